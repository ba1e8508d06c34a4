"""rollout_correction: the public function, and the mapping of verl's and TRL's options onto its config.

Two implementations. The eager one (rlkernels/reference/rollout_correction.py, the spec; any device) is a
couple of dozen elementwise passes and row reductions over the two [B, T] log-prob tensors and the mask.
The fused one is one op per flavor (C++ on the CPU, csrc/cpu/rollout_correction.cpp; Triton on a GPU,
rlkernels/triton/rollout_correction.py, or CUDA C++, csrc/cuda/rollout_correction.cu): one pass reads the
inputs once and writes the token weights, a token rejection's mask and each row's sums, and finishes the
batch in the same launch (the metrics, the sequence-level weights and their batch normalization, each row's
seq_* rejection: the math of csrc/include/rlkernels/rollout_correction.h); a second elementwise launch runs
only for token weights with batch_normalize or the mask of a seq_* rejection. It checks the mask's values
into a flag (on a GPU the kernel's own assert, either flavor). No host sync: the
metrics stay 0-dim tensors, views of the op's [len(METRICS)] output. benchmarks/results/rollout_correction.md
compares both with torch.compile and the peers.
"""

from __future__ import annotations

import math

import torch

from rlkernels import _validate as v
from rlkernels._backend import select_backend
from rlkernels._dtypes import acc_dtype
from rlkernels.ops._flags import check_flag
from rlkernels.ops._library import register_constant_backends
from rlkernels.ops._token_masks import kernel_mask
from rlkernels.reference import rollout_correction as reference
from rlkernels.reference.rollout_correction import (
    LEVELS,
    MODES,
    REJECTIONS,
    TRL_DIFF,
    TRL_RATIO,
    VERL,
    RolloutCorrection,
    RolloutCorrectionConfig,
)

OP = "rollout_correction"
Tensor = torch.Tensor
# The fused op's metrics output, in order (csrc/include/rlkernels/rollout_correction.h RolloutMetric; the
# Triton kernel's too): the public function keeps those the options define (_metric_keys).
METRICS = (
    VERL + "kl", VERL + "k3_kl", VERL + "log_ppl_diff", VERL + "seq_kl_k1", VERL + "seq_kl_k3",
    TRL_DIFF + "mean", TRL_DIFF + "max", VERL + "rollout_is_ratio_fraction_high",
    VERL + "rollout_is_ratio_fraction_low", VERL + "rollout_is_oob_ratio", VERL + "rollout_is_mean",
    TRL_RATIO + "min", TRL_RATIO + "max", TRL_RATIO + "mean", VERL + "rollout_is_batch_norm_factor",
    VERL + "rollout_rs_masked_fraction", VERL + "rollout_rs_seq_masked_fraction",
)  # fmt: skip
# TRL 1.16 vllm_importance_sampling_mode -> (level, mode).
TRL_MODES = {
    "token_truncate": ("token", "truncate"),
    "token_mask": ("token", "mask"),
    "sequence_truncate": ("sequence", "truncate"),
    "sequence_mask": ("sequence", "mask"),
}


def check_config(config: RolloutCorrectionConfig) -> RolloutCorrectionConfig:
    """Validate every option (ValueError / TypeError naming it); numbers become floats."""
    if config.level is not None:
        v.check_choice(OP, config.level, "level", LEVELS)
    v.check_choice(OP, config.mode, "mode", MODES)
    clip_max = v.check_number(OP, config.clip_max, "clip_max", gt=0, optional=True)
    clip_min = v.check_number(OP, config.clip_min, "clip_min", gt=0, optional=True)
    if config.level is not None and clip_max is None and clip_min is None:
        raise ValueError(f"{OP}: give clip_max or clip_min (or both) for level={config.level!r}")
    if clip_max is not None and clip_min is not None and clip_min > clip_max:
        raise ValueError(f"{OP}: clip_min ({clip_min}) must be <= clip_max ({clip_max})")
    rejection = config.rejection
    rej_max = v.check_number(OP, config.rejection_max, "rejection_max", gt=0, optional=True)
    rej_min = v.check_number(OP, config.rejection_min, "rejection_min", gt=0, optional=True)
    if rejection is None:
        if rej_max is not None or rej_min is not None:
            raise ValueError(f"{OP}: rejection_max / rejection_min need rejection= (one of {REJECTIONS})")
    else:
        v.check_choice(OP, rejection, "rejection", REJECTIONS)
        if rej_max is None:
            raise ValueError(f"{OP}: rejection={rejection!r} needs rejection_max")
        if rej_min is not None and not rejection.endswith("k1"):
            raise ValueError(f"{OP}: rejection_min applies to the k1 (ratio) options only, got {rejection!r}")
        if rej_min is not None and rej_min > rej_max:
            raise ValueError(f"{OP}: rejection_min ({rej_min}) must be <= rejection_max ({rej_max})")
    if not isinstance(config.batch_normalize, bool):
        raise TypeError(f"{OP}: batch_normalize must be a bool, got {type(config.batch_normalize).__name__}")
    if config.batch_normalize and config.level is None:
        raise ValueError(f"{OP}: batch_normalize needs importance weights (level 'token' or 'sequence')")
    clamp = v.check_number(OP, config.log_ratio_clamp, "log_ratio_clamp", gt=0, optional=True)
    if clamp is not None and not math.isfinite(clamp):
        raise ValueError(f"{OP}: log_ratio_clamp must be finite (or None for no clamp), got {clamp}")

    def f(x):
        return None if x is None else float(x)

    return config._replace(
        clip_max=f(clip_max), clip_min=f(clip_min), rejection_max=f(rej_max), rejection_min=f(rej_min),
        log_ratio_clamp=f(clamp),
    )  # fmt: skip


@v.keyword_options
def rollout_correction(
    logp_old: Tensor,
    logp_rollout: Tensor,
    mask: Tensor,
    *,
    level: str | None = "token",
    mode: str = "truncate",
    clip_max: float | None = 2.0,
    clip_min: float | None = None,
    rejection: str | None = None,
    rejection_max: float | None = None,
    rejection_min: float | None = None,
    batch_normalize: bool = False,
    log_ratio_clamp: float | None = 20.0,
    backend: str = "auto",
) -> RolloutCorrection:
    """Importance weights and rejection mask for the rollout / training mismatch (TIS, MIS, IcePop, verl's
    rejection sampling), with the metrics verl and TRL log. docs/semantics.md, "Rollout correction".

    With d = logp_old - logp_rollout on the valid tokens (NaN counts as 0: ratio 1, as TRL), the ratio is
    ρ = exp(clamp(d, ±log_ratio_clamp)) per token (level="token") or exp(clamp(Σ_t d, ±log_ratio_clamp))
    per sequence (level="sequence"); mode="truncate" clamps it to [clip_min, clip_max] (TIS), mode="mask"
    sets it to 0 outside (MIS; IcePop at token level). Peers: verl rollout_is="token"/"sequence" with
    rollout_is_threshold=C (truncate, clip_max=C) or "lo_hi" (mask, clip_min=lo, clip_max=hi); TRL
    vllm_importance_sampling_mode "<level>_<mode>" with clip_min / clip_max and log_ratio_clamp=None
    (`from_verl` / `from_trl` build the options from their configs).

    Args:
        logp_old: [B, T] float log-probs of the sampled tokens under the training policy (treated as data).
        logp_rollout: [B, T] log-probs the rollout engine reported for them.
        mask: [B, T] bool, 0/1 integer or float (nonzero = valid token).
        level: "token" | "sequence" | None (no weights: rejection and metrics only).
        mode: "truncate" | "mask". clip_max, clip_min: bounds > 0 (None: that side open; one is needed).
        rejection: a verl rollout_rs option ("token_k1" ... "seq_max_k3", see REJECTIONS) or None;
            rejection_max its upper bound, rejection_min the k1 ratio's lower bound (default 1/max).
        batch_normalize: divide the weights by their batch mean (verl rollout_is_batch_normalize).
        log_ratio_clamp: |log ρ| bound (verl's 20), None for none (TRL).
        backend: "auto" | "cpu" (C++) | "cuda" (CUDA C++) | "triton" (one fused pass each; "auto": C++ on
            CPU tensors, Triton on GPU tensors) | "reference" (eager). See the module docstring.

    Returns:
        RolloutCorrection(weights, mask, metrics): weights [B, T] or [B, 1] float32 (float64 for float64
        inputs), 0 on padding, for policy_loss(is_weights=) (None when level is None); mask, the input mask
        (its dtype) with the rejected tokens zeroed (the input itself without rejection); metrics, a dict of
        0-dim tensors: "rollout_corr/kl", "k3_kl", "log_ppl_diff", "seq_kl_k1", "seq_kl_k3",
        "rollout_is_mean", "rollout_is_ratio_fraction_high" / "_low", "rollout_is_oob_ratio" (mask mode),
        "rollout_is_batch_norm_factor", "rollout_rs_masked_fraction", "rollout_rs_seq_masked_fraction"
        (verl's names) and "sampling/importance_sampling_ratio/{min,mean,max}",
        "sampling/sampling_logp_difference/{mean,max}" (TRL's). An empty mask gives 0s, never NaN.
    """
    v.check_float(OP, logp_old, "logp_old")
    v.check_ndim(OP, logp_old, "logp_old", (2,))
    v.check_float(OP, logp_rollout, "logp_rollout")
    v.check_shape(OP, logp_rollout, "logp_rollout", logp_old.shape, "logp_old")
    v.check_mask(OP, mask, "mask", logp_old.shape, "logp_old")
    device = v.check_same_device(OP, logp_old=logp_old, logp_rollout=logp_rollout, mask=mask)
    config = check_config(
        RolloutCorrectionConfig(
            level=level, mode=mode, clip_max=clip_max, clip_min=clip_min, rejection=rejection,
            rejection_max=rejection_max, rejection_min=rejection_min, batch_normalize=batch_normalize,
            log_ratio_clamp=log_ratio_clamp,
        )
    )  # fmt: skip
    chosen = select_backend(OP, backend, device, implemented=tuple(_LAUNCH))
    with torch.no_grad():
        if chosen == "reference":
            v.mask_values(OP, mask)  # integer masks hold 0/1, float masks finite and >= 0
            return reference.rollout_correction(logp_old.detach(), logp_rollout.detach(), mask, config)
        return _fused(chosen, logp_old.detach(), logp_rollout.detach(), mask, config)


# ---- the fused op: one per flavor (C++ CPU: csrc/cpu/rollout_correction.cpp, CUDA C++:
# csrc/cuda/rollout_correction.cu; Triton), one schema ----


@torch.library.custom_op("rlkernels::rollout_correction_triton", mutates_args=())
def _rollout_triton(
    logp_old: Tensor, logp_rollout: Tensor, mask: Tensor, level: int, mask_mode: bool, clamp: float,
    clip_min: float, clip_max: float, low_bound: float, rejection: str | None, rej_low: float,
    rej_high: float, batch_normalize: bool, log_upper: float, log_low: float,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    from rlkernels.triton.rollout_correction import rollout_forward

    return rollout_forward(
        logp_old, logp_rollout, mask, level=LEVEL_NAMES[level], mask_mode=mask_mode, clamp=clamp,
        clip_min=clip_min, clip_max=clip_max, low_bound=low_bound, rejection=rejection, rej_low=rej_low,
        rej_high=rej_high, batch_normalize=batch_normalize, log_upper=log_upper, log_low=log_low,
    )  # fmt: skip


def _fake(logp_old, logp_rollout, mask, level, mask_mode, clamp, clip_min, clip_max, low_bound, rejection,
          rej_low, rej_high, batch_normalize, log_upper, log_low):  # fmt: skip
    acc = acc_dtype(torch.promote_types(logp_old.dtype, logp_rollout.dtype))
    b, t = logp_old.shape
    weights = {0: (0,), 1: (b, t), 2: (b, 1)}[level]
    return (
        logp_old.new_empty(weights, dtype=acc),
        mask.new_empty((b, t) if rejection is not None else (0,)),
        logp_old.new_empty(len(METRICS), dtype=acc),
        logp_old.new_empty((), dtype=torch.bool),
    )


# backend -> launcher of its flavor (rlkernels/ops/_library.py)
_LAUNCH = register_constant_backends(OP, fake=_fake)
# The op's level codes (rlk::RolloutLevel).
LEVEL_NAMES = {0: None, 1: "token", 2: "sequence"}
LEVEL_CODES = {name: code for code, name in LEVEL_NAMES.items()}
BAD_MASK = (
    f"{OP}: mask of an integer dtype must hold only 0 and 1, a float mask finite weights >= 0 (CPU "
    "tensors: a ValueError names the first bad element)"
)


def _metric_keys(config: RolloutCorrectionConfig) -> list[str]:
    """The metrics the options define, in the reference's order (a subset of METRICS)."""
    keys = list(METRICS[:7])  # the divergence metrics
    if config.level is not None:
        if config.clip_max is not None:
            keys.append(VERL + "rollout_is_ratio_fraction_high")
        if reference.low_ratio_bound(config) is not None:
            keys.append(VERL + "rollout_is_ratio_fraction_low")
        if config.mode == "mask":
            keys.append(VERL + "rollout_is_oob_ratio")
        keys += [VERL + "rollout_is_mean", TRL_RATIO + "min", TRL_RATIO + "max", TRL_RATIO + "mean"]
        if config.batch_normalize:
            keys.append(VERL + "rollout_is_batch_norm_factor")
    if config.rejection is not None:
        keys += [VERL + "rollout_rs_masked_fraction", VERL + "rollout_rs_seq_masked_fraction"]
    return keys


def _fused(
    backend: str, logp_old: Tensor, logp_rollout: Tensor, mask: Tensor, config: RolloutCorrectionConfig
):
    """The one-op path: weights, rejected mask, metrics and the mask's validity from the flavor's op."""

    def rows_unit(x):
        return x if x.stride(-1) == 1 else x.contiguous()

    acc = acc_dtype(torch.promote_types(logp_old.dtype, logp_rollout.dtype))
    if logp_old.dtype != logp_rollout.dtype:  # one dtype for the kernels: the accumulation dtype
        logp_old, logp_rollout = logp_old.to(acc), logp_rollout.to(acc)
    upper, lower, c = config.clip_max, config.clip_min, config.log_ratio_clamp
    low_bound = reference.low_ratio_bound(config)
    rej_low, rej_high = (-math.inf, math.inf)
    if config.rejection is not None:
        rej_low, rej_high = reference.rejection_bounds(config)
    m = rows_unit(kernel_mask(OP, mask, acc, backend))
    weights, out_mask, metrics, ok = _LAUNCH[backend](
        rows_unit(logp_old), rows_unit(logp_rollout), m, LEVEL_CODES[config.level], config.mode == "mask",
        math.inf if c is None else c, 0.0 if lower is None else lower, math.inf if upper is None else upper,
        0.0 if low_bound is None else low_bound, config.rejection, rej_low, rej_high, config.batch_normalize,
        math.inf if upper is None else math.log(upper), -math.inf if not low_bound else math.log(low_bound),
    )  # fmt: skip
    check_flag(OP, ok, BAD_MASK, lambda: v.mask_values(OP, mask), backend=backend)
    values = dict(zip(METRICS, metrics.unbind(0), strict=True))
    out = {k: values[k] for k in _metric_keys(config)}
    if config.rejection is None:
        out_mask = mask
    elif out_mask.dtype != mask.dtype:  # a mask the kernels read converted
        out_mask = out_mask.to(mask.dtype)
    return RolloutCorrection(weights if config.level is not None else None, out_mask, out)


def _parse_bounds(spec, name: str) -> tuple[float | None, float]:
    """verl's threshold: a number (upper) or "lower_upper"."""
    if isinstance(spec, bool) or not isinstance(spec, (int, float, str)):
        raise TypeError(f"{OP}: {name} must be a number or a 'lower_upper' string, got {type(spec).__name__}")
    if isinstance(spec, str) and "_" in spec:
        low, high = spec.split("_", 1)
        return float(low), float(high)
    return None, float(spec)


def from_verl(
    rollout_is: str | None = "sequence",
    rollout_is_threshold: str | float = 2.0,
    rollout_is_batch_normalize: bool = False,
    rollout_rs: str | None = None,
    rollout_rs_threshold: str | float | None = None,
) -> dict:
    """rollout_correction's keyword options for verl 0.9.1's RolloutCorrectionConfig fields (one rollout_rs
    option; verl's comma-separated chains are not covered). Use: rk.rollout_correction(old, rollout, mask,
    **from_verl(rollout_is="token", rollout_is_threshold="0.5_5.0"))."""
    low, high = _parse_bounds(rollout_is_threshold, "rollout_is_threshold")
    options = dict(
        level=rollout_is, mode="truncate" if low is None else "mask", clip_max=high, clip_min=low,
        batch_normalize=rollout_is_batch_normalize,
    )  # fmt: skip
    if rollout_rs is not None:
        if "," in rollout_rs:
            raise ValueError(f"{OP}: one rollout_rs option at a time, got {rollout_rs!r}")
        if rollout_rs_threshold is None:
            raise ValueError(f"{OP}: rollout_rs={rollout_rs!r} needs rollout_rs_threshold")
        rs_low, rs_high = _parse_bounds(rollout_rs_threshold, "rollout_rs_threshold")
        options.update(rejection=rollout_rs.strip(), rejection_max=rs_high, rejection_min=rs_low)
    return options


def from_trl(
    vllm_importance_sampling_mode: str = "sequence_mask",
    vllm_importance_sampling_clip_max: float | None = 3.0,
    vllm_importance_sampling_clip_min: float | None = None,
) -> dict:
    """rollout_correction's keyword options for TRL 1.16's GRPOConfig vllm_importance_sampling_* fields
    (no log-ratio clamp, as TRL)."""
    level, mode = TRL_MODES[v.check_choice(OP, vllm_importance_sampling_mode, "mode", TRL_MODES)]
    return dict(
        level=level, mode=mode, clip_max=vllm_importance_sampling_clip_max,
        clip_min=vllm_importance_sampling_clip_min, log_ratio_clamp=None,
    )  # fmt: skip
