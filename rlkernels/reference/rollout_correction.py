"""Rollout correction in eager PyTorch: the spec and the implementation of rk.rollout_correction.

The importance weights and the rejection mask that correct for the gap between the policy that sampled
a batch (the rollout engine, e.g. vLLM in bf16: `logp_rollout`) and the training policy's log-probs of the
same tokens (`logp_old`), as verl 0.9.1 (`verl/trainer/ppo/rollout_corr_helper.py`) and TRL 1.16
(`GRPOTrainer._generate_and_score_completions`, `vllm_importance_sampling_*`) compute them.
docs/semantics.md ("Rollout correction") states the formulas and where each peer differs.

With d = logp_old - logp_rollout on the valid tokens (mask != 0; 0 elsewhere and where d is NaN, as
TRL treats a token vLLM could not score) and c = log_ratio_clamp (verl's SAFETY_BOUND 20; None: no clamp,
as TRL):
  level="token":    ρ_t = exp(clamp(d_t, -c, c))                       per token, [B, T]
  level="sequence": ρ_b = exp(clamp(Σ_t d_t, -c, c))                   per sequence, [B, 1]
  mode="truncate":  w = clamp(ρ, clip_min, clip_max)                   (TIS; verl has no clip_min)
  mode="mask":      w = ρ if clip_min <= ρ <= clip_max else 0          (MIS / IcePop; a missing bound is open)
w is 0 on padding (and on empty rows at sequence level); batch_normalize divides w by its mean (over
valid tokens, or over non-empty rows at sequence level) when that mean exceeds 1e-8 (verl).

Rejection (verl `rollout_rs`, one option): with l_t = clamp(d_t, -c, c), the token statistic is
k1 = -l, k2 = l²/2 or k3 = e^l - 1 - l; "token_k*" tests it per token, "seq_sum_k*" / "seq_mean_k*" /
"seq_max_k*" test its masked sum / mean / max per sequence (an empty row gives 0). k1 keeps
log(rejection_min) <= stat <= log(rejection_max) (rejection_min defaults to 1 / rejection_max); k2 and
k3 keep stat <= rejection_max. The returned mask is mask·keep.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from rlkernels._dtypes import acc_dtype

Tensor = torch.Tensor

LEVELS = ("token", "sequence")
MODES = ("truncate", "mask")
# verl 0.9.1 SUPPORTED_ROLLOUT_RS_OPTIONS: the statistic's aggregation and its estimator.
REJECTIONS = (
    "token_k1", "token_k2", "token_k3",
    "seq_sum_k1", "seq_sum_k2", "seq_sum_k3",
    "seq_mean_k1", "seq_mean_k2", "seq_mean_k3",
    "seq_max_k2", "seq_max_k3",
)  # fmt: skip
# Normalization below this mean is skipped (verl rollout_is_batch_normalize).
BATCH_NORM_MIN = 1e-8
# The sums per row of the fused pass (rows of its [len(ROW_SUMS), B] output; the C++ CPU kernel's enum Stat
# and the Triton kernel store them in this order): rlkernels/ops/rollout_correction.py assembles them.
ROW_SUMS = (
    "count",  # valid tokens
    "sum_d",  # Σ d (the sequence log-ratio, unclamped)
    "sum_k3",  # Σ e^d − d − 1
    "sum_abs",  # Σ |d|
    "max_abs",  # max |d| (0 for an empty row)
    "sum_w",  # Σ w (token weights)
    "min_w",  # min w (+inf for an empty row)
    "max_w",  # max w (−inf for an empty row)
    "n_high",  # ρ > clip_max
    "n_low",  # ρ < the low bound (clip_min, else 1 / clip_max)
    "n_oob",  # ρ outside [clip_min, clip_max] (mask mode)
    "rejection",  # token_*: rejected tokens; seq_sum / seq_mean: Σ stat; seq_max: max stat (−inf if empty)
)
# Metric names: verl's (logged with this prefix) and TRL's.
VERL = "rollout_corr/"
TRL_RATIO = "sampling/importance_sampling_ratio/"
TRL_DIFF = "sampling/sampling_logp_difference/"


class RolloutCorrectionConfig(NamedTuple):
    """The options of rollout_correction, once (docs/semantics.md, "Rollout correction").

    level: "token" | "sequence" | None (no importance weights: rejection and metrics only).
    mode: "truncate" (TIS: clamp ρ to [clip_min, clip_max]) | "mask" (MIS / IcePop: ρ outside is 0).
    clip_max, clip_min: the bounds C_max / C_min (> 0); None leaves that side open.
    rejection: one of REJECTIONS (verl `rollout_rs`) or None; rejection_max its upper bound (a ratio for
        k1, a divergence for k2 / k3), rejection_min the k1 ratio's lower bound (default 1/rejection_max).
    batch_normalize: divide the weights by their batch mean (verl `rollout_is_batch_normalize`).
    log_ratio_clamp: |log ρ| bound before exp (verl 20); None: unclamped (TRL).
    """

    level: str | None = "token"
    mode: str = "truncate"
    clip_max: float | None = 2.0
    clip_min: float | None = None
    rejection: str | None = None
    rejection_max: float | None = None
    rejection_min: float | None = None
    batch_normalize: bool = False
    log_ratio_clamp: float | None = 20.0


class RolloutCorrection(NamedTuple):
    """What rollout_correction returns.

    weights: [B, T] (level="token") or [B, 1] (level="sequence") float, 0 on padding: pass as
        policy_loss(is_weights=); None when level is None.
    mask: the input mask (its dtype) with the rejected tokens set to 0; the input itself without rejection.
    metrics: 0-dim tensors (no host sync), verl's names under "rollout_corr/" and TRL's under "sampling/".
    """

    weights: Tensor | None
    mask: Tensor
    metrics: dict[str, Tensor]


def mean_or_zero(total: Tensor, count: Tensor) -> Tensor:
    """total / count, 0 where count is 0 (an empty mask gives 0, never NaN)."""
    return total / count.clamp(min=1).to(total.dtype)


def ratio_range(c: float | None) -> tuple[float, float]:
    """(e^-c, e^c), the range of a ratio whose log is clamped to ±c (inf past float64's range; None: open)."""
    if c is None:
        return 0.0, math.inf
    return (math.exp(-c), math.exp(c)) if c < 709.0 else (0.0, math.inf)


def low_ratio_bound(config: RolloutCorrectionConfig) -> float | None:
    """The bound of verl's rollout_is_ratio_fraction_low: clip_min, else 1 / clip_max (None: neither)."""
    if config.clip_min is not None:
        return config.clip_min
    return None if config.clip_max is None else 1.0 / config.clip_max


def token_ratio_metrics(high, low, oob, total: Tensor, config: RolloutCorrectionConfig) -> dict[str, Tensor]:
    """verl's token-level ratio fractions from the batch's counts of valid tokens with ρ above clip_max
    (`high`), below low_ratio_bound (`low`) and outside [clip_min, clip_max] (`oob`, mask mode), each
    0-dim; a fraction whose bound is absent is left out."""
    metrics = {}
    if config.clip_max is not None:
        metrics[VERL + "rollout_is_ratio_fraction_high"] = mean_or_zero(high, total)
    if low_ratio_bound(config) is not None:
        metrics[VERL + "rollout_is_ratio_fraction_low"] = mean_or_zero(low, total)
    if config.mode == "mask":
        metrics[VERL + "rollout_is_oob_ratio"] = mean_or_zero(oob, total)
    return metrics


def _apply_bounds(rho: Tensor, config: RolloutCorrectionConfig) -> Tensor:
    """TIS clamp or MIS / IcePop zeroing of the ratios ρ (any shape)."""
    lo, hi = config.clip_min, config.clip_max
    if config.mode == "truncate":
        return rho.clamp(min=lo, max=hi)
    out = rho
    if lo is not None:
        out = out.masked_fill(rho < lo, 0.0)
    if hi is not None:
        out = out.masked_fill(rho > hi, 0.0)
    return out


def rejection_bounds(config: RolloutCorrectionConfig) -> tuple[float, float]:
    """The kept range [low, high] of the rejection statistic: [log(rejection_min), log(rejection_max)] for
    k1 (rejection_min defaults to 1 / rejection_max), [-inf, rejection_max] for k2 / k3."""
    upper = config.rejection_max
    if config.rejection.endswith("k1"):
        lower = 1.0 / upper if config.rejection_min is None else config.rejection_min
        return math.log(lower), math.log(upper)
    return -math.inf, upper


def rejection_stat(lr: Tensor, kind: str) -> Tensor:
    """The token statistic of the clamped log-ratio lr: k1 = -l, k2 = l²/2, k3 = e^l - 1 - l."""
    if kind == "k1":
        return -lr
    if kind == "k2":
        return 0.5 * lr.square()
    return lr.exp() - 1.0 - lr


def row_rejection_value(agg: str, total: Tensor, count: Tensor) -> Tensor:
    """A seq_* option's row statistic from the row's masked sum (seq_sum, seq_mean) or max (seq_max) of the
    token statistic and its valid-token count (same shapes): the mean divides by the count, and an empty
    row gives 0 (verl)."""
    if agg == "seq_mean":
        return mean_or_zero(total, count)
    if agg == "seq_max":
        return torch.where(count > 0, total, 0.0)
    return total


def _rejection_keep(lr: Tensor, valid: Tensor, count: Tensor, config: RolloutCorrectionConfig) -> Tensor:
    """Per-token keep (token_*) [B, T] or per-row keep [B, 1] (seq_*)."""
    agg, kind = config.rejection.rsplit("_", 1)
    stat = rejection_stat(lr, kind)
    if agg == "token":
        value = stat
    elif agg == "seq_max":
        value = torch.where(valid, stat, -math.inf).amax(-1, keepdim=True)
    else:
        value = torch.where(valid, stat, 0.0).sum(-1, keepdim=True)
    if agg != "token":
        value = row_rejection_value(agg, value, count.unsqueeze(-1))
    low, high = rejection_bounds(config)
    return (value >= low) & (value <= high)


def divergence_metrics(seq: Tensor, count: Tensor, k3_sum: Tensor, abs_sum: Tensor, abs_max: Tensor,
                       c: float | None) -> dict[str, Tensor]:  # fmt: skip
    """verl's compute_offpolicy_metrics (the token and sequence-level k1 / k3 of d) and TRL's |d| metrics
    from the rows' Σ d `seq` [B] and valid-token counts [B], and the batch's Σ (e^d - d - 1), Σ |d| and
    max |d| (0-dim)."""
    b = seq.shape[0]
    total = count.sum()
    nonempty = count > 0
    rows = nonempty.sum()
    seq_c = seq if c is None else seq.clamp(-c, c)
    return {
        VERL + "kl": mean_or_zero(-seq.sum(), total),
        VERL + "k3_kl": mean_or_zero(k3_sum, total),
        VERL + "log_ppl_diff": (-mean_or_zero(seq, count)).sum() / b if b else seq.sum(),
        VERL + "seq_kl_k1": mean_or_zero(torch.where(nonempty, -seq, 0.0).sum(), rows),
        VERL + "seq_kl_k3": mean_or_zero(torch.where(nonempty, seq_c.exp() - seq_c - 1.0, 0.0).sum(), rows),
        TRL_DIFF + "mean": mean_or_zero(abs_sum, total),
        TRL_DIFF + "max": abs_max,
    }


def sequence_weights(seq: Tensor, count: Tensor, config: RolloutCorrectionConfig):
    """level="sequence" from the rows' Σ d [B] and counts [B]: (w [B], Σ of the token weights, metrics,
    min and max weight over the non-empty rows (±inf when none))."""
    upper, lower, c = config.clip_max, config.clip_min, config.log_ratio_clamp
    b = seq.shape[0]
    total = count.sum()
    nonempty = count > 0
    seq_c = seq if c is None else seq.clamp(-c, c)
    rho = seq_c.exp()  # [B]
    w = torch.where(nonempty, _apply_bounds(rho, config), 0.0)
    metrics: dict[str, Tensor] = {}
    # verl weighs each sequence by its length in its token means (weights broadcast over [B, T]).
    w_sum = (w * count).sum()
    low_bound = low_ratio_bound(config)
    # verl counts these over all rows (an empty row has Σd = 0).
    bt = torch.tensor(b, device=seq.device)
    if upper is not None:
        metrics[VERL + "rollout_is_ratio_fraction_high"] = mean_or_zero((seq > math.log(upper)).sum(), bt)
    if low_bound is not None:
        metrics[VERL + "rollout_is_ratio_fraction_low"] = mean_or_zero((seq < math.log(low_bound)).sum(), bt)
    if config.mode == "mask":
        out = torch.zeros_like(nonempty)
        if lower is not None:
            out = out | (rho < lower)
        if upper is not None:
            out = out | (rho > upper)
        metrics[VERL + "rollout_is_oob_ratio"] = mean_or_zero(
            (out & nonempty).to(w.dtype).mul(count).sum(), total
        )
    flat_min = torch.where(nonempty, w, math.inf).amin() if b else w.sum()
    flat_max = torch.where(nonempty, w, -math.inf).amax() if b else w.sum()
    return w, w_sum, metrics, flat_min, flat_max


def finish_weights(w: Tensor, w_sum: Tensor, count: Tensor, flat_min: Tensor, flat_max: Tensor,
                   config: RolloutCorrectionConfig, metrics: dict[str, Tensor]) -> Tensor:  # fmt: skip
    """The weights' mean metrics and batch normalization, shared by both levels: w is [B, T] (token) or
    [B] (sequence); Σ w over the valid tokens is w_sum. Returns the weights, [B, T] or [B, 1]."""
    total = count.sum()
    rows = (count > 0).sum()
    mean_w = mean_or_zero(w_sum, total)
    metrics[VERL + "rollout_is_mean"] = mean_w
    any_weight = total > 0
    metrics[TRL_RATIO + "min"] = torch.where(any_weight, flat_min, 0.0)
    metrics[TRL_RATIO + "max"] = torch.where(any_weight, flat_max, 0.0)
    # TRL's mean: over valid tokens (token level), over the (non-empty) rows (sequence level).
    if config.level == "token":
        metrics[TRL_RATIO + "mean"] = mean_w
    else:
        metrics[TRL_RATIO + "mean"] = mean_or_zero(w.sum(), rows)
        w = w.unsqueeze(-1)
    if config.batch_normalize:
        # verl: token level, the token mean; sequence level, the mean over non-empty rows.
        norm = mean_w if config.level == "token" else mean_or_zero(w.sum(), rows)
        apply = norm > BATCH_NORM_MIN
        w = torch.where(apply, w / torch.where(apply, norm, 1.0), w)
        metrics[VERL + "rollout_is_batch_norm_factor"] = torch.where(apply, norm, 1.0)
    return w


def rejection_metrics(rejected: Tensor, count: Tensor) -> dict[str, Tensor]:
    """verl's rollout_rs fractions from the rows' rejected valid tokens [B] and valid-token counts [B]."""
    b = count.shape[0]
    total = count.sum()
    seq_rejected = (rejected > 0).sum().to(count.dtype)
    return {
        VERL + "rollout_rs_masked_fraction": mean_or_zero(rejected.sum().to(count.dtype), total),
        VERL + "rollout_rs_seq_masked_fraction": seq_rejected / b if b else seq_rejected,
    }


def rejected_mask(mask: Tensor, kept_tokens: Tensor) -> Tensor:
    """The input mask (its dtype) with the tokens not kept zeroed."""
    return kept_tokens if mask.dtype == torch.bool else mask * kept_tokens.to(mask.dtype)


def rollout_correction(
    logp_old: Tensor, logp_rollout: Tensor, mask: Tensor, config: RolloutCorrectionConfig
) -> RolloutCorrection:
    """Importance weights, rejection mask and metrics for [B, T] log-probs (see the module docstring).

    `mask` is bool, 0/1 integer or float (its nonzero positions are the valid tokens)."""
    acc = acc_dtype(torch.promote_types(logp_old.dtype, logp_rollout.dtype))
    valid = mask if mask.dtype == torch.bool else mask != 0
    count = valid.sum(-1).to(acc)  # [B] valid tokens per row

    d = torch.where(valid, logp_old.to(acc) - logp_rollout.to(acc), 0.0).nan_to_num_(nan=0.0)
    seq = d.sum(-1)  # [B] sequence log-ratio Σ_t d_t, unclamped
    c = config.log_ratio_clamp
    lr = d if c is None else d.clamp(-c, c)  # the clamped token log-ratio, 0 on padding
    e = d.exp()
    absd = d.abs()
    abs_max = absd.amax() if absd.numel() else absd.sum()
    # 0 on padding: e^0 - 0 - 1
    metrics = divergence_metrics(seq, count, (e - d - 1.0).sum(), absd.sum(), abs_max, c)

    weights = None
    if config.level == "token":
        upper, lower = config.clip_max, config.clip_min
        total = count.sum()
        rho = e if c is None else e.clamp(*ratio_range(c))  # = exp(lr), one exp pass
        w = torch.where(valid, _apply_bounds(rho, config), 0.0)
        raw = torch.where(valid, rho, 0.0)
        high = (raw > upper).logical_and_(valid).sum() if upper is not None else None
        low_bound = low_ratio_bound(config)
        low = (raw < low_bound).logical_and_(valid).sum() if low_bound is not None else None
        oob = None
        if config.mode == "mask":
            out = ((raw < lower) if lower is not None else torch.zeros_like(valid)) | (
                (raw > upper) if upper is not None else torch.zeros_like(valid)
            )
            oob = out.logical_and_(valid).sum()
        metrics.update(token_ratio_metrics(high, low, oob, total, config))
        flat_min = torch.where(valid, w, math.inf).amin() if w.numel() else w.sum()
        flat_max = torch.where(valid, w, -math.inf).amax() if w.numel() else w.sum()
        weights = finish_weights(w, w.sum(), count, flat_min, flat_max, config, metrics)
    elif config.level == "sequence":
        w, w_sum, seq_metrics, flat_min, flat_max = sequence_weights(seq, count, config)
        metrics.update(seq_metrics)
        weights = finish_weights(w, w_sum, count, flat_min, flat_max, config, metrics)

    out_mask = mask
    if config.rejection is not None:
        kept_tokens = valid & _rejection_keep(
            lr, valid, count, config
        )  # keep broadcasts over T for the sequence options
        metrics.update(rejection_metrics((valid & ~kept_tokens).sum(-1), count))
        out_mask = rejected_mask(mask, kept_tokens)
    metrics = {k: v.to(acc) for k, v in metrics.items()}
    return RolloutCorrection(weights, out_mask, metrics)
