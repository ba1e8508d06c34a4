"""rollout_correction's one pass over the tokens: per row, the token weights (level="token"), the token
rejection mask (token_* rejection) and the row sums every metric and sequence-level decision is made of.

One program reads one row of (logp_old, logp_rollout, mask) in chunks of BLOCK tokens, once. What is left,
[B]-sized, is assembled by rlkernels/ops/rollout_correction.py. The formulas are the reference's
(rlkernels/reference/rollout_correction.py, the spec): with d = logp_old − logp_rollout on the valid
tokens (NaN → 0, ±inf → ±finfo.max as torch.nan_to_num), l = clamp(d, ±c) and ρ = e^l.
"""

import functools
import math

import torch
import triton
import triton.language as tl

from rlkernels.reference.rollout_correction import ROW_SUMS as STATS
from rlkernels.reference.rollout_correction import acc_dtype, ratio_range
from rlkernels.triton._common import to_acc
from rlkernels.triton._specializations import FLOAT_DTYPES, CompileCase, covering, meta

# The float options, one [NUM_PARAMS] tensor in the accumulation dtype (exact for fp64, unlike scalars).
PARAMS = (
    "clamp",
    "clip_min",
    "clip_max",
    "low_bound",
    "rej_low",
    "rej_high",
    "finite_max",
    "rho_min",
    "rho_max",
)
REJECTION_KINDS = {None: 0, "k1": 1, "k2": 2, "k3": 3}
REJECTION_AGGS = {None: 0, "token": 0, "seq_sum": 1, "seq_mean": 1, "seq_max": 2}
# Tokens per loop step on a GPU: 1024 per input in flight per program, 4 per thread of WARPS warps: the
# twelve per-lane row sums then fit in registers (4 warps spilled them in fp64).
BLOCK = 1024
WARPS = 8


@triton.jit
def _rollout_rows_kernel(
    old_ptr,  # [B, T] row stride stride_old
    roll_ptr,  # [B, T] row stride stride_roll
    mask_ptr,  # [B, T] int8/bool, row stride stride_mask (nonzero: valid)
    w_ptr,  # [B, T] contiguous, ACC (TOKEN_WEIGHTS)
    keep_ptr,  # [B, T] contiguous bool: valid and not rejected (TOKEN_REJECTION)
    stats_ptr,  # [len(STATS), B] ACC
    params_ptr,  # [9] ACC: PARAMS
    B,
    T,
    stride_old,
    stride_roll,
    stride_mask,
    TOKEN_WEIGHTS: tl.constexpr,
    MASK_MODE: tl.constexpr,
    REJ_KIND: tl.constexpr,  # 0 none, 1 k1, 2 k2, 3 k3
    REJ_AGG: tl.constexpr,  # 0 token, 1 sum, 2 max
    ACC: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    lanes = tl.arange(0, BLOCK)
    c = tl.load(params_ptr + 0)
    clip_min = tl.load(params_ptr + 1)  # 0: open
    clip_max = tl.load(params_ptr + 2)  # inf: open
    low_bound = tl.load(params_ptr + 3)  # 0: no low fraction
    rej_low = tl.load(params_ptr + 4)
    rej_high = tl.load(params_ptr + 5)
    big = tl.load(params_ptr + 6)  # finfo(ACC).max: where torch.nan_to_num puts ±inf
    rho_min = tl.load(params_ptr + 7)  # e^{-clamp}: ρ = clamp(e^d, e^{-c}, e^{c}) as the reference
    rho_max = tl.load(params_ptr + 8)
    zero = tl.zeros([BLOCK], ACC)
    count = zero
    sum_d = zero
    sum_k3 = zero
    sum_abs = zero
    max_abs = zero
    sum_w = zero
    min_w = zero + float("inf")
    max_w = zero - float("inf")
    n_high = zero
    n_low = zero
    n_oob = zero
    if REJ_AGG == 2:
        rej = zero - float("inf")
    else:
        rej = zero
    for t0 in range(0, T, BLOCK):
        cols = t0 + lanes
        inside = cols < T
        valid = tl.load(mask_ptr + row * stride_mask + cols, mask=inside, other=0) != 0
        old = to_acc(tl.load(old_ptr + row * stride_old + cols, mask=valid, other=0.0))
        roll = to_acc(tl.load(roll_ptr + row * stride_roll + cols, mask=valid, other=0.0))
        d = old - roll
        d = tl.where(d != d, 0.0, d)
        d = tl.where(d > big, big, tl.where(d < -big, -big, d))
        d = tl.where(valid, d, 0.0)
        e = tl.exp(d)
        count += valid.to(ACC)
        sum_d += d
        sum_k3 += tl.where(valid, e - d - 1.0, 0.0)
        sum_abs += tl.abs(d)
        max_abs = tl.maximum(max_abs, tl.abs(d))
        lr = tl.where(d < -c, -c, tl.where(d > c, c, d))
        if TOKEN_WEIGHTS:
            rho = tl.where(e < rho_min, rho_min, tl.where(e > rho_max, rho_max, e))
            if MASK_MODE:
                w = tl.where((rho < clip_min) | (rho > clip_max), 0.0, rho)
            else:
                w = tl.where(rho < clip_min, clip_min, tl.where(rho > clip_max, clip_max, rho))
            w = tl.where(valid, w, 0.0)
            tl.store(w_ptr + row * T + cols, w, mask=inside)
            sum_w += w
            min_w = tl.minimum(min_w, tl.where(valid, w, float("inf")))
            max_w = tl.maximum(max_w, tl.where(valid, w, -float("inf")))
            n_high += (valid & (rho > clip_max)).to(ACC)
            n_low += (valid & (rho < low_bound)).to(ACC)
            n_oob += (valid & ((rho < clip_min) | (rho > clip_max))).to(ACC)
        if REJ_KIND != 0:
            if REJ_KIND == 1:
                stat = -lr
            elif REJ_KIND == 2:
                stat = 0.5 * lr * lr
            else:
                stat = tl.exp(lr) - 1.0 - lr
            if REJ_AGG == 0:
                keep = (stat >= rej_low) & (stat <= rej_high)
                tl.store(keep_ptr + row * T + cols, valid & keep, mask=inside)
                rej += (valid & ~keep).to(ACC)
            elif REJ_AGG == 1:
                rej += tl.where(valid, stat, 0.0)
            else:
                rej = tl.maximum(rej, tl.where(valid, stat, -float("inf")))
    one = tl.arange(0, 1)
    tl.store(stats_ptr + 0 * B + row + one, tl.sum(count, axis=0, keep_dims=True))
    tl.store(stats_ptr + 1 * B + row + one, tl.sum(sum_d, axis=0, keep_dims=True))
    tl.store(stats_ptr + 2 * B + row + one, tl.sum(sum_k3, axis=0, keep_dims=True))
    tl.store(stats_ptr + 3 * B + row + one, tl.sum(sum_abs, axis=0, keep_dims=True))
    tl.store(stats_ptr + 4 * B + row + one, tl.max(max_abs, axis=0, keep_dims=True))
    tl.store(stats_ptr + 5 * B + row + one, tl.sum(sum_w, axis=0, keep_dims=True))
    tl.store(stats_ptr + 6 * B + row + one, tl.min(min_w, axis=0, keep_dims=True))
    tl.store(stats_ptr + 7 * B + row + one, tl.max(max_w, axis=0, keep_dims=True))
    tl.store(stats_ptr + 8 * B + row + one, tl.sum(n_high, axis=0, keep_dims=True))
    tl.store(stats_ptr + 9 * B + row + one, tl.sum(n_low, axis=0, keep_dims=True))
    tl.store(stats_ptr + 10 * B + row + one, tl.sum(n_oob, axis=0, keep_dims=True))
    if REJ_AGG == 2:
        tl.store(stats_ptr + 11 * B + row + one, tl.max(rej, axis=0, keep_dims=True))
    else:
        tl.store(stats_ptr + 11 * B + row + one, tl.sum(rej, axis=0, keep_dims=True))


def rollout_rows(logp_old, logp_rollout, valid, *, token_weights, mask_mode, clamp, clip_min, clip_max,
                 low_bound, rejection, rej_low, rej_high, block=None):  # fmt: skip
    """logp_old, logp_rollout [B, T] float (unit column stride), valid [B, T] bool -> (w [B, T] or [0],
    keep [B, T] bool or [0], stats [len(STATS), B]) in the accumulation dtype (float64 if an input is,
    else float32). Open bounds: clamp / clip_max / rej_high inf, clip_min / low_bound 0, rej_low -inf.
    rejection: a REJECTIONS name or None."""
    b, t = logp_old.shape
    acc = acc_dtype(logp_old, logp_rollout)
    dev = logp_old.device
    agg, kind = (None, None) if rejection is None else rejection.rsplit("_", 1)
    token_rejection = agg == "token"
    w = torch.empty((b, t) if token_weights else (0,), dtype=acc, device=dev)
    keep = torch.empty((b, t) if token_rejection else (0,), dtype=torch.bool, device=dev)
    stats = torch.empty((len(STATS), b), dtype=acc, device=dev)
    finite_max = torch.finfo(acc).max
    rho = ratio_range(clamp)
    params = torch.tensor(
        [clamp, clip_min, clip_max, low_bound, rej_low, rej_high, finite_max, *rho], dtype=acc
    )
    params = params.to(dev)
    if b == 0:
        return w, keep, stats
    _rollout_rows_kernel[(b,)](
        logp_old, logp_rollout, valid, w if token_weights else stats, keep if token_rejection else valid,
        stats, params, b, t, logp_old.stride(0), logp_rollout.stride(0), valid.stride(0),
        TOKEN_WEIGHTS=token_weights, MASK_MODE=mask_mode, REJ_KIND=REJECTION_KINDS[kind],
        REJ_AGG=REJECTION_AGGS[agg], ACC=tl.float64 if acc == torch.float64 else tl.float32,
        BLOCK=block or min(BLOCK, triton.next_power_of_2(max(t, 1))), num_warps=WARPS,
    )  # fmt: skip
    return w, keep, stats


def compile_cases():
    """Every input dtype with every option on (weights in both modes, each rejection kind and aggregation),
    at the full block and at a short row's block (rlkernels/triton/_specializations.py)."""
    rows = covering(
        features={
            "weights": (None, "truncate", "mask"),
            "rejection": (None, "token_k1", "token_k3", "seq_sum_k2", "seq_max_k3"),
        },
        resources={"dtype": FLOAT_DTYPES, "block": (BLOCK, 64)},
        heaviest={"weights": "mask", "rejection": "token_k3"},
    )
    for row, _ in rows:
        b, t = 64, 4096
        old = meta(b, t, dtype=row["dtype"])
        label = ",".join(str(v) for v in row.values()).replace("torch.", "")
        yield CompileCase(
            f"rollout_correction[{label}]",
            functools.partial(
                rollout_rows, old, meta(b, t, dtype=row["dtype"]), meta(b, t, dtype=torch.bool),
                token_weights=row["weights"] is not None, mask_mode=row["weights"] == "mask", clamp=20.0,
                clip_min=0.5, clip_max=2.0, low_bound=0.5, rejection=row["rejection"],
                rej_low=-math.log(2.0), rej_high=math.log(2.0), block=row["block"],
            ),
        )  # fmt: skip
