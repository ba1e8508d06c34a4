"""dynamic_sampling and overlong_penalty, DAPO's batch utilities: the public functions. Their inputs are
[B] per-sequence values, so the only implementation is the eager one (rlkernels/reference/dapo.py), on
any device, with no Python loop over groups or sequences."""

from __future__ import annotations

import torch

from rlkernels import _validate as v
from rlkernels._backend import select_backend
from rlkernels.reference import dapo as reference
from rlkernels.reference.dapo import DynamicSampling

Tensor = torch.Tensor


@v.keyword_options
def dynamic_sampling(
    rewards: Tensor,
    group_ids: Tensor | None = None,
    *,
    group_size: int | None = None,
    target_groups: int | None = None,
    keep_singletons: bool = True,
    backend: str = "auto",
) -> DynamicSampling:
    """DAPO dynamic sampling: which groups to keep (metric std > 0) and how many more a batch needs.

    A group whose metric is equal across its members (all correct, all wrong) gives zero advantage and
    is dropped; a group of one is kept, as verl 0.9.1 keeps it (keep_singletons=False drops it).

    Args:
        rewards: [B] float, the metric per sequence (reward, accuracy, ...); finite.
        group_ids: [B] int32/int64, equal ids form a group (any values, any order, uneven sizes); or
        group_size: contiguous groups of this size (B divisible by it). Exactly one of the two.
        target_groups: the number of groups the batch should hold (>= 0), or None.
        keep_singletons: keep groups of one member.
        backend: "auto" | "reference" (the only implementation).

    Returns:
        DynamicSampling(keep, indices, group_ids, group_keep, num_groups, groups_needed), see
        rlkernels/reference/dapo.py. `indices` has a data-dependent size (a host sync on GPU tensors);
        the rest does not sync, except torch.unique of the ids on GPU.
    """
    op = "dynamic_sampling"
    v.check_float(op, rewards, "rewards")
    v.check_ndim(op, rewards, "rewards", (1,))
    if (group_size is None) == (group_ids is None):
        raise ValueError(f"{op}: give exactly one of group_ids or group_size")
    if group_ids is not None:
        v.check_index(op, group_ids, "group_ids")
        v.check_shape(op, group_ids, "group_ids", rewards.shape, "rewards")
        device = v.check_same_device(op, rewards=rewards, group_ids=group_ids)
    else:
        size = v.check_number(op, group_size, "group_size", ge=1)
        if not isinstance(size, int) or rewards.shape[0] % size:
            raise ValueError(
                f"{op}: group_size must be an int dividing B = {rewards.shape[0]}, got {group_size!r}"
            )
        device = rewards.device
        group_ids = torch.arange(rewards.shape[0], device=device) // size
    if target_groups is not None and (isinstance(target_groups, bool) or not isinstance(target_groups, int)):
        raise TypeError(f"{op}: target_groups must be an int or None, got {type(target_groups).__name__}")
    if target_groups is not None and target_groups < 0:
        raise ValueError(f"{op}: target_groups must be >= 0, got {target_groups}")
    if not isinstance(keep_singletons, bool):
        raise TypeError(f"{op}: keep_singletons must be a bool, got {type(keep_singletons).__name__}")
    v.check_finite(op, rewards, "rewards")
    select_backend(op, backend, device, implemented=())
    return reference.dynamic_sampling(
        rewards.detach(), group_ids, target_groups=target_groups, keep_singletons=keep_singletons
    )


@v.keyword_options
def overlong_penalty(
    lengths: Tensor,
    *,
    max_resp_len: int,
    buffer_len: int,
    penalty_factor: float = 1.0,
    backend: str = "auto",
) -> Tensor:
    """DAPO's soft overlong penalty per response, to add to its reward (verl 0.9.1 overlong_buffer):
    min(-(L - (max_resp_len - buffer_len)) / buffer_len · penalty_factor, 0). 0 up to
    max_resp_len - buffer_len (inclusive), -penalty_factor at L = max_resp_len; not bounded below (as verl).

    Args:
        lengths: response lengths, any shape, integer or float (finite, >= 0).
        max_resp_len: the maximum response length (int > 0); buffer_len: the soft buffer, an int in
            (0, max_resp_len] (verl's overlong_buffer.len); penalty_factor: >= 0.
        backend: "auto" | "reference" (the only implementation).

    Returns:
        The penalty, lengths' shape, float32 (float64 for float64 lengths), <= 0.
    """
    op = "overlong_penalty"
    v.check_tensor(op, lengths, "lengths")
    if lengths.dtype == torch.bool or lengths.is_complex():
        raise TypeError(f"{op}: lengths must be an integer or floating tensor, got {lengths.dtype}")
    for name, value in (("max_resp_len", max_resp_len), ("buffer_len", buffer_len)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{op}: {name} must be an int, got {type(value).__name__}")
    v.check_number(op, max_resp_len, "max_resp_len", gt=0)
    v.check_number(op, buffer_len, "buffer_len", gt=0, le=max_resp_len)
    penalty_factor = float(v.check_number(op, penalty_factor, "penalty_factor", ge=0))
    if lengths.is_floating_point():
        v.check_nonnegative(op, lengths, "lengths")
    elif lengths.numel():
        low = lengths.amin()
        if v.checks_eagerly(lengths):
            if bool(low < 0):
                raise ValueError(f"{op}: lengths must be >= 0, found {int(low)}")
        else:
            v.assert_async(low >= 0, f"{op}: lengths must be >= 0")
    select_backend(op, backend, lengths.device, implemented=())
    return reference.overlong_penalty(lengths.detach(), max_resp_len, buffer_len, penalty_factor)
