// Launchers of the value_loss CUDA kernels (csrc/cuda/value_loss.cu), called by value_loss_binding.cpp.
#pragma once

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "rlkernels/aggregation.h"
#include "rlkernels/dtype.h"
#include "rows.h"

namespace rlk {
namespace cuda {

// values, old_values, returns: [B, T] of `dtype`; mask: [B, T] of mask_type (float: of the accumulation type);
// each at its row stride (rows.h).
struct ValueLossTensors {
  RowsArg values, old_values, returns, mask;
  MaskType mask_type;
  int64_t B, T;
};

// The forward's outputs, of the accumulation type (fp32, fp64 for fp64 inputs) but ok.
struct ValueLossOutputs {
  void* loss;         // []
  void* clipfrac;     // [1]
  void* row_weights;  // [B] d loss / d row sum
  bool* ok;           // [] no input value rejected
};

// Accumulation-type elements of the workspace value_loss_forward needs.
int64_t value_loss_workspace(int64_t B, int64_t T);

// One launch computes every output, the aggregation finished by the last block. clip: +inf for the unclipped
// loss; counter: the zeroed int32 of aggregation_host.h launch_counter for this device and stream.
cudaError_t value_loss_forward(DType dtype, const ValueLossTensors& x, double clip, const AggParams& agg,
                               const ValueLossOutputs& out, void* workspace, unsigned int* counter,
                               cudaStream_t stream);

// One launch: grad_loss [1] and row_weights [B] of the accumulation type; grad_values [B, T] of `dtype`.
cudaError_t value_loss_backward(DType dtype, const ValueLossTensors& x, double clip, const void* grad_loss,
                                const void* row_weights, void* grad_values, cudaStream_t stream);

}  // namespace cuda
}  // namespace rlk
