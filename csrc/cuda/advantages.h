// Launchers of the group_advantages and advantage_tokens CUDA kernels (csrc/cuda/advantages.cu), called by
// advantages_binding.cpp. One launch each (two to whiten tokens); each writes the op's validity flag.
#pragma once

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "rlkernels/dtype.h"

namespace rlk {
namespace cuda {

// Contiguous groups: rewards / out [num_groups * group_size] of `dtype`; means [num_groups] double and parts
// [max(blocks, 1), 4] double: scratch; counter: the zeroed launch counter (launch_counter.h); ok: [] bool,
// every reward finite. mode: rlk::GroupMode (Batch: the batch std is computed in the launch).
cudaError_t group_advantages_contiguous(DType dtype, const void* rewards, void* out, void* means, void* parts,
                                        unsigned int* counter, bool* ok, int64_t num_groups, int64_t group_size,
                                        int mode, double eps, cudaStream_t stream);

// The sorted walk (one block): arbitrary groups from a stable sort of the ids, or contiguous groups of
// group_size in index order (sorted_ids null), each of `cols` reward columns in turn, their weighted sum
// written (renormalize: then TRL's batch pass, group_advantages_sum).
struct SortedArgs {
  const void* rewards;     // [b, cols] of the dtype
  const void* weights;     // [cols] of the dtype, or null (all 1)
  const void* sorted_ids;  // [b] int32 / int64 (ids_int64) sorted, or null
  bool ids_int64;
  const int64_t* perm;  // [b] the sorted ids' original indices (with sorted_ids)
  void* stats;          // [4, b] double scratch: each group's count, mean, m2 at its head; each position's head
  void* out;            // [b] of the dtype
  bool* ok;             // [] every reward finite
  int64_t b, cols, group_size;
  int mode;  // rlk::GroupMode
  double eps;
  bool renormalize;
};
cudaError_t group_advantages_sorted(DType dtype, const SortedArgs& args, cudaStream_t stream);
// verl's masked whitening of the walk's advantages (one block of its launch per mask row, the last one walking):
// mask [b, t] bool / int64 / float weights (mask_kind 0 / 1 / 2); parts [b, 4] and coef [2] of the accumulation type
// (coef: the whitening's mean and rstd, for advantage_tokens' whiten); counter: the zeroed launch
// counter. args.ok: also every mask value valid. Arbitrary ids only, at most one chunk (sorted_chunks(b) == 0);
// past one the chunk path takes them (group_advantages_chunked's whiten: the first scan launch has the row
// blocks, the last writing launch the statistics).
struct WhitenRows {
  const void* mask;
  int mask_kind;
  int64_t t;
  void* parts;
  void* coef;
  unsigned int* counter;
  void* chunk_parts;  // [chunks, 4] of the accumulation type (the chunk path's)
};
cudaError_t group_advantages_whitened(DType dtype, const SortedArgs& args, const WhitenRows& rows,
                                      cudaStream_t stream);
// The chunk-parallel path (arbitrary groups, or contiguous ones in index order): per column a block per chunk
// of sorted positions, then the advantages added to the sum (two launches a column; renormalize: one more).
// sorted_chunks(b): its chunks, 0 where one chunk holds b (the walk's case). scratch: [chunked_scratch(chunks)]
// doubles; counter: the zeroed launch counter (launch_counter.h).
int64_t sorted_chunks(int64_t b);
int64_t chunked_scratch(int64_t chunks);
cudaError_t group_advantages_chunked(DType dtype, const SortedArgs& args, unsigned int* counter, void* scratch,
                                     cudaStream_t stream, const WhitenRows* whiten = nullptr);

// advantage_tokens: adv [rows] and tokens [rows, t] of the dtype, mask [rows, t] bool / int64 / float weights
// (mask_kind 0 / 1 / 2); parts [blocks] of the accumulation type, scratch (not whiten); ok_in the flag of the op
// that wrote adv, ok the output flag (not whiten: ok_in and every mask value valid). One launch.
struct TokenArgs {
  const void* adv;
  const void* mask;
  void* tokens;
  void* parts;
  void* coef;
  unsigned int* counter;
  const bool* ok_in;
  bool* ok;
  int64_t n;
  int64_t t;
  bool whiten;  // (x - coef[0]) * coef[1] * m, coef [2] from the group pass that checked the mask
};
cudaError_t advantage_tokens(DType dtype, int mask_kind, const TokenArgs& args, cudaStream_t stream);
// The blocks advantage_tokens launches for n tokens (the rows of its parts).
int64_t advantage_token_blocks(int64_t n);

}  // namespace cuda
}  // namespace rlk
