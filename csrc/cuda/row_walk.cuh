// A row of a row kernel read in 16-byte packs by the block's threads (csrc/cuda/logprobs.cu,
// csrc/cuda/logp_jacobian.cu). Torch-free.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

#include "common.cuh"
#include "rlkernels/logprobs.h"  // LogitTransform, transform_logit

namespace rlk {
namespace cuda {

// Packs a thread loads before it computes on the first: 64 bytes a thread, 16 KiB a block of 256 threads in
// flight, as much as a Triton program's two 4096-logit bf16 tiles (LOAD_STAGES); one load a thread left a
// block 512 bytes in flight and the row loop waiting on each.
constexpr int kPacksInFlight = 4;

// The transformed logit of a row's raw value x at column j, bias[j] (in its own dtype: the accumulation
// dtype in logprobs.cu's row kernels, the head's in logp_jacobian.cu's chunk kernel) added first where bias
// is non-null.
template <typename In, typename A, bool kSoftcap, typename B>
__device__ __forceinline__ A row_logit(In x, const B* __restrict__ bias, int64_t j, const LogitTransform<A>& t) {
  A v = to_acc(x);
  if (bias != nullptr) v += A(to_acc(bias[j]));
  return transform_logit<A, kSoftcap>(v, t.cap, t.inv_cap, t.inv_temp);
}

// A row is read in 16-byte packs (common.cuh), a thread taking the packs threadIdx.x, + blockDim.x, ...; the
// columns before the row's first 16-byte boundary (an odd vocabulary's rows, a chunk's offset) and after its
// last whole pack go one logit a thread. A row's columns [0, cols): [0, head) before that boundary, then
// `packs` whole packs, then [tail, cols).
struct RowSplit {
  int64_t head, packs, tail;
};

template <typename In>
__device__ __forceinline__ RowSplit split_row(const In* row, int64_t cols) {
  const auto misaligned = int64_t(reinterpret_cast<uintptr_t>(row) % 16);
  int64_t head = misaligned == 0 ? 0 : (16 - misaligned) / int64_t(sizeof(In));
  head = head < cols ? head : cols;
  const int64_t packs = (cols - head) / kPack<In>;
  return {head, packs, head + packs * kPack<In>};
}

// Walks one row's columns [0, cols) as the block's threads share them: one(j, x[j]) for each column before
// the row's first 16-byte boundary and after its last whole pack, pack(p, j0, packed) for each whole pack p
// (columns j0 = head + p·P on), a thread loading kPacksInFlight packs before it hands over the first.
template <typename In, typename One, typename PackFn>
__device__ __forceinline__ void walk_row(const In* x, int64_t cols, One one, PackFn pack) {
  constexpr int P = kPack<In>;
  const RowSplit r = split_row(x, cols);
  for (int64_t j = threadIdx.x; j < r.head; j += blockDim.x) one(j, x[j]);
  const auto* packs = reinterpret_cast<const Pack<In, P>*>(x + r.head);
  const int64_t step = int64_t(blockDim.x) * kPacksInFlight;
  for (int64_t p0 = threadIdx.x; p0 < r.packs; p0 += step) {
    Pack<In, P> loaded[kPacksInFlight];
#pragma unroll
    for (int k = 0; k < kPacksInFlight; ++k) {
      const int64_t p = p0 + int64_t(k) * blockDim.x;
      if (p < r.packs) loaded[k] = packs[p];
    }
#pragma unroll
    for (int k = 0; k < kPacksInFlight; ++k) {
      const int64_t p = p0 + int64_t(k) * blockDim.x;
      if (p >= r.packs) break;
      pack(p, r.head + p * P, loaded[k]);
    }
  }
  for (int64_t j = r.tail + threadIdx.x; j < cols; j += blockDim.x) one(j, x[j]);
}

}  // namespace cuda
}  // namespace rlk
