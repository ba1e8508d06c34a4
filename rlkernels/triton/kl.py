"""kl_penalty Triton kernels; the per-element math (kl_value / kl_grad) is reused by the policy loss."""

import functools

import torch
import triton
import triton.language as tl

from rlkernels.reference.kl import K3_LOG_RATIO_BOUND, KL_KIND_CODES, KL_STRAIGHT_THROUGH
from rlkernels.triton._common import (
    cdiv,
    clamp,
    clamp_passes,
    elementwise_block,
    float_arg,
    store_dtype,
    to_acc,
    unit_rows,
)
from rlkernels.triton._specializations import FLOAT_DTYPES, CompileCase, dtype_name, full, meta

# A kind's code is its base estimator's code, plus the straight-through flag for "+" kinds (reference/kl.py).
# The flag is above every base code, so KIND >= STRAIGHT_THROUGH tests it.
K1 = tl.constexpr(KL_KIND_CODES["k1"])
ABS = tl.constexpr(KL_KIND_CODES["abs"])
K2 = tl.constexpr(KL_KIND_CODES["k2"])
K3 = tl.constexpr(KL_KIND_CODES["k3"])
STRAIGHT_THROUGH = tl.constexpr(KL_STRAIGHT_THROUGH)
BOUND = tl.constexpr(K3_LOG_RATIO_BOUND)


@triton.jit
def kl_value(logp, ref, kl_clamp, KIND: tl.constexpr):
    """Value of the estimator: the base kind's, with or without the straight-through flag (which changes the
    gradient, and gives NaN where the log-ratio is not finite, as verl's k2 - k2.detach()). kl_clamp bounds k3
    (inf: none)."""
    diff = logp - ref
    if KIND == K1 or KIND == K1 + STRAIGHT_THROUGH:
        out = diff
    elif KIND == ABS or KIND == ABS + STRAIGHT_THROUGH:
        out = tl.abs(diff)
    elif KIND == K2 or KIND == K2 + STRAIGHT_THROUGH:
        out = 0.5 * diff * diff
    else:
        d = clamp(ref - logp, -BOUND, BOUND)
        c = float_arg(kl_clamp, d.dtype)
        out = clamp(tl.exp(d) - d - 1.0, -c, c)
    if KIND >= STRAIGHT_THROUGH:
        # verl's "<kind>+" value is k2 - k2.detach() + value.detach(): NaN where k2 is infinite or NaN.
        out = tl.where(tl.abs(diff) < float("inf"), out, float("nan"))
    return out


@triton.jit
def kl_grad(logp, ref, kl_clamp, KIND: tl.constexpr):
    """d value / d logp (d / d ref is its negative); with the straight-through flag (KIND >=
    STRAIGHT_THROUGH): the gradient of k2."""
    diff = logp - ref
    if KIND >= STRAIGHT_THROUGH:
        g = diff
    elif KIND == K1:
        g = tl.full(diff.shape, 1.0, diff.dtype)
    elif KIND == ABS:
        g = tl.where(diff > 0, 1.0, tl.where(diff < 0, -1.0, 0.0)).to(diff.dtype)
    elif KIND == K3:
        raw = ref - logp
        d = clamp(raw, -BOUND, BOUND)
        e = tl.exp(d)
        c = float_arg(kl_clamp, d.dtype)
        passes = clamp_passes(raw, -BOUND, BOUND) & clamp_passes(e - d - 1.0, -c, c)
        g = tl.where(passes, 1.0 - e, 0.0)
    else:
        g = diff
    return g


@triton.jit
def _kl_forward_kernel(
    logp_ptr,  # [rows, n] row stride ld_logp (a flat call: one row, every stride 0)
    ref_ptr,  # [rows, n] row stride ld_ref
    out_ptr,  # [rows, n] row stride ld_out (contiguous: n)
    n,
    ld_logp,
    ld_ref,
    ld_out,
    kl_clamp: tl.float64,
    KIND: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """A program per (block of a row's n elements, row): grid (cdiv(n, BLOCK), rows)."""
    row = tl.program_id(1).to(tl.int64)
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    logp = to_acc(tl.load(logp_ptr + row * ld_logp + offs, mask=mask, other=0.0))
    ref = to_acc(tl.load(ref_ptr + row * ld_ref + offs, mask=mask, other=0.0))
    out = kl_value(logp, ref, kl_clamp, KIND)
    tl.store(out_ptr + row * ld_out + offs, out.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _kl_backward_kernel(
    grad_ptr,  # [rows, n] row stride ld_out, or [1] broadcast (GRAD_SCALAR)
    logp_ptr,  # [rows, n] row stride ld_logp (a flat call: one row, every stride 0)
    ref_ptr,  # [rows, n] row stride ld_ref
    grad_logp_ptr,  # [rows, n] row stride ld_out (written when LOGP_GRAD)
    grad_ref_ptr,  # [rows, n] row stride ld_out (written when REF_GRAD): -d logp
    n,
    ld_logp,
    ld_ref,
    ld_out,
    kl_clamp: tl.float64,
    KIND: tl.constexpr,
    GRAD_SCALAR: tl.constexpr,
    LOGP_GRAD: tl.constexpr,
    REF_GRAD: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(1).to(tl.int64)
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    out_offs = row * ld_out + offs
    if GRAD_SCALAR:
        grad = to_acc(tl.load(grad_ptr))
    else:
        grad = to_acc(tl.load(grad_ptr + out_offs, mask=mask, other=0.0))
    logp = to_acc(tl.load(logp_ptr + row * ld_logp + offs, mask=mask, other=0.0))
    ref = to_acc(tl.load(ref_ptr + row * ld_ref + offs, mask=mask, other=0.0))
    out = grad * kl_grad(logp, ref, kl_clamp, KIND)
    if LOGP_GRAD:
        tl.store(grad_logp_ptr + out_offs, out.to(grad_logp_ptr.dtype.element_ty), mask=mask)
    if REF_GRAD:
        tl.store(grad_ref_ptr + out_offs, (-out).to(grad_ref_ptr.dtype.element_ty), mask=mask)


def _clamp_arg(clamp_value):
    return float("inf") if clamp_value is None else float(clamp_value)


# Rows a launch may have: a grid's second axis holds at most 65535 programs.
MAX_ROWS = 65535


def _rows(logp: torch.Tensor, ref_logp: torch.Tensor):
    """(logp, ref_logp, rows, n, ld_logp, ld_ref, ld_out) as the kernels read them: [B, T] whose rows lie at
    any stride (verl's log-probs sliced out of the padded sequence) as B rows at their row strides, read in
    place; a contiguous pair, or any other layout made contiguous, as one flat row (every stride 0, which
    Triton knows divides 16: the loads stay vectorized)."""
    if logp.ndim == 2 and logp.shape[0] <= MAX_ROWS:
        B, T = logp.shape
        (logp, ref_logp), (ld_logp, ld_ref), strided = unit_rows(T, logp, ref_logp)
        if strided and B > 1:
            return logp, ref_logp, B, T, ld_logp, ld_ref, T
        return logp, ref_logp, 1, B * T, 0, 0, 0  # contiguous, or one row whose elements are adjacent
    logp, ref_logp = logp.contiguous(), ref_logp.contiguous()
    return logp, ref_logp, 1, logp.numel(), 0, 0, 0


def kl_penalty_forward(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str, kl_clamp) -> torch.Tensor:
    """logp, ref_logp: [...] of one float dtype -> [...] contiguous, same dtype."""
    logp, ref_logp, rows, n, ld_logp, ld_ref, ld_out = _rows(logp, ref_logp)
    out = torch.empty(logp.shape, dtype=store_dtype(logp.dtype), device=logp.device)
    if n and rows:
        block = elementwise_block(n)
        _kl_forward_kernel[(cdiv(n, block), rows)](
            logp, ref_logp, out, n, ld_logp, ld_ref, ld_out, _clamp_arg(kl_clamp), KIND=KL_KIND_CODES[kind],
            BLOCK=block,
        )  # fmt: skip
    return out.to(logp.dtype)


def expanded_scalar(grad: torch.Tensor) -> bool:
    """An upstream gradient expanded from one element (every stride 0: the gradient of `.sum()`), which the
    kernels read once instead of a contiguous copy of it."""
    return grad.numel() > 0 and all(s == 0 for s in grad.stride())


def kl_penalty_backward(
    grad: torch.Tensor,
    logp: torch.Tensor,
    ref_logp: torch.Tensor,
    kind: str,
    kl_clamp,
    logp_grad: bool = True,
    ref_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(d loss / d logp, d loss / d ref_logp = its negative) for upstream `grad`, in one launch; an output not
    asked for is an empty [0] tensor. grad: any strides (expanded from one element: read as is; otherwise
    made contiguous)."""
    scalar = expanded_scalar(grad)
    grad = grad if scalar else grad.contiguous()
    logp, ref_logp, rows, n, ld_logp, ld_ref, ld_out = _rows(logp, ref_logp)

    def output(wanted):
        if not wanted:
            return logp.new_empty(0)
        return torch.empty(logp.shape, dtype=store_dtype(logp.dtype), device=logp.device)

    d_logp, d_ref = output(logp_grad), output(ref_grad)
    if n and rows and (logp_grad or ref_grad):
        block = elementwise_block(n)
        _kl_backward_kernel[(cdiv(n, block), rows)](
            grad, logp, ref_logp, d_logp if logp_grad else d_ref, d_ref if ref_grad else d_logp, n,
            ld_logp, ld_ref, ld_out, _clamp_arg(kl_clamp), KIND=KL_KIND_CODES[kind], GRAD_SCALAR=scalar,
            LOGP_GRAD=logp_grad, REF_GRAD=ref_grad, BLOCK=block,
        )  # fmt: skip
    return d_logp.to(logp.dtype), d_ref.to(logp.dtype)


# Element counts that give each integer specialization Triton makes of `n`: divisible by 16, not, and 1.
SIZES = {"aligned": 4096, "odd": 4099, "one": 1}
# The backward's outputs: d logp, d ref_logp, or both.
GRADS = ("logp", "ref", "both")


def compile_cases():
    """Every specialization the launchers produce: kind x dtype x size class, the backward's outputs cycling
    over the size classes, an expanded upstream gradient, and [B, T] rows at their strides
    (rlkernels/triton/_specializations.py)."""
    for i, row in enumerate(
        full({"kind": tuple(KL_KIND_CODES), "dtype": FLOAT_DTYPES, "size": tuple(SIZES)})
    ):
        x = meta(SIZES[row["size"]], dtype=row["dtype"])
        label = f"{row['kind']},{dtype_name(row['dtype'])},{row['size']}"
        yield CompileCase(
            f"kl_penalty_forward[{label}]", functools.partial(kl_penalty_forward, x, x, row["kind"], 10.0)
        )
        grads = GRADS[i % len(GRADS)]  # every kind x dtype meets every choice over the size classes
        yield CompileCase(
            f"kl_penalty_backward[{label},{grads}]",
            functools.partial(
                kl_penalty_backward, x, x, x, row["kind"], 10.0, grads != "ref", grads != "logp"
            ),
        )
        if row["size"] == "aligned":
            yield CompileCase(
                f"kl_penalty_backward[{label},expanded grad]",
                functools.partial(
                    kl_penalty_backward, meta(1, dtype=row["dtype"]).expand(x.shape), x, x, row["kind"], 10.0,
                    True, True,
                ),
            )  # fmt: skip
        if row["size"] == "odd":  # rows at their strides: logp at an odd one (T + 1), ref_logp contiguous
            B, T = 3, SIZES["aligned"]
            lp, ref = meta(B, T + 1, dtype=row["dtype"])[:, 1:], meta(B, T, dtype=row["dtype"])
            label = f"{row['kind']},{dtype_name(row['dtype'])},rows"
            forward = functools.partial(kl_penalty_forward, lp, ref, row["kind"], 10.0)
            yield CompileCase(f"kl_penalty_forward[{label}]", forward)
            yield CompileCase(
                f"kl_penalty_backward[{label},{grads}]",
                functools.partial(
                    kl_penalty_backward, ref, lp, ref, row["kind"], 10.0, grads != "ref", grads != "logp"
                ),
            )
