// Host-side argument checks of the log-prob ops (linear_logprobs, logprobs_from_logits), shared by their
// CPU implementations. The Python API already validates with friendlier messages; these keep direct
// torch.ops callers from ever indexing out of bounds.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <optional>

#include "rlkernels/torch_utils.h"

namespace rlk {

// labels: 1-D int32/int64 of n elements.
inline void check_logprob_label_shape(const char* op, const at::Tensor& labels, int64_t n) {
  TORCH_CHECK(labels.dim() == 1 && labels.size(0) == n, op, ": labels must have shape [", n, "], got ",
              labels.sizes());
  TORCH_CHECK(labels.scalar_type() == at::kLong || labels.scalar_type() == at::kInt, op,
              ": labels must be int32 or int64, got ", labels.scalar_type());
}

// Whether every label of a CPU tensor lies in [0, vocab) or equals ignore_index (one pass, no ATen op).
inline bool labels_in_range(const at::Tensor& labels, int64_t vocab, int64_t ignore_index) {
  const at::Tensor y = labels.to(at::kLong).contiguous();
  const int64_t* p = y.const_data_ptr<int64_t>();
  for (int64_t i = 0; i < y.numel(); ++i) {
    if (p[i] != ignore_index && (p[i] < 0 || p[i] >= vocab)) return false;
  }
  return true;
}

// labels: 1-D int32/int64 of n elements, each in [0, vocab) or equal to ignore_index. The values are checked
// on CPU tensors only: on a GPU that would be a host sync (the Python API enqueues an async assert, or the
// checked kernels set a flag, instead), and the CUDA kernels only compare labels with column indices, never
// index with them.
inline void check_logprob_labels(const char* op, const at::Tensor& labels, int64_t n, int64_t vocab,
                                 int64_t ignore_index) {
  check_logprob_label_shape(op, labels, n);
  if (n == 0 || !labels.is_cpu()) return;
  TORCH_CHECK(labels_in_range(labels, vocab, ignore_index), op, ": labels must lie in [0, ", vocab,
              ") or equal ignore_index (", ignore_index, ")");
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

// hidden [N, D] and weight [V, D] of one floating dtype, V >= 1; bias [V] or None; chunk_size >= 1 or None.
inline void check_linear_inputs(const char* op, const at::Tensor& hidden, const at::Tensor& weight,
                                const std::optional<at::Tensor>& bias, std::optional<int64_t> chunk_size) {
  TORCH_CHECK(hidden.dim() == 2, op, ": hidden must be 2-D [N, D], got ", hidden.sizes());
  TORCH_CHECK(weight.dim() == 2 && weight.size(1) == hidden.size(1), op, ": weight must be [V, ", hidden.size(1),
              "], got ", weight.sizes());
  TORCH_CHECK(weight.size(0) >= 1, op, ": weight must have at least one row (vocabulary entry)");
  TORCH_CHECK(hidden.scalar_type() == weight.scalar_type(), op, ": hidden (", hidden.scalar_type(),
              ") and weight (", weight.scalar_type(), ") must have the same dtype");
  TORCH_CHECK(at::isFloatingType(hidden.scalar_type()), op, ": hidden must be floating point");
  if (bias.has_value()) {
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == weight.size(0), op, ": bias must be [", weight.size(0),
                "], got ", bias->sizes());
  }
  TORCH_CHECK(!chunk_size.has_value() || *chunk_size >= 1, op, ": chunk_size must be >= 1");
}

}  // namespace rlk
