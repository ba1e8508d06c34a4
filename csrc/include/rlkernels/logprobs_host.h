// Host-side argument checks of the log-prob ops (linear_logprobs, logprobs_from_logits), shared by their
// CPU implementations. The Python API already validates with friendlier messages; these keep direct
// torch.ops callers from ever indexing out of bounds.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <optional>

#include "rlkernels/torch_utils.h"

namespace rlk {

// labels: 1-D int32/int64 of n elements, each in [0, vocab) or equal to ignore_index.
inline void check_logprob_labels(const char* op, const at::Tensor& labels, int64_t n, int64_t vocab,
                                 int64_t ignore_index) {
  TORCH_CHECK(labels.dim() == 1 && labels.size(0) == n, op, ": labels must have shape [", n, "], got ",
              labels.sizes());
  TORCH_CHECK(labels.scalar_type() == at::kLong || labels.scalar_type() == at::kInt, op,
              ": labels must be int32 or int64, got ", labels.scalar_type());
  if (n == 0) return;
  const at::Tensor bad = labels.lt(0).logical_or(labels.ge(vocab)).logical_and(labels.ne(ignore_index));
  TORCH_CHECK(!bad.any().item<bool>(), op, ": labels must lie in [0, ", vocab, ") or equal ignore_index (",
              ignore_index, ")");
}

inline void check_temperature_softcap(const char* op, double temperature, std::optional<double> softcap) {
  TORCH_CHECK(temperature > 0, op, ": temperature must be > 0, got ", temperature);
  TORCH_CHECK(!softcap.has_value() || *softcap > 0, op, ": softcap must be > 0 or None, got ", *softcap);
}

// A per-row fp32/fp64 vector of n elements (lse, entropy, upstream gradients).
inline void check_row_vector(const char* op, const at::Tensor& t, const char* name, int64_t n) {
  TORCH_CHECK(t.dim() == 1 && t.size(0) == n, op, ": ", name, " must have shape [", n, "], got ", t.sizes());
  TORCH_CHECK(at::isFloatingType(t.scalar_type()), op, ": ", name, " must be floating point, got ",
              t.scalar_type());
}

}  // namespace rlk
