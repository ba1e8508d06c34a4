// Launchers of the kl_penalty CUDA kernels (csrc/cuda/kl.cu), called by csrc/cuda/kl_binding.cpp.
#pragma once

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "rlkernels/dtype.h"

namespace rlk {
namespace cuda {

// out[i] = kl(logp[i], ref[i]); all pointers contiguous [n] of `dtype`. clamp: +inf for none.
cudaError_t kl_penalty_forward(DType dtype, const void* logp, const void* ref, void* out, int64_t n, int kind,
                               double clamp, cudaStream_t stream);

// grad_logp[i] = grad[i * grad_stride] * d kl / d logp at i, grad_ref[i] = -grad_logp[i], in one pass; either
// output may be nullptr (not written). grad_stride: 1, or 0 for one element broadcast.
cudaError_t kl_penalty_backward(DType dtype, const void* grad, int64_t grad_stride, const void* logp,
                                const void* ref, void* grad_logp, void* grad_ref, int64_t n, int kind, double clamp,
                                cudaStream_t stream);

}  // namespace cuda
}  // namespace rlk
