"""grpo_passk and opo Triton kernels (rlkernels/reference/advantage_estimators.py grpo_passk_scores,
opo_scores; verl 0.9.1).

Groups are named by their representative, the index of their first member (advantages.py
`group_representatives`: a stable sort, device ops, no host sync). Each group's statistics accumulate at its
representative with atomics, one launch per pass that needs the previous pass complete, and a last pass
writes each response's advantage. The statistics are fp64 whatever the scores' dtype: atomics add in no
fixed order, and an fp32 running sum loses the small terms that come after large ones (as group_advantages'
representative path). The last pass computes in fp64 too, then stores in the scores' dtype.

    grpo_passk  1. count, Σ (s - pivot), best (atomic max)
                2. centered sum of squares, ties of the best, second best (atomic max over the rest)
                3. the unique best of a group of two or more gets (best - second) / (std + eps)
    opo         1. count, Σ L, Σ L (s - pivot)
                2. s - (pivot + Σ L (s - pivot) / Σ L) (baseline 0 in a group of one or of empty responses)
"""

import functools

import torch
import triton
import triton.language as tl

from rlkernels.triton._common import cdiv, elementwise_block, float_arg
from rlkernels.triton._specializations import CompileCase, full, meta
from rlkernels.triton.advantages import group_representatives

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
def _member(s_ptr, rep_ptr, B, BLOCK: tl.constexpr):
    """This program's responses: (offsets, valid, score, representative, the group's first score); the
    scores in fp64."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    valid = offs < B
    s = tl.load(s_ptr + offs, mask=valid, other=0.0).to(tl.float64)
    rep = tl.load(rep_ptr + offs, mask=valid, other=0)
    pivot = tl.load(s_ptr + rep, mask=valid, other=0.0).to(tl.float64)
    return offs, valid, s, rep, pivot


@triton.jit
def _passk_first_kernel(
    s_ptr,  # [B] scores (fp32 / fp64)
    rep_ptr,  # [B] int64 representatives
    stats_ptr,  # [6, B] PASSK_STATS at the representatives (count, sum, m2, ties zeroed; best, second -inf)
    B,
    BLOCK: tl.constexpr,
):
    offs, valid, s, rep, pivot = _member(s_ptr, rep_ptr, B, BLOCK)
    tl.atomic_add(stats_ptr + rep, tl.where(valid, 1.0, 0.0).to(s.dtype), mask=valid, sem="relaxed")
    tl.atomic_add(stats_ptr + B + rep, s - pivot, mask=valid, sem="relaxed")
    tl.atomic_max(stats_ptr + 4 * B + rep, s, mask=valid, sem="relaxed")


@triton.jit
def _passk_second_kernel(
    s_ptr,  # [B]
    rep_ptr,  # [B]
    stats_ptr,  # [6, B]
    B,
    BLOCK: tl.constexpr,
):
    offs, valid, s, rep, pivot = _member(s_ptr, rep_ptr, B, BLOCK)
    n = tl.load(stats_ptr + rep, mask=valid, other=1.0)
    mean = pivot + tl.load(stats_ptr + B + rep, mask=valid, other=0.0) / n
    best = tl.load(stats_ptr + 4 * B + rep, mask=valid, other=0.0)
    d = s - mean
    is_best = s == best
    tl.atomic_add(stats_ptr + 2 * B + rep, d * d, mask=valid, sem="relaxed")
    tl.atomic_add(
        stats_ptr + 3 * B + rep, tl.where(is_best, 1.0, 0.0).to(s.dtype), mask=valid & is_best, sem="relaxed"
    )
    tl.atomic_max(stats_ptr + 5 * B + rep, s, mask=valid & (~is_best), sem="relaxed")


@triton.jit
def _passk_finish_kernel(
    s_ptr,  # [B]
    rep_ptr,  # [B]
    stats_ptr,  # [6, B]
    out_ptr,  # [B] advantages
    B,
    eps: tl.float64,
    NORM_BY_STD: tl.constexpr,
    BLOCK: tl.constexpr,
):
    offs, valid, s, rep, pivot = _member(s_ptr, rep_ptr, B, BLOCK)
    n = tl.load(stats_ptr + rep, mask=valid, other=1.0)
    m2 = tl.load(stats_ptr + 2 * B + rep, mask=valid, other=0.0)
    ties = tl.load(stats_ptr + 3 * B + rep, mask=valid, other=0.0)
    best = tl.load(stats_ptr + 4 * B + rep, mask=valid, other=0.0)
    second = tl.load(stats_ptr + 5 * B + rep, mask=valid, other=0.0)
    eps = float_arg(eps, s.dtype)
    out = passk_advantage(s, n, best, ties, second, m2, eps, NORM_BY_STD)
    tl.store(out_ptr + offs, out.to(out_ptr.dtype.element_ty), mask=valid)


@triton.jit
def _opo_sums_kernel(
    s_ptr,  # [B] scores
    len_ptr,  # [B] lengths (mask sums), scores' dtype
    rep_ptr,  # [B] int64 representatives
    stats_ptr,  # [3, B] OPO_STATS at the representatives (zeroed)
    B,
    BLOCK: tl.constexpr,
):
    offs, valid, s, rep, pivot = _member(s_ptr, rep_ptr, B, BLOCK)
    length = tl.load(len_ptr + offs, mask=valid, other=0.0).to(tl.float64)
    tl.atomic_add(stats_ptr + rep, tl.where(valid, 1.0, 0.0).to(s.dtype), mask=valid, sem="relaxed")
    tl.atomic_add(stats_ptr + B + rep, length, mask=valid, sem="relaxed")
    tl.atomic_add(stats_ptr + 2 * B + rep, length * (s - pivot), mask=valid, sem="relaxed")


@triton.jit
def _opo_finish_kernel(
    s_ptr,  # [B]
    rep_ptr,  # [B]
    stats_ptr,  # [3, B]
    out_ptr,  # [B] advantages
    B,
    BLOCK: tl.constexpr,
):
    offs, valid, s, rep, pivot = _member(s_ptr, rep_ptr, B, BLOCK)
    n = tl.load(stats_ptr + rep, mask=valid, other=1.0)
    weight = tl.load(stats_ptr + B + rep, mask=valid, other=0.0)
    shift = tl.load(stats_ptr + 2 * B + rep, mask=valid, other=0.0)
    out = opo_advantage(s, n, pivot, shift, weight)
    tl.store(out_ptr + offs, out.to(out_ptr.dtype.element_ty), mask=valid)


def _check(scores: torch.Tensor) -> None:
    if scores.dtype not in (torch.float32, torch.float64):
        raise TypeError(
            f"scores must be float32 or float64 (the estimators' compute dtypes), got {scores.dtype}"
        )


def grpo_passk_forward(
    scores: torch.Tensor, group_ids: torch.Tensor, eps: float, norm_by_std: bool
) -> torch.Tensor:
    """scores [B] fp32/fp64, group_ids [B] int -> per-response advantages [B] (scores' dtype)."""
    _check(scores)
    s = scores.contiguous()
    b = s.numel()
    out = torch.empty_like(s)
    if b == 0:
        return out
    rep = group_representatives(group_ids)
    stats = torch.zeros((PASSK_STATS, b), dtype=torch.float64, device=s.device)  # the module docstring
    stats[4:].fill_(-torch.inf)
    block = elementwise_block(b)
    grid = (cdiv(b, block),)
    _passk_first_kernel[grid](s, rep, stats, b, BLOCK=block)
    _passk_second_kernel[grid](s, rep, stats, b, BLOCK=block)
    _passk_finish_kernel[grid](s, rep, stats, out, b, float(eps), NORM_BY_STD=norm_by_std, BLOCK=block)
    return out


def opo_forward(scores: torch.Tensor, lengths: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """scores, lengths [B] fp32/fp64 (one dtype), group_ids [B] int -> per-response advantages [B]."""
    _check(scores)
    s, length = scores.contiguous(), lengths.to(scores.dtype).contiguous()
    b = s.numel()
    out = torch.empty_like(s)
    if b == 0:
        return out
    rep = group_representatives(group_ids)
    stats = torch.zeros((OPO_STATS, b), dtype=torch.float64, device=s.device)
    block = elementwise_block(b)
    grid = (cdiv(b, block),)
    _opo_sums_kernel[grid](s, length, rep, stats, b, BLOCK=block)
    _opo_finish_kernel[grid](s, rep, stats, out, b, BLOCK=block)
    return out


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
