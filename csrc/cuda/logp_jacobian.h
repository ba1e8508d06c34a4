// Launchers of the frozen head's vocabulary stream (csrc/cuda/logp_jacobian.cu), called by
// csrc/cuda/logp_jacobian_binding.cpp; the Triton flavor's twin is rlkernels/triton/logp_jacobian.py, the
// host loop around both rlkernels/ops/logp_jacobian.py. `head` is the head's dtype: the bias's and e's (GEMM 2's
// operand); z, acc and state are in its accumulation dtype (fp32, fp64 for fp64 heads). Rows are contiguous
// with the given row strides; labels [rows] int64, bias [V] and state [5, rows] contiguous.
#pragma once

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "rlkernels/dtype.h"

namespace rlk {
namespace cuda {

// The rows of the [5, rows] state: the reference max m, Σe, Σe², the label's transformed logit and its
// softcap slope c' (1 without a softcap). rlkernels/ops/logp_jacobian.py's STATE_* are the same rows, and set
// their start.
enum JacobianState : int { kStateMax = 0, kStateSum, kStateSumSq, kStateLabelLogit, kStateLabelSlope };

// One chunk [v0, v0 + cols) of a block: z [rows, cols] its logits (bias not added), e [rows, cols] written as
// e^{y − m}·c' (0 for ignored rows), acc [rows, dim] rescaled in place where a row's reference m moves (by more
// than e^8), state updated. softcap <= 0: none.
cudaError_t logp_jacobian_chunk(DType head, const void* z, int64_t ld_z, void* e, int64_t ld_e, void* acc,
                                int64_t ld_acc, const int64_t* labels, const void* bias, void* state, int64_t rows,
                                int64_t cols, int64_t dim, int64_t vocab, int64_t v0, double temperature,
                                double softcap, int64_t ignore_index, cudaStream_t stream);

// The end of a block: logp [rows], sum_sq [rows] (when non-null) and out [rows, dim] = d logp / d hidden in the
// head's dtype (or, out_in_acc, the accumulation dtype), from acc and state; weight [vocab, dim] at strides
// (ld_w, col_w). Ignored rows get 0. The softcap's slope at the label is in the state.
cudaError_t logp_jacobian_finish(DType head, const void* acc, int64_t ld_acc, const void* state,
                                 const int64_t* labels, const void* weight, int64_t ld_w, int64_t col_w,
                                 bool out_in_acc, void* out, int64_t ld_out, void* logp, void* sum_sq, int64_t rows,
                                 int64_t dim, int64_t vocab, double temperature, int64_t ignore_index,
                                 cudaStream_t stream);

}  // namespace cuda
}  // namespace rlk
