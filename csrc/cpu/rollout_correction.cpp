// rollout_correction's one pass over the tokens on CPU, the twin of rlkernels/triton/rollout_correction.py
// (formulas: rlkernels/reference/rollout_correction.py). Per row: the token weights (level "token"), the
// token rejection mask (token_* rejection) and the row sums named by rlkernels.triton.rollout_correction.STATS,
// from one read of logp_old, logp_rollout and the mask. Rows run in parallel; within a row, kLanes
// independent partial sums let the token loop vectorize without reassociating a sum.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/logical_and.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "rlkernels/common.h"
#include "rlkernels/rollout_correction_host.h"

namespace rlk {
namespace {

// Lanes of the row sums: one AVX-512 register of fp32.
constexpr int kLanes = 16;
// Tokens per parallel task: below it a second thread costs more than it saves once 1 parallel region in 100
// waits out a busy neighbor's scheduler tick (benchmarks/parallel_grain.py, results/parallel_grain.md).
constexpr int64_t kTaskTokens = 65536;
// Tokens per block of a row: three scratch arrays (6 KiB of fp32) that stay in L1 between the block's passes.
constexpr int64_t kBlock = 512;

// Lane partial sums of one row (kLanes each, summed in a fixed order at the end: deterministic).
template <typename A>
struct RowLanes {
  A v[kNumStats][kLanes];
};

// d = old − roll on the valid tokens (NaN → 0, ±inf → ±finite_max as torch.nan_to_num), 0 elsewhere; m = 1
// on the valid tokens, 0 elsewhere.
template <typename T, typename A>
RLK_CPU_MULTIVERSION void log_ratio_span(const T* __restrict__ old, const T* __restrict__ roll,
                                         const bool* __restrict__ valid, A big, A* __restrict__ d,
                                         A* __restrict__ m, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    A x = A(old[i]) - A(roll[i]);
    x = x != x ? A(0) : x;
    x = x > big ? big : (x < -big ? -big : x);
    const bool v = valid[i];
    d[i] = v ? x : A(0);
    m[i] = v ? A(1) : A(0);
  }
}

template <typename A>
RLK_CPU_MULTIVERSION void exp_span(const A* __restrict__ x, A* __restrict__ y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = exp_(x[i]);
}

// The divergence sums (count, Σd, Σ e^d − d − 1, Σ|d|, max|d|) of a block into the lanes.
template <typename A>
RLK_CPU_MULTIVERSION void divergence_span(const A* __restrict__ d, const A* __restrict__ e,
                                          const A* __restrict__ m, int64_t n, RowLanes<A>& acc) {
  A c[kLanes], sd[kLanes], k3[kLanes], sa[kLanes], mx[kLanes];
  for (int l = 0; l < kLanes; ++l) {
    c[l] = acc.v[kCount][l], sd[l] = acc.v[kSumD][l], k3[l] = acc.v[kSumK3][l];
    sa[l] = acc.v[kSumAbs][l], mx[l] = acc.v[kMaxAbs][l];
  }
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) {
      const A x = d[i + l], ax = x < 0 ? -x : x, v = m[i + l];
      c[l] += v;
      sd[l] += x;
      k3[l] += v * (e[i + l] - x - A(1));
      sa[l] += ax;
      mx[l] = ax > mx[l] ? ax : mx[l];
    }
  }
  for (; i < n; ++i) {
    const A x = d[i], ax = x < 0 ? -x : x, v = m[i];
    c[0] += v, sd[0] += x, k3[0] += v * (e[i] - x - A(1)), sa[0] += ax;
    mx[0] = ax > mx[0] ? ax : mx[0];
  }
  for (int l = 0; l < kLanes; ++l) {
    acc.v[kCount][l] = c[l], acc.v[kSumD][l] = sd[l], acc.v[kSumK3][l] = k3[l];
    acc.v[kSumAbs][l] = sa[l], acc.v[kMaxAbs][l] = mx[l];
  }
}

// The token weights of a block (TIS clamp, or MIS / IcePop zeroing) and their sums into the lanes.
template <typename A, bool kMaskMode>
RLK_CPU_MULTIVERSION void weight_span(const A* __restrict__ e, const A* __restrict__ m, int64_t n,
                                      const RolloutBounds<A> b, A* __restrict__ w, RowLanes<A>& acc) {
  const A inf = std::numeric_limits<A>::infinity();
  A sw[kLanes], mn[kLanes], mxw[kLanes], hi[kLanes], lo[kLanes], oob[kLanes];
  for (int l = 0; l < kLanes; ++l) {
    sw[l] = acc.v[kSumW][l], mn[l] = acc.v[kMinW][l], mxw[l] = acc.v[kMaxW][l];
    hi[l] = acc.v[kHigh][l], lo[l] = acc.v[kLow][l], oob[l] = acc.v[kOob][l];
  }
  auto one = [&](int64_t i, int l) {
    const A x = e[i], v = m[i];
    const A rho = x < b.rho_min ? b.rho_min : (x > b.rho_max ? b.rho_max : x);
    const bool low = rho < b.clip_min, high = rho > b.clip_max, in = v != A(0);
    A wt = kMaskMode ? (low || high ? A(0) : rho) : (low ? b.clip_min : (high ? b.clip_max : rho));
    wt = in ? wt : A(0);
    w[i] = wt;
    sw[l] += wt;
    const A for_min = in ? wt : inf, for_max = in ? wt : -inf;
    mn[l] = for_min < mn[l] ? for_min : mn[l];
    mxw[l] = for_max > mxw[l] ? for_max : mxw[l];
    hi[l] += in && high ? A(1) : A(0);
    lo[l] += in && rho < b.low_bound ? A(1) : A(0);
    oob[l] += in && (low || high) ? A(1) : A(0);
  };
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) one(i + l, l);
  }
  for (; i < n; ++i) one(i, 0);
  for (int l = 0; l < kLanes; ++l) {
    acc.v[kSumW][l] = sw[l], acc.v[kMinW][l] = mn[l], acc.v[kMaxW][l] = mxw[l];
    acc.v[kHigh][l] = hi[l], acc.v[kLow][l] = lo[l], acc.v[kOob][l] = oob[l];
  }
}

// The rejection statistic of a block (k1 = −l, k2 = l²/2, k3 = e^l − 1 − l of l = clamp(d)): token keep and
// rejected count, or its row sum / max, into the lanes.
template <typename A, int kKind, int kAgg>
RLK_CPU_MULTIVERSION void rejection_span(const A* __restrict__ d, const A* __restrict__ m, int64_t n,
                                         const RolloutBounds<A> b, bool* __restrict__ keep, RowLanes<A>& acc) {
  const A inf = std::numeric_limits<A>::infinity();
  A r[kLanes];
  for (int l = 0; l < kLanes; ++l) r[l] = acc.v[kRejection][l];
  auto one = [&](int64_t i, int l) {
    const A x = d[i], lr = x < -b.clamp ? -b.clamp : (x > b.clamp ? b.clamp : x);
    const bool in = m[i] != A(0);
    const A stat = kKind == 1 ? -lr : (kKind == 2 ? A(0.5) * lr * lr : exp_(lr) - A(1) - lr);
    if (kAgg == kTokenAgg) {
      const bool ok = stat >= b.rej_low && stat <= b.rej_high;
      keep[i] = in && ok;
      r[l] += in && !ok ? A(1) : A(0);
    } else if (kAgg == kSumAgg) {
      r[l] += in ? stat : A(0);
    } else {
      const A s = in ? stat : -inf;
      r[l] = s > r[l] ? s : r[l];
    }
  };
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) one(i + l, l);
  }
  for (; i < n; ++i) one(i, 0);
  for (int l = 0; l < kLanes; ++l) acc.v[kRejection][l] = r[l];
}

// One row: the block passes above over an L1 scratch, then the lanes reduced in a fixed order.
template <typename T, typename A, bool kWeights, bool kMaskMode, int kKind, int kAgg>
void row_pass(const T* old, const T* roll, const bool* valid, int64_t n, const RolloutBounds<A> b, A* w, bool* keep,
              A (&out)[kNumStats]) {
  const A inf = std::numeric_limits<A>::infinity();
  RowLanes<A> acc;
  for (int s = 0; s < kNumStats; ++s) {
    const A init = s == kMinW ? inf : (s == kMaxW || (s == kRejection && kAgg == kMaxAgg) ? -inf : A(0));
    for (int l = 0; l < kLanes; ++l) acc.v[s][l] = init;
  }
  A d[kBlock], e[kBlock], m[kBlock];
  for (int64_t j = 0; j < n; j += kBlock) {
    const int64_t nb = std::min(kBlock, n - j);
    log_ratio_span<T, A>(old + j, roll + j, valid + j, b.finite_max, d, m, nb);
    exp_span<A>(d, e, nb);
    divergence_span<A>(d, e, m, nb, acc);
    if (kWeights) weight_span<A, kMaskMode>(e, m, nb, b, w + j, acc);
    if (kAgg != kNoRejection) rejection_span<A, kKind, kAgg>(d, m, nb, b, kAgg == kTokenAgg ? keep + j : nullptr, acc);
  }
  for (int s = 0; s < kNumStats; ++s) {
    const bool is_min = s == kMinW, is_max = s == kMaxAbs || s == kMaxW || (s == kRejection && kAgg == kMaxAgg);
    A r = acc.v[s][0];
    for (int l = 1; l < kLanes; ++l) {
      const A x = acc.v[s][l];
      r = is_min ? (x < r ? x : r) : (is_max ? (x > r ? x : r) : r + x);
    }
    out[s] = r;
  }
}

// f(integral_constant<kind>, integral_constant<agg>) for the rejection option (kind 1..3 = k1..k3).
template <typename F>
void dispatch_rejection(int kind, int agg, F&& f) {
  using std::integral_constant;
  dispatch_agg(agg, [&](auto kAgg) {
    if constexpr (kAgg.value == kNoRejection) {
      f(integral_constant<int, 0>{}, kAgg);
    } else if (kind == 1) {
      f(integral_constant<int, 1>{}, kAgg);
    } else if (kind == 2) {
      f(integral_constant<int, 2>{}, kAgg);
    } else {
      f(integral_constant<int, 3>{}, kAgg);
    }
  });
}

// The mask's nonzero entries as bool, and how many of its values the op rejects (an integer other than 0 and
// 1, a negative or non-finite weight).
template <typename M>
int64_t mask_to_valid(const M* m, bool* valid, int64_t rows, int64_t t, int64_t ld) {
  int64_t bad = 0;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < t; ++j) {
      const M x = m[r * ld + j];
      valid[r * t + j] = x != M(0);
      if constexpr (std::is_same_v<M, int64_t>) {
        bad += x != 0 && x != 1;
      } else if constexpr (!std::is_same_v<M, bool>) {
        bad += !(x >= M(0) && x < std::numeric_limits<M>::infinity());
      }
    }
  }
  return bad;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> rollout_correction_cpu(
    const at::Tensor& logp_old, const at::Tensor& logp_rollout, const at::Tensor& mask, int64_t level,
    bool mask_mode, double clamp, double clip_min, double clip_max, double low_bound,
    std::optional<c10::string_view> rejection, double rej_low, double rej_high, bool batch_normalize,
    double log_upper, double log_low) {
  check_rollout_inputs(logp_old, logp_rollout, mask, level);
  const Rejection rej = parse_rejection(rejection);
  const int64_t B = logp_old.size(0), T = logp_old.size(1);
  const at::ScalarType acc = acc_scalar_type(logp_old.scalar_type());
  const RolloutFinish<double> finish = rollout_finish(level, mask_mode, clamp, clip_min, clip_max, low_bound, rej,
                                                      rej_low, rej_high, batch_normalize, log_upper, log_low);
  const at::Tensor old = logp_old.contiguous(), roll = logp_rollout.contiguous();
  auto [w, out_mask, metrics, ok] = rollout_outputs(logp_old, mask, level, rej.agg);
  // The valid tokens: a contiguous bool mask as it is, else its nonzero entries (its values checked).
  at::Tensor valid = mask;
  int64_t bad = 0;
  if (mask.scalar_type() != at::kBool || !mask.is_contiguous()) {
    valid = at::empty({B, T}, mask.options().dtype(at::kBool));
    bool* vp = valid.mutable_data_ptr<bool>();
    const int64_t ld = mask.stride(0);
    switch (mask.scalar_type()) {
      case at::kBool:
        bad = mask_to_valid(mask.const_data_ptr<bool>(), vp, B, T, ld);
        break;
      case at::kLong:
        bad = mask_to_valid(mask.const_data_ptr<int64_t>(), vp, B, T, ld);
        break;
      case at::kFloat:
        bad = mask_to_valid(mask.const_data_ptr<float>(), vp, B, T, ld);
        break;
      default:
        bad = mask_to_valid(mask.const_data_ptr<double>(), vp, B, T, ld);
    }
  }
  ok.fill_(bad == 0);
  at::Tensor keep = at::empty({rej.agg == kTokenAgg ? B * T : 0}, mask.options().dtype(at::kBool));
  at::Tensor stats = at::empty({B, kNumStats}, logp_old.options().dtype(acc));
  std::vector<uint8_t> keep_row(B, 1);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, old.scalar_type(), "rollout_correction_cpu", [&] {
    using T_ = scalar_t;
    AT_DISPATCH_FLOATING_TYPES(acc, "rollout_correction_acc", [&] {
      using A = scalar_t;
      const RolloutFinish<A> f = finish.to<A>();
      const T_* o = old.const_data_ptr<T_>();
      const T_* r = roll.const_data_ptr<T_>();
      const bool* vp = valid.const_data_ptr<bool>();
      A* wp = level == kTokenLevel ? w.mutable_data_ptr<A>() : nullptr;
      bool* kp = rej.agg == kTokenAgg ? keep.mutable_data_ptr<bool>() : nullptr;
      A* sp = stats.mutable_data_ptr<A>();
      dispatch_bool(level == kTokenLevel, [&](auto kWeights) {
        dispatch_bool(mask_mode, [&](auto kMaskMode) {
          dispatch_rejection(rej.kind, rej.agg, [&](auto kKind, auto kAgg) {
            const int64_t grain = std::max<int64_t>(1, kTaskTokens / std::max<int64_t>(T, 1));
            at::parallel_for(0, B, grain, [&](int64_t lo, int64_t hi) {
              for (int64_t row = lo; row < hi; ++row) {
                A out[kNumStats];
                row_pass<T_, A, kWeights.value, kMaskMode.value, kKind.value, kAgg.value>(
                    o + row * T, r + row * T, vp + row * T, T, f.b, wp ? wp + row * T : nullptr,
                    kp ? kp + row * T : nullptr, out);
                for (int s = 0; s < kNumStats; ++s) sp[row * kNumStats + s] = out[s];
              }
            });
          });
        });
      });
      // The batch: every row's sums in row order (rollout_correction.h), then the rows' weights and rejection.
      A t[kNumTotals], x[kNumExtremes];
      rollout_totals_init(t, x);
      for (int64_t row = 0; row < B; ++row) add_rollout_row(sp + row * kNumStats, f, t, x);
      A* mp = metrics.mutable_data_ptr<A>();
      const A factor = rollout_metrics(t, x, B, f, mp);
      for (int64_t row = 0; row < B; ++row) {
        const A* rs = sp + row * kNumStats;
        if (level == kSequenceLevel) {
          w.mutable_data_ptr<A>()[row] = sequence_weight(rs[kSumD], rs[kCount], f) / factor;
        }
        if (rej.agg == kSumAgg || rej.agg == kMaxAgg) keep_row[row] = row_kept(rs[kRejection], rs[kCount], f);
      }
      if (level == kTokenLevel && factor != A(1)) {
        at::parallel_for(0, B * T, kTaskTokens, [&](int64_t lo, int64_t hi) {
          for (int64_t i = lo; i < hi; ++i) wp[i] /= factor;
        });
      }
    });
  });
  if (rej.agg == kTokenAgg) {
    const at::Tensor kept = keep.view({B, T});
    out_mask.copy_(mask.scalar_type() == at::kBool ? kept : mask.mul(kept.to(mask.scalar_type())));
  } else if (rej.agg != kNoRejection) {
    at::Tensor rows = at::empty({B, 1}, mask.options().dtype(at::kBool));
    for (int64_t row = 0; row < B; ++row) rows.mutable_data_ptr<bool>()[row] = keep_row[row] != 0;
    out_mask.copy_(mask.scalar_type() == at::kBool ? mask.logical_and(rows) : mask.mul(rows.to(mask.scalar_type())));
  }
  return {w, out_mask, metrics, ok};
}

}  // namespace

TORCH_LIBRARY_IMPL(rlkernels, CPU, m) { m.impl("rollout_correction", &rollout_correction_cpu); }

}  // namespace rlk
