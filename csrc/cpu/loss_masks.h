// The masks of the CPU loss kernels (policy_loss.cpp, value_loss.cpp) as their block loops read them: bool,
// integer (0 / 1, a Hugging Face attention_mask, read as it is and checked) or float weights of the
// accumulation type (aggregation.h MaskType; the CUDA kernels read the same types).
//
// Internal linkage on purpose, as row_loops.h: the loops carry RLK_CPU_MULTIVERSION.
#pragma once

#include <stdint.h>

#include "rlkernels/aggregation.h"
#include "row_loops.h"

namespace rlk {
namespace {

// An integer mask's weights (0 / 1) into dst; returns how many of its values are neither 0 nor 1.
template <typename I, typename A>
RLK_CPU_MULTIVERSION int64_t int_mask_span(const I* __restrict__ src, A* __restrict__ dst, int64_t n) {
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    dst[i] = mask_weight<A>(src[i]);
    bad += bad_mask_value(src[i]);
  }
  return bad;
}

// The mask of one call (bool, integer or float weights of the accumulation type: aggregation.h MaskType).
template <typename A>
struct MaskIn {
  MaskType type = MaskType::Bool;
  const void* ptr = nullptr;

  // Its weights are 0 / 1 (bool or integer).
  bool unit() const { return type != MaskType::Float; }

  // The weights of tokens [off, off + n) in the accumulation type: read in place from a float mask, else
  // converted into buf (a bool mask's 0 / 1 bytes as they are); adds to *bad the integer values other than
  // 0 and 1 (a float mask's weights are checked by the token loop).
  const A* span(int64_t off, int64_t n, A* buf, int64_t* bad) const {
    switch (type) {
      case MaskType::Float:
        return static_cast<const A*>(ptr) + off;
      case MaskType::Bool:
        convert_span(static_cast<const uint8_t*>(ptr) + off, buf, n);
        return buf;
      case MaskType::UInt8:
        *bad += int_mask_span(static_cast<const uint8_t*>(ptr) + off, buf, n);
        return buf;
      case MaskType::Int32:
        *bad += int_mask_span(static_cast<const int32_t*>(ptr) + off, buf, n);
        return buf;
      case MaskType::Int64:
        *bad += int_mask_span(static_cast<const int64_t*>(ptr) + off, buf, n);
        return buf;
    }
    return buf;
  }
};

}  // namespace
}  // namespace rlk
