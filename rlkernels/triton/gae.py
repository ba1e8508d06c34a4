"""GAE and discounted returns: a reverse `tl.associative_scan` of 2x2 affine maps.

Each position maps the carried state of the position to its right to its own (csrc/include/rlkernels/
gae.h has the derivation):
    GAE      x = (nextV, A):  nextV_t = (1-m) nextV + m V
                              A_t = m gamma nextV + (1 - m + m gamma lam) A + m (r - V)
    returns  x = (C, G):      G_t = m (r + gamma C),  C_t = m r + (1 - m + m gamma) C
i.e. x_t = [[p, 0], [q, s]] x_{t+1} + (b1, b2). The first row of the scan is verl's carried nextV (or the
running return, carried through masked positions); the second, which reads it, is the advantage (or the
return). One program scans one row (a padded row or a packed sequence) in chunks of BLOCK positions from
the right, carrying the state between chunks, and checks the values it reads (finite rewards and values,
0 / 1 integer masks, finite non-negative mask weights, its cu_seqlens entries). Every program publishes its
row's bad-value count and (weight, mean, centered sum of squares) of its outputs; the last program to finish
(`_finish.last_program`) writes the validity flag and, with whitening, the coefficients (mean, rstd) of all
rows together, which one elementwise launch applies (docs/gpu_token_ops.md). REINFORCE++ whitens the returns
times the mask; ReMax writes G - b·m beside the returns, in the scan.
"""

import functools

import torch
import triton
import triton.language as tl

from rlkernels._dtypes import acc_dtype
from rlkernels.reference.gae import WHITEN_EPS
from rlkernels.triton._common import cdiv, elementwise_block, float_arg, store_dtype, tl_acc, to_acc
from rlkernels.triton._device_assert import check, require
from rlkernels.triton._finish import last_program, launch_counter, publish
from rlkernels.triton._mask import load_mask, mask_kind
from rlkernels.triton._specializations import (
    FLOAT_DTYPES,
    INDEX_DTYPES,
    CompileCase,
    covering,
    meta,
)

# The scan's device assert (_device_assert), csrc/cuda/gae.cu's message.
BAD_VALUES = (
    "rlkernels gae / discounted returns: NaN or inf rewards, values or baselines, a mask value not 0 / 1 "
    "(integer) or finite and >= 0 (float), or cu_seqlens not 0, ..., N non-decreasing"
)
GAE = tl.constexpr(0)
RETURNS = tl.constexpr(1)
KINDS = {"gae": 0, "returns": 1}  # the codes of rlk::ScanKind (csrc/include/rlkernels/gae.h)
# Columns of each program's partials: its bad-value count, then its row's whitening moments.
NUM_PARTS = tl.constexpr(4)
BAD_PART = tl.constexpr(0)
W_PART = tl.constexpr(1)
MEAN_PART = tl.constexpr(2)
M2_PART = tl.constexpr(3)
# Rows the finishing program reduces at a time (a [1024] vector per column: 8 registers a thread, 4 warps).
FINISH_ROWS = tl.constexpr(1024)


@triton.jit
def _compose(p_in, q_in, s_in, b1_in, b2_in, p_out, q_out, s_out, b1_out, b2_out):
    """Combine of the reverse scan: `_in` is the accumulated part to the right (applies first), `_out` the
    element to its left (applies after it): returns out o in."""
    return (
        p_out * p_in,
        q_out * p_in + s_out * q_in,
        s_out * s_in,
        p_out * b1_in + b1_out,
        q_out * b1_in + s_out * b2_in + b2_out,
    )


@triton.jit
def finish_whiten(part_ptr, rows, coef_ptr, eps, ACC: tl.constexpr):
    """The last program: every row's (bad, weight, mean, m2) partials merged in a fixed order into the
    whitening coefficients (mean, 1 / sqrt(var + eps)) of all rows together (verl's unbiased variance, 0 with
    a total weight <= 1), written to coef_ptr; returns the inputs' validity (no bad value counted)."""
    lanes = tl.arange(0, FINISH_ROWS)
    bad = tl.zeros([FINISH_ROWS], ACC)
    w_sum = tl.zeros([FINISH_ROWS], ACC)
    s_sum = tl.zeros([FINISH_ROWS], ACC)
    for r0 in range(0, rows, FINISH_ROWS):
        idx = r0 + lanes
        inside = idx < rows
        bad += tl.load(part_ptr + idx * NUM_PARTS + BAD_PART, mask=inside, other=0.0, volatile=True)
        w = tl.load(part_ptr + idx * NUM_PARTS + W_PART, mask=inside, other=0.0, volatile=True)
        mu = tl.load(part_ptr + idx * NUM_PARTS + MEAN_PART, mask=inside, other=0.0, volatile=True)
        w_sum += w
        s_sum += w * mu
    wt = tl.sum(w_sum, axis=0)
    mean = tl.where(wt > 0, tl.sum(s_sum, axis=0) / tl.where(wt > 0, wt, 1.0), 0.0)
    m2_sum = tl.zeros([FINISH_ROWS], ACC)
    for r0 in range(0, rows, FINISH_ROWS):
        idx = r0 + lanes
        inside = idx < rows
        w = tl.load(part_ptr + idx * NUM_PARTS + W_PART, mask=inside, other=0.0, volatile=True)
        mu = tl.load(part_ptr + idx * NUM_PARTS + MEAN_PART, mask=inside, other=0.0, volatile=True)
        m2 = tl.load(part_ptr + idx * NUM_PARTS + M2_PART, mask=inside, other=0.0, volatile=True)
        m2_sum += m2 + w * (mu - mean) * (mu - mean)
    m2t = tl.sum(m2_sum, axis=0)
    var = tl.where(wt > 1, m2t / tl.where(wt > 1, wt - 1.0, 1.0), 0.0)
    tl.store(coef_ptr, mean)
    if ACC == tl.float64:
        rstd = 1.0 / tl.sqrt(var + eps)
    else:
        rstd = 1.0 / tl.sqrt_rn(var + eps)  # tl.sqrt is the fast approximation in fp32
    tl.store(coef_ptr + 1, rstd)
    return tl.sum(bad, axis=0) == 0


@triton.jit
def _finish_flag(part_ptr, rows, ok_ptr, ACC: tl.constexpr, CHECK_MSG: tl.constexpr):
    """The last program without whitening: the inputs' validity from every row's bad count."""
    lanes = tl.arange(0, FINISH_ROWS)
    bad = tl.zeros([FINISH_ROWS], ACC)
    for r0 in range(0, rows, FINISH_ROWS):
        idx = r0 + lanes
        bad += tl.load(part_ptr + idx * NUM_PARTS + BAD_PART, mask=idx < rows, other=0.0, volatile=True)
    require(tl.sum(bad, axis=0) == 0, CHECK_MSG)
    tl.store(ok_ptr, tl.sum(bad, axis=0) == 0)


@triton.jit
def _scan_kernel(
    r_ptr,  # [N] rewards (rows back to back)
    v_ptr,  # [N] values (GAE; unused for returns)
    m_ptr,  # [N] mask: bool, integer (0 / 1) or float weights
    cu_ptr,  # [rows + 1] int32/int64 row offsets (PACKED)
    base_ptr,  # [rows] baselines (BASELINE)
    out_ptr,  # [N] advantages (GAE) or returns
    second_ptr,  # [N] returns (GAE), or G - b m (BASELINE)
    part_ptr,  # [grid, NUM_PARTS] ACC: each program's (bad, weight, mean, m2)
    counter_ptr,  # [1] int32, zero (_finish.launch_counter)
    coef_ptr,  # [2] ACC: whitening (mean, 1 / sqrt(var + eps)) (WHITEN)
    ok_ptr,  # [] bool: every input value valid
    rows,
    N,  # elements of the flat inputs
    T,  # row length of the padded layout
    gamma: tl.float64,
    gl: tl.float64,  # gamma * lam
    eps: tl.float64,  # the whitening eps
    KIND: tl.constexpr,
    PACKED: tl.constexpr,
    WHITEN: tl.constexpr,
    BASELINE: tl.constexpr,
    MASK_KIND: tl.constexpr,
    ACC: tl.constexpr,
    BLOCK: tl.constexpr,
    CHECK_MSG: tl.constexpr,  # the device assert's message, or None (_device_assert)
):
    """Scans row program_id(0) (grid max(rows, 1): with no row, one program still checks cu_seqlens and writes
    the flag), checking the values it reads; the last program to finish writes the flag and, with WHITEN, the
    whitening coefficients."""
    row = tl.program_id(0)
    in_rows = row < rows
    bad = tl.zeros([1], ACC)
    if PACKED:
        raw_start = tl.load(cu_ptr + row).to(tl.int64)
        raw_end = tl.load(cu_ptr + row + 1, mask=in_rows, other=0).to(tl.int64)
        # cu_seqlens: starts at 0, non-decreasing, ends at N (flagged, and clamped into [0, N])
        bad += tl.where((row == 0) & (raw_start != 0), 1.0, 0.0)
        bad += tl.where(in_rows & (raw_end < raw_start), 1.0, 0.0)
        last_end = tl.where(in_rows, raw_end, raw_start)  # with no row, cu_seqlens[0] is the end
        bad += tl.where((row == tl.maximum(rows, 1) - 1) & (last_end != N), 1.0, 0.0)
        start = tl.minimum(tl.maximum(raw_start, 0), N)
        end = tl.minimum(tl.maximum(raw_end, start), N)
        end = tl.where(in_rows, end, start)
    else:
        start = row.to(tl.int64) * T
        end = tl.where(in_rows, start + T, start)
    gamma = float_arg(gamma, ACC)
    gl = float_arg(gl, ACC)
    b = tl.zeros([1], ACC)
    if BASELINE:
        here = row + tl.arange(0, 1)
        b = to_acc(tl.load(base_ptr + here, mask=here < rows, other=0.0))
        bad += tl.where(~(tl.abs(b) < float("inf")), 1.0, 0.0)
    lanes = tl.arange(0, BLOCK)
    x1 = tl.zeros([1], ACC)  # carried state of the position right of the chunk
    x2 = tl.zeros([1], ACC)
    w_run = tl.zeros([1], ACC)  # whitening moments of the row so far
    mean_run = tl.zeros([1], ACC)
    m2_run = tl.zeros([1], ACC)
    for c in range(0, tl.cdiv(end - start, BLOCK)):
        offs = end - (c + 1) * BLOCK + lanes
        valid = offs >= start
        r = to_acc(tl.load(r_ptr + offs, mask=valid, other=0.0))
        m, bad_m = load_mask(m_ptr + offs, valid, MASK_KIND, ACC)  # 0 off the row: identity maps for GAE
        finite = r - r  # NaN where r is NaN or inf (values too, for GAE)
        if KIND == GAE:
            v = to_acc(tl.load(v_ptr + offs, mask=valid, other=0.0))
            finite += v - v
            p = 1.0 - m
            q = m * gamma
            s = 1.0 - m + m * gl
            b1 = m * v
            b2 = m * (r - v)
        else:
            p = 1.0 - m + m * gamma
            q = m * gamma
            s = tl.zeros_like(m)
            b1 = m * r
            b2 = m * r
        bad += tl.sum(tl.where(bad_m | (finite != 0), 1.0, 0.0), axis=0, keep_dims=True)
        # Lanes left of the row (last chunk) come after every valid lane in the reverse scan: no effect.
        P, Q, S, B1, B2 = tl.associative_scan((p, q, s, b1, b2), 0, _compose, reverse=True)
        y1 = B1 + P * x1
        y2 = B2 + Q * x1 + S * x2
        tl.store(out_ptr + offs, y2.to(out_ptr.dtype.element_ty), mask=valid)
        if KIND == GAE:
            tl.store(second_ptr + offs, (y2 + v).to(second_ptr.dtype.element_ty), mask=valid)
        if BASELINE:
            tl.store(second_ptr + offs, (y2 - b * m).to(second_ptr.dtype.element_ty), mask=valid)
        if WHITEN:
            w_c = tl.sum(m, axis=0, keep_dims=True)
            mean_c = tl.sum(m * y2, axis=0, keep_dims=True) / tl.where(w_c > 0, w_c, 1.0)
            d = tl.where(valid, y2 - mean_c, 0.0)
            m2_c = tl.sum(m * d * d, axis=0, keep_dims=True)
            w_new = w_run + w_c
            delta = mean_c - mean_run
            frac = w_c / tl.where(w_new > 0, w_new, 1.0)
            mean_run = mean_run + delta * frac
            m2_run = m2_run + m2_c + delta * delta * w_run * frac
            w_run = w_new
        # The state at the chunk's first position is the carry into the next chunk to the left.
        x1 = tl.sum(tl.where(lanes == 0, y1, 0.0), axis=0, keep_dims=True)
        x2 = tl.sum(tl.where(lanes == 0, y2, 0.0), axis=0, keep_dims=True)
    cols = tl.arange(0, NUM_PARTS)
    part = tl.where(cols == BAD_PART, tl.sum(bad, axis=0), 0.0)
    part = tl.where(cols == W_PART, tl.sum(w_run, axis=0), part)
    part = tl.where(cols == MEAN_PART, tl.sum(mean_run, axis=0), part)
    part = tl.where(cols == M2_PART, tl.sum(m2_run, axis=0), part)
    publish(part_ptr + row * NUM_PARTS + cols, part, cols < NUM_PARTS)
    grid = tl.num_programs(0)
    if last_program(counter_ptr, grid):
        if WHITEN:
            ok = finish_whiten(part_ptr, grid, coef_ptr, float_arg(eps, ACC), ACC)
            require(ok, CHECK_MSG)
            tl.store(ok_ptr, ok)
        else:
            _finish_flag(part_ptr, grid, ok_ptr, ACC, CHECK_MSG)


@triton.jit
def _normalize_kernel(
    x_ptr,  # [n] values to whiten (GAE: the advantages, in place)
    out_ptr,  # [n] (x_ptr for GAE)
    m_ptr,  # [n] mask (MASK_OUT)
    coef_ptr,  # [2] (mean, 1 / sqrt(var + eps)) in the accumulation dtype
    n,
    MASK_OUT: tl.constexpr,
    MASK_KIND: tl.constexpr,
    ACC: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """out = (x - mean) * rstd, times the mask with MASK_OUT (REINFORCE++: masked_whiten(G) * m)."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    valid = offs < n
    mean = tl.load(coef_ptr)
    rstd = tl.load(coef_ptr + 1)
    x = (to_acc(tl.load(x_ptr + offs, mask=valid, other=0.0)) - mean) * rstd
    if MASK_OUT:
        m, _ = load_mask(m_ptr + offs, valid, MASK_KIND, ACC)
        x = x * m
    tl.store(out_ptr + offs, x.to(out_ptr.dtype.element_ty), mask=valid)


# Positions per chunk: up to 1024 (4 warps x 8 positions: loads stay wide, the scan stays in registers);
# short rows take a narrower chunk (at most 4x their length: the scan costs per lane, under the interpreter
# too), and three widths keep first-call compiles few.
BLOCKS = (64, 256, 1024)


def _block(longest: int) -> int:
    return next((b for b in BLOCKS if b >= longest), BLOCKS[-1])


def scan_forward(
    kind: str,
    rewards: torch.Tensor,
    values: torch.Tensor | None,
    mask: torch.Tensor,
    cu_seqlens: torch.Tensor | None,
    gamma: float,
    lam: float,
    whiten: bool,
    baseline: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """rewards, values, mask [B, T] (or [N] with cu_seqlens [S + 1]); rewards and values of one float dtype,
    mask bool, integer or float; baseline [B] (returns only) -> (out, second, ok []):
      gae:     (advantages, returns): whitened advantages with `whiten`;
      returns: (discounted returns, advantages): masked_whiten(returns) * mask with `whiten` (REINFORCE++),
               returns - baseline * mask with `baseline` (ReMax), else an empty [0] tensor.
    ok is False when an input value is rejected (the module docstring). One launch (+1 with whiten)."""
    dtype = rewards.dtype
    acc = acc_dtype(dtype)
    r = rewards.contiguous()
    v = values.contiguous() if values is not None else r
    m = mask.contiguous()
    packed = cu_seqlens is not None
    rows = cu_seqlens.numel() - 1 if packed else r.shape[0]
    row_len = 0 if packed else r.shape[1]
    out = torch.empty(r.shape, dtype=store_dtype(dtype), device=r.device)
    has_second = kind == "gae" or whiten or baseline is not None
    second = torch.empty_like(out) if has_second else out.new_empty(0)
    if r.numel() == 0:  # nothing to scan (a GPU launch would get null pointers): only cu_seqlens to check
        ok = (cu_seqlens == 0).all() if packed else torch.ones((), dtype=torch.bool, device=r.device)
        return out.to(dtype), second.to(dtype), ok
    ok = r.new_empty((), dtype=torch.bool)
    grid = max(rows, 1)  # with no row, one program still checks cu_seqlens
    coef = r.new_empty(2, dtype=acc)
    cu = cu_seqlens.contiguous() if packed else r
    parts = r.new_empty((grid, NUM_PARTS), dtype=acc)
    _scan_kernel[(grid,)](
        r, v, m, cu, r if baseline is None else baseline.contiguous(), out, second if has_second else out,
        parts, launch_counter(r.device), coef, ok, rows, r.numel(), row_len,
        gamma, gamma * lam, WHITEN_EPS,
        KIND=KINDS[kind], PACKED=packed, WHITEN=whiten, BASELINE=baseline is not None, MASK_KIND=mask_kind(m),
        ACC=tl_acc(acc), BLOCK=_block(r.numel() if packed else row_len), **check(r, BAD_VALUES),
    )  # fmt: skip
    n = out.numel()
    if whiten and n:
        block = elementwise_block(n)
        target = out if kind == "gae" else second  # GAE whitens in place; REINFORCE++ keeps the returns
        _normalize_kernel[(cdiv(n, block),)](
            out,
            target,
            m,
            coef,
            n,
            MASK_OUT=kind == "returns",
            MASK_KIND=mask_kind(m),
            ACC=tl_acc(acc),
            BLOCK=block,
        )
    return out.to(dtype), second.to(dtype), ok


def compile_cases():
    """The scans (GAE, GAE with whitening, returns, whitened returns, returns minus a baseline) x layout x
    mask / cu_seqlens dtypes x size class, in a covering design, and every dtype x block at the heaviest
    options (rlkernels/triton/_specializations.py)."""
    rows = covering(
        features={
            "scan": ("gae", "gae+whiten", "returns", "returns+whiten", "returns+baseline"),
            "layout": ("padded", "packed"),
            "mask": ("bool", "int", "float"),
            "cu": INDEX_DTYPES,
            "size": ("aligned", "odd"),
            "dtype": FLOAT_DTYPES,
        },
        resources={"dtype": FLOAT_DTYPES, "block": BLOCKS},
        heaviest={
            "scan": "gae+whiten",
            "layout": "packed",
            "mask": "float",
            "cu": torch.int64,
            "size": "odd",
        },
    )
    mask_dtypes = {"bool": torch.bool, "int": torch.int64}
    for row, _ in rows:
        dtype, packed = row["dtype"], row["layout"] == "packed"
        n = row["block"] - (row["size"] == "odd")  # picks `block`
        shape = (3 * n,) if packed else (3, n)
        r = meta(*shape, dtype=dtype)
        mask = meta(*shape, dtype=mask_dtypes.get(row["mask"], dtype))
        cu = meta(4, dtype=row["cu"]) if packed else None
        kind = "returns" if row["scan"].startswith("returns") else "gae"
        baseline = meta(3, dtype=dtype) if row["scan"] == "returns+baseline" else None
        label = ",".join(str(v) for v in row.values()).replace("torch.", "")
        yield CompileCase(
            f"scan_forward[{label}]",
            functools.partial(
                scan_forward, kind, r, None if kind == "returns" else r, mask, cu, 0.99, 0.95,
                row["scan"].endswith("whiten"), baseline,
            ),
        )  # fmt: skip
