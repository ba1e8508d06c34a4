// Per-row softmax statistics, log-prob / entropy values and the per-logit gradient (docs/semantics.md), shared by
// the CPU kernels of linear_logprobs and logprobs_from_logits (and any CUDA kernel). No torch headers.
//
// z = softcap(x) / temperature with softcap(x) = c·tanh(x / c); logp = z_y − LSE(z); H = LSE(z) − Σ q·z with
// q = softmax(z). A row is reduced tile by tile: each tile gives (m, s, a) relative to its own max m,
//   s = Σ e^{z−m} (≥ 1 for a non-empty tile),  a = Σ e^{z−m}·(z − m) (≤ 0),
// and tiles merge exactly (online log-sum-exp). A −inf logit (a masked token) is q = 0: it adds nothing to
// s, a or s2, and a tile of them only is empty (m = −inf, s = 0). Then LSE = m + log s and H = log s − a / s:
// every term is bounded, so huge logits (±1e4) lose nothing to cancellation, logp ≤ 0 and H ≥ 0 hold in
// floating point.
// LSE is carried in float64 (docs/semantics.md, "The saved LSE"): m + log s rounded to fp32 loses ulp(|LSE|)/2,
// an error every log q = z − LSE of the row shares, which large logits make several times the reference's own
// error. Split into hi + lo in the compute type, (z − hi) − lo keeps those bits.
// The optional s2 = Σ e^{2(z−m)} (in [1, s] for a non-empty tile) gives Σ q² = s2 / s² (verl's sum_pi_squared),
// a forward-only statistic: kernels that are not asked for it leave s2 at 0.
#pragma once

#include "rlkernels/common.h"

namespace rlk {

template <typename T>
struct SoftmaxStats {
  T m;  // max of the logits seen (−inf when none)
  T s;  // Σ e^{z−m}
  T a;  // Σ e^{z−m}·(z − m)
  T s2;  // Σ e^{2(z−m)} (0 where Σ softmax² is not asked for)
};

template <typename T>
RLK_HOST_DEVICE SoftmaxStats<T> empty_softmax_stats() {
  return {T(-INFINITY), T(0), T(0), T(0)};
}

// Statistics of the union of two disjoint sets of logits. An empty part (s == 0, m == −inf) adds nothing;
// the guard keeps (−inf) − (−inf) out of the arithmetic.
template <typename T>
RLK_HOST_DEVICE SoftmaxStats<T> merge_softmax_stats(SoftmaxStats<T> x, SoftmaxStats<T> y) {
  const T m = x.m > y.m ? x.m : y.m;
  const T dx = x.s > T(0) ? x.m - m : T(0);
  const T dy = y.s > T(0) ? y.m - m : T(0);
  const T ex = x.s > T(0) ? exp_(dx) : T(0);
  const T ey = y.s > T(0) ? exp_(dy) : T(0);
  return {m, ex * x.s + ey * y.s, ex * (x.a + dx * x.s) + ey * (y.a + dy * y.s), ex * ex * x.s2 + ey * ey * y.s2};
}

// The reference a tile's exponentials are taken against: its max m, or 0 when m = −inf (a tile of −inf logits
// only), whose every z − 0 is then −inf, e^{z} = 0 and the tile empty, where z − m would be NaN.
template <typename T>
RLK_HOST_DEVICE T exp_reference(T m) {
  return m == T(-INFINITY) ? T(0) : m;
}

// e^{d}·d, the entropy sum's term, for d = z − m ≤ 0: 0 at d = −inf (a masked token), its limit, not NaN.
template <typename T>
RLK_HOST_DEVICE T entropy_term(T e, T d) {
  return d == T(-INFINITY) ? T(0) : e * d;
}

// LSE = m + log s in float64 (exact for fp32 m and log s).
template <typename T>
RLK_HOST_DEVICE double softmax_lse(SoftmaxStats<T> st) {
  return double(st.m) + double(log_(st.s));
}

// A row's float64 LSE as hi + lo in the compute type T (lo = 0 for T = double, and where LSE is ±inf).
template <typename T>
struct RowLse {
  T hi, lo;
};

template <typename T>
RLK_HOST_DEVICE RowLse<T> split_lse(double lse) {
  const T hi = T(lse);
  return {hi, double(hi) == lse ? T(0) : T(lse - double(hi))};
}

// log q = z − LSE, in T, from the split LSE.
template <typename T>
RLK_HOST_DEVICE T log_softmax_value(T z, RowLse<T> lse) {
  return (z - lse.hi) - lse.lo;
}

template <typename T>
RLK_HOST_DEVICE T softmax_entropy(SoftmaxStats<T> st) {
  return log_(st.s) - st.a / st.s;
}

// Σ_v softmax(z)_v² = e^{LSE(2z) − 2·LSE(z)} = s2 / s², in (0, 1] (1 ≤ s2 ≤ s² for a non-empty row).
template <typename T>
RLK_HOST_DEVICE T softmax_sum_sq(SoftmaxStats<T> st) {
  return st.s2 / (st.s * st.s);
}

// logp = z_y − LSE, never above 0 (z_y ≤ max ≤ LSE holds exactly; this guards a rounding of z_y). NaN stays.
template <typename T>
RLK_HOST_DEVICE T logprob_value(T z_target, RowLse<T> lse) {
  const T v = log_softmax_value(z_target, lse);
  return v > T(0) ? T(0) : v;
}

// Scalars of the logit transform z = softcap(x) / temperature, precomputed once per call (softcap <= 0: none).
template <typename T>
struct LogitTransform {
  T cap = T(1), inv_cap = T(1), inv_temp = T(1), temp_over_cap = T(0);

  LogitTransform() = default;
  RLK_HOST_DEVICE LogitTransform(double temperature, double softcap) {
    inv_temp = T(1.0 / temperature);
    if (softcap > 0) {
      cap = T(softcap);
      inv_cap = T(1.0 / softcap);
      temp_over_cap = T(temperature / softcap);
    }
  }
};

// The logit transform and its derivative. inv_cap = 1 / c, inv_temp = 1 / temperature.
template <typename T, bool kSoftcap>
RLK_HOST_DEVICE T transform_logit(T x, T cap, T inv_cap, T inv_temp) {
  if (kSoftcap) x = cap * tanh_(x * inv_cap);
  return x * inv_temp;
}

// z rounded as the forward stored it (csrc/cpu: the forward's statistics read z from a scratch). Where the
// backward recomputes z = x / τ in registers, z − LSE would be fused into fma(x, 1/τ, −LSE) (AVX2 / AVX-512,
// aarch64) and miss the forward's rounding of z by up to ulp(z)/2 in every log q; the product then goes into
// fma(x, 1/τ, 0) instead, which rounds it exactly as a store. (No -ffast-math: + 0 is never folded away.)
template <typename T>
RLK_HOST_DEVICE T as_stored(T z) {
  return z + T(0);
}

// dz/dx written in terms of the output z: (1 − tanh²(x / c)) / temperature, with tanh(x / c) = z·temperature / c.
template <typename T, bool kSoftcap>
RLK_HOST_DEVICE T transform_grad(T z, T temp_over_cap, T inv_temp) {
  if (!kSoftcap) return inv_temp;
  const T t = z * temp_over_cap;
  return (T(1) - t * t) * inv_temp;
}

// d(g_logp·logp + g_ent·H)/dz_j for a logit that is not the target (the target adds g_logp):
// −q_j·(g_logp + g_ent·(log q_j + H)), since d logp/dz_j = [j = y] − q_j and dH/dz_j = −q_j·(log q_j + H)
// (kEntropy; else −q_j·g_logp). A −inf logit (a masked token) gives 0, the limit: its log q_j = −inf is
// taken as −1e4 in the entropy's factor, where q_j = 0 already (exactly, in fp32 and fp64), not 0·(−inf).
// One max a logit (a select cost the CPU backward's loop twice that); NaN goes on.
template <typename T, bool kEntropy>
RLK_HOST_DEVICE T softmax_logit_grad(T z, RowLse<T> lse, T entropy, T g_logp, T g_ent) {
  const T log_q = log_softmax_value(z, lse);
  if (!kEntropy) return -exp_(log_q) * g_logp;
  const T floored = log_q < T(-1e4) ? T(-1e4) : log_q;
  return -exp_(log_q) * (g_logp + g_ent * (floored + entropy));
}

}  // namespace rlk
