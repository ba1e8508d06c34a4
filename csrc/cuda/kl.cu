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

template <typename T>
__global__ void kl_backward_kernel(const T* __restrict__ grad,  // [n]
                                   const T* __restrict__ logp,  // [n]
                                   const T* __restrict__ ref,   // [n]
                                   T* __restrict__ grad_logp,   // [n]
                                   int64_t n, KLKind kind, typename Acc<T>::type clamp) {
  using A = typename Acc<T>::type;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const A g = to_acc(grad[i]);
    grad_logp[i] = from_acc<T>(g * kl_grad<A>(kind, to_acc(logp[i]), to_acc(ref[i]), clamp));
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

cudaError_t kl_penalty_backward(DType dtype, const void* grad, const void* logp, const void* ref,
                                void* grad_logp, int64_t n, int kind, double clamp, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  RLK_CUDA_DISPATCH_FLOATING(dtype, T, {
    using A = typename Acc<T>::type;
    kl_backward_kernel<T><<<elementwise_blocks(n), kElementwiseThreads, 0, stream>>>(
        static_cast<const T*>(grad), static_cast<const T*>(logp), static_cast<const T*>(ref),
        static_cast<T*>(grad_logp), n, KLKind(kind), A(clamp));
  });
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace rlk
