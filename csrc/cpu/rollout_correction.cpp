// rollout_correction's one pass over the tokens on CPU, the twin of rlkernels/triton/rollout_correction.py
// (formulas: rlkernels/reference/rollout_correction.py). Per row: the token weights (level "token"), the
// token rejection mask (token_* rejection) and the row sums named by rlkernels.triton.rollout_correction.STATS,
// from one read of logp_old, logp_rollout and the mask. Rows run in parallel; within a row, kLanes
// independent partial sums let the token loop vectorize without reassociating a sum.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <limits>
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

std::tuple<at::Tensor, at::Tensor, at::Tensor> rollout_correction_rows_cpu(
    const at::Tensor& logp_old, const at::Tensor& logp_rollout, const at::Tensor& valid, bool token_weights,
    bool mask_mode, double clamp, double clip_min, double clip_max, double low_bound,
    std::optional<c10::string_view> rejection, double rej_low, double rej_high) {
  check_rollout_inputs(logp_old, logp_rollout, valid);
  const auto [kind, agg] = parse_rejection(rejection);
  const int64_t B = logp_old.size(0), T = logp_old.size(1);
  const at::ScalarType acc = rollout_acc_type(logp_old);
  const RolloutBounds<double> bounds = rollout_bounds(clamp, clip_min, clip_max, low_bound, rej_low, rej_high);
  const at::Tensor old = logp_old.contiguous(), roll = logp_rollout.contiguous(), v = valid.contiguous();
  at::Tensor w, keep, stats;
  std::tie(w, keep, stats) = rollout_outputs(logp_old, token_weights, agg);
  if (B == 0) return {w, keep, stats};
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, old.scalar_type(), "rollout_correction_rows_cpu", [&] {
    using T_ = scalar_t;
    AT_DISPATCH_FLOATING_TYPES(acc, "rollout_correction_rows_acc", [&] {
      using A = scalar_t;
      const RolloutBounds<A> b = bounds.to<A>();
      const T_* o = old.const_data_ptr<T_>();
      const T_* r = roll.const_data_ptr<T_>();
      const bool* vp = v.const_data_ptr<bool>();
      A* wp = token_weights ? w.mutable_data_ptr<A>() : nullptr;
      bool* kp = agg == kTokenAgg ? keep.mutable_data_ptr<bool>() : nullptr;
      A* sp = stats.mutable_data_ptr<A>();
      dispatch_bool(token_weights, [&](auto kWeights) {
        dispatch_bool(mask_mode, [&](auto kMaskMode) {
          dispatch_rejection(kind, agg, [&](auto kKind, auto kAgg) {
            const int64_t grain = std::max<int64_t>(1, kTaskTokens / std::max<int64_t>(T, 1));
            at::parallel_for(0, B, grain, [&](int64_t lo, int64_t hi) {
              for (int64_t row = lo; row < hi; ++row) {
                A out[kNumStats];
                row_pass<T_, A, kWeights.value, kMaskMode.value, kKind.value, kAgg.value>(
                    o + row * T, r + row * T, vp + row * T, T, b, wp ? wp + row * T : nullptr,
                    kp ? kp + row * T : nullptr, out);
                for (int s = 0; s < kNumStats; ++s) sp[s * B + row] = out[s];
              }
            });
          });
        });
      });
    });
  });
  return {w, keep, stats};
}

}  // namespace

TORCH_LIBRARY_IMPL(rlkernels, CPU, m) {
  m.impl("rollout_correction_rows", &rollout_correction_rows_cpu);
}

}  // namespace rlk
