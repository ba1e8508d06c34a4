"""rollout_correction in one pass over the tokens, finished in the same launch (docs/gpu_token_ops.md): per
row the token weights (level="token"), the rejection mask of a token_* rejection and the row sums every
metric and sequence-level decision is made of; the last program to finish (`_finish.last_program`) reduces the
rows' sums in a fixed order into the metrics, the sequence-level weights (and their batch normalization) and
each row's seq_* rejection, and the mask's validity. A second, elementwise launch runs only where the tokens
need the batch's answer: token weights divided by the batch mean (batch_normalize), or the mask of a seq_*
rejection. Nothing [B]-sized is left to torch ops, and no tensor is built on the host.

The formulas are the reference's (rlkernels/reference/rollout_correction.py, the spec; the C++ twin of the
finishing: csrc/include/rlkernels/rollout_correction.h): with d = logp_old − logp_rollout on the valid tokens
(NaN → 0, ±inf → ±finfo.max as torch.nan_to_num), l = clamp(d, ±c) and ρ = e^l.
"""

import functools
import math

import torch
import triton
import triton.language as tl

from rlkernels._dtypes import acc_dtype
from rlkernels.ops.rollout_correction import METRICS
from rlkernels.reference.rollout_correction import ROW_SUMS as STATS
from rlkernels.reference.rollout_correction import VERL, ratio_range
from rlkernels.triton._common import cdiv, float_arg, next_pow2, tl_acc, to_acc
from rlkernels.triton._device_assert import check, require
from rlkernels.triton._finish import last_program, launch_counter, publish
from rlkernels.triton._mask import mask_bad, mask_kind
from rlkernels.triton._specializations import FLOAT_DTYPES, CompileCase, covering, meta

# The rows kernel's device assert (_device_assert), csrc/cuda/rollout_correction.cu's message.
BAD_MASK = "rlkernels rollout_correction: a mask value not 0 / 1 (integer) or finite and >= 0 (float)"
LEVELS = {None: 0, "token": 1, "sequence": 2}  # rlk::RolloutLevel
TOKEN_LEVEL = tl.constexpr(1)
SEQUENCE_LEVEL = tl.constexpr(2)
REJECTION_KINDS = {None: 0, "k1": 1, "k2": 2, "k3": 3}
REJECTION_AGGS = {None: 0, "token": 1, "seq_sum": 2, "seq_mean": 2, "seq_max": 3}  # rlk::RejectionAgg
TOKEN_AGG = tl.constexpr(1)
SUM_AGG = tl.constexpr(2)
MAX_AGG = tl.constexpr(3)
# Columns of each row's published partials: the STATS, then its bad mask values.
NUM_STATS = tl.constexpr(len(STATS))
NUM_PARTS = tl.constexpr(len(STATS) + 1)
PARTS_PAD = tl.constexpr(next_pow2(len(STATS) + 1))
BAD_PART = tl.constexpr(len(STATS))
NUM_METRICS = tl.constexpr(len(METRICS))
METRICS_PAD = tl.constexpr(next_pow2(len(METRICS)))
# verl rollout_is_batch_normalize: a mean below this is not divided by.
BATCH_NORM_MIN = tl.constexpr(1e-8)
# Tokens per loop step on a GPU: 1024 per input in flight per program, 4 per thread of WARPS warps: the
# twelve per-lane row sums then fit in registers (4 warps spilled them in fp64).
BLOCK = 1024
WARPS = 8
# Rows the finishing program reduces at a time (one per thread of 8 warps: its twenty fp64 totals per lane
# stay in registers; 2048 spilled ~1 KB a thread).
FINISH_ROWS = tl.constexpr(256)
# Tokens per program of the second, elementwise launch (8 per thread of 4 warps, 128-bit loads).
TOKEN_BLOCK = 1024


@triton.jit
def _col(stats_ptr, rows, in_rows, col):
    """Column `col` of the rows' published partials, [R] (another program's: read past the L1)."""
    return tl.load(stats_ptr + rows * NUM_PARTS + col, mask=in_rows, other=0.0, volatile=True)


@triton.jit
def _sequence_weight(sum_d, count, c, clip_min, clip_max, MASK_MODE: tl.constexpr):
    """The sequence-level weight of rows with Σd and valid-token count (0 for an empty row)."""
    rho = tl.exp(tl.where(sum_d < -c, -c, tl.where(sum_d > c, c, sum_d)))
    low = rho < clip_min
    high = rho > clip_max
    if MASK_MODE:
        w = tl.where(low | high, 0.0, rho)
    else:
        w = tl.where(low, clip_min, tl.where(high, clip_max, rho))
    return tl.where(count > 0, w, 0.0), rho


@triton.jit
def _row_kept(rej, count, rej_low, rej_high, SEQ_MEAN: tl.constexpr, REJ_AGG: tl.constexpr):
    """Whether a seq_* rejection keeps rows whose statistic column is `rej`."""
    value = rej
    if SEQ_MEAN:
        value = rej / tl.where(count > 1, count, 1.0)
    if REJ_AGG == MAX_AGG:
        value = tl.where(count > 0, rej, 0.0)
    return (value >= rej_low) & (value <= rej_high)


@triton.jit
def _finish(
    part_ptr, w_ptr, keep_row_ptr, metrics_ptr, ok_ptr, B, c, clip_min, clip_max, rej_low, rej_high,
    log_upper, log_low, LEVEL: tl.constexpr, MASK_MODE: tl.constexpr, REJ_AGG: tl.constexpr,
    SEQ_MEAN: tl.constexpr, BATCH_NORMALIZE: tl.constexpr, ACC: tl.constexpr, CHECK_MSG: tl.constexpr,
):  # fmt: skip
    """The last program: every row's sums into the metrics (rlkernels/rollout_correction.h rollout_metrics),
    then the sequence-level weights and the rows' rejection."""
    lanes = tl.arange(0, FINISH_ROWS)
    z = tl.zeros([FINISH_ROWS], ACC)
    t_count, t_sum_d, t_k3, t_abs, t_ppl, t_rows, t_seq_k1, t_seq_k3 = z, z, z, z, z, z, z, z
    t_w, t_high, t_low, t_oob, t_seq_w, t_rej, t_rej_rows, t_bad = z, z, z, z, z, z, z, z
    x_abs = z
    x_max_w = z - float("inf")
    x_neg_min_w = z - float("inf")
    for r0 in range(0, B, FINISH_ROWS):
        rows = r0 + lanes
        inside = rows < B
        count = _col(part_ptr, rows, inside, 0)
        sum_d = _col(part_ptr, rows, inside, 1)
        nonempty = count > 0
        sc = tl.where(sum_d < -c, -c, tl.where(sum_d > c, c, sum_d))
        t_count += count
        t_sum_d += sum_d
        t_k3 += _col(part_ptr, rows, inside, 2)
        t_abs += _col(part_ptr, rows, inside, 3)
        x_abs = tl.maximum(x_abs, _col(part_ptr, rows, inside, 4))
        t_ppl += -sum_d / tl.where(count > 1, count, 1.0)
        t_rows += tl.where(nonempty, 1.0, 0.0)
        t_seq_k1 += tl.where(nonempty, -sum_d, 0.0)
        t_seq_k3 += tl.where(nonempty, tl.exp(sc) - sc - 1.0, 0.0)
        t_bad += _col(part_ptr, rows, inside, BAD_PART)
        if LEVEL == TOKEN_LEVEL:
            t_w += _col(part_ptr, rows, inside, 5)
            x_neg_min_w = tl.maximum(
                x_neg_min_w, tl.where(inside, -_col(part_ptr, rows, inside, 6), -float("inf"))
            )
            x_max_w = tl.maximum(x_max_w, tl.where(inside, _col(part_ptr, rows, inside, 7), -float("inf")))
            t_high += _col(part_ptr, rows, inside, 8)
            t_low += _col(part_ptr, rows, inside, 9)
            t_oob += _col(part_ptr, rows, inside, 10)
        if LEVEL == SEQUENCE_LEVEL:
            w, rho = _sequence_weight(sum_d, count, c, clip_min, clip_max, MASK_MODE)
            t_w += w * count
            t_seq_w += w
            t_high += tl.where(inside & (sum_d > log_upper), 1.0, 0.0)  # every row (an empty one: Σd = 0)
            t_low += tl.where(inside & (sum_d < log_low), 1.0, 0.0)
            t_oob += tl.where(nonempty & ((rho < clip_min) | (rho > clip_max)), count, 0.0)
            x_max_w = tl.maximum(x_max_w, tl.where(inside & nonempty, w, -float("inf")))
            x_neg_min_w = tl.maximum(x_neg_min_w, tl.where(inside & nonempty, -w, -float("inf")))
        if REJ_AGG != 0:
            rej = _col(part_ptr, rows, inside, 11)
            if REJ_AGG == TOKEN_AGG:
                rejected = rej
            else:
                rejected = tl.where(_row_kept(rej, count, rej_low, rej_high, SEQ_MEAN, REJ_AGG), 0.0, count)
            t_rej += rejected
            t_rej_rows += tl.where(inside & (rejected > 0), 1.0, 0.0)
    total = tl.sum(t_count, axis=0)
    per_token = tl.maximum(total, 1.0)
    nonempty_rows = tl.sum(t_rows, axis=0)
    per_row = tl.maximum(nonempty_rows, 1.0)
    b = B + tl.zeros_like(total)
    per_b = tl.maximum(b, 1.0)
    mean_w = tl.sum(t_w, axis=0) / per_token
    row_mean = tl.sum(t_seq_w, axis=0) / per_row
    if LEVEL == SEQUENCE_LEVEL:
        norm = row_mean
        ratio_mean = row_mean
        per_count = per_b
    else:
        norm = mean_w
        ratio_mean = mean_w
        per_count = per_token
    floor = float_arg(BATCH_NORM_MIN, norm.dtype)  # exact in fp64 (Triton 3.6 rounds a compared constexpr)
    factor = tl.where(norm > floor, norm, 1.0) if BATCH_NORMALIZE else 1.0 + tl.zeros_like(norm)
    values = (
        -tl.sum(t_sum_d, axis=0) / per_token,
        tl.sum(t_k3, axis=0) / per_token,
        tl.where(b > 0, tl.sum(t_ppl, axis=0) / per_b, 0.0),
        tl.sum(t_seq_k1, axis=0) / per_row,
        tl.sum(t_seq_k3, axis=0) / per_row,
        tl.sum(t_abs, axis=0) / per_token,
        tl.where(b > 0, tl.max(x_abs, axis=0), 0.0),
        tl.sum(t_high, axis=0) / per_count,
        tl.sum(t_low, axis=0) / per_count,
        tl.sum(t_oob, axis=0) / per_token,
        mean_w,
        tl.where(total > 0, -tl.max(x_neg_min_w, axis=0), 0.0),
        tl.where(total > 0, tl.max(x_max_w, axis=0), 0.0),
        ratio_mean,
        factor,
        tl.sum(t_rej, axis=0) / per_token,
        tl.where(b > 0, tl.sum(t_rej_rows, axis=0) / per_b, 0.0),
    )
    cols = tl.arange(0, METRICS_PAD)
    out = tl.zeros([METRICS_PAD], ACC)
    for i in tl.static_range(NUM_METRICS):
        out = tl.where(cols == i, values[i], out)
    tl.store(metrics_ptr + cols, out, mask=cols < NUM_METRICS)
    require(tl.sum(t_bad, axis=0) == 0, CHECK_MSG)
    tl.store(ok_ptr, tl.sum(t_bad, axis=0) == 0)
    if (LEVEL == SEQUENCE_LEVEL) or (REJ_AGG == SUM_AGG) or (REJ_AGG == MAX_AGG):
        for r0 in range(0, B, FINISH_ROWS):  # the rows' weights and rejection, once the batch is known
            rows = r0 + lanes
            inside = rows < B
            count = _col(part_ptr, rows, inside, 0)
            if LEVEL == SEQUENCE_LEVEL:
                w, _ = _sequence_weight(
                    _col(part_ptr, rows, inside, 1), count, c, clip_min, clip_max, MASK_MODE
                )
                tl.store(w_ptr + rows, w / factor, mask=inside)
            if (REJ_AGG == SUM_AGG) or (REJ_AGG == MAX_AGG):
                kept = _row_kept(
                    _col(part_ptr, rows, inside, 11), count, rej_low, rej_high, SEQ_MEAN, REJ_AGG
                )
                tl.store(keep_row_ptr + rows, kept.to(tl.int8), mask=inside)


@triton.jit
def _rollout_rows_kernel(
    old_ptr,  # [B, T] row stride stride_old
    roll_ptr,  # [B, T] row stride stride_roll
    mask_ptr,  # [B, T] bool, integer or float (nonzero: valid), row stride stride_mask
    w_ptr,  # [B, T] ACC contiguous (token level), or [B] (sequence level: the last program writes it)
    out_mask_ptr,  # [B, T] contiguous, the mask's dtype: the mask with the rejected tokens zeroed (TOKEN_AGG)
    keep_row_ptr,  # [B] int8: whether a seq_* rejection keeps the row (the last program writes it)
    part_ptr,  # [B, NUM_PARTS] ACC: each row's STATS and bad mask values
    counter_ptr,  # [1] int32, zero (_finish.launch_counter)
    metrics_ptr,  # [NUM_METRICS] ACC
    ok_ptr,  # [] bool: every mask value valid
    B,
    T,
    stride_old,
    stride_roll,
    stride_mask,
    c: tl.float64,  # log_ratio_clamp (inf: none)
    clip_min: tl.float64,  # 0: open
    clip_max: tl.float64,  # inf: open
    low_bound: tl.float64,  # the low fraction's bound (0: none)
    rej_low: tl.float64,  # the rejection's kept range low (-inf: open)
    rej_high: tl.float64,  # ... and high (inf: open)
    rho_min: tl.float64,  # e^-clamp: ρ = clamp(e^d, e^-c, e^c) as the reference
    rho_max: tl.float64,  # e^clamp
    log_upper: tl.float64,  # log(clip_max) (inf: none), compared with Σd at sequence level
    log_low: tl.float64,  # log(low bound) (-inf: none)
    LEVEL: tl.constexpr,
    MASK_MODE: tl.constexpr,
    REJ_KIND: tl.constexpr,  # 0 none, 1 k1, 2 k2, 3 k3
    REJ_AGG: tl.constexpr,  # 0 none, 1 token, 2 sum, 3 max
    SEQ_MEAN: tl.constexpr,
    BATCH_NORMALIZE: tl.constexpr,
    MASK_KIND: tl.constexpr,
    ACC: tl.constexpr,
    BLOCK: tl.constexpr,
    CHECK_MSG: tl.constexpr,  # the device assert's message, or None (_device_assert)
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    lanes = tl.arange(0, BLOCK)
    c, clip_min, clip_max, low_bound = (
        float_arg(c, ACC),
        float_arg(clip_min, ACC),
        float_arg(clip_max, ACC),
        float_arg(low_bound, ACC),
    )
    rej_low, rej_high, rho_min, rho_max = (
        float_arg(rej_low, ACC),
        float_arg(rej_high, ACC),
        float_arg(rho_min, ACC),
        float_arg(rho_max, ACC),
    )
    if ACC == tl.float64:  # where torch.nan_to_num puts ±inf
        big = tl.full([1], 1.7976931348623157e308, tl.float64)
    else:
        big = tl.full([1], 3.4028234663852886e38, tl.float32)
    zero = tl.zeros([BLOCK], ACC)
    count, sum_d, sum_k3, sum_abs, max_abs = zero, zero, zero, zero, zero
    sum_w, n_high, n_low, n_oob, bad = zero, zero, zero, zero, zero
    min_w = zero + float("inf")
    max_w = zero - float("inf")
    if REJ_AGG == MAX_AGG:
        rej = zero - float("inf")
    else:
        rej = zero
    for t0 in range(0, T, BLOCK):
        cols = t0 + lanes
        inside = cols < T
        raw = tl.load(mask_ptr + row * stride_mask + cols, mask=inside, other=0)
        valid = inside & (raw != 0)
        bad_m = mask_bad(raw, to_acc(raw), inside, MASK_KIND)  # the values as stored: a nonzero is valid
        bad += bad_m.to(ACC)
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
        if LEVEL == TOKEN_LEVEL:
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
            if REJ_AGG == TOKEN_AGG:
                keep = (stat >= rej_low) & (stat <= rej_high)
                kept = tl.where(keep, raw, tl.zeros_like(raw))  # the mask, rejected tokens zeroed
                tl.store(out_mask_ptr + row * T + cols, kept, mask=inside)
                rej += (valid & ~keep).to(ACC)
            elif REJ_AGG == SUM_AGG:
                rej += tl.where(valid, stat, 0.0)
            else:
                rej = tl.maximum(rej, tl.where(valid, stat, -float("inf")))
    parts = (
        tl.sum(count, axis=0), tl.sum(sum_d, axis=0), tl.sum(sum_k3, axis=0), tl.sum(sum_abs, axis=0),
        tl.max(max_abs, axis=0), tl.sum(sum_w, axis=0), tl.min(min_w, axis=0), tl.max(max_w, axis=0),
        tl.sum(n_high, axis=0), tl.sum(n_low, axis=0), tl.sum(n_oob, axis=0),
        tl.max(rej, axis=0) if REJ_AGG == MAX_AGG else tl.sum(rej, axis=0), tl.sum(bad, axis=0),
    )  # fmt: skip
    pcols = tl.arange(0, PARTS_PAD)
    part = tl.zeros([PARTS_PAD], ACC)
    for i in tl.static_range(NUM_PARTS):
        part = tl.where(pcols == i, parts[i], part)
    publish(part_ptr + row * NUM_PARTS + pcols, part, pcols < NUM_PARTS)
    if last_program(counter_ptr, tl.num_programs(0)):
        _finish(
            part_ptr, w_ptr, keep_row_ptr, metrics_ptr, ok_ptr, B, c, clip_min, clip_max, rej_low, rej_high,
            float_arg(log_upper, ACC), float_arg(log_low, ACC), LEVEL, MASK_MODE, REJ_AGG, SEQ_MEAN,
            BATCH_NORMALIZE, ACC, CHECK_MSG,
        )  # fmt: skip


@triton.jit
def _rollout_tokens_kernel(
    w_ptr,  # [B, T] ACC token weights, divided in place by the factor (NORMALIZE)
    mask_ptr,  # [B, T] the input mask, row stride stride_mask (SEQ_REJECTION)
    out_mask_ptr,  # [B, T] contiguous, mask's dtype: the mask where the row is kept, else 0 (SEQ_REJECTION)
    keep_row_ptr,  # [B] int8
    metrics_ptr,  # [NUM_METRICS] ACC: the batch normalization factor at FACTOR
    n,
    T,
    stride_mask,
    FACTOR: tl.constexpr,
    NORMALIZE: tl.constexpr,
    SEQ_REJECTION: tl.constexpr,
    BLOCK: tl.constexpr,
):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = offs < n
    if NORMALIZE:
        w = tl.load(w_ptr + offs, mask=inside, other=0.0)
        tl.store(w_ptr + offs, w / tl.load(metrics_ptr + FACTOR), mask=inside)
    if SEQ_REJECTION:
        row = offs // T
        raw = tl.load(mask_ptr + row * stride_mask + offs % T, mask=inside, other=0)
        kept = tl.load(keep_row_ptr + row, mask=inside, other=0) != 0
        tl.store(out_mask_ptr + offs, tl.where(kept, raw, tl.zeros_like(raw)), mask=inside)


def rollout_forward(logp_old, logp_rollout, mask, *, level, mask_mode, clamp, clip_min, clip_max,
                    low_bound, rejection, rej_low, rej_high, batch_normalize, log_upper, log_low,
                    block=None):  # fmt: skip
    """logp_old, logp_rollout [B, T] float (unit column stride), mask [B, T] bool / integer / float (unit
    column stride) -> (weights [B, T] (level "token") or [B, 1] ("sequence") or [0], the mask with the
    rejected tokens zeroed [B, T] in its dtype (with a rejection) or [0], metrics [len(METRICS)], ok [] bool)
    in the accumulation dtype (float64 if an input is, else float32). Open bounds: clamp / clip_max /
    rej_high inf, clip_min / low_bound 0, rej_low -inf; log_upper = log(clip_max), log_low = log(the low
    bound). One launch (+1 for token weights with batch_normalize, or a seq_* rejection)."""
    b, t = logp_old.shape
    acc = acc_dtype(torch.promote_types(logp_old.dtype, logp_rollout.dtype))
    dev = logp_old.device
    agg, kind = (None, None) if rejection is None else rejection.rsplit("_", 1)
    lvl = LEVELS[level]
    weights = torch.empty((b, t) if lvl == 1 else ((b, 1) if lvl == 2 else (0,)), dtype=acc, device=dev)
    out_mask = torch.empty((b, t) if rejection is not None else (0,), dtype=mask.dtype, device=dev)
    metrics = torch.empty(len(METRICS), dtype=acc, device=dev)
    ok = torch.empty((), dtype=torch.bool, device=dev)
    keep_row = torch.empty(b if agg not in (None, "token") else 0, dtype=torch.int8, device=dev)
    grid = max(b, 1)  # with no row, one program still writes the metrics and the flag
    if b * t == 0:  # null pointers on a GPU: give the kernel one-element stand-ins it reads nothing from
        logp_old = logp_rollout = torch.zeros(1, 1, dtype=acc, device=dev)
        mask = torch.zeros(1, 1, dtype=mask.dtype, device=dev)
        t_eff = 0
    else:
        t_eff = t
    rho_min, rho_max = ratio_range(None if math.isinf(clamp) else clamp)
    _rollout_rows_kernel[(grid,)](
        logp_old, logp_rollout, mask, weights if weights.numel() else metrics,
        out_mask if out_mask.numel() else mask, keep_row if keep_row.numel() else ok,
        logp_old.new_empty((grid, len(STATS) + 1), dtype=acc), launch_counter(dev), metrics, ok, b, t_eff,
        logp_old.stride(0), logp_rollout.stride(0), mask.stride(0),
        float(clamp), float(clip_min), float(clip_max), float(low_bound), float(rej_low), float(rej_high),
        float(rho_min), float(rho_max), float(log_upper), float(log_low),
        LEVEL=lvl, MASK_MODE=mask_mode, REJ_KIND=REJECTION_KINDS[kind], REJ_AGG=REJECTION_AGGS[agg],
        SEQ_MEAN=agg == "seq_mean", BATCH_NORMALIZE=batch_normalize, MASK_KIND=mask_kind(mask),
        ACC=tl_acc(acc),
        BLOCK=block or min(BLOCK, next_pow2(max(t_eff, 1))), num_warps=WARPS, **check(mask, BAD_MASK),
    )  # fmt: skip
    normalize = lvl == 1 and batch_normalize
    seq_rejection = agg not in (None, "token")
    n = b * t
    if n and (normalize or seq_rejection):
        _rollout_tokens_kernel[(cdiv(n, TOKEN_BLOCK),)](
            weights if normalize else metrics, mask, out_mask if seq_rejection else mask,
            keep_row if seq_rejection else ok, metrics, n, t, mask.stride(0),
            FACTOR=METRICS.index(VERL + "rollout_is_batch_norm_factor"), NORMALIZE=normalize,
            SEQ_REJECTION=seq_rejection, BLOCK=TOKEN_BLOCK,
        )  # fmt: skip
    return weights, out_mask, metrics, ok


def compile_cases():
    """Every input and mask dtype with every option on (weights at both levels and modes, each rejection kind
    and aggregation, batch normalization), at the full block and at a short row's block
    (rlkernels/triton/_specializations.py)."""
    rows = covering(
        features={
            "weights": (None, "token", "token,mask", "sequence", "sequence,mask"),
            "rejection": (None, "token_k1", "token_k3", "seq_sum_k2", "seq_mean_k1", "seq_max_k3"),
            "normalize": (False, True),
            "mask": ("bool", "int", "float"),
        },
        resources={"dtype": FLOAT_DTYPES, "block": (BLOCK, 64)},
        heaviest={"weights": "token,mask", "rejection": "token_k3", "normalize": True, "mask": "float"},
    )
    mask_dtypes = {"bool": torch.bool, "int": torch.int64, "float": torch.float32}
    for row, _ in rows:
        b, t = 64, 4096
        old = meta(b, t, dtype=row["dtype"])
        level = None if row["weights"] is None else row["weights"].split(",")[0]
        label = ",".join(str(v) for v in row.values()).replace("torch.", "")
        yield CompileCase(
            f"rollout_correction[{label}]",
            functools.partial(
                rollout_forward, old, meta(b, t, dtype=row["dtype"]),
                meta(b, t, dtype=mask_dtypes[row["mask"]]),
                level=level, mask_mode=str(row["weights"]).endswith("mask"), clamp=20.0, clip_min=0.5,
                clip_max=2.0, low_bound=0.5, rejection=row["rejection"], rej_low=-math.log(2.0),
                rej_high=math.log(2.0), batch_normalize=row["normalize"] and level is not None,
                log_upper=math.log(2.0), log_low=math.log(0.5), block=row["block"],
            ),
        )  # fmt: skip
