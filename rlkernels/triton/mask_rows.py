"""A response mask's rows, summed by programs inside another kernel's launch.

An estimator that needs each response's length Σ_t m_t (opo's length-weighted baseline), or the moments
that verl's masked whitening of A_b · m_bt takes from the mask (reinforce_plus_plus_baseline, gdpo), gets
them from the launch that needs them: that launch has a program per mask row, each publishing its row's
values (`_finish.publish`), and its last program (`_finish.last_program`), or the next launch, reads them
all. No `mask.sum(-1)` or statistics launch of its own (docs/gpu_token_ops.md, "The advantage estimators").

The whitening's moments of x_bt = A_b · m_bt weighted by m_bt, row b: weight W_b = Σ_t m, mean A_b · r_b
and centered sum of squares A_b² · C_b, with r_b = Σ_t m² / W_b and C_b = Σ_t m (m - r_b)², which depend on
the mask alone (a bool or 0 / 1 mask: r_b = 1, C_b = 0, exactly). The rows' moments then merge as any
partials do (gae.py finish_whiten).
"""

import triton
import triton.language as tl

from rlkernels._backend import triton_interpreting
from rlkernels.triton._common import next_pow2
from rlkernels.triton._finish import publish
from rlkernels.triton._mask import MASK_FLOAT, load_mask

# Columns of a row's published moments, gae.py's partials: bad mask values, W, then r and C (the mask's
# own), which the reader turns into the mean and m2 of A · m.
ROW_PARTS = tl.constexpr(4)


@triton.jit
def publish_row_sum(m_ptr, len_ptr, row, T, MASK_KIND: tl.constexpr, W: tl.constexpr, BLOCK: tl.constexpr):
    """len[row] = Σ_t m[row, t] in fp64 (an integer mask: nonzero counts 1; a float one: its weights rounded
    to W, the scores' dtype, as the C++ bindings convert them), for m [B, T] of kind MASK_KIND
    (_mask.MASK_KINDS), BLOCK positions at a time."""
    lanes = tl.arange(0, BLOCK)
    row_ptr = m_ptr + row.to(tl.int64) * T
    total = tl.zeros([BLOCK], tl.float64)
    for t0 in range(0, T, BLOCK):
        m, _ = load_mask(row_ptr + t0 + lanes, t0 + lanes < T, MASK_KIND, W)
        total += m.to(tl.float64)
    one = tl.arange(0, 1)
    publish(len_ptr + row + one, tl.sum(total, axis=0, keep_dims=True), one < 1)


@triton.jit
def publish_row_moments(
    m_ptr, part_ptr, row, T, MASK_KIND: tl.constexpr, ACC: tl.constexpr, BLOCK: tl.constexpr
):
    """part[row] = (bad values, W, r, C) of mask row `row` (the module docstring), in ACC; a float mask
    takes a second read of the row for C (two passes: C from the exact r)."""
    lanes = tl.arange(0, BLOCK)
    row_ptr = m_ptr + row.to(tl.int64) * T
    bad = tl.zeros([BLOCK], ACC)
    w = tl.zeros([BLOCK], ACC)
    sq = tl.zeros([BLOCK], ACC)
    for t0 in range(0, T, BLOCK):
        m, b = load_mask(row_ptr + t0 + lanes, t0 + lanes < T, MASK_KIND, ACC)
        bad += tl.where(b, 1.0, 0.0)
        w += m
        sq += m * m
    weight = tl.sum(w, axis=0)
    r = tl.sum(sq, axis=0) / tl.where(weight > 0, weight, 1.0)
    c = tl.zeros([BLOCK], ACC)
    if MASK_KIND == MASK_FLOAT:
        for t0 in range(0, T, BLOCK):
            inside = t0 + lanes < T
            m, _ = load_mask(row_ptr + t0 + lanes, inside, MASK_KIND, ACC)
            d = tl.where(inside, m - r, 0.0)
            c += m * d * d
    cols = tl.arange(0, ROW_PARTS)
    part = tl.where(cols == 0, tl.sum(bad, axis=0), tl.where(cols == 1, weight, 0.0))
    part = tl.where(cols == 2, r, tl.where(cols == 3, tl.sum(c, axis=0), part))
    publish(part_ptr + row * ROW_PARTS + cols, part.to(ACC), cols < ROW_PARTS)


@triton.jit
def whitening_part(a, row_ptrs, inside):
    """[ROW_PARTS] (bad mask values, W, mean, m2) of x = A_b · m_bt weighted by m_bt over the rows at
    row_ptrs (each row's published (bad, W, r, C), read with volatile loads), a [N] their A: each row's
    (W, A·r, A²·C) merged (two passes: the weighted mean, then Σ m2 + W (mean_b - mean)²), the partial that
    gae.py finish_whiten merges."""
    w = tl.load(row_ptrs + 1, mask=inside, other=0.0, volatile=True)
    mu = a * tl.load(row_ptrs + 2, mask=inside, other=0.0, volatile=True)
    c = tl.load(row_ptrs + 3, mask=inside, other=0.0, volatile=True)
    weight = tl.sum(w, axis=0)
    mean = tl.sum(w * mu, axis=0) / tl.where(weight > 0, weight, 1.0)
    m2 = tl.sum(a * a * c + w * (mu - mean) * (mu - mean), axis=0)
    bad = tl.sum(tl.load(row_ptrs, mask=inside, other=0.0, volatile=True), axis=0)
    cols = tl.arange(0, ROW_PARTS)
    return tl.where(cols == 0, bad, tl.where(cols == 1, weight, tl.where(cols == 2, mean, m2)))


def row_block(t: int) -> int:
    """Mask positions a row program reads at a time: up to 2048 (8 fp64 registers a thread over the walks'
    8 warps); the interpreter runs one numpy op per block, so up to 1 << 14 there."""
    return min(next_pow2(t), (1 << 14) if triton_interpreting() else 2048)
