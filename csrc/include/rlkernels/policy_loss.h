// Policy-loss math per token, shared by the CPU loops and the CUDA kernels (the executable spec is
// rlkernels/reference/policy_loss.py; the sources it follows are cited there).
//
// The kernels reduce, per row b, the masked sum S_b = Σ_t m_bt L_bt of the per-token loss
//     L = w · pg(r, A) + kl_coef · kl(logp, ref) - entropy_coef · H
// and the masked sums behind the stats; aggregation_host.h turns the row sums into the loss of each `agg`
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
  return p;
}

// The policy term of one token, its derivative in logp, and 0/1 flags for the clip stats.
template <typename T>
struct PGToken {
  T loss, dlogp;
  T clipped, low, high, dual;
};

// DPPO-Binary's token filter (dppo_tv / dppo_kl): 1 where the divergence between p = e^logp and
// p_old = e^old_logp stays within the threshold of the side A pushes p to, else 0.
template <typename T>
RLK_HOST_DEVICE T dppo_kept(bool binary_kl, T logp, T old_logp, T adv, const PGParams<T>& p) {
  const T prob = exp_(logp), old_prob = exp_(old_logp);
  bool rise_ok, fall_ok;
  if (binary_kl) {
    const T eps = T(1e-8);
    const T kl = old_prob * (old_logp - logp) +
                 (T(1) - old_prob) * log_((T(1) - old_prob + eps) / (T(1) - prob + eps));
    rise_ok = (kl <= p.delta_high) | (prob <= old_prob);
    fall_ok = (kl <= p.delta_low) | (prob >= old_prob);
  } else {
    rise_ok = prob - old_prob <= p.delta_high;
    fall_ok = prob - old_prob >= -p.delta_low;
  }
  return one_if<T>(adv > T(0) ? rise_ok : fall_ok);
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
    default: {  // DppoTv, DppoKl: -A·sg(min(r, c))·logp on the kept tokens, exact 0 on the others
      const T kept = dppo_kept(objective == PGObjective::DppoKl, logp, old_logp, adv, p);
      const T truncated = r < p.ratio_cap ? r : p.ratio_cap;
      out.loss = kept > T(0) ? -adv * truncated * logp : T(0);
      out.dlogp = kept > T(0) ? -adv * truncated : T(0);
      out.clipped = T(1) - kept;
      out.low = adv > T(0) ? T(0) : T(1) - kept;
      out.high = adv > T(0) ? T(1) - kept : T(0);
      out.dual = kept > T(0) ? one_if<T>(r > p.ratio_cap) : T(0);
      break;
    }
  }
  return out;
}

}  // namespace rlk
