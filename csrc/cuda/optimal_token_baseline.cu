// The optimal token baseline's CUDA kernels (rlkernels/reference/advantage_estimators.py optimal_token_baseline,
// verl 0.9.1 compute_optimal_token_baseline_advantage), two launches after a stable sort of the group ids, as
// the Triton flavor (rlkernels/triton/optimal_token_baseline.py, whose docstring has the passes):
//   rows    a block per response: W·m (W_t = Σ_{j<=t} w_j m_j, w = (1 − 2 e^{old_logp}) + Σπ², times ρ²) into
//           the advantages' buffer (scratch) from the left, the returns G_t = m_t (r_t + Σ_{j>t} m_j r_j) from
//           the right, chunk by chunk with block scans (warp shuffles, the warps' totals in shared memory);
//           the row's length Σ m and its count of rejected values;
//   groups  a block per sorted position and chunk of positions, working at a group's head: the group's run,
//           its zero tail from the members' lengths, b = Σ_g G·W·m / (Σ_g W·m + eps) (0 in a group of one),
//           every member's (G − b)·m over the scratch the block has read; block (head, 0) lowers the flag on
//           a member's rejected value (the rows pass's block 0 raised it).
#include <type_traits>

#include "block_reduce.cuh"
#include "common.cuh"
#include "optimal_token_baseline.h"
#include "rlkernels/aggregation.h"
#include "rlkernels/vmath.h"

namespace rlk {
namespace cuda {
namespace {

// 8 warps: a 1024-position chunk in registers (4 positions a thread) and a short scan over the warps' totals.
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
// Positions per thread per chunk: 4 loads in flight per input.
constexpr int kItems = 4;
constexpr int64_t kChunk = int64_t(kThreads) * kItems;
constexpr unsigned kFullMask = 0xffffffffu;

// The sum of x over the threads before this one (kReverse: after it) in the block, and the block's total, in
// a fixed order (no subtraction: the exclusive value is the neighbour's inclusive one). `warp_totals` holds
// kWarps values; every thread must call it.
template <bool kReverse, typename A>
__device__ __forceinline__ A exclusive_block_scan(A x, A* warp_totals, A& total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  A inc = x;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const A other = kReverse ? __shfl_down_sync(kFullMask, inc, d) : __shfl_up_sync(kFullMask, inc, d);
    if (kReverse ? lane + d < 32 : lane >= d) inc += other;
  }
  A excl = kReverse ? __shfl_down_sync(kFullMask, inc, 1) : __shfl_up_sync(kFullMask, inc, 1);
  if (kReverse ? lane == 31 : lane == 0) excl = A(0);
  if (kReverse ? lane == 0 : lane == 31) warp_totals[warp] = inc;
  __syncthreads();
  A before = A(0);
  total = A(0);
  for (int w = 0; w < kWarps; ++w) {
    const A s = warp_totals[w];
    total += s;
    if (kReverse ? w > warp : w < warp) before += s;
  }
  __syncthreads();  // every thread read the totals before the next call overwrites them
  return before + excl;
}

template <typename A, typename M>
__global__ void __launch_bounds__(kThreads)
    rows_kernel(const A* __restrict__ rewards,   // [b, t]
                const M* __restrict__ mask,      // [b, t]
                const A* __restrict__ old_logp,  // [b, t]
                const A* __restrict__ sum_sq,    // [b, t]
                const A* __restrict__ rho,       // [b, t] or nullptr
                A* __restrict__ returns,         // [b, t] out
                A* __restrict__ wm_out,          // [b, t] out: W·m
                A* __restrict__ row_stats,       // [b, kOtbRowStats] out: length, rejected values
                bool* __restrict__ ok,           // [] raised here
                int64_t t) {
  __shared__ A warp_totals[kWarps];
  __shared__ A smem[2 * kWarps];
  const int64_t row = blockIdx.x;
  const int tid = threadIdx.x;
  if (row == 0 && tid == 0) *ok = true;
  const int64_t base = row * t;
  A length = A(0), bad = A(0);
  A carry = A(0);  // Σ w·m left of the chunk
  for (int64_t lo = 0; lo < t; lo += kChunk) {
    const int64_t first = lo + int64_t(tid) * kItems;
    A wm[kItems], m[kItems];
    A own = A(0);
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const int64_t i = first + k;
      wm[k] = m[k] = A(0);
      if (i >= t) continue;
      const auto raw = mask_raw<A>(mask + base + i);
      m[k] = mask_weight<A>(raw);
      const A sp = sum_sq[base + i];
      A w = (A(1) - A(2) * exp_(old_logp[base + i])) + sp;  // the reference's order of operations
      bool rejected = bad_mask_value(raw) || bad_weight(sp);
      if (rho != nullptr) {
        const A r = rho[base + i];
        w = w * (r * r);
        rejected = rejected || bad_weight(r);
      }
      wm[k] = w * m[k];
      own += wm[k];
      length += m[k];
      bad += A(rejected);
    }
    A total;
    A cum = carry + exclusive_block_scan<false>(own, warp_totals, total);
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const int64_t i = first + k;
      cum += wm[k];
      if (i < t) wm_out[base + i] = cum * m[k];
    }
    carry += total;
  }
  carry = A(0);  // Σ m·r right of the chunk
  for (int64_t hi = t; hi > 0; hi -= kChunk) {
    const int64_t first = hi - kChunk + int64_t(tid) * kItems;
    A r[kItems], m[kItems];
    A own = A(0);
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const int64_t i = first + k;
      r[k] = m[k] = A(0);
      if (i < 0) continue;
      m[k] = mask_weight<A>(mask_raw<A>(mask + base + i));
      r[k] = rewards[base + i];
      bad += A(!finite_value(r[k]));
      own += m[k] * r[k];
    }
    A total;
    A right = carry + exclusive_block_scan<true>(own, warp_totals, total);  // Σ m·r right of this thread
#pragma unroll
    for (int k = kItems - 1; k >= 0; --k) {
      const int64_t i = first + k;
      right += m[k] * r[k];  // now inclusive of position i
      // m (r + Σ_{j>i} m_j r_j) without taking m_i r_i back out of the inclusive sum
      if (i >= 0) returns[base + i] = m[k] * (right + (A(1) - m[k]) * r[k]);
    }
    carry += total;
  }
  A v[2] = {length, bad};
  block_sum<kThreads>(v, smem);
  if (tid == 0) {
    row_stats[kOtbRowStats * row] = v[0];
    row_stats[kOtbRowStats * row + 1] = v[1];
  }
}

// The group's zero tail (verl's handle_zero_tail): the member (original index) whose baseline is 0 from `cut`
// on, or -1: the group's unique longest response, when longer than the second longest (verl:
// sorted(lengths)[-2]; both floored, as verl's int()). Lengths from the rows pass, kThreads members at a time.
template <typename A>
__device__ void zero_tail(const int64_t* __restrict__ perm, const A* __restrict__ row_stats, int64_t head,
                          int64_t n, A* smem, long long* ismem, long long& alone, A& cut) {
  const A lowest = -A(INFINITY);
  A top[1] = {lowest};
  for (int64_t k = threadIdx.x; k < n; k += kThreads) {
    top[0] = MaxOp{}(top[0], row_stats[kOtbRowStats * perm[head + k]]);
  }
  block_max<kThreads>(top, smem, lowest);
  if (threadIdx.x == 0) smem[0] = top[0];
  __syncthreads();
  const A longest = smem[0];
  __syncthreads();
  A counts[2] = {A(0), A(0)};  // ties of the longest, hits of its floor
  A below[1] = {lowest};
  long long hit[1] = {-1};
  for (int64_t k = threadIdx.x; k < n; k += kThreads) {
    const int64_t idx = perm[head + k];
    const A len = row_stats[kOtbRowStats * idx];
    counts[0] += A(len == longest);
    if (len != longest) below[0] = MaxOp{}(below[0], len);
    if (len == A(floor(longest))) {
      counts[1] += A(1);
      hit[0] = idx > hit[0] ? idx : hit[0];
    }
  }
  block_sum<kThreads>(counts, smem);
  __syncthreads();
  block_max<kThreads>(below, smem, lowest);
  block_max<kThreads>(hit, ismem, -1LL);
  if (threadIdx.x == 0) {
    const A second = counts[0] > A(1) ? longest : below[0];
    const A c = A(floor(second));
    const bool unique = counts[1] == A(1) && A(floor(longest)) > c && n > 1;
    smem[0] = c;
    ismem[0] = unique ? hit[0] : -1;
  }
  __syncthreads();
  cut = smem[0];
  alone = ismem[0];
  __syncthreads();
}

template <typename A, typename M, typename I>
__global__ void __launch_bounds__(kThreads)
    groups_kernel(const A* __restrict__ returns,    // [b, t]
                  const M* __restrict__ mask,       // [b, t]
                  const I* __restrict__ ids,        // [b] sorted
                  const int64_t* __restrict__ perm,  // [b]
                  const A* __restrict__ row_stats,  // [b, kOtbRowStats]
                  A* __restrict__ adv,              // [b, t] in: W·m, out: the advantages
                  bool* __restrict__ ok,            // [] lowered here
                  int64_t b, int64_t t, A eps, bool zero_tail_on) {
  __shared__ A smem[2 * kWarps];
  __shared__ long long ismem[kWarps];
  const int64_t head = blockIdx.x;
  if (head > 0 && ids[head - 1] == ids[head]) return;  // not a group's head: the whole block leaves
  const I key = ids[head];
  // The run's end: the first sorted position after head whose id differs, kThreads positions at a time.
  int64_t end = b;
  for (int64_t q0 = head + 1; q0 < b; q0 += kThreads) {
    const int64_t q = q0 + threadIdx.x;
    long long stop[1] = {(q < b && ids[q] != key) ? -(long long)q : -(long long)b};
    block_max<kThreads>(stop, ismem, -(long long)b);
    if (threadIdx.x == 0) ismem[0] = stop[0];
    __syncthreads();
    end = -ismem[0];
    __syncthreads();
    if (end < b) break;
  }
  const int64_t n = end - head;
  if (blockIdx.y == 0) {
    A count[1] = {A(0)};
    for (int64_t k = threadIdx.x; k < n; k += kThreads) count[0] += row_stats[kOtbRowStats * perm[head + k] + 1];
    block_sum<kThreads>(count, smem);
    if (threadIdx.x == 0 && count[0] > A(0)) {
      *ok = false;
      RLK_REQUIRE_VALUES(false, "rlkernels optimal_token_baseline: NaN or inf rewards, sum_pi_squared or "
                                "rollout_is_weights negative or not finite, or a mask value not 0 / 1 (integer) or "
                                "finite and >= 0 (float)");
    }
    __syncthreads();
  }
  long long alone = -1;
  A cut = A(0);
  if (zero_tail_on) zero_tail(perm, row_stats, head, n, smem, ismem, alone, cut);
  const int64_t first = int64_t(blockIdx.y) * kChunk + int64_t(threadIdx.x) * kItems;
  A num[kItems], den[kItems];
#pragma unroll
  for (int k = 0; k < kItems; ++k) num[k] = den[k] = A(0);
  for (int64_t j = 0; j < n; ++j) {
    const int64_t base = perm[head + j] * t;
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const int64_t i = first + k;
      if (i >= t) continue;
      const A wm = adv[base + i];
      num[k] += returns[base + i] * wm;
      den[k] += wm;
    }
  }
  A baseline[kItems];
#pragma unroll
  for (int k = 0; k < kItems; ++k) baseline[k] = n > 1 ? num[k] / (den[k] + eps) : A(0);
  for (int64_t j = 0; j < n; ++j) {
    const int64_t idx = perm[head + j];
    const int64_t base = idx * t;
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const int64_t i = first + k;
      if (i >= t) continue;
      const A m = mask_weight<A>(mask_raw<A>(mask + base + i));
      const A bl = (idx == alone && A(i) >= cut) ? A(0) : baseline[k];
      adv[base + i] = (returns[base + i] - bl) * m;
    }
  }
}

template <typename A, typename M>
cudaError_t launch(const OtbArgs& a, cudaStream_t stream) {
  const A* r = static_cast<const A*>(a.rewards);
  const M* m = static_cast<const M*>(a.mask);
  A* ret = static_cast<A*>(a.returns);
  A* adv = static_cast<A*>(a.advantages);
  A* stats = static_cast<A*>(a.row_stats);
  rows_kernel<A, M><<<unsigned(a.b), kThreads, 0, stream>>>(
      r, m, static_cast<const A*>(a.old_logp), static_cast<const A*>(a.sum_pi_squared),
      static_cast<const A*>(a.is_weights), ret, adv, stats, a.ok, a.t);
  const dim3 grid(unsigned(a.b), unsigned((a.t + kChunk - 1) / kChunk));
  if (a.ids_int64) {
    groups_kernel<A, M, int64_t><<<grid, kThreads, 0, stream>>>(ret, m, static_cast<const int64_t*>(a.sorted_ids),
                                                                a.perm, stats, adv, a.ok, a.b, a.t, A(a.eps),
                                                                a.zero_tail);
  } else {
    groups_kernel<A, M, int32_t><<<grid, kThreads, 0, stream>>>(ret, m, static_cast<const int32_t*>(a.sorted_ids),
                                                                a.perm, stats, adv, a.ok, a.b, a.t, A(a.eps),
                                                                a.zero_tail);
  }
  return cudaGetLastError();
}

template <typename A>
cudaError_t launch_masks(const OtbArgs& a, cudaStream_t stream) {
  switch (a.mask_kind) {
    case OtbMask::Bool:
      return launch<A, bool>(a, stream);
    case OtbMask::Int64:
      return launch<A, int64_t>(a, stream);
    case OtbMask::Float:
      return launch<A, A>(a, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace

cudaError_t optimal_token_baseline_sorted(const OtbArgs& args, cudaStream_t stream) {
  if (args.b == 0 || args.t == 0) return cudaSuccess;
  if (args.dtype == DType::Float64) return launch_masks<double>(args, stream);
  if (args.dtype == DType::Float32) return launch_masks<float>(args, stream);
  return cudaErrorInvalidValue;
}

}  // namespace cuda
}  // namespace rlk
