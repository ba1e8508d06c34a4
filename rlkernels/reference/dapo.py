"""DAPO's batch utilities in eager PyTorch: the spec and the implementation of rk.dynamic_sampling and
rk.overlong_penalty ([B]-sized inputs: nothing for a kernel to fuse).

Dynamic sampling (DAPO, Yu et al. 2025, §3.2; verl 0.9.1 `trainer/ppo/v1/replay_buffer.py`
`_dapo_filtered_keys`): a group of responses to one prompt whose metric (reward) is the same for every
member gives zero advantage and no gradient; it is dropped, and the trainer samples more prompts until
the batch holds its target number of groups. verl drops a group when it has more than one member and
np.std of its metric is 0, so a singleton group is kept. Here "std > 0" is tested as max > min within
the group: equal in exact arithmetic, and exact in floating point, where a computed std of equal values
(their mean rounded) can come out a few ulps above 0.

Overlong reward shaping (DAPO §3.4; verl 0.9.1 `workers/reward_manager/dapo.py`, overlong_buffer): with
L the response length, L_max = max_resp_len and L_cache = buffer_len,
    penalty(L) = min(-(L - (L_max - L_cache)) / L_cache · penalty_factor, 0)
0 up to L_max - L_cache, then linear down to -penalty_factor at L = L_max. verl does not bound it below
(a length over L_max gives less than -penalty_factor); the paper's -1 beyond L_max is that bound.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

Tensor = torch.Tensor


class DynamicSampling(NamedTuple):
    """What dynamic_sampling returns.

    keep: [B] bool, True where the sequence's group has non-zero metric std (or is a kept singleton).
    indices: [K] int64, the positions of the kept sequences, ascending (data-dependent size: on a GPU,
        forming it syncs with the host, as any batch selection does).
    group_ids: [G] the distinct group ids, ascending; group_keep: [G] bool, whether each group is kept.
    num_groups: 0-dim int64, the number of kept groups.
    groups_needed: 0-dim int64, max(target_groups - num_groups, 0); None without target_groups.
    """

    keep: Tensor
    indices: Tensor
    group_ids: Tensor
    group_keep: Tensor
    num_groups: Tensor
    groups_needed: Tensor | None


def dynamic_sampling(
    rewards: Tensor, group_ids: Tensor, *, target_groups: int | None = None, keep_singletons: bool = True
) -> DynamicSampling:
    """Groups of `rewards` [B] (equal `group_ids` [B], any integers in any order) whose rewards differ."""
    ids, inverse, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    g = ids.numel()
    high = rewards.new_full((g,), -torch.inf).scatter_reduce(0, inverse, rewards, "amax")
    low = rewards.new_full((g,), torch.inf).scatter_reduce(0, inverse, rewards, "amin")
    group_keep = high > low
    if keep_singletons:
        group_keep |= counts == 1
    keep = group_keep[inverse]
    num_groups = group_keep.sum()
    needed = None if target_groups is None else (target_groups - num_groups).clamp(min=0)
    return DynamicSampling(keep, keep.nonzero().squeeze(-1), ids, group_keep, num_groups, needed)


def overlong_penalty(lengths: Tensor, max_resp_len: int, buffer_len: int, penalty_factor: float) -> Tensor:
    """The soft overlong penalty of each length (float64 for float64 lengths, else float32)."""
    dtype = torch.float64 if lengths.dtype == torch.float64 else torch.float32
    exceed = lengths.to(torch.float64) - (max_resp_len - buffer_len)
    return ((-exceed / buffer_len * penalty_factor).clamp(max=0.0) + 0.0).to(dtype)  # + 0.0: no -0.0
