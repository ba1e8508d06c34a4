// Launchers of the gae / discounted_returns CUDA kernels (csrc/cuda/gae.cu), called by gae_binding.cpp.
#pragma once

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "rlkernels/dtype.h"

namespace rlk {
namespace cuda {

// Where the rows of a scan are: row i covers [offsets[i], offsets[i+1]) of the flat inputs when
// `offsets` is given (packed; int32 or int64, clamped to [0, numel] on the device), else
// [i * row_len, (i + 1) * row_len) (padded).
struct ScanRows {
  const void* offsets;  // [rows + 1] device array or nullptr
  bool offsets_int64;
  int64_t rows;
  int64_t row_len;
  int64_t numel;
};

// Scans every row right to left (one block per row). kind: rlk::ScanKind. rewards, values (GAE only;
// else unused), out, ret (GAE only): [numel] of `dtype`; mask: [numel] bool or `dtype`. moments: nullptr,
// or [rows, 3] of the accumulation type (fp64 for fp64, else fp32) to receive each row's (weight, mean,
// centered sum of squares) of the advantages.
cudaError_t scan_forward(DType dtype, bool mask_is_bool, int kind, const ScanRows& rows, const void* rewards,
                         const void* values, const void* mask, void* out, void* ret, void* moments, double gamma,
                         double gamma_lam, cudaStream_t stream);

// x = (x - coef[0]) * coef[1] over [n] values of `dtype`; coef: 2 values of the accumulation type.
cudaError_t whiten_apply(DType dtype, void* x, const void* coef, int64_t n, cudaStream_t stream);

}  // namespace cuda
}  // namespace rlk
