"""The loss aggregation of policy_loss, value_loss and agg_loss finished inside their kernels (the math:
rlkernels/reference/aggregation.py; the C++ twin: csrc/include/rlkernels/aggregation.h).

Each program of a token kernel publishes one partial row of NP columns for its (row, chunk) tile: the
masked loss sum, the token count, the sums behind the stats, and a bad-input flag. The last program
(`_finish.last_program`) calls `finish_aggregation`, which reduces the chunks of each row in a fixed order
(deterministic), and writes the loss, the stat means, each row's weight c_b = d loss / d S_b, the rows' sums
the backward reads, and whether every input value was valid."""

from __future__ import annotations

import triton
import triton.language as tl

from rlkernels.reference.aggregation import AGG_MODES
from rlkernels.triton._common import float_arg, next_pow2
from rlkernels.triton._device_assert import require

AGG_CODES = {mode: i for i, mode in enumerate(AGG_MODES)}
TOKEN_MEAN = tl.constexpr(AGG_CODES["token-mean"])
TOKEN_SUM = tl.constexpr(AGG_CODES["token-sum"])
SEQ_MEAN_TOKEN_MEAN = tl.constexpr(AGG_CODES["seq-mean-token-mean"])
SEQ_MEAN_TOKEN_SUM_NORM = tl.constexpr(AGG_CODES["seq-mean-token-sum-norm"])
# How a global normalizer (num_tokens, num_seqs) is given: not at all, as a number, or as a device tensor.
NORM_NONE, NORM_VALUE, NORM_TENSOR = 0, 1, 2
# Partials the finishing program loads at a time, per thread: each load is a round trip to L2 that the
# program waits for (volatile loads, a dependent sum), so the tail's length is the number of loads. The tile
# sets the whole kernel's registers: at 8 a thread policy_loss's forward (8 warps, every term on) takes 80 on
# sm_90, 16 took it to 128 (2 programs an SM instead of 3).
FINISH_ELEMENTS = 8
# Chunks of a row the finishing program loads together, for tiles of more than 1024 tokens (policy_loss's
# FORWARD_BLOCK: the tile of rows longer than that, which span several chunks); one chunk otherwise, where a
# row is mostly one chunk and a group's other lanes would be idle.
FINISH_CHUNK_GROUP = 4


@triton.jit
def _column(tile, cols, col):
    """Column `col` of a [R, C] tile as [R]."""
    return tl.sum(tl.where(cols[None, :] == col, tile, 0.0), axis=1)


@triton.jit
def _add3(a0, a1, a2, b0, b1, b2):
    return a0 + b0, a1 + b1, a2 + b2


@triton.jit
def _add4(a0, a1, a2, a3, b0, b1, b2, b3):
    return a0 + b0, a1 + b1, a2 + b2, a3 + b3


@triton.jit
def _add10(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, b0, b1, b2, b3, b4, b5, b6, b7, b8, b9):
    return a0 + b0, a1 + b1, a2 + b2, a3 + b3, a4 + b4, a5 + b5, a6 + b6, a7 + b7, a8 + b8, a9 + b9


@triton.jit
def sums4(a0, a1, a2, a3):
    """The sums of four [BLOCK] vectors in one reduction, where a tl.sum each reduces them one after another:
    the warps' shuffle steps of all of them interleave, and they cross the warps in one shared-memory step
    (policy_loss's forward: 13 barriers before its partials are published, 21 with a tl.sum each)."""
    return tl.reduce((a0, a1, a2, a3), 0, _add4)


@triton.jit
def sums3(a0, a1, a2):
    """sums4 for three vectors."""
    return tl.reduce((a0, a1, a2), 0, _add3)


@triton.jit
def sums10(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9):
    """sums4 for ten vectors."""
    return tl.reduce((a0, a1, a2, a3, a4, a5, a6, a7, a8, a9), 0, _add10)


def finish_tile(block: int, warps: int, np_pad: int) -> tuple[int, int]:
    """(rows, chunk group) of the finishing program's [rows, group, np_pad] loads for a token kernel of
    `block` tokens and `warps` warps a program: FINISH_ELEMENTS partials a thread."""
    group = FINISH_CHUNK_GROUP if block > 1024 else 1
    return max(1, FINISH_ELEMENTS * 32 * warps // (np_pad * group)), group


@triton.jit
def _row_sums(
    part_ptr, rows, in_rows, cols, chunks, NP: tl.constexpr, ACC: tl.constexpr, GROUP: tl.constexpr
):
    """[R, NP_PAD] sums over chunks of the rows' partials, GROUP chunks per load, in a fixed order."""
    group = tl.arange(0, GROUP)
    acc = tl.zeros([rows.shape[0], cols.shape[0]], ACC)
    for c0 in range(0, chunks, GROUP):
        c = c0 + group
        p = tl.load(
            part_ptr + ((rows[:, None, None] * chunks + c[None, :, None]) * NP + cols[None, None, :]),
            mask=in_rows[:, None, None] & (c[None, :, None] < chunks) & (cols[None, None, :] < NP),
            other=0.0,
            volatile=True,  # other programs' partials: read from L2, never a stale line
        )
        acc += tl.sum(p.to(ACC), axis=1)
    return acc


@triton.jit
def _row_slots(part_ptr, rows, cols, chunks, NP: tl.constexpr):
    """Pointers to the rows' first chunk partials [R, NP_PAD]: where the first pass leaves each row's sums."""
    return part_ptr + (rows[:, None] * chunks) * NP + cols[None, :]


@triton.jit
def _normalizer(value, ptr, MODE: tl.constexpr, fallback, ACC: tl.constexpr):
    if MODE == 1:
        out = float_arg(value, ACC) + tl.zeros_like(fallback)
    elif MODE == 2:
        out = tl.load(ptr).to(ACC) + tl.zeros_like(fallback)
    else:
        out = fallback
    return out


@triton.jit
def finish_aggregation(
    part_ptr,  # [B, chunks, NP] the programs' partials
    B,
    chunks,
    row_out_ptr,  # [B, ROW_COLS] the rows' sums of columns ROW_FIRST.. (unused when ROW_COLS == 0)
    weights_ptr,  # [B] c_b = d loss / d row sum
    loss_ptr,  # [] the aggregated loss
    stats_ptr,  # [NUM_STATS] column sums STAT_FIRST.. over the batch's token count (0 without tokens)
    ok_ptr,  # [] bool: no program flagged a bad input value (column BAD_COL)
    dp,  # the scalars: fp64 kernel arguments (docs/compile_check.md)
    norm_len,
    tokens_value,
    tokens_ptr,  # [1] num_tokens as a tensor (TOKENS == 2)
    seqs_value,
    seqs_ptr,  # [1] num_seqs as a tensor (SEQS == 2)
    NP: tl.constexpr,
    NP_PAD: tl.constexpr,
    LOSS_COL: tl.constexpr,
    COUNT_COL: tl.constexpr,
    ROW_FIRST: tl.constexpr,
    ROW_COLS: tl.constexpr,
    STAT_FIRST: tl.constexpr,
    NUM_STATS: tl.constexpr,
    BAD_COL: tl.constexpr,
    AGG: tl.constexpr,
    TOKENS: tl.constexpr,
    SEQS: tl.constexpr,
    ACC: tl.constexpr,
    ROWS: tl.constexpr,
    GROUP: tl.constexpr,
    CHECK_MSG: tl.constexpr,  # the device assert's message, or None (_device_assert)
):
    """Two passes over the rows: the first, ROWS at a time (finish_tile), sums each row's chunks (GROUP per
    load) into the batch's totals and leaves the row's sums in its first chunk's partials; the second reads
    them back, ROWS * GROUP rows a load, for the rows' weights and the loss."""
    dp = float_arg(dp, ACC)
    norm_len = float_arg(norm_len, ACC)
    cols = tl.arange(0, NP_PAD)
    totals = tl.zeros([NP_PAD], ACC)
    nonempty = tl.zeros([ROWS], ACC)
    for r0 in range(0, B, ROWS):  # pass 1: the batch's totals
        rows = r0 + tl.arange(0, ROWS)
        in_rows = rows < B
        acc = _row_sums(part_ptr, rows, in_rows, cols, chunks, NP, ACC, GROUP)
        totals += tl.sum(acc, axis=0)
        nonempty += tl.where(in_rows & (_column(acc, cols, COUNT_COL) > 0), 1.0, 0.0)
        in_tile = in_rows[:, None] & (cols[None, :] < NP)
        tl.store(_row_slots(part_ptr, rows, cols, chunks, NP), acc, mask=in_tile)
    tl.debug_barrier()  # the second pass's threads read what the first pass's threads stored
    count = tl.sum(tl.where(cols == COUNT_COL, totals, 0.0), axis=0)
    if AGG == TOKEN_MEAN:
        denom = _normalizer(tokens_value, tokens_ptr, TOKENS, count, ACC)
    else:
        denom = _normalizer(seqs_value, seqs_ptr, SEQS, tl.sum(nonempty, axis=0), ACC)
    scale = tl.where(denom > 0, dp / tl.where(denom > 0, denom, 1.0), 0.0)  # a zero normalizer: loss 0
    if AGG == TOKEN_SUM:
        scale = dp + tl.zeros_like(scale)
    if AGG == SEQ_MEAN_TOKEN_SUM_NORM:
        scale = scale / norm_len
    loss = tl.zeros([ROWS * GROUP], ACC)
    for r0 in range(0, B, ROWS * GROUP):  # pass 2: the rows' weights and sums, the loss
        rows = r0 + tl.arange(0, ROWS * GROUP)
        in_rows = rows < B
        acc = tl.load(
            _row_slots(part_ptr, rows, cols, chunks, NP),
            mask=in_rows[:, None] & (cols[None, :] < NP),
            other=0.0,
            volatile=True,
        ).to(ACC)
        n = _column(acc, cols, COUNT_COL)
        w = scale + tl.zeros_like(n)
        if AGG == SEQ_MEAN_TOKEN_MEAN:
            w = tl.where(n > 0, w / tl.where(n > 0, n, 1.0), 0.0)
        tl.store(weights_ptr + rows, w, mask=in_rows)
        loss += tl.where(in_rows, w * _column(acc, cols, LOSS_COL), 0.0)
        if ROW_COLS > 0:
            out_cols = cols - ROW_FIRST
            keep = (out_cols >= 0) & (out_cols < ROW_COLS)
            tl.store(
                row_out_ptr + rows[:, None] * ROW_COLS + out_cols[None, :],
                acc,
                mask=in_rows[:, None] & keep[None, :],
            )
    tl.store(loss_ptr, tl.sum(loss, axis=0))
    stat_cols = cols - STAT_FIRST
    inv = tl.where(count > 0, 1.0 / tl.where(count > 0, count, 1.0), 0.0)
    tl.store(
        stats_ptr + stat_cols,
        totals * inv,
        mask=(stat_cols >= 0) & (stat_cols < NUM_STATS),
    )
    bad = tl.sum(tl.where(cols == BAD_COL, totals, 0.0), axis=0)
    require(bad == 0, CHECK_MSG)
    tl.store(ok_ptr, bad == 0)


def normalizer_args(value, tensor):
    """(number, tensor or None, mode) of a global normalizer for the kernels (AggConfig's split form)."""
    if tensor is not None:
        return 0.0, tensor, NORM_TENSOR
    if value is not None:
        return float(value), None, NORM_VALUE
    return 0.0, None, NORM_NONE


def np_pad(np_: int) -> int:
    return next_pow2(np_)
