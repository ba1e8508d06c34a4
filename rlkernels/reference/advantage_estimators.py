"""Advantage estimators of verl 0.9.1 (`verl/trainer/ppo/core_algos.py`, `@register_adv_est`) and TRL 1.16
(`GRPOTrainer`: `scale_rewards`, `multi_objective_aggregation`) beyond `group_advantages`, vectorized over
arbitrary group ids (sort + index_add; no Python loop over groups or rows, no host sync).

Notation: s [B] one score per response (verl: token_level_rewards.sum(-1)), r [B, T] token rewards,
m [B, T] response mask, g(i) the group of response i, n_g its size, L_i = Σ_t m_it its length.
Every token-level output is multiplied by m. `whiten` is verl's masked_whiten over all [B, T] tokens
(rlkernels/reference/gae.py: exact counts, unbiased variance, 0 variance for <= 1 token).

    gdpo            A_i = Σ_k w_k grpo_k(s_ik) (grpo per reward key; dr_grpo without norm_by_std),
                    then whiten(A_i m_it) m_it                                       (verl gdpo)
    grpo_passk      the unique best response of a group gets (s_max - s_second) / (std_g + eps)
                    (no division without norm_by_std); every other response 0. A group whose best is
                    tied (a constant group included) or of one response gives 0 (verl raises there)
    reinforce_plus_plus           G = discounted_returns(r, m, gamma); whiten(G) m
    reinforce_plus_plus_baseline  whiten((s_i - mean_g) m_it) m_it (a group of one: mean 0)
    remax           G = discounted_returns(r, m, 1); G - b_i m_it (b: the greedy rollout's reward)
    opo             (s_i - Σ_g L_j s_j / Σ_g L_j) m_it (a group of one, or of empty masks: baseline 0)
    gpg             α (s_i - mean_g) / f_norm · m_it, α = B / max(#{s != 0}, 1) (a group of one: mean 0)
    optimal_token_baseline
                    w_t = (1 - 2 exp(old_logp_t) + Σπ²_t) ρ_t², W_t = Σ_{j<=t} w_j m_j, G = returns (γ = 1),
                    b_gt = Σ_g G W m / (Σ_g W m + eps) per group and position (a group of one: 0),
                    A = (G - b) m; with handle_zero_tail the unique longest response of a group gets
                    b = 0 from the second-longest length on
    trl (sum_then_normalize)  Σ_k w_k s_ik, then group_advantages mode grpo / batch / dr_grpo for
                    scale_rewards group / batch / none, eps 1e-4
    trl (normalize_then_sum)  Σ_k w_k grpo_k(s_ik) with eps 1e-4, then (x - mean_B) / (std_B + 1e-4)
                    TRL: a group of one gets 0 (its mean is itself), as does a batch of one

The estimators that are built from `group_advantages` or `discounted_returns` take those two as a
`Kernels` tuple, so that the public functions (rlkernels/ops/advantage_estimators.py) run this same code on
the backend-dispatched ops; by default they are the reference implementations.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch

from rlkernels.reference import advantages as adv_ref
from rlkernels.reference import gae as gae_ref
from rlkernels.reference.gae import masked_whiten

# TRL 1.16 GRPOTrainer: the constant added to every std it divides by.
TRL_EPS = 1e-4
TRL_SCALE_MODES = {"group": "grpo", "batch": "batch", "none": "dr_grpo"}  # scale_rewards -> group mode
TRL_AGGREGATIONS = ("sum_then_normalize", "normalize_then_sum")


class Kernels(NamedTuple):
    """The ops the composed estimators call: group_advantages(rewards [B], group_ids [B], mode, eps) -> [B]
    and discounted_returns(rewards [B, T], mask [B, T], gamma) -> [B, T]."""

    group_advantages: Callable
    discounted_returns: Callable


REFERENCE = Kernels(
    lambda rewards, ids, mode, eps: adv_ref.group_advantages(rewards, None, ids, mode, eps),
    gae_ref.discounted_returns,
)


def group_index(group_ids: torch.Tensor) -> torch.Tensor:
    """[B] arbitrary integer ids -> [B] dense group numbers in [0, B) (by a stable sort: no host sync, so
    buffers indexed by it have B slots, some unused)."""
    b = group_ids.shape[0]
    sorted_ids, order = torch.sort(group_ids, stable=True)
    new = torch.ones(b, dtype=torch.bool, device=group_ids.device)
    new[1:] = sorted_ids[1:] != sorted_ids[:-1]
    dense = new.cumsum(0) - 1
    return torch.empty_like(dense).scatter_(0, order, dense)


def group_total(x: torch.Tensor, inverse: torch.Tensor) -> torch.Tensor:
    """Each row's group sum of x [B, ...], gathered back to the rows."""
    return adv_ref.group_sums(x, inverse, x.shape[0])[inverse]


def group_extreme(x: torch.Tensor, inverse: torch.Tensor, reduce: str) -> torch.Tensor:
    """Each row's group max ("amax") or min ("amin") of x [B], gathered back to the rows."""
    fill = -math.inf if reduce == "amax" else math.inf
    out = torch.full_like(x, fill).scatter_reduce_(0, inverse, x, reduce=reduce, include_self=True)
    return out[inverse]


def group_count(inverse: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Each row's group size, in dtype."""
    return group_total(torch.ones(inverse.shape[0], dtype=dtype, device=inverse.device), inverse)


def group_std(scores: torch.Tensor, inverse: torch.Tensor) -> torch.Tensor:
    """Each row's unbiased group std (1 for a group of one, as verl's group of one), pivoted on the
    group's largest value so that a constant group gives exactly 0."""
    n = group_count(inverse, scores.dtype)
    centered = scores - group_extreme(scores, inverse, "amax")
    mean = group_total(centered, inverse) / n
    m2 = group_total((centered - mean).square(), inverse)
    return torch.where(n > 1, torch.sqrt(m2 / (n - 1).clamp_min(1)), torch.ones_like(m2))


def _tokens(adv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return adv_ref.broadcast_to_tokens(adv, mask)


def _whitened(tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    m = mask.to(tokens.dtype)
    return masked_whiten(tokens, m) * m


def gdpo(scores, mask, group_ids, weights, eps=1e-6, norm_by_std=True, kernels=REFERENCE):
    """scores [B, K] (one column per reward key), weights [K] -> (advantages, advantages) [B, T]."""
    mode = "grpo" if norm_by_std else "dr_grpo"
    total = None
    for k in range(scores.shape[1]):  # reward keys, not groups or rows
        term = weights[k] * kernels.group_advantages(scores[:, k].contiguous(), group_ids, mode, eps)
        total = term if total is None else total + term
    adv = _whitened(_tokens(total, mask), mask)
    return adv, adv


def grpo_passk_scores(scores, group_ids, eps=1e-6, norm_by_std=True):
    """scores [B] -> [B] per-response advantages (the kernels' output; grpo_passk broadcasts it)."""
    inverse = group_index(group_ids)
    n = group_count(inverse, scores.dtype)
    best = group_extreme(scores, inverse, "amax")
    is_best = scores == best
    unique = is_best & (group_total(is_best.to(scores.dtype), inverse) == 1) & (n > 1)
    second = group_extreme(torch.where(is_best, -math.inf, scores), inverse, "amax")
    gap = best - second
    if norm_by_std:
        gap = gap / (group_std(scores, inverse) + eps)
    return torch.where(unique, gap, torch.zeros_like(scores))  # elsewhere gap may be 0 / 0 or -inf


def grpo_passk(scores, mask, group_ids, eps=1e-6, norm_by_std=True, per_response=grpo_passk_scores):
    """scores [B] -> (advantages, advantages) [B, T]; per_response: grpo_passk_scores or a kernel of it."""
    adv = _tokens(per_response(scores, group_ids, eps, norm_by_std), mask)
    return adv, adv


def reinforce_plus_plus(rewards, mask, gamma=1.0, kernels=REFERENCE):
    """rewards [B, T] -> (advantages, returns) [B, T]."""
    returns = kernels.discounted_returns(rewards, mask, gamma)
    return _whitened(returns, mask), returns


def reinforce_plus_plus_baseline(scores, mask, group_ids, kernels=REFERENCE):
    """scores [B] -> (advantages, advantages) [B, T]."""
    centered = kernels.group_advantages(scores, group_ids, "dr_grpo", 0.0)
    adv = _whitened(_tokens(centered, mask), mask)
    return adv, adv


def remax(rewards, mask, reward_baselines, kernels=REFERENCE):
    """rewards [B, T], reward_baselines [B] -> (advantages, returns) [B, T]."""
    returns = kernels.discounted_returns(rewards, mask, 1.0)
    return returns - _tokens(reward_baselines, mask), returns


def opo_scores(scores, lengths, group_ids):
    """scores, lengths [B] (each response's mask sum) -> [B] per-response advantages s - baseline."""
    inverse = group_index(group_ids)
    pivot = group_extreme(scores, inverse, "amax")  # a constant group: baseline == pivot exactly
    weight = group_total(lengths, inverse)
    shift = group_total(lengths * (scores - pivot), inverse) / torch.where(weight > 0, weight, 1)
    multi = (group_count(inverse, scores.dtype) > 1) & (weight > 0)
    return scores - torch.where(multi, pivot + shift, torch.zeros_like(scores))


def opo(scores, mask, group_ids, per_response=opo_scores):
    """scores [B] -> (advantages, advantages) [B, T]; the baseline weighs each score by its length.
    per_response: opo_scores or a kernel of it."""
    adv = _tokens(per_response(scores, mask.to(scores.dtype).sum(-1), group_ids), mask)
    return adv, adv


def gpg(scores, mask, group_ids, f_norm=1.0, kernels=REFERENCE):
    """scores [B] -> (advantages, advantages) [B, T]."""
    alpha = scores.shape[0] / torch.count_nonzero(scores).clamp_min(1).to(scores.dtype)
    centered = kernels.group_advantages(scores, group_ids, "dr_grpo", 0.0)
    adv = _tokens(alpha * centered / f_norm, mask)
    return adv, adv


def optimal_token_baseline(
    rewards,
    mask,
    group_ids,
    old_logp,
    sum_pi_squared,
    rollout_is_weights=None,
    handle_zero_tail=True,
    eps=1e-8,
    kernels=REFERENCE,
):
    """rewards, old_logp, sum_pi_squared, rollout_is_weights [B, T] -> (advantages, returns) [B, T]."""
    m = mask.to(rewards.dtype)
    returns = kernels.discounted_returns(rewards, mask, 1.0)
    w = 1 - 2 * torch.exp(old_logp) + sum_pi_squared
    if rollout_is_weights is not None:
        w = w * rollout_is_weights.square()
    wm = torch.cumsum(w * m, dim=-1) * m
    inverse = group_index(group_ids)
    n = group_count(inverse, rewards.dtype)
    baseline = group_total(returns * wm, inverse) / (group_total(wm, inverse) + eps)
    baseline = torch.where((n > 1)[:, None], baseline, torch.zeros_like(baseline))
    if handle_zero_tail and rewards.shape[0]:
        lengths = m.sum(-1)
        longest = group_extreme(lengths, inverse, "amax")
        ties = group_total((lengths == longest).to(rewards.dtype), inverse)
        below = group_extreme(torch.where(lengths == longest, -math.inf, lengths), inverse, "amax")
        second = torch.where(ties > 1, longest, below)  # verl: sorted(lengths)[-2]
        top, cut = torch.floor(longest), torch.floor(second)  # verl's int() of the float lengths
        hit = lengths == top
        alone = hit & (group_total(hit.to(rewards.dtype), inverse) == 1) & (top > cut) & (n > 1)
        t = torch.arange(rewards.shape[-1], device=rewards.device, dtype=rewards.dtype)
        baseline = torch.where(alone[:, None] & (t[None, :] >= cut[:, None]), 0, baseline)
    return (returns - baseline) * m, returns


def trl_grpo(
    scores, group_ids, weights, scale_rewards="group", aggregation="sum_then_normalize", kernels=REFERENCE
):
    """scores [B, K] (one column per reward function), weights [K] -> advantages [B] (TRL 1.16)."""
    b = scores.shape[0]
    alone = group_count(group_index(group_ids), scores.dtype) == 1  # TRL: mean of itself, advantage 0
    if aggregation == "sum_then_normalize":
        total = (scores * weights).sum(-1)
        adv = kernels.group_advantages(total, group_ids, TRL_SCALE_MODES[scale_rewards], TRL_EPS)
    else:
        total = None
        for k in range(scores.shape[1]):  # reward functions, not groups or rows
            a = kernels.group_advantages(scores[:, k].contiguous(), group_ids, "grpo", TRL_EPS)
            term = weights[k] * torch.where(alone, 0, a)
            total = term if total is None else total + term
        batch = torch.zeros_like(group_ids)
        adv = kernels.group_advantages(total, batch, "grpo", TRL_EPS) if b > 1 else torch.zeros_like(total)
    return torch.where(alone, 0, adv)
