"""verl's `core_algos` functions on rlkernels' kernels, with verl 0.9.1's signatures and return conventions.

Each function below takes the arguments of the verl function of the same name
(verl/trainer/ppo/core_algos.py, verl 0.9.1) and returns what it returns, computed by rlkernels' fused
kernels instead of verl's Python loops and eager tensor ops:

    agg_loss                                        rk.agg_loss (cast to loss_mat's dtype, as verl returns)
    kl_penalty                                      rk.kl_penalty
    compute_policy_loss_vanilla                     rk.policy_loss(dual_clip=clip_ratio_c)
    compute_policy_loss_gspo / _sapo / _cispo       rk.policy_loss(level="sequence" / objective=...)
    compute_policy_loss_gpg / _dro / _dppo_tv / _dppo_kl / _geo_mean / _clip_cov / _kl_cov
                                                    rk.policy_loss(objective=...)
    compute_value_loss                              rk.value_loss
    FusedLinearForPPO, linear_cross_entropy         rk.linear_logprobs(return_entropy=True): verl's fused
                                                    log-prob / entropy path (model.use_fused_kernels=True)

and the advantage estimators (rlkernels/integrations/verl_advantages.py, re-exported here), registered by
install() under "rlk_" + verl's name:

    rlk_gae              compute_gae_advantage_return                    rk.gae(whiten=True)
    rlk_grpo (+ _vectorized)
                         compute_grpo_outcome_advantage (+ _vectorized)  rk.group_advantages "grpo"/"dr_grpo"
    rlk_gdpo             compute_gdpo_outcome_advantage                  rk.gdpo_advantages
    rlk_grpo_passk       compute_grpo_passk_outcome_advantage            rk.grpo_passk_advantages
    rlk_rloo (+ _vectorized)
                         compute_rloo_outcome_advantage (+ _vectorized)  rk.group_advantages "rloo"
    rlk_reinforce_plus_plus
                         compute_reinforce_plus_plus_outcome_advantage   rk.discounted_returns + whitening
    rlk_reinforce_plus_plus_baseline
                         compute_reinforce_plus_plus_baseline_outcome_advantage
                                                                         rk.reinforce_plus_plus_baseline_advantages
    rlk_remax            compute_remax_outcome_advantage                 rk.remax_advantages
    rlk_opo              compute_opo_outcome_advantage                   rk.opo_advantages
    rlk_gpg              compute_gpg_outcome_advantage                   rk.gpg_advantages
    rlk_optimal_token_baseline
                         compute_optimal_token_baseline_advantage        rk.optimal_token_baseline_advantages
    rlk_tir_optimal_token_baseline
                         compute_multi_turn_optimal_token_baseline_advantage
                                                                         the same on left-compacted tokens

`install()` puts them into verl's registries: the policy loss under its own name (verl's
POLICY_LOSS_REGISTRY takes overrides, so `actor.policy_loss.loss_mode="vanilla"` then runs ours), the
advantage estimators under names of their own ("rlk_gae", "rlk_grpo", ...: verl refuses to re-register a
name), selected with `algorithm.adv_estimator="rlk_grpo"`. verl 0.9.1's trainer gives gdpo's per-key
rewards and the optimal token baselines' log-probs only to verl's own names (see verl_advantages): for
those, `install(replace_estimators=True)` puts ours under verl's own names instead (its registry entries,
and the `core_algos.compute_gae_advantage_return` / `compute_grpo_outcome_advantage` that its trainer calls
directly), so `algorithm.adv_estimator="gdpo"` then runs ours with everything verl passes. It also
replaces the two entry points of verl's fused kernels (`fused_kernel_options.impl_backend` "torch" and
"triton"), which verl's model forwards import at call time:
`verl.utils.experimental.torch_functional.FusedLinearForPPO` and
`verl.utils.kernel.linear_cross_entropy.linear_cross_entropy`. And it gives the modules whose losses call
`agg_loss` (the actor's entropy and KL terms; AGG_LOSS_CALLERS) this module's, the fused `rk.agg_loss`.

Differences from verl 0.9.1, all on purpose (docs/semantics.md): a fully masked micro-batch gives a loss of
0 where verl divides by 0; `seq-mean-token-mean` divides by the token count exactly where verl adds 1e-8
(the same number in fp32); a group of equal rewards gets an advantage of exactly 0; GSPO's sequence
log-ratio is clamped to ±20 like every other log-ratio (verl: at 10, from above only), which matters only
for a sequence whose mean log-ratio exceeds 10 (a ratio over 22026). The estimators' own differences are
listed in verl_advantages.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

import rlkernels as rk
from rlkernels.integrations.verl_advantages import (  # noqa: F401  (re-exported: verl's names)
    ADVANTAGE_ESTIMATORS,
    compute_gae_advantage_return,
    compute_gdpo_outcome_advantage,
    compute_gpg_outcome_advantage,
    compute_grpo_outcome_advantage,
    compute_grpo_passk_outcome_advantage,
    compute_grpo_vectorized_outcome_advantage,
    compute_multi_turn_optimal_token_baseline_advantage,
    compute_opo_outcome_advantage,
    compute_optimal_token_baseline_advantage,
    compute_reinforce_plus_plus_baseline_outcome_advantage,
    compute_reinforce_plus_plus_outcome_advantage,
    compute_remax_outcome_advantage,
    compute_rloo_outcome_advantage,
    compute_rloo_vectorized_outcome_advantage,
)

VERL_VERSION = "0.9.1"

# verl's modules whose losses call `agg_loss` by the name they imported from core_algos, and core_algos
# itself: the actor's entropy and KL terms (verl/workers/utils/losses.py) and the distillation losses.
# install() gives them this module's (the fused op: two launches, where verl's composition takes two
# dozen). The trainers' metric-only calls (ray_trainer's in-reward KL) keep verl's.
AGG_LOSS_CALLERS = (
    "verl.trainer.ppo.core_algos",
    "verl.workers.utils.losses",
    "verl.trainer.distillation.losses",
)

# verl's registered name -> our function's name in this module.
POLICY_LOSSES = {
    "vanilla": "compute_policy_loss_vanilla",
    "gspo": "compute_policy_loss_gspo",
    "sapo": "compute_policy_loss_sapo",
    "cispo": "compute_policy_loss_cispo",
    "gpg": "compute_policy_loss_gpg",
    "dro": "compute_policy_loss_dro",
    "dppo_tv": "compute_policy_loss_dppo_tv",
    "dppo_kl": "compute_policy_loss_dppo_kl",
    "geo_mean": "compute_policy_loss_geo_mean",
    "clip_cov": "compute_policy_loss_clip_cov",
    "kl_cov": "compute_policy_loss_kl_cov",
}


def _agg_kwargs(
    loss_agg_mode, dp_size=1, batch_num_tokens=None, global_batch_size=None, loss_scale_factor=None
):
    """rk's aggregation keyword arguments from verl's `agg_loss` arguments (and `config.global_batch_info`),
    with verl's errors for a data-parallel call that lacks its global normalizer."""
    if dp_size > 1 and loss_agg_mode == "token-mean" and batch_num_tokens is None:
        raise ValueError("(global) batch_num_tokens is required when dp_size > 1")
    if dp_size > 1 and loss_agg_mode.startswith("seq-mean") and global_batch_size is None:
        raise ValueError("global_batch_size is required when dp_size > 1")
    return dict(
        agg=loss_agg_mode,
        dp_size=int(dp_size),
        num_tokens=batch_num_tokens,
        num_seqs=global_batch_size,
        norm_len=loss_scale_factor,
    )


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str,
    dp_size: int = 1,
    batch_num_tokens=None,
    global_batch_size=None,
    loss_scale_factor=None,
) -> torch.Tensor:
    """verl `agg_loss`: loss_mat [B, T] float, loss_mask [B, T] (bool or float) -> a 0-dim tensor in
    loss_mat's dtype, differentiable in loss_mat. loss_agg_mode: "token-mean", "token-sum",
    "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm" (divided by loss_scale_factor,
    default T)."""
    kw = _agg_kwargs(loss_agg_mode, dp_size, batch_num_tokens, global_batch_size, loss_scale_factor)
    return rk.agg_loss(loss_mat, loss_mask, kw.pop("agg"), **kw).to(loss_mat.dtype)


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, kl_penalty: str) -> torch.Tensor:
    """verl `kl_penalty`: the per-token [B, T] estimator "kl"/"k1", "abs", "mse"/"k2", "low_var_kl"/"k3"
    (clamped to ±10 as verl), or with a "+" suffix the value with k2's gradient; float dtypes,
    differentiable."""
    return rk.kl_penalty(logprob, ref_logprob, kl_penalty)


def _verl_policy_loss(name: str, doc: str, default_agg: str, metrics: dict, options, fixed_agg=None):
    """A verl policy loss with verl's signature and return, on rk.policy_loss: the clip range and
    global_batch_info from config (an ActorConfig), plus options(config) (rk.policy_loss keywords).
    metrics: verl's metric name -> our stat (None: verl reports 0.0). fixed_agg: an aggregation verl uses
    whatever loss_agg_mode says (SAPO's)."""

    def loss_fn(
        old_log_prob: torch.Tensor,  # [B, T]
        log_prob: torch.Tensor,  # [B, T]
        advantages: torch.Tensor,  # [B, T]
        response_mask: torch.Tensor,  # [B, T]
        loss_agg_mode: str = default_agg,
        config=None,
        rollout_is_weights: torch.Tensor | None = None,  # [B, T]
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        if config is None:
            raise ValueError(f"{name} needs config (an ActorConfig)")
        clip_low = config.clip_ratio_low if config.clip_ratio_low is not None else config.clip_ratio
        clip_high = config.clip_ratio_high if config.clip_ratio_high is not None else config.clip_ratio
        info = dict(getattr(config, "global_batch_info", None) or {})
        loss, stats = rk.policy_loss(
            log_prob, old_log_prob, advantages, response_mask, clip_low=clip_low, clip_high=clip_high,
            is_weights=rollout_is_weights, **_agg_kwargs(fixed_agg or loss_agg_mode, **info),
            **options(config),
        )  # fmt: skip
        return loss, {key: 0.0 if stat is None else stats[stat].item() for key, stat in metrics.items()}

    loss_fn.__name__ = loss_fn.__qualname__ = name
    loss_fn.__doc__ = doc
    return loss_fn


def _dual_clip(config) -> dict:
    clip_ratio_c = config.get("clip_ratio_c", 3.0)
    if not clip_ratio_c > 1.0:
        raise ValueError(f"clip_ratio_c (dual-clip PPO's lower bound) must be > 1.0, got {clip_ratio_c}")
    return {"dual_clip": clip_ratio_c}


# verl's metrics of the clipped objectives; vanilla reports its dual-clip fraction as the "lower" one.
_CLIP_METRICS = {
    "actor/pg_clipfrac": "clipfrac",
    "actor/ppo_kl": "approx_kl",
    "actor/pg_clipfrac_lower": None,
}

compute_policy_loss_vanilla = _verl_policy_loss(
    "compute_policy_loss_vanilla",
    """verl `compute_policy_loss_vanilla`: dual-clip PPO on [B, T] log-probs, advantages and mask, with
    config's clip_ratio / clip_ratio_low / clip_ratio_high / clip_ratio_c and global_batch_info. Returns
    (loss, {"actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower"} as Python floats).""",
    "token-mean",
    {**_CLIP_METRICS, "actor/pg_clipfrac_lower": "clipfrac_dual"},
    _dual_clip,
)
compute_policy_loss_gspo = _verl_policy_loss(
    "compute_policy_loss_gspo",
    """verl `compute_policy_loss_gspo`: the clip objective on each row's masked mean log-ratio,
    straight-through per token (rk level="sequence"), no dual clip. Arguments and return as vanilla's;
    "actor/pg_clipfrac_lower" is 0.0 as in verl.""",
    "seq-mean-token-mean",
    _CLIP_METRICS,
    lambda config: {"level": "sequence"},
)
compute_policy_loss_sapo = _verl_policy_loss(
    "compute_policy_loss_sapo",
    """verl `compute_policy_loss_sapo`: -A·σ(τ(r-1))·4/τ with config.tau_pos / tau_neg. Like verl, it always
    aggregates with "seq-mean-token-mean" (loss_agg_mode is not used); the clip fractions are 0.0.""",
    "seq-mean-token-mean",
    {**_CLIP_METRICS, "actor/pg_clipfrac": None},
    lambda config: {"objective": "sapo", "sapo_tau_pos": config.tau_pos, "sapo_tau_neg": config.tau_neg},
    fixed_agg="seq-mean-token-mean",
)
compute_policy_loss_cispo = _verl_policy_loss(
    "compute_policy_loss_cispo",
    """verl `compute_policy_loss_cispo`: -sg(clip(r, 1-clip_ratio_low, 1+clip_ratio_high))·A·logp.
    Arguments and return as vanilla's; "actor/pg_clipfrac_lower" is 0.0 as in verl.""",
    "token-mean",
    _CLIP_METRICS,
    lambda config: {"objective": "cispo"},
)


compute_policy_loss_gpg = _verl_policy_loss(
    "compute_policy_loss_gpg",
    """verl `compute_policy_loss_gpg`: -A·logp (old_log_prob unused). Arguments as vanilla's; no metrics, as
    verl.""",
    "token-mean",
    {},
    lambda config: {"objective": "gpg"},
)


def _dro_beta(config) -> dict:
    beta = getattr(config.policy_loss, "dro_beta", None)
    if beta is None or not beta > 0:
        raise ValueError("policy_loss.dro_beta must be a positive value when using DRO")
    return {"objective": "dro", "dro_beta": beta}


compute_policy_loss_dro = _verl_policy_loss(
    "compute_policy_loss_dro",
    """verl `compute_policy_loss_dro`: -(A·logp - ½β·(logp - old_logp)²) with β = config.policy_loss.dro_beta.
    Arguments as vanilla's; metrics {"actor/ppo_kl"} (the mean of the ±20-clamped log-ratio, as every rk
    objective; verl leaves this one unclamped, a difference only past a ratio of e^20).""",
    "token-mean",
    {"actor/ppo_kl": "approx_kl"},
    _dro_beta,
)


def _dppo(objective: str):
    def options(config) -> dict:
        return {"objective": objective, "ratio_cap": config.get("clip_ratio_c", 20.0)}

    return options


# DPPO reports the dropped fraction, and as its "lower" fraction the kept tokens whose ratio is truncated.
_DPPO_METRICS = {**_CLIP_METRICS, "actor/pg_clipfrac_lower": "clipfrac_dual"}
compute_policy_loss_dppo_tv = _verl_policy_loss(
    "compute_policy_loss_dppo_tv",
    """verl `compute_policy_loss_dppo_tv` (DPPO-Binary-TV): -A·sg(min(r, clip_ratio_c))·logp on the tokens
    whose probability moved by at most clip_ratio_high up (A > 0) / clip_ratio_low down (A <= 0). Arguments
    and return as vanilla's.""",
    "token-mean",
    _DPPO_METRICS,
    _dppo("dppo_tv"),
)
compute_policy_loss_dppo_kl = _verl_policy_loss(
    "compute_policy_loss_dppo_kl",
    """verl `compute_policy_loss_dppo_kl` (DPPO-Binary-KL): as dppo_tv with the binary KL between the old and
    new token probabilities as the divergence. Arguments and return as vanilla's.""",
    "token-mean",
    _DPPO_METRICS,
    _dppo("dppo_kl"),
)


def compute_policy_loss_geo_mean(
    old_log_prob: torch.Tensor,  # [B, T]
    log_prob: torch.Tensor,  # [B, T]
    advantages: torch.Tensor,  # [B, T]
    response_mask: torch.Tensor,  # [B, T]
    loss_agg_mode: str = "token-mean",
    config=None,
    rollout_is_weights: torch.Tensor | None = None,  # [B, T]
) -> tuple[torch.Tensor, dict[str, Any]]:
    """verl 0.9.1 `compute_policy_loss_geo_mean` (GMPO): the mean over all B rows of -Ā·R, Ā the row's masked
    mean advantage and R = exp of the row's masked mean of sign-clipped log-ratios (each token clipped by
    the sign of its own advantage; clip range clip_ratio_low / clip_ratio_high, in log space). Like verl it
    ignores loss_agg_mode and global_batch_info, and weights each row by the geometric mean of its tokens'
    rollout_is_weights. The loss's gradient is verl's: d/dlogp_t = -Ā·R·(1/n)·[token t's log-ratio not
    clipped]. With sequence-level advantages (constant along each row's masked tokens) that is rk's
    straight-through per-token form, computed by rk.policy_loss; with token-level advantages rk's form
    weighs token t by its own A_t instead of Ā, so the loss is then computed by _geo_mean_token_level in
    eager PyTorch. Telling the two apart costs a host sync (so do the metrics). Returns (loss 0-dim,
    {"actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower"} as Python floats) as verl."""
    if config is None:
        raise ValueError("compute_policy_loss_geo_mean needs config (an ActorConfig)")
    clip_low = config.clip_ratio_low if config.clip_ratio_low is not None else config.clip_ratio
    clip_high = config.clip_ratio_high if config.clip_ratio_high is not None else config.clip_ratio
    is_weights = None
    if rollout_is_weights is not None:  # verl: exp(Σ m·log(w + 1e-10) / (Σ m + 1e-8)) per row
        m = response_mask.to(rollout_is_weights.dtype)
        log_w = (torch.log(rollout_is_weights + 1e-10) * m).sum(-1) / (m.sum(-1) + 1e-8)
        is_weights = torch.exp(log_w)
    metrics = {
        "actor/pg_clipfrac": "clipfrac_high",
        "actor/ppo_kl": "approx_kl",
        "actor/pg_clipfrac_lower": "clipfrac_low",
    }
    if _varies_along_rows(advantages, response_mask):
        loss, stats = _geo_mean_token_level(
            log_prob, old_log_prob, advantages, response_mask, clip_low, clip_high, is_weights
        )
    else:
        loss, stats = rk.policy_loss(
            log_prob, old_log_prob, advantages, response_mask, objective="geo_mean", clip_low=clip_low,
            clip_high=clip_high, is_weights=is_weights, agg="seq-mean-token-mean", num_seqs=log_prob.shape[0],
        )  # fmt: skip
    return loss, {key: stats[stat].item() for key, stat in metrics.items()}


def _varies_along_rows(advantages: torch.Tensor, mask: torch.Tensor) -> bool:
    """Whether some row's advantages [B, T] differ between two of its masked tokens (a host sync)."""
    on = mask != 0
    highest = torch.where(on, advantages, float("-inf")).amax(-1)
    lowest = torch.where(on, advantages, float("inf")).amin(-1)
    return bool((highest > lowest).any())


def _geo_mean_token_level(logp, old_logp, advantages, mask, clip_low, clip_high, is_weights):
    """verl's GMPO loss as verl writes it, for token-level advantages: logp, old_logp, advantages, mask
    [B, T], is_weights [B] or None -> (loss 0-dim, stats as rk.policy_loss's: clipfrac_high / clipfrac_low /
    approx_kl). R's gradient reaches every token of the row through its mean log-ratio, weighed by the
    row's Ā. The conventions are the kernels' (rlkernels/reference/policy_loss.py): exact division by the
    token count (verl adds 1e-8) and the row's log-ratio clamped to ±20, so that this agrees with the
    kernel path where both apply."""
    from rlkernels.reference.aggregation import masked_mean
    from rlkernels.reference.policy_loss import LOG_RATIO_BOUND, sequence_bounds, sequence_token_log_ratio

    m = mask.to(logp.dtype)
    on = m != 0
    count = m.sum(-1)
    count = torch.where(count > 0, count, 1)
    x = sequence_token_log_ratio(logp, old_logp, advantages, "geo_mean", clip_low, clip_high)
    ratio = torch.exp(torch.clamp(torch.where(on, x * m, 0).sum(-1) / count, *sequence_bounds("geo_mean")))
    adv_mean = torch.where(on, advantages * m, 0).sum(-1) / count
    rows = -adv_mean * ratio
    if is_weights is not None:
        rows = rows * is_weights
    raw = logp.detach() - old_logp
    outside = (raw < -clip_low) | (raw > clip_high)
    stats = {
        "clipfrac_high": masked_mean((outside & (advantages > 0)).to(logp.dtype), mask),
        "clipfrac_low": masked_mean((outside & (advantages < 0)).to(logp.dtype), mask),
        "approx_kl": masked_mean(-torch.clamp(raw, -LOG_RATIO_BOUND, LOG_RATIO_BOUND), mask),
    }
    return rows.mean(), stats


def _cov_options(config, kind: str) -> rk.CovOptions:
    pl = config.policy_loss

    def get(name, default):
        value = getattr(pl, name, None)
        return default if value is None else value

    if kind == "clip_cov":
        return rk.CovOptions(
            ratio=get("clip_cov_ratio", 2e-4), lower=get("clip_cov_lb", 1.0), upper=get("clip_cov_ub", 5.0)
        )
    return rk.CovOptions(ratio=get("kl_cov_ratio", 2e-4), kl_coef=get("ppo_kl_coef", 1.0))


compute_policy_loss_clip_cov = _verl_policy_loss(
    "compute_policy_loss_clip_cov",
    """verl `compute_policy_loss_clip_cov`: the clip objective (no dual clip) with the policy term of a random
    clip_cov_ratio of the unclipped tokens whose covariance lies in (clip_cov_lb, clip_cov_ub) dropped.
    verl draws them with the global RNG, rk from its own uniform keys (the same when every candidate is
    taken). Metrics {"actor/pg_clipfrac": the dropped fraction, "actor/ppo_kl"}, as verl.""",
    "token-mean",
    {"actor/pg_clipfrac": "cov_selected", "actor/ppo_kl": "approx_kl"},
    lambda config: {"objective": "clip_cov", "cov_options": _cov_options(config, "clip_cov")},
)


def compute_policy_loss_kl_cov(
    old_log_prob: torch.Tensor,  # [B, T]
    log_prob: torch.Tensor,  # [B, T]
    advantages: torch.Tensor,  # [B, T]
    response_mask: torch.Tensor,  # [B, T]
    loss_agg_mode: str = "token-mean",
    config=None,
    rollout_is_weights: torch.Tensor | None = None,  # [B, T]
) -> tuple[torch.Tensor, dict[str, Any]]:
    """verl `compute_policy_loss_kl_cov`: -A·r, plus ppo_kl_coef·|logp - old_logp| on the kl_cov_ratio of
    tokens with the largest covariance. Returns (loss, {"actor/ppo_kl": the masked mean |log-ratio|})."""
    if config is None:
        raise ValueError("compute_policy_loss_kl_cov needs config (an ActorConfig)")
    info = dict(getattr(config, "global_batch_info", None) or {})
    loss, _ = rk.policy_loss(
        log_prob, old_log_prob, advantages, response_mask, objective="kl_cov",
        cov_options=_cov_options(config, "kl_cov"), is_weights=rollout_is_weights,
        **_agg_kwargs(loss_agg_mode, **info),
    )  # fmt: skip
    m = response_mask.to(log_prob.dtype)
    abs_kl = ((log_prob.detach() - old_log_prob).abs() * m).sum() / m.sum().clamp(min=1)
    return loss, {"actor/ppo_kl": abs_kl.item()}


def compute_value_loss(
    vpreds: torch.Tensor,
    returns: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange_value: float,
    loss_agg_mode: str = "token-mean",
    dp_size: int = 1,
    batch_num_tokens=None,
    global_batch_size=None,
    loss_scale_factor=None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """verl `compute_value_loss`: 0.5·agg(max((vpreds - returns)², (clip(vpreds, values ± cliprange_value) -
    returns)²)) on [B, T] tensors; returns (loss, clip fraction), 0-dim tensors, the loss differentiable in
    vpreds."""
    loss, stats = rk.value_loss(
        vpreds, values, returns, response_mask, clip=cliprange_value,
        **_agg_kwargs(loss_agg_mode, dp_size, batch_num_tokens, global_batch_size, loss_scale_factor),
    )  # fmt: skip
    return loss, stats["clipfrac"]


class FusedLinearForPPO(torch.nn.Module):
    """verl `FusedLinearForPPO` (verl/utils/experimental/torch_functional.py) on rk.linear_logprobs.

    forward(hidden_states [B, T, D] or [N, D], vocab_weights [V, D], input_ids [B, T] or [N] int,
    temperature=1.0) -> (log_probs fp32, entropy in hidden_states' dtype), each of input_ids' shape, both
    differentiable in hidden_states and vocab_weights. chunk_size is verl's token chunk, a memory knob of
    its own implementation; rk.linear_logprobs streams the vocabulary instead, so it is accepted and not
    needed. impl_backend: verl's choice between its torch and Liger paths; both run rlkernels here."""

    def __init__(self, chunk_size: int = 512, impl_backend: str = "torch"):
        super().__init__()
        if impl_backend not in ("torch", "liger"):
            raise ValueError(
                f"Unsupported FusedLinearForPPO backend: {impl_backend}. Choose 'torch' or 'liger'."
            )
        self.chunk_size, self.impl_backend = chunk_size, impl_backend

    def forward(self, hidden_states, vocab_weights, input_ids, temperature: float = 1.0):
        logp, entropy = rk.linear_logprobs(
            hidden_states, vocab_weights, input_ids.to(torch.int64), temperature=float(temperature),
            return_entropy=True,
        )  # fmt: skip
        return logp, entropy.to(hidden_states.dtype)


def linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    temperature: float = 1.0,
    reduction: str = "none",
    dist_process_group=None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """verl `linear_cross_entropy` (verl/utils/kernel/linear_cross_entropy.py) on rk.linear_logprobs.

    hidden [B, T, D] or [N, D], weight [V, D] (with dist_process_group: this rank's contiguous vocabulary
    shard [V_local, D], labels global ids), labels [B, T] or [N] int -> (log_probs fp32 [N], or their sum /
    mean for reduction "sum" / "mean"; entropy fp32 [N]), differentiable in hidden and weight. Unlike
    verl's Triton kernels it runs on every backend, CPU included."""
    if reduction not in ("none", "sum", "mean"):
        raise ValueError(
            f"linear_cross_entropy: reduction must be 'none', 'sum' or 'mean', got {reduction!r}"
        )
    logp, entropy = rk.linear_logprobs(
        hidden.reshape(-1, hidden.shape[-1]), weight, labels.reshape(-1).to(torch.int64),
        temperature=float(temperature), return_entropy=True, process_group=dist_process_group,
    )  # fmt: skip
    if reduction == "sum":
        logp = logp.sum()
    elif reduction == "mean":
        logp = logp.mean()
    return logp, entropy


def install(*, replace_estimators: bool = False) -> None:
    """Register this module's functions into the installed verl's registries (see the module docstring).
    The advantage estimators go under "rlk_" + verl's name, and with replace_estimators=True under verl's
    own names as well (replacing verl's). Raises ModuleNotFoundError (an ImportError) naming the install
    commands when verl or what its core_algos imports is not installed, and RuntimeError when its version
    is not the one these functions follow."""
    if not isinstance(replace_estimators, bool):
        raise TypeError(
            f"install: replace_estimators must be a bool, got {type(replace_estimators).__name__}"
        )
    try:
        import verl
        from verl.trainer.ppo import core_algos
    except ModuleNotFoundError as e:
        raise ModuleNotFoundError(
            f"rlkernels.integrations.verl.install() needs verl {VERL_VERSION} ({e}): pip install "
            f"'rlkernels[integrations]' && pip install --no-deps verl=={VERL_VERSION}",
            name=e.name,
        ) from e
    if verl.__version__ != VERL_VERSION:
        raise RuntimeError(
            f"rlkernels.integrations.verl follows verl {VERL_VERSION}, found {verl.__version__}"
        )
    for name, fn in POLICY_LOSSES.items():
        core_algos.POLICY_LOSS_REGISTRY[name] = globals()[fn]
    for name, fn in ADVANTAGE_ESTIMATORS.items():
        core_algos.register_adv_est(name)(globals()[fn])
        if replace_estimators:  # verl's register_adv_est refuses a second function under its names
            core_algos.ADV_ESTIMATOR_REGISTRY[name.removeprefix("rlk_")] = globals()[fn]
    if replace_estimators:  # verl's trainer calls these two by attribute, not through the registry
        core_algos.compute_gae_advantage_return = compute_gae_advantage_return
        core_algos.compute_grpo_outcome_advantage = compute_grpo_outcome_advantage
    for module in AGG_LOSS_CALLERS:
        try:
            importlib.import_module(module).agg_loss = agg_loss
        except ModuleNotFoundError:  # a part of verl whose own imports are missing cannot call it either
            continue
    from verl.utils.experimental import torch_functional
    from verl.utils.kernel import linear_cross_entropy as lce

    torch_functional.FusedLinearForPPO = FusedLinearForPPO
    lce.linear_cross_entropy = linear_cross_entropy
