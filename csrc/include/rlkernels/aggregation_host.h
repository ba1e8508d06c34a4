// The loss of each `agg` mode from a kernel's per-row masked sums, inside the op (rlkernels/reference/
// aggregation.py is the spec and holds the formulas). Every mode is loss = Σ_b c_b · S_b with per-row weights
// c_b that depend on the mask's row counts and the normalizers only, so the op returns c_b = d loss / d S_b
// and the backward pass needs nothing else. ATen ops on the rows' device: no host sync on a GPU, and one
// custom op call instead of a dozen small torch ops from Python (~10 us each on CPU).
#pragma once

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/dot.h>
#include <ATen/ops/full_like.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/where.h>

#include <optional>
#include <tuple>
#include <utility>

#include "rlkernels/agg_config.h"
#include "rlkernels/torch_utils.h"

namespace rlk {

// Codes in rlkernels/reference/aggregation.py AGG_MODES order.
enum class AggMode : int {
  TokenMean = 0,
  TokenSum = 1,
  SeqMeanTokenSum = 2,
  SeqMeanTokenMean = 3,
  SeqMeanTokenSumNorm = 4,
};

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

// A global normalizer (num_tokens, num_seqs): a number, a one-element tensor on the rows' device (an
// all-reduced count, read there), or absent (then this batch's own count).
struct Normalizer {
  std::optional<double> value;
  std::optional<at::Tensor> tensor;
  bool given() const { return value.has_value() || tensor.has_value(); }
};

// The aggregation arguments of an op's schema (RLK_AGG_CONFIG_SCHEMA), parsed.
struct AggArgs {
  AggMode mode;
  double dp_size, norm_len;
  Normalizer num_tokens, num_seqs;
};

inline Normalizer checked_normalizer(const char* op, const char* name, std::optional<double> value,
                                     const std::optional<at::Tensor>& tensor) {
  TORCH_CHECK(!(value && tensor), op, ": ", name, " is given both as a number and as a tensor");
  TORCH_CHECK(!value || *value >= 0, op, ": ", name, " must be >= 0, got ", *value);
  TORCH_CHECK(!tensor || tensor->numel() == 1, op, ": ", name, " must be a one-element tensor, got shape ",
              tensor->sizes());
  return Normalizer{value, tensor};
}

inline AggArgs make_agg_args(const char* op, RLK_AGG_CONFIG_PARAMS) {
  TORCH_CHECK(dp_size >= 1, op, ": dp_size must be >= 1, got ", dp_size);
  TORCH_CHECK(norm_len >= 0, op, ": norm_len must be >= 0, got ", norm_len);  // 0: T = 0 (loss 0)
  return AggArgs{checked_agg_mode(agg), double(dp_size), norm_len,
                 checked_normalizer(op, "num_tokens", num_tokens, num_tokens_tensor),
                 checked_normalizer(op, "num_seqs", num_seqs, num_seqs_tensor)};
}

// w · dp / denom, and 0 where denom == 0 (a fully masked batch gives a loss of 0, never NaN).
inline at::Tensor scale_by(const at::Tensor& w, double dp, double denom) { return w * (denom > 0 ? dp / denom : 0.0); }

inline at::Tensor scale_by(const at::Tensor& w, double dp, const at::Tensor& denom) {
  TORCH_CHECK(denom.device() == w.device(), "rlkernels: a normalizer tensor is on ", denom.device(),
              " but the inputs are on ", w.device());
  const at::Tensor d = denom.reshape({}).to(w.scalar_type());
  return w * at::where(d > 0, d.reciprocal() * dp, 0.0);  // 1/0 = inf is never selected
}

inline at::Tensor scale_by(const at::Tensor& w, double dp, const Normalizer& given, const at::Tensor& fallback) {
  if (given.value) return scale_by(w, dp, *given.value);
  return scale_by(w, dp, given.tensor ? *given.tensor : fallback);
}

// (loss [], row weights c [B]) from the masked row sums S [B] and row token counts n [B] (accumulation type).
inline std::pair<at::Tensor, at::Tensor> aggregate_rows(const at::Tensor& row_sums, const at::Tensor& row_counts,
                                                        const AggArgs& a) {
  // seq-mean-token-mean weighs each row by 1/n_b (0 for a row without tokens); the other modes by 1.
  const at::Tensor w = a.mode == AggMode::SeqMeanTokenMean ? at::where(row_counts > 0, row_counts.reciprocal(), 0.0)
                                                          : at::full_like(row_sums, 1.0);
  at::Tensor weights;
  switch (a.mode) {
    case AggMode::TokenMean:
      weights = scale_by(w, a.dp_size, a.num_tokens, at::sum(row_counts));
      break;
    case AggMode::TokenSum:
      weights = w * a.dp_size;
      break;
    default:  // the seq-mean modes: over the rows with tokens (seq-mean-token-sum-norm: then / norm_len)
      weights = scale_by(a.mode == AggMode::SeqMeanTokenSumNorm ? scale_by(w, 1.0, a.norm_len) : w, a.dp_size,
                         a.num_seqs, at::sum(row_counts > 0));
      break;
  }
  return {at::dot(row_sums, weights), weights};
}

// Masked means over the batch's tokens [K] from per-row sums [B, K] and counts [B]; 0 without tokens.
inline at::Tensor stat_means(const at::Tensor& row_sums, const at::Tensor& row_counts) {
  return scale_by(at::sum(row_sums, 0), 1.0, at::sum(row_counts));
}

// A loss op's outputs from its per-row sums row_loss [B] and row_stats [B, C]: (loss [], stat means [C -
// first_stat] of the columns from first_stat on, row weights [B]); column count_col holds the row counts.
inline std::tuple<at::Tensor, at::Tensor, at::Tensor> finish_rows(const at::Tensor& row_loss,
                                                                 const at::Tensor& row_stats, int64_t count_col,
                                                                 int64_t first_stat, const AggArgs& agg) {
  const at::Tensor counts = row_stats.select(1, count_col);
  auto [loss, weights] = aggregate_rows(row_loss, counts, agg);
  return {loss, stat_means(row_stats.narrow(1, first_stat, row_stats.size(1) - first_stat), counts), weights};
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

// d output / d row sum [B] = grad_loss · row_weights, on the rows' device (the backward ops' per-row scale).
inline at::Tensor row_grads(const at::Tensor& grad_loss, const at::Tensor& row_weights) {
  return (row_weights * grad_loss.reshape({})).contiguous();
}

}  // namespace rlk
