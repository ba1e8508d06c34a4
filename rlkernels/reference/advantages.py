"""Group advantages of outcome rewards (verl `compute_grpo_outcome_advantage` /
`compute_rloo_outcome_advantage`, Dr.GRPO, TRL's batch-scaled GRPO).

For a group g of n rewards with mean m_g and unbiased std s_g:
    grpo     (r - m_g) / (s_g + eps)          a group of one: mean 0, std 1 -> r / (1 + eps)
    dr_grpo  r - m_g                          a group of one: r
    rloo     n / (n - 1) * (r - m_g)          a group of one: r
    batch    (r - m_g) / (s_batch + eps)      s_batch: unbiased std of all rewards (1 for a batch of one)
A group whose rewards are all equal gives exactly 0: the mean is taken as pivot + mean(r - pivot) with
the group's first reward as pivot, so r - m_g is exactly 0 there (and the sums lose less precision).
A zero denominator (only possible with eps = 0) gives 0.

`group_advantages` is the vectorized spec (the "reference" backend and the test oracle);
`group_advantages_loop` is the verl-style dictionary loop it must agree with (the benchmark baseline).
"""

from __future__ import annotations

from collections import defaultdict

import torch

GROUP_MODES = ("grpo", "dr_grpo", "rloo", "batch")
# Mode name -> the code the C++ (csrc/include/rlkernels/advantages.h) and Triton kernels use.
# "gpg" is the group op's only (gpg_advantages): dr_grpo's centered rewards times eps / max(#{r != 0}, 1), eps
# carrying B / f_norm.
GROUP_MODE_CODES = {"grpo": 0, "dr_grpo": 1, "rloo": 2, "batch": 3, "gpg": 4}
# The kernels' flag for TRL's rule on a group of one (advantage 0; verl's modes keep its reward, centered on
# 0): added to a mode's code, and its name's suffix for the group_advantages op (trl_grpo_advantages only).
ZERO_SINGLES, ZERO_SINGLES_SUFFIX = 8, "_trl"


def group_mode_code(mode: str) -> int:
    """The kernels' code of a mode name, with the ZERO_SINGLES flag for the suffix."""
    if mode.endswith(ZERO_SINGLES_SUFFIX):
        return GROUP_MODE_CODES[mode.removesuffix(ZERO_SINGLES_SUFFIX)] + ZERO_SINGLES
    return GROUP_MODE_CODES[mode]


def batch_std(rewards: torch.Tensor) -> torch.Tensor:
    """Unbiased std of all rewards as a 0-dim tensor; 1 for a batch of one (as a group of one)."""
    if rewards.numel() <= 1:
        return torch.ones((), dtype=rewards.dtype, device=rewards.device)
    return rewards.std()


def group_sums(x: torch.Tensor, inverse: torch.Tensor, slots: int) -> torch.Tensor:
    """[slots, ...] sums of x [B, ...] over each group's members (inverse [B]: each member's group).

    The members are added from the last to the first. The CPU runs of the atomic GPU kernels (Triton's
    interpreter, the CUDA harness) add roughly in index order, and so would an in-order fp32 reference: a
    kernel whose rounding depends on the order would then match this reference's rounding on the CPU by
    coincidence, and miss it on a GPU, whose atomics add in no fixed order (the H200 run: groups wider than
    a Triton tile). Summed in another order, such a kernel's error shows on the CPU too (docs/testing.md)."""
    return x.new_zeros((slots, *x.shape[1:])).index_add_(0, inverse.flip(0), x.flip(0))


def advantage_from_stats(
    rewards: torch.Tensor, n: torch.Tensor, mean: torch.Tensor, m2: torch.Tensor, mode: str, eps: float, bstd
) -> torch.Tensor:
    """Per-element advantage from its group's count n, mean and centered sum of squares m2 ([B] each)."""
    multi = n > 1
    centered = torch.where(multi, rewards - mean, rewards)  # a group of one has mean 0
    denom_n = torch.where(multi, n - 1, torch.ones_like(n))
    if mode == "grpo":
        return _scaled(centered, torch.where(multi, torch.sqrt(m2 / denom_n), torch.ones_like(m2)) + eps)
    if mode == "dr_grpo":
        return centered
    if mode == "rloo":
        return torch.where(multi, n / denom_n * centered, rewards)
    if mode == "batch":
        return _scaled(centered, (bstd + eps).expand_as(centered))
    raise ValueError(f"unknown mode {mode!r}")


def _scaled(x: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """x / d, and 0 where d == 0 (a zero std with eps = 0: every centered reward is then 0 too)."""
    return torch.where(d > 0, x / torch.where(d > 0, d, torch.ones_like(d)), torch.zeros_like(x))


def group_advantages(
    rewards: torch.Tensor,
    group_size: int | None = None,
    group_ids: torch.Tensor | None = None,
    mode: str = "grpo",
    eps: float = 1e-6,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """rewards [B] -> advantages [B] (or [B, T] = advantages[:, None] * mask), in rewards' dtype.

    Groups: contiguous blocks of `group_size`, or equal values of `group_ids` [B] (any integers, any
    order, uneven sizes). torch.unique syncs with the host on GPU: this is the spec, not the fast path.
    """
    b = rewards.shape[0]
    if group_ids is None:
        group_ids = torch.arange(b, device=rewards.device) // group_size
    _, inverse, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    num_groups = counts.numel()
    idx = torch.arange(b, device=rewards.device)
    first = torch.full((num_groups,), b, dtype=idx.dtype, device=rewards.device)
    first = first.scatter_reduce(0, inverse, idx, reduce="amin")  # each group's first member
    pivot = rewards[first][inverse]
    n = counts.to(rewards.dtype)[inverse]
    mean = pivot + group_sums(rewards - pivot, inverse, num_groups)[inverse] / n
    m2 = group_sums((rewards - mean).square(), inverse, num_groups)[inverse]
    bstd = batch_std(rewards) if mode == "batch" else None
    adv = advantage_from_stats(rewards, n, mean, m2, mode, eps, bstd)
    return adv if mask is None else broadcast_to_tokens(adv, mask)


def broadcast_to_tokens(adv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B] sequence advantages -> [B, T] token advantages adv[:, None] * mask (verl)."""
    return adv.unsqueeze(-1) * mask.to(adv.dtype)


def group_advantages_loop(
    rewards: torch.Tensor,
    group_ids,
    mode: str = "grpo",
    eps: float = 1e-6,
) -> torch.Tensor:
    """The verl-style dictionary loop (per-element Python, torch.mean/torch.std per group): the
    semantics `group_advantages` implements, and the baseline of benchmarks/bench_advantages.py.
    `group_ids`: any sequence of hashable ids (verl passes a numpy array of uids)."""
    scores = rewards.clone()
    id2score = defaultdict(list)
    for i in range(len(scores)):
        id2score[group_ids[i]].append(scores[i])
    id2mean, id2std, id2n = {}, {}, {}
    for gid, members in id2score.items():
        id2n[gid] = len(members)
        if len(members) == 1:
            id2mean[gid] = torch.tensor(0.0, dtype=scores.dtype)
            id2std[gid] = torch.tensor(1.0, dtype=scores.dtype)
        else:
            stacked = torch.stack(members)
            id2mean[gid], id2std[gid] = torch.mean(stacked), torch.std(stacked)
    bstd = batch_std(rewards)
    for i in range(len(scores)):
        gid = group_ids[i]
        n = id2n[gid]
        if mode == "grpo":
            scores[i] = (scores[i] - id2mean[gid]) / (id2std[gid] + eps)
        elif mode == "dr_grpo":
            scores[i] = scores[i] - id2mean[gid]
        elif mode == "rloo":
            if n > 1:
                scores[i] = scores[i] * n / (n - 1) - id2mean[gid] * n / (n - 1)
        elif mode == "batch":
            scores[i] = (scores[i] - id2mean[gid]) / (bstd + eps)
        else:
            raise ValueError(f"unknown mode {mode!r}")
    return scores
