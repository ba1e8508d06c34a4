// Launchers of the value_loss CUDA kernels (csrc/cuda/value_loss.cu), called by value_loss_binding.cpp.
#pragma once

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "rlkernels/dtype.h"

namespace rlk {
namespace cuda {

// values, old_values, returns: contiguous [B, T] of `dtype`; mask: [B, T] bool (mask_is_bool) or of the
// accumulation type; clip: +inf for the unclipped loss.
struct ValueLossTensors {
  const void* values;
  const void* old_values;
  const void* returns;
  const void* mask;
  bool mask_is_bool;
  int64_t B, T;
};

// Accumulation-type elements of the workspace value_loss_forward needs.
int64_t value_loss_workspace(int64_t B, int64_t T);

// row_loss [B], row_stats [B, 2] (ValueRowStat columns), workspace: of the accumulation type.
cudaError_t value_loss_forward(DType dtype, const ValueLossTensors& x, double clip, void* row_loss,
                               void* row_stats, void* workspace, cudaStream_t stream);

// grad_rows [B] of the accumulation type; grad_values [B, T] of `dtype`.
cudaError_t value_loss_backward(DType dtype, const ValueLossTensors& x, double clip, const void* grad_rows,
                                void* grad_values, cudaStream_t stream);

}  // namespace cuda
}  // namespace rlk
