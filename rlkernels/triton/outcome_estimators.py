"""grpo_passk and opo Triton kernels (rlkernels/reference/advantage_estimators.py grpo_passk_scores,
opo_scores; verl 0.9.1).

One program walks the responses in the order of a stable sort of their group ids (`torch.sort`: equal ids
become runs, each headed by the group's first member), as group_advantages' sorted walk does
(advantages.py): each response's group is named by the sorted position of its run's head (a running max of
the heads' positions, carried between chunks). Each group's statistics accumulate at that position with
atomics, one walk per pass that needs the previous pass complete (a barrier between walks; the statistics
read back with volatile loads), and a last walk writes each response's advantage: one launch after the sort,
and the scores' finiteness in its flag. opo's launch has a program per response, each summing its mask row
into the lengths L (mask_rows.py); the last of them to finish walks. The statistics are fp64 whatever the
scores' dtype: atomics add in no fixed order, and an fp32 running sum loses the small terms that come after
large ones. The last walk computes in fp64 too, then stores in the scores' dtype.

    grpo_passk  1. count, Σ (s - pivot), best (atomic max); pivot: the group's first score
                2. centered sum of squares, ties of the best, second best (atomic max over the rest)
                3. the unique best of a group of two or more gets (best - second) / (std + eps)
    opo         1. count, Σ L, Σ L (s - pivot)
                2. s - (pivot + Σ L (s - pivot) / Σ L) (baseline 0 in a group of one or of empty responses)

Past one chunk of responses (advantages._parallel_chunk) each pass is a launch of its own over every
position instead (`_passk_chunk_kernel`, `_opo_chunk_kernel`), after one that finds each position's head by
a binary search of the sorted ids and fills the statistics (`_chunk_heads_kernel`; for opo, with a program
per mask row more for the lengths).
"""

import functools

import torch
import triton
import triton.language as tl

from rlkernels.triton._common import float_arg, tl_acc
from rlkernels.triton._device_assert import check, require
from rlkernels.triton._finish import last_program, launch_counter
from rlkernels.triton._mask import mask_kind
from rlkernels.triton._specializations import CompileCase, full, meta
from rlkernels.triton.advantages import (
    SORTED_WARPS,
    _head_positions,
    _parallel_chunk,
    _sorted_chunk,
)
from rlkernels.triton.mask_rows import publish_row_sum, row_block

# The walks' device assert (_device_assert), csrc/cuda/outcome_estimators.cu's message.
BAD_SCORES = "rlkernels grpo_passk / opo: a score is NaN or inf"
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
    s, pivot = _scored(s_ptr, perm_ptr, idx, h, inside)
    return idx, s, h, pivot, tl.max(h, axis=0, keep_dims=True)


@triton.jit
def _scored(s_ptr, perm_ptr, idx, h, inside):
    """(score, its group's first score) in fp64 of the responses at original indices idx, h their heads'
    sorted positions."""
    s = tl.load(s_ptr + idx, mask=inside, other=0.0).to(tl.float64)
    first = tl.load(perm_ptr + h, mask=inside, other=0)
    return s, tl.load(s_ptr + first, mask=inside, other=0.0).to(tl.float64)


@triton.jit
def _passk_pass(
    stats_ptr, out_ptr, b, idx, s, h, pivot, inside, eps, PASS: tl.constexpr, NORM_BY_STD: tl.constexpr
):
    """Pass PASS of grpo_passk (the module docstring) for the responses given, their statistics at their
    heads; pass 1 returns which scores are not finite (1.0 each)."""
    bad = tl.zeros_like(s)
    if PASS == 1:  # count, Σ (s - pivot), best
        bad = tl.where(inside & ((s - s) != 0), 1.0, 0.0)
        tl.atomic_add(stats_ptr + h, tl.where(inside, 1.0, 0.0), mask=inside, sem="relaxed")
        tl.atomic_add(stats_ptr + b + h, s - pivot, mask=inside, sem="relaxed")
        tl.atomic_max(stats_ptr + 4 * b + h, s, mask=inside, sem="relaxed")
    elif PASS == 2:  # centered sum of squares, ties of the best, second best
        n = tl.load(stats_ptr + h, mask=inside, other=1.0, volatile=True)
        mean = pivot + tl.load(stats_ptr + b + h, mask=inside, other=0.0, volatile=True) / n
        best = tl.load(stats_ptr + 4 * b + h, mask=inside, other=0.0, volatile=True)
        d = s - mean
        is_best = s == best
        tl.atomic_add(stats_ptr + 2 * b + h, d * d, mask=inside, sem="relaxed")
        tl.atomic_add(stats_ptr + 3 * b + h, tl.zeros_like(s) + 1.0, mask=inside & is_best, sem="relaxed")
        tl.atomic_max(stats_ptr + 5 * b + h, s, mask=inside & (~is_best), sem="relaxed")
    else:  # the advantages
        n = tl.load(stats_ptr + h, mask=inside, other=1.0, volatile=True)
        m2 = tl.load(stats_ptr + 2 * b + h, mask=inside, other=0.0, volatile=True)
        ties = tl.load(stats_ptr + 3 * b + h, mask=inside, other=0.0, volatile=True)
        best = tl.load(stats_ptr + 4 * b + h, mask=inside, other=0.0, volatile=True)
        second = tl.load(stats_ptr + 5 * b + h, mask=inside, other=0.0, volatile=True)
        out = passk_advantage(s, n, best, ties, second, m2, eps, NORM_BY_STD)
        tl.store(out_ptr + idx, out.to(out_ptr.dtype.element_ty), mask=inside)
    return bad


@triton.jit
def _opo_pass(stats_ptr, len_ptr, out_ptr, b, idx, s, h, pivot, inside, PASS: tl.constexpr):
    """Pass PASS of opo (the module docstring) for the responses given; pass 1 returns which scores are not
    finite (1.0 each)."""
    bad = tl.zeros_like(s)
    if PASS == 1:  # count, Σ L, Σ L (s - pivot)
        length = tl.load(len_ptr + idx, mask=inside, other=0.0, volatile=True)  # fp64, other programs'
        bad = tl.where(inside & ((s - s) != 0), 1.0, 0.0)
        tl.atomic_add(stats_ptr + h, tl.where(inside, 1.0, 0.0), mask=inside, sem="relaxed")
        tl.atomic_add(stats_ptr + b + h, length, mask=inside, sem="relaxed")
        tl.atomic_add(stats_ptr + 2 * b + h, length * (s - pivot), mask=inside, sem="relaxed")
    else:  # the advantages
        n = tl.load(stats_ptr + h, mask=inside, other=1.0, volatile=True)
        weight = tl.load(stats_ptr + b + h, mask=inside, other=0.0, volatile=True)
        shift = tl.load(stats_ptr + 2 * b + h, mask=inside, other=0.0, volatile=True)
        out = opo_advantage(s, n, pivot, shift, weight)
        tl.store(out_ptr + idx, out.to(out_ptr.dtype.element_ty), mask=inside)
    return bad


@triton.jit
def _fill(stats_ptr, b, row, value, CHUNK: tl.constexpr):
    """stats[row, :] = value."""
    for p0 in range(0, b, CHUNK):
        pos = p0 + tl.arange(0, CHUNK)
        tl.store(stats_ptr + row * b + pos, tl.full([CHUNK], value, tl.float64), mask=pos < b)


@triton.jit
def _walk(
    s_ptr, len_ptr, ids_ptr, perm_ptr, stats_ptr, out_ptr, b, eps, step,
    OPO: tl.constexpr,  # opo's passes (len_ptr its lengths), else grpo_passk's (eps, NORM_BY_STD theirs)
    NORM_BY_STD: tl.constexpr,
    CHUNK: tl.constexpr,
):  # fmt: skip
    """Pass `step` of a walk over the sorted responses, CHUNK at a time, each chunk's group heads carried from
    the chunk before (_response); returns the lanes' counts of bad scores."""
    lanes = tl.arange(0, CHUNK)
    bad = tl.zeros([CHUNK], tl.float64)
    carried = tl.zeros([1], tl.int64)
    for p0 in range(0, b, CHUNK):
        pos = p0 + lanes
        inside = pos < b
        idx, s, h, pivot, carried = _response(s_ptr, ids_ptr, perm_ptr, pos, inside, b, carried)
        if OPO:
            bad += _opo_pass(stats_ptr, len_ptr, out_ptr, b, idx, s, h, pivot, inside, step)
        else:
            bad += _passk_pass(stats_ptr, out_ptr, b, idx, s, h, pivot, inside, eps, step, NORM_BY_STD)
    return bad


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
    CHECK_MSG: tl.constexpr,  # the device assert's message, or None (_device_assert)
):
    """One program (grid (1,)): the walks of the module docstring."""
    for row in tl.static_range(4):  # count, sum, m2, ties 0; best, second -inf
        _fill(stats_ptr, b, row, 0.0, CHUNK)
    _fill(stats_ptr, b, 4, float("-inf"), CHUNK)
    _fill(stats_ptr, b, 5, float("-inf"), CHUNK)
    tl.debug_barrier()
    eps = float_arg(eps, tl.float64)
    for step in tl.static_range(1, 4):  # the passes, each after the one before is complete
        bad = _walk(s_ptr, s_ptr, ids_ptr, perm_ptr, stats_ptr, out_ptr, b, eps, step, False, NORM_BY_STD,
                    CHUNK)  # fmt: skip
        if step == 1:
            require(tl.sum(bad, axis=0) == 0, CHECK_MSG)
            tl.store(ok_ptr, tl.sum(bad, axis=0) == 0)
        tl.debug_barrier()  # this pass's atomics, made by other threads of this program, are read next


@triton.jit
def _opo_kernel(
    s_ptr,  # [B] scores
    m_ptr,  # [B, T] response mask: bool, integer (0 / 1) or float weights
    len_ptr,  # [B] fp64 scratch: the lengths Σ_t m, a program each
    counter_ptr,  # [1] int32, zero (_finish.launch_counter)
    ids_ptr,  # [B] sorted group ids
    perm_ptr,  # [B] int64 their original indices
    stats_ptr,  # [3, B] fp64 scratch: OPO_STATS at each group's head
    out_ptr,  # [B] advantages
    ok_ptr,  # [] bool: every score finite
    b,
    T,
    MASK_KIND: tl.constexpr,  # _mask.MASK_KINDS
    CHUNK: tl.constexpr,
    ROW_BLOCK: tl.constexpr,  # mask_rows.row_block
    CHECK_MSG: tl.constexpr,  # the device assert's message, or None (_device_assert)
):
    """Grid (B,): program p sums mask row p into len; the last program to finish walks (the module
    docstring)."""
    publish_row_sum(m_ptr, len_ptr, tl.program_id(0), T, MASK_KIND, s_ptr.dtype.element_ty, ROW_BLOCK)
    if last_program(counter_ptr, tl.num_programs(0)):
        for row in tl.static_range(3):
            _fill(stats_ptr, b, row, 0.0, CHUNK)
        tl.debug_barrier()
        for step in tl.static_range(1, 3):  # the passes, each after the one before is complete
            bad = _walk(
                s_ptr, len_ptr, ids_ptr, perm_ptr, stats_ptr, out_ptr, b, 0.0, step, True, False, CHUNK
            )
            if step == 1:
                require(tl.sum(bad, axis=0) == 0, CHECK_MSG)
                tl.store(ok_ptr, tl.sum(bad, axis=0) == 0)
            tl.debug_barrier()  # this pass's atomics, made by other threads of this program, are read next


# The chunk-parallel path (more than one chunk of responses): the walks' passes as launches of their own, a
# program per CHUNK sorted positions, each response's head found by a binary search of the sorted ids in place
# of the walk's carried running max; the passes' atomics at the heads as before.


@triton.jit
def _group_heads(ids_ptr, pos, inside, b):
    """Each sorted position's group head: the first position holding its id (a binary search, ids sorted)."""
    key = tl.load(ids_ptr + pos, mask=inside, other=0)
    lo = tl.zeros_like(pos)
    hi = pos
    span = b
    while span > 0:  # ceil(log2(b)) + 1 halvings of [lo, hi]
        mid = (lo + hi) // 2
        below = tl.load(ids_ptr + mid, mask=inside & (lo < hi), other=0) < key
        lo = tl.where((lo < hi) & below, mid + 1, lo)
        hi = tl.where((lo < hi) & ~below, mid, hi)
        span = span // 2
    return lo


@triton.jit
def _chunk_heads_kernel(
    ids_ptr,  # [B] sorted group ids
    head_ptr,  # [B] int64: each sorted position's group head
    stats_ptr,  # [rows, B] fp64: the passes' statistics, filled here (the rows >= ROWS_ZERO with -inf)
    bad_ptr,  # [1] fp64: the non-finite scores, zeroed here
    m_ptr,  # [B, T] response mask (LENGTHS)
    len_ptr,  # [B] fp64: the lengths Σ_t m (LENGTHS)
    b,
    T,
    heads_programs,  # the programs of the heads; LENGTHS: a program per mask row after them
    ROWS: tl.constexpr,
    ROWS_ZERO: tl.constexpr,
    LENGTHS: tl.constexpr,  # opo: the mask rows' sums too
    MASK_KIND: tl.constexpr,
    WEIGHT: tl.constexpr,  # the scores' dtype: a float mask's weights are rounded to it (LENGTHS)
    CHUNK: tl.constexpr,
    ROW_BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    if pid < heads_programs:
        pos = pid.to(tl.int64) * CHUNK + tl.arange(0, CHUNK)
        inside = pos < b
        tl.store(head_ptr + pos, _group_heads(ids_ptr, pos, inside, b), mask=inside)
        for row in tl.static_range(ROWS):
            fill = 0.0 if row < ROWS_ZERO else float("-inf")
            tl.store(stats_ptr + row * b + pos, tl.full([CHUNK], fill, tl.float64), mask=inside)
        if pid == 0:
            tl.store(bad_ptr + tl.arange(0, 1), tl.zeros([1], tl.float64))
    elif LENGTHS:
        publish_row_sum(m_ptr, len_ptr, pid - heads_programs, T, MASK_KIND, WEIGHT, ROW_BLOCK)


@triton.jit
def _passk_chunk_kernel(
    s_ptr,  # [B] scores
    perm_ptr,  # [B] int64 the sorted ids' original indices
    head_ptr,  # [B] int64 (_chunk_heads_kernel)
    stats_ptr,  # [6, B] fp64: PASSK_STATS at each group's head
    bad_ptr,  # [1] fp64: the non-finite scores (pass 1 adds, pass 2 reads)
    ok_ptr,  # [] bool (pass 2)
    out_ptr,  # [B] advantages (pass 3)
    b,
    eps: tl.float64,
    PASS: tl.constexpr,
    NORM_BY_STD: tl.constexpr,
    CHUNK: tl.constexpr,
    CHECK_MSG: tl.constexpr,  # the device assert's message (pass 2), or None (_device_assert)
):
    """One pass of _passk_kernel's walks over a chunk of sorted positions (grid (chunks,))."""
    pid = tl.program_id(0)
    pos = pid.to(tl.int64) * CHUNK + tl.arange(0, CHUNK)
    inside = pos < b
    idx = tl.load(perm_ptr + pos, mask=inside, other=0)
    h = tl.load(head_ptr + pos, mask=inside, other=0)
    s, pivot = _scored(s_ptr, perm_ptr, idx, h, inside)
    if PASS == 2 and pid == 0:
        require(tl.load(bad_ptr) == 0, CHECK_MSG)
        tl.store(ok_ptr, tl.load(bad_ptr) == 0)
    bad = _passk_pass(
        stats_ptr, out_ptr, b, idx, s, h, pivot, inside, float_arg(eps, tl.float64), PASS, NORM_BY_STD
    )
    if PASS == 1:
        tl.atomic_add(bad_ptr, tl.sum(bad, axis=0), sem="relaxed")


@triton.jit
def _opo_chunk_kernel(
    s_ptr,  # [B] scores
    len_ptr,  # [B] lengths
    perm_ptr,  # [B] int64 the sorted ids' original indices
    head_ptr,  # [B] int64 (_chunk_heads_kernel)
    stats_ptr,  # [3, B] fp64: OPO_STATS at each group's head
    bad_ptr,  # [1] fp64: the non-finite scores (pass 1 adds, pass 2 reads)
    ok_ptr,  # [] bool (pass 2)
    out_ptr,  # [B] advantages (pass 2)
    b,
    PASS: tl.constexpr,
    CHUNK: tl.constexpr,
    CHECK_MSG: tl.constexpr,  # the device assert's message (pass 2), or None (_device_assert)
):
    """One pass of _opo_kernel's walks over a chunk of sorted positions (grid (chunks,))."""
    pid = tl.program_id(0)
    pos = pid.to(tl.int64) * CHUNK + tl.arange(0, CHUNK)
    inside = pos < b
    idx = tl.load(perm_ptr + pos, mask=inside, other=0)
    h = tl.load(head_ptr + pos, mask=inside, other=0)
    s, pivot = _scored(s_ptr, perm_ptr, idx, h, inside)
    if PASS == 2 and pid == 0:
        require(tl.load(bad_ptr) == 0, CHECK_MSG)
        tl.store(ok_ptr, tl.load(bad_ptr) == 0)
    bad = _opo_pass(stats_ptr, len_ptr, out_ptr, b, idx, s, h, pivot, inside, PASS)
    if PASS == 1:
        tl.atomic_add(bad_ptr, tl.sum(bad, axis=0), sem="relaxed")


def _chunk_heads(ids, s, rows: int, rows_zero: int, chunk: int, mask=None):
    """The chunk path's first launch for scores s [B]: (heads [B], statistics [rows, B] filled, the bad count
    zeroed, and with a mask [B, T] the lengths [B] fp64 of its weights rounded to s's dtype (a program per
    row more), else None)."""
    b, device = s.numel(), s.device
    heads = torch.empty(b, dtype=torch.int64, device=device)
    stats = torch.empty((rows, b), dtype=torch.float64, device=device)
    bad = torch.empty(1, dtype=torch.float64, device=device)
    programs = triton.cdiv(b, chunk)
    lengths = None if mask is None else torch.empty(b, dtype=torch.float64, device=device)
    t = 0 if mask is None else mask.shape[1]
    m, lengths_arg = (bad, bad) if mask is None else (mask, lengths)  # unused without a mask
    _chunk_heads_kernel[(programs + (0 if mask is None else b),)](
        ids, heads, stats, bad, m, lengths_arg, b, t, programs,
        ROWS=rows, ROWS_ZERO=rows_zero, LENGTHS=mask is not None,
        MASK_KIND=0 if mask is None else mask_kind(mask), WEIGHT=tl_acc(s.dtype), CHUNK=chunk,
        ROW_BLOCK=row_block(max(t, 1)),
        num_warps=SORTED_WARPS,
    )  # fmt: skip
    return heads, stats, bad, lengths


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
    ok = torch.empty((), dtype=torch.bool, device=s.device)
    chunk = _parallel_chunk(b)
    if chunk is not None:  # the chunk path: heads, then a launch per pass
        heads, stats, bad, _ = _chunk_heads(ids, s, PASSK_STATS, 4, chunk)
        for step in (1, 2, 3):  # pass 2 reads pass 1's count of bad scores: it lowers the flag and asserts
            _passk_chunk_kernel[(triton.cdiv(b, chunk),)](
                s, perm, heads, stats, bad, ok, out, b, float(eps), PASS=step, NORM_BY_STD=norm_by_std,
                CHUNK=chunk, num_warps=SORTED_WARPS, **check(s, BAD_SCORES if step == 2 else None),
            )  # fmt: skip
        return out, ok
    stats = torch.empty((PASSK_STATS, b), dtype=torch.float64, device=s.device)  # the module docstring
    _passk_kernel[(1,)](
        s, ids, perm, stats, out, ok, b, float(eps), NORM_BY_STD=norm_by_std, CHUNK=_sorted_chunk(b),
        num_warps=SORTED_WARPS, **check(s, BAD_SCORES),
    )  # fmt: skip
    return out, ok


def opo_forward(
    scores: torch.Tensor, mask: torch.Tensor, group_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """scores [B] fp32/fp64, mask [B, T] (bool, integer or float weights), group_ids [B] int ->
    (per-response advantages [B], ok [] bool: every score finite), with the lengths Σ_t m summed in the
    walk's launch (mask_rows.py). torch.sort, then one launch (past one chunk: three)."""
    _check(scores)
    s, m = scores.contiguous(), mask.contiguous()
    b, t = s.numel(), m.shape[1]
    out = torch.empty_like(s)
    if b == 0:
        return out, torch.ones((), dtype=torch.bool, device=s.device)
    ids, perm = torch.sort(group_ids, stable=True)
    ok = torch.empty((), dtype=torch.bool, device=s.device)
    chunk = _parallel_chunk(b)
    if chunk is not None:  # the chunk path: heads and lengths, then a launch per pass
        heads, stats, bad, lengths = _chunk_heads(ids, s, OPO_STATS, OPO_STATS, chunk, mask=m)
        for step in (1, 2):
            _opo_chunk_kernel[(triton.cdiv(b, chunk),)](
                s, lengths, perm, heads, stats, bad, ok, out, b, PASS=step, CHUNK=chunk,
                num_warps=SORTED_WARPS, **check(s, BAD_SCORES if step == 2 else None),
            )  # fmt: skip
        return out, ok
    stats = torch.empty((OPO_STATS, b), dtype=torch.float64, device=s.device)
    lengths = torch.empty(b, dtype=torch.float64, device=s.device)
    _opo_kernel[(b,)](
        s, m, lengths, launch_counter(s.device), ids, perm, stats, out, ok, b, t, MASK_KIND=mask_kind(m),
        CHUNK=_sorted_chunk(b), ROW_BLOCK=row_block(max(t, 1)), num_warps=SORTED_WARPS,
        **check(s, BAD_SCORES),
    )  # fmt: skip
    return out, ok


def compile_cases():
    """Both estimators x dtype x norm_by_std (passk) at an aligned and an odd size (the chunk path), and at
    one chunk (the walk); opo's mask of each kind on the walk, one a size on the chunk path."""
    kinds = {1000: (torch.bool, torch.int64, None), 4096: (torch.int64,), 4099: (None,)}  # None: float
    for row in full({"dtype": (torch.float32, torch.float64), "size": (1000, 4096, 4099)}):
        scores, ids = meta(row["size"], dtype=row["dtype"]), meta(row["size"], dtype=torch.int64)
        label = f"{str(row['dtype']).removeprefix('torch.')},{row['size']}"
        for norm in (True, False):
            yield CompileCase(
                f"grpo_passk_forward[{label},norm_by_std={norm}]",
                functools.partial(grpo_passk_forward, scores, ids, 1e-6, norm),
            )
        for kind in kinds[row["size"]]:
            mask = meta(row["size"], 4096, dtype=kind or row["dtype"])  # rows of 2048-position blocks
            name = str(mask.dtype).removeprefix("torch.")
            yield CompileCase(
                f"opo_forward[{label},mask={name}]", functools.partial(opo_forward, scores, mask, ids)
            )
