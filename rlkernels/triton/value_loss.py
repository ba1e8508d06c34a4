"""value_loss Triton kernels: the per-token math of csrc/include/rlkernels/value_loss.h, a forward pass that
reduces per-row masked sums (per-chunk partials summed by torch in a fixed order, as policy_loss.py) and
a backward pass writing d values."""

import functools

import torch
import triton
import triton.language as tl

from rlkernels.triton._common import clamp, clamp_passes, store_dtype, to_acc
from rlkernels.triton._specializations import FLOAT_DTYPES, CompileCase, covering, meta
from rlkernels.triton.policy_loss import TOKEN_BLOCKS, _block, acc_dtype

NUM_ROW_STATS = 2  # csrc/include/rlkernels/value_loss.h ValueRowStat: count, clipped
NUM_PARTS = tl.constexpr(1 + NUM_ROW_STATS)


@triton.jit
def value_token(v, old, ret, clip):
    """(0.5·max((v-R)^2, (clip(v, old±c)-R)^2), its derivative in v, clipped flag), as value_loss.h."""
    lo = old - clip
    hi = old + clip
    d1 = v - ret
    d2 = clamp(v, lo, hi) - ret
    use2 = d2 * d2 > d1 * d1
    loss = 0.5 * tl.where(use2, d2 * d2, d1 * d1)
    dvalue = tl.where(use2, tl.where(clamp_passes(v, lo, hi), d2, 0.0), d1)
    return loss, dvalue, use2


@triton.jit
def _load_token(values_ptr, old_ptr, ret_ptr, mask_ptr, idx, inb):
    v = to_acc(tl.load(values_ptr + idx, mask=inb, other=0.0))
    old = to_acc(tl.load(old_ptr + idx, mask=inb, other=0.0))
    ret = to_acc(tl.load(ret_ptr + idx, mask=inb, other=0.0))
    m = tl.load(mask_ptr + idx, mask=inb, other=0).to(v.dtype)
    return v, old, ret, m


@triton.jit
def _value_forward_kernel(
    values_ptr,  # [B, T]
    old_ptr,  # [B, T]
    ret_ptr,  # [B, T]
    mask_ptr,  # [B, T] bool or acc
    part_ptr,  # [B, chunks, NUM_PARTS] acc: Σ m·L, Σ m, Σ m·clipped
    T,
    clip,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    offs = chunk * BLOCK + tl.arange(0, BLOCK)
    inb = offs < T
    v, old, ret, m = _load_token(values_ptr, old_ptr, ret_ptr, mask_ptr, row * T + offs, inb)
    loss, _dvalue, clipped = value_token(v, old, ret, clip)
    on = m != 0
    zero = tl.zeros_like(v)
    base = part_ptr + (row * tl.num_programs(1) + chunk) * NUM_PARTS
    tl.store(base, tl.sum(tl.where(on, m * loss, zero), axis=0))
    tl.store(base + 1, tl.sum(m, axis=0))
    tl.store(base + 2, tl.sum(tl.where(on, m * clipped.to(v.dtype), zero), axis=0))


@triton.jit
def _value_backward_kernel(
    grad_rows_ptr,  # [B] acc
    values_ptr,  # [B, T]
    old_ptr,  # [B, T]
    ret_ptr,  # [B, T]
    mask_ptr,  # [B, T]
    grad_ptr,  # [B, T] out
    T,
    clip,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inb = offs < T
    idx = row * T + offs
    v, old, ret, m = _load_token(values_ptr, old_ptr, ret_ptr, mask_ptr, idx, inb)
    _loss, dvalue, _clipped = value_token(v, old, ret, clip)
    g = tl.load(grad_rows_ptr + row)
    out = tl.where(m != 0, g * m * dvalue, tl.zeros_like(v))
    tl.store(grad_ptr + idx, out.to(grad_ptr.dtype.element_ty), mask=inb)


def _clip_arg(clip):
    return float("inf") if clip is None else float(clip)


def value_loss_forward(values, old_values, returns, mask, clip):
    """-> (row sums [B], row stats [B, 2]) in the accumulation type."""
    values, old_values, returns, mask = (t.contiguous() for t in (values, old_values, returns, mask))
    B, T = values.shape
    acc = acc_dtype(values.dtype)
    if B == 0 or T == 0:
        return values.new_zeros(B, dtype=acc), values.new_zeros(B, NUM_ROW_STATS, dtype=acc)
    block = _block(T)
    chunks = triton.cdiv(T, block)
    part = values.new_empty(B, chunks, 1 + NUM_ROW_STATS, dtype=acc)
    _value_forward_kernel[(B, chunks)](
        values, old_values, returns, mask, part, T, _clip_arg(clip), BLOCK=block
    )
    sums = part.sum(1)
    return sums[:, 0].contiguous(), sums[:, 1:].clone()


def value_loss_backward(grad_rows, values, old_values, returns, mask, clip) -> torch.Tensor:
    """d loss / d values [B, T] in values' dtype."""
    grad_rows, values, old_values, returns, mask = (
        t.contiguous() for t in (grad_rows, values, old_values, returns, mask)
    )
    B, T = values.shape
    grad = values.new_empty((B, T), dtype=store_dtype(values.dtype))
    if B and T:
        block = _block(T)
        _value_backward_kernel[(B, triton.cdiv(T, block))](
            grad_rows, values, old_values, returns, mask, grad, T, _clip_arg(clip), BLOCK=block
        )
    return grad.to(values.dtype)


def compile_cases():
    """dtype x mask dtype x size class in a covering design, and every dtype x token block with a float
    mask, of both kernels (rlkernels/triton/_specializations.py); clip is a runtime value (None: inf)."""
    rows = covering(
        features={"dtype": FLOAT_DTYPES, "mask": ("bool", "float"), "size": ("aligned", "odd")},
        resources={"dtype": FLOAT_DTYPES, "block": TOKEN_BLOCKS},
        heaviest={"mask": "float", "size": "odd"},
    )
    for row, _ in rows:
        dtype = row["dtype"]
        B, T = 3, row["block"] - (row["size"] == "odd")
        x = meta(B, T, dtype=dtype)
        mask = meta(B, T, dtype=torch.bool if row["mask"] == "bool" else acc_dtype(dtype))
        label = ",".join(str(v) for v in row.values()).replace("torch.", "")
        yield CompileCase(
            f"value_loss_forward[{label}]", functools.partial(value_loss_forward, x, x, x, mask, 0.2)
        )
        yield CompileCase(
            f"value_loss_backward[{label}]",
            functools.partial(value_loss_backward, meta(B, dtype=acc_dtype(dtype)), x, x, x, mask, 0.2),
        )
