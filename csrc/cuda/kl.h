// Launchers of the kl_penalty CUDA kernels (csrc/cuda/kl.cu), called by csrc/cuda/kl_binding.cpp.
#pragma once

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "rlkernels/dtype.h"
#include "rows.h"

namespace rlk {
namespace cuda {

// A call is `rows` rows of n elements of `dtype`: logp and ref at their row strides (rows.h: [B, T] views such as
// verl's log-probs sliced out of the padded sequence, read in place), the outputs contiguous [rows, n]. A flat
// call (any shape, contiguous) is one row of all its elements.

// out[r, i] = kl(logp[r, i], ref[r, i]). clamp: +inf for none.
cudaError_t kl_penalty_forward(DType dtype, RowsArg logp, RowsArg ref, void* out, int64_t rows, int64_t n, int kind,
                               double clamp, cudaStream_t stream);

// grad_logp[r, i] = grad[(r * n + i) * grad_stride] * d kl / d logp there, grad_ref = -grad_logp, in one pass;
// either output may be nullptr (not written). grad_stride: 1 (contiguous), or 0 for one element broadcast.
cudaError_t kl_penalty_backward(DType dtype, const void* grad, int64_t grad_stride, RowsArg logp, RowsArg ref,
                                void* grad_logp, void* grad_ref, int64_t rows, int64_t n, int kind, double clamp,
                                cudaStream_t stream);

}  // namespace cuda
}  // namespace rlk
