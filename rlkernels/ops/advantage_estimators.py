"""Advantage estimators picked by name as in verl 0.9.1 (`algorithm.adv_estimator`) and TRL 1.16's GRPO
reward scaling: input validation, backend selection and the public functions. The math is
rlkernels/reference/advantage_estimators.py. On the kernel backends the estimators run on the ops' fused
forms (docs/gpu_token_ops.md, "The advantage estimators"): the returns scan with its ReMax baseline or
REINFORCE++ whitening (ops/gae.py), the group kernels (ops/advantages.py, the sort of the ids included), the
token broadcast `advantage_tokens`, and `whitened_group_tokens` for verl's masked whitening of group
advantages (gdpo, reinforce_plus_plus_baseline), each checking the values it reads into one flag asserted
once; grpo_passk and opo have kernels of their own for the per-response advantage (the ops
`rlkernels::grpo_passk` / `opo`: C++ CPU, CUDA C++, and Triton in rlkernels/triton/outcome_estimators.py).
The reference backend runs the reference's torch ops. The advantages are constants for the policy loss: no
autograd.

Every estimator computes in fp32 (fp64 for fp64 inputs) and returns its outputs in the scores' (or token
rewards') dtype.
"""

from __future__ import annotations

import inspect

import torch

from rlkernels import _validate as v
from rlkernels._backend import select_backend
from rlkernels._dtypes import acc_dtype
from rlkernels.ops import advantages as adv_ops
from rlkernels.ops import gae as gae_ops
from rlkernels.ops._device_values import device_values
from rlkernels.ops._flags import check_flag
from rlkernels.ops._library import register_constant_backends
from rlkernels.ops._token_masks import kernel_mask
from rlkernels.ops.advantages import group_advantages
from rlkernels.ops.gae import discounted_returns
from rlkernels.reference import advantage_estimators as reference
from rlkernels.reference.advantage_estimators import TRL_AGGREGATIONS, TRL_EPS, TRL_SCALE_MODES
from rlkernels.reference.advantages import ZERO_SINGLES_SUFFIX, broadcast_to_tokens

VERL_VERSION = "0.9.1"
TRL_VERSION = "1.16.0"


@torch.library.custom_op("rlkernels::grpo_passk_triton", mutates_args=())
def _grpo_passk_triton(
    scores: torch.Tensor, group_ids: torch.Tensor, eps: float, norm_by_std: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    from rlkernels.triton.outcome_estimators import grpo_passk_forward

    return grpo_passk_forward(scores, group_ids, eps, norm_by_std)


@torch.library.custom_op("rlkernels::opo_triton", mutates_args=())
def _opo_triton(
    scores: torch.Tensor, mask: torch.Tensor, group_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    from rlkernels.triton.outcome_estimators import opo_forward

    return opo_forward(scores, mask, group_ids)


def _per_response_fake(scores, *rest):
    return scores.new_empty(scores.shape), scores.new_empty((), dtype=torch.bool)


# name -> backend -> launcher of the per-response advantages [B]
_PER_RESPONSE = {
    name: register_constant_backends(name, fake=_per_response_fake) for name in ("grpo_passk", "opo")
}
_REFERENCE_PER_RESPONSE = {"grpo_passk": reference.grpo_passk_scores}  # opo_advantages selects its own


def _per_response(name: str, backend: str, device: torch.device):
    """The per-response function of grpo_passk on the resolved backend (opo's kernels take the mask, and
    opo_advantages resolves its backend itself)."""
    launch = _PER_RESPONSE[name]
    backend = select_backend(name, backend, device, implemented=tuple(launch))
    return _REFERENCE_PER_RESPONSE[name] if backend == "reference" else launch[backend]


@torch.library.custom_op("rlkernels::optimal_token_baseline_triton", mutates_args=())
def _optimal_token_baseline_triton(
    rewards: torch.Tensor,
    mask: torch.Tensor,
    group_ids: torch.Tensor,
    old_logp: torch.Tensor,
    sum_pi_squared: torch.Tensor,
    rollout_is_weights: torch.Tensor | None,
    handle_zero_tail: bool,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    from rlkernels.triton.optimal_token_baseline import optimal_token_baseline_forward

    return optimal_token_baseline_forward(
        rewards, mask, group_ids, old_logp, sum_pi_squared, rollout_is_weights, handle_zero_tail, eps
    )


def _optimal_token_baseline_fake(rewards, *rest):
    return (
        rewards.new_empty(rewards.shape),
        rewards.new_empty(rewards.shape),
        rewards.new_empty((), dtype=torch.bool),
    )


# backend -> launcher of (advantages, returns, ok): the whole estimator, its values checked by the kernels
_OPTIMAL_TOKEN_BASELINE = register_constant_backends(
    "optimal_token_baseline", fake=_optimal_token_baseline_fake
)


def _kernels(backend: str) -> reference.Kernels:
    """The reference math's two building blocks as the public, backend-dispatched ops."""
    return reference.Kernels(
        lambda r, ids, mode, eps: group_advantages(r, group_ids=ids, mode=mode, eps=eps, backend=backend),
        lambda r, m, gamma: discounted_returns(r, m, gamma=gamma, backend=backend),
    )


def _group_backend(backend: str, device: torch.device) -> str:
    """The backend the group kernels run on (select_backend of group_advantages)."""
    return select_backend("group_advantages", backend, device, implemented=tuple(adv_ops._LAUNCH))


def _group_tokens(op: str, scores, ids, mode: str, eps: float, mask, backend: str):
    """The per-response group advantages of `mode` (one kernel after the ids' sort) broadcast to the tokens
    times the mask, each kernel checking what it reads into one flag, asserted once (ops/advantages.py)."""
    adv, ok = adv_ops._LAUNCH[backend](scores, ids, 0, mode, eps)
    return adv_ops.to_tokens(
        op, adv, ok, mask, backend, message=f"{op}: {adv_ops.BAD_VALUES}",
        eager_checks=lambda: v.check_finite(op, scores, "scores"),
    )  # fmt: skip


def _kernel_tokens(op: str, scores, per_response, mask, backend: str):
    """The per-response advantages of a grpo_passk / opo kernel, (advantages, ok: its scores finite),
    broadcast to the tokens: the kernel's flag folded into the token broadcast's, asserted once with the
    mask's values (CPU tensors: the eager checks, once the flag is down)."""
    adv, ok = per_response
    be = _group_backend(backend, adv.device)
    return adv_ops.to_tokens(
        op, adv, ok, mask, be,
        message=f"{op}: {adv_ops.BAD_VALUES}", eager_checks=lambda: v.check_finite(op, scores, "scores"),
    )  # fmt: skip


def _float(op: str, x, name: str, shape, shape_of: str, dtype: torch.dtype, *, finite=True, nonneg=False):
    """A float tensor of exactly `shape`, checked and cast to the compute dtype, outside autograd."""
    v.check_float(op, x, name)
    v.check_shape(op, x, name, shape, shape_of)
    if nonneg:
        v.check_nonnegative(op, x, name)
    elif finite:
        v.check_finite(op, x, name)
    return x.detach().to(dtype)


def _scores(op: str, scores, ndims=(1,)) -> torch.Tensor:
    v.check_float(op, scores, "scores")
    v.check_ndim(op, scores, "scores", ndims)
    if scores.dim() == 2 and scores.shape[1] == 0:
        raise ValueError(f"{op}: scores [B, K] need at least one reward column, got {tuple(scores.shape)}")
    return scores


def _mask(op: str, mask, b: int) -> torch.Tensor:
    v.check_tensor(op, mask, "mask")
    if mask.dim() != 2 or mask.shape[0] != b:
        raise ValueError(
            f"{op}: mask must be [B, T] with B = {b} (the scores' rows), got {tuple(mask.shape)}"
        )
    return v.check_mask(op, mask, "mask", mask.shape, "mask")


def _ids(op: str, group_ids, b: int) -> torch.Tensor:
    if group_ids is None:
        raise ValueError(f"{op}: group_ids is required ([B] int ids, equal ids form a group)")
    v.check_index(op, group_ids, "group_ids")
    v.check_shape(op, group_ids, "group_ids", (b,), "scores' rows")
    return group_ids


def _outcome_inputs(op, scores, mask, group_ids, ndims=(1,), *, values=True):
    """Checks of the outcome estimators' inputs; returns (scores in the compute dtype, mask, ids). values:
    check the scores' and the mask's values here (else the kernels that read them do)."""
    _scores(op, scores, ndims)
    b = scores.shape[0]
    _mask(op, mask, b)
    _ids(op, group_ids, b)
    v.check_same_device(op, scores=scores, mask=mask, group_ids=group_ids)
    s = scores.detach()
    s = s if s.dtype == acc_dtype(scores.dtype) else s.to(acc_dtype(scores.dtype))
    if not values:
        return s, mask, group_ids
    v.check_finite(op, scores, "scores")
    return s, v.mask_values(op, mask), group_ids


def _token_inputs(op, rewards, mask):
    v.check_float(op, rewards, "rewards")
    v.check_ndim(op, rewards, "rewards", (2,))
    v.check_mask(op, mask, "mask", rewards.shape, "rewards")
    return rewards


def _bool(op: str, value, name: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{op}: {name} must be a bool, got {type(value).__name__}")
    return value


def _weights(op: str, weights, k: int, device, dtype) -> torch.Tensor:
    """Reward weights: None (all 1), a sequence of K numbers or a [K] float tensor."""
    if weights is None:
        return torch.ones(k, dtype=dtype, device=device)
    if not isinstance(weights, torch.Tensor):
        if isinstance(weights, (str, bytes)) or not hasattr(weights, "__len__"):
            raise TypeError(f"{op}: weights must be a sequence of numbers or a float tensor, got {weights!r}")
        for i, w in enumerate(weights):
            v.check_number(op, w, f"weights[{i}]")
        weights = device_values([float(w) for w in weights], dtype, device)  # no host-to-device copy
    else:
        v.check_float(op, weights, "weights")
        v.check_finite(op, weights, "weights")
    if tuple(weights.shape) != (k,):
        raise ValueError(
            f"{op}: weights must have one entry per reward column ({k}), got shape {tuple(weights.shape)}"
        )
    if weights.device != device:
        raise ValueError(f"{op}: weights on {weights.device} but scores on {device}")
    return weights.detach().to(dtype)


def _out(pair, dtype):
    adv, ret = pair
    adv = adv.to(dtype)
    return adv, (adv if ret is pair[0] else ret.to(dtype))


@v.keyword_options
def gdpo_advantages(
    scores: torch.Tensor,
    mask: torch.Tensor,
    *,
    group_ids: torch.Tensor,
    weights=None,
    eps: float = 1e-6,
    norm_by_std: bool = True,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """GDPO (verl 0.9.1 `compute_gdpo_outcome_advantage`, adv_estimator="gdpo"): each reward key normalized
    within its groups, then a weighted sum, then verl's masked whitening over all response tokens.

    A_i = Σ_k w_k (s_ik - mean_g) / (std_g + eps) (unbiased std; without norm_by_std: s_ik - mean_g; a group
    of one: mean 0, std 1), then whiten(A_i · m_it) · m_it with the token-weighted batch mean and unbiased
    variance, (x - mean) * rsqrt(var + 1e-8); fewer than two tokens give variance 0, never NaN.
    TRL's multi_objective_aggregation="normalize_then_sum" is a different formula: `trl_grpo_advantages`.

    Args:
        scores: [B] or [B, K] float32/float64/float16/bfloat16, finite: one score per response and reward
            key (verl's `algorithm.gdpo_reward_keys`; [B] is verl's fallback on token_level_rewards.sum(-1)).
        mask: [B, T] response mask: bool, integer 0/1 or float weights >= 0.
        group_ids: [B] int32/int64, any integers in any order (verl's uid index).
        weights: K numbers or a [K] float tensor (verl's `gdpo_reward_weights`); None: all 1.
        eps: added to each group std (>= 0). norm_by_std: verl's norm_adv_by_std_in_grpo.
        backend: "auto" | "triton" | "cuda" | "cpu" | "reference" (that of group_advantages).

    Returns:
        (advantages, advantages): the same [B, T] tensor twice (verl's convention), in scores' dtype.
    """
    op = "gdpo_advantages"
    s, _, ids = _outcome_inputs(op, scores, mask, group_ids, ndims=(1, 2), values=False)
    s = s if s.dim() == 2 else s[:, None]
    w = None if weights is None else _weights(op, weights, s.shape[1], s.device, s.dtype)
    eps = float(v.check_number(op, eps, "eps", ge=0))
    norm_by_std = _bool(op, norm_by_std, "norm_by_std")
    be = _group_backend(backend, s.device)
    if be == "reference":
        v.check_finite(op, scores, "scores")
        w = _weights(op, weights, s.shape[1], s.device, s.dtype) if w is None else w
        adv = reference.gdpo(s, v.mask_values(op, mask), ids, w, eps, norm_by_std, _kernels(be))
        return _out(adv, scores.dtype)
    mode = "grpo" if norm_by_std else "dr_grpo"
    # After the ids' sort one launch takes every key's group pass, their weighted sum and the whitening
    # statistics, and one writes the tokens (ops/advantages.py whitened_tokens).
    tokens = adv_ops.whitened_tokens(
        op, s, ids, w, mode, eps, mask, be, eager_checks=lambda: v.check_finite(op, scores, "scores")
    )
    return _out((tokens, tokens), scores.dtype)


@v.keyword_options
def grpo_passk_advantages(
    scores: torch.Tensor,
    mask: torch.Tensor,
    *,
    group_ids: torch.Tensor,
    eps: float = 1e-6,
    norm_by_std: bool = True,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pass@k GRPO (verl 0.9.1 `compute_grpo_passk_outcome_advantage`, adv_estimator="grpo_passk"): only a
    group's best response learns, from the gap to the second best.

    The group's unique best response gets (s_max - s_second) / (std_g + eps) (unbiased std; no division
    without norm_by_std), every other response 0. A tied best (a constant group included) gives the whole
    group 0, as in verl (its gap is 0). A group of one gives 0 where verl raises ValueError.

    Args:
        scores: [B] float, finite. mask: [B, T] response mask (bool, 0/1 integer or float weights >= 0).
        group_ids: [B] int32/int64, any integers in any order.
        eps: >= 0. norm_by_std: verl's config.norm_adv_by_std_in_grpo.
        backend: "auto" | "triton" | "cuda" | "cpu" | "reference".

    Returns:
        (advantages, advantages): the same [B, T] tensor twice, in scores' dtype.
    """
    op = "grpo_passk_advantages"
    s, _, ids = _outcome_inputs(op, scores, mask, group_ids, values=False)
    eps = float(v.check_number(op, eps, "eps", ge=0))
    norm_by_std = _bool(op, norm_by_std, "norm_by_std")
    per_response = _per_response("grpo_passk", backend, s.device)
    if per_response is reference.grpo_passk_scores:
        v.check_finite(op, scores, "scores")
        adv = reference.grpo_passk(s, v.mask_values(op, mask), ids, eps, norm_by_std, per_response)
        return _out(adv, scores.dtype)
    tokens = _kernel_tokens(op, scores, per_response(s, ids, eps, norm_by_std), mask, backend)
    return _out((tokens, tokens), scores.dtype)


@v.keyword_options
def reinforce_plus_plus_advantages(
    rewards: torch.Tensor,
    mask: torch.Tensor,
    *,
    gamma: float = 1.0,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ (verl 0.9.1 `compute_reinforce_plus_plus_outcome_advantage`,
    adv_estimator="reinforce_plus_plus"): discounted returns, whitened over the batch's response tokens.

    G = discounted_returns(rewards, mask, gamma) (a masked position returns 0 and carries the running
    return through), advantages = masked_whiten(G, mask) · mask (batch mean, unbiased variance, eps 1e-8).

    Args:
        rewards: [B, T] token-level rewards, float32/float64/float16/bfloat16, finite.
        mask: [B, T] response mask (bool, 0/1 integer or float weights >= 0).
        gamma: discount in [0, 1] (verl's algorithm.gamma).
        backend: "auto" | "triton" | "cuda" | "cpu" | "reference" (that of discounted_returns).

    Returns:
        (advantages, returns), each [B, T] in rewards' dtype.
    """
    op = "reinforce_plus_plus_advantages"
    _token_inputs(op, rewards, mask)
    r = rewards.detach().to(acc_dtype(rewards.dtype))
    gamma = float(v.check_number(op, gamma, "gamma", ge=0, le=1))
    # One scan that whitens its returns times the mask (ops/gae.py): on the reference backend the reference's
    # masked_whiten.
    returns, adv = gae_ops._returns(op, r, mask, gamma, None, backend, whiten=True)
    return _out((adv, returns), rewards.dtype)


@v.keyword_options
def reinforce_plus_plus_baseline_advantages(
    scores: torch.Tensor,
    mask: torch.Tensor,
    *,
    group_ids: torch.Tensor,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ with a group-mean baseline (verl 0.9.1
    `compute_reinforce_plus_plus_baseline_outcome_advantage`, adv_estimator="reinforce_plus_plus_baseline").

    (s_i - mean_g) · m_it (a group of one: mean 0), then masked_whiten over all response tokens, · m_it.

    Args:
        scores: [B] float, finite. mask: [B, T] response mask (bool, 0/1 integer or float weights >= 0).
        group_ids: [B] int32/int64, any integers in any order.
        backend: "auto" | "triton" | "cuda" | "cpu" | "reference" (that of group_advantages).

    Returns:
        (advantages, advantages): the same [B, T] tensor twice, in scores' dtype.
    """
    op = "reinforce_plus_plus_baseline_advantages"
    s, _, ids = _outcome_inputs(op, scores, mask, group_ids, values=False)
    be = _group_backend(backend, s.device)
    if be == "reference":
        v.check_finite(op, scores, "scores")
        adv = reference.reinforce_plus_plus_baseline(s, v.mask_values(op, mask), ids, _kernels(be))
        return _out(adv, scores.dtype)
    # verl's whitening of the group-centered scores (ops/advantages.py whitened_tokens, as gdpo).
    checks = lambda: v.check_finite(op, scores, "scores")  # noqa: E731
    tokens = adv_ops.whitened_tokens(op, s[:, None], ids, None, "dr_grpo", 0.0, mask, be, eager_checks=checks)
    return _out((tokens, tokens), scores.dtype)


@v.keyword_options
def remax_advantages(
    rewards: torch.Tensor,
    mask: torch.Tensor,
    *,
    reward_baselines: torch.Tensor,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """ReMax (verl 0.9.1 `compute_remax_outcome_advantage`, adv_estimator="remax"): the reward-to-go minus
    the reward of the greedy rollout of the same prompt.

    G = discounted_returns(rewards, mask, gamma=1) (the masked reverse cumulative sum), advantages =
    G - b_i · m_it. verl leaves the reward-to-go at masked positions inside a response (holes); here they
    are 0, in the returns and the advantages (no loss reads them). With fractional float mask weights the
    returns follow discounted_returns ((r_t + G_{t+1}) m_t), where verl sums r·m from t on.

    Args:
        rewards: [B, T] token-level rewards, float, finite.
        mask: [B, T] response mask (bool, 0/1 integer or float weights >= 0).
        reward_baselines: [B] float, finite: each response's greedy-rollout reward.
        backend: "auto" | "triton" | "cuda" | "cpu" | "reference" (that of discounted_returns).

    Returns:
        (advantages, returns), each [B, T] in rewards' dtype.
    """
    op = "remax_advantages"
    _token_inputs(op, rewards, mask)
    dtype = acc_dtype(rewards.dtype)
    # The scan checks the baselines (finite) with the rewards: no check here (ops/gae.py).
    b = _float(
        op, reward_baselines, "reward_baselines", rewards.shape[:1], "rewards' rows", dtype, finite=False
    )
    v.check_same_device(op, rewards=rewards, mask=mask, reward_baselines=reward_baselines)
    r = rewards.detach().to(dtype)
    returns, adv = gae_ops._returns(op, r, mask, 1.0, None, backend, baseline=b)
    return _out((adv, returns), rewards.dtype)


@v.keyword_options
def opo_advantages(
    scores: torch.Tensor,
    mask: torch.Tensor,
    *,
    group_ids: torch.Tensor,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """OPO (verl 0.9.1 `compute_opo_outcome_advantage`, adv_estimator="opo"): a length-weighted group
    baseline, (s_i - Σ_g L_j s_j / Σ_g L_j) · m_it with L_j = Σ_t m_jt.

    A group of one has baseline 0 (as verl); a group whose masks are all empty too (verl: 0 / 0 = NaN).
    A constant group gives exactly 0.

    Args:
        scores: [B] float, finite. mask: [B, T] response mask (bool, 0/1 integer or float weights >= 0).
        group_ids: [B] int32/int64, any integers in any order.
        backend: "auto" | "triton" | "cuda" | "cpu" | "reference".

    Returns:
        (advantages, advantages): the same [B, T] tensor twice, in scores' dtype.
    """
    op = "opo_advantages"
    s, _, ids = _outcome_inputs(op, scores, mask, group_ids, values=False)
    be = select_backend("opo", backend, s.device, implemented=tuple(_PER_RESPONSE["opo"]))
    if be == "reference":
        v.check_finite(op, scores, "scores")
        return _out(reference.opo(s, v.mask_values(op, mask), ids), scores.dtype)
    # The kernel sums each response's length (a float mask: its weights) in its own launch; the token
    # broadcast checks the mask's values.
    per_response = _PER_RESPONSE["opo"][be](s, kernel_mask(op, mask, s.dtype, be), ids)
    tokens = _kernel_tokens(op, scores, per_response, mask, backend)
    return _out((tokens, tokens), scores.dtype)


@v.keyword_options
def gpg_advantages(
    scores: torch.Tensor,
    mask: torch.Tensor,
    *,
    group_ids: torch.Tensor,
    f_norm: float = 1.0,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """GPG (verl 0.9.1 `compute_gpg_outcome_advantage`, adv_estimator="gpg"):
    α · (s_i - mean_g) / f_norm · m_it with α = B / max(#{i: s_i != 0}, 1) (a group of one: mean 0).

    Args:
        scores: [B] float, finite. mask: [B, T] response mask (bool, 0/1 integer or float weights >= 0).
        group_ids: [B] int32/int64, any integers in any order.
        f_norm: > 0 (verl's default 1.0; its trainer passes none).
        backend: "auto" | "triton" | "cuda" | "cpu" | "reference" (that of group_advantages).

    Returns:
        (advantages, advantages): the same [B, T] tensor twice, in scores' dtype.
    """
    op = "gpg_advantages"
    s, _, ids = _outcome_inputs(op, scores, mask, group_ids, values=False)
    f_norm = float(v.check_number(op, f_norm, "f_norm", gt=0))
    be = _group_backend(backend, s.device)
    if be == "reference":
        v.check_finite(op, scores, "scores")
        return _out(reference.gpg(s, v.mask_values(op, mask), ids, f_norm, _kernels(be)), scores.dtype)
    # α / f_norm = B / (f_norm · max(#nonzero, 1)), a batch statistic: the group kernels' gpg mode counts the
    # nonzero scores in the walk that gathers the groups' statistics, its eps carrying B / f_norm.
    tokens = _group_tokens(op, s, ids, "gpg", s.shape[0] / f_norm, mask, be)
    return _out((tokens, tokens), scores.dtype)


@v.keyword_options
def optimal_token_baseline_advantages(
    rewards: torch.Tensor,
    mask: torch.Tensor,
    *,
    group_ids: torch.Tensor,
    old_logp: torch.Tensor,
    sum_pi_squared: torch.Tensor,
    rollout_is_weights: torch.Tensor | None = None,
    handle_zero_tail: bool = True,
    eps: float = 1e-8,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Optimal Token Baseline (verl 0.9.1 `compute_optimal_token_baseline_advantage`,
    adv_estimator="optimal_token_baseline"): a per-position baseline for each group, weighted by the
    cumulative path variance.

    w_t = (1 - 2 exp(old_logp_t) + Σπ²_t) · ρ_t² (ρ = rollout_is_weights, else 1), W_t = Σ_{j<=t} w_j m_j,
    G = the reward-to-go (discounted_returns with gamma 1), b_t = Σ_g G_t W_t m_t / (Σ_g W_t m_t + eps)
    over the group's responses, advantages = (G - b) · m (a group of one: b = 0). handle_zero_tail: a
    group's unique longest response gets b = 0 from the second-longest response's length on.

    Args:
        rewards: [B, T] token-level rewards, float, finite.
        mask: [B, T] response mask (bool, 0/1 integer or float weights >= 0).
        group_ids: [B] int32/int64, any integers in any order.
        old_logp: [B, T] float log-probs of the sampled tokens (-inf allowed: π = 0).
        sum_pi_squared: [B, T] float Σ_v π_v² per token, finite and >= 0
            (rk.linear_logprobs(..., return_sum_pi_squared=True)).
        rollout_is_weights: optional [B, T] float importance weights, finite and >= 0.
        handle_zero_tail: bool (verl's default True). eps: >= 0, added to the baseline's denominator.
        backend: "auto" | "triton" | "cuda" | "cpu" | "reference": the kernel backends run the whole
            estimator as one op that checks the values it reads (C++ on CPU tensors; on a GPU a sort of the
            ids and two kernels, Triton rlkernels/triton/optimal_token_baseline.py or CUDA C++
            csrc/cuda/optimal_token_baseline.cu); "reference" the reference's vectorized torch ops.

    Returns:
        (advantages, returns), each [B, T] in rewards' dtype.
    """
    op = "optimal_token_baseline_advantages"
    _token_inputs(op, rewards, mask)
    _ids(op, group_ids, rewards.shape[0])
    dtype = acc_dtype(rewards.dtype)
    shape = rewards.shape
    kernel = select_backend(
        "optimal_token_baseline", backend, rewards.device, implemented=tuple(_OPTIMAL_TOKEN_BASELINE)
    )
    fused = kernel != "reference"  # the whole estimator in the kernels, which check the values
    weights = dict(finite=not fused, nonneg=not fused)  # the values' checks, where no kernel makes them
    lp = _float(op, old_logp, "old_logp", shape, "rewards", dtype, finite=False)
    sp = _float(op, sum_pi_squared, "sum_pi_squared", shape, "rewards", dtype, **weights)
    isw = None
    if rollout_is_weights is not None:
        isw = _float(op, rollout_is_weights, "rollout_is_weights", shape, "rewards", dtype, **weights)
    v.check_same_device(
        op, rewards=rewards, mask=mask, group_ids=group_ids, old_logp=old_logp,
        sum_pi_squared=sum_pi_squared, rollout_is_weights=rollout_is_weights,
    )  # fmt: skip
    handle_zero_tail = _bool(op, handle_zero_tail, "handle_zero_tail")
    eps = float(v.check_number(op, eps, "eps", ge=0))
    r = rewards.detach().to(dtype)
    if fused:
        m = kernel_mask(op, mask, dtype, kernel)
        adv, returns, ok = _OPTIMAL_TOKEN_BASELINE[kernel](
            r, m, group_ids, lp, sp, isw, handle_zero_tail, eps
        )

        def eager_checks():
            v.check_finite(op, rewards, "rewards")
            v.check_nonnegative(op, sum_pi_squared, "sum_pi_squared")
            v.check_nonnegative(op, rollout_is_weights, "rollout_is_weights")
            v.mask_values(op, mask)

        check_flag(op, ok, _OTB_BAD_VALUES, eager_checks, backend=kernel)
        return _out((adv, returns), rewards.dtype)
    out = reference.optimal_token_baseline(
        r, v.mask_values(op, mask), group_ids, lp, sp, isw, handle_zero_tail, eps, _kernels("reference")
    )
    return _out(out, rewards.dtype)


_OTB_BAD_VALUES = (
    "optimal_token_baseline_advantages: rewards must be finite, sum_pi_squared and rollout_is_weights finite "
    "and >= 0, and a mask's values 0 / 1 (integer) or finite and >= 0 (float)"
)


@v.keyword_options
def trl_grpo_advantages(
    scores: torch.Tensor,
    *,
    group_size: int | None = None,
    group_ids: torch.Tensor | None = None,
    reward_weights=None,
    scale_rewards="group",
    multi_objective_aggregation: str = "sum_then_normalize",
    mask: torch.Tensor | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """GRPO advantages as TRL 1.16's GRPOTrainer forms them from its reward functions' outputs.

    multi_objective_aggregation="sum_then_normalize" (TRL's default): x = Σ_k w_k s_ik, then by
    scale_rewards: "group" (or True) = group_advantages mode "grpo", "batch" = mode "batch", "none" (or
    False) = mode "dr_grpo", each with eps 1e-4. "normalize_then_sum" (TRL's GDPO): each reward normalized
    in its groups, (s_ik - mean_g) / (std_g + 1e-4), weighted and summed, then (x - mean_B) / (std_B + 1e-4)
    over the batch's responses (scale_rewards is not used, as in TRL). Unbiased stds. A group of one gets
    0, as in TRL (its mean is its own reward). TRL's unscorable (NaN) rewards are not accepted: scores must
    be finite.

    Args:
        scores: [B] or [B, K] float, finite: TRL's rewards_per_func (one column per reward function).
        group_size: contiguous groups of this many responses (TRL's num_generations). Or:
        group_ids: [B] int32/int64, any integers in any order. Exactly one of the two.
        reward_weights: K numbers or a [K] float tensor (TRL's reward_weights); None: all 1.
        scale_rewards: "group" | "batch" | "none" | True | False.
        multi_objective_aggregation: "sum_then_normalize" | "normalize_then_sum".
        mask: optional [B, T] response mask: returns advantages[:, None] * mask.
        backend: "auto" | "triton" | "cuda" | "cpu" | "reference" (that of group_advantages).

    Returns:
        [B] (or [B, T] with mask) advantages in scores' dtype.
    """
    op = "trl_grpo_advantages"
    _scores(op, scores, (1, 2))
    b = scores.shape[0]
    if (group_size is None) == (group_ids is None):
        raise ValueError(f"{op}: give exactly one of group_size or group_ids")
    if group_size is not None:
        if isinstance(group_size, bool) or not isinstance(group_size, int):
            raise TypeError(f"{op}: group_size must be an int, got {type(group_size).__name__}")
        if group_size < 1 or b % group_size:
            raise ValueError(f"{op}: group_size must be >= 1 and divide B = {b}, got {group_size}")
    else:
        _ids(op, group_ids, b)
    scale_rewards = {True: "group", False: "none"}.get(scale_rewards, scale_rewards)
    scale_rewards = v.check_choice(op, scale_rewards, "scale_rewards", TRL_SCALE_MODES)
    aggregation = v.check_choice(
        op, multi_objective_aggregation, "multi_objective_aggregation", TRL_AGGREGATIONS
    )
    if mask is not None:
        _mask(op, mask, b)
    v.check_same_device(op, scores=scores, group_ids=group_ids, mask=mask)
    s = scores.detach().to(acc_dtype(scores.dtype))
    s = s if s.dim() == 2 else s[:, None]
    be = _group_backend(backend, s.device)
    if be == "reference":
        ids = group_ids if group_ids is not None else torch.arange(b, device=scores.device) // group_size
        v.check_finite(op, scores, "scores")
        w = _weights(op, reward_weights, s.shape[1], s.device, s.dtype)
        adv = reference.trl_grpo(s, ids, w, scale_rewards, aggregation, _kernels(backend))
        adv = adv.to(scores.dtype)
        return adv if mask is None else broadcast_to_tokens(adv, v.mask_values(op, mask))
    w = None if reward_weights is None else _weights(op, reward_weights, s.shape[1], s.device, s.dtype)
    if aggregation == "sum_then_normalize":
        # one group kernel (+1 with a mask), in its mode with TRL's rule that a group of one gets 0 (the
        # kernels' ZERO_SINGLES flag, the mode's suffix)
        if w is None:
            total = s[:, 0] if s.shape[1] == 1 else s.sum(-1)
        else:
            total = (s * w).sum(-1)
        mode = TRL_SCALE_MODES[scale_rewards] + ZERO_SINGLES_SUFFIX
        adv, ok = adv_ops._LAUNCH[be](total.contiguous(), group_ids, group_size or 0, mode, TRL_EPS)
    else:
        adv, ok = _trl_normalize_then_sum(s, group_ids, group_size, w, be)
    message = f"{op}: {adv_ops.BAD_VALUES}"
    if mask is None:
        check_flag(op, ok, message, lambda: v.check_finite(op, scores, "scores"), backend=be)
        return adv.to(scores.dtype)
    tokens = adv_ops.to_tokens(
        op, adv, ok, mask, be, message=message, eager_checks=lambda: v.check_finite(op, scores, "scores")
    )
    return tokens.to(scores.dtype)


def _trl_normalize_then_sum(s, group_ids, group_size, w, backend: str):
    """TRL's GDPO aggregation on the group kernels, s [B, K] -> (advantages [B], ok): each reward function's
    column normalized in its groups ("grpo" with TRL's rule that a group of one gets 0), weighted (w [K] or
    None: all 1) and summed, then the batch normalized as one group ("grpo") and a group of one set to 0
    again as TRL does: one kernel (after the ids' sort), `group_advantages_sum` with renormalize."""
    return adv_ops._SUM[backend](
        s, group_ids, group_size or 0, w, "grpo" + ZERO_SINGLES_SUFFIX, TRL_EPS, True
    )


# verl's adv_estimator name -> the function computing it (verl 0.9.1 registers these with @register_adv_est).
ESTIMATORS = {
    "gdpo": gdpo_advantages,
    "grpo_passk": grpo_passk_advantages,
    "reinforce_plus_plus": reinforce_plus_plus_advantages,
    "reinforce_plus_plus_baseline": reinforce_plus_plus_baseline_advantages,
    "remax": remax_advantages,
    "opo": opo_advantages,
    "gpg": gpg_advantages,
    "optimal_token_baseline": optimal_token_baseline_advantages,
}
ADVANTAGE_ESTIMATORS = tuple(ESTIMATORS)


def advantages(estimator: str, rewards: torch.Tensor, mask: torch.Tensor, **options):
    """The advantage estimator named as verl 0.9.1's `algorithm.adv_estimator`, on the same inputs.

    `advantages(name, rewards, mask, **options)` calls the function in ESTIMATORS[name] with its own
    keyword options (see each function's docstring): rewards is [B] per-response scores for "gdpo" ([B, K]
    too), "grpo_passk", "reinforce_plus_plus_baseline", "opo" and "gpg" (verl: token_level_rewards.sum(-1)),
    and [B, T] token-level rewards for "reinforce_plus_plus", "remax" and "optimal_token_baseline". mask is
    the [B, T] response mask. group_advantages covers "grpo" and "rloo"; gae covers "gae".

    Returns:
        (advantages, returns), each [B, T] in the rewards' dtype (verl's pair: the same tensor twice for the
        outcome estimators).
    """
    if not isinstance(estimator, str) or estimator not in ESTIMATORS:
        hint = ""
        if estimator in ("grpo", "grpo_vectorized", "rloo", "rloo_vectorized", "gae"):
            hint = f" ({estimator!r}: use rk.group_advantages or rk.gae)"
        raise ValueError(
            f"advantages: estimator must be one of {ADVANTAGE_ESTIMATORS}, got {estimator!r}{hint}"
        )
    fn = ESTIMATORS[estimator]
    allowed = [p.name for p in inspect.signature(fn).parameters.values() if p.kind is p.KEYWORD_ONLY]
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise TypeError(f"advantages: estimator {estimator!r} takes the options {allowed}, got {unknown}")
    return fn(rewards, mask, **options)
