// Host side of the loss aggregation (the math: aggregation.h, used by the CPU kernels and by the CUDA
// kernels' last block alike): the ops' aggregation arguments parsed into the AggParams the kernels read, the
// CPU kernels' finishing, the backward's checks of the forward's outputs. Nothing here launches device work:
// a normalizer tensor is read by the kernel itself.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "rlkernels/agg_config.h"
#include "rlkernels/aggregation.h"
#include "rlkernels/torch_utils.h"

namespace rlk {

inline AggMode checked_agg_mode(c10::string_view agg) {
  const std::string_view s = as_std(agg);
  if (s == "token-mean") return AggMode::TokenMean;
  if (s == "token-sum") return AggMode::TokenSum;
  if (s == "seq-mean-token-sum") return AggMode::SeqMeanTokenSum;
  if (s == "seq-mean-token-mean") return AggMode::SeqMeanTokenMean;
  if (s == "seq-mean-token-sum-norm") return AggMode::SeqMeanTokenSumNorm;
  TORCH_CHECK(false, "rlkernels: unknown agg '", agg,
              "' (expected token-mean, token-sum, seq-mean-token-sum, seq-mean-token-mean or "
              "seq-mean-token-sum-norm)");
}

inline CountType checked_count_type(const char* op, const char* name, at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return CountType::Float32;
    case at::kDouble:
      return CountType::Float64;
    case at::kHalf:
      return CountType::Float16;
    case at::kBFloat16:
      return CountType::BFloat16;
    case at::kLong:
      return CountType::Int64;
    case at::kInt:
      return CountType::Int32;
    case at::kShort:
      return CountType::Int16;
    case at::kChar:
      return CountType::Int8;
    case at::kByte:
      return CountType::UInt8;
    default:
      TORCH_CHECK(false, op, ": ", name, " must be a real (not bool or complex) tensor, got ", t);
  }
}

// A global normalizer (num_tokens, num_seqs): a number, a one-element tensor on the inputs' device (an
// all-reduced count, read by the kernel), or absent (then this batch's own count).
inline Normalizer checked_normalizer(const char* op, const char* name, std::optional<double> value,
                                     const std::optional<at::Tensor>& tensor, const at::Device& device) {
  TORCH_CHECK(!(value && tensor), op, ": ", name, " is given both as a number and as a tensor");
  Normalizer n;
  if (value) {
    TORCH_CHECK(*value >= 0, op, ": ", name, " must be >= 0, got ", *value);
    n.kind = Normalizer::kValue;
    n.value = *value;
  } else if (tensor) {
    TORCH_CHECK(tensor->numel() == 1, op, ": ", name, " must be a one-element tensor, got shape ", tensor->sizes());
    TORCH_CHECK(tensor->device() == device, op, ": ", name, " is on ", tensor->device(), " but the inputs are on ",
                device);
    n.kind = Normalizer::kTensor;
    n.ptr = tensor->const_data_ptr();  // one element: its address whatever the strides
    n.type = checked_count_type(op, name, tensor->scalar_type());
  }
  return n;
}

// The aggregation arguments of an op's schema (RLK_AGG_CONFIG_SCHEMA), parsed; the inputs are on `device`.
// The normalizer tensors' pointers stay valid while the op's arguments live.
inline AggParams make_agg_args(const char* op, const at::Device& device, RLK_AGG_CONFIG_PARAMS) {
  TORCH_CHECK(dp_size >= 1, op, ": dp_size must be >= 1, got ", dp_size);
  TORCH_CHECK(norm_len >= 0, op, ": norm_len must be >= 0, got ", norm_len);  // 0: T = 0 (loss 0)
  return AggParams{checked_agg_mode(agg), double(dp_size), norm_len,
                   checked_normalizer(op, "num_tokens", num_tokens, num_tokens_tensor, device),
                   checked_normalizer(op, "num_seqs", num_seqs, num_seqs_tensor, device)};
}

// The backward's view of the finishing: grad_loss (one element) and the forward's row_weights [B], both in
// the accumulation type `acc` on `device`.
inline void check_loss_grad(const char* op, const at::Tensor& grad_loss, const at::Tensor& row_weights, int64_t B,
                            at::ScalarType acc, const at::Device& device) {
  TORCH_CHECK(grad_loss.numel() == 1 && grad_loss.scalar_type() == acc && grad_loss.device() == device, op,
              ": grad_loss must be one element of ", acc, " on ", device);
  TORCH_CHECK(row_weights.dim() == 1 && row_weights.size(0) == B && row_weights.scalar_type() == acc &&
                  row_weights.device() == device,
              op, ": row_weights must be [B] of ", acc, " on ", device);
}

// The CPU kernels' finishing (the CUDA kernels finish in their last block: csrc/cuda/loss_finish.cuh): from
// the rows' sums rows [B, cols] in fp64 (column loss_col: S_b, count_col: n_b, bad_col: the rejected input
// values, num_stats stat sums from first_stat), writes the loss [], the stat means [num_stats] and the row
// weights c_b [B]; returns whether no input value was rejected. Rows are summed in order.
template <typename A>
bool finish_rows(const double* rows, int64_t B, int cols, int loss_col, int count_col, int first_stat,
                 int num_stats, int bad_col, const AggParams& p, A* loss, A* stats, A* weights) {
  double tokens = 0, nonempty = 0, bad = 0;
  for (int64_t b = 0; b < B; ++b) {
    const double* r = rows + b * cols;
    tokens += r[count_col];
    nonempty += r[count_col] > 0 ? 1.0 : 0.0;
    bad += r[bad_col];
  }
  const double scale = aggregation_scale<double>(p, tokens, nonempty);
  double total = 0;
  for (int64_t b = 0; b < B; ++b) {
    const double* r = rows + b * cols;
    const double c = aggregation_row_weight<double>(p.mode, scale, r[count_col]);
    weights[b] = A(c);
    total += c * r[loss_col];
  }
  *loss = A(total);
  for (int k = 0; k < num_stats; ++k) {
    double sum = 0;
    for (int64_t b = 0; b < B; ++b) sum += rows[b * cols + first_stat + k];
    stats[k] = A(token_mean<double>(sum, tokens));
  }
  return bad == 0;
}

}  // namespace rlk
