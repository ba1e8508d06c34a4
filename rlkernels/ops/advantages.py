"""group_advantages: custom ops (native C++/CUDA and Triton), their fake registrations, and the public
function. The advantages are constants for the policy loss: no autograd formula."""

from __future__ import annotations

import operator

import torch

from rlkernels import _validate as v
from rlkernels._backend import select_backend
from rlkernels.ops._library import register_constant_backends
from rlkernels.reference import advantages as reference
from rlkernels.reference.advantages import GROUP_MODES, broadcast_to_tokens

OP = "group_advantages"


@torch.library.custom_op("rlkernels::group_advantages_triton", mutates_args=())
def _group_advantages_triton(
    rewards: torch.Tensor, group_ids: torch.Tensor | None, group_size: int, mode: str, eps: float
) -> torch.Tensor:
    from rlkernels.triton.advantages import group_advantages_forward

    return group_advantages_forward(rewards, group_ids, group_size, mode, eps)


def _fake(rewards, group_ids, group_size, mode, eps):
    return rewards.new_empty(rewards.shape)


# backend -> launcher of its flavor
_LAUNCH = register_constant_backends("group_advantages", fake=_fake)


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
            raises in every mode: ValueError for CPU tensors, torch._assert_async for GPU tensors).
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
    v.check_finite(OP, rewards, "rewards")
    if mask is not None:
        mask = v.mask_values(OP, mask)
    backend = select_backend(OP, backend, device, implemented=tuple(_LAUNCH))
    r = rewards.detach() if rewards.requires_grad else rewards  # the advantages are constants
    if backend == "reference":
        adv = reference.group_advantages(r, size or None, group_ids, mode, eps)
    else:
        adv = _LAUNCH[backend](r, group_ids, size, mode, eps)
    return adv if mask is None else broadcast_to_tokens(adv, mask)
