// The reduction of the token-level loss ops (policy_loss, value_loss), shared by the CPU kernels and the CUDA
// kernels (which finish it in the forward launch's last block, csrc/cuda/loss_finish.cuh): how a mask is read,
// which input values the kernels reject, and the loss aggregation from per-row sums. The Triton kernels
// mirror it (rlkernels/triton/_aggregation.py, _mask.py load_mask, policy_loss.py _token_terms). No torch headers.
//
// Aggregation (spec and formulas: rlkernels/reference/aggregation.py). Every `agg` mode is
//     loss = Σ_b c_b · S_b,    c_b = row_factor(n_b) · scale
// with S_b the masked row sums of the token loss and n_b the rows' mask sums: row_factor is 1/n_b (0 for an
// empty row) for seq-mean-token-mean and 1 otherwise, and `scale` depends on the batch's totals and the
// normalizers only. So c_b = d loss / d S_b is all the backward pass needs.
#pragma once

#include <stdint.h>
#include <string.h>

#include "rlkernels/common.h"

namespace rlk {

// ---- masks and value checks ----

// How a [B, T] mask is stored: bool, integer (uint8 / int32 / int64) or float weights of the accumulation type.
enum class MaskType : int { Bool, UInt8, Int32, Int64, Float };

// A token's mask weight: a bool or integer mask (0 / 1, a Hugging Face attention_mask: nonzero -> 1) gives 0 or
// 1, a float mask its value (a weight).
// Conversions, not selects: gcc compiles a select times a value into a branch per element, which a random
// mask mispredicts (rlkernels/gae.h mask_weight).
template <typename A>
RLK_HOST_DEVICE A mask_weight(bool m) {
  return A(m);
}
template <typename A>
RLK_HOST_DEVICE A mask_weight(uint8_t m) {
  return A(m != 0);
}
template <typename A>
RLK_HOST_DEVICE A mask_weight(int32_t m) {
  return A(m != 0);
}
template <typename A>
RLK_HOST_DEVICE A mask_weight(int64_t m) {
  return A(m != 0);
}
template <typename A>
RLK_HOST_DEVICE A mask_weight(float m) {
  return A(m);
}
template <typename A>
RLK_HOST_DEVICE A mask_weight(double m) {
  return A(m);
}

// Whether x is a finite number (NaN and ±inf are not).
template <typename T>
RLK_HOST_DEVICE bool finite_value(T x) {
  return abs_(x) < T(INFINITY);
}

// The values the ops reject (the public functions' contract; the kernels raise their `ok` flag): a weight (a
// float mask value, an importance weight) that is negative or not finite, and an integer mask value other
// than 0 and 1. A bool mask has none. Comparisons combined with `|` / `&`: the CPU loops vectorize them.
template <typename T>
RLK_HOST_DEVICE bool bad_weight(T w) {
  return !((w >= T(0)) & (w < T(INFINITY)));
}
RLK_HOST_DEVICE bool bad_mask_value(bool) { return false; }
RLK_HOST_DEVICE bool bad_mask_value(uint8_t m) { return m > 1; }
RLK_HOST_DEVICE bool bad_mask_value(int32_t m) { return (m != 0) & (m != 1); }
RLK_HOST_DEVICE bool bad_mask_value(int64_t m) { return (m != 0) & (m != 1); }
RLK_HOST_DEVICE bool bad_mask_value(float m) { return bad_weight(m); }
RLK_HOST_DEVICE bool bad_mask_value(double m) { return bad_weight(m); }

// ---- aggregation ----

// Codes in rlkernels/reference/aggregation.py AGG_MODES order.
enum class AggMode : int {
  TokenMean = 0,
  TokenSum = 1,
  SeqMeanTokenSum = 2,
  SeqMeanTokenMean = 3,
  SeqMeanTokenSumNorm = 4,
};

// The dtypes a normalizer tensor may have (a one-element count, e.g. all-reduced), read by the kernel as is.
enum class CountType : int { Float32, Float64, Float16, BFloat16, Int64, Int32, Int16, Int8, UInt8 };

// A global normalizer (num_tokens, num_seqs) as the kernels take it: absent (then this batch's own count), a
// number, or one element at `ptr` of type `type` on the kernel's device (read there: no host sync).
struct Normalizer {
  enum Kind : int { kNone = 0, kValue = 1, kTensor = 2 };
  int kind = kNone;
  double value = 0;
  const void* ptr = nullptr;
  CountType type = CountType::Float32;
};

// The aggregation arguments of a forward launch (the op's AggConfig, parsed by aggregation_host.h).
struct AggParams {
  AggMode mode;
  double dp_size, norm_len;
  Normalizer num_tokens, num_seqs;
};

// An IEEE half / bfloat16 value from its bits (exact).
RLK_HOST_DEVICE double half_bits_value(uint16_t h) {
  const int exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
  const double sign = (h & 0x8000) ? -1.0 : 1.0;
  if (exponent == 0x1f) return mantissa ? double(NAN) : sign * double(INFINITY);
  if (exponent == 0) return sign * ldexp(double(mantissa), -24);  // subnormal
  return sign * ldexp(double(mantissa | 0x400), exponent - 25);
}
RLK_HOST_DEVICE double bfloat16_bits_value(uint16_t h) {
  const uint32_t bits = uint32_t(h) << 16;
  float f;
  memcpy(&f, &bits, sizeof f);
  return double(f);
}

// The element at p of type t, as a double.
RLK_HOST_DEVICE double read_count(const void* p, CountType t) {
  switch (t) {
    case CountType::Float32:
      return double(*static_cast<const float*>(p));
    case CountType::Float64:
      return *static_cast<const double*>(p);
    case CountType::Float16:
      return half_bits_value(*static_cast<const uint16_t*>(p));
    case CountType::BFloat16:
      return bfloat16_bits_value(*static_cast<const uint16_t*>(p));
    case CountType::Int64:
      return double(*static_cast<const int64_t*>(p));
    case CountType::Int32:
      return double(*static_cast<const int32_t*>(p));
    case CountType::Int16:
      return double(*static_cast<const int16_t*>(p));
    case CountType::Int8:
      return double(*static_cast<const int8_t*>(p));
    case CountType::UInt8:
      return double(*static_cast<const uint8_t*>(p));
  }
  return 0.0;
}

// A normalizer's value, or `own` (this batch's count) when it is not given.
template <typename A>
RLK_HOST_DEVICE A normalizer_value(const Normalizer& n, A own) {
  if (n.kind == Normalizer::kValue) return A(n.value);
  if (n.kind == Normalizer::kTensor) return A(read_count(n.ptr, n.type));
  return own;
}

// `scale` of the batch, from its token count (Σ_b n_b) and its rows with tokens (#{b : n_b > 0}): dp_size over
// the mode's normalizer (num_tokens or the token count for token-mean, num_seqs or the nonempty rows for the
// seq-mean modes, then / norm_len for seq-mean-token-sum-norm), dp_size for token-sum. A normalizer that is
// not > 0 (a fully masked batch) gives 0: a loss of 0, never NaN.
template <typename A>
RLK_HOST_DEVICE A aggregation_scale(const AggParams& p, A tokens, A nonempty_rows) {
  const A dp = A(p.dp_size);
  if (p.mode == AggMode::TokenSum) return dp;
  const A denom = p.mode == AggMode::TokenMean ? normalizer_value(p.num_tokens, tokens)
                                               : normalizer_value(p.num_seqs, nonempty_rows);
  const A scale = denom > A(0) ? dp / denom : A(0);
  if (p.mode != AggMode::SeqMeanTokenSumNorm) return scale;
  return p.norm_len > 0 ? scale / A(p.norm_len) : A(0);
}

// c_b = d loss / d S_b of a row with mask sum n_b (`count`).
template <typename A>
RLK_HOST_DEVICE A aggregation_row_weight(AggMode mode, A scale, A count) {
  if (mode == AggMode::SeqMeanTokenMean) return count > A(0) ? scale / count : A(0);
  return scale;
}

// A stat's masked mean over the batch's tokens from its sum: 0 without tokens.
template <typename A>
RLK_HOST_DEVICE A token_mean(A sum, A tokens) {
  return tokens > A(0) ? sum / tokens : A(0);
}

}  // namespace rlk
