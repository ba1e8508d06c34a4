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

// grad_logp[i] = grad[i] * d kl / d logp at i.
cudaError_t kl_penalty_backward(DType dtype, const void* grad, const void* logp, const void* ref,
                                void* grad_logp, int64_t n, int kind, double clamp, cudaStream_t stream);

}  // namespace cuda
}  // namespace rlk
