// Launchers of the gae / discounted_returns CUDA kernels (csrc/cuda/gae.cu), called by gae_binding.cpp.
#pragma once

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "rlkernels/dtype.h"

namespace rlk {
namespace cuda {

// Where the rows of a scan are: row i covers [offsets[i], offsets[i+1]) of the flat inputs when
// `offsets` is given (packed; int32 or int64, clamped to [0, numel] on the device, and checked into the
// validity flag), else [i * row_len, (i + 1) * row_len) (padded).
struct ScanRows {
  const void* offsets;  // [rows + 1] device array or nullptr
  bool offsets_int64;
  int64_t rows;
  int64_t row_len;
  int64_t numel;
};

// How the mask is given: bool, int64 (0 / 1) or float weights of the inputs' accumulation type.
enum class ScanMask : int { Bool = 0, Int64 = 1, Float = 2 };

// One scan op: kind rlk::ScanKind; rewards, values (GAE only; else unused), out, second: [numel] of the
// inputs' dtype; mask: [numel] of mask_kind; baseline: [rows] or nullptr (returns only). second: GAE's returns,
// or (returns) returns - baseline·mask with a baseline, masked_whiten(returns)·mask with whiten, else unused.
// parts: [max(rows, 1), 4] of the accumulation type (fp64 for fp64, else fp32), scratch; counter: the zeroed
// launch counter (launch_counter.h); coef: [2] of the accumulation type (whitening mean, rstd); ok: [] bool,
// every input value valid.
struct ScanArgs {
  int kind;
  bool whiten;
  ScanMask mask_kind;
  ScanRows rows;
  const void* rewards;
  const void* values;
  const void* mask;
  const void* baseline;
  void* out;
  void* second;
  void* parts;
  unsigned int* counter;
  void* coef;
  bool* ok;
  double gamma;
  double gamma_lam;
};

// Scans every row right to left (one block per row; one launch, +1 to whiten).
cudaError_t scan_forward(DType dtype, const ScanArgs& args, cudaStream_t stream);

}  // namespace cuda
}  // namespace rlk
