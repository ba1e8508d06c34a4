// Launchers of the group_advantages CUDA kernels (csrc/cuda/advantages.cu), called by
// advantages_binding.cpp.
#pragma once

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "rlkernels/dtype.h"

namespace rlk {
namespace cuda {

// Contiguous groups: rewards / out [num_groups * group_size] of `dtype`. batch_std: nullptr (std 1) or one
// value of the accumulation type (fp64 for fp64, else fp32) on the device. mode: rlk::GroupMode.
cudaError_t group_advantages_contiguous(DType dtype, const void* rewards, void* out, const void* batch_std,
                                        int64_t num_groups, int64_t group_size, int mode, double eps,
                                        cudaStream_t stream);

// Arbitrary groups given by representatives rep [b] int64 (the index of each element's group's first
// member). stats: [3, b] float64 whatever the rewards' dtype (atomics add in no fixed order), zero-filled
// (count, pivot-shifted sum, centered sum of squares at the representatives).
cudaError_t group_advantages_by_rep(DType dtype, const void* rewards, const int64_t* rep, void* stats, void* out,
                                    const void* batch_std, int64_t b, int mode, double eps, cudaStream_t stream);

}  // namespace cuda
}  // namespace rlk
