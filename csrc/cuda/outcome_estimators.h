// Launchers of the grpo_passk and opo CUDA kernels (csrc/cuda/outcome_estimators.cu), called by
// outcome_estimators_binding.cpp. stats: [4 * b + 1] (passk) / [3 * b + 1] (opo) doubles of scratch, the
// statistics' rows and, past one chunk of responses, the non-finite count the chunk path's passes share.
#pragma once

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "rlkernels/dtype.h"

namespace rlk {
namespace cuda {

// scores / out [b] float32 or float64; sorted_ids [b] (int64 or int32) and perm [b] int64 from a stable sort
// of the group ids; ok [] bool: every score finite. Scratch, any contents: head [b] int64, stats [4, b]
// float64 (count, pivot-shifted sum, centered sum of squares, ties of the best), keys [2, b] int64 (the ordered
// keys of the best and second-best scores). One launch.
cudaError_t grpo_passk_sorted(DType dtype, const void* scores, const void* sorted_ids, bool ids_int64,
                              const int64_t* perm, int64_t* head, void* stats, int64_t* keys, void* out, bool* ok,
                              int64_t b, double eps, bool norm_by_std, cudaStream_t stream);

// scores / out [b] float32 or float64; the sort, ok and head as above; mask [b, t] bool / int64 / the scores'
// dtype (mask_kind 0 / 1 / 2), each row's sum (nonzero integers count 1) the response's length L; lengths [b]
// and stats [3, b] float64 scratch (count, Σ L, Σ L (s − pivot)); counter: the zeroed launch counter
// (launch_counter.h). One launch, a block per response summing its row and the last one walking (past one
// chunk: three).
struct OpoInputs {
  const void* scores;
  const void* mask;
  int mask_kind;
  int64_t t;
  const void* sorted_ids;
  bool ids_int64;
  const int64_t* perm;
  int64_t* head;
  void* lengths;
  void* stats;
  void* out;
  bool* ok;
  unsigned int* counter;
  int64_t b;
};
cudaError_t opo_sorted(DType dtype, const OpoInputs& inputs, cudaStream_t stream);

}  // namespace cuda
}  // namespace rlk
