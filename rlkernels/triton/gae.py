"""GAE and discounted returns: a reverse `tl.associative_scan` of 2x2 affine maps.

Each position maps the carried state of the position to its right to its own (csrc/include/rlkernels/
gae.h has the derivation):
    GAE      x = (nextV, A):  nextV_t = (1-m) nextV + m V
                              A_t = m gamma nextV + (1 - m + m gamma lam) A + m (r - V)
    returns  x = (C, G):      G_t = m (r + gamma C),  C_t = m r + (1 - m + m gamma) C
i.e. x_t = [[p, 0], [q, s]] x_{t+1} + (b1, b2). The first row of the scan is verl's carried nextV (or the
running return, carried through masked positions); the second, which reads it, is the advantage (or the
return). One program scans one row (a padded row or a packed sequence) in chunks of BLOCK positions from
the right, carrying the state between chunks. With `WHITEN`, each program also writes its row's (weight,
mean, centered sum of squares) of the advantages; they are merged across rows (Chan) and applied by a
second, elementwise kernel.
"""

import functools

import torch
import triton
import triton.language as tl

from rlkernels.reference.gae import WHITEN_EPS
from rlkernels.triton._common import elementwise_block, store_dtype, to_acc
from rlkernels.triton._scalar import join3, split3
from rlkernels.triton._specializations import (
    FLOAT_DTYPES,
    INDEX_DTYPES,
    CompileCase,
    covering,
    meta,
)

GAE = tl.constexpr(0)
RETURNS = tl.constexpr(1)
KINDS = {"gae": 0, "returns": 1}  # the codes of rlk::ScanKind (csrc/include/rlkernels/gae.h)


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
def _scan_kernel(
    r_ptr,  # [N] rewards (rows back to back)
    v_ptr,  # [N] values (GAE; unused for returns)
    m_ptr,  # [N] mask, bool or float
    cu_ptr,  # [rows + 1] int32/int64 row offsets (PACKED)
    out_ptr,  # [N] advantages (GAE) or returns
    ret_ptr,  # [N] returns (GAE)
    stats_ptr,  # [rows, 3] (weight, mean, m2) of the advantages (WHITEN)
    T,  # row length of the padded layout
    g_hi,
    g_mid,
    g_lo,  # gamma, split3
    gl_hi,
    gl_mid,
    gl_lo,  # gamma * lam, split3
    KIND: tl.constexpr,
    PACKED: tl.constexpr,
    WHITEN: tl.constexpr,
    ACC: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    if PACKED:
        start = tl.load(cu_ptr + row).to(tl.int64)
        end = tl.load(cu_ptr + row + 1).to(tl.int64)
        end = tl.maximum(end, start)  # a decreasing cu_seqlens (caught by the API) scans nothing
    else:
        start = row.to(tl.int64) * T
        end = start + T
    gamma = join3(g_hi, g_mid, g_lo, ACC)
    gl = join3(gl_hi, gl_mid, gl_lo, ACC)
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
        m = tl.load(m_ptr + offs, mask=valid, other=0).to(ACC)  # 0 off the row: identity maps for GAE
        if KIND == GAE:
            v = to_acc(tl.load(v_ptr + offs, mask=valid, other=0.0))
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
        # Lanes left of the row (last chunk) come after every valid lane in the reverse scan: no effect.
        P, Q, S, B1, B2 = tl.associative_scan((p, q, s, b1, b2), 0, _compose, reverse=True)
        y1 = B1 + P * x1
        y2 = B2 + Q * x1 + S * x2
        tl.store(out_ptr + offs, y2.to(out_ptr.dtype.element_ty), mask=valid)
        if KIND == GAE:
            tl.store(ret_ptr + offs, (y2 + v).to(ret_ptr.dtype.element_ty), mask=valid)
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
    if WHITEN:
        zero = tl.arange(0, 1)
        tl.store(stats_ptr + row * 3 + zero, w_run)
        tl.store(stats_ptr + row * 3 + 1 + zero, mean_run)
        tl.store(stats_ptr + row * 3 + 2 + zero, m2_run)


@triton.jit
def _normalize_kernel(
    x_ptr,  # [n] advantages, normalized in place
    coef_ptr,  # [2] (mean, 1 / sqrt(var + eps)) in the accumulation dtype
    n,
    BLOCK: tl.constexpr,
):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    valid = offs < n
    mean = tl.load(coef_ptr)
    rstd = tl.load(coef_ptr + 1)
    x = to_acc(tl.load(x_ptr + offs, mask=valid, other=0.0))
    tl.store(x_ptr + offs, ((x - mean) * rstd).to(x_ptr.dtype.element_ty), mask=valid)


def whiten_coefficients(stats: torch.Tensor) -> torch.Tensor:
    """Per-row moments [rows, 3] -> (mean, 1 / sqrt(var + 1e-8)) of all rows together (Chan's merge,
    verl's unbiased variance, var = 0 with at most one valid token). Device ops only, no host sync."""
    w, mu, m2 = stats.unbind(1)
    wt = w.sum()
    mean = torch.where(wt > 0, (w * mu).sum() / torch.where(wt > 0, wt, 1), 0)
    m2t = m2.sum() + (w * (mu - mean).square()).sum()
    var = torch.where(wt > 1, m2t / torch.where(wt > 1, wt - 1, 1), 0)
    return torch.stack([mean, torch.rsqrt(var + WHITEN_EPS)])


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
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """rewards, values, mask [B, T] (or [N] with cu_seqlens [S + 1]) of one float dtype (mask: bool or
    that dtype) -> (out, returns): GAE (advantages, returns) or (discounted returns, None)."""
    dtype = rewards.dtype
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    r = rewards.contiguous()
    v = values.contiguous() if values is not None else r
    m = mask.contiguous()
    packed = cu_seqlens is not None
    rows = cu_seqlens.numel() - 1 if packed else r.shape[0]
    row_len = 0 if packed else r.shape[1]
    out = torch.empty(r.shape, dtype=store_dtype(dtype), device=r.device)
    ret = torch.empty_like(out) if kind == "gae" else out
    stats = torch.empty((max(rows, 1), 3), dtype=acc, device=r.device) if whiten else out
    if rows > 0:
        cu = cu_seqlens.contiguous() if packed else r
        _scan_kernel[(rows,)](
            r,
            v,
            m,
            cu,
            out,
            ret,
            stats,
            row_len,
            *split3(gamma),
            *split3(gamma * lam),
            KIND=KINDS[kind],
            PACKED=packed,
            WHITEN=whiten,
            ACC=tl.float64 if acc == torch.float64 else tl.float32,
            BLOCK=_block(r.numel() if packed else row_len),
        )
    if whiten:
        coef = whiten_coefficients(stats[:rows])
        n = out.numel()
        if n:
            block = elementwise_block(n)
            _normalize_kernel[(triton.cdiv(n, block),)](out, coef, n, BLOCK=block)
    return out.to(dtype), (ret.to(dtype) if kind == "gae" else None)


def compile_cases():
    """The scans (GAE, GAE with whitening, returns) x layout x mask / cu_seqlens dtypes x size class, in a
    covering design, and every dtype x block at the heaviest options
    (rlkernels/triton/_specializations.py)."""
    rows = covering(
        features={
            "scan": ("gae", "gae+whiten", "returns"),
            "layout": ("padded", "packed"),
            "mask": ("bool", "float"),
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
    for row, _ in rows:
        dtype, packed = row["dtype"], row["layout"] == "packed"
        n = row["block"] - (row["size"] == "odd")  # picks `block`
        shape = (3 * n,) if packed else (3, n)
        r = meta(*shape, dtype=dtype)
        mask = meta(*shape, dtype=torch.bool if row["mask"] == "bool" else dtype)
        cu = meta(4, dtype=row["cu"]) if packed else None
        kind = "returns" if row["scan"] == "returns" else "gae"
        label = ",".join(str(v) for v in row.values()).replace("torch.", "")
        yield CompileCase(
            f"scan_forward[{label}]",
            functools.partial(
                scan_forward,
                kind,
                r,
                None if kind == "returns" else r,
                mask,
                cu,
                0.99,
                0.95,
                row["scan"] == "gae+whiten",
            ),
        )
