// kl_penalty CUDA kernels: grid-stride elementwise loops over the shared math in rlkernels/kl.h, in 16-byte packs.
#include "common.cuh"
#include "kl.h"
#include "rlkernels/kl.h"

namespace rlk {
namespace cuda {
namespace {

// The grid-stride loops go over 16-byte packs (common.cuh) when every pointer is 16-byte aligned (`packed`;
// the host checks it), then over what is left one element a thread: all of it when not packed, else the
// tail after the last whole pack. A thread's packs of both inputs are loaded before it computes.
template <typename T>
__global__ void kl_forward_kernel(const T* __restrict__ logp,  // [n]
                                  const T* __restrict__ ref,   // [n]
                                  T* __restrict__ out,         // [n]
                                  int64_t n, bool packed, KLKind kind, typename Acc<T>::type clamp) {
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

// d logp and its negative d ref_logp in one pass (a null output is not written); grad is read at g_stride
// (0: one element broadcast, the gradient of `.sum()`).
template <typename T>
__global__ void kl_backward_kernel(const T* __restrict__ grad,  // [n] at g_stride
                                   const T* __restrict__ logp,  // [n]
                                   const T* __restrict__ ref,   // [n]
                                   T* __restrict__ grad_logp,   // [n] or nullptr
                                   T* __restrict__ grad_ref,    // [n] or nullptr
                                   int64_t n, int64_t g_stride, bool packed, KLKind kind,
                                   typename Acc<T>::type clamp) {
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

}  // namespace

cudaError_t kl_penalty_forward(DType dtype, const void* logp, const void* ref, void* out, int64_t n, int kind,
                               double clamp, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  RLK_CUDA_DISPATCH_FLOATING(dtype, T, {
    using A = typename Acc<T>::type;
    const bool packed = packs_aligned({logp, ref, out});
    kl_forward_kernel<T><<<elementwise_blocks(packed ? n / kPack<T> + n % kPack<T> : n), kElementwiseThreads, 0,
                           stream>>>(static_cast<const T*>(logp), static_cast<const T*>(ref), static_cast<T*>(out), n,
                                     packed, KLKind(kind), A(clamp));
  });
  return cudaGetLastError();
}

cudaError_t kl_penalty_backward(DType dtype, const void* grad, int64_t grad_stride, const void* logp,
                                const void* ref, void* grad_logp, void* grad_ref, int64_t n, int kind, double clamp,
                                cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  RLK_CUDA_DISPATCH_FLOATING(dtype, T, {
    using A = typename Acc<T>::type;
    const bool packed = (grad_stride == 0 || grad_stride == 1) &&
                        packs_aligned({grad_stride == 0 ? nullptr : grad, logp, ref, grad_logp, grad_ref});
    kl_backward_kernel<T><<<elementwise_blocks(packed ? n / kPack<T> + n % kPack<T> : n), kElementwiseThreads, 0,
                            stream>>>(static_cast<const T*>(grad), static_cast<const T*>(logp),
                                      static_cast<const T*>(ref), static_cast<T*>(grad_logp),
                                      static_cast<T*>(grad_ref), n, grad_stride, packed, KLKind(kind), A(clamp));
  });
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace rlk
