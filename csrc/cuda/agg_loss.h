// Launchers of the agg_loss CUDA kernels (csrc/cuda/agg_loss.cu), called by agg_loss_binding.cpp.
#pragma once

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "rlkernels/aggregation.h"
#include "rlkernels/dtype.h"
#include "rows.h"

namespace rlk {
namespace cuda {

// loss_mat: [B, T] of `dtype`; mask: [B, T] of mask_type (float: of the accumulation type); each at its row
// stride (rows.h).
struct AggLossTensors {
  RowsArg loss_mat, mask;
  MaskType mask_type;
  int64_t B, T;
};

// The forward's outputs, of the accumulation type (fp32, fp64 for fp64 inputs) but ok.
struct AggLossOutputs {
  void* loss;         // []
  void* row_weights;  // [B] d loss / d row sum
  bool* ok;           // [] no mask value rejected
};

// Accumulation-type elements of the workspace agg_loss_forward needs.
int64_t agg_loss_workspace(int64_t B, int64_t T);

// One launch computes every output, the aggregation finished by the last block. counter: the zeroed int32 of
// launch_counter.h for this device and stream.
cudaError_t agg_loss_forward(DType dtype, const AggLossTensors& x, const AggParams& agg, const AggLossOutputs& out,
                             void* workspace, unsigned int* counter, cudaStream_t stream);

// One launch: grad_loss [1] and row_weights [B] of the accumulation type; grad [B, T] of `dtype`, contiguous.
cudaError_t agg_loss_backward(DType dtype, const AggLossTensors& x, const void* grad_loss, const void* row_weights,
                              void* grad, cudaStream_t stream);

}  // namespace cuda
}  // namespace rlk
