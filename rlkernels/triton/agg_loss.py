"""agg_loss Triton kernels: verl's agg_loss over a given token loss (csrc/include/rlkernels/agg_loss.h) in
one forward launch that also finishes the loss, and one backward launch writing d loss_mat
(docs/gpu_token_ops.md), as value_loss.py.

Grid: (row, chunk of BLOCK tokens). Each program reduces its tokens' Σ m·L and Σ m, checks the mask values it
reads and publishes its chunk's partial sums; the last program to finish (`_finish.last_program`) reduces them
in a fixed order (deterministic, no float atomics) into the loss, the rows' weights and the inputs' validity
(`_aggregation`)."""

import functools

import torch
import triton
import triton.language as tl

from rlkernels._dtypes import acc_dtype
from rlkernels.triton._aggregation import AGG_CODES, finish_aggregation, finish_tile, normalizer_args, sums3
from rlkernels.triton._common import cdiv, store_dtype, tl_acc, to_acc, unit_rows
from rlkernels.triton._device_assert import check
from rlkernels.triton._finish import last_program, launch_counter, publish
from rlkernels.triton._mask import kept, load_mask, mask_kind
from rlkernels.triton._specializations import CompileCase
from rlkernels.triton.policy_loss import _block
from rlkernels.triton.value_loss import aggregation_cases

# The forward's device assert (_device_assert), csrc/cuda/agg_loss.cu's message.
BAD_VALUES = (
    "rlkernels agg_loss: mask weights negative or not finite, or an integer mask value other than 0 and 1"
)

# Columns of the chunk partials [B, chunks, NUM_PARTS] (csrc/include/rlkernels/agg_loss.h AggLossPart): Σ m·L,
# Σ m, the count of rejected mask values.
SUM_PART, COUNT_PART, BAD_PART = (tl.constexpr(i) for i in range(3))
NUM_PARTS = tl.constexpr(3)
NUM_PARTS_PAD = tl.constexpr(4)
# Warps of the forward's programs (Triton's default: 4 warps x 8 tokens at the 1024-token block).
FORWARD_WARPS = 4


@triton.jit
def _agg_forward_kernel(
    loss_mat_ptr,  # [B, T] row stride ld_loss
    mask_ptr,  # [B, T] bool, integer or float, row stride ld_mask
    part_ptr,  # [B, chunks, NUM_PARTS] acc: this launch's partials
    counter_ptr,  # [1] int32, zero (_finish.launch_counter)
    loss_ptr,  # [] acc
    weights_ptr,  # [B] acc: d loss / d row sum
    ok_ptr,  # [] bool
    tokens_ptr,  # [1] num_tokens as a tensor (TOKENS == 2)
    seqs_ptr,  # [1] num_seqs as a tensor (SEQS == 2)
    ld_loss,
    ld_mask,
    B,
    T,
    dp: tl.float64,
    norm_len: tl.float64,
    tokens_value: tl.float64,
    seqs_value: tl.float64,
    MASK_KIND: tl.constexpr,
    AGG: tl.constexpr,
    TOKENS: tl.constexpr,
    SEQS: tl.constexpr,
    ACC: tl.constexpr,
    BLOCK: tl.constexpr,
    FINISH_ROWS: tl.constexpr,
    FINISH_GROUP: tl.constexpr,
    CHECK_MSG: tl.constexpr,  # the device assert's message, or None (_device_assert)
):
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    chunks = tl.num_programs(1)
    offs = chunk * BLOCK + tl.arange(0, BLOCK)
    inb = offs < T
    m, bad = load_mask(mask_ptr + row * ld_mask + offs, inb, MASK_KIND, ACC)
    on = m != 0
    # A masked-out token adds exactly 0, even a NaN there: its loss is not read.
    loss = to_acc(tl.load(loss_mat_ptr + row * ld_loss + offs, mask=inb & on, other=0.0))
    s_loss, s_m, s_bad = sums3(kept(on, m, loss, MASK_KIND), m, bad.to(ACC))
    cols = tl.arange(0, NUM_PARTS_PAD)
    part = tl.where(cols == SUM_PART, s_loss, 0.0)
    part = tl.where(cols == COUNT_PART, s_m, part)
    part = tl.where(cols == BAD_PART, s_bad, part).to(ACC)
    publish(part_ptr + (row * chunks + chunk) * NUM_PARTS + cols, part, cols < NUM_PARTS)
    if last_program(counter_ptr, B * chunks):
        finish_aggregation(
            part_ptr, B, chunks, weights_ptr, weights_ptr, loss_ptr, weights_ptr, ok_ptr,
            dp, norm_len, tokens_value, tokens_ptr, seqs_value, seqs_ptr,
            NUM_PARTS, NUM_PARTS_PAD, SUM_PART, COUNT_PART, 0, 0, 0, 0, BAD_PART, AGG, TOKENS,
            SEQS, ACC, FINISH_ROWS, FINISH_GROUP, CHECK_MSG,
        )  # fmt: skip


@triton.jit
def _agg_backward_kernel(
    grad_loss_ptr,  # [1] acc: d output / d loss
    weights_ptr,  # [B] acc: d loss / d row sum (the forward's)
    mask_ptr,  # [B, T] bool, integer or float, row stride ld_mask
    grad_ptr,  # [B, T] out, contiguous
    ld_mask,
    T,
    MASK_KIND: tl.constexpr,
    ACC: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inb = offs < T
    m, _bad = load_mask(mask_ptr + row * ld_mask + offs, inb, MASK_KIND, ACC)
    g = tl.load(grad_loss_ptr).to(ACC) * tl.load(weights_ptr + row)  # d output / d row sum
    tl.store(grad_ptr + row * T + offs, (g * m).to(grad_ptr.dtype.element_ty), mask=inb)


def agg_loss_forward(loss_mat, mask, agg):
    """The forward op in one launch: -> (loss [], row weights [B], ok [] bool) in the accumulation type; `agg`
    is the op's AggConfig, `mask` bool, integer or float. ok is False when a mask value is rejected."""
    B, T = loss_mat.shape
    (loss_mat, mask), strides, _ = unit_rows(T, loss_mat, mask)
    acc = acc_dtype(loss_mat.dtype)
    empty = functools.partial(loss_mat.new_empty, dtype=acc)
    loss, weights = empty(()), empty(B)
    ok = loss_mat.new_empty((), dtype=torch.bool)
    if B == 0 or T == 0:  # no token: loss 0
        return loss.zero_(), weights.zero_(), ok.fill_(True)
    block = _block(T)
    chunks = cdiv(T, block)
    tokens, tokens_t, tokens_mode = normalizer_args(agg.num_tokens, agg.num_tokens_tensor)
    seqs, seqs_t, seqs_mode = normalizer_args(agg.num_seqs, agg.num_seqs_tensor)
    finish_rows, finish_group = finish_tile(block, FORWARD_WARPS, NUM_PARTS_PAD.value)
    _agg_forward_kernel[(B, chunks)](
        loss_mat, mask, empty(B, chunks, NUM_PARTS), launch_counter(loss_mat.device), loss, weights, ok,
        weights if tokens_t is None else tokens_t, weights if seqs_t is None else seqs_t,
        *strides, B, T, float(agg.dp_size), float(agg.norm_len), tokens, seqs,
        MASK_KIND=mask_kind(mask), AGG=AGG_CODES[agg.agg], TOKENS=tokens_mode, SEQS=seqs_mode,
        ACC=tl_acc(acc), BLOCK=block, FINISH_ROWS=finish_rows, FINISH_GROUP=finish_group,
        num_warps=FORWARD_WARPS, **check(loss_mat, BAD_VALUES),
    )  # fmt: skip
    return loss, weights, ok


def agg_loss_backward(grad_loss, row_weights, loss_mat, mask) -> torch.Tensor:
    """The backward op in one launch: d loss / d loss_mat [B, T] in loss_mat's dtype."""
    B, T = loss_mat.shape
    (mask,), (ld_mask,), _ = unit_rows(T, mask)
    grad = loss_mat.new_empty((B, T), dtype=store_dtype(loss_mat.dtype))
    if B and T:
        block = _block(T)
        _agg_backward_kernel[(B, cdiv(T, block))](
            grad_loss, row_weights, mask, grad, ld_mask, T,
            MASK_KIND=mask_kind(mask), ACC=tl_acc(acc_dtype(loss_mat.dtype)), BLOCK=block,
        )  # fmt: skip
    return grad.to(loss_mat.dtype)


def compile_cases():
    """value_loss.aggregation_cases for both kernels."""
    for c in aggregation_cases():
        forward = functools.partial(agg_loss_forward, c.x, c.mask, c.agg)
        yield CompileCase(f"agg_loss_forward[{c.label}]", forward)
        yield CompileCase(
            f"agg_loss_backward[{c.label}]",
            functools.partial(agg_loss_backward, c.grad_loss, c.row_weights, c.x, c.mask),
        )
