"""The frozen head's d logp / d hidden streamed over vocabulary chunks on a GPU (ops/logp_jacobian.py): the
two kernels between its cuBLAS GEMMs.

Per block of R rows and chunk of C vocabulary columns, after GEMM 1 wrote the chunk's fp32 logits [R, C]:

- `_chunk_kernel`, a program per row: the chunk's max of the transformed logits y, then e = e^{y − m}·c'
  (c' the softcap's derivative, or 1) written in the operand dtype of GEMM 2, which adds e @ W_chunk into
  the row's accumulator A [R, D]. The row's reference m is the running max, raised lazily: only when the
  chunk's max passes it by more than LAZY_GROWTH, and then A (and Σe, Σe²) are rescaled here. So e stays
  below e^LAZY_GROWTH, and most chunks leave A's row untouched.
- `_finish_kernel`, a program per row once the vocabulary is done: logp = (y_label − m) − log Σe, Σπ², and
  d logp / d hidden = (c'_label·W_label − A / Σe) / T in the output's dtype.

Ignored rows (and labels outside [0, V), which the op's range check reports) give e = 0, logp 0 and a zero
row. The state [5, R] holds per row m, Σe, Σe², y_label, c'_label in the accumulation dtype.
"""

import functools

import torch
import triton
import triton.language as tl

from rlkernels._backend import triton_interpreting
from rlkernels._dtypes import acc_dtype
from rlkernels.ops.logp_jacobian import (
    STATE_LABEL_LOGIT,
    STATE_LABEL_SLOPE,
    STATE_MAX,
    STATE_SUM,
    STATE_SUM_SQ,
)
from rlkernels.triton._common import float_arg, next_pow2, tl_acc, to_acc
from rlkernels.triton._softmax import transform_args, transform_grad, transform_logit, transform_options
from rlkernels.triton._specializations import FLOAT_DTYPES, CompileCase, dtype_name, meta

# How far a chunk's max may pass a row's reference before the reference moves (and A's row is rescaled):
# e <= e^8 ≈ 3e3 keeps e·c', Σe and Σe² far from overflow in fp32 and in GEMM 2's 16-bit operand, whose
# rounding is relative; a chunk that moves it by less than that costs no read and write of A's row.
LAZY_GROWTH = tl.constexpr(8.0)
# Rows of the [5, R] state (ops/logp_jacobian.py names them and sets their start).
ROW_MAX, ROW_SUM, ROW_SUM_SQ, ROW_LABEL_LOGIT, ROW_LABEL_SLOPE = (
    tl.constexpr(row) for row in (STATE_MAX, STATE_SUM, STATE_SUM_SQ, STATE_LABEL_LOGIT, STATE_LABEL_SLOPE)
)
# Columns per loop step on a GPU: 2048 fp32 logits (8 KiB) a step per program. The second pass re-reads the
# row a few microseconds after the first: from L2, which holds every running program's row (64 KiB each).
BLOCK_C = 2048
# Logit tiles a program has in flight: Triton pipelines the passes' loads (cp.async into shared memory), as
# the row sweep's statistics loop (docs/gpu_linear.md, "The statistics loop, pipelined").
LOAD_STAGES = 3
# Accumulator columns per step of the rescale and the finish: 1024 (one 4 KiB row piece a step).
BLOCK_D = 1024
# Warps per row program: 8 keep a 2048-wide step at 8 elements a thread.
NUM_WARPS = 8


@triton.jit
def _chunk_kernel(
    z_ptr,  # [R, C] fp32/fp64 logits of the chunk (bias not added), row stride z_stride
    e_ptr,  # [R, C] e^{y - m}·c' in GEMM 2's operand dtype, row stride e_stride
    acc_ptr,  # [R, D] accumulation dtype: Σ e·c'·W over the chunks so far, row stride acc_stride
    labels_ptr,  # [R]
    bias_ptr,  # [V] (unused without BIAS)
    state_ptr,  # [5, R] accumulation dtype: m, Σe, Σe², y_label, c'_label
    R,
    C,
    D,
    V,
    v0,
    z_stride,
    e_stride,
    acc_stride,
    ignore_index,
    inv_temp: tl.float64,
    cap: tl.float64,
    inv_cap: tl.float64,
    temp_over_cap: tl.float64,
    SOFTCAP: tl.constexpr,
    BIAS: tl.constexpr,
    ACC: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_D: tl.constexpr,
    STAGES: tl.constexpr,  # LOAD_STAGES
):
    inv_temp, cap, inv_cap = transform_options(inv_temp, cap, inv_cap, ACC)  # once, not per tile
    temp_over_cap = float_arg(temp_over_cap, ACC)
    row = tl.program_id(0).to(tl.int64)
    label = tl.load(labels_ptr + row).to(tl.int64)
    valid = (label != ignore_index) & (label >= 0) & (label < V)
    z_row = z_ptr + row * z_stride
    e_row = e_ptr + row * e_stride
    if valid:
        chunk_max = tl.full([], float("-inf"), ACC)
        for c0 in tl.range(0, C, BLOCK_C, num_stages=STAGES):
            cols = c0 + tl.arange(0, BLOCK_C)
            inside = cols < C
            x = to_acc(tl.load(z_row + cols, mask=inside, other=0.0))
            if BIAS:
                x += to_acc(tl.load(bias_ptr + v0 + cols, mask=inside, other=0.0))
            y = transform_logit(x, inv_temp, cap, inv_cap, SOFTCAP)
            chunk_max = tl.maximum(chunk_max, tl.max(tl.where(inside, y, float("-inf")), axis=0))
        m = tl.load(state_ptr + ROW_MAX * R + row)
        s = tl.load(state_ptr + ROW_SUM * R + row)
        q = tl.load(state_ptr + ROW_SUM_SQ * R + row)
        if chunk_max > m + LAZY_GROWTH:  # the reference moves to this chunk's max (first chunk: m = -inf)
            if s > 0:
                r = tl.exp(m - chunk_max)
                s = s * r
                q = q * r * r
                acc_row = acc_ptr + row * acc_stride
                for d0 in range(0, D, BLOCK_D):
                    dcols = d0 + tl.arange(0, BLOCK_D)
                    a = tl.load(acc_row + dcols, mask=dcols < D)
                    tl.store(acc_row + dcols, a * r, mask=dcols < D)
            m = chunk_max
        t = tl.zeros([BLOCK_C], ACC)
        t2 = tl.zeros([BLOCK_C], ACC)
        for c0 in tl.range(0, C, BLOCK_C, num_stages=STAGES):
            cols = c0 + tl.arange(0, BLOCK_C)
            inside = cols < C
            x = to_acc(tl.load(z_row + cols, mask=inside, other=0.0))
            if BIAS:
                x += to_acc(tl.load(bias_ptr + v0 + cols, mask=inside, other=0.0))
            y = transform_logit(x, inv_temp, cap, inv_cap, SOFTCAP)
            # m = -inf only while every logit so far is -inf (masked tokens): those give e = 0
            e = tl.where(inside & (y != float("-inf")), tl.exp(y - m), 0.0)
            t += e
            t2 += e * e
            if SOFTCAP:  # c' = 1 - tanh²(x / cap): the transform's derivative without the temperature
                e = e * transform_grad(y, 1.0, temp_over_cap, SOFTCAP)
            tl.store(e_row + cols, e.to(e_ptr.dtype.element_ty), mask=inside)
        s += tl.sum(t, axis=0)
        q += tl.sum(t2, axis=0)
        tl.store(state_ptr + ROW_MAX * R + row, m)
        tl.store(state_ptr + ROW_SUM * R + row, s)
        tl.store(state_ptr + ROW_SUM_SQ * R + row, q)
        col = label - v0
        if (col >= 0) & (col < C):
            x = to_acc(tl.load(z_row + col))
            if BIAS:
                x += to_acc(tl.load(bias_ptr + label))
            y = transform_logit(x, inv_temp, cap, inv_cap, SOFTCAP)
            tl.store(state_ptr + ROW_LABEL_LOGIT * R + row, y)
            if SOFTCAP:
                slope = transform_grad(y, 1.0, temp_over_cap, SOFTCAP)
                tl.store(state_ptr + ROW_LABEL_SLOPE * R + row, slope)
    else:  # nothing reaches A's row
        for c0 in range(0, C, BLOCK_C):
            cols = c0 + tl.arange(0, BLOCK_C)
            tl.store(e_row + cols, tl.zeros([BLOCK_C], e_ptr.dtype.element_ty), mask=cols < C)


@triton.jit
def _finish_kernel(
    acc_ptr,  # [R, D] Σ e·c'·W, row stride acc_stride
    state_ptr,  # [5, R] m, Σe, Σe², y_label, c'_label
    labels_ptr,  # [R]
    weight_ptr,  # [V, D] the head, strides w_stride, w_col_stride
    out_ptr,  # [R, D] d logp / d hidden in its dtype, row stride out_stride
    logp_ptr,  # [R] accumulation dtype
    sum_sq_ptr,  # [R] Σπ² (unused without SUM_SQ)
    R,
    D,
    V,
    acc_stride,
    w_stride,
    w_col_stride,
    out_stride,
    ignore_index,
    inv_temp: tl.float64,
    SOFTCAP: tl.constexpr,
    SUM_SQ: tl.constexpr,
    ACC: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    label = tl.load(labels_ptr + row).to(tl.int64)
    valid = (label != ignore_index) & (label >= 0) & (label < V)
    # an ignored row's m = -inf and Σe = 0 stand in as 0 and 1 (its results are 0 below)
    m = tl.where(valid, tl.load(state_ptr + ROW_MAX * R + row), 0.0)
    s = tl.where(valid, tl.load(state_ptr + ROW_SUM * R + row), 1.0)
    logp = (tl.load(state_ptr + ROW_LABEL_LOGIT * R + row) - m) - tl.log(s)
    tl.store(logp_ptr + row, tl.where(valid, logp, 0.0).to(logp_ptr.dtype.element_ty))
    if SUM_SQ:
        q = tl.load(state_ptr + ROW_SUM_SQ * R + row)
        tl.store(sum_sq_ptr + row, tl.where(valid, q / (s * s), 0.0).to(sum_sq_ptr.dtype.element_ty))
    scale = float_arg(inv_temp, ACC)
    if SOFTCAP:
        label_scale = scale * tl.load(state_ptr + ROW_LABEL_SLOPE * R + row)
    else:
        label_scale = scale
    sum_scale = scale / s
    acc_row = acc_ptr + row * acc_stride
    w_row = weight_ptr + tl.where(valid, label, 0) * w_stride
    out_row = out_ptr + row * out_stride
    for d0 in range(0, D, BLOCK_D):
        cols = d0 + tl.arange(0, BLOCK_D)
        inside = cols < D
        # an ignored row's A is 0 (its e was) and it reads W's row 0: both dropped below
        a = tl.load(acc_row + cols, mask=inside, other=0.0)
        w = to_acc(tl.load(w_row + cols * w_col_stride, mask=inside, other=0.0))
        j = tl.where(valid, label_scale * w - sum_scale * a, 0.0)
        tl.store(out_row + cols, j.to(out_ptr.dtype.element_ty), mask=inside)


def _blocks(columns: int) -> tuple[int, int]:
    """(BLOCK_C, BLOCK_D); under the interpreter at most 256 columns a step, which keeps the multi-step
    loops exercised at test sizes."""
    if triton_interpreting():
        return min(256, next_pow2(columns)), 256
    return BLOCK_C, BLOCK_D


def chunk(
    z: torch.Tensor,  # [R, C] unit column stride
    e: torch.Tensor,  # [R, C] unit column stride, written
    acc: torch.Tensor,  # [R, D] unit column stride, rescaled in place
    labels: torch.Tensor,  # [R] contiguous
    bias: torch.Tensor | None,  # [V] contiguous
    state: torch.Tensor,  # [5, R] contiguous, updated
    v0: int,
    vocab: int,
    temperature: float,
    softcap: float | None,
    ignore_index: int,
) -> None:
    """One vocabulary chunk [v0, v0 + C) of a block (module docstring). One launch."""
    rows, columns = z.shape
    if not rows:
        return
    inv_temp, cap, inv_cap, temp_over_cap = transform_args(temperature, softcap)
    block_c, block_d = _blocks(columns)
    _chunk_kernel[(rows,)](
        z, e, acc, labels, z if bias is None else bias, state, rows, columns, acc.shape[1], vocab, v0,
        z.stride(0), e.stride(0), acc.stride(0), ignore_index, inv_temp, cap, inv_cap, temp_over_cap,
        SOFTCAP=softcap is not None, BIAS=bias is not None, ACC=tl_acc(state.dtype), BLOCK_C=block_c,
        BLOCK_D=block_d, STAGES=LOAD_STAGES, num_warps=NUM_WARPS,
    )  # fmt: skip


def finish(
    acc: torch.Tensor,  # [R, D]
    state: torch.Tensor,  # [5, R]
    labels: torch.Tensor,  # [R] contiguous
    weight: torch.Tensor,  # [V, D] any strides
    out: torch.Tensor,  # [R, D] unit column stride, written
    logp: torch.Tensor,  # [R] written
    sum_sq: torch.Tensor | None,  # [R] written
    temperature: float,
    softcap: float | None,
    ignore_index: int,
) -> None:
    """logp, Σπ² and the rows of d logp / d hidden of a finished block. One launch."""
    rows, dim = acc.shape
    if not rows:
        return
    _, block_d = _blocks(dim)
    _finish_kernel[(rows,)](
        acc, state, labels, weight, out, logp,
        logp if sum_sq is None else sum_sq, rows, dim, weight.shape[0], acc.stride(0), weight.stride(0),
        weight.stride(1), out.stride(0), ignore_index, 1.0 / temperature, SOFTCAP=softcap is not None,
        SUM_SQ=sum_sq is not None, ACC=tl_acc(state.dtype), BLOCK_D=block_d, num_warps=NUM_WARPS,
    )  # fmt: skip


def compile_cases():
    """Every head dtype with the softcap and bias on and off, the finish with and without Σπ²."""
    for dtype in FLOAT_DTYPES:
        acc = acc_dtype(dtype)
        operand = dtype if dtype != acc else acc
        r, c, d, vocab = 64, 1000, 300, 5000
        for softcap in (None, 30.0):
            label = f"{dtype_name(dtype)},softcap={softcap}"
            yield CompileCase(
                f"logp_jacobian_chunk[{label},bias]",
                functools.partial(
                    chunk, meta(r, c, dtype=acc), meta(r, c, dtype=operand), meta(r, d, dtype=acc),
                    meta(r, dtype=torch.int64), meta(vocab, dtype=dtype), meta(5, r, dtype=acc), 128, vocab,
                    0.7, softcap, -100,
                ),
            )  # fmt: skip
            yield CompileCase(
                f"logp_jacobian_chunk[{label}]",
                functools.partial(
                    chunk, meta(r, c, dtype=acc), meta(r, c, dtype=operand), meta(r, d, dtype=acc),
                    meta(r, dtype=torch.int64), None, meta(5, r, dtype=acc), 0, vocab, 1.0, softcap, -100,
                ),
            )  # fmt: skip
            for sum_sq in (False, True):
                yield CompileCase(
                    f"logp_jacobian_finish[{label},sum_sq={sum_sq}]",
                    functools.partial(
                        finish, meta(r, d, dtype=acc), meta(5, r, dtype=acc), meta(r, dtype=torch.int64),
                        meta(vocab, d, dtype=dtype), meta(r, d, dtype=dtype), meta(r, dtype=acc),
                        meta(r, dtype=acc) if sum_sq else None, 0.7, softcap, -100,
                    ),
                )  # fmt: skip
