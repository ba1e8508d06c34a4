// kl_penalty CUDA kernels: grid-stride elementwise loops over the shared math in rlkernels/kl.h.
#include "common.cuh"
#include "kl.h"
#include "rlkernels/kl.h"

namespace rlk {
namespace cuda {
namespace {

template <typename T>
__global__ void kl_forward_kernel(const T* __restrict__ logp,  // [n]
                                  const T* __restrict__ ref,   // [n]
                                  T* __restrict__ out,         // [n]
                                  int64_t n, KLKind kind, typename Acc<T>::type clamp) {
  using A = typename Acc<T>::type;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
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
                                   int64_t n, int64_t g_stride, KLKind kind, typename Acc<T>::type clamp) {
  using A = typename Acc<T>::type;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
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
    kl_forward_kernel<T><<<elementwise_blocks(n), kElementwiseThreads, 0, stream>>>(
        static_cast<const T*>(logp), static_cast<const T*>(ref), static_cast<T*>(out), n, KLKind(kind), A(clamp));
  });
  return cudaGetLastError();
}

cudaError_t kl_penalty_backward(DType dtype, const void* grad, int64_t grad_stride, const void* logp,
                                const void* ref, void* grad_logp, void* grad_ref, int64_t n, int kind, double clamp,
                                cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  RLK_CUDA_DISPATCH_FLOATING(dtype, T, {
    using A = typename Acc<T>::type;
    kl_backward_kernel<T><<<elementwise_blocks(n), kElementwiseThreads, 0, stream>>>(
        static_cast<const T*>(grad), static_cast<const T*>(logp), static_cast<const T*>(ref),
        static_cast<T*>(grad_logp), static_cast<T*>(grad_ref), n, grad_stride, KLKind(kind), A(clamp));
  });
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace rlk
