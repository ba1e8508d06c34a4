// The optimal token baseline (rlkernels/reference/advantage_estimators.py optimal_token_baseline, verl 0.9.1
// compute_optimal_token_baseline_advantage) on CPU, in four passes instead of the reference's ~20 [B, T] torch
// ops:
//   1. per block of rows (blocks in parallel): the returns G (discounted_returns at gamma 1: G_t =
//      m_t (r_t + Σ_{j>t} m_j r_j)) and the masked cumulative path variance W·m, W_t = Σ_{j<=t} w_j m_j, into
//      `adv` (used as scratch), kRows rows' running sums at once; each row's length and rejected values;
//   2. per block of positions (blocks in parallel): the group sums Σ G·W·m and Σ W·m at every position, then
//      the group's baseline b = Σ G·W·m / (Σ W·m + eps) (0 in a group of one);
//   3. per group: the zero tail's lengths (the longest response, its ties, the second longest);
//   4. per row (rows in parallel): adv = (G − b)·m, b = 0 in a unique longest response's tail.
// Group ids are hashed (rlkernels/first_index_map.h): no sort. The values are checked into the `ok` flag as
// the GPU kernels do (csrc/cuda/optimal_token_baseline.cu).
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "rlkernels/aggregation.h"
#include "rlkernels/first_index_map.h"
#include "rlkernels/optimal_token_baseline_host.h"
#include "rlkernels/torch_utils.h"
#include "rlkernels/vmath.h"
#include "token_masks.h"  // with_mask, ok_flag

namespace rlk {
namespace {

constexpr const char* kOp = "rlkernels::optimal_token_baseline";
// Tokens per parallel task: enough work to amortize the thread-pool hand-off on short rows.
constexpr int64_t kTaskTokens = 16384;
// Positions per block of pass 2: the block's group sums stay in L1/L2 while every row's block streams through.
constexpr int64_t kPositionBlock = 1024;
// Rows whose running sums pass 1 carries together: independent add chains hide the add latency.
constexpr int kRows = 8;

template <typename A, typename M>
struct Inputs {
  const A* rewards;  // [B, T]
  const M* mask;     // [B, T] bool, int64 (0 / 1) or A
  const A* old_logp;
  const A* sum_sq;
  const A* is_weights;  // nullptr without rollout_is_weights
  A* returns;           // [B, T] out
};

// Pass 1 on one row but the running sums: w·m into wm, in the reference's order of operations
// (w = (1 − 2 e^{logp}) + Σπ², times ρ²). Returns the row's length Σ m; adds its
// rejected values (non-finite rewards, Σπ² or ρ not finite and >= 0, bad mask values) to `bad`.
template <typename A, typename M>
RLK_CPU_MULTIVERSION A row_weights(const Inputs<A, M>& in, int64_t base, int64_t t, A* __restrict__ wm,
                                   int64_t& bad) {
  const M* __restrict__ mask = in.mask + base;
  const A* __restrict__ lp = in.old_logp + base;
  const A* __restrict__ sp = in.sum_sq + base;
  const A* __restrict__ r = in.rewards + base;
  A len = A(0);
  int64_t rejected = 0;
  if (in.is_weights == nullptr) {
    for (int64_t j = 0; j < t; ++j) {
      wm[j] = ((A(1) - A(2) * exp_(lp[j])) + sp[j]) * mask_weight<A>(mask[j]);
    }
  } else {
    const A* __restrict__ rho = in.is_weights + base;
    for (int64_t j = 0; j < t; ++j) {
      wm[j] = (((A(1) - A(2) * exp_(lp[j])) + sp[j]) * (rho[j] * rho[j])) * mask_weight<A>(mask[j]);
    }
    for (int64_t j = 0; j < t; ++j) rejected += bad_weight(rho[j]);
  }
  for (int64_t j = 0; j < t; ++j) {
    len += mask_weight<A>(mask[j]);
    rejected += int64_t(bad_weight(sp[j]) | bad_mask_value(mask[j]) | !finite_value(r[j]));
  }
  bad += rejected;
  return len;
}

// Pass 1's returns on rows [r0, r0 + R), R running sums at once from the right (as cumulate_rows):
// G_j = m_j (Σ_{j'>=j} m r + (1 − m_j) r_j), m (r + Σ_{j'>j} m r) without taking m r back out of the sum.
template <int R, typename A, typename M>
void return_rows(const M* __restrict__ mask, const A* __restrict__ r, A* __restrict__ ret, int64_t t) {
  A right[R];
  for (int k = 0; k < R; ++k) right[k] = A(0);
  for (int64_t j = t - 1; j >= 0; --j) {
#pragma GCC unroll 8
    for (int k = 0; k < R; ++k) {
      const A m = mask_weight<A>(mask[k * t + j]);
      right[k] += m * r[k * t + j];
      ret[k * t + j] = m * (right[k] + (A(1) - m) * r[k * t + j]);
    }
  }
}

// Pass 1 on rows [r0, r0 + R): wm = cumsum(w·m)·m in place, R running sums at once.
template <int R, typename A, typename M>
void cumulate_rows(const M* __restrict__ mask, A* __restrict__ wm, int64_t t) {
  A cum[R];
  for (int k = 0; k < R; ++k) cum[k] = A(0);
  for (int64_t j = 0; j < t; ++j) {
#pragma GCC unroll 8
    for (int k = 0; k < R; ++k) {
      cum[k] += wm[k * t + j];
      wm[k * t + j] = cum[k] * mask_weight<A>(mask[k * t + j]);
    }
  }
}

// Pass 2 on positions [t0, t1): num[g, j] += G·W·m, den[g, j] += W·m over the rows of group g.
template <typename A>
RLK_CPU_MULTIVERSION void group_sums(const A* __restrict__ returns, const A* __restrict__ wm,
                                     const int64_t* __restrict__ group, int64_t b, int64_t t, int64_t t0,
                                     int64_t t1, A* __restrict__ num, A* __restrict__ den) {
  for (int64_t i = 0; i < b; ++i) {
    const A* g_row = returns + i * t;
    const A* w_row = wm + i * t;
    A* n_row = num + group[i] * t;
    A* d_row = den + group[i] * t;
    for (int64_t j = t0; j < t1; ++j) {
      n_row[j] += g_row[j] * w_row[j];
      d_row[j] += w_row[j];
    }
  }
}

// Pass 4 on one row: adv = (G − b)·m with the group's baseline b before `cut`, b = 0 from `cut` on.
template <typename A, typename M>
RLK_CPU_MULTIVERSION void row_advantages(const M* __restrict__ mask, const A* __restrict__ returns,
                                         const A* __restrict__ baseline, int64_t cut, int64_t t,
                                         A* __restrict__ adv) {
  for (int64_t j = 0; j < cut; ++j) adv[j] = (returns[j] - baseline[j]) * mask_weight<A>(mask[j]);
  for (int64_t j = cut; j < t; ++j) adv[j] = returns[j] * mask_weight<A>(mask[j]);
}

// The first position of each row whose baseline the zero tail sets to 0 (t where it does not apply), from the
// rows' lengths: a group's unique longest response, when longer than the second longest (verl:
// sorted(lengths)[-2], floored as its int()), from that length on.
template <typename A>
std::vector<int64_t> tail_starts(const std::vector<A>& lengths, const std::vector<int64_t>& group,
                                 const std::vector<int64_t>& members, int64_t groups, int64_t t) {
  const int64_t b = int64_t(lengths.size());
  const A lowest = -std::numeric_limits<A>::infinity();
  std::vector<A> longest(groups, lowest), below(groups, lowest);
  std::vector<int64_t> ties(groups, 0), hits(groups, 0);
  for (int64_t i = 0; i < b; ++i) longest[group[i]] = std::max(longest[group[i]], lengths[i]);
  for (int64_t i = 0; i < b; ++i) {
    const int64_t g = group[i];
    if (lengths[i] == longest[g]) {
      ++ties[g];
    } else {
      below[g] = std::max(below[g], lengths[i]);
    }
    if (lengths[i] == std::floor(longest[g])) ++hits[g];
  }
  std::vector<int64_t> start(b, t);
  for (int64_t i = 0; i < b; ++i) {
    const int64_t g = group[i];
    const A top = std::floor(longest[g]);
    const A cut = std::floor(ties[g] > 1 ? longest[g] : below[g]);
    if (members[g] > 1 && lengths[i] == top && hits[g] == 1 && top > cut) {
      // cut >= 0 (the lengths are sums of weights >= 0); a float mask's lengths may pass t
      start[i] = cut >= A(t) ? t : int64_t(cut);
    }
  }
  return start;
}

// Returns the count of rejected values.
template <typename A, typename M, typename I>
int64_t optimal_token_baseline(const Inputs<A, M>& in, const I* ids, int64_t b, int64_t t, bool zero_tail, A eps,
                               A* adv) {
  std::vector<int64_t> group(b);
  const int64_t groups = dense_groups(ids, b, group.data());
  std::vector<int64_t> members(groups, 0);
  for (int64_t i = 0; i < b; ++i) ++members[group[i]];

  std::vector<A> lengths(b);
  std::vector<int64_t> bad(b, 0);
  const int64_t blocks = (b + kRows - 1) / kRows;
  const int64_t block_grain = std::max<int64_t>(1, kTaskTokens / std::max<int64_t>(kRows * t, 1));
  at::parallel_for(0, blocks, block_grain, [&](int64_t begin, int64_t end) {
    for (int64_t blk = begin; blk < end; ++blk) {
      const int64_t r0 = blk * kRows, rows = std::min<int64_t>(kRows, b - r0);
      for (int64_t i = r0; i < r0 + rows; ++i) lengths[i] = row_weights(in, i * t, t, adv + i * t, bad[i]);
      if (rows == kRows) {
        cumulate_rows<kRows>(in.mask + r0 * t, adv + r0 * t, t);
        return_rows<kRows>(in.mask + r0 * t, in.rewards + r0 * t, in.returns + r0 * t, t);
      } else {
        for (int64_t i = r0; i < r0 + rows; ++i) {
          cumulate_rows<1>(in.mask + i * t, adv + i * t, t);
          return_rows<1>(in.mask + i * t, in.rewards + i * t, in.returns + i * t, t);
        }
      }
    }
  });

  // num becomes the baseline in place (0 for a group of one).
  std::vector<A> num(size_t(groups * t), A(0)), den(size_t(groups * t), A(0));
  at::parallel_for(0, (t + kPositionBlock - 1) / kPositionBlock, 1, [&](int64_t begin, int64_t end) {
    for (int64_t blk = begin; blk < end; ++blk) {
      const int64_t t0 = blk * kPositionBlock, t1 = std::min(t, t0 + kPositionBlock);
      group_sums<A>(in.returns, adv, group.data(), b, t, t0, t1, num.data(), den.data());
      for (int64_t g = 0; g < groups; ++g) {
        A* base = num.data() + g * t;
        const A* d = den.data() + g * t;
        for (int64_t j = t0; j < t1; ++j) base[j] = members[g] > 1 ? base[j] / (d[j] + eps) : A(0);
      }
    }
  });

  const std::vector<int64_t> start =
      zero_tail ? tail_starts(lengths, group, members, groups, t) : std::vector<int64_t>(b, t);
  const int64_t row_grain = std::max<int64_t>(1, kTaskTokens / std::max<int64_t>(t, 1));
  at::parallel_for(0, b, row_grain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      row_advantages(in.mask + i * t, in.returns + i * t, num.data() + group[i] * t, start[i], t, adv + i * t);
    }
  });
  int64_t rejected = 0;
  for (const int64_t count : bad) rejected += count;
  return rejected;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> optimal_token_baseline_cpu(
    const at::Tensor& rewards, const at::Tensor& mask, const at::Tensor& group_ids, const at::Tensor& old_logp,
    const at::Tensor& sum_pi_squared, const std::optional<at::Tensor>& rollout_is_weights, bool handle_zero_tail,
    double eps) {
  check_otb_inputs(kOp, rewards, mask, group_ids, old_logp, sum_pi_squared, rollout_is_weights, eps);
  const at::Tensor r = rewards.contiguous(), m = mask.contiguous(), ids = group_ids.contiguous();
  const at::Tensor lp = old_logp.contiguous(), sp = sum_pi_squared.contiguous();
  const at::Tensor rho = rollout_is_weights.has_value() ? rollout_is_weights->contiguous() : at::Tensor();
  at::Tensor adv = at::empty_like(r), returns = at::empty_like(r);
  const int64_t b = r.size(0), t = r.size(1);
  int64_t rejected = 0;
  if (b > 0 && t > 0) {
    AT_DISPATCH_FLOATING_TYPES(r.scalar_type(), kOp, [&] {
      using A = scalar_t;
      with_mask<A>(m, [&](auto mask_ptr) {
        using M = std::remove_const_t<std::remove_pointer_t<decltype(mask_ptr)>>;
        const Inputs<A, M> in{r.const_data_ptr<A>(), mask_ptr, lp.const_data_ptr<A>(), sp.const_data_ptr<A>(),
                              rho.defined() ? rho.const_data_ptr<A>() : nullptr, returns.mutable_data_ptr<A>()};
        AT_DISPATCH_INDEX_TYPES(ids.scalar_type(), kOp, [&] {
          rejected = optimal_token_baseline(in, ids.const_data_ptr<index_t>(), b, t, handle_zero_tail, A(eps),
                                            adv.mutable_data_ptr<A>());
        });
      });
    });
  }
  return {adv, returns, ok_flag(rejected, r)};
}

}  // namespace

TORCH_LIBRARY_IMPL(rlkernels, CPU, m) { m.impl("optimal_token_baseline", &optimal_token_baseline_cpu); }

}  // namespace rlk
