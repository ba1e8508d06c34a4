// The loss kernels' last block (docs/gpu_token_ops.md): the forward kernels of policy_loss and value_loss
// finish their loss in the same launch. Every block writes its partial sums (thread 0, after the block's
// reduction) and takes a ticket (last_block.cuh: the threadfence-reduction pattern, the counter of
// launch_counter.h); the block that draws the last ticket reduces all the partials in a fixed order
// (deterministic: no float atomics, the same result whichever block is last) into the loss, the stat means,
// the rows' weights c_b and sums, and the inputs' validity, with the aggregation math of
// rlkernels/aggregation.h. Also the launchers' dispatch on the mask's type. Torch-free.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

#include "block_reduce.cuh"
#include "common.cuh"
#include "last_block.cuh"
#include "rlkernels/aggregation.h"

namespace rlk {
namespace cuda {

// A loss forward's grid over [B, T] in chunks of kChunk tokens a row. Chunks per row: at least one, so that a
// batch without tokens still launches (and finishes).
template <int kChunk>
inline int64_t num_chunks(int64_t T) {
  return T > kChunk ? (T + kChunk - 1) / kChunk : 1;
}

// Blocks of the forward launch: one per (row, chunk), at least one (an empty batch).
template <int kChunk>
inline int64_t forward_blocks(int64_t B, int64_t T) {
  return B > 0 ? B * num_chunks<kChunk>(T) : 1;
}

// Where the columns of a forward kernel's partials [B, chunks, kParts] are: the masked loss sum S, the mask
// sum n, the row sums the op returns (kRowCols columns from kRowFirst, summed over the chunks), the stat sums
// (kNumStats columns from kStatFirst, averaged over the batch's tokens) and the count of rejected input values.
template <int kParts_, int kLoss_, int kCount_, int kRowFirst_, int kRowCols_, int kStatFirst_, int kNumStats_,
          int kBad_>
struct PartLayout {
  static constexpr int kParts = kParts_, kLoss = kLoss_, kCount = kCount_, kRowFirst = kRowFirst_,
                       kRowCols = kRowCols_, kStatFirst = kStatFirst_, kNumStats = kNumStats_, kBad = kBad_;
};

// The finished outputs, all of the accumulation type A but ok.
template <typename A>
struct LossOutputs {
  A* loss;       // []
  A* stats;      // [kNumStats] stat means over the batch's tokens (0 without tokens)
  A* weights;    // [B] c_b = d loss / d S_b
  A* row_stats;  // [B, kRowCols] (unused when kRowCols == 0)
  bool* ok;      // [] no input value rejected
};

// r = row b's partials summed over its chunks, in chunk order (other blocks' writes: load_partial).
template <int kParts, typename A>
__device__ __forceinline__ void row_partials(const A* part, int64_t b, int64_t chunks, A (&r)[kParts]) {
  const A* p = part + b * chunks * kParts;
#pragma unroll
  for (int k = 0; k < kParts; ++k) r[k] = A(0);
  // 4 chunks a step (the adds stay in chunk order): where registers allow, ptxas issues their loads before
  // the first add, one L2 round trip for 4 chunks (policy_loss's fp32 forward on sm_90: all 44; at the 48
  // registers it had before its TokenQueue, 1 to 3 at a time).
#pragma unroll 4
  for (int64_t c = 0; c < chunks; ++c) {
#pragma unroll
    for (int k = 0; k < kParts; ++k) r[k] += load_partial(p + c * kParts + k);
  }
}

// The last block's work (all its kThreads threads): two passes over the rows (thread t takes rows t, t +
// kThreads, ...; block sums in fixed trees), the batch's totals first, then each row's weight and sums and
// the loss. bad_values: what the op rejects, the message of its device-side assert (common.cuh).
template <int kThreads, typename L, typename A>
__device__ void finish_loss(const A* part, int64_t B, int64_t chunks, const AggParams& agg,
                            const LossOutputs<A>& out, const char* bad_values) {
  constexpr int kParts = L::kParts;
  __shared__ A smem[(kParts + 1) * (kThreads / 32)];
  __shared__ A shared_scale;
  A totals[kParts + 1];  // the columns' sums over the rows, then the rows with tokens
#pragma unroll
  for (int k = 0; k <= kParts; ++k) totals[k] = A(0);
  for (int64_t b = threadIdx.x; b < B; b += kThreads) {
    A r[kParts];
    row_partials(part, b, chunks, r);
#pragma unroll
    for (int k = 0; k < kParts; ++k) totals[k] += r[k];
    totals[kParts] += r[L::kCount] > A(0) ? A(1) : A(0);
  }
  block_sum<kThreads>(totals, smem);
  if (threadIdx.x == 0) {
    const A tokens = totals[L::kCount];
    shared_scale = aggregation_scale<A>(agg, tokens, totals[kParts]);
#pragma unroll
    for (int k = 0; k < L::kNumStats; ++k) out.stats[k] = token_mean(totals[L::kStatFirst + k], tokens);
    *out.ok = totals[L::kBad] == A(0);
    RLK_REQUIRE_VALUES(*out.ok, bad_values);
  }
  __syncthreads();  // shared_scale written; smem free again
  const A scale = shared_scale;
  A loss[1] = {A(0)};
  for (int64_t b = threadIdx.x; b < B; b += kThreads) {
    A r[kParts];
    row_partials(part, b, chunks, r);
    const A c = aggregation_row_weight(agg.mode, scale, r[L::kCount]);
    out.weights[b] = c;
    loss[0] += c * r[L::kLoss];
#pragma unroll
    for (int k = 0; k < L::kRowCols; ++k) out.row_stats[b * L::kRowCols + k] = r[L::kRowFirst + k];
  }
  block_sum<kThreads>(loss, smem);
  if (threadIdx.x == 0) *out.loss = loss[0];
}

// The block's partial sums v (valid in thread 0 after block_sum) into part[blockIdx.x], then the ticket;
// returns whether this block finishes the launch.
template <int kParts, typename A>
__device__ __forceinline__ bool publish_partials(const A (&v)[kParts], A* part, unsigned int* counter) {
  if (threadIdx.x == 0) {
#pragma unroll
    for (int k = 0; k < kParts; ++k) part[int64_t(blockIdx.x) * kParts + k] = v[k];
  }
  return last_block(counter, gridDim.x);
}

// The launchers' f(M{}) with M the element type of a mask of type `mask` (float masks: of the accumulation
// type A): the kernels read bool, integer and float masks as they are.
template <typename A, typename F>
void dispatch_mask(MaskType mask, F&& f) {
  switch (mask) {
    case MaskType::Bool:
      return f(bool{});
    case MaskType::UInt8:
      return f(uint8_t{});
    case MaskType::Int32:
      return f(int32_t{});
    case MaskType::Int64:
      return f(int64_t{});
    case MaskType::Float:
      return f(A{});
  }
}

}  // namespace cuda
}  // namespace rlk
