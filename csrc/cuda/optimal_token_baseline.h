// Launcher of the optimal token baseline's CUDA kernels (csrc/cuda/optimal_token_baseline.cu), called by
// optimal_token_baseline_binding.cpp.
#pragma once

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "rlkernels/dtype.h"

namespace rlk {
namespace cuda {

// Columns of the rows pass's per-response scratch: the length Σ m, the count of rejected values.
constexpr int kOtbRowStats = 2;

// How the [B, T] mask is stored: bool, int64 (0 / 1) or float weights of the rewards' dtype.
enum class OtbMask : int { Bool, Int64, Float };

struct OtbArgs {
  DType dtype;                  // Float32 or Float64: rewards, old_logp, sum_pi_squared, is_weights, outputs
  const void* rewards;          // [b, t]
  const void* mask;             // [b, t], mask_kind
  OtbMask mask_kind;
  const void* old_logp;         // [b, t]
  const void* sum_pi_squared;   // [b, t]
  const void* is_weights;       // [b, t] or nullptr
  const void* sorted_ids;       // [b] from a stable sort of the group ids
  bool ids_int64;               // else int32
  const int64_t* perm;          // [b] their original indices
  void* row_stats;              // [b, kOtbRowStats] scratch in dtype: each row's length and rejected values
  void* advantages;             // [b, t] out (W·m scratch between the launches)
  void* returns;                // [b, t] out
  bool* ok;                     // [] out: every value valid
  int64_t b, t;
  bool zero_tail;
  double eps;
};

// The rows pass, then the groups pass (two launches; the module comment of optimal_token_baseline.cu).
cudaError_t optimal_token_baseline_sorted(const OtbArgs& args, cudaStream_t stream);

}  // namespace cuda
}  // namespace rlk
