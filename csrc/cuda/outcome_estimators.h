// Launchers of the grpo_passk and opo CUDA kernels (csrc/cuda/outcome_estimators.cu), called by
// outcome_estimators_binding.cpp. Groups are given by representatives rep [b] int64 (the index of each
// response's group's first member).
#pragma once

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "rlkernels/dtype.h"

namespace rlk {
namespace cuda {

// scores / out [b] float32 or float64. stats: [4, b] float64, zero-filled (count, pivot-shifted sum,
// centered sum of squares, ties of the best); keys: [2, b] int64 filled with INT64_MIN (the ordered keys of
// the best and second-best scores).
cudaError_t grpo_passk_by_rep(DType dtype, const void* scores, const int64_t* rep, void* stats, int64_t* keys,
                              void* out, int64_t b, double eps, bool norm_by_std, cudaStream_t stream);

// scores / lengths / out [b] float32 or float64 (one dtype). stats: [3, b] float64, zero-filled (count,
// Σ L, Σ L (s − pivot)).
cudaError_t opo_by_rep(DType dtype, const void* scores, const void* lengths, const int64_t* rep, void* stats,
                       void* out, int64_t b, cudaStream_t stream);

}  // namespace cuda
}  // namespace rlk
