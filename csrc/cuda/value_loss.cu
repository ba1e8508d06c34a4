// value_loss CUDA kernels over the shared per-token math of rlkernels/value_loss.h: (row, chunk) blocks
// with deterministic block reductions into per-block partials, a per-row combine in chunk order, and an
// elementwise backward (the same scheme as policy_loss.cu).
#include "block_reduce.cuh"
#include "common.cuh"
#include "rlkernels/value_loss.h"
#include "value_loss.h"

namespace rlk {
namespace cuda {
namespace {

// Threads per block: 8 warps, a good occupancy default on A100/H100.
constexpr int kThreads = 256;
// Tokens per thread per block: 4 independent loads in flight per thread to cover memory latency.
constexpr int kItems = 4;
constexpr int kChunk = kThreads * kItems;
constexpr int kWarps = kThreads / 32;
constexpr int kParts = 1 + kValueRowStats;  // Σ m·L, Σ m, Σ m·clipped

template <typename A>
__device__ __forceinline__ A mask_value(bool m) {
  return m ? A(1) : A(0);
}
template <typename A>
__device__ __forceinline__ A mask_value(A m) {
  return m;
}

template <typename T, typename M>
__global__ void __launch_bounds__(kThreads)
    value_forward_kernel(const T* __restrict__ values, const T* __restrict__ old, const T* __restrict__ ret,
                         const M* __restrict__ mask,  // [B, T] each
                         int64_t T_, int64_t chunks, typename Acc<T>::type clip,
                         typename Acc<T>::type* __restrict__ part) {  // [B, chunks, kParts]
  using A = typename Acc<T>::type;
  __shared__ A smem[kParts * kWarps];
  const int64_t b = blockIdx.x / chunks, c = blockIdx.x % chunks;
  A v[kParts] = {A(0), A(0), A(0)};
#pragma unroll
  for (int it = 0; it < kItems; ++it) {
    const int64_t t = c * kChunk + it * kThreads + threadIdx.x;
    if (t < T_) {
      const int64_t i = b * T_ + t;
      const VLToken<A> tok = value_token<A>(to_acc(values[i]), to_acc(old[i]), to_acc(ret[i]), clip);
      const A m = mask_value<A>(mask[i]);
      const bool on = m != A(0);
      v[0] += on ? m * tok.loss : A(0);
      v[1] += m;
      v[2] += on ? m * tok.clipped : A(0);
    }
  }
  block_sum<kThreads>(v, smem);
  if (threadIdx.x == 0) {
#pragma unroll
    for (int k = 0; k < kParts; ++k) part[blockIdx.x * kParts + k] = v[k];
  }
}

template <typename A>
__global__ void value_combine_kernel(const A* __restrict__ part, int64_t B, int64_t chunks,
                                     A* __restrict__ row_loss, A* __restrict__ row_stats) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= B * kParts) return;
  const int64_t b = idx / kParts;
  const int k = int(idx % kParts);
  A s = A(0);
  for (int64_t c = 0; c < chunks; ++c) s += part[(b * chunks + c) * kParts + k];
  if (k == 0) {
    row_loss[b] = s;
  } else {
    row_stats[b * kValueRowStats + k - 1] = s;
  }
}

template <typename T, typename M>
__global__ void __launch_bounds__(kThreads)
    value_backward_kernel(const typename Acc<T>::type* __restrict__ grad_rows,  // [B]
                          const T* __restrict__ values, const T* __restrict__ old, const T* __restrict__ ret,
                          const M* __restrict__ mask, int64_t T_, int64_t chunks, typename Acc<T>::type clip,
                          T* __restrict__ grad) {  // [B, T]
  using A = typename Acc<T>::type;
  const int64_t b = blockIdx.x / chunks, c = blockIdx.x % chunks;
  const A g = grad_rows[b];
#pragma unroll
  for (int it = 0; it < kItems; ++it) {
    const int64_t t = c * kChunk + it * kThreads + threadIdx.x;
    if (t < T_) {
      const int64_t i = b * T_ + t;
      const VLToken<A> tok = value_token<A>(to_acc(values[i]), to_acc(old[i]), to_acc(ret[i]), clip);
      const A m = mask_value<A>(mask[i]);
      grad[i] = from_acc<T>(m != A(0) ? g * m * tok.dvalue : A(0));
    }
  }
}

int64_t num_chunks(int64_t T) { return (T + kChunk - 1) / kChunk; }

template <typename T, typename M>
void launch_forward(const ValueLossTensors& x, double clip, void* row_loss, void* row_stats, void* workspace,
                    cudaStream_t stream) {
  using A = typename Acc<T>::type;
  const int64_t chunks = num_chunks(x.T);
  A* part = static_cast<A*>(workspace);
  value_forward_kernel<T, M><<<static_cast<unsigned int>(x.B * chunks), kThreads, 0, stream>>>(
      static_cast<const T*>(x.values), static_cast<const T*>(x.old_values), static_cast<const T*>(x.returns),
      static_cast<const M*>(x.mask), x.T, chunks, A(clip), part);
  const unsigned int blocks = static_cast<unsigned int>((x.B * kParts + kThreads - 1) / kThreads);
  value_combine_kernel<A><<<blocks, kThreads, 0, stream>>>(part, x.B, chunks, static_cast<A*>(row_loss),
                                                           static_cast<A*>(row_stats));
}

template <typename T, typename M>
void launch_backward(const ValueLossTensors& x, double clip, const void* grad_rows, void* grad,
                     cudaStream_t stream) {
  using A = typename Acc<T>::type;
  const int64_t chunks = num_chunks(x.T);
  value_backward_kernel<T, M><<<static_cast<unsigned int>(x.B * chunks), kThreads, 0, stream>>>(
      static_cast<const A*>(grad_rows), static_cast<const T*>(x.values), static_cast<const T*>(x.old_values),
      static_cast<const T*>(x.returns), static_cast<const M*>(x.mask), x.T, chunks, A(clip), static_cast<T*>(grad));
}

}  // namespace

int64_t value_loss_workspace(int64_t B, int64_t T) { return B * num_chunks(T) * kParts; }

cudaError_t value_loss_forward(DType dtype, const ValueLossTensors& x, double clip, void* row_loss,
                               void* row_stats, void* workspace, cudaStream_t stream) {
  if (x.B == 0 || x.T == 0) return cudaSuccess;  // the binding returns zeros
  RLK_CUDA_DISPATCH_FLOATING(dtype, T, {
    using A = typename Acc<T>::type;
    if (x.mask_is_bool) {
      launch_forward<T, bool>(x, clip, row_loss, row_stats, workspace, stream);
    } else {
      launch_forward<T, A>(x, clip, row_loss, row_stats, workspace, stream);
    }
  });
  return cudaGetLastError();
}

cudaError_t value_loss_backward(DType dtype, const ValueLossTensors& x, double clip, const void* grad_rows,
                                void* grad_values, cudaStream_t stream) {
  if (x.B == 0 || x.T == 0) return cudaSuccess;
  RLK_CUDA_DISPATCH_FLOATING(dtype, T, {
    using A = typename Acc<T>::type;
    if (x.mask_is_bool) {
      launch_backward<T, bool>(x, clip, grad_rows, grad_values, stream);
    } else {
      launch_backward<T, A>(x, clip, grad_rows, grad_values, stream);
    }
  });
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace rlk
