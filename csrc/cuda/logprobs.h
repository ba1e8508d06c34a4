// Launchers of the row kernels of the log-prob ops (csrc/cuda/logprobs.cu), called by
// csrc/cuda/logprobs_binding.cpp. A "row matrix" is [rows, cols] with unit column stride and row stride ld.
// Per-row arrays (labels int64, statistics and gradients) are contiguous; statistics and scalars are in the
// accumulation dtype `acc` (fp32, or fp64 for fp64 inputs), which is also the dtype of `bias`.
#pragma once

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "rlkernels/common.h"
#include "rlkernels/dtype.h"

namespace rlk {
namespace cuda {

// Where the rows of an input row matrix are, in elements from its start: row r at
// (r / per_batch) * ld_batch + (r % per_batch) * ld. A [rows, cols] matrix at row stride ld is batches of one
// row (`matrix`, as rlkernels/triton/logprobs_from_logits.py _row_strides takes it); the [B, T, V] logits of a
// slice such as logits[:, :-1] are B batches of T rows, read in place.
struct RowStrides {
  int64_t ld;
  int64_t per_batch;  // >= 1
  int64_t ld_batch;

  static RowStrides matrix(int64_t ld) { return {0, 1, ld}; }
  RLK_HOST_DEVICE int64_t offset(int64_t row) const {
    return (row / per_batch) * ld_batch + (row % per_batch) * ld;
  }
};

struct LogitArgs {
  double temperature;
  double softcap;  // <= 0: none
  int64_t ignore_index;
  bool entropy;  // compute / use the entropy terms
  bool sum_sq;   // compute Σ softmax² (forward only)
};

// Merge the softmax statistics (m, s, a, s2) of every row of x [rows, cols] (column j is vocabulary entry
// col0 + j; bias [cols] added first when non-null) into m/s/a/s2 [rows], and write the transformed logit of the
// row's label into z_target [rows] when the label lies in [col0, col0 + cols). Rows whose label is
// ignore_index are skipped. a is only touched when args.entropy, s2 only when args.sum_sq.
cudaError_t softmax_rows_stats(DType x_dtype, const void* x, int64_t ld, int64_t rows, int64_t cols, int64_t col0,
                               const void* bias, const int64_t* labels, LogitArgs args, void* m, void* s, void* a,
                               void* s2, void* z_target, cudaStream_t stream);

// logp, entropy (when args.entropy), lse (float64), sum_sq = Σ softmax² (when args.sum_sq) [rows] from the
// merged statistics; ignored rows get 0.
cudaError_t softmax_rows_finalize(DType acc, const void* m, const void* s, const void* a, const void* s2,
                                  const void* z_target, const int64_t* labels, int64_t rows, LogitArgs args,
                                  void* logp, void* entropy, void* lse, void* sum_sq, cudaStream_t stream);

// out [rows, cols] (row stride ld_out, dtype out_dtype) = d(Σ g_logp·logp + Σ g_ent·H) / d x for x [rows, cols]
// (rows at x_rows; column j is vocabulary entry col0 + j; bias as above; lse float64). entropy / g_ent only
// read when args.entropy; g_logp and g_ent read at g_stride (0: one element broadcast), g_logp null: 0.
// Ignored rows get 0. out may alias x when both have the same dtype and x is a matrix at row stride ld_out.
// Supported (x, out) dtypes: (fp32, fp32 / fp16 / bf16), and (T, T) for fp64, fp16, bf16.
cudaError_t softmax_rows_grad(DType x_dtype, const void* x, RowStrides x_rows, DType out_dtype, void* out,
                              int64_t ld_out, int64_t rows, int64_t cols, int64_t col0, const void* bias,
                              const int64_t* labels, LogitArgs args, const void* lse, const void* entropy,
                              const void* g_logp, const void* g_ent, cudaStream_t stream, int64_t g_stride = 1);

// logprobs_from_logits in one launch over full logits rows x [rows, cols] (at x_rows): logp, entropy
// (args.entropy), lse (float64), sum_sq (args.sum_sq) [rows] as softmax_rows_stats + softmax_rows_finalize,
// each label checked (in [0, cols) or ignore_index; a row with another gives 0); parts [rows] float scratch,
// counter the zeroed launch counter (launch_counter.h), ok [] bool: no bad label.
cudaError_t logits_rows(DType x_dtype, const void* x, RowStrides x_rows, int64_t rows, int64_t cols,
                        const int64_t* labels, LogitArgs args, void* logp, void* entropy, void* lse, void* sum_sq,
                        float* parts, unsigned int* counter, bool* ok, cudaStream_t stream);

}  // namespace cuda
}  // namespace rlk
