"""group_advantages: custom ops (native C++/CUDA and Triton), their fake registrations, and the public
function. The advantages are constants for the policy loss: no autograd formula.

On a GPU a call is one launch (torch.sort of the ids first for group_ids; +1 with a mask: the token
broadcast, `advantage_tokens`): the kernels check the rewards (and the mask's values) they read and return a
validity flag, on which they assert themselves on a GPU (both flavors; docs/gpu_token_ops.md)."""

from __future__ import annotations

import operator

import torch

from rlkernels import _validate as v
from rlkernels._backend import select_backend
from rlkernels.ops._flags import check_flag
from rlkernels.ops._library import register_constant_backends
from rlkernels.ops._token_masks import kernel_mask
from rlkernels.reference import advantages as reference
from rlkernels.reference.advantages import GROUP_MODES, broadcast_to_tokens

OP = "group_advantages"
TOKENS = "advantage_tokens"


@torch.library.custom_op("rlkernels::group_advantages_triton", mutates_args=())
def _group_advantages_triton(
    rewards: torch.Tensor, group_ids: torch.Tensor | None, group_size: int, mode: str, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    from rlkernels.triton.advantages import group_advantages_forward

    return group_advantages_forward(rewards, group_ids, group_size, mode, eps)


@torch.library.custom_op("rlkernels::advantage_tokens_triton", mutates_args=())
def _advantage_tokens_triton(
    adv: torch.Tensor, mask: torch.Tensor, ok: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    from rlkernels.triton.advantages import tokens_forward

    return tokens_forward(adv, mask, ok)


@torch.library.custom_op("rlkernels::group_advantages_sum_triton", mutates_args=())
def _group_advantages_sum_triton(
    scores: torch.Tensor,
    group_ids: torch.Tensor | None,
    group_size: int,
    weights: torch.Tensor | None,
    mode: str,
    eps: float,
    renormalize: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    from rlkernels.triton.advantages import group_advantages_sum_forward

    return group_advantages_sum_forward(scores, group_ids, group_size, weights, mode, eps, renormalize)


@torch.library.custom_op("rlkernels::whitened_group_tokens_triton", mutates_args=())
def _whitened_group_tokens_triton(
    scores: torch.Tensor,
    group_ids: torch.Tensor,
    weights: torch.Tensor | None,
    mode: str,
    eps: float,
    mask: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    from rlkernels.triton.advantages import whitened_group_tokens_forward

    return whitened_group_tokens_forward(scores, group_ids, weights, mode, eps, mask)


def _fake(rewards, group_ids, group_size, mode, eps):
    return rewards.new_empty(rewards.shape), rewards.new_empty((), dtype=torch.bool)


def _fake_sum(scores, group_ids, group_size, weights, mode, eps, renormalize):
    return scores.new_empty(scores.shape[:1]), scores.new_empty((), dtype=torch.bool)


def _fake_tokens(adv, mask, ok):
    return adv.new_empty(mask.shape), ok.new_empty(())


def _fake_whitened(scores, group_ids, weights, mode, eps, mask):
    return scores.new_empty(mask.shape), scores.new_empty((), dtype=torch.bool)


# backend -> launcher of its flavor
_LAUNCH = register_constant_backends(OP, fake=_fake)
# The group pass over several reward columns at once, their weighted sum (the estimators gdpo and
# trl_grpo_advantages' normalize_then_sum): scores [B, K] float32/float64, weights [K] or None, renormalize
# (TRL's batch pass after the sum) -> (advantages [B], ok). Same backends as group_advantages.
SUM = "group_advantages_sum"
_SUM = register_constant_backends(SUM, fake=_fake_sum)
_TOKENS = register_constant_backends(TOKENS, fake=_fake_tokens)
# verl's masked whitening of the group advantages' weighted sum over the reward columns, as tokens
# (reinforce_plus_plus_baseline, gdpo): scores [B, K] float32/float64, group_ids [B], weights [K] or None,
# mask [B, T] as kernel_mask gives it -> (tokens [B, T], ok: the scores finite and the mask's values valid).
# On a GPU the ids' sort, the group walk with the mask rows' moments and the whitening statistics in one
# launch, and the tokens (past 1024 responses: the chunk path, a statistics launch, the tokens).
WHITENED = "whitened_group_tokens"
_WHITENED = register_constant_backends(WHITENED, fake=_fake_whitened)


def _check_group_size(group_size, b: int) -> int:
    if isinstance(group_size, bool):
        raise TypeError(f"{OP}: group_size must be an int, got bool")
    try:
        size = operator.index(group_size)
    except TypeError:
        raise TypeError(f"{OP}: group_size must be an int, got {type(group_size).__name__}") from None
    if size < 1:
        raise ValueError(f"{OP}: group_size must be >= 1, got {size}")
    if b % size:
        raise ValueError(f"{OP}: group_size {size} does not divide B (rewards shape ({b},))")
    return size


def to_tokens(op: str, adv, ok, mask, backend: str, *, eager_checks=None, message=None):
    """adv [B] (and its kernel's flag ok) -> adv[:, None] * mask [B, T] in adv's dtype; checks the mask's
    values into the flag and raises if it is down (check_flag: eager_checks on CPU tensors; on a GPU the
    kernels' own assert). One launch. backend: a kernel backend (not "reference")."""
    tokens, ok = _TOKENS[backend](adv, kernel_mask(op, mask, adv.dtype, backend), ok)
    check_flag(
        op, ok, message, lambda: (eager_checks and eager_checks(), v.mask_values(op, mask)), backend=backend
    )
    return tokens


def whitened_tokens(op: str, scores, ids, weights, mode: str, eps: float, mask, backend: str, eager_checks):
    """verl's masked_whiten(A[:, None] * mask, mask) * mask [B, T] of A = Σ_k w_k
    group_advantages(scores[:, k]) (scores [B, K] in the compute dtype, weights [K] or None, ids [B])
    through `whitened_group_tokens`, raising if its flag is down (check_flag: eager_checks and the mask's
    values on CPU tensors)."""
    tokens, ok = _WHITENED[backend](
        scores, ids, weights, mode, eps, kernel_mask(op, mask, scores.dtype, backend)
    )
    check_flag(
        op, ok, f"{op}: {BAD_VALUES}", lambda: (eager_checks(), v.mask_values(op, mask)), backend=backend
    )
    return tokens


BAD_VALUES = (
    f"{OP}: rewards must be finite (found NaN or inf), and a mask's values 0 / 1 (integer) or finite and "
    ">= 0 (float) (CPU tensors: a ValueError names the first bad element)"
)


@v.keyword_options
def group_advantages(
    rewards: torch.Tensor,
    *,
    group_size: int | None = None,
    group_ids: torch.Tensor | None = None,
    mode: str = "grpo",
    eps: float = 1e-6,
    mask: torch.Tensor | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """Outcome-reward advantages normalized within groups of responses to the same prompt (verl
    `compute_grpo_outcome_advantage` / `compute_rloo_outcome_advantage`, Dr.GRPO, TRL batch scaling).

    Args:
        rewards: [B] float32/float64/float16/bfloat16, one finite scalar reward per response (NaN or inf
            raises in every mode: ValueError for CPU tensors, a device-side assert for GPU tensors).
        group_size: groups are contiguous blocks of this many rewards (must divide B). Or:
        group_ids: [B] int32/int64, any integers in any order; equal ids form a group (uneven sizes
            allowed). Exactly one of group_size / group_ids. On GPU the ids are mapped to groups with a
            stable sort (device ops, no host sync).
        mode: "grpo" (r - mean_g) / (std_g + eps); "dr_grpo" r - mean_g; "rloo" n/(n-1) (r - mean_g);
            "batch" (r - mean_g) / (std_batch + eps). std unbiased; a group of one has mean 0 and std 1
            (rloo: r); a group of equal rewards gives exactly 0.
        eps: added to the std (>= 0).
        mask: optional [B, T] response mask: bool, integer 0/1 (a Hugging Face attention_mask) or float
            weights (finite, >= 0): returns the token advantages adv[:, None] * mask.
        backend: "auto" | "triton" | "cuda" | "cpu" | "reference".

    Returns:
        [B] (or [B, T] with mask) in rewards' dtype, computed in fp32 (fp64 for fp64). Not differentiable
        (advantages are constants for the loss).
    """
    v.check_float(OP, rewards, "rewards")
    v.check_ndim(OP, rewards, "rewards", (1,))
    mode = v.check_choice(OP, mode, "mode", GROUP_MODES)
    eps = float(v.check_number(OP, eps, "eps", ge=0))
    b = rewards.shape[0]
    if (group_size is None) == (group_ids is None):
        raise ValueError(f"{OP}: give exactly one of group_size or group_ids")
    size = 0
    if group_ids is not None:
        v.check_index(OP, group_ids, "group_ids")
        v.check_shape(OP, group_ids, "group_ids", rewards.shape, "rewards")
    else:
        size = _check_group_size(group_size, b)
    if mask is not None:
        v.check_tensor(OP, mask, "mask")
        if mask.dim() != 2 or mask.shape[0] != b:
            raise ValueError(f"{OP}: mask must be [B, T] with rewards shape ({b},), got {tuple(mask.shape)}")
        v.check_mask(OP, mask, "mask", mask.shape, "mask")
    device = v.check_same_device(OP, rewards=rewards, group_ids=group_ids, mask=mask)
    backend = select_backend(OP, backend, device, implemented=tuple(_LAUNCH))
    r = rewards.detach() if rewards.requires_grad else rewards  # the advantages are constants
    if backend == "reference":
        v.check_finite(OP, rewards, "rewards")
        adv = reference.group_advantages(r, size or None, group_ids, mode, eps)
        return adv if mask is None else broadcast_to_tokens(adv, v.mask_values(OP, mask))
    adv, ok = _LAUNCH[backend](r, group_ids, size, mode, eps)
    if mask is None:
        check_flag(OP, ok, BAD_VALUES, lambda: v.check_finite(OP, rewards, "rewards"), backend=backend)
        return adv
    return to_tokens(
        OP,
        adv,
        ok,
        mask,
        backend,
        eager_checks=lambda: v.check_finite(OP, rewards, "rewards"),
        message=BAD_VALUES,
    )
