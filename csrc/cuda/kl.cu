// kl_penalty CUDA kernels: grid-stride elementwise loops over the shared math in rlkernels/kl.h, in 16-byte packs.
#include <algorithm>

#include "common.cuh"
#include "kl.h"
#include "rlkernels/kl.h"

namespace rlk {
namespace cuda {
namespace {

// One contiguous span of n elements, the thread's share of it: the grid-stride loop along the span (over
// blockIdx.x) goes over 16-byte packs (common.cuh) when the span's pointers are 16-byte aligned (`packed`; the
// host checks it), then over what is left one element a thread: all of it when not packed, else the tail after
// the last whole pack. A thread's packs of both inputs are loaded before it computes.
template <typename T>
__device__ __forceinline__ void kl_forward_span(const T* __restrict__ logp, const T* __restrict__ ref,
                                                T* __restrict__ out, int64_t n, bool packed, KLKind kind,
                                                typename Acc<T>::type clamp) {
  using A = typename Acc<T>::type;
  constexpr int P = kPack<T>;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t first = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t packs = packed ? n / P : 0;
  const auto* lp = reinterpret_cast<const Pack<T>*>(logp);
  const auto* rp = reinterpret_cast<const Pack<T>*>(ref);
  for (int64_t p = first; p < packs; p += stride) {
    const Pack<T> a = lp[p], b = rp[p];
    Pack<T> o;
#pragma unroll
    for (int i = 0; i < P; ++i) o.v[i] = from_acc<T>(kl_value<A>(kind, to_acc(a.v[i]), to_acc(b.v[i]), clamp));
    reinterpret_cast<Pack<T>*>(out)[p] = o;
  }
  for (int64_t i = packs * P + first; i < n; i += stride) {
    out[i] = from_acc<T>(kl_value<A>(kind, to_acc(logp[i]), to_acc(ref[i]), clamp));
  }
}

// d logp and its negative d ref_logp of a span in one pass (a null output is not written); grad is read at
// g_stride (0: one element broadcast, the gradient of `.sum()`).
template <typename T>
__device__ __forceinline__ void kl_backward_span(const T* __restrict__ grad, const T* __restrict__ logp,
                                                 const T* __restrict__ ref, T* __restrict__ grad_logp,
                                                 T* __restrict__ grad_ref, int64_t n, int64_t g_stride, bool packed,
                                                 KLKind kind, typename Acc<T>::type clamp) {
  using A = typename Acc<T>::type;
  constexpr int P = kPack<T>;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t first = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t packs = packed ? n / P : 0;
  const auto* lp = reinterpret_cast<const Pack<T>*>(logp);
  const auto* rp = reinterpret_cast<const Pack<T>*>(ref);
  const auto* gp = reinterpret_cast<const Pack<T>*>(grad);
  const A g0 = g_stride == 0 ? to_acc(grad[0]) : A(0);
  for (int64_t p = first; p < packs; p += stride) {
    const Pack<T> a = lp[p], b = rp[p];
    Pack<T> gs;
    if (g_stride != 0) gs = gp[p];
    Pack<T> dl, dr;
#pragma unroll
    for (int i = 0; i < P; ++i) {
      const A g = (g_stride == 0 ? g0 : to_acc(gs.v[i])) * kl_grad<A>(kind, to_acc(a.v[i]), to_acc(b.v[i]), clamp);
      dl.v[i] = from_acc<T>(g);
      dr.v[i] = from_acc<T>(-g);
    }
    if (grad_logp != nullptr) reinterpret_cast<Pack<T>*>(grad_logp)[p] = dl;
    if (grad_ref != nullptr) reinterpret_cast<Pack<T>*>(grad_ref)[p] = dr;
  }
  for (int64_t i = packs * P + first; i < n; i += stride) {
    const A g = to_acc(grad[i * g_stride]) * kl_grad<A>(kind, to_acc(logp[i]), to_acc(ref[i]), clamp);
    if (grad_logp != nullptr) grad_logp[i] = from_acc<T>(g);
    if (grad_ref != nullptr) grad_ref[i] = from_acc<T>(-g);
  }
}

// A flat call (kl.h): one span of all n elements over the whole grid.
template <typename T>
__global__ void kl_forward_kernel(const T* __restrict__ logp,  // [n]
                                  const T* __restrict__ ref,   // [n]
                                  T* __restrict__ out,         // [n]
                                  int64_t n, bool packed, KLKind kind, typename Acc<T>::type clamp) {
  kl_forward_span(logp, ref, out, n, packed, kind, clamp);
}

template <typename T>
__global__ void kl_backward_kernel(const T* __restrict__ grad,  // [n] at g_stride
                                   const T* __restrict__ logp,  // [n]
                                   const T* __restrict__ ref,   // [n]
                                   T* __restrict__ grad_logp,   // [n] or nullptr
                                   T* __restrict__ grad_ref,    // [n] or nullptr
                                   int64_t n, int64_t g_stride, bool packed, KLKind kind,
                                   typename Acc<T>::type clamp) {
  kl_backward_span(grad, logp, ref, grad_logp, grad_ref, n, g_stride, packed, kind, clamp);
}

// A call of rows (kl.h): each row a span, block row blockIdx.y taking rows blockIdx.y, blockIdx.y + gridDim.y,
// ...; its own kernel, so that the flat one keeps its registers (with the row loop in it, fp32 took 48-56 a
// thread where it takes 32: 5-6 blocks of 256 threads an SM instead of 8).
template <typename T>
__global__ void kl_forward_rows_kernel(Rows<T> logp,              // [rows, n]
                                       Rows<T> ref,               // [rows, n]
                                       T* __restrict__ out,       // [rows, n] contiguous
                                       int64_t rows, int64_t n, bool packed, KLKind kind,
                                       typename Acc<T>::type clamp) {
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    kl_forward_span(logp.row(r), ref.row(r), out + r * n, n, packed, kind, clamp);
  }
}

template <typename T>
__global__ void kl_backward_rows_kernel(const T* __restrict__ grad,  // [rows, n] contiguous, at g_stride
                                        Rows<T> logp,                // [rows, n]
                                        Rows<T> ref,                 // [rows, n]
                                        T* __restrict__ grad_logp,   // [rows, n] contiguous, or nullptr
                                        T* __restrict__ grad_ref,    // [rows, n] contiguous, or nullptr
                                        int64_t rows, int64_t n, int64_t g_stride, bool packed, KLKind kind,
                                        typename Acc<T>::type clamp) {
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    kl_backward_span(grad + r * n * g_stride, logp.row(r), ref.row(r),
                     grad_logp == nullptr ? nullptr : grad_logp + r * n,
                     grad_ref == nullptr ? nullptr : grad_ref + r * n, n, g_stride, packed, kind, clamp);
  }
}

// Each row of each pointer 16-byte aligned: its start, and its row stride in bytes (a flat call's one row
// has none).
bool rows_packs_aligned(std::initializer_list<RowsArg> ptrs, int64_t rows, size_t elem) {
  for (const RowsArg& a : ptrs) {
    if (a.data != nullptr && (!packs_aligned({a.data}) || (rows > 1 && (a.ld * int64_t(elem)) % 16 != 0))) {
      return false;
    }
  }
  return true;
}

// (blocks along a row, block rows): a flat call's grid as before; rows share the grid-stride cap.
dim3 rows_grid(int64_t rows, int64_t units) {
  const unsigned int y = static_cast<unsigned int>(rows < 65535 ? (rows < 1 ? 1 : rows) : 65535);
  int64_t x = elementwise_blocks(units);
  if (y > 1) x = std::max<int64_t>(1, std::min<int64_t>(x, kMaxElementwiseBlocks / y));
  return dim3(static_cast<unsigned int>(x), y);
}

}  // namespace

cudaError_t kl_penalty_forward(DType dtype, RowsArg logp, RowsArg ref, void* out, int64_t rows, int64_t n, int kind,
                               double clamp, cudaStream_t stream) {
  if (n == 0 || rows == 0) return cudaSuccess;
  RLK_CUDA_DISPATCH_FLOATING(dtype, T, {
    using A = typename Acc<T>::type;
    const bool packed = rows_packs_aligned({logp, ref, RowsArg{out, n}}, rows, sizeof(T));
    const dim3 grid = rows_grid(rows, packed ? n / kPack<T> + n % kPack<T> : n);
    if (rows == 1) {
      kl_forward_kernel<T><<<grid, kElementwiseThreads, 0, stream>>>(
          static_cast<const T*>(logp.data), static_cast<const T*>(ref.data), static_cast<T*>(out), n, packed,
          KLKind(kind), A(clamp));
    } else {
      kl_forward_rows_kernel<T><<<grid, kElementwiseThreads, 0, stream>>>(
          rows_of<T>(logp), rows_of<T>(ref), static_cast<T*>(out), rows, n, packed, KLKind(kind), A(clamp));
    }
  });
  return cudaGetLastError();
}

cudaError_t kl_penalty_backward(DType dtype, const void* grad, int64_t grad_stride, RowsArg logp, RowsArg ref,
                                void* grad_logp, void* grad_ref, int64_t rows, int64_t n, int kind, double clamp,
                                cudaStream_t stream) {
  if (n == 0 || rows == 0) return cudaSuccess;
  RLK_CUDA_DISPATCH_FLOATING(dtype, T, {
    using A = typename Acc<T>::type;
    const bool packed = (grad_stride == 0 || grad_stride == 1) &&
                        rows_packs_aligned({RowsArg{grad_stride == 0 ? nullptr : grad, n}, logp, ref,
                                            RowsArg{grad_logp, n}, RowsArg{grad_ref, n}},
                                           rows, sizeof(T));
    const dim3 grid = rows_grid(rows, packed ? n / kPack<T> + n % kPack<T> : n);
    if (rows == 1) {
      kl_backward_kernel<T><<<grid, kElementwiseThreads, 0, stream>>>(
          static_cast<const T*>(grad), static_cast<const T*>(logp.data), static_cast<const T*>(ref.data),
          static_cast<T*>(grad_logp), static_cast<T*>(grad_ref), n, grad_stride, packed, KLKind(kind), A(clamp));
    } else {
      kl_backward_rows_kernel<T><<<grid, kElementwiseThreads, 0, stream>>>(
          static_cast<const T*>(grad), rows_of<T>(logp), rows_of<T>(ref), static_cast<T*>(grad_logp),
          static_cast<T*>(grad_ref), rows, n, grad_stride, packed, KLKind(kind), A(clamp));
    }
  });
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace rlk
