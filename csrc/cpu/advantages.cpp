// group_advantages on CPU. Contiguous groups: one task per run of groups, each group's statistics in
// two passes over its (cached) rewards. Arbitrary ids: one pass through an open-addressing hash map
// sends every id to its group's representative (the index of the group's first member), then
// statistics accumulate at the representative (sort-free, O(B)). Non-finite rewards are counted into the
// op's validity flag. group_advantages_sum: each reward column through the same kernels, their weighted sum
// (and TRL's batch pass after it). advantage_tokens: the per-row advantages times the mask, the mask's values
// checked into the flag; whitened_group_tokens: the group pass, then the tokens whitened (verl's
// masked_whiten).
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/logical_and.h>
#include <ATen/ops/scalar_tensor.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <vector>

#include "rlkernels/advantages_host.h"
#include "rlkernels/first_index_map.h"
#include "token_masks.h"

namespace rlk {
namespace {

// Rewards per parallel task: below it a second thread costs more than it saves once 1 parallel region in 100
// waits out a busy neighbor's scheduler tick (benchmarks/parallel_grain.py, results/parallel_grain.md).
constexpr int64_t kGrain = 65536;

template <typename T>
using acc_t = at::opmath_type<T>;

// Partial sums per reduction: 4 independent accumulators (one AVX2 vector of fp64) instead of one
// serial chain of dependent adds.
constexpr int kLanes = 4;

// sum of (r[i] - shift)^p over a span, p = 1 or 2, in double whatever r's dtype: a group's statistics are
// sums over its members, kept in double by every kernel (the GPU ones add by atomics in no fixed order, and
// fp32 running sums there lose small terms added after large ones), so that all give the same answer.
template <int P, typename T>
inline double shifted_sum(const T* __restrict__ r, int64_t n, double shift) {
  double lanes[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int k = 0; k < kLanes; ++k) {
      const double d = double(r[i + k]) - shift;
      lanes[k] += P == 1 ? d : d * d;
    }
  }
  for (; i < n; ++i) {
    const double d = double(r[i]) - shift;
    lanes[0] += P == 1 ? d : d * d;
  }
  double total = 0;
  for (int k = 0; k < kLanes; ++k) total += lanes[k];
  return total;
}

// How many of n rewards are NaN or inf (the slow path, run only when a span's statistics are not finite).
template <typename T>
int64_t count_non_finite(const T* r, int64_t n) {
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) bad += !std::isfinite(double(r[i]));
  return bad;
}

// Mean (around the pivot r[0], so a constant span has exactly its value as mean) and centered sum of
// squares, in double; returns how many rewards of the span are not finite (a non-finite reward makes the
// statistics non-finite, which only then pays for the exact count).
template <typename T>
int64_t span_stats(const T* __restrict__ r, int64_t n, double& mean, double& m2) {
  const double pivot = double(r[0]);
  mean = pivot + shifted_sum<1>(r, n, pivot) / double(n);
  m2 = shifted_sum<2>(r, n, mean);
  return std::isfinite(mean) && std::isfinite(m2) ? 0 : count_non_finite(r, n);
}

// out[i] = the group's affine form applied to r[i] over one group (branch-free: vectorizes).
template <typename T>
RLK_CPU_MULTIVERSION void apply_span(const T* __restrict__ r, T* __restrict__ out, int64_t n, acc_t<T> shift,
                                     acc_t<T> factor, acc_t<T> denom) {
  using A = acc_t<T>;
  const GroupAffine<A> g{shift, factor, denom};
  for (int64_t i = 0; i < n; ++i) out[i] = T(group_apply(g, A(r[i])));
}

// Returns how many rewards are not finite.
template <typename T>
int64_t contiguous_groups(const T* r, T* out, int64_t b, int64_t g, GroupMode mode, acc_t<T> eps, acc_t<T> bstd) {
  using A = acc_t<T>;
  const int64_t grain = std::max<int64_t>(1, kGrain / g);
  std::atomic<int64_t> bad{0};
  at::parallel_for(0, b / g, grain, [&](int64_t begin, int64_t end) {
    int64_t task_bad = 0;
    for (int64_t grp = begin; grp < end; ++grp) {
      double mean, m2;
      task_bad += span_stats(r + grp * g, g, mean, m2);
      const GroupAffine<A> form = group_affine<A>(mode, A(g), A(mean), A(m2), eps, bstd);
      apply_span(r + grp * g, out + grp * g, g, form.shift, form.factor, form.denom);
    }
    bad += task_bad;
  });
  return bad.load();
}

// rep [b]: each reward's group representative (first_index_map.h representatives). Returns how many rewards
// are not finite.
template <typename T>
int64_t arbitrary_groups(const T* r, const std::vector<int64_t>& rep, T* out, int64_t b, GroupMode mode,
                         acc_t<T> eps, acc_t<T> bstd) {
  using A = acc_t<T>;
  // Statistics live at each group's representative: count, then mean (via the sum around the pivot
  // r[rep]), then the centered sum of squares.
  // In double, as span_stats.
  std::vector<double> count(b, 0.0), mean(b, 0.0), m2(b, 0.0);
  for (int64_t i = 0; i < b; ++i) {
    count[rep[i]] += 1.0;
    mean[rep[i]] += double(r[i]) - double(r[rep[i]]);
  }
  for (int64_t i = 0; i < b; ++i) {
    if (rep[i] == i) mean[i] = double(r[i]) + mean[i] / count[i];
  }
  for (int64_t i = 0; i < b; ++i) {
    const double d = double(r[i]) - mean[rep[i]];
    m2[rep[i]] += d * d;
  }
  std::vector<GroupAffine<A>> form(b);  // at the representatives
  bool finite = true;
  for (int64_t i = 0; i < b; ++i) {
    if (rep[i] != i) continue;
    form[i] = group_affine<A>(mode, A(count[i]), A(mean[i]), A(m2[i]), eps, bstd);
    finite = finite && std::isfinite(mean[i]) && std::isfinite(m2[i]);
  }
  at::parallel_for(0, b, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) out[i] = T(group_apply(form[rep[i]], A(r[i])));
  });
  return finite ? 0 : count_non_finite(r, b);
}

std::tuple<at::Tensor, at::Tensor> group_advantages_cpu(const at::Tensor& rewards,
                                                        const std::optional<at::Tensor>& group_ids,
                                                        int64_t group_size, c10::string_view mode, double eps) {
  check_group_inputs(rewards, group_ids, group_size, eps);
  const GroupMode md = checked_group_mode(mode, group_ids.has_value());
  const at::Tensor r = rewards.contiguous();
  at::Tensor out = at::empty(r.sizes(), r.options());
  const int64_t b = r.numel();
  if (b == 0) return {out, ok_flag(0, r)};
  int64_t bad = 0;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, r.scalar_type(), "group_advantages_cpu", [&] {
    using A = acc_t<scalar_t>;
    const scalar_t* rp = r.const_data_ptr<scalar_t>();
    scalar_t* o = out.mutable_data_ptr<scalar_t>();
    double mean, m2 = 0.0, nonzero = 0.0;
    if (is_batch_mode(md)) span_stats(rp, b, mean, m2);
    if (is_gpg_mode(md)) {
      for (int64_t i = 0; i < b; ++i) nonzero += double(A(rp[i]) != A(0));
    }
    const A bstd = batch_statistic<A>(md, double(b), m2, nonzero, eps);
    if (!group_ids.has_value()) {
      bad = contiguous_groups(rp, o, b, group_size, md, A(eps), bstd);
    } else {
      const at::Tensor ids = group_ids->contiguous();
      AT_DISPATCH_INDEX_TYPES(ids.scalar_type(), "group_advantages_cpu_ids", [&] {
        bad = arbitrary_groups(rp, representatives(ids.const_data_ptr<index_t>(), b), o, b, md, A(eps), bstd);
      });
    }
  });
  return {out, ok_flag(bad, r)};
}

// TRL's batch pass after the sum (group_advantages_sum's renormalize): the sums as one group ("grpo"), then
// each group of one 0 when the mode zeroes singles (its count from `single`). Returns nothing: the sums are
// finite where the scores were.
template <typename T>
void renormalize(T* total, int64_t b, GroupMode mode, acc_t<T> eps, const std::vector<bool>& single) {
  using A = acc_t<T>;
  double mean, m2;
  span_stats(total, b, mean, m2);
  const GroupAffine<A> form = group_affine<A>(GroupMode::GRPO, A(b), A(mean), A(m2), eps, A(1));
  apply_span(total, total, b, form.shift, form.factor, form.denom);
  if (!zero_singles(mode)) return;
  for (int64_t i = 0; i < b; ++i) {
    if (single[i]) total[i] = T(0);
  }
}

// Each response's group is of one (rep: the representatives of the ids' groups; none: groups of group_size).
std::vector<bool> singles(const std::vector<int64_t>& rep, int64_t b, int64_t group_size) {
  if (rep.empty()) return std::vector<bool>(b, group_size == 1);
  std::vector<int64_t> count(b, 0);
  for (int64_t i = 0; i < b; ++i) ++count[rep[i]];
  std::vector<bool> out(b);
  for (int64_t i = 0; i < b; ++i) out[i] = count[rep[i]] == 1;
  return out;
}

// Σ_k w_k group_advantages(scores[:, k]) (and TRL's batch pass with renormalize): each column through the
// group kernels above, the weighted sum in scores' dtype in column order, as the reference adds its terms.
// Returns how many scores are not finite.
template <typename T, typename I>
int64_t group_sum_rows(const T* s, const T* w, const I* ids, T* out, int64_t b, int64_t cols, int64_t group_size,
                       GroupMode mode, acc_t<T> eps, bool renorm) {
  std::vector<T> column(b), adv(b);
  const std::vector<int64_t> rep = ids == nullptr ? std::vector<int64_t>() : representatives(ids, b);
  int64_t bad = 0;
  for (int64_t k = 0; k < cols; ++k) {  // reward functions, not groups or rows
    for (int64_t i = 0; i < b; ++i) column[i] = s[i * cols + k];
    bad += ids == nullptr ? contiguous_groups(column.data(), adv.data(), b, group_size, mode, eps, acc_t<T>(1))
                          : arbitrary_groups(column.data(), rep, adv.data(), b, mode, eps, acc_t<T>(1));
    const T wk = w == nullptr ? T(1) : w[k];
    for (int64_t i = 0; i < b; ++i) {
      const T term = T(wk * adv[i]);
      out[i] = k == 0 ? term : T(out[i] + term);
    }
  }
  if (renorm && bad == 0) renormalize(out, b, mode, eps, singles(rep, b, group_size));
  return bad;
}

std::tuple<at::Tensor, at::Tensor> group_advantages_sum_cpu(const at::Tensor& scores,
                                                            const std::optional<at::Tensor>& group_ids,
                                                            int64_t group_size,
                                                            const std::optional<at::Tensor>& weights,
                                                            c10::string_view mode, double eps, bool renormalize) {
  const GroupMode md = check_group_sum_inputs(scores, group_ids, group_size, weights, mode, eps);
  const at::Tensor s = scores.contiguous();
  const int64_t b = s.size(0);
  at::Tensor out = at::empty({b}, s.options());
  if (b == 0) return {out, ok_flag(0, s)};
  const at::Tensor w = weights.has_value() ? weights->contiguous() : at::Tensor();
  int64_t bad = 0;
  AT_DISPATCH_FLOATING_TYPES(s.scalar_type(), "group_advantages_sum_cpu", [&] {
    using A = acc_t<scalar_t>;
    const scalar_t* wp = w.defined() ? w.const_data_ptr<scalar_t>() : nullptr;
    scalar_t* o = out.mutable_data_ptr<scalar_t>();
    if (!group_ids.has_value()) {
      bad = group_sum_rows<scalar_t, int64_t>(s.const_data_ptr<scalar_t>(), wp, nullptr, o, b, s.size(1),
                                              group_size, md, A(eps), renormalize);
    } else {
      const at::Tensor ids = group_ids->contiguous();
      AT_DISPATCH_INDEX_TYPES(ids.scalar_type(), "group_advantages_sum_cpu_ids", [&] {
        bad = group_sum_rows(s.const_data_ptr<scalar_t>(), wp, ids.const_data_ptr<index_t>(), o, b, s.size(1), 0,
                             md, A(eps), renormalize);
      });
    }
  });
  return {out, ok_flag(bad, s)};
}

// One row of the tokens without whitening, o = a * m (vectorized: the loop carries no running sum); returns
// how many mask values the op rejects.
template <typename T, typename M>
RLK_CPU_MULTIVERSION int64_t broadcast_row(acc_t<T> a, const M* __restrict__ m, T* __restrict__ o, int64_t t) {
  using A = acc_t<T>;
  int64_t bad = 0;
  for (int64_t j = 0; j < t; ++j) {
    bad += mask_value_bad<A>(m[j]);
    o[j] = T(a * mask_weight<A>(m[j]));
  }
  return bad;
}

// The tokens [B, T] = adv[b] * m[b, t] (whiten: verl's masked_whiten of them, weighted by m, times m), rows in
// parallel; returns how many mask values the op rejects.
template <typename T, typename M>
int64_t advantage_tokens_rows(const T* adv, const M* m, T* out, int64_t rows, int64_t t, bool whiten) {
  using A = acc_t<T>;
  std::atomic<int64_t> bad{0};
  std::vector<Moments<A>> moments(whiten ? rows : 0);
  const int64_t grain = std::max<int64_t>(1, kGrain / std::max<int64_t>(t, 1));
  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    int64_t task_bad = 0;
    for (int64_t row = begin; row < end; ++row) {
      const A a = A(adv[row]);
      const M* mr = m + row * t;
      T* o = out + row * t;
      if (!whiten) {
        task_bad += broadcast_row<T>(a, mr, o, t);
        continue;
      }
      A w = 0, s = 0;
      for (int64_t j = 0; j < t; ++j) {
        const A mj = mask_weight<A>(mr[j]);
        task_bad += mask_value_bad<A>(mr[j]);
        o[j] = T(a * mj);
        w += mj;
        s += mj * (a * mj);
      }
      const A mean = w > A(0) ? s / w : A(0);
      A m2 = 0;
      for (int64_t j = 0; j < t; ++j) {
        const A mj = mask_weight<A>(mr[j]);
        const A d = a * mj - mean;
        m2 += mj * d * d;
      }
      moments[row] = {w, mean, m2};
    }
    bad += task_bad;
  });
  if (whiten) {  // the rows' moments merged in row order, then (x - mean) * rstd * m
    A w = 0, s = 0;
    for (const auto& r : moments) {
      w += r.w;
      s += r.w * r.mean;
    }
    const A mean = w > A(0) ? s / w : A(0);
    A m2 = 0;
    for (const auto& r : moments) m2 += r.m2 + r.w * (r.mean - mean) * (r.mean - mean);
    A out_mean, rstd;
    whiten_coefficients(w, mean, m2, out_mean, rstd);
    at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
      for (int64_t row = begin; row < end; ++row) {
        const A a = A(adv[row]);
        for (int64_t j = 0; j < t; ++j) {
          const A mj = mask_weight<A>(m[row * t + j]);
          out[row * t + j] = T((a * mj - out_mean) * rstd * mj);
        }
      }
    });
  }
  return bad.load();
}

// The tokens of advantage_tokens (and, whitened, of whitened_group_tokens).
std::tuple<at::Tensor, at::Tensor> tokens_cpu(const at::Tensor& adv, const at::Tensor& mask, const at::Tensor& ok,
                                              bool whiten) {
  check_token_inputs(adv, mask, ok);
  const at::Tensor a = adv.contiguous(), m = mask.contiguous();
  at::Tensor out = at::empty(m.sizes(), a.options());
  int64_t bad = 0;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a.scalar_type(), "advantage_tokens_cpu", [&] {
    with_mask<acc_t<scalar_t>>(m, [&](auto mp) {
      bad = advantage_tokens_rows(a.const_data_ptr<scalar_t>(), mp, out.mutable_data_ptr<scalar_t>(), m.size(0),
                                  m.size(1), whiten);
    });
  });
  return {out, at::logical_and(ok, ok_flag(bad, a))};
}

std::tuple<at::Tensor, at::Tensor> advantage_tokens_cpu(const at::Tensor& adv, const at::Tensor& mask,
                                                        const at::Tensor& ok) {
  return tokens_cpu(adv, mask, ok, false);
}

// The group pass over the columns, then the whitened tokens (the CPU has no launches to save).
std::tuple<at::Tensor, at::Tensor> whitened_group_tokens_cpu(const at::Tensor& scores, const at::Tensor& group_ids,
                                                             const std::optional<at::Tensor>& weights,
                                                             c10::string_view mode, double eps,
                                                             const at::Tensor& mask) {
  const auto [adv, ok] = group_advantages_sum_cpu(scores, group_ids, 0, weights, mode, eps, false);
  return tokens_cpu(adv, mask, ok, true);
}

}  // namespace

TORCH_LIBRARY_IMPL(rlkernels, CPU, m) {
  m.impl("group_advantages", &group_advantages_cpu);
  m.impl("group_advantages_sum", &group_advantages_sum_cpu);
  m.impl("advantage_tokens", &advantage_tokens_cpu);
  m.impl("whitened_group_tokens", &whitened_group_tokens_cpu);
}

}  // namespace rlk
