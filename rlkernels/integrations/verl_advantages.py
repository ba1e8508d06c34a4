"""verl 0.9.1's advantage estimators on rlkernels, with verl's signatures and return conventions.

Each function takes the arguments of the verl 0.9.1 function of the same name (verl/trainer/ppo/core_algos.py,
registered there with `@register_adv_est`) and returns what it returns, an (advantages, returns) pair of
[B, T] tensors, computed by rlkernels' vectorized estimators instead of verl's Python loops over rows and
groups. `rlkernels.integrations.verl` re-exports them and its `install()` registers them under
`rlk_<verl name>` (ADVANTAGE_ESTIMATORS). Common arguments: token_level_rewards [B, T] float (the outcome
estimators take the row sums as scores, as verl), response_mask [B, T] (bool, 0/1 integer or float), index
[B] (verl's `uid` array: any hashable labels, e.g. a numpy array of strings; or an integer tensor), config
(verl's AlgoConfig, read with `.get` / attributes as verl reads it). The results come in verl's dtype: the
rewards' (float32 for gdpo's per-key scores), promoted by a float response_mask of a wider dtype (verl
multiplies by the mask).

What verl reads from config, these read the same way: `gamma` (reinforce_plus_plus, required),
`norm_adv_by_std_in_grpo` (grpo_passk only, `config.get(..., True)`; grpo and gdpo take it as an argument
and ignore config's, as verl), `gdpo_reward_keys` / `gdpo_reward_weights` (gdpo, with non_tensor_batch and
batch). verl 0.9.1's trainer (`ray_trainer.compute_advantage`) calls a registered estimator with
token_level_rewards, response_mask, config, index and reward_baselines; it adds non_tensor_batch / batch only
for the name "gdpo", and old_log_probs / sum_pi_squared / rollout_is_weights only for "optimal_token_baseline"
and "tir_optimal_token_baseline". Under the `rlk_` names its trainer therefore passes neither: rlk_gdpo
raises (instead of silently dropping config.gdpo_reward_keys, as verl's own function would) and the two
optimal-token-baseline adapters miss their required arguments. Call them directly, or keep verl's own names
for those three.

Differences from verl 0.9.1, all on purpose (docs/semantics.md, "Advantage estimators by name"): a group of
equal rewards gets exactly 0; verl's masked whitening divides by the token count + 1e-8 (we by the count);
grpo_passk gives a group of one 0 (verl raises); opo gives a group of empty responses 0 (verl 0 / 0); remax
and the optimal token baselines return 0 at masked positions inside a response (verl leaves the reward-to-go
there; no loss reads it); rlk_gdpo with config.gdpo_reward_keys and no non_tensor_batch raises.
"""

from __future__ import annotations

import numpy as np
import torch

import rlkernels as rk
from rlkernels.reference.advantage_estimators import group_index
from rlkernels.reference.gae import masked_whiten

# verl's registered name prefixed with "rlk_" -> our function's name in this module.
ADVANTAGE_ESTIMATORS = {
    "rlk_gae": "compute_gae_advantage_return",
    "rlk_grpo": "compute_grpo_outcome_advantage",
    "rlk_grpo_vectorized": "compute_grpo_vectorized_outcome_advantage",
    "rlk_gdpo": "compute_gdpo_outcome_advantage",
    "rlk_grpo_passk": "compute_grpo_passk_outcome_advantage",
    "rlk_rloo": "compute_rloo_outcome_advantage",
    "rlk_rloo_vectorized": "compute_rloo_vectorized_outcome_advantage",
    "rlk_reinforce_plus_plus": "compute_reinforce_plus_plus_outcome_advantage",
    "rlk_reinforce_plus_plus_baseline": "compute_reinforce_plus_plus_baseline_outcome_advantage",
    "rlk_remax": "compute_remax_outcome_advantage",
    "rlk_opo": "compute_opo_outcome_advantage",
    "rlk_gpg": "compute_gpg_outcome_advantage",
    "rlk_optimal_token_baseline": "compute_optimal_token_baseline_advantage",
    "rlk_tir_optimal_token_baseline": "compute_multi_turn_optimal_token_baseline_advantage",
}


def _group_ids(index, device: torch.device) -> torch.Tensor:
    """verl's `index` (an array of any hashable labels, one per row, e.g. uid strings) -> int64 ids [B]."""
    if isinstance(index, torch.Tensor):
        return index.to(device=device, dtype=torch.int64)
    return torch.from_numpy(np.unique(np.asarray(index), return_inverse=True)[1].reshape(-1)).to(device)


def _token_rewards(op: str, token_level_rewards, response_mask) -> None:
    """token_level_rewards a [B, T] float tensor and response_mask a tensor of its shape, named as verl."""
    if not isinstance(token_level_rewards, torch.Tensor) or not token_level_rewards.is_floating_point():
        got = getattr(token_level_rewards, "dtype", type(token_level_rewards).__name__)
        raise TypeError(f"{op}: token_level_rewards must be a float tensor [B, T], got {got}")
    if token_level_rewards.dim() != 2:
        raise ValueError(
            f"{op}: token_level_rewards must be [B, T], got shape {tuple(token_level_rewards.shape)}"
        )
    if not isinstance(response_mask, torch.Tensor) or response_mask.shape != token_level_rewards.shape:
        shape = tuple(response_mask.shape) if isinstance(response_mask, torch.Tensor) else response_mask
        raise ValueError(
            f"{op}: response_mask must be a tensor of token_level_rewards' shape "
            f"{tuple(token_level_rewards.shape)}, got {shape}"
        )


def _verl_dtype(dtype: torch.dtype, response_mask: torch.Tensor) -> torch.dtype:
    """The dtype of verl's results: it multiplies its values by response_mask, so a float mask of a wider
    dtype promotes them (a bool or integer mask does not)."""
    return torch.promote_types(dtype, response_mask.dtype) if response_mask.is_floating_point() else dtype


def _outcome(op: str, token_level_rewards, response_mask, index) -> tuple[torch.Tensor, torch.Tensor]:
    """(scores [B] = the row sums, as verl, in verl's result dtype; int64 group ids [B]) of an outcome
    estimator's arguments."""
    _token_rewards(op, token_level_rewards, response_mask)
    b = token_level_rewards.shape[0]
    if index is None or len(index) != b:
        got = None if index is None else len(index)
        raise ValueError(f"{op}: index must hold one group label per row (B = {b}), got {got}")
    scores = token_level_rewards.sum(dim=-1)
    scores = scores.to(_verl_dtype(scores.dtype, response_mask))
    return scores, _group_ids(index, scores.device)


def compute_gae_advantage_return(
    token_level_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma,
    lam,
) -> tuple[torch.Tensor, torch.Tensor]:
    """verl 0.9.1 `compute_gae_advantage_return`: [B, T] rewards, values, mask -> (advantages whitened over
    the masked tokens [B, T], returns [B, T]), in the rewards' dtype."""
    return rk.gae(token_level_rewards, values, response_mask, gamma=float(gamma), lam=float(lam), whiten=True)


def compute_grpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    config=None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """verl 0.9.1 `compute_grpo_outcome_advantage`: rewards [B, T] summed per row, grouped by index [B];
    returns (advantages, advantages), each [B, T] (the row's scalar times the mask). (r - mean_g) /
    (std_g + epsilon), or r - mean_g without norm_adv_by_std_in_grpo (Dr.GRPO); a group of one gets mean 0,
    std 1. config is not read (as verl)."""
    scores, ids = _outcome("compute_grpo_outcome_advantage", token_level_rewards, response_mask, index)
    adv = rk.group_advantages(
        scores,
        group_ids=ids,
        mode="grpo" if norm_adv_by_std_in_grpo else "dr_grpo",
        eps=epsilon,
        mask=response_mask,
    )
    return adv, adv


compute_grpo_vectorized_outcome_advantage = compute_grpo_outcome_advantage


def _gdpo_scores(op, config, non_tensor_batch, batch, b: int, device) -> tuple[torch.Tensor, list | None]:
    """verl's per-key GDPO scores [B, K] float32 (from non_tensor_batch[key] for each of
    config.gdpo_reward_keys, cast to float32 as verl) and config.gdpo_reward_weights (None: all 1)."""
    keys = config.get("gdpo_reward_keys", None)
    if not keys:
        raise ValueError(
            f"{op}: config.gdpo_reward_keys must list the reward components of compute_score "
            "(e.g. ['format_reward', 'accuracy_reward']) when non_tensor_batch and batch are given"
        )
    columns = []
    for key in keys:
        if key not in non_tensor_batch:
            raise ValueError(
                f"{op}: gdpo reward key {key!r} (config.gdpo_reward_keys) not in non_tensor_batch "
                f"(keys: {list(non_tensor_batch)})"
            )
        column = np.asarray(non_tensor_batch[key], dtype=np.float32).reshape(-1)
        if column.shape[0] != b:
            raise ValueError(
                f"{op}: non_tensor_batch[{key!r}] must hold one score per row (B = {b}), "
                f"got {column.shape[0]}"
            )
        columns.append(torch.from_numpy(column))
    weights = config.get("gdpo_reward_weights", None)
    if weights is not None:
        weights = [float(w) for w in weights]
        if len(weights) != len(keys):
            raise ValueError(
                f"{op}: config.gdpo_reward_weights must have one weight per gdpo_reward_keys entry "
                f"({len(keys)}), got {len(weights)}"
            )
    return torch.stack(columns, dim=1).to(device), weights


def compute_gdpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    config=None,
    non_tensor_batch: dict | None = None,
    batch: dict | None = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """verl 0.9.1 `compute_gdpo_outcome_advantage` on rk.gdpo_advantages: each reward component normalized
    within its groups ((s - mean_g) / (std_g + epsilon), or s - mean_g without norm_adv_by_std_in_grpo), the
    weighted sum, then verl's masked whitening over all response tokens.

    With config, non_tensor_batch and batch all given (verl's trainer under the name "gdpo"), the components
    are non_tensor_batch[key] for key in config.gdpo_reward_keys ([B] numbers each, cast to float32 as
    verl), weighted by config.gdpo_reward_weights (default 1). Otherwise the single component is
    token_level_rewards.sum(-1). config.gdpo_reward_keys set without non_tensor_batch raises ValueError,
    where verl silently falls back to token_level_rewards (which is what its trainer passes under any other
    name than "gdpo", rlk_gdpo included). batch is only tested for None (verl reads the response lengths
    from it to place each score on a token, then sums them back).

    Returns:
        (advantages, advantages): the same [B, T] tensor twice, in verl's dtype (module docstring: float32
        with the per-key scores).
    """
    op = "compute_gdpo_outcome_advantage"
    scores, ids = _outcome(op, token_level_rewards, response_mask, index)
    weights = None
    if config is not None and non_tensor_batch is not None and batch is not None:
        scores, weights = _gdpo_scores(op, config, non_tensor_batch, batch, scores.shape[0], scores.device)
        scores = scores.to(_verl_dtype(torch.float32, response_mask))
    elif config is not None and config.get("gdpo_reward_keys", None):
        raise ValueError(
            f"{op}: config.gdpo_reward_keys is set but non_tensor_batch / batch were not passed (verl "
            "0.9.1's compute_advantage passes them only to adv_estimator='gdpo'): the per-key rewards would "
            "be ignored. Use verl's 'gdpo', or call this function with non_tensor_batch and batch."
        )
    return rk.gdpo_advantages(
        scores, response_mask, group_ids=ids, weights=weights, eps=float(epsilon),
        norm_by_std=bool(norm_adv_by_std_in_grpo),
    )  # fmt: skip


def _need_config(op: str, config, what: str) -> None:
    if config is None:
        raise ValueError(f"{op} needs config (verl's AlgoConfig: {what})")


def compute_grpo_passk_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    config=None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """verl 0.9.1 `compute_grpo_passk_outcome_advantage` on rk.grpo_passk_advantages: a group's unique best
    response gets (s_max - s_second) / (std_g + epsilon), every other response 0. As verl, the std division
    follows config.get("norm_adv_by_std_in_grpo", True) and the norm_adv_by_std_in_grpo argument is not read;
    config is required. A tied best gives its group 0 (as verl); a group of one gives 0 (verl raises).

    Returns:
        (advantages, advantages): the same [B, T] tensor twice, in verl's dtype (module docstring).
    """
    op = "compute_grpo_passk_outcome_advantage"
    _need_config(op, config, "its norm_adv_by_std_in_grpo")
    scores, ids = _outcome(op, token_level_rewards, response_mask, index)
    norm = bool(config.get("norm_adv_by_std_in_grpo", True))
    return rk.grpo_passk_advantages(
        scores, response_mask, group_ids=ids, eps=float(epsilon), norm_by_std=norm
    )


def compute_rloo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    config=None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """verl 0.9.1 `compute_rloo_outcome_advantage`: n/(n-1)·(r - mean_g) per row (r for a group of one), as
    (advantages, advantages) [B, T]."""
    scores, ids = _outcome("compute_rloo_outcome_advantage", token_level_rewards, response_mask, index)
    adv = rk.group_advantages(scores, group_ids=ids, mode="rloo", mask=response_mask)
    return adv, adv


def compute_rloo_vectorized_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    config=None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """verl 0.9.1 `compute_rloo_vectorized_outcome_advantage`: as compute_rloo_outcome_advantage, except that
    a group of one gets 0 (verl's two RLOO functions differ there)."""
    ids = _group_ids(index, token_level_rewards.device)
    adv, _ = compute_rloo_outcome_advantage(token_level_rewards, response_mask, ids)
    adv = adv * (torch.bincount(ids)[ids] > 1).to(adv.dtype)[:, None]
    return adv, adv


def compute_reinforce_plus_plus_outcome_advantage(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, config=None, **kwargs
) -> tuple[torch.Tensor, torch.Tensor]:
    """verl 0.9.1 `compute_reinforce_plus_plus_outcome_advantage`: discounted returns with config.gamma
    [B, T] (masked tokens return 0 and carry the running return), then (masked_whiten(returns) · mask,
    returns)."""
    _need_config("compute_reinforce_plus_plus_outcome_advantage", config, "its gamma")
    returns = rk.discounted_returns(token_level_rewards, response_mask, gamma=float(config.gamma))
    advantages = masked_whiten(returns, response_mask) * response_mask
    return advantages, returns


def compute_reinforce_plus_plus_baseline_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: torch.Tensor,
    epsilon: float = 1e-6,
    config=None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """verl 0.9.1 `compute_reinforce_plus_plus_baseline_outcome_advantage` on
    rk.reinforce_plus_plus_baseline_advantages: (s_i - mean_g) · mask (a group of one: mean 0), whitened
    over all response tokens, · mask. epsilon and config are not read (as verl).

    Returns:
        (advantages, advantages): the same [B, T] tensor twice, in verl's dtype (module docstring).
    """
    op = "compute_reinforce_plus_plus_baseline_outcome_advantage"
    scores, ids = _outcome(op, token_level_rewards, response_mask, index)
    return rk.reinforce_plus_plus_baseline_advantages(scores, response_mask, group_ids=ids)


def _like(x, rewards: torch.Tensor):
    """A float tensor argument in the rewards' dtype (anything else is left to rk's checks)."""
    return x.to(rewards.dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x


def compute_remax_outcome_advantage(
    token_level_rewards: torch.Tensor,
    reward_baselines: torch.Tensor,
    response_mask: torch.Tensor,
    config=None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """verl 0.9.1 `compute_remax_outcome_advantage` on rk.remax_advantages (note verl's argument order:
    reward_baselines [B] float, the greedy rollout's reward, comes second). returns = the reward-to-go
    [B, T], advantages = returns - reward_baselines · mask; both 0 at masked positions (verl leaves the
    reward-to-go at masked positions inside a response). config is not read (as verl).

    Returns:
        (advantages, returns), each [B, T] in verl's dtype (module docstring).
    """
    _token_rewards("compute_remax_outcome_advantage", token_level_rewards, response_mask)
    rewards = token_level_rewards.to(_verl_dtype(token_level_rewards.dtype, response_mask))
    return rk.remax_advantages(rewards, response_mask, reward_baselines=_like(reward_baselines, rewards))


def compute_opo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    config=None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """verl 0.9.1 `compute_opo_outcome_advantage` on rk.opo_advantages: (s_i - Σ_g L_j s_j / Σ_g L_j) · mask
    with L_j the response lengths (a group of one, or of empty responses: baseline 0). epsilon and config
    are not read (as verl).

    Returns:
        (advantages, advantages): the same [B, T] tensor twice, in verl's dtype (module docstring).
    """
    scores, ids = _outcome("compute_opo_outcome_advantage", token_level_rewards, response_mask, index)
    return rk.opo_advantages(scores, response_mask, group_ids=ids)


def compute_gpg_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    f_norm: float = 1.0,
    alpha: float = 1.0,
    config=None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """verl 0.9.1 `compute_gpg_outcome_advantage` on rk.gpg_advantages: α · (s_i - mean_g) / f_norm · mask
    with α = B / max(#{s_i != 0}, 1) computed from the scores, as verl does (its alpha argument, like epsilon
    and config, is not read).

    Returns:
        (advantages, advantages): the same [B, T] tensor twice, in verl's dtype (module docstring).
    """
    scores, ids = _outcome("compute_gpg_outcome_advantage", token_level_rewards, response_mask, index)
    return rk.gpg_advantages(scores, response_mask, group_ids=ids, f_norm=float(f_norm))


def _token_inputs(op: str, token_level_rewards, old_log_probs, sum_pi_squared, rollout_is_weights) -> None:
    """The optimal token baseline's per-token inputs: tensors of token_level_rewards' shape
    (rollout_is_weights may be None), named as verl names them."""
    for name, x in (("old_log_probs", old_log_probs), ("sum_pi_squared", sum_pi_squared),
                    ("rollout_is_weights", rollout_is_weights)):  # fmt: skip
        if x is None and name == "rollout_is_weights":
            continue
        if not isinstance(x, torch.Tensor) or x.shape != token_level_rewards.shape:
            shape = tuple(x.shape) if isinstance(x, torch.Tensor) else x
            raise ValueError(
                f"{op}: {name} must be a tensor of token_level_rewards' shape "
                f"{tuple(token_level_rewards.shape)}, got {shape}"
            )


def compute_optimal_token_baseline_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    old_log_probs: torch.Tensor,
    sum_pi_squared: torch.Tensor,
    rollout_is_weights: torch.Tensor | None = None,
    handle_zero_tail: bool = True,
    epsilon: float = 1e-8,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """verl 0.9.1 `compute_optimal_token_baseline_advantage` on rk.optimal_token_baseline_advantages: a
    per-position baseline b_t = Σ_g G_t W_t / (Σ_g W_t + epsilon) per group, W_t the cumulative path variance
    Σ_{j<=t} (1 - 2·exp(old_log_probs_j) + sum_pi_squared_j)·rollout_is_weights_j² over the mask, G the
    reward-to-go; advantages (G - b) · mask. old_log_probs, sum_pi_squared and rollout_is_weights: [B, T]
    float (verl's trainer passes them only to the name "optimal_token_baseline").

    Returns:
        (advantages, returns), each [B, T] in verl's dtype (module docstring) (0 at masked positions).
    """
    op = "compute_optimal_token_baseline_advantage"
    _, ids = _outcome(op, token_level_rewards, response_mask, index)
    _token_inputs(op, token_level_rewards, old_log_probs, sum_pi_squared, rollout_is_weights)
    rewards = token_level_rewards.to(_verl_dtype(token_level_rewards.dtype, response_mask))
    return rk.optimal_token_baseline_advantages(
        rewards, response_mask, group_ids=ids, old_logp=old_log_probs,
        sum_pi_squared=sum_pi_squared, rollout_is_weights=rollout_is_weights,
        handle_zero_tail=bool(handle_zero_tail), eps=float(epsilon),
    )  # fmt: skip


def compute_multi_turn_optimal_token_baseline_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    old_log_probs: torch.Tensor,
    sum_pi_squared: torch.Tensor,
    rollout_is_weights: torch.Tensor | None = None,
    handle_zero_tail: bool = True,
    epsilon: float = 1e-8,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """verl 0.9.1 `compute_multi_turn_optimal_token_baseline_advantage` (adv_estimator
    "tir_optimal_token_baseline"): compute_optimal_token_baseline_advantage on each response's valid tokens
    moved to the left (a multi-turn response's observation tokens, mask 0 between its turns, taken out), so
    that the baseline of a group is shared by the k-th valid token of each response rather than by column
    t; responses with no valid token leave their group (verl drops them). Arguments as
    compute_optimal_token_baseline_advantage's; the mask is read as valid where nonzero (verl's bool gather).

    Returns:
        (advantages, returns), each [B, T] in verl's dtype (module docstring), back in the original columns
        (0 at masked positions, where verl's returns keep the reward-to-go).
    """
    op = "compute_multi_turn_optimal_token_baseline_advantage"
    _, ids = _outcome(op, token_level_rewards, response_mask, index)
    _token_inputs(op, token_level_rewards, old_log_probs, sum_pi_squared, rollout_is_weights)
    b = token_level_rewards.shape[0]
    valid = response_mask != 0
    # A stable sort per row puts the valid columns first, in order: the left-compacted layout.
    order = torch.argsort((~valid).to(torch.int8), dim=-1, stable=True)

    def compact(x):
        return None if x is None else x.gather(-1, order)

    rows = torch.arange(b, device=ids.device)
    ids = torch.where(valid.any(-1), group_index(ids), b + rows)  # an empty response: a group of its own
    rewards = token_level_rewards.to(_verl_dtype(token_level_rewards.dtype, response_mask))
    adv, returns = rk.optimal_token_baseline_advantages(
        compact(rewards), compact(response_mask), group_ids=ids, old_logp=compact(old_log_probs),
        sum_pi_squared=compact(sum_pi_squared), rollout_is_weights=compact(rollout_is_weights),
        handle_zero_tail=bool(handle_zero_tail), eps=float(epsilon),
    )  # fmt: skip
    # Both are 0 past each row's valid count, so scattering back puts 0 at the masked columns.
    return tuple(torch.zeros_like(x).scatter_(-1, order, x) for x in (adv, returns))
