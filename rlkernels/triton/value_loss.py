"""value_loss Triton kernels: the per-token math of csrc/include/rlkernels/value_loss.h in one forward launch
that also finishes the loss, and one backward launch writing d values (docs/gpu_token_ops.md), as
policy_loss.py.

Grid: (row, chunk of BLOCK tokens). Each program computes its tokens' terms, checks the input values it reads
(non-finite values, old values or returns anywhere, bad mask values) and publishes its chunk's partial sums;
the last program to finish (`_finish.last_program`) reduces them in a fixed order (deterministic, no float
atomics) into the loss, clipfrac, the rows' weights and the inputs' validity (`_aggregation`)."""

import functools
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from rlkernels._dtypes import acc_dtype
from rlkernels.triton._aggregation import AGG_CODES, finish_aggregation, finish_tile, normalizer_args, sums4
from rlkernels.triton._common import (
    cdiv,
    clamp,
    clamp_passes,
    float_arg,
    store_dtype,
    tl_acc,
    to_acc,
    unit_rows,
)
from rlkernels.triton._device_assert import check
from rlkernels.triton._finish import last_program, launch_counter, publish
from rlkernels.triton._mask import kept, kept_flag, load_mask, mask_kind
from rlkernels.triton._specializations import FLOAT_DTYPES, CompileCase, covering, meta
from rlkernels.triton.policy_loss import TOKEN_BLOCKS, _block

# The forward's device assert (_device_assert), csrc/cuda/value_loss.cu's message.
BAD_VALUES = (
    "rlkernels value_loss: NaN or inf values, old_values or returns, mask weights negative or not finite, or "
    "an integer mask value other than 0 and 1"
)

# Columns of the chunk partials [B, chunks, NUM_PARTS] (csrc/include/rlkernels/value_loss.h ValuePart): Σ m·L,
# Σ m, Σ m·clipped, the count of rejected input values.
LOSS_PART, COUNT_PART, CLIPPED_PART, BAD_PART = (tl.constexpr(i) for i in range(4))
NUM_PARTS = tl.constexpr(4)
NUM_PARTS_PAD = tl.constexpr(4)
# Warps of the forward's programs (Triton's default: 4 warps x 8 tokens at the 1024-token block).
FORWARD_WARPS = 4


@triton.jit
def value_token(v, old, ret, clip):
    """(0.5·max((v-R)^2, (clip(v, old±c)-R)^2), its derivative in v, clipped flag), as value_loss.h."""
    c = float_arg(clip, v.dtype)
    lo = old - c
    hi = old + c
    d1 = v - ret
    d2 = clamp(v, lo, hi) - ret
    use2 = d2 * d2 > d1 * d1
    loss = 0.5 * tl.where(use2, d2 * d2, d1 * d1)
    dvalue = tl.where(use2, tl.where(clamp_passes(v, lo, hi), d2, 0.0), d1)
    return loss, dvalue, use2


@triton.jit
def _load_token(
    values_ptr, old_ptr, ret_ptr, mask_ptr, ld_values, ld_old, ld_ret, ld_mask, row, offs, inb,
    MASK_KIND: tl.constexpr,
):  # fmt: skip
    """(v, old, R, m, bad) of tokens `offs` of `row`, each input's rows at its row stride ld_*: bad flags a
    non-finite v, old or R, and the mask values the op rejects (_mask.py mask_bad)."""
    v = to_acc(tl.load(values_ptr + row * ld_values + offs, mask=inb, other=0.0))
    old = to_acc(tl.load(old_ptr + row * ld_old + offs, mask=inb, other=0.0))
    ret = to_acc(tl.load(ret_ptr + row * ld_ret + offs, mask=inb, other=0.0))
    m, bad = load_mask(mask_ptr + row * ld_mask + offs, inb, MASK_KIND, v.dtype)
    finite = (tl.abs(v) < float("inf")) & (tl.abs(old) < float("inf")) & (tl.abs(ret) < float("inf"))
    return v, old, ret, m, bad | (inb & ~finite)


@triton.jit
def _value_forward_kernel(
    values_ptr,  # [B, T] row stride ld_values (each input: its own)
    old_ptr,  # [B, T]
    ret_ptr,  # [B, T]
    mask_ptr,  # [B, T] bool, integer or float
    part_ptr,  # [B, chunks, NUM_PARTS] acc: this launch's partials
    counter_ptr,  # [1] int32, zero (_finish.launch_counter)
    loss_ptr,  # [] acc
    clipfrac_ptr,  # [1] acc
    weights_ptr,  # [B] acc: d loss / d row sum
    ok_ptr,  # [] bool
    tokens_ptr,  # [1] num_tokens as a tensor (TOKENS == 2)
    seqs_ptr,  # [1] num_seqs as a tensor (SEQS == 2)
    ld_values,
    ld_old,
    ld_ret,
    ld_mask,
    B,
    T,
    clip: tl.float64,
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
    v, old, ret, m, bad = _load_token(
        values_ptr, old_ptr, ret_ptr, mask_ptr, ld_values, ld_old, ld_ret, ld_mask, row, offs, inb, MASK_KIND
    )
    loss, _dvalue, clipped = value_token(v, old, ret, clip)
    on = m != 0
    cols = tl.arange(0, NUM_PARTS_PAD)
    s_loss, s_m, s_clipped, s_bad = sums4(
        kept(on, m, loss, MASK_KIND), m, kept_flag(on, m, clipped, MASK_KIND), bad.to(ACC)
    )
    part = tl.where(cols == LOSS_PART, s_loss, 0.0)
    part = tl.where(cols == COUNT_PART, s_m, part)
    part = tl.where(cols == CLIPPED_PART, s_clipped, part)
    part = tl.where(cols == BAD_PART, s_bad, part).to(ACC)
    publish(part_ptr + (row * chunks + chunk) * NUM_PARTS + cols, part, cols < NUM_PARTS)
    if last_program(counter_ptr, B * chunks):
        finish_aggregation(
            part_ptr, B, chunks, weights_ptr, weights_ptr, loss_ptr, clipfrac_ptr, ok_ptr,
            dp, norm_len, tokens_value, tokens_ptr, seqs_value, seqs_ptr,
            NUM_PARTS, NUM_PARTS_PAD, LOSS_PART, COUNT_PART, 0, 0, CLIPPED_PART, 1, BAD_PART, AGG, TOKENS,
            SEQS, ACC, FINISH_ROWS, FINISH_GROUP, CHECK_MSG,
        )  # fmt: skip


@triton.jit
def _value_backward_kernel(
    grad_loss_ptr,  # [1] acc: d output / d loss
    weights_ptr,  # [B] acc: d loss / d row sum (the forward's)
    values_ptr,  # [B, T] row stride ld_values (each input: its own)
    old_ptr,  # [B, T]
    ret_ptr,  # [B, T]
    mask_ptr,  # [B, T] bool, integer or float
    grad_ptr,  # [B, T] out, contiguous
    ld_values,
    ld_old,
    ld_ret,
    ld_mask,
    T,
    clip: tl.float64,
    MASK_KIND: tl.constexpr,
    ACC: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inb = offs < T
    v, old, ret, m, _bad = _load_token(
        values_ptr, old_ptr, ret_ptr, mask_ptr, ld_values, ld_old, ld_ret, ld_mask, row, offs, inb, MASK_KIND
    )
    _loss, dvalue, _clipped = value_token(v, old, ret, clip)
    g = tl.load(grad_loss_ptr).to(ACC) * tl.load(weights_ptr + row)  # d output / d row sum
    out = tl.where(m != 0, g * m * dvalue, tl.zeros_like(v))
    tl.store(grad_ptr + row * T + offs, out.to(grad_ptr.dtype.element_ty), mask=inb)


def _clip_arg(clip):
    return float("inf") if clip is None else float(clip)


def value_loss_forward(values, old_values, returns, mask, clip, agg):
    """The forward op in one launch: -> (loss [], clipfrac [1], row weights [B], ok [] bool) in the
    accumulation type; `agg` is the op's AggConfig, `mask` bool, integer or float. ok is False when an input
    value is rejected (_load_token)."""
    B, T = values.shape
    (values, old_values, returns, mask), strides, _ = unit_rows(T, values, old_values, returns, mask)
    acc = acc_dtype(values.dtype)
    empty = functools.partial(values.new_empty, dtype=acc)
    loss, clipfrac, weights = empty(()), empty(1), empty(B)
    ok = values.new_empty((), dtype=torch.bool)
    if B == 0 or T == 0:  # no token: loss and clipfrac 0
        return loss.zero_(), clipfrac.zero_(), weights.zero_(), ok.fill_(True)
    block = _block(T)
    chunks = cdiv(T, block)
    tokens, tokens_t, tokens_mode = normalizer_args(agg.num_tokens, agg.num_tokens_tensor)
    seqs, seqs_t, seqs_mode = normalizer_args(agg.num_seqs, agg.num_seqs_tensor)
    finish_rows, finish_group = finish_tile(block, FORWARD_WARPS, NUM_PARTS_PAD.value)
    _value_forward_kernel[(B, chunks)](
        values, old_values, returns, mask, empty(B, chunks, NUM_PARTS), launch_counter(values.device),
        loss, clipfrac, weights, ok,
        weights if tokens_t is None else tokens_t, weights if seqs_t is None else seqs_t,
        *strides, B, T, _clip_arg(clip), float(agg.dp_size), float(agg.norm_len), tokens, seqs,
        MASK_KIND=mask_kind(mask), AGG=AGG_CODES[agg.agg], TOKENS=tokens_mode, SEQS=seqs_mode,
        ACC=tl_acc(acc), BLOCK=block, FINISH_ROWS=finish_rows, FINISH_GROUP=finish_group,
        num_warps=FORWARD_WARPS, **check(values, BAD_VALUES),
    )  # fmt: skip
    return loss, clipfrac, weights, ok


def value_loss_backward(grad_loss, row_weights, values, old_values, returns, mask, clip) -> torch.Tensor:
    """The backward op in one launch: d loss / d values [B, T] in values' dtype."""
    B, T = values.shape
    (values, old_values, returns, mask), strides, _ = unit_rows(T, values, old_values, returns, mask)
    grad = values.new_empty((B, T), dtype=store_dtype(values.dtype))
    if B and T:
        block = _block(T)
        _value_backward_kernel[(B, cdiv(T, block))](
            grad_loss, row_weights, values, old_values, returns, mask, grad, *strides, T,
            _clip_arg(clip),
            MASK_KIND=mask_kind(mask), ACC=tl_acc(acc_dtype(values.dtype)), BLOCK=block,
        )  # fmt: skip
    return grad.to(values.dtype)


class AggCase(NamedTuple):
    """One row of the token losses' compile cases (aggregation_cases)."""

    label: str
    x: torch.Tensor  # [B, T] meta tensor of the row's dtype, for each float input
    mask: torch.Tensor  # [B, T] meta tensor of the row's mask dtype
    agg: tuple  # the op's AggConfig
    grad_loss: torch.Tensor  # [1] and [B] meta tensors of the accumulation dtype, for the backward
    row_weights: torch.Tensor


def aggregation_cases():
    """The compile cases' inputs of a token loss that finishes its aggregation in the forward (value_loss,
    agg_loss): dtype x mask dtype x size class x agg x normalizer form in a covering design (every pair of
    values of any two), and every dtype x token block with the heaviest options
    (rlkernels/triton/_specializations.py)."""
    from rlkernels.ops._aggregation import AggConfig  # the op's argument table (the launchers take it as is)

    rows = covering(
        features={
            "dtype": FLOAT_DTYPES,
            "mask": ("bool", "int", "float"),
            "size": ("aligned", "odd"),
            "agg": tuple(AGG_CODES),
            "normalizer": ("none", "value", "tensor"),
        },
        resources={"dtype": FLOAT_DTYPES, "block": TOKEN_BLOCKS},
        heaviest={"mask": "float", "size": "odd", "agg": "seq-mean-token-mean", "normalizer": "tensor"},
    )
    for row, _ in rows:
        dtype = row["dtype"]
        acc = acc_dtype(dtype)
        B, T = 3, row["block"] - (row["size"] == "odd")
        mask = meta(B, T, dtype={"bool": torch.bool, "int": torch.int64, "float": acc}[row["mask"]])
        normalizer = {"none": (None, None), "value": (40.0, None), "tensor": (None, meta(1, dtype=acc))}
        agg = AggConfig(
            row["agg"], 1, float(T), *normalizer[row["normalizer"]], *normalizer[row["normalizer"]]
        )
        label = ",".join(str(v) for v in row.values()).replace("torch.", "")
        yield AggCase(label, meta(B, T, dtype=dtype), mask, agg, meta(1, dtype=acc), meta(B, dtype=acc))


def compile_cases():
    """aggregation_cases for both kernels; clip is a runtime value (None: inf)."""
    for c in aggregation_cases():
        yield CompileCase(
            f"value_loss_forward[{c.label}]",
            functools.partial(value_loss_forward, c.x, c.x, c.x, c.mask, 0.2, c.agg),
        )
        yield CompileCase(
            f"value_loss_backward[{c.label}]",
            functools.partial(value_loss_backward, c.grad_loss, c.row_weights, c.x, c.x, c.x, c.mask, 0.2),
        )
