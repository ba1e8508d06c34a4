// The optimal token baseline (rlkernels/reference/advantage_estimators.py optimal_token_baseline, verl 0.9.1
// compute_optimal_token_baseline_advantage) on CPU, from the returns G (the discounted_returns op, gamma 1),
// in four passes instead of the reference's ~20 [B, T] torch ops:
//   1. per block of rows (blocks in parallel): the masked cumulative path variance W·m, W_t = Σ_{j<=t} w_j m_j,
//      into `adv` (used as scratch), kRows rows' running sums at once;
//   2. per block of positions (blocks in parallel): the group sums Σ G·W·m and Σ W·m at every position, then
//      the group's baseline b = Σ G·W·m / (Σ W·m + eps) (0 in a group of one);
//   3. per group: the zero tail's lengths (the longest response, its ties, the second longest);
//   4. per row (rows in parallel): adv = (G − b)·m, b = 0 in a unique longest response's tail.
// Group ids are hashed (rlkernels/first_index_map.h): no sort.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "rlkernels/first_index_map.h"
#include "rlkernels/torch_utils.h"
#include "rlkernels/vmath.h"

namespace rlk {
namespace {

constexpr const char* kOp = "rlkernels::optimal_token_baseline_rows";
// Tokens per parallel task: enough work to amortize the thread-pool hand-off on short rows.
constexpr int64_t kTaskTokens = 16384;
// Positions per block of pass 2: the block's group sums stay in L1/L2 while every row's block streams through.
constexpr int64_t kPositionBlock = 1024;
// Rows whose running sums pass 1 carries together: independent add chains hide the add latency.
constexpr int kRows = 8;

template <typename A, typename M>
struct Inputs {
  const A* returns;  // [B, T]
  const M* mask;     // [B, T]
  const A* old_logp;
  const A* sum_sq;
  const A* is_weights;  // nullptr without rollout_is_weights
};

// w·m of one row into wm, in the reference's order of operations: w = (1 − 2 e^{logp}) + Σπ², times ρ².
// Returns the row's length Σ m.
template <typename A, typename M>
RLK_CPU_MULTIVERSION A row_weights(const Inputs<A, M>& in, int64_t base, int64_t t, A* __restrict__ wm) {
  const M* __restrict__ mask = in.mask + base;
  const A* __restrict__ lp = in.old_logp + base;
  const A* __restrict__ sp = in.sum_sq + base;
  A len = A(0);
  if (in.is_weights == nullptr) {
    for (int64_t j = 0; j < t; ++j) wm[j] = ((A(1) - A(2) * exp_(lp[j])) + sp[j]) * A(mask[j]);
  } else {
    const A* __restrict__ rho = in.is_weights + base;
    for (int64_t j = 0; j < t; ++j) {
      wm[j] = (((A(1) - A(2) * exp_(lp[j])) + sp[j]) * (rho[j] * rho[j])) * A(mask[j]);
    }
  }
  for (int64_t j = 0; j < t; ++j) len += A(mask[j]);
  return len;
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
      wm[k * t + j] = cum[k] * A(mask[k * t + j]);
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
  for (int64_t j = 0; j < cut; ++j) adv[j] = (returns[j] - baseline[j]) * A(mask[j]);
  for (int64_t j = cut; j < t; ++j) adv[j] = returns[j] * A(mask[j]);
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

template <typename A, typename M, typename I>
void optimal_token_baseline(const Inputs<A, M>& in, const I* ids, int64_t b, int64_t t, bool zero_tail, A eps,
                            A* adv) {
  std::vector<int64_t> group(b);
  const int64_t groups = dense_groups(ids, b, group.data());
  std::vector<int64_t> members(groups, 0);
  for (int64_t i = 0; i < b; ++i) ++members[group[i]];

  std::vector<A> lengths(b);
  const int64_t blocks = (b + kRows - 1) / kRows;
  const int64_t block_grain = std::max<int64_t>(1, kTaskTokens / std::max<int64_t>(kRows * t, 1));
  at::parallel_for(0, blocks, block_grain, [&](int64_t begin, int64_t end) {
    for (int64_t blk = begin; blk < end; ++blk) {
      const int64_t r0 = blk * kRows, rows = std::min<int64_t>(kRows, b - r0);
      for (int64_t i = r0; i < r0 + rows; ++i) lengths[i] = row_weights(in, i * t, t, adv + i * t);
      if (rows == kRows) {
        cumulate_rows<kRows>(in.mask + r0 * t, adv + r0 * t, t);
      } else {
        for (int64_t i = r0; i < r0 + rows; ++i) cumulate_rows<1>(in.mask + i * t, adv + i * t, t);
      }
    }
  });

  // num becomes the baseline in place (0 for a group of one).
  std::vector<A> num(size_t(groups * t), A(0)), den(size_t(groups * t), A(0));
  at::parallel_for(0, (t + kPositionBlock - 1) / kPositionBlock, 1, [&](int64_t begin, int64_t end) {
    for (int64_t blk = begin; blk < end; ++blk) {
      const int64_t t0 = blk * kPositionBlock, t1 = std::min(t, t0 + kPositionBlock);
      group_sums(in.returns, adv, group.data(), b, t, t0, t1, num.data(), den.data());
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
}

at::Tensor optimal_token_baseline_rows_cpu(const at::Tensor& returns, const at::Tensor& mask,
                                            const at::Tensor& group_ids, const at::Tensor& old_logp,
                                            const at::Tensor& sum_pi_squared,
                                            const std::optional<at::Tensor>& rollout_is_weights,
                                            bool handle_zero_tail, double eps) {
  TORCH_CHECK(returns.dim() == 2, kOp, ": returns must be [B, T], got ", returns.sizes());
  TORCH_CHECK(returns.scalar_type() == at::kFloat || returns.scalar_type() == at::kDouble, kOp,
              ": returns must be float32 or float64, got ", returns.scalar_type());
  check_same_layout(kOp, returns, "returns", old_logp, "old_logp");
  check_same_layout(kOp, returns, "returns", sum_pi_squared, "sum_pi_squared");
  if (rollout_is_weights.has_value()) {
    check_same_layout(kOp, returns, "returns", *rollout_is_weights, "rollout_is_weights");
  }
  TORCH_CHECK(mask.sizes() == returns.sizes(), kOp, ": mask ", mask.sizes(), " must have returns' shape ",
              returns.sizes());
  TORCH_CHECK(mask.scalar_type() == at::kBool || mask.scalar_type() == returns.scalar_type(), kOp,
              ": mask must be bool or returns' dtype, got ", mask.scalar_type());
  TORCH_CHECK(group_ids.dim() == 1 && group_ids.size(0) == returns.size(0), kOp, ": group_ids must be [B] = [",
              returns.size(0), "], got ", group_ids.sizes());
  TORCH_CHECK(group_ids.scalar_type() == at::kInt || group_ids.scalar_type() == at::kLong, kOp,
              ": group_ids must be int32 or int64, got ", group_ids.scalar_type());
  TORCH_CHECK(eps >= 0, kOp, ": eps must be >= 0, got ", eps);
  const at::Tensor g = returns.contiguous(), m = mask.contiguous(), ids = group_ids.contiguous();
  const at::Tensor lp = old_logp.contiguous(), sp = sum_pi_squared.contiguous();
  const at::Tensor rho = rollout_is_weights.has_value() ? rollout_is_weights->contiguous() : at::Tensor();
  at::Tensor adv = at::empty(g.sizes(), g.options());
  const int64_t b = g.size(0), t = g.size(1);
  if (b == 0 || t == 0) return adv;
  AT_DISPATCH_FLOATING_TYPES(g.scalar_type(), kOp, [&] {
    using A = scalar_t;
    dispatch_bool(m.scalar_type() == at::kBool, [&](auto is_bool) {
      using M = std::conditional_t<decltype(is_bool)::value, bool, A>;
      const Inputs<A, M> in{g.const_data_ptr<A>(), m.const_data_ptr<M>(), lp.const_data_ptr<A>(),
                            sp.const_data_ptr<A>(), rho.defined() ? rho.const_data_ptr<A>() : nullptr};
      AT_DISPATCH_INDEX_TYPES(ids.scalar_type(), kOp, [&] {
        optimal_token_baseline(in, ids.const_data_ptr<index_t>(), b, t, handle_zero_tail, A(eps),
                               adv.mutable_data_ptr<A>());
      });
    });
  });
  return adv;
}

}  // namespace

TORCH_LIBRARY_IMPL(rlkernels, CPU, m) { m.impl("optimal_token_baseline_rows", &optimal_token_baseline_rows_cpu); }

}  // namespace rlk
