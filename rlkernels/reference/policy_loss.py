"""Policy losses of PPO / GRPO and their variants, in eager PyTorch (the spec of rk.policy_loss).

Sources followed, pinned to verl 0.9.1 (tests/test_verl.py runs the installed verl's vanilla, gspo, sapo and
cispo against these) and TRL f2cd577 (the TRL mapping's hand-written formulas, tests/test_trl_mapping.py):
- clip: verl `compute_policy_loss_vanilla`: log-ratio clamped to [-20, 20],
  L = max(-A·r, -A·clip(r, 1-clip_low, 1+clip_high)), dual clip min(L, -A·c) where A < 0;
  `ratio_cap` is TRL's `delta` (grpo_trainer.py at TRL f2cd577): the unclipped ratio is min(r, δ).
- level="sequence": GSPO as verl `compute_policy_loss_gspo`: the masked mean log-ratio of the row,
  straight-through per token (value of the row's ratio, gradient of each token's logp). The bound is the
  token level's ±20 (verl clamps the sequence log-ratio at 10 from above only).
- cispo: verl `compute_policy_loss_cispo`: L = -sg(clip(r, 1-clip_low, 1+clip_high))·A·logp. TRL/Liger
  cap the ratio at an absolute `epsilon_high` with no lower bound: clip_low=1, clip_high=epsilon_high-1.
- sapo: TRL / Liger `sapo_loss_fn` / verl `compute_policy_loss_sapo`:
  L = -A·σ(τ(r-1))·4/τ with τ = tau_pos where A > 0, else tau_neg.
- gpg: verl `compute_policy_loss_gpg`: L = -A·logp (no ratio). verl's "reinforce" (bypass mode,
  `compute_policy_loss_reinforce`) is the same term, its IS weights given as is_weights.
- dro: verl `compute_policy_loss_dro`: L = -(A·logp - ½β·(logp - old_logp)²), the log-ratio not clamped.
- dppo_tv / dppo_kl: verl `compute_policy_loss_dppo_tv` / `_dppo_kl` (DPPO-Binary): L = -A·sg(min(r, c))·logp
  on the tokens a divergence test keeps, 0 elsewhere; c = ratio_cap (verl's clip_ratio_c; None: no
  truncation); clip_low / clip_high are the divergence thresholds δ_low / δ_high, not ratio ranges. With
  p = e^logp, p_old = e^old_logp, a token is kept where A > 0 and the divergence of a rise stays within
  δ_high, or A <= 0 and that of a fall within δ_low: tv: p - p_old <= δ_high / p - p_old >= -δ_low;
  kl: the binary KL p_old·log(p_old/p) + (1-p_old)·log((1-p_old+1e-8)/(1-p+1e-8)) <= δ, or p moved
  the other way. Where verl multiplies by the 0/1 mask (NaN for logp = -inf), the dropped tokens give 0.
  Stats: clipfrac the dropped fraction (split by the sign of A into clipfrac_low / clipfrac_high),
  clipfrac_dual the kept tokens whose ratio the cap truncates (verl's "pg_clipfrac_lower").
- geo_mean: verl `compute_policy_loss_geo_mean` (GMPO): each token's log-ratio lr (unclamped) is clipped
  toward the side A pushes it, sgn(A)·min(sgn(A)·lr, sgn(A)·clamp(lr, -clip_low, clip_high)), the row's
  ratio R is exp of their masked mean (bounded by ±20 like every log-ratio here), and L = -A·R per token,
  straight-through as GSPO: with agg="seq-mean-token-mean" the row's loss is -Ā·R and its gradient verl's
  whenever A is constant along the row (verl supports only sequence-level advantages). verl ignores
  loss_agg_mode (a plain mean over all B rows: seq-mean-token-mean with num_seqs=B), and multiplies the row
  by the geometric mean of per-token IS weights; here is_weights multiply per token as for every objective
  (integrations/verl.py passes verl's per-row geometric mean). Stats as verl: clipfrac_high / clipfrac_low
  the tokens whose lr lies outside [-clip_low, clip_high] with A > 0 / A < 0.
- vespo: TRL `get_gamma_weights` / loss_type="vespo": L = -sg(φ)·A·logp with φ = e^λ·w^k·e^(-λw),
  w = exp(clamp(Σ_t m·clamp(lr_t, ±20), ln 1e-8, 20)) the sequence ratio (a sum, not a mean), (k, λ) =
  (vespo_k_pos, vespo_lambda_pos) where A >= 0, else the _neg pair, λ at least 1e-4, and φ 0 where not
  finite. Per-token is_weights (TRL's vLLM IS ratio) are folded into w in log space, Σ_t m·clamp(ln w_t,
  ln 1e-8, 20), instead of multiplying L.
- clip_cov / kl_cov: verl `compute_policy_loss_clip_cov` / `_kl_cov`, tokens selected by their covariance
  (reference/cov_selection.py): clip_cov is clip with the selected tokens' policy term dropped (no dual
  clip); kl_cov is -A·r (no clipping) plus cov_options.kl_coef·|logp - old_logp| on its selected tokens,
  both multiplied by is_weights as verl does. The ratio is ±20-clamped (verl does not clamp it here).
- is_weights multiply the policy term after clipping (verl `rollout_is_weights`, TRL's vLLM IS ratio);
  the KL term `kl_coef·kl_penalty(logp, ref_logp)` and the entropy bonus `-entropy_coef·entropy` are added
  per token, and the sum is aggregated by `agg` (reference/aggregation.py), so the KL and entropy terms
  use the same aggregation as the policy term (as verl's actor does).

old_logp, advantages, ref_logp, is_weights and mask are data: no gradient is meant to flow to them.
"""

from __future__ import annotations

import math

import torch

from rlkernels.policy_config import OBJECTIVES, SEQUENCE_OBJECTIVES, STAT_KEYS
from rlkernels.reference.aggregation import agg_loss, masked_mean
from rlkernels.reference.cov_selection import COV_OBJECTIVES, CovOptions, cov_selection
from rlkernels.reference.kl import kl_penalty

LEVELS = ("token", "sequence")
# log(r) is clamped to [-20, 20] before exp (verl), so r stays finite and positive.
LOG_RATIO_BOUND = 20.0
# VESPO's bounds of its sequence log-weight and of the log of each folded IS weight (TRL: [ln 1e-8, 20]).
VESPO_LOG_W_MIN = math.log(1e-8)
# VESPO's smallest rate λ (TRL clamps it at 1e-4).
VESPO_LAMBDA_MIN = 1e-4


def _per_row(x: torch.Tensor | None) -> torch.Tensor | None:
    """[B] per-sequence values broadcast against [B, T]."""
    return x.unsqueeze(-1) if x is not None and x.dim() == 1 else x


def sequence_token_log_ratio(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    adv: torch.Tensor | None,
    objective: str,
    clip_low: float,
    clip_high: float,
    is_weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """Each token's term [B, T] of its row's log-ratio statistic: lr (GSPO), geo_mean's sign-clipped lr,
    vespo's ±20-clamped lr plus its folded IS weight."""
    raw = logp - old_logp
    if objective == "geo_mean":
        sgn = torch.sign(adv)
        return sgn * torch.minimum(sgn * raw, sgn * torch.clamp(raw, -clip_low, clip_high))
    if objective == "vespo":
        x = torch.clamp(raw, -LOG_RATIO_BOUND, LOG_RATIO_BOUND)
        if is_weights is not None:
            x = x + torch.clamp(torch.log(is_weights), VESPO_LOG_W_MIN, LOG_RATIO_BOUND)
        return x
    return raw


def sequence_bounds(objective: str) -> tuple[float, float]:
    """The clamp of a row's log-ratio statistic."""
    return (VESPO_LOG_W_MIN if objective == "vespo" else -LOG_RATIO_BOUND), LOG_RATIO_BOUND


def log_ratio(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    mask: torch.Tensor,
    level: str,
    *,
    objective: str = "clip",
    adv: torch.Tensor | None = None,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    is_weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """Clamped log importance ratio [B, T]. A per-row ratio (level="sequence", SEQUENCE_OBJECTIVES) is the
    row's statistic of sequence_token_log_ratio (vespo: the sum, else the masked mean), clamped, and
    straight-through per token: its value in every token, the gradient of the token's own term."""
    if level == "token" and objective not in SEQUENCE_OBJECTIVES:
        return torch.clamp(logp - old_logp, -LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    x = sequence_token_log_ratio(logp, old_logp, adv, objective, clip_low, clip_high, is_weights)
    m = mask.to(logp.dtype)
    total = torch.where(m != 0, x * m, 0).sum(-1, keepdim=True)
    n = m.sum(-1, keepdim=True)
    seq = total if objective == "vespo" else total / torch.where(n > 0, n, 1)
    return torch.clamp(x - x.detach() + seq.detach(), *sequence_bounds(objective))


def dppo_kept(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    adv: torch.Tensor,
    objective: str,
    clip_low: float,
    clip_high: float,
) -> torch.Tensor:
    """DPPO's token filter [B, T] bool: the divergence test of dppo_tv / dppo_kl (module docstring)."""
    p, p_old = torch.exp(logp), torch.exp(old_logp)
    if objective == "dppo_tv":
        rise_ok, fall_ok = p - p_old <= clip_high, p - p_old >= -clip_low
    else:
        kl = p_old * (old_logp - logp) + (1 - p_old) * torch.log((1 - p_old + 1e-8) / (1 - p + 1e-8))
        rise_ok, fall_ok = (kl <= clip_high) | (p <= p_old), (kl <= clip_low) | (p >= p_old)
    return torch.where(adv > 0, rise_ok, fall_ok)


def policy_terms(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    ratio: torch.Tensor,
    adv: torch.Tensor,
    *,
    objective: str,
    clip_low: float,
    clip_high: float,
    dual_clip: float | None,
    ratio_cap: float | None,
    tau_pos: float,
    tau_neg: float,
    dro_beta: float = 1.0,
    vespo: tuple[float, float, float, float] = (2.0, 3.0, 3.0, 2.0),
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token policy term [B, T] and the boolean [B, T] masks behind the clip stats. ratio: exp of
    log_ratio (per-row objectives: the row's ratio, straight-through). vespo: (k_pos, λ_pos, k_neg, λ_neg)."""
    lo, hi = 1 - clip_low, 1 + clip_high
    flags: dict[str, torch.Tensor] = {}
    if objective == "clip":
        unclipped = ratio if ratio_cap is None else torch.clamp(ratio, max=ratio_cap)
        loss1 = -adv * unclipped
        loss2 = -adv * torch.clamp(ratio, lo, hi)
        loss = torch.maximum(loss1, loss2)
        flags["clipfrac"] = loss2 > loss1
        flags["clipfrac_low"] = (ratio < lo) & (adv < 0)
        flags["clipfrac_high"] = (ratio > hi) & (adv > 0)
        if dual_clip is not None:
            loss3 = -adv * dual_clip
            flags["clipfrac_dual"] = (adv < 0) & (loss > loss3)
            loss = torch.where(adv < 0, torch.minimum(loss, loss3), loss)
    elif objective == "cispo":
        loss = -torch.clamp(ratio, lo, hi).detach() * adv * logp
        flags["clipfrac_low"] = ratio < lo
        flags["clipfrac_high"] = ratio > hi
        flags["clipfrac"] = flags["clipfrac_low"] | flags["clipfrac_high"]
    elif objective == "sapo":
        tau = torch.where(adv > 0, adv.new_tensor(tau_pos), adv.new_tensor(tau_neg))
        loss = -adv * torch.sigmoid(tau * (ratio - 1)) * (4 / tau)
    elif objective == "gpg":
        loss = -adv * logp
    elif objective == "dro":
        loss = -(adv * logp - 0.5 * dro_beta * (logp - old_logp) ** 2)
    elif objective in ("dppo_tv", "dppo_kl"):
        kept = dppo_kept(logp.detach(), old_logp, adv, objective, clip_low, clip_high)
        truncated = ratio if ratio_cap is None else torch.clamp(ratio, max=ratio_cap)
        loss = torch.where(kept, -adv * truncated.detach() * logp, torch.zeros_like(logp))
        flags["clipfrac"] = ~kept
        flags["clipfrac_low"] = ~kept & (adv <= 0)
        flags["clipfrac_high"] = ~kept & (adv > 0)
        if ratio_cap is not None:
            flags["clipfrac_dual"] = kept & (ratio > ratio_cap)
    elif objective == "geo_mean":
        loss = -adv * ratio
        raw = logp.detach() - old_logp
        outside = (raw < -clip_low) | (raw > clip_high)
        flags["clipfrac_low"] = outside & (adv < 0)
        flags["clipfrac_high"] = outside & (adv > 0)
        flags["clipfrac"] = flags["clipfrac_low"] | flags["clipfrac_high"]
    elif objective == "vespo":
        k_pos, lam_pos, k_neg, lam_neg = vespo
        pos = adv >= 0
        k = torch.where(pos, adv.new_tensor(k_pos), adv.new_tensor(k_neg))
        lam = torch.where(pos, adv.new_tensor(lam_pos), adv.new_tensor(lam_neg)).clamp(min=VESPO_LAMBDA_MIN)
        w = ratio.detach()
        phi = torch.exp(lam + k * torch.log(w) - lam * w).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)
        loss = -phi * adv * logp
    else:
        raise ValueError(f"unknown objective {objective!r} (expected one of {OBJECTIVES})")
    return loss, flags


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float | None = None,
    dual_clip: float | None = None,
    ratio_cap: float | None = None,
    objective: str = "clip",
    level: str = "token",
    agg: str = "token-mean",
    num_tokens=None,
    num_seqs=None,
    dp_size: int = 1,
    norm_len: float | None = None,
    ref_logp: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    kl_kind: str = "k3",
    kl_clamp: float | None = 10.0,
    entropy: torch.Tensor | None = None,
    entropy_coef: float = 0.0,
    is_weights: torch.Tensor | None = None,
    sapo_tau_pos: float = 1.0,
    sapo_tau_neg: float = 1.05,
    dro_beta: float = 1.0,
    vespo_k_pos: float = 2.0,
    vespo_lambda_pos: float = 3.0,
    vespo_k_neg: float = 3.0,
    vespo_lambda_neg: float = 2.0,
    cov_options: CovOptions | None = None,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(loss, stats) in the dtype of the inputs. logp, old_logp, mask, ref_logp, entropy: [B, T];
    advantages, is_weights: [B] or [B, T]. stats: masked means over this batch's tokens."""
    clip_high = clip_low if clip_high is None else clip_high
    adv = _per_row(advantages)
    folds_is_weights = objective == "vespo"
    lr = log_ratio(
        logp, old_logp, mask, level, objective=objective, adv=adv, clip_low=clip_low, clip_high=clip_high,
        is_weights=is_weights if folds_is_weights else None,
    )  # fmt: skip
    cov_objective = objective if objective in COV_OBJECTIVES else None
    cov_options = CovOptions() if cov_options is None else cov_options
    if cov_objective == "kl_cov":  # -A·r: the clip objective with an unbounded range
        objective, clip_low, clip_high = "clip", 1.0, float("inf")
    elif cov_objective == "clip_cov":
        objective = "clip"
    terms, flags = policy_terms(
        logp,
        old_logp,
        torch.exp(lr),
        adv,
        objective=objective,
        clip_low=clip_low,
        clip_high=clip_high,
        dual_clip=dual_clip,
        ratio_cap=ratio_cap,
        tau_pos=sapo_tau_pos,
        tau_neg=sapo_tau_neg,
        dro_beta=dro_beta,
        vespo=(vespo_k_pos, vespo_lambda_pos, vespo_k_neg, vespo_lambda_neg),
    )
    if cov_objective is not None:
        selected = cov_selection(
            cov_objective, logp, adv, mask, cov_options, clipped=flags["clipfrac"], generator=generator
        )
        if cov_objective == "clip_cov":
            terms = torch.where(selected, 0.0, terms)
        else:
            terms = terms + torch.where(selected, cov_options.kl_coef * (logp - old_logp).abs(), 0.0)
            flags = {}
        flags["cov_selected"] = selected
    if is_weights is not None and not folds_is_weights:
        terms = terms * _per_row(is_weights)
    stats = {key: masked_mean(flag.to(logp.dtype), mask) for key, flag in flags.items()}
    token_lr = torch.clamp(logp.detach() - old_logp, -LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    stats["approx_kl"] = masked_mean(-token_lr, mask)
    if ref_logp is not None:
        kl = kl_penalty(logp, ref_logp, kl_kind, kl_clamp)
        stats["kl"] = masked_mean(kl.detach(), mask)
        if kl_coef != 0:
            terms = terms + kl_coef * kl
    if entropy is not None:
        stats["entropy"] = masked_mean(entropy.detach(), mask)
        if entropy_coef != 0:
            terms = terms - entropy_coef * entropy
    loss = agg_loss(
        terms, mask, agg, num_tokens=num_tokens, num_seqs=num_seqs, dp_size=dp_size, norm_len=norm_len
    )
    return loss, {key: stats[key] for key in (*STAT_KEYS, "cov_selected") if key in stats}


def linear_policy_loss(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    temperature: float = 1.0,
    softcap: float | None = None,
    ignore_index: int = -100,
    entropy_coef: float = 0.0,
    **policy_kwargs,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The policy loss from hidden states: `linear_logprobs` composed with `policy_loss`.

    hidden [B, T, D], weight [V, D], labels [B, T]; the other arguments as `policy_loss`. Tokens whose
    label is `ignore_index` are left out of the loss (their logp is 0 by convention). The entropy bonus
    uses the entropy of the same softmax; `stats["entropy"]` is reported whenever entropy_coef != 0."""
    from rlkernels.reference.logprobs import linear_logprobs  # another module's spec, loaded lazily

    want_entropy = entropy_coef != 0
    out = linear_logprobs(
        hidden,
        weight,
        labels,
        bias=bias,
        temperature=temperature,
        softcap=softcap,
        ignore_index=ignore_index,
        return_entropy=want_entropy,
    )
    logp, entropy = out if want_entropy else (out, None)
    valid = labels != ignore_index
    mask = mask & valid if mask.dtype == torch.bool else mask * valid.to(mask.dtype)
    return policy_loss(
        logp,
        old_logp,
        advantages,
        mask,
        entropy=entropy,
        entropy_coef=entropy_coef,
        **policy_kwargs,
    )
