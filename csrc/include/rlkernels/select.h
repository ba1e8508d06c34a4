// Branch-free helpers for the per-token math that the CPU loops must vectorize.
#pragma once

#include "rlkernels/common.h"

namespace rlk {

// 1 or 0. A select, not a bool-to-float conversion: gcc vectorizes selects but not conversions of combined
// comparisons ("bit-precision" types). Combine comparisons with `&`, not `&&`, and keep flags that are
// tested again as 0/1 values (`flag > 0`): gcc does not vectorize selects on stored bools either.
template <typename T>
RLK_HOST_DEVICE T one_if(bool c) {
  return c ? T(1) : T(0);
}

}  // namespace rlk
