"""grpo_passk and opo Triton kernels (rlkernels/reference/advantage_estimators.py grpo_passk_scores,
opo_scores; verl 0.9.1).

One program walks the responses in the order of a stable sort of their group ids (`torch.sort`: equal ids
become runs, each headed by the group's first member), as group_advantages' sorted walk does
(advantages.py): each response's group is named by the sorted position of its run's head (a running max of
the heads' positions, carried between chunks). Each group's statistics accumulate at that position with
atomics, one walk per pass that needs the previous pass complete (a barrier between walks; the statistics
read back with volatile loads), and a last walk writes each response's advantage: one launch after the sort,
and the scores' finiteness in its flag. The statistics are fp64 whatever the scores' dtype: atomics add in no
fixed order, and an fp32 running sum loses the small terms that come after large ones. The last walk computes
in fp64 too, then stores in the scores' dtype.

    grpo_passk  1. count, Σ (s - pivot), best (atomic max); pivot: the group's first score
                2. centered sum of squares, ties of the best, second best (atomic max over the rest)
                3. the unique best of a group of two or more gets (best - second) / (std + eps)
    opo         1. count, Σ L, Σ L (s - pivot)
                2. s - (pivot + Σ L (s - pivot) / Σ L) (baseline 0 in a group of one or of empty responses)
"""

import functools

import torch
import triton
import triton.language as tl

from rlkernels.triton._common import float_arg
from rlkernels.triton._specializations import CompileCase, full, meta
from rlkernels.triton.advantages import SORTED_WARPS, _head_positions, _sorted_chunk

PASSK_STATS = 6  # count, Σ (s - pivot), m2, ties, best, second
OPO_STATS = 3  # count, Σ L, Σ L (s - pivot)


@triton.jit
def passk_advantage(r, n, best, ties, second, m2, eps, NORM_BY_STD: tl.constexpr):
    """Mirrors rlk::passk_advantage (csrc/include/rlkernels/outcome_estimators.h)."""
    learns = (r == best) & (ties == 1.0) & (n > 1.0)
    gap = tl.where(learns, best - second, 0.0)  # elsewhere second may be -inf
    if NORM_BY_STD:
        std = tl.sqrt(m2 / tl.where(n > 1.0, n - 1.0, 1.0))
        denom = tl.where(n > 1.0, std, 1.0) + eps
        gap = tl.where(denom > 0, gap / tl.where(denom > 0, denom, 1.0), 0.0)
    return gap


@triton.jit
def opo_advantage(r, n, pivot, weighted_shift, weight):
    """Mirrors rlk::opo_advantage (csrc/include/rlkernels/outcome_estimators.h)."""
    multi = (n > 1.0) & (weight > 0)
    return r - tl.where(multi, pivot + weighted_shift / tl.where(multi, weight, 1.0), 0.0)


@triton.jit
def _response(s_ptr, ids_ptr, perm_ptr, pos, inside, b, carried):
    """The responses at sorted positions `pos`: (original index, score and its group's first score in fp64,
    the sorted position of its group's head, the chunk's last head for the next chunk)."""
    idx = tl.load(perm_ptr + pos, mask=inside, other=0)
    key = tl.load(ids_ptr + pos, mask=inside, other=0)
    prev = tl.load(ids_ptr + pos - 1, mask=inside & (pos > 0), other=0)
    head = inside & ((pos == 0) | (key != prev))
    h = _head_positions(head, pos, carried)
    s = tl.load(s_ptr + idx, mask=inside, other=0.0).to(tl.float64)
    first = tl.load(perm_ptr + h, mask=inside, other=0)
    pivot = tl.load(s_ptr + first, mask=inside, other=0.0).to(tl.float64)
    return idx, s, h, pivot, tl.max(h, axis=0, keep_dims=True)


@triton.jit
def _fill(stats_ptr, b, row, value, CHUNK: tl.constexpr):
    """stats[row, :] = value."""
    for p0 in range(0, b, CHUNK):
        pos = p0 + tl.arange(0, CHUNK)
        tl.store(stats_ptr + row * b + pos, tl.full([CHUNK], value, tl.float64), mask=pos < b)


@triton.jit
def _passk_kernel(
    s_ptr,  # [B] scores (fp32 / fp64)
    ids_ptr,  # [B] sorted group ids
    perm_ptr,  # [B] int64 their original indices
    stats_ptr,  # [6, B] fp64 scratch: PASSK_STATS at each group's head position
    out_ptr,  # [B] advantages
    ok_ptr,  # [] bool: every score finite
    b,
    eps: tl.float64,
    NORM_BY_STD: tl.constexpr,
    CHUNK: tl.constexpr,  # responses per step of a walk (advantages._sorted_chunk)
):
    """One program (grid (1,)): the walks of the module docstring."""
    lanes = tl.arange(0, CHUNK)
    for row in tl.static_range(4):  # count, sum, m2, ties 0; best, second -inf
        _fill(stats_ptr, b, row, 0.0, CHUNK)
    _fill(stats_ptr, b, 4, float("-inf"), CHUNK)
    _fill(stats_ptr, b, 5, float("-inf"), CHUNK)
    tl.debug_barrier()
    bad = tl.zeros([CHUNK], tl.float64)
    carried = tl.zeros([1], tl.int64)
    for p0 in range(0, b, CHUNK):  # 1. count, Σ (s - pivot), best
        pos = p0 + lanes
        inside = pos < b
        _, s, h, pivot, carried = _response(s_ptr, ids_ptr, perm_ptr, pos, inside, b, carried)
        bad += tl.where(inside & ((s - s) != 0), 1.0, 0.0)
        tl.atomic_add(stats_ptr + h, tl.where(inside, 1.0, 0.0), mask=inside, sem="relaxed")
        tl.atomic_add(stats_ptr + b + h, s - pivot, mask=inside, sem="relaxed")
        tl.atomic_max(stats_ptr + 4 * b + h, s, mask=inside, sem="relaxed")
    tl.store(ok_ptr, tl.sum(bad, axis=0) == 0)
    tl.debug_barrier()
    carried = tl.zeros([1], tl.int64)
    for p0 in range(0, b, CHUNK):  # 2. centered sum of squares, ties of the best, second best
        pos = p0 + lanes
        inside = pos < b
        _, s, h, pivot, carried = _response(s_ptr, ids_ptr, perm_ptr, pos, inside, b, carried)
        n = tl.load(stats_ptr + h, mask=inside, other=1.0, volatile=True)
        mean = pivot + tl.load(stats_ptr + b + h, mask=inside, other=0.0, volatile=True) / n
        best = tl.load(stats_ptr + 4 * b + h, mask=inside, other=0.0, volatile=True)
        d = s - mean
        is_best = s == best
        tl.atomic_add(stats_ptr + 2 * b + h, d * d, mask=inside, sem="relaxed")
        tl.atomic_add(
            stats_ptr + 3 * b + h, tl.full([CHUNK], 1.0, tl.float64), mask=inside & is_best, sem="relaxed"
        )
        tl.atomic_max(stats_ptr + 5 * b + h, s, mask=inside & (~is_best), sem="relaxed")
    tl.debug_barrier()
    eps = float_arg(eps, tl.float64)
    carried = tl.zeros([1], tl.int64)
    for p0 in range(0, b, CHUNK):  # 3. the advantages
        pos = p0 + lanes
        inside = pos < b
        idx, s, h, _, carried = _response(s_ptr, ids_ptr, perm_ptr, pos, inside, b, carried)
        n = tl.load(stats_ptr + h, mask=inside, other=1.0, volatile=True)
        m2 = tl.load(stats_ptr + 2 * b + h, mask=inside, other=0.0, volatile=True)
        ties = tl.load(stats_ptr + 3 * b + h, mask=inside, other=0.0, volatile=True)
        best = tl.load(stats_ptr + 4 * b + h, mask=inside, other=0.0, volatile=True)
        second = tl.load(stats_ptr + 5 * b + h, mask=inside, other=0.0, volatile=True)
        out = passk_advantage(s, n, best, ties, second, m2, eps, NORM_BY_STD)
        tl.store(out_ptr + idx, out.to(out_ptr.dtype.element_ty), mask=inside)


@triton.jit
def _opo_kernel(
    s_ptr,  # [B] scores
    len_ptr,  # [B] lengths (mask sums), scores' dtype
    ids_ptr,  # [B] sorted group ids
    perm_ptr,  # [B] int64 their original indices
    stats_ptr,  # [3, B] fp64 scratch: OPO_STATS at each group's head position
    out_ptr,  # [B] advantages
    ok_ptr,  # [] bool: every score finite
    b,
    CHUNK: tl.constexpr,
):
    """One program (grid (1,)): the walks of the module docstring."""
    lanes = tl.arange(0, CHUNK)
    for row in tl.static_range(3):
        _fill(stats_ptr, b, row, 0.0, CHUNK)
    tl.debug_barrier()
    bad = tl.zeros([CHUNK], tl.float64)
    carried = tl.zeros([1], tl.int64)
    for p0 in range(0, b, CHUNK):  # 1. count, Σ L, Σ L (s - pivot)
        pos = p0 + lanes
        inside = pos < b
        idx, s, h, pivot, carried = _response(s_ptr, ids_ptr, perm_ptr, pos, inside, b, carried)
        length = tl.load(len_ptr + idx, mask=inside, other=0.0).to(tl.float64)
        bad += tl.where(inside & ((s - s) != 0), 1.0, 0.0)
        tl.atomic_add(stats_ptr + h, tl.where(inside, 1.0, 0.0), mask=inside, sem="relaxed")
        tl.atomic_add(stats_ptr + b + h, length, mask=inside, sem="relaxed")
        tl.atomic_add(stats_ptr + 2 * b + h, length * (s - pivot), mask=inside, sem="relaxed")
    tl.store(ok_ptr, tl.sum(bad, axis=0) == 0)
    tl.debug_barrier()
    carried = tl.zeros([1], tl.int64)
    for p0 in range(0, b, CHUNK):  # 2. the advantages
        pos = p0 + lanes
        inside = pos < b
        idx, s, h, pivot, carried = _response(s_ptr, ids_ptr, perm_ptr, pos, inside, b, carried)
        n = tl.load(stats_ptr + h, mask=inside, other=1.0, volatile=True)
        weight = tl.load(stats_ptr + b + h, mask=inside, other=0.0, volatile=True)
        shift = tl.load(stats_ptr + 2 * b + h, mask=inside, other=0.0, volatile=True)
        out = opo_advantage(s, n, pivot, shift, weight)
        tl.store(out_ptr + idx, out.to(out_ptr.dtype.element_ty), mask=inside)


def _check(scores: torch.Tensor) -> None:
    if scores.dtype not in (torch.float32, torch.float64):
        raise TypeError(
            f"scores must be float32 or float64 (the estimators' compute dtypes), got {scores.dtype}"
        )


def grpo_passk_forward(
    scores: torch.Tensor, group_ids: torch.Tensor, eps: float, norm_by_std: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """scores [B] fp32/fp64, group_ids [B] int -> (per-response advantages [B] in scores' dtype, ok [] bool:
    every score finite). torch.sort, then one launch."""
    _check(scores)
    s = scores.contiguous()
    b = s.numel()
    out = torch.empty_like(s)
    if b == 0:
        return out, torch.ones((), dtype=torch.bool, device=s.device)
    ids, perm = torch.sort(group_ids, stable=True)
    stats = torch.empty((PASSK_STATS, b), dtype=torch.float64, device=s.device)  # the module docstring
    ok = torch.empty((), dtype=torch.bool, device=s.device)
    _passk_kernel[(1,)](
        s, ids, perm, stats, out, ok, b, float(eps), NORM_BY_STD=norm_by_std, CHUNK=_sorted_chunk(b),
        num_warps=SORTED_WARPS,
    )  # fmt: skip
    return out, ok


def opo_forward(
    scores: torch.Tensor, lengths: torch.Tensor, group_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """scores, lengths [B] fp32/fp64 (one dtype), group_ids [B] int -> (per-response advantages [B], ok []
    bool: every score finite). torch.sort, then one launch."""
    _check(scores)
    s, length = scores.contiguous(), lengths.to(scores.dtype).contiguous()
    b = s.numel()
    out = torch.empty_like(s)
    if b == 0:
        return out, torch.ones((), dtype=torch.bool, device=s.device)
    ids, perm = torch.sort(group_ids, stable=True)
    stats = torch.empty((OPO_STATS, b), dtype=torch.float64, device=s.device)
    ok = torch.empty((), dtype=torch.bool, device=s.device)
    _opo_kernel[(1,)](s, length, ids, perm, stats, out, ok, b, CHUNK=_sorted_chunk(b), num_warps=SORTED_WARPS)
    return out, ok


def compile_cases():
    """Both estimators x dtype x norm_by_std (passk) at an aligned and an odd size."""
    for row in full({"dtype": (torch.float32, torch.float64), "size": (4096, 4099)}):
        scores, ids = meta(row["size"], dtype=row["dtype"]), meta(row["size"], dtype=torch.int64)
        label = f"{str(row['dtype']).removeprefix('torch.')},{row['size']}"
        for norm in (True, False):
            yield CompileCase(
                f"grpo_passk_forward[{label},norm_by_std={norm}]",
                functools.partial(grpo_passk_forward, scores, ids, 1e-6, norm),
            )
        yield CompileCase(f"opo_forward[{label}]", functools.partial(opo_forward, scores, scores, ids))
