// group_advantages CUDA kernels, one launch each (docs/gpu_token_ops.md).
// Contiguous groups: one warp per group, the group's pivot-shifted sum and centered sum of squares by warp
// shuffles, every reward read from L1/L2 after the first pass; the block's non-finite rewards and its groups'
// moments go to its partials, and the last block (last_block.cuh) writes the validity flag and, for mode
// "batch", the batch std and the advantages (from the group means the blocks left).
// Arbitrary ids: one block walks the rewards in the order of a stable sort of the ids (equal ids become runs,
// each headed by the group's first member), chunk by chunk: a block-wide segmented scan merges each run's
// moments (Chan's formula in double: a constant group keeps its mean exact and its centered sum 0), the end of
// each run stores its group's statistics at the run's head, then every thread writes advantages.
// group_advantages_sum: the same walk once per reward column, the columns' weighted sum written (and TRL's
// batch pass after it: the sums' moments, then every sum normalized, a group of one 0).
// advantage_tokens: the per-row advantages times the mask, its values checked into the flag. whitened_group_tokens
// (reinforce_plus_plus_baseline, gdpo): the walk in the last of a launch's blocks that each take a mask row's
// moments, which then merge into verl's whitening statistics (past one chunk: the rows in the first scan
// launch, the statistics in the last writing launch), then the tokens whitened with them.
#include "advantages.h"
#include "block_reduce.cuh"
#include "common.cuh"
#include "last_block.cuh"
#include "rlkernels/advantages.h"

namespace rlk {
namespace cuda {
namespace {

// What the kernels check: the messages of their device-side asserts (common.cuh RLK_REQUIRE_VALUES).
__device__ const char kBadRewards[] = "rlkernels group advantages: a reward (score) is NaN or inf";
__device__ const char kBadTokenMask[] =
    "rlkernels advantage tokens: a mask value is not 0 / 1 (integer) or finite and >= 0 (float)";

// 8 warps (8 groups) per block.
constexpr int kGroupThreads = 256;
constexpr int kGroupsPerBlock = kGroupThreads / 32;
constexpr unsigned kFullMask = 0xffffffffu;
// The sorted walk: one block of 8 warps, 4 rewards per thread per chunk (a 1024-reward chunk).
constexpr int kWalkThreads = 256;
constexpr int kWalkItems = 4;
constexpr int kWalkWarps = kWalkThreads / 32;
// Columns of a block's partials: non-finite rewards (or bad mask values), then (count, mean, m2).
constexpr int kParts = 4;

template <typename A>
__device__ __forceinline__ A warp_sum(A x) {
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) x += __shfl_xor_sync(kFullMask, x, d);
  return x;
}

template <typename A>
__device__ __forceinline__ Moments<A> shfl_down(const Moments<A>& m, int delta) {
  return {__shfl_down_sync(kFullMask, m.w, delta), __shfl_down_sync(kFullMask, m.mean, delta),
          __shfl_down_sync(kFullMask, m.m2, delta)};
}

// The moments of every thread of the block merged in a fixed order (lanes, then warps), valid in thread 0.
template <int kThreads, typename A>
__device__ __forceinline__ Moments<A> block_moments(Moments<A> m, Moments<A>* smem) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) m = moments_merge(m, shfl_down(m, d));
  if (lane == 0) smem[warp] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kThreads / 32; ++w) m = moments_merge(m, smem[w]);
  }
  return m;
}

// This block's partials (bad count, count, mean, m2) at its row of parts [gridDim.x, kParts], for
// merge_parts.
template <typename A>
__device__ __forceinline__ void store_part(A* parts, A bad, const Moments<A>& m) {
  A* p = parts + int64_t(blockIdx.x) * kParts;
  p[0] = bad;
  p[1] = m.w;
  p[2] = m.mean;
  p[3] = m.m2;
}

// Every block's partials (bad count, count, mean, m2) merged by the last block, in a fixed order: the bad
// total and the batch's moments, valid in thread 0.
template <int kThreads, typename A>
__device__ __forceinline__ void merge_parts(const A* parts, int64_t n_parts, A* smem, A& bad, Moments<A>& total) {
  A sums[3] = {A(0), A(0), A(0)};  // Σ bad, Σ n, Σ n·mean
  for (int64_t i = threadIdx.x; i < n_parts; i += kThreads) {
    const A n = load_partial(parts + i * kParts + 1);
    sums[0] += load_partial(parts + i * kParts);
    sums[1] += n;
    sums[2] += n * load_partial(parts + i * kParts + 2);
  }
  block_sum<kThreads>(sums, smem);
  __shared__ A mean_all;
  if (threadIdx.x == 0) mean_all = sums[1] > A(0) ? sums[2] / sums[1] : A(0);
  __syncthreads();
  const A mean = mean_all;
  A m2[1] = {A(0)};
  for (int64_t i = threadIdx.x; i < n_parts; i += kThreads) {
    const A d = load_partial(parts + i * kParts + 2) - mean;
    m2[0] += load_partial(parts + i * kParts + 3) + load_partial(parts + i * kParts + 1) * d * d;
  }
  block_sum<kThreads>(m2, smem);
  bad = sums[0];
  total = {sums[1], mean, m2[0]};
}

template <typename T>
__global__ void __launch_bounds__(kGroupThreads)
    contiguous_kernel(const T* __restrict__ rewards,  // [num_groups * g]
                      T* __restrict__ out,            // [num_groups * g]
                      double* __restrict__ means,     // [num_groups] (Batch: read by the last block)
                      double* __restrict__ parts,     // [gridDim.x, kParts]
                      unsigned int* __restrict__ counter,  // [1] zero (launch_counter.h)
                      bool* __restrict__ ok,               // [] every reward finite
                      int64_t num_groups, int64_t g, GroupMode mode, typename Acc<T>::type eps) {
  using A = typename Acc<T>::type;
  __shared__ Moments<double> warp_moments[kGroupsPerBlock];
  __shared__ double smem[3 * kGroupsPerBlock];
  const int64_t grp = int64_t(blockIdx.x) * kGroupsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  double bad = 0.0;
  Moments<double> mom{0.0, 0.0, 0.0};
  if (grp < num_groups) {  // the whole warp: the shuffles below stay warp-uniform
    const T* rg = rewards + grp * g;
    T* og = out + grp * g;
    // Each lane's running sums are doubles: a lane adds g / 32 members in turn.
    const double pivot = double(to_acc(rg[0]));
    double s = 0.0;
    for (int64_t i = lane; i < g; i += 32) {
      const double x = double(to_acc(rg[i]));
      bad += (x - x) != 0.0;  // NaN or inf
      s += x - pivot;
    }
    const double mean = pivot + warp_sum(s) / double(g);
    double q = 0.0;
    for (int64_t i = lane; i < g; i += 32) {
      const double d = double(to_acc(rg[i])) - mean;
      q += d * d;
    }
    const double m2 = warp_sum(q);
    if (is_batch_mode(mode)) {
      if (lane == 0) means[grp] = mean;
    } else {
      for (int64_t i = lane; i < g; i += 32) {
        og[i] = from_acc<T>(group_advantage<A>(mode, A(to_acc(rg[i])), A(g), A(mean), A(m2), eps, A(1)));
      }
    }
    if (lane == 0) mom = {double(g), mean, m2};  // the group's moments, once
  }
  double count[1] = {bad};
  block_sum<kGroupThreads>(count, smem);
  mom = block_moments<kGroupThreads>(mom, warp_moments);
  if (threadIdx.x == 0) store_part(parts, count[0], mom);
  if (!last_block(counter, gridDim.x)) return;
  double total_bad;
  Moments<double> batch;
  __syncthreads();
  merge_parts<kGroupThreads>(parts, gridDim.x, smem, total_bad, batch);
  __shared__ A bstd;
  if (threadIdx.x == 0) {
    *ok = total_bad == 0.0;
    RLK_REQUIRE_VALUES(*ok, kBadRewards);
    bstd = A(unbiased_std(batch.w, batch.m2, 1.0));
  }
  __syncthreads();
  if (!is_batch_mode(mode)) return;
  const int64_t b = num_groups * g;
  for (int64_t i = threadIdx.x; i < b; i += kGroupThreads) {
    const double mean = load_partial(means + i / g);
    out[i] = from_acc<T>(group_advantage<A>(mode, A(to_acc(rewards[i])), A(g), A(mean), A(0), eps, bstd));
  }
}

// A segmented scan element over sorted rewards: f, whether it holds a group head; then the moments of its
// rewards from its last head on (all of them without a head), and the sorted position h of that head.
struct Seg {
  int f;
  double n, mean, m2;
  long long h;
};

// l then r: r restarts at a head, else Chan's merge (associative).
__device__ __forceinline__ Seg seg_combine(const Seg& l, const Seg& r) {
  if (r.f) return r;
  const Moments<double> m = moments_merge(Moments<double>{l.n, l.mean, l.m2}, Moments<double>{r.n, r.mean, r.m2});
  return {l.f, m.w, m.mean, m.m2, l.h};
}

__device__ __forceinline__ Seg shfl_up(const Seg& s, int delta) {
  return {__shfl_up_sync(kFullMask, s.f, delta), __shfl_up_sync(kFullMask, s.n, delta),
          __shfl_up_sync(kFullMask, s.mean, delta), __shfl_up_sync(kFullMask, s.m2, delta),
          __shfl_up_sync(kFullMask, s.h, delta)};
}

// The exclusive prefix of this thread's items in a block-wide segmented scan of kWalkThreads threads:
// `carry` (shared: what came before the block's items), then the totals of the threads before this one
// (scanned over the warp, then over the warps). Syncs the block before it reads carry and warp_totals.
__device__ __forceinline__ Seg block_exclusive(Seg total, Seg* warp_totals, const Seg& carry) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const Seg other = shfl_up(total, d);
    if (lane >= d) total = seg_combine(other, total);
  }
  Seg left = shfl_up(total, 1);  // lanes [0, lane)
  if (lane == 0) left = Seg{0, 0.0, 0.0, 0.0, -1};
  if (lane == 31) warp_totals[warp] = total;
  __syncthreads();
  Seg prefix = carry;
  for (int w = 0; w < warp; ++w) prefix = seg_combine(prefix, warp_totals[w]);
  return seg_combine(prefix, left);
}

// The scan element of sorted position p < b: its reward x (column k of `cols`), whether it heads its run and
// whether it ends it (`end`). ids null: groups of g in index order.
template <typename T, typename I>
__device__ __forceinline__ Seg sorted_element(const T* rewards, const I* ids, const int64_t* perm, int64_t p,
                                              int64_t b, int64_t cols, int64_t k, int64_t g, double& x, bool& end) {
  x = double(to_acc(rewards[(ids ? perm[p] : p) * cols + k]));
  const bool is_head = ids ? (p == 0 || ids[p] != ids[p - 1]) : p % g == 0;
  end = p == b - 1 || (ids ? ids[p] != ids[p + 1] : (p + 1) % g == 0);
  return {int(is_head), 1.0, x, 0.0, is_head ? (long long)p : -1};
}

// A run's statistics (count, mean, m2) at its head's row of stats [3, b].
__device__ __forceinline__ void store_stats(double* stats, int64_t b, const Seg& s) {
  stats[s.h] = s.n;
  stats[b + s.h] = s.mean;
  stats[2 * b + s.h] = s.m2;
}

template <typename T, typename I>
__device__ void sorted_walk(const T* __restrict__ rewards,     // [b, cols] a column per reward function
                  const T* __restrict__ weights,     // [cols] or null (all 1)
                  const I* __restrict__ ids,         // [b] sorted, or null: groups of g in index order
                  const int64_t* __restrict__ perm,  // [b] their original indices (with ids)
                  double* __restrict__ stats,        // [3, b] (count, mean, m2) at each group's head
                  long long* __restrict__ head,      // [b] each sorted position's head
                  T* __restrict__ out,               // [b] Σ_k w_k advantages of column k (renorm: normalized)
                  bool* __restrict__ ok,             // [] every reward finite
                  int64_t b, int64_t cols, int64_t g, GroupMode mode, typename Acc<T>::type eps, bool renorm) {
  using A = typename Acc<T>::type;
  __shared__ Seg warp_totals[kWalkWarps];
  __shared__ Seg carry;
  __shared__ Moments<double> warp_moments[kWalkWarps];
  __shared__ double smem[2 * kWalkWarps];
  __shared__ A bstd;
  const int tid = threadIdx.x;
  const Seg none{0, 0.0, 0.0, 0.0, -1};
  double bad = 0.0;  // over every column
  for (int64_t k = 0; k < cols; ++k) {  // reward functions (columns), not groups or rows
    if (tid == 0) carry = none;
    __syncthreads();
    double nonzero = 0.0;
    Moments<double> batch{0.0, 0.0, 0.0};
    for (int64_t c0 = 0; c0 < b; c0 += int64_t(kWalkThreads) * kWalkItems) {
      const int64_t first = c0 + int64_t(tid) * kWalkItems;
      Seg inc[kWalkItems];
      Seg acc = none;
      bool end[kWalkItems];
#pragma unroll
      for (int j = 0; j < kWalkItems; ++j) {
        const int64_t p = first + j;
        Seg e = none;
        end[j] = false;
        if (p < b) {
          double x;
          e = sorted_element(rewards, ids, perm, p, b, cols, k, g, x, end[j]);
          bad += (x - x) != 0.0;
          nonzero += x != 0.0;
          batch = moments_merge(batch, Moments<double>{1.0, x, 0.0});
        }
        acc = seg_combine(acc, e);
        inc[j] = acc;
      }
      const Seg prefix = block_exclusive(acc, warp_totals, carry);
#pragma unroll
      for (int j = 0; j < kWalkItems; ++j) {
        const int64_t p = first + j;
        if (p >= b) continue;
        const Seg s = seg_combine(prefix, inc[j]);
        head[p] = s.h;
        if (end[j]) store_stats(stats, b, s);
      }
      __syncthreads();  // every thread read the carry and the warp totals
      if (tid == kWalkThreads - 1) carry = seg_combine(prefix, inc[kWalkItems - 1]);
      __syncthreads();
    }
    double count[2] = {bad, nonzero};
    block_sum<kWalkThreads>(count, smem);
    batch = block_moments<kWalkThreads>(batch, warp_moments);
    if (tid == 0) {
      *ok = count[0] == 0.0;
      RLK_REQUIRE_VALUES(*ok, kBadRewards);
      bstd = batch_statistic<A>(mode, batch.w, batch.m2, count[1], double(eps));
    }
    __syncthreads();  // the statistics and heads above, written by other threads, are read below
    const A wk = weights ? A(to_acc(weights[k])) : A(1);
    for (int64_t p = tid; p < b; p += kWalkThreads) {
      const long long h = head[p];
      const int64_t i = ids ? perm[p] : p;
      const A a = group_advantage<A>(mode, A(to_acc(rewards[i * cols + k])), A(stats[h]), A(stats[b + h]),
                                     A(stats[2 * b + h]), eps, bstd);
      const T term = weights ? from_acc<T>(wk * a) : from_acc<T>(a);  // the reference's term, in T
      out[i] = k == 0 ? term : from_acc<T>(A(to_acc(out[i])) + A(to_acc(term)));
    }
    __syncthreads();  // the next column's walk overwrites the statistics and heads read above
  }
  if (!renorm) return;
  // TRL's batch pass: the sums as one group ("grpo", moments in double, index order), then a group of one 0.
  Moments<double> sums{0.0, 0.0, 0.0};
  for (int64_t p = tid; p < b; p += kWalkThreads) {
    sums = moments_merge(sums, Moments<double>{1.0, double(to_acc(out[p])), 0.0});
  }
  sums = block_moments<kWalkThreads>(sums, warp_moments);
  __shared__ A batch_mean;
  __shared__ A batch_m2;
  if (tid == 0) {
    batch_mean = A(sums.mean);
    batch_m2 = A(sums.m2);
  }
  __syncthreads();  // and every sum is read before any is overwritten below
  for (int64_t p = tid; p < b; p += kWalkThreads) {
    const int64_t i = ids ? perm[p] : p;
    const A y = group_advantage<A>(GroupMode::GRPO, A(to_acc(out[i])), A(b), batch_mean, batch_m2, eps, A(1));
    out[i] = from_acc<T>(zero_singles(mode) && stats[head[p]] <= 1.0 ? A(0) : y);
  }
}


// The walk of the file's comment in one block (grid 1).
template <typename T, typename I>
__global__ void __launch_bounds__(kWalkThreads)
    sorted_kernel(const T* __restrict__ rewards, const T* __restrict__ weights, const I* __restrict__ ids,
                  const int64_t* __restrict__ perm, double* __restrict__ stats, long long* __restrict__ head,
                  T* __restrict__ out, bool* __restrict__ ok, int64_t b, int64_t cols, int64_t g, GroupMode mode,
                  typename Acc<T>::type eps, bool renorm) {
  sorted_walk<T, I>(rewards, weights, ids, perm, stats, head, out, ok, b, cols, g, mode, eps, renorm);
}

// A mask row's part of verl's masked whitening of x = A_b * m_bt weighted by m_bt, which depends on the mask
// alone (rlkernels/triton/mask_rows.py): parts[row] = (bad values, W = Σ m, r = Σ m² / W, C = Σ m (m - r)²) of
// the row's values in A; the walk's block turns (r, C) into the row's mean A_b r and m2 A_b² C. A bool or int64
// mask has r = 1 and C = 0 exactly: no second read.
template <typename A, typename M>
__device__ void store_row_moments(const M* __restrict__ mask, A* parts, int64_t row, int64_t t) {
  __shared__ A smem[3 * kWalkWarps];
  __shared__ A ratio;
  const M* mr = mask + row * t;
  A sums[3] = {A(0), A(0), A(0)};  // bad, Σ m, Σ m²
  for (int64_t j = threadIdx.x; j < t; j += kWalkThreads) {
    const auto raw = mask_raw<A>(mr + j);
    const A m = mask_weight<A>(raw);
    sums[0] += mask_value_bad<A>(raw) ? A(1) : A(0);
    sums[1] += m;
    sums[2] += m * m;
  }
  block_sum<kWalkThreads>(sums, smem);
  if (threadIdx.x == 0) ratio = sums[1] > A(0) ? sums[2] / sums[1] : A(0);
  __syncthreads();
  const A r = ratio;
  A c[1] = {A(0)};
  if constexpr (!std::is_same_v<M, bool> && !std::is_same_v<M, int64_t>) {
    for (int64_t j = threadIdx.x; j < t; j += kWalkThreads) {
      const A m = mask_weight<A>(mask_raw<A>(mr + j));
      c[0] += m * (m - r) * (m - r);
    }
    block_sum<kWalkThreads>(c, smem);
  }
  if (threadIdx.x == 0) {
    A* p = parts + row * kParts;
    p[0] = sums[0];
    p[1] = sums[1];
    p[2] = r;
    p[3] = c[0];
  }
}

// store_row_moments of the mask in rows (its kind at run time), row `row`, into rows.parts.
template <typename T>
__device__ void store_mask_row_moments(const WhitenRows& rows, int64_t row) {
  using A = typename Acc<T>::type;
  A* parts = static_cast<A*>(rows.parts);
  if (rows.mask_kind == 0) {
    store_row_moments(static_cast<const bool*>(rows.mask), parts, row, rows.t);
  } else if (rows.mask_kind == 1) {
    store_row_moments(static_cast<const int64_t*>(rows.mask), parts, row, rows.t);
  } else {
    store_row_moments(static_cast<const A*>(rows.mask), parts, row, rows.t);
  }
}

// Row i's part of verl's whitening of x = A_i · m_i weighted by m_i: its bad mask values, and its moments (W,
// A·r, A²·C) merged into `white` (rows: each row's (bad, W, r, C) from store_row_moments, another block's).
template <typename A>
__device__ __forceinline__ void add_whitening_row(const A* rows, int64_t i, A a, A& bad, Moments<A>& white) {
  const A* q = rows + i * kParts;
  bad += load_partial(q);
  white = moments_merge(white, Moments<A>{load_partial(q + 1), a * load_partial(q + 2),
                                          a * a * load_partial(q + 3)});
}

// Thread 0, the rows' bad count and moments whole: the flag (ok AND-ed with no bad mask value, and its
// device assert) and the whitening's (mean, rstd) into coef [2].
template <typename A>
__device__ __forceinline__ void finish_whitening(A bad, const Moments<A>& all, bool* ok, void* coef) {
  RLK_REQUIRE_VALUES(bad == A(0), kBadTokenMask);
  *ok = *ok && bad == A(0);
  A* c = static_cast<A*>(coef);
  whiten_coefficients(all.w, all.mean, all.m2, c[0], c[1]);
}

// verl's masked whitening of the walk's advantages (reinforce_plus_plus_baseline, gdpo): a block per mask row
// stores its moments, the last block to finish walks the sorted rewards (sorted_walk), then merges the rows'
// moments of A_b * m into the whitening coefficients (mean, rstd) and lowers the flag for a bad mask value.
template <typename T, typename I>
__global__ void __launch_bounds__(kWalkThreads)
    whitened_sorted_kernel(const T* __restrict__ rewards, const T* __restrict__ weights, const I* __restrict__ ids,
                           const int64_t* __restrict__ perm, double* __restrict__ stats, long long* __restrict__ head,
                           T* __restrict__ out, bool* __restrict__ ok, int64_t b, int64_t cols, GroupMode mode,
                           typename Acc<T>::type eps, WhitenRows rows) {
  using A = typename Acc<T>::type;
  store_mask_row_moments<T>(rows, blockIdx.x);
  if (!last_block(rows.counter, gridDim.x)) return;
  sorted_walk<T, I>(rewards, weights, ids, perm, stats, head, out, ok, b, cols, 1, mode, eps, false);
  __syncthreads();  // the advantages, written by every thread
  __shared__ A smem[kWalkWarps];
  __shared__ Moments<A> warp_moments[kWalkWarps];
  A bad[1] = {A(0)};
  Moments<A> white{A(0), A(0), A(0)};
  for (int64_t i = threadIdx.x; i < b; i += kWalkThreads) {
    add_whitening_row(static_cast<const A*>(rows.parts), i, A(to_acc(out[i])), bad[0], white);
  }
  block_sum<kWalkThreads>(bad, smem);
  white = block_moments<kWalkThreads>(white, warp_moments);
  if (threadIdx.x == 0) finish_whitening(bad[0], white, ok, rows.coef);
}

// The chunk-parallel sorted path (ids, more than one chunk of kChunk sorted positions): a block per chunk
// scans its chunk with nothing carried in; a run that starts and ends there gets its statistics at once. The
// chunk publishes its total and its leading run (the positions before its first head), and the last block
// scans the chunks' totals (each chunk's carry), finishes every run that began in an earlier chunk and ends in
// the chunk, and records each chunk's open head; a second launch writes the advantages. Partials' columns, as
// rlkernels/triton/advantages.py's CHUNK_PARTS:
constexpr int64_t kChunk = int64_t(kWalkThreads) * kWalkItems;
constexpr int kChunkParts = 16;
enum ChunkPart : int {
  kTotF, kTotN, kTotMean, kTotM2, kTotH,     // the chunk's total as a scan element
  kLeadN, kLeadMean, kLeadM2, kLeadEnds,     // its leading run, and whether that run ends in the chunk
  kBad, kAllN, kAllMean, kAllM2, kNonzero,   // bad rewards, all rewards' moments (Batch), nonzero ones (GPG)
};

// The last block of chunk_scan_kernel: see above. coef: the batch statistic (Batch, GPG).
__device__ void finish_chunks(const double* parts, int64_t chunks, double* stats, long long* open, double* coef,
                              bool* ok, bool and_ok, int64_t b, GroupMode mode, double eps, Seg* warp_totals,
                              Seg& carry, Moments<double>* warp_moments, double* smem) {
  const int tid = threadIdx.x;
  const Seg none{0, 0.0, 0.0, 0.0, -1};
  if (tid == 0) carry = none;
  for (int64_t k0 = 0; k0 < chunks; k0 += kChunk) {
    const int64_t first = k0 + int64_t(tid) * kWalkItems;
    Seg inc[kWalkItems];
    Seg acc = none;
#pragma unroll
    for (int j = 0; j < kWalkItems; ++j) {  // each chunk's carry: the totals of the chunks before it
      const int64_t c = first + j;
      Seg e = none;
      if (c > 0 && c < chunks) {
        const double* q = parts + (c - 1) * kChunkParts;
        e = {int(load_partial(q + kTotF)), load_partial(q + kTotN), load_partial(q + kTotMean),
             load_partial(q + kTotM2), (long long)load_partial(q + kTotH)};
      }
      acc = seg_combine(acc, e);
      inc[j] = acc;
    }
    const Seg prefix = block_exclusive(acc, warp_totals, carry);
#pragma unroll
    for (int j = 0; j < kWalkItems; ++j) {
      const int64_t c = first + j;
      if (c >= chunks) continue;
      const Seg in = seg_combine(prefix, inc[j]);
      open[c] = in.h;
      const double* q = parts + c * kChunkParts;
      const double lead_n = load_partial(q + kLeadN);
      if (lead_n > 0.0 && load_partial(q + kLeadEnds) != 0.0) {
        const Moments<double> m = moments_merge(Moments<double>{in.n, in.mean, in.m2},
                                                Moments<double>{lead_n, load_partial(q + kLeadMean),
                                                                load_partial(q + kLeadM2)});
        store_stats(stats, b, Seg{1, m.w, m.mean, m.m2, in.h});
      }
    }
    __syncthreads();  // every thread read the carry
    if (tid == kWalkThreads - 1) carry = seg_combine(prefix, inc[kWalkItems - 1]);
    __syncthreads();
  }
  double count[2] = {0.0, 0.0};  // bad, nonzero
  Moments<double> all{0.0, 0.0, 0.0};
  for (int64_t c = tid; c < chunks; c += kWalkThreads) {
    const double* q = parts + c * kChunkParts;
    count[0] += load_partial(q + kBad);
    count[1] += load_partial(q + kNonzero);
    all = moments_merge(all, Moments<double>{load_partial(q + kAllN), load_partial(q + kAllMean),
                                             load_partial(q + kAllM2)});
  }
  block_sum<kWalkThreads>(count, smem);
  all = block_moments<kWalkThreads>(all, warp_moments);
  if (tid == 0) {
    RLK_REQUIRE_VALUES(count[0] == 0.0, kBadRewards);
    *ok = count[0] == 0.0 && (!and_ok || *ok);  // and_ok: a later column of the sum
    *coef = batch_statistic<double>(mode, all.w, all.m2, count[1], eps);
  }
}

template <typename T, typename I>
__global__ void __launch_bounds__(kWalkThreads)
    chunk_scan_kernel(const T* __restrict__ rewards,     // [b, cols]: column k is scanned
                      const I* __restrict__ ids,         // [b] sorted, or null: groups of g in index order
                      const int64_t* __restrict__ perm,  // [b] their original indices (with ids)
                      double* __restrict__ stats,        // [3, b] (count, mean, m2) at each group's head
                      long long* __restrict__ head,      // [b] each position's head in its chunk, or -1
                      double* __restrict__ parts,        // [chunks, kChunkParts]
                      long long* __restrict__ open,      // [chunks] the head of the run open at each start
                      double* __restrict__ coef,         // [1] the batch statistic (Batch, GPG)
                      unsigned int* __restrict__ counter,  // [1] zero (launch_counter.h)
                      bool* __restrict__ ok,               // [] every reward finite (and_ok: AND-ed)
                      int64_t b, int64_t cols, int64_t k, int64_t g, bool and_ok, GroupMode mode, double eps,
                      unsigned int chunks,  // the scan's blocks; rows.mask: a block per mask row after them
                      WhitenRows rows) {
  if (blockIdx.x >= chunks) {  // the whitening's mask rows, for the last column's writing launch
    store_mask_row_moments<T>(rows, blockIdx.x - chunks);
    return;
  }
  __shared__ Seg warp_totals[kWalkWarps];
  __shared__ Seg carry;
  __shared__ Seg edge[2];  // the chunk's total, its leading run
  __shared__ int lead_ends;
  __shared__ Moments<double> warp_moments[kWalkWarps];
  __shared__ double smem[2 * kWalkWarps];
  const int tid = threadIdx.x;
  const Seg none{0, 0.0, 0.0, 0.0, -1};
  if (tid == 0) {
    carry = none;  // nothing carried into a chunk
    edge[0] = edge[1] = none;
    lead_ends = 0;
  }
  const int64_t c0 = int64_t(blockIdx.x) * kChunk;
  const int64_t stop = c0 + kChunk < b ? c0 + kChunk : b;
  const int64_t first = c0 + int64_t(tid) * kWalkItems;
  Seg inc[kWalkItems];
  Seg acc = none;
  bool end[kWalkItems];
  double count[2] = {0.0, 0.0};  // bad, nonzero
  Moments<double> all{0.0, 0.0, 0.0};
#pragma unroll
  for (int j = 0; j < kWalkItems; ++j) {
    const int64_t p = first + j;
    Seg e = none;
    end[j] = false;
    if (p < stop) {
      double x;
      e = sorted_element(rewards, ids, perm, p, b, cols, k, g, x, end[j]);
      count[0] += (x - x) != 0.0;
      count[1] += x != 0.0;
      all = moments_merge(all, Moments<double>{1.0, x, 0.0});
    }
    acc = seg_combine(acc, e);
    inc[j] = acc;
  }
  const Seg prefix = block_exclusive(acc, warp_totals, carry);
#pragma unroll
  for (int j = 0; j < kWalkItems; ++j) {
    const int64_t p = first + j;
    if (p >= stop) continue;
    const Seg s = seg_combine(prefix, inc[j]);
    head[p] = s.h;
    if (end[j] && s.h >= 0) store_stats(stats, b, s);  // a run that started in this chunk ends here: whole
    if (p == stop - 1) edge[0] = s;
    if (s.h < 0 && (end[j] || p == stop - 1)) {  // the leading run's last position in the chunk
      edge[1] = s;
      lead_ends = int(end[j]);
    }
  }
  block_sum<kWalkThreads>(count, smem);
  all = block_moments<kWalkThreads>(all, warp_moments);
  __syncthreads();  // edge and lead_ends, written by other threads
  if (tid == 0) {
    double* q = parts + int64_t(blockIdx.x) * kChunkParts;
    const double v[kChunkParts] = {double(edge[0].f), edge[0].n,      edge[0].mean, edge[0].m2, double(edge[0].h),
                                   edge[1].n,         edge[1].mean,   edge[1].m2,   double(lead_ends),
                                   count[0],          all.w,          all.mean,     all.m2,     count[1],
                                   0.0,               0.0};
    for (int c = 0; c < kChunkParts; ++c) q[c] = v[c];
  }
  if (!last_block(counter, chunks)) return;
  finish_chunks(parts, chunks, stats, open, coef, ok, and_ok, b, mode, eps, warp_totals, carry, warp_moments,
                smem);
}

// What a column's writing launch does beyond its advantages: weight them and add them to the sum so far (the
// reward columns' sum), and, before TRL's batch pass, publish each chunk's moments of the sums for the last
// block to merge into coef[1], coef[2] (mean, m2).
struct WriteSum {
  const void* weights;  // [cols] or null
  int64_t cols, k;
  bool accumulate, moments;
  double* parts;  // [chunks, 4] (moments)
  unsigned int* counter;
  // The last column before verl's whitening (whitened_group_tokens): each chunk's moments of A_b · m_bt from
  // its rows' (bad, W, r, C) (the first scan launch's row blocks), merged by the last block into the
  // whitening's (mean, rstd); ok AND-ed with every mask value valid. Null rows: none.
  const void* rows;  // [b, kParts] of the accumulation type
  void* white;       // [chunks, kParts] of the accumulation type
  void* white_coef;  // [2] of the accumulation type
  bool* ok;
};

// The whitening's chunk partials (bad mask values, the moments of A · m) of this block, and in the last block
// their merge into sum.white_coef and the flag (WriteSum's rows).
template <int kThreads, typename A>
__device__ void whiten_chunks(A (&bad)[1], Moments<A> white, const WriteSum& sum) {
  __shared__ A smem[3 * (kThreads / 32)];
  __shared__ Moments<A> warp_moments[kThreads / 32];
  A* parts = static_cast<A*>(sum.white);
  block_sum<kThreads>(bad, smem);
  white = block_moments<kThreads>(white, warp_moments);
  if (threadIdx.x == 0) store_part(parts, bad[0], white);
  if (!last_block(sum.counter, gridDim.x)) return;
  __syncthreads();
  A total_bad;
  Moments<A> all;
  merge_parts<kThreads>(parts, gridDim.x, smem, total_bad, all);
  if (threadIdx.x == 0) finish_whitening(total_bad, all, sum.ok, sum.white_coef);
}

template <typename T>
__global__ void __launch_bounds__(kWalkThreads)
    chunk_write_kernel(const T* __restrict__ rewards,       // [b, cols]: column sum.k
                       const int64_t* __restrict__ perm,    // [b], or null: index order
                       const double* __restrict__ stats,    // [3, b] (chunk_scan_kernel)
                       const long long* __restrict__ head,  // [b] (chunk_scan_kernel)
                       const long long* __restrict__ open,  // [chunks] (finish_chunks)
                       double* __restrict__ coef,           // [3] (finish_chunks; moments: mean, m2 after)
                       T* __restrict__ out,                 // [b]
                       int64_t b, GroupMode mode, typename Acc<T>::type eps, WriteSum sum) {
  using A = typename Acc<T>::type;
  __shared__ Moments<double> warp_moments[kWalkWarps];
  const int64_t c0 = int64_t(blockIdx.x) * kChunk;
  const int64_t stop = c0 + kChunk < b ? c0 + kChunk : b;
  const long long opened = open[blockIdx.x];
  const A stat = A(coef[0]);
  const T* weights = static_cast<const T*>(sum.weights);
  const A wk = weights ? A(to_acc(weights[sum.k])) : A(1);
  Moments<double> sums{0.0, 0.0, 0.0};
  A bad[1] = {A(0)};
  Moments<A> white{A(0), A(0), A(0)};
  for (int64_t p = c0 + threadIdx.x; p < stop; p += kWalkThreads) {
    const long long h = head[p] >= 0 ? head[p] : opened;
    const int64_t i = perm ? perm[p] : p;
    const A a = group_advantage<A>(mode, A(to_acc(rewards[i * sum.cols + sum.k])), A(stats[h]), A(stats[b + h]),
                                   A(stats[2 * b + h]), eps, stat);
    T v = weights ? from_acc<T>(wk * a) : from_acc<T>(a);  // the reference's term, in T
    if (sum.accumulate) v = from_acc<T>(A(to_acc(out[i])) + A(to_acc(v)));
    out[i] = v;
    if (sum.moments) sums = moments_merge(sums, Moments<double>{1.0, double(to_acc(v)), 0.0});
    if (sum.rows) add_whitening_row(static_cast<const A*>(sum.rows), i, A(to_acc(v)), bad[0], white);
  }
  if (sum.rows) {
    whiten_chunks<kWalkThreads>(bad, white, sum);
    return;
  }
  if (!sum.moments) return;
  sums = block_moments<kWalkThreads>(sums, warp_moments);
  if (threadIdx.x == 0) {
    double* q = sum.parts + int64_t(blockIdx.x) * 4;
    q[0] = sums.w;
    q[1] = sums.mean;
    q[2] = sums.m2;
  }
  if (!last_block(sum.counter, gridDim.x)) return;
  Moments<double> all{0.0, 0.0, 0.0};  // the chunks' moments, merged in a fixed order
  for (int64_t c = threadIdx.x; c < gridDim.x; c += kWalkThreads) {
    const double* q = sum.parts + c * 4;
    all = moments_merge(all, Moments<double>{load_partial(q), load_partial(q + 1), load_partial(q + 2)});
  }
  all = block_moments<kWalkThreads>(all, warp_moments);
  if (threadIdx.x == 0) {
    coef[1] = all.mean;
    coef[2] = all.m2;
  }
}

// TRL's batch pass on the chunk path (as sorted_kernel's renorm): the sums as one group ("grpo"), a group of
// one 0.
template <typename T>
__global__ void __launch_bounds__(kWalkThreads)
    chunk_renormalize_kernel(T* __restrict__ out,                 // [b] the sums, normalized in place
                             const int64_t* __restrict__ perm,    // [b], or null: index order
                             const double* __restrict__ stats,    // [3, b]: each group's count at its head
                             const long long* __restrict__ head,  // [b]
                             const long long* __restrict__ open,  // [chunks]
                             const double* __restrict__ coef,     // [3]: the sums' mean, m2 at 1, 2
                             int64_t b, GroupMode mode, typename Acc<T>::type eps) {
  using A = typename Acc<T>::type;
  const int64_t c0 = int64_t(blockIdx.x) * kChunk;
  const int64_t stop = c0 + kChunk < b ? c0 + kChunk : b;
  const long long opened = open[blockIdx.x];
  const A mean = A(coef[1]), m2 = A(coef[2]);
  for (int64_t p = c0 + threadIdx.x; p < stop; p += kWalkThreads) {
    const long long h = head[p] >= 0 ? head[p] : opened;
    const int64_t i = perm ? perm[p] : p;
    const A y = group_advantage<A>(GroupMode::GRPO, A(to_acc(out[i])), A(b), mean, m2, eps, A(1));
    out[i] = from_acc<T>(zero_singles(mode) && stats[h] <= 1.0 ? A(0) : y);
  }
}

// tokens[i] = adv[i / t] * mask[i]; without whitening, the mask's bad values are counted and the last block
// writes ok = ok_in and none bad; with whitening (the statistics from the group pass, which checked the mask,
// in coef), tokens[i] = (adv[i / t] * m - coef[0]) * coef[1] * m.
template <typename T, typename M, bool kWhiten>
__global__ void __launch_bounds__(kElementwiseThreads)
    tokens_kernel(const T* __restrict__ adv,  // [rows]
                  const M* __restrict__ mask,  // [rows, t]
                  T* __restrict__ tokens,      // [rows, t]
                  const typename Acc<T>::type* __restrict__ coef,  // [2] (kWhiten)
                  typename Acc<T>::type* __restrict__ parts,       // [gridDim.x] (not kWhiten)
                  unsigned int* __restrict__ counter,              // [1] zero
                  const bool* __restrict__ ok_in, bool* __restrict__ ok, int64_t n, int64_t t) {
  using A = typename Acc<T>::type;
  __shared__ A smem[kElementwiseThreads / 32];
  A bad[1] = {A(0)};
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const auto raw = mask_raw<A>(mask + i);
    const A m = mask_weight<A>(raw);
    A x = A(to_acc(adv[i / t])) * m;
    if constexpr (kWhiten) {
      x = (x - coef[0]) * coef[1] * m;
    } else {
      bad[0] += mask_value_bad<A>(raw) ? A(1) : A(0);
    }
    tokens[i] = from_acc<T>(x);
  }
  if constexpr (!kWhiten) {
    block_sum<kElementwiseThreads>(bad, smem);
    if (threadIdx.x == 0) parts[blockIdx.x] = bad[0];
    if (!last_block(counter, gridDim.x)) return;
    A total[1] = {A(0)};
    for (int64_t i = threadIdx.x; i < gridDim.x; i += kElementwiseThreads) total[0] += load_partial(parts + i);
    __syncthreads();
    block_sum<kElementwiseThreads>(total, smem);
    if (threadIdx.x == 0) {
      RLK_REQUIRE_VALUES(total[0] == A(0), kBadTokenMask);
      *ok = *ok_in && total[0] == A(0);
    }
  }
}

template <typename T, typename M>
void launch_tokens(const TokenArgs& a, cudaStream_t stream) {
  using A = typename Acc<T>::type;
  const unsigned int blocks = elementwise_blocks(a.n);
  const T* adv = static_cast<const T*>(a.adv);
  const M* mask = static_cast<const M*>(a.mask);
  A* parts = static_cast<A*>(a.parts);
  A* coef = static_cast<A*>(a.coef);
  if (a.whiten) {
    tokens_kernel<T, M, true><<<blocks, kElementwiseThreads, 0, stream>>>(
        adv, mask, static_cast<T*>(a.tokens), coef, parts, a.counter, a.ok_in, a.ok, a.n, a.t);
  } else {
    tokens_kernel<T, M, false><<<blocks, kElementwiseThreads, 0, stream>>>(
        adv, mask, static_cast<T*>(a.tokens), coef, parts, a.counter, a.ok_in, a.ok, a.n, a.t);
  }
}

// SortedArgs' buffers as the walk kernels take them.
template <typename T>
struct Sorted {
  double* stats;
  long long* head;  // after the statistics' three rows
  const T* rewards;
  const T* weights;
  T* out;
  GroupMode mode;
  explicit Sorted(const SortedArgs& a)
      : stats(static_cast<double*>(a.stats)),
        head(reinterpret_cast<long long*>(stats + 3 * a.b)),
        rewards(static_cast<const T*>(a.rewards)),
        weights(static_cast<const T*>(a.weights)),
        out(static_cast<T*>(a.out)),
        mode(GroupMode(a.mode)) {}
};

}  // namespace

cudaError_t group_advantages_contiguous(DType dtype, const void* rewards, void* out, void* means, void* parts,
                                        unsigned int* counter, bool* ok, int64_t num_groups, int64_t group_size,
                                        int mode, double eps, cudaStream_t stream) {
  const int64_t blocks = (num_groups + kGroupsPerBlock - 1) / kGroupsPerBlock;
  if (blocks > 0x7fffffff) return cudaErrorInvalidConfiguration;
  RLK_CUDA_DISPATCH_FLOATING(dtype, T, {
    using A = typename Acc<T>::type;
    contiguous_kernel<T><<<static_cast<unsigned int>(blocks > 0 ? blocks : 1), kGroupThreads, 0, stream>>>(
        static_cast<const T*>(rewards), static_cast<T*>(out), static_cast<double*>(means),
        static_cast<double*>(parts), counter, ok, num_groups, group_size, GroupMode(mode), A(eps));
  });
  return cudaGetLastError();
}

cudaError_t group_advantages_sorted(DType dtype, const SortedArgs& a, cudaStream_t stream) {
  RLK_CUDA_DISPATCH_FLOATING(dtype, T, {
    using A = typename Acc<T>::type;
    const Sorted<T> k(a);
    if (a.sorted_ids == nullptr || a.ids_int64) {
      sorted_kernel<T, int64_t><<<1, kWalkThreads, 0, stream>>>(
          k.rewards, k.weights, static_cast<const int64_t*>(a.sorted_ids), a.perm, k.stats, k.head, k.out, a.ok, a.b,
          a.cols, a.group_size, k.mode, A(a.eps), a.renormalize);
    } else {
      sorted_kernel<T, int32_t><<<1, kWalkThreads, 0, stream>>>(
          k.rewards, k.weights, static_cast<const int32_t*>(a.sorted_ids), a.perm, k.stats, k.head, k.out, a.ok, a.b,
          a.cols, a.group_size, k.mode, A(a.eps), a.renormalize);
    }
  });
  return cudaGetLastError();
}

cudaError_t group_advantages_whitened(DType dtype, const SortedArgs& a, const WhitenRows& rows, cudaStream_t stream) {
  if (a.sorted_ids == nullptr || a.b > kChunk) return cudaErrorInvalidValue;
  RLK_CUDA_DISPATCH_FLOATING(dtype, T, {
    using A = typename Acc<T>::type;
    const Sorted<T> k(a);
    const unsigned int grid = static_cast<unsigned int>(a.b);  // a block per mask row
    if (a.ids_int64) {
      whitened_sorted_kernel<T, int64_t><<<grid, kWalkThreads, 0, stream>>>(
          k.rewards, k.weights, static_cast<const int64_t*>(a.sorted_ids), a.perm, k.stats, k.head, k.out, a.ok, a.b,
          a.cols, k.mode, A(a.eps), rows);
    } else {
      whitened_sorted_kernel<T, int32_t><<<grid, kWalkThreads, 0, stream>>>(
          k.rewards, k.weights, static_cast<const int32_t*>(a.sorted_ids), a.perm, k.stats, k.head, k.out, a.ok, a.b,
          a.cols, k.mode, A(a.eps), rows);
    }
  });
  return cudaGetLastError();
}

int64_t sorted_chunks(int64_t b) { return b > kChunk ? (b + kChunk - 1) / kChunk : 0; }

// The chunks' partials, their open heads and the sums' moments (4 a chunk), then coef [3].
int64_t chunked_scratch(int64_t chunks) { return chunks * (kChunkParts + 1 + 4) + 3; }

cudaError_t group_advantages_chunked(DType dtype, const SortedArgs& a, unsigned int* counter, void* scratch,
                                     cudaStream_t stream, const WhitenRows* whiten) {
  const int64_t chunks = sorted_chunks(a.b);
  if (chunks == 0 || chunks > 0x7fffffff) return cudaErrorInvalidConfiguration;
  double* parts = static_cast<double*>(scratch);
  long long* open = reinterpret_cast<long long*>(parts + chunks * kChunkParts);
  double* sum_parts = parts + chunks * (kChunkParts + 1);
  double* coef = sum_parts + chunks * 4;
  const unsigned int grid = static_cast<unsigned int>(chunks);
  RLK_CUDA_DISPATCH_FLOATING(dtype, T, {
    using A = typename Acc<T>::type;
    const Sorted<T> kt(a);
    const WhitenRows none{nullptr, 0, 0, nullptr, nullptr, nullptr, nullptr};
    for (int64_t k = 0; k < a.cols; ++k) {  // reward columns, not groups or rows
      // The first scan launch also takes the whitening's mask rows, a block each after the chunks'.
      const WhitenRows& rows = whiten && k == 0 ? *whiten : none;
      const unsigned int scan_grid = grid + (whiten && k == 0 ? static_cast<unsigned int>(a.b) : 0u);
      if (a.sorted_ids == nullptr || a.ids_int64) {
        chunk_scan_kernel<T, int64_t><<<scan_grid, kWalkThreads, 0, stream>>>(
            kt.rewards, static_cast<const int64_t*>(a.sorted_ids), a.perm, kt.stats, kt.head, parts, open, coef,
            counter, a.ok, a.b, a.cols, k, a.group_size, k > 0, kt.mode, a.eps, grid, rows);
      } else {
        chunk_scan_kernel<T, int32_t><<<scan_grid, kWalkThreads, 0, stream>>>(
            kt.rewards, static_cast<const int32_t*>(a.sorted_ids), a.perm, kt.stats, kt.head, parts, open, coef,
            counter, a.ok, a.b, a.cols, k, a.group_size, k > 0, kt.mode, a.eps, grid, rows);
      }
      const bool last = k == a.cols - 1;
      const WriteSum sum{a.weights, a.cols, k, k > 0, a.renormalize && last, sum_parts, counter,
                         whiten && last ? whiten->parts : nullptr, whiten ? whiten->chunk_parts : nullptr,
                         whiten ? whiten->coef : nullptr, a.ok};
      chunk_write_kernel<T><<<grid, kWalkThreads, 0, stream>>>(kt.rewards, a.perm, kt.stats, kt.head, open, coef,
                                                               kt.out, a.b, kt.mode, A(a.eps), sum);
    }
    if (a.renormalize) {
      chunk_renormalize_kernel<T><<<grid, kWalkThreads, 0, stream>>>(kt.out, a.perm, kt.stats, kt.head, open, coef,
                                                                     a.b, kt.mode, A(a.eps));
    }
  });
  return cudaGetLastError();
}

int64_t advantage_token_blocks(int64_t n) { return elementwise_blocks(n); }

cudaError_t advantage_tokens(DType dtype, int mask_kind, const TokenArgs& args, cudaStream_t stream) {
  if (args.n == 0) return cudaSuccess;
  RLK_CUDA_DISPATCH_FLOATING(dtype, T, {
    if (mask_kind == 0) {
      launch_tokens<T, bool>(args, stream);
    } else if (mask_kind == 1) {
      launch_tokens<T, int64_t>(args, stream);
    } else {
      launch_tokens<T, typename Acc<T>::type>(args, stream);  // float weights: the accumulation type
    }
  });
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace rlk
