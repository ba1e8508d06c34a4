// Policy-loss math per token, shared by the CPU loops and the CUDA kernels (the executable spec is
// rlkernels/reference/policy_loss.py; the sources it follows are cited there).
//
// The kernels reduce, per row b, the masked sum S_b = Σ_t m_bt L_bt of the per-token loss
//     L = w · pg(r, A) + kl_coef · kl(logp, ref) - entropy_coef · H
// and the masked sums behind the stats; aggregation.h turns the row sums into the loss of each `agg`
// mode (spec: rlkernels/reference/aggregation.py). The backward pass needs d L / d logp per token, computed
// here too.
#pragma once

#include "rlkernels/common.h"
#include "rlkernels/kl.h"
#include "rlkernels/policy_config.h"
#include "rlkernels/select.h"

namespace rlk {

// log(r) is clamped to [-20, 20] before exp (verl), so r stays finite and positive.
template <typename T>
RLK_HOST_DEVICE T log_ratio_bound() {
  return T(20);
}

// VESPO's lower bound of its sequence log-weight and of each folded log IS weight (TRL: ln 1e-8), and its
// smallest rate λ (TRL clamps it at 1e-4).
template <typename T>
RLK_HOST_DEVICE T vespo_log_w_min() {
  return T(-18.420680743952367);  // ln 1e-8
}
constexpr double kVespoLambdaMin = 1e-4;

// Hyper-parameters of the policy term. Disabled options are +inf (dual_c: the dual clip never binds;
// ratio_cap: min(r, inf) = r).
template <typename T>
struct PGParams {
  T lo, hi;       // ratio clip bounds 1 - clip_low, 1 + clip_high
  T delta_low, delta_high;  // clip_low, clip_high as DPPO's divergence thresholds
  T dual_c;       // dual-clip constant c > 1
  T ratio_cap;    // cap of the unclipped ratio (TRL delta; DPPO's truncation c)
  T tau_pos, tau_neg;  // SAPO gate temperatures for A > 0 and A <= 0
  T dro_beta;     // DRO's quadratic log-ratio penalty
  T vespo_k_pos, vespo_lambda_pos, vespo_k_neg, vespo_lambda_neg;  // VESPO's gamma weights (λ >= 1e-4)
};

// The policy term's parameters from the op's options (host code: the CPU kernels, the CUDA launchers).
template <typename T>
PGParams<T> pg_params(const PolicyLossConfig& c) {
  PGParams<T> p;
  p.lo = T(1.0 - c.clip_low);
  p.hi = T(1.0 + c.clip_high);
  p.delta_low = T(c.clip_low);
  p.delta_high = T(c.clip_high);
  p.dual_c = value_or_inf<T>(c.dual_clip);
  p.ratio_cap = value_or_inf<T>(c.ratio_cap);
  p.tau_pos = T(c.tau_pos);
  p.tau_neg = T(c.tau_neg);
  p.dro_beta = T(c.dro_beta);
  p.vespo_k_pos = T(c.vespo_k_pos);
  p.vespo_lambda_pos = T(c.vespo_lambda_pos < kVespoLambdaMin ? kVespoLambdaMin : c.vespo_lambda_pos);
  p.vespo_k_neg = T(c.vespo_k_neg);
  p.vespo_lambda_neg = T(c.vespo_lambda_neg < kVespoLambdaMin ? kVespoLambdaMin : c.vespo_lambda_neg);
  return p;
}

// The policy term of one token, its derivative in logp, and 0/1 flags for the clip stats.
template <typename T>
struct PGToken {
  T loss, dlogp;
  T clipped, low, high, dual;
};

// ---- the per-row ratio of seq_level (GSPO, geo_mean, vespo): a row statistic of per-token terms ----

// Token's term of its row's log-ratio statistic: lr = logp - old_logp (GSPO), geo_mean's lr clipped toward
// the side A pushes it, vespo's ±20-clamped lr plus ln of its IS weight clamped to [ln 1e-8, 20] (log_isw:
// ln w, or 0 without weights; the callers pass it for vespo only).
template <typename T>
RLK_HOST_DEVICE T sequence_token_log_ratio(PGObjective objective, T logp, T old_logp, T adv, T log_isw,
                                           const PGParams<T>& p) {
  const T raw = logp - old_logp;
  const T bound = log_ratio_bound<T>();
  if (objective == PGObjective::GeoMean) {
    const T lrc = clamp_value(raw, -p.delta_low, p.delta_high);
    return adv > T(0) ? (raw < lrc ? raw : lrc) : (adv < T(0) ? (raw > lrc ? raw : lrc) : T(0));
  }
  if (objective == PGObjective::Vespo) {
    return clamp_value(raw, -bound, bound) + clamp_value(log_isw, vespo_log_w_min<T>(), bound);
  }
  return raw;
}

// Whether the row statistic is the masked mean of the token terms (GSPO, geo_mean) or their sum (vespo).
RLK_HOST_DEVICE bool sequence_statistic_is_mean(PGObjective objective) {
  return objective != PGObjective::Vespo;
}

// The row's clamped log-ratio from its statistic, and whether the clamp passes the gradient (1) or not (0).
template <typename T>
RLK_HOST_DEVICE void sequence_log_ratio(PGObjective objective, T stat, T& lr, T& pass) {
  const T hi = log_ratio_bound<T>();
  const T lo = objective == PGObjective::Vespo ? vespo_log_w_min<T>() : -hi;
  lr = clamp_value(stat, lo, hi);
  pass = T(clamp_passes(stat, lo, hi));
}

// DPPO-Binary's token filter (dppo_tv / dppo_kl) as a margin that is >= 0 exactly where a token is kept:
// the divergence between p = e^logp and p_old = e^old_logp stays within the threshold of the side A pushes
// p to (δ_high - (p - p_old) for a rise, ...), or (kl) p moved the other way. A margin compared once, not
// combined bools: the CPU token loops vectorize (select.h). A NaN binary KL never wins the max, so a token
// whose p moved the other way is kept, as verl's `kl <= δ | p <= p_old`.
template <bool BINARY_KL, typename T>
RLK_HOST_DEVICE T dppo_margin(T logp, T old_logp, T adv, const PGParams<T>& p) {
  const T prob = exp_(logp), old_prob = exp_(old_logp);
  const T rise = prob - old_prob;
  if constexpr (BINARY_KL) {
    const T eps = T(1e-8);
    const T kl = old_prob * (old_logp - logp) +
                 (T(1) - old_prob) * vlog_((T(1) - old_prob + eps) / (T(1) - prob + eps));
    const T up = p.delta_high - kl, down = p.delta_low - kl;
    const T rise_margin = up > -rise ? up : -rise;
    const T fall_margin = down > rise ? down : rise;
    return adv > T(0) ? rise_margin : fall_margin;
  } else {
    return adv > T(0) ? p.delta_high - rise : rise + p.delta_low;
  }
}

// DPPO's term from its filter margin: -A·sg(min(r, c))·logp on the kept tokens, exact 0 on the others.
template <typename T>
RLK_HOST_DEVICE void dppo_term(T margin, T logp, T r, T adv, const PGParams<T>& p, PGToken<T>& out) {
  const T truncated = r < p.ratio_cap ? r : p.ratio_cap;
  out.loss = margin >= T(0) ? -adv * truncated * logp : T(0);
  out.dlogp = margin >= T(0) ? -adv * truncated : T(0);
  out.clipped = one_if<T>(margin < T(0));
  out.low = one_if<T>((margin < T(0)) & (adv <= T(0)));
  out.high = one_if<T>((margin < T(0)) & (adv > T(0)));
  out.dual = one_if<T>((margin >= T(0)) & (r > p.ratio_cap));
}

// r = exp(clamped log-ratio); `passes` is 1 where that clamp passes the gradient, else 0.
// All branches are ternaries so that CPU loops over tokens vectorize.
template <typename T>
RLK_HOST_DEVICE PGToken<T> pg_token(PGObjective objective, T logp, T old_logp, T r, T passes, T adv,
                                    const PGParams<T>& p) {
  PGToken<T> out;
  const T in_clip = one_if<T>((r >= p.lo) & (r <= p.hi));
  const T rc = clamp_value(r, p.lo, p.hi);
  switch (objective) {
    case PGObjective::Clip: {
      // max(-A·min(r, cap), -A·clip(r)); where A < 0, min(that, -A·c). Flags as 0/1 values (select.h).
      const T r1 = r < p.ratio_cap ? r : p.ratio_cap;
      const T loss1 = -adv * r1;
      const T loss2 = -adv * rc;
      const T use2 = one_if<T>(loss2 > loss1);
      const T lc = use2 > T(0) ? loss2 : loss1;
      const T dr = use2 > T(0) ? -adv * in_clip : -adv * one_if<T>(r <= p.ratio_cap);
      const T loss3 = -adv * p.dual_c;
      const T dual = one_if<T>((adv < T(0)) & (lc > loss3));
      out.loss = dual > T(0) ? loss3 : lc;
      out.dlogp = dual > T(0) ? T(0) : dr * r * passes;
      out.clipped = use2;
      out.low = one_if<T>((r < p.lo) & (adv < T(0)));
      out.high = one_if<T>((r > p.hi) & (adv > T(0)));
      out.dual = dual;
      break;
    }
    case PGObjective::Cispo: {
      // -sg(clip(r))·A·logp: the gradient reaches logp directly, not through r.
      out.loss = -rc * adv * logp;
      out.dlogp = -rc * adv;
      out.low = one_if<T>(r < p.lo);
      out.high = one_if<T>(r > p.hi);
      out.clipped = T(1) - in_clip;
      out.dual = T(0);
      break;
    }
    case PGObjective::Sapo: {  // -A·σ(τ(r-1))·4/τ, d/dr = -A·4σ(1-σ)
      const T tau = adv > T(0) ? p.tau_pos : p.tau_neg;
      const T s = T(1) / (T(1) + exp_(-tau * (r - T(1))));
      out.loss = -adv * s * (T(4) / tau);
      out.dlogp = -adv * T(4) * s * (T(1) - s) * r * passes;
      out.clipped = out.low = out.high = out.dual = T(0);
      break;
    }
    case PGObjective::Gpg: {  // -A·logp
      out.loss = -adv * logp;
      out.dlogp = -adv;
      out.clipped = out.low = out.high = out.dual = T(0);
      break;
    }
    case PGObjective::Dro: {  // -(A·logp - β/2·(logp - old_logp)²), the log-ratio unclamped (verl)
      const T lr = logp - old_logp;
      out.loss = -adv * logp + T(0.5) * p.dro_beta * lr * lr;
      out.dlogp = -adv + p.dro_beta * lr;
      out.clipped = out.low = out.high = out.dual = T(0);
      break;
    }
    case PGObjective::GeoMean: {  // -A·R, R the row's ratio; the gradient passes where lr is not clipped
      const T raw = logp - old_logp;
      const T outside = one_if<T>((raw < -p.delta_low) | (raw > p.delta_high));
      const T token_pass = adv > T(0) ? one_if<T>(raw <= p.delta_high) : one_if<T>(raw >= -p.delta_low);
      out.loss = -adv * r;
      out.dlogp = -adv * r * passes * token_pass;
      out.low = adv < T(0) ? outside : T(0);
      out.high = adv > T(0) ? outside : T(0);
      out.clipped = out.low + out.high;
      out.dual = T(0);
      break;
    }
    case PGObjective::Vespo: {  // -sg(φ(w))·A·logp, w = r the row's weight, φ 0 where not finite
      const bool pos = adv >= T(0);
      const T k = pos ? p.vespo_k_pos : p.vespo_k_neg;
      const T lam = pos ? p.vespo_lambda_pos : p.vespo_lambda_neg;
      const T e = exp_(lam + k * vlog_(r) - lam * r);
      const T phi = (e - e == T(0)) ? e : T(0);  // e - e is NaN for inf and NaN
      out.loss = -phi * adv * logp;
      out.dlogp = -phi * adv;
      out.clipped = out.low = out.high = out.dual = T(0);
      break;
    }
    case PGObjective::DppoTv:
      dppo_term(dppo_margin<false>(logp, old_logp, adv, p), logp, r, adv, p, out);
      break;
    case PGObjective::DppoKl:
      dppo_term(dppo_margin<true>(logp, old_logp, adv, p), logp, r, adv, p, out);
      break;
  }
  return out;
}

}  // namespace rlk
