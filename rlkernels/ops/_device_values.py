"""Python numbers onto the device without a host sync.

`torch.tensor(values, device="cuda")` copies from pageable host memory, and torch follows such a copy with a
stream synchronize (at::cuda::memcpy_and_sync): the host waits for every kernel queued before it. Options
given as numbers (reward weights, a KL reference point, shard sizes) are written by fills instead, each a
scalar kernel argument (`rlkernels/fake_cuda/host_syncs.py` counts the blocking copy as a sync)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch


def device_values(values: Sequence[float | int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """[K] tensor of `values` (K >= 1) on `device`: one fill, and one more per entry that differs from the
    first (a reward-weight vector of K numbers, usually all equal, takes one or a few); integers in an
    arithmetic progression (the ends of equal vocabulary shards) one `arange`, exact."""
    first = values[0]
    step = values[1] - first if len(values) > 2 else 0
    integral = not dtype.is_floating_point and dtype != torch.bool
    if integral and step and all(b - a == step for a, b in itertools.pairwise(values)):
        return torch.arange(first, first + step * len(values), step, dtype=dtype, device=device)
    out = torch.full((len(values),), first, dtype=dtype, device=device)
    for i, x in enumerate(values[1:], 1):
        if x != first:
            out[i] = x
    return out
