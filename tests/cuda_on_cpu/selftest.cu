// Kernels that exercise the cuda-on-cpu harness itself (tests/test_cuda_on_cpu.py calls them through
// ctypes). Written as CUDA and compiled exactly like csrc/cuda's .cu files. Each entry point launches one
// kernel and returns the launch's cudaError_t; rlk_sim_test_error(code) is the message.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#define RLK_SIM_TEST extern "C" __attribute__((visibility("default")))

namespace {

// Thread t of block b holds value(b, t) before an exchange.
__device__ long long value_of(unsigned b, unsigned t) { return (long long)(b * 1000 + t) * 3 + 1; }

// Threads with active[t] == 0 return at once; the others run warp op `op` on mask masks[t] with argument
// param[t] (the source lane, delta, lane mask, or the vote's predicate), on 4- or 8-byte values.
__global__ void warp_op_kernel(int op, int width, int size, const unsigned* masks, const long long* param,
                               const int* active, long long* out) {
  const unsigned t = threadIdx.x, g = blockIdx.x * blockDim.x + t;
  if (!active[t]) return;
  const unsigned mask = masks[t];
  const long long v = value_of(blockIdx.x, t), p = param[t];
  long long r = 0;
  if (op <= 3 && size == 4) {
    const int x = int(v);
    if (op == 0) r = __shfl_sync(mask, x, int(p), width);
    if (op == 1) r = __shfl_up_sync(mask, x, unsigned(p), width);
    if (op == 2) r = __shfl_down_sync(mask, x, unsigned(p), width);
    if (op == 3) r = __shfl_xor_sync(mask, x, int(p), width);
  } else if (op <= 3) {
    const long long x = v << 20;  // uses the upper 32 bits
    if (op == 0) r = __shfl_sync(mask, x, int(p), width) >> 20;
    if (op == 1) r = __shfl_up_sync(mask, x, unsigned(p), width) >> 20;
    if (op == 2) r = __shfl_down_sync(mask, x, unsigned(p), width) >> 20;
    if (op == 3) r = __shfl_xor_sync(mask, x, int(p), width) >> 20;
  } else if (op == 4) {
    r = __ballot_sync(mask, int(p));
  } else if (op == 5) {
    r = __any_sync(mask, int(p));
  } else if (op == 6) {
    r = __all_sync(mask, int(p));
  } else {
    __syncwarp(mask);
    r = 1;
  }
  out[g] = r;
}

// Warps whose bit is set in exit_warps return at once; the others exchange through shared memory for
// `rounds` rounds: thread t writes round * 100000 + t, and after the barrier reads its partner's slot.
__global__ void barrier_kernel(unsigned exit_warps, int rounds, const int* partner, int* out) {
  __shared__ int slots[1024];
  const unsigned t = threadIdx.x;
  if (exit_warps >> (t / 32) & 1u) return;
  for (int r = 0; r < rounds; ++r) {
    slots[t] = r * 100000 + int(t);
    __syncthreads();
    out[r * blockDim.x + t] = slots[partner[t]];
    __syncthreads();
  }
}

// Even threads wait at one __syncthreads, odd threads at another: undefined on a GPU, an error here.
__global__ void divergent_barrier_kernel(int* out) {
  if (threadIdx.x % 2 == 0) {
    __syncthreads();
  } else {
    __syncthreads();
  }
  out[threadIdx.x] = 1;
}

// Even lanes shuffle while odd lanes vote, on the same mask: undefined on a GPU, an error here.
__global__ void mixed_ops_kernel(long long* out) {
  const unsigned t = threadIdx.x;
  out[t] = t % 2 == 0 ? __shfl_down_sync(0xffffffffu, (long long)t, 1) : (long long)__ballot_sync(0xffffffffu, 1);
}

// Thread 0 writes a shared value that every thread reads, with the __syncthreads between them missing: a
// race. Each thread records what it read.
__global__ void missing_barrier_kernel(int* out) {
  __shared__ int value;
  if (threadIdx.x == 0) value = 42;
  out[blockIdx.x * blockDim.x + threadIdx.x] = value;
}

// Lane 0 waits for its warp at __syncwarp while lanes 1-31 wait for it at __syncthreads: a deadlock.
__global__ void deadlock_kernel() {
  if (threadIdx.x == 0) {
    __syncwarp();
  } else {
    __syncthreads();
  }
}

// Every thread of every block adds to the same counters `iters` times.
__global__ void atomics_kernel(int iters, float* f, double* d, int* i, unsigned long long* u, int* imax) {
  for (int k = 0; k < iters; ++k) {
    atomicAdd(f, 1.0f);
    atomicAdd(d, 0.25);
    atomicAdd(i, 1);
    unsigned long long old = *u, seen;
    do {  // an increment by compare-and-swap
      seen = old;
      old = atomicCAS(u, seen, seen + 1);
    } while (old != seen);
  }
  atomicMax(imax, int(blockIdx.x * blockDim.x + threadIdx.x));
}

// Float -> fp16 / bf16 bits and back, and fp16 / bf16 bit patterns -> float (grid-stride loops).
__global__ void convert_kernel(const float* in, int64_t n, unsigned short* h, unsigned short* b) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    h[i] = __half_raw(__float2half_rn(in[i])).x;
    b[i] = __nv_bfloat16_raw(__float2bfloat16_rn(in[i])).x;
  }
}

__global__ void widen_kernel(const unsigned short* bits, int64_t n, float* from_half, float* from_bf16) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    from_half[i] = __half2float(__half(__half_raw{bits[i]}));
    from_bf16[i] = __bfloat162float(__nv_bfloat16(__nv_bfloat16_raw{bits[i]}));
  }
}

// Per block: what its shared storage held before any write (out[3 * b]), and after the block wrote its own
// index and met the barrier, twice (the other blocks in flight write theirs meanwhile).
__global__ void shared_kernel(int* out) {
  __shared__ int mine;
  __shared__ float unwritten[4];
  if (threadIdx.x == 0) out[3 * blockIdx.x] = mine;
  __syncthreads();
  if (threadIdx.x == 0) mine = int(blockIdx.x);
  __syncthreads();
  const int seen = mine;
  __syncthreads();
  if (threadIdx.x == 0) out[3 * blockIdx.x + 1] = seen;
  if (threadIdx.x == 1) out[3 * blockIdx.x + 2] = unwritten[threadIdx.x] != unwritten[threadIdx.x];  // NaN
}

// Thread and block coordinates as seen by each thread of a 3-D launch.
__global__ void builtins_kernel(unsigned* out) {
  const unsigned b = (blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
  const unsigned t = (threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x;
  unsigned* o = out + 12 * (b * blockDim.x * blockDim.y * blockDim.z + t);
  const unsigned v[12] = {threadIdx.x, threadIdx.y, threadIdx.z, blockIdx.x, blockIdx.y, blockIdx.z,
                          blockDim.x,  blockDim.y,  blockDim.z,  gridDim.x,  gridDim.y,  gridDim.z};
  for (int k = 0; k < 12; ++k) o[k] = v[k];
}

}  // namespace

RLK_SIM_TEST const char* rlk_sim_test_error(int code) { return cudaGetErrorString(cudaError_t(code)); }

RLK_SIM_TEST int rlk_sim_test_warp_op(int op, int width, int size, int blocks, int threads, const unsigned* masks,
                                      const long long* param, const int* active, long long* out) {
  warp_op_kernel<<<blocks, threads>>>(op, width, size, masks, param, active, out);
  return cudaGetLastError();
}

RLK_SIM_TEST int rlk_sim_test_barrier(int threads, unsigned exit_warps, int rounds, const int* partner, int* out) {
  barrier_kernel<<<1, threads>>>(exit_warps, rounds, partner, out);
  return cudaGetLastError();
}

RLK_SIM_TEST int rlk_sim_test_divergent_barrier(int threads, int* out) {
  divergent_barrier_kernel<<<1, threads>>>(out);
  return cudaGetLastError();
}

RLK_SIM_TEST int rlk_sim_test_mixed_ops(long long* out) {
  mixed_ops_kernel<<<1, 32>>>(out);
  return cudaGetLastError();
}

RLK_SIM_TEST int rlk_sim_test_missing_barrier(int blocks, int threads, int* out) {
  missing_barrier_kernel<<<blocks, threads>>>(out);
  return cudaGetLastError();
}

RLK_SIM_TEST int rlk_sim_test_deadlock() {
  deadlock_kernel<<<1, 32>>>();
  return cudaGetLastError();
}

RLK_SIM_TEST int rlk_sim_test_atomics(int blocks, int threads, int iters, float* f, double* d, int* i,
                                      unsigned long long* u, int* imax) {
  atomics_kernel<<<blocks, threads>>>(iters, f, d, i, u, imax);
  return cudaGetLastError();
}

RLK_SIM_TEST int rlk_sim_test_convert(const float* in, int64_t n, unsigned short* h, unsigned short* b) {
  convert_kernel<<<7, 96>>>(in, n, h, b);
  return cudaGetLastError();
}

RLK_SIM_TEST int rlk_sim_test_widen(const unsigned short* bits, int64_t n, float* from_half, float* from_bf16) {
  widen_kernel<<<5, 128>>>(bits, n, from_half, from_bf16);
  return cudaGetLastError();
}

RLK_SIM_TEST int rlk_sim_test_shared(int blocks, int* out) {
  shared_kernel<<<blocks, 64>>>(out);
  return cudaGetLastError();
}

RLK_SIM_TEST int rlk_sim_test_builtins(unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                                       unsigned* out) {
  builtins_kernel<<<dim3(gx, gy, gz), dim3(bx, by, bz)>>>(out);
  return cudaGetLastError();
}
