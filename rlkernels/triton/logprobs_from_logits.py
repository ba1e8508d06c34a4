"""logprobs_from_logits Triton kernels: one program per row, streaming the row in blocks with an online
log-sum-exp. Memory-bound: the forward reads the logits once (no log_softmax copy), the backward reads them
once and writes the gradient once."""

import functools

import torch
import triton
import triton.language as tl

from rlkernels._backend import triton_interpreting
from rlkernels._dtypes import acc_dtype
from rlkernels.triton._common import float_arg, next_pow2, store_dtype, tl_acc, to_acc
from rlkernels.triton._device_assert import check, require
from rlkernels.triton._finish import last_program, launch_counter, publish
from rlkernels.triton._softmax import (
    UNFUSED,
    finalize_stats,
    logit_grad,
    merge_stats,
    split_lse,
    sum_sq_of,
    tile_stats,
    transform_args,
    transform_grad,
    transform_logit,
    transform_options,
)
from rlkernels.triton._specializations import (
    FLOAT_DTYPES,
    INDEX_DTYPES,
    CompileCase,
    covering,
    dtype_name,
    meta,
)


@triton.jit
def _logits_forward_kernel(
    logits_ptr,  # [N, V] or [B, T, V] (N = B·T; row n at the strides of _row_strides), unit column stride
    labels_ptr,  # [N]
    logp_ptr,  # [N] fp32/fp64
    entropy_ptr,  # [N] (unused without ENTROPY)
    lse_ptr,  # [N] float64
    sum_sq_ptr,  # [N] Σ softmax² (unused without SUM_SQ)
    part_ptr,  # [N] fp32: each row's bad label (CHECK)
    counter_ptr,  # [1] int32, zero (_finish.launch_counter; CHECK)
    ok_ptr,  # [] bool: every label in [0, V) or ignore_index (CHECK)
    V,
    per_batch,  # rows a batch (1 for [N, V]: the division folds away)
    stride_batch,
    stride_row,
    ignore_index,
    inv_temp: tl.float64,
    cap: tl.float64,
    inv_cap: tl.float64,
    SOFTCAP: tl.constexpr,
    ENTROPY: tl.constexpr,
    SUM_SQ: tl.constexpr,
    CHECK: tl.constexpr,
    ACC: tl.constexpr,  # tl.float32, or tl.float64 for fp64 logits
    BLOCK_V: tl.constexpr,
    STAGES: tl.constexpr,  # logits blocks in flight (LOAD_STAGES)
    CHECK_MSG: tl.constexpr,  # the device assert's message, or None (_device_assert)
):
    inv_temp, cap, inv_cap = transform_options(inv_temp, cap, inv_cap, ACC)  # once, not per tile
    row = tl.program_id(0).to(tl.int64)
    label = tl.load(labels_ptr + row).to(tl.int64)
    valid = label != ignore_index
    bad = valid & ((label < 0) | (label >= V))  # read nowhere: the row gives 0 and the flag goes down
    valid = valid & ~bad
    if valid:
        base = logits_ptr + (row // per_batch) * stride_batch + (row % per_batch) * stride_row
        m = tl.full((1,), float("-inf"), ACC)
        s = tl.zeros((1,), ACC)
        a = tl.zeros((1,), ACC)
        q = tl.zeros((1,), ACC)
        for v0 in tl.range(0, V, BLOCK_V, num_stages=STAGES):
            cols = v0 + tl.arange(0, BLOCK_V)
            mask = cols < V
            x = to_acc(tl.load(base + cols, mask=mask, other=0.0))
            z = transform_logit(x, inv_temp, cap, inv_cap, SOFTCAP)[None, :]
            # A -inf logit (a masked token) is left out: q = 0, no 0 * -inf in the entropy's sum, and a
            # tile of them only is empty. NaN is kept (it reaches the sums).
            m_t, s_t, a_t, q_t = tile_stats(z, mask[None, :] & (z != float("-inf")), ENTROPY, SUM_SQ)
            m, s, a, q = merge_stats(m, s, a, q, m_t, s_t, a_t, q_t, SUM_SQ)
        z_y = transform_logit(
            to_acc(tl.load(base + label + tl.zeros((1,), tl.int64))), inv_temp, cap, inv_cap, SOFTCAP
        )
        logp, entropy, lse = finalize_stats(m, s, a, z_y)
        sum_sq = sum_sq_of(s, q)
    else:
        logp = tl.zeros((1,), ACC)
        entropy = logp
        lse = tl.zeros((1,), tl.float64)
        sum_sq = logp
    one = tl.arange(0, 1)
    tl.store(logp_ptr + row + one, logp.to(logp_ptr.dtype.element_ty))
    tl.store(lse_ptr + row + one, lse)
    if ENTROPY:
        tl.store(entropy_ptr + row + one, entropy.to(entropy_ptr.dtype.element_ty))
    if SUM_SQ:
        tl.store(sum_sq_ptr + row + one, sum_sq.to(sum_sq_ptr.dtype.element_ty))
    if CHECK:
        publish(part_ptr + row + one, tl.where(bad, 1.0, 0.0) + tl.zeros((1,), tl.float32), one < 1)
        rows = tl.num_programs(0)
        if last_program(counter_ptr, rows):
            lanes = tl.arange(0, FINISH_ROWS)
            total = tl.zeros([FINISH_ROWS], tl.float32)
            for r0 in range(0, rows, FINISH_ROWS):
                idx = r0 + lanes
                total += tl.load(part_ptr + idx, mask=idx < rows, other=0.0, volatile=True)
            require(tl.sum(total, axis=0) == 0, CHECK_MSG)
            tl.store(ok_ptr, tl.sum(total, axis=0) == 0)


@triton.jit
def _logits_backward_kernel(
    logits_ptr,  # [N, V] or [B, T, V] at the strides of _row_strides, unit column stride
    labels_ptr,  # [N]
    g_logp_ptr,  # [N] at stride g_stride (0: one element broadcast)
    g_ent_ptr,  # [N] at stride e_stride (unused without ENTROPY)
    lse_ptr,  # [N] float64
    entropy_ptr,  # [N] (unused without ENTROPY)
    grad_ptr,  # [N, V] at row stride grad_stride (the logits' own storage: their row's first bytes)
    V,
    per_batch,  # rows a batch (1 for [N, V])
    stride_batch,
    stride_row,
    ignore_index,
    grad_stride,
    inv_temp: tl.float64,
    cap: tl.float64,
    inv_cap: tl.float64,
    temp_over_cap: tl.float64,
    g_stride,
    e_stride,
    SOFTCAP: tl.constexpr,
    ENTROPY: tl.constexpr,
    LOGP_GRAD: tl.constexpr,
    BLOCK_V: tl.constexpr,
    STAGES: tl.constexpr,  # logits blocks in flight (LOAD_STAGES)
    OVER_LOGITS: tl.constexpr,  # grad_ptr is the logits' own storage
):
    row = tl.program_id(0).to(tl.int64)
    one = tl.arange(0, 1)
    label = tl.load(labels_ptr + row + one).to(tl.int64)
    valid = label != ignore_index
    # Ignored rows: zero gradient (the coefficients below vanish and the row's lse is never read). Without
    # LOGP_GRAD (only the entropy reaches the loss) d logp is 0.
    if LOGP_GRAD:
        g_logp = tl.where(valid, to_acc(tl.load(g_logp_ptr + row * g_stride + one)), 0.0)
    else:  # the entropy's gradient is given (ENTROPY)
        g_logp = tl.zeros_like(to_acc(tl.load(entropy_ptr + row + one)))
    lse_hi, lse_lo = split_lse(tl.where(valid, tl.load(lse_ptr + row + one), 0.0), g_logp)
    inv_temp, cap, inv_cap = transform_options(inv_temp, cap, inv_cap, g_logp.dtype)  # once, not per tile
    temp_over_cap = float_arg(temp_over_cap, g_logp.dtype)
    if ENTROPY:
        g_ent = tl.where(valid, to_acc(tl.load(g_ent_ptr + row * e_stride + one)), 0.0)
        entropy = tl.where(valid, to_acc(tl.load(entropy_ptr + row + one)), 0.0)
    else:
        g_ent = g_logp
        entropy = g_logp
    base = logits_ptr + (row // per_batch) * stride_batch + (row % per_batch) * stride_row
    out = grad_ptr + row * grad_stride
    for v0 in tl.range(0, V, BLOCK_V, num_stages=STAGES):
        cols = v0 + tl.arange(0, BLOCK_V)
        mask = cols < V
        x = to_acc(tl.load(base + cols, mask=mask & valid, other=0.0))
        z = transform_logit(x, inv_temp, cap, inv_cap, SOFTCAP)[None, :]
        # A -inf logit (a masked token; never under a softcap) taken 1e4 under the row's LSE: q = 0 exactly,
        # so its gradient is its label term alone, where -inf itself meets 0 * -inf.
        z = tl.where(z == float("-inf"), lse_hi[:, None] - 1e4, z)
        dz = logit_grad(z, lse_hi, lse_lo, entropy, g_logp, g_ent, cols[None, :] == label[:, None], ENTROPY)
        dx = tl.where(valid[:, None], dz * transform_grad(z, inv_temp, temp_over_cap, SOFTCAP), 0.0)
        if OVER_LOGITS:  # the tile's stores land on logits other warps load in this step: every load first
            tl.debug_barrier()
        tl.store(out + cols[None, :], dx.to(grad_ptr.dtype.element_ty), mask=mask[None, :])


# The label check's device assert (_device_assert), csrc/cuda/logprobs.cu's message.
BAD_LABELS = "rlkernels logprobs_from_logits: a label outside [0, V) that is not ignore_index"
# Rows the finishing program of the label check reduces at a time (a [1024] vector: 8 per thread of 4 warps).
FINISH_ROWS = tl.constexpr(1024)
# Logits per loop step on a GPU: 4096 (16 KiB of fp32 per program in flight, plenty of loads to hide
# latency); narrower steps for small vocabularies only (masked lanes cost little, and three widths keep the
# specializations, and first-call compiles, few).
VOCAB_BLOCKS = (256, 1024, 4096)
# Logits blocks a program has in flight: Triton pipelines the row loop's loads (cp.async into shared memory,
# sm_80+), so two blocks are on their way while one is reduced; a loop that loads as it reduces waits for
# each block (its forward's loads and its three block reductions alternate).
LOAD_STAGES = 3


def _block_v(vocab: int, dtype: torch.dtype = torch.float32) -> int:
    """A VOCAB_BLOCKS entry on a GPU (fp64 logits: at most 1024, the backward's fp64 temporaries of a 4096
    block spilled past the budget); under the interpreter at most 512, which keeps the multi-block path
    exercised at test sizes."""
    if triton_interpreting():
        return min(512, next_pow2(max(vocab, 1)))
    block = next((b for b in VOCAB_BLOCKS if b >= vocab), VOCAB_BLOCKS[-1])
    return min(block, 1024) if dtype == torch.float64 else block


def _rows(logits: torch.Tensor) -> torch.Tensor:
    return logits if logits.stride(-1) == 1 else logits.contiguous()


def _row_strides(x: torch.Tensor) -> tuple[int, int, int, int, int]:
    """(N, V, per_batch, stride_batch, stride_row) of logits x [N, V], or [B, T, V] read in place (a slice
    such as logits[:, :-1], whose rows are at two strides): row n at (n // per_batch) · stride_batch +
    (n % per_batch) · stride_row. [N, V] is N batches of one row, so that the kernels' division folds away."""
    if x.dim() == 2:
        return x.shape[0], x.shape[1], 1, x.stride(0), 0
    if x.dim() != 3:
        raise ValueError(f"logits must be [N, V] or [B, T, V], got shape {tuple(x.shape)}")
    b, t, vocab = x.shape
    return b * t, vocab, max(t, 1), x.stride(0), x.stride(1)


def logprobs_from_logits_forward(
    logits: torch.Tensor,
    labels: torch.Tensor,
    temperature: float,
    softcap: float | None,
    ignore_index: int,
    return_entropy: bool,
    return_sum_pi_squared: bool,
    check_labels: bool = False,
):
    """logits [N, V] or [B, T, V] (read in place at any row and batch strides), labels [N] (N = B·T) -> (logp
    [N], entropy [N] or [0], lse [N], sum_pi_squared [N] or [0]) in fp32
    (fp64 for fp64 logits), lse in fp64; with check_labels also ok [] bool: every label in [0, V) or
    ignore_index (a row with another label gives 0 and reads no logit). One launch."""
    x = _rows(logits)
    n, vocab, per_batch, stride_batch, stride_row = _row_strides(x)
    acc = acc_dtype(x.dtype)
    logp = torch.empty(n, dtype=acc, device=x.device)
    lse = torch.empty(n, dtype=torch.float64, device=x.device)
    entropy = torch.empty(n if return_entropy else 0, dtype=acc, device=x.device)
    sum_sq = torch.empty(n if return_sum_pi_squared else 0, dtype=acc, device=x.device)
    ok = torch.ones((), dtype=torch.bool, device=x.device) if n == 0 and check_labels else None
    if n:
        inv_temp, cap, inv_cap, _ = transform_args(temperature, softcap)
        ok = x.new_empty((), dtype=torch.bool)
        _logits_forward_kernel[(n,)](
            x, labels.contiguous(), logp, entropy if return_entropy else logp, lse,
            sum_sq if return_sum_pi_squared else logp,
            x.new_empty(n, dtype=torch.float32) if check_labels else logp,
            launch_counter(x.device) if check_labels else labels, ok, vocab, per_batch, stride_batch,
            stride_row, ignore_index,
            inv_temp, cap, inv_cap, SOFTCAP=softcap is not None, ENTROPY=return_entropy,
            SUM_SQ=return_sum_pi_squared, CHECK=check_labels, ACC=tl_acc(acc),
            BLOCK_V=_block_v(vocab, x.dtype), STAGES=LOAD_STAGES,
            **check(x, BAD_LABELS if check_labels else None), **UNFUSED,
        )  # fmt: skip
    if check_labels:
        return logp, entropy, lse, sum_sq, ok
    return logp, entropy, lse, sum_sq


def _row_grad(grad: torch.Tensor | None) -> tuple[torch.Tensor | None, int]:
    """An upstream per-row gradient and its stride: read as is when expanded from one element (stride 0,
    the gradient of `.sum()`), else made contiguous."""
    if grad is None:
        return None, 0
    if grad.numel() and grad.stride(0) == 0:
        return grad, 0
    return grad.contiguous(), 1


def logprobs_from_logits_backward(
    grad_logp: torch.Tensor | None,
    grad_entropy: torch.Tensor | None,
    logits: torch.Tensor,
    labels: torch.Tensor,
    lse: torch.Tensor,
    entropy: torch.Tensor,
    temperature: float,
    softcap: float | None,
    ignore_index: int,
    out_dtype: torch.dtype | None = None,
    into_logits: bool = False,
) -> torch.Tensor:
    """d loss / d logits (the logits' shape, contiguous) in the logits' dtype (or out_dtype: rounded in the
    kernel, as .to() would round it), in one launch. Upstream grads of any strides (expanded from one
    element: read as they are); grad_logp None: only the entropy reaches the loss.

    into_logits (contiguous logits, out_dtype no wider than theirs): the gradient is written over the logits,
    each row's in the first bytes of that row's own storage, and returned as a row-strided view of them. A
    program owns its row, and column c's gradient lands on the bytes of column c·size(out)/size(logits) <=
    c: logits of this step's tile or earlier ones. A barrier between each tile's loads and its stores
    orders them across the program's warps (earlier tiles were loaded before the last barrier; later ones
    are never written), so the row sweep keeps one [R, V] block, not two."""
    x = _rows(logits)
    n, vocab, per_batch, stride_batch, stride_row = _row_strides(x)
    out_dtype = x.dtype if out_dtype is None else out_dtype
    if into_logits:
        if x is not logits or x.dim() != 2 or store_dtype(out_dtype).itemsize > x.dtype.itemsize:
            raise ValueError("into_logits needs contiguous logits at least as wide as what the kernel stores")
        grad = x.view(store_dtype(out_dtype))[:, :vocab]  # [N, V] at the logits' row stride in bytes
    else:
        grad = torch.empty((n, vocab), dtype=store_dtype(out_dtype), device=x.device)
    if n:
        with_entropy = grad_entropy is not None
        g_logp, g_stride = _row_grad(grad_logp)
        g_ent, e_stride = _row_grad(grad_entropy)
        ent = entropy.contiguous() if with_entropy else lse
        inv_temp, cap, inv_cap, temp_over_cap = transform_args(temperature, softcap)
        _logits_backward_kernel[(n,)](
            x, labels.contiguous(), lse if g_logp is None else g_logp, g_ent if with_entropy else lse,
            lse.to(torch.float64).contiguous(), ent, grad, vocab, per_batch, stride_batch, stride_row,
            ignore_index, grad.stride(0),
            inv_temp, cap, inv_cap, temp_over_cap, g_stride, e_stride, SOFTCAP=softcap is not None,
            ENTROPY=with_entropy, LOGP_GRAD=g_logp is not None, BLOCK_V=_block_v(vocab, x.dtype),
            STAGES=LOAD_STAGES, OVER_LOGITS=into_logits, **UNFUSED,
        )  # fmt: skip
    if not into_logits or grad.dtype == out_dtype:
        return grad.view(x.shape).to(out_dtype)
    # the interpreter wrote fp32 over the fp32 logits: rounded by torch into each row's first bytes here
    over = x.view(out_dtype)[:, :vocab]
    over.copy_(x.to(out_dtype))
    return over


def compile_cases():
    """Options x labels dtype x size class x the label check x the upstream gradients in a covering design,
    plus every dtype x vocabulary block with every option on, forward and backward
    (rlkernels/triton/_specializations.py)."""
    rows = covering(
        features={
            "softcap": (None, 30.0),
            "entropy": (False, True),
            "sum_sq": (False, True),
            "check": (False, True),
            "grads": ("contiguous", "expanded", "entropy only"),
            "labels": INDEX_DTYPES,
            "size": ("aligned", "odd"),
            "dtype": FLOAT_DTYPES,
        },
        resources={"dtype": FLOAT_DTYPES, "block": VOCAB_BLOCKS},
        heaviest={
            "softcap": 30.0, "entropy": True, "sum_sq": True, "check": True, "grads": "contiguous",
            "labels": torch.int64, "size": "odd",
        },
    )  # fmt: skip
    for row, _ in rows:
        n, vocab = 64, row["block"] - (row["size"] == "odd")
        logits = meta(n, vocab, dtype=row["dtype"])
        labels = meta(n, dtype=row["labels"])
        acc = acc_dtype(row["dtype"])
        stat, lse = meta(n, dtype=acc), meta(n, dtype=torch.float64)
        label = ",".join(str(v) for v in row.values()).replace("torch.", "")
        yield CompileCase(
            f"logprobs_from_logits_forward[{label}]",
            functools.partial(
                logprobs_from_logits_forward, logits, labels, 0.7, row["softcap"], -100, row["entropy"],
                row["sum_sq"], row["check"],
            ),
        )  # fmt: skip
        entropy = row["entropy"] or row["grads"] == "entropy only"
        g = meta(1, dtype=acc).expand(n) if row["grads"] == "expanded" else stat
        yield CompileCase(
            f"logprobs_from_logits_backward[{label}]",
            functools.partial(
                logprobs_from_logits_backward, None if row["grads"] == "entropy only" else g,
                g if entropy else None, logits, labels, lse, stat, 0.7, row["softcap"], -100,
            ),
        )  # fmt: skip
    # The row sweep's backward on a 16-bit head (ops/linear_sweep.py): fp32 logits, the gradient written over
    # them in the GEMMs' operand dtype, every vocabulary block, odd and 16-aligned widths (the row stride is
    # specialized on it), every option on.
    for block in VOCAB_BLOCKS:
        for out in (torch.bfloat16, torch.float16):
            for vocab in (block - 1, block):
                n, stat = 64, meta(64, dtype=torch.float32)
                yield CompileCase(
                    f"logprobs_from_logits_backward[fp32 logits,{dtype_name(out)} over them,{vocab}]",
                    functools.partial(
                        logprobs_from_logits_backward, stat, stat, meta(n, vocab, dtype=torch.float32),
                        meta(n, dtype=torch.int64), meta(n, dtype=torch.float64), stat, 0.7, 30.0, -100, out,
                        into_logits=True,
                    ),
                )  # fmt: skip
