"""policy_loss Triton kernels: the per-token math of csrc/include/rlkernels/policy_loss.h in one forward
launch that also finishes the loss, and one backward launch writing d logp and d entropy
(docs/gpu_token_ops.md).

Grid: (row, chunk of BLOCK tokens). Each program computes its tokens' terms (and, with save_grad, writes
m · d row sum / d logp), checks the input values it reads, and publishes its chunk's partial sums; the last
program to finish (`_finish.last_program`) reduces them in a fixed order (deterministic, no float atomics)
into the loss, the stat means, the rows' weights and sums, and the inputs' validity (`_aggregation`).
level="sequence" (and the objectives with a per-row ratio) first reduce each row's log-ratio statistic in a
pass of their own, which the main pass's programs finish for their row.
"""

import functools
import types

import torch
import triton
import triton.language as tl

from rlkernels._backend import triton_interpreting
from rlkernels._dtypes import acc_dtype
from rlkernels.policy_config import OBJECTIVES, ROW_STATS, SEQUENCE_OBJECTIVES, STAT_KEYS, PolicyConfig
from rlkernels.reference.kl import KL_KIND_CODES
from rlkernels.reference.policy_loss import LOG_RATIO_BOUND, VESPO_LAMBDA_MIN, VESPO_LOG_W_MIN
from rlkernels.triton._aggregation import AGG_CODES, finish_aggregation, finish_tile, normalizer_args, sums10
from rlkernels.triton._common import (
    cdiv,
    clamp,
    clamp_passes,
    float_arg,
    next_pow2,
    store_dtype,
    tl_acc,
    to_acc,
    unit_rows,
)
from rlkernels.triton._device_assert import check
from rlkernels.triton._finish import last_program, launch_counter, publish, publish_relaxed
from rlkernels.triton._mask import kept, kept_flag, load_mask, mask_kind
from rlkernels.triton._specializations import FLOAT_DTYPES, CompileCase, covering, meta
from rlkernels.triton.kl import kl_grad, kl_value

# The objectives' codes (rlkernels/policy_config.py OBJECTIVES; C++ PGObjective).
# The forward's device assert (_device_assert), csrc/cuda/policy_loss.cu's message.
BAD_VALUES = (
    "rlkernels policy_loss: NaN or inf advantages, is_weights or mask weights negative or not finite, an "
    "integer mask value other than 0 and 1, or NaN logp / old_logp / ref_logp at a kept token"
)
OBJECTIVE_CODES = {name: code for code, name in enumerate(OBJECTIVES)}
CLIP = tl.constexpr(OBJECTIVE_CODES["clip"])
CISPO = tl.constexpr(OBJECTIVE_CODES["cispo"])
SAPO = tl.constexpr(OBJECTIVE_CODES["sapo"])
GPG = tl.constexpr(OBJECTIVE_CODES["gpg"])
DRO = tl.constexpr(OBJECTIVE_CODES["dro"])
DPPO_KL = tl.constexpr(OBJECTIVE_CODES["dppo_kl"])
GEO_MEAN = tl.constexpr(OBJECTIVE_CODES["geo_mean"])
VESPO = tl.constexpr(OBJECTIVE_CODES["vespo"])
# Not an fp32 number: the kernels take it through float_arg (Triton 3.6 compares an fp64 value with a float
# constexpr rounded to fp32).
LOG_W_MIN = tl.constexpr(VESPO_LOG_W_MIN)
BOUND = tl.constexpr(LOG_RATIO_BOUND)
# The per-row stats' column that holds the row's mean log-ratio (ROW_STATS).
SEQ_LOG_RATIO = tl.constexpr(ROW_STATS.index("seq_log_ratio"))
# Columns of the chunk partials [B, chunks, NUM_PARTS]: Σ m·L, then the ROW_STATS columns, then a bad-input
# flag (an input value the op rejects: _token_terms).
NUM_PARTS = tl.constexpr(2 + len(ROW_STATS))
NUM_PARTS_PAD = tl.constexpr(next_pow2(2 + len(ROW_STATS)))
LOSS_PART = tl.constexpr(0)
BAD_PART = tl.constexpr(1 + len(ROW_STATS))
FIRST_STAT_PART = tl.constexpr(1 + ROW_STATS.index(STAT_KEYS[0]))
NUM_ROW_STATS = tl.constexpr(len(ROW_STATS))
NUM_STATS = tl.constexpr(len(STAT_KEYS))


def _part(column: str) -> tl.constexpr:
    return tl.constexpr(1 + ROW_STATS.index(column))


COUNT_PART = _part("count")
SEQ_LOG_RATIO_PART = _part("seq_log_ratio")
CLIPFRAC_PART = _part("clipfrac")
CLIPFRAC_LOW_PART = _part("clipfrac_low")
CLIPFRAC_HIGH_PART = _part("clipfrac_high")
CLIPFRAC_DUAL_PART = _part("clipfrac_dual")
APPROX_KL_PART = _part("approx_kl")
KL_PART = _part("kl")
ENTROPY_PART = _part("entropy")


@triton.jit
def dppo_kept(logp, old, adv, delta_low, delta_high, BINARY_KL: tl.constexpr):
    """DPPO-Binary's token filter (a bool block): policy_loss.h dppo_margin >= 0, as comparisons."""
    prob = tl.exp(logp)
    old_prob = tl.exp(old)
    if BINARY_KL:
        kl = old_prob * (old - logp) + (1.0 - old_prob) * tl.log(
            (1.0 - old_prob + 1e-8) / (1.0 - prob + 1e-8)
        )
        rise_ok = (kl <= delta_high) | (prob <= old_prob)
        fall_ok = (kl <= delta_low) | (prob >= old_prob)
    else:
        rise_ok = prob - old_prob <= delta_high
        fall_ok = prob - old_prob >= -delta_low
    return tl.where(adv > 0, rise_ok, fall_ok)


@triton.jit
def pg_token(
    logp,
    old,
    r,
    passes,
    adv,
    lo,
    hi,
    delta_low,
    delta_high,
    dual_c,
    ratio_cap,
    tau_pos,
    tau_neg,
    dro_beta,
    k_pos,
    lam_pos,
    k_neg,
    lam_neg,
    OBJECTIVE: tl.constexpr,
    DUAL: tl.constexpr,
):
    """(loss, d loss / d logp, clipped, low, high, dual) of the policy term, as policy_loss.h pg_token.
    DUAL: whether the dual clip is on (the C++ code uses dual_c = inf instead)."""
    in_clip = (r >= lo) & (r <= hi)
    rc = clamp(r, lo, hi)
    zero = tl.zeros_like(r)
    if OBJECTIVE == CLIP:
        r1 = tl.where(r < ratio_cap, r, ratio_cap)
        loss1 = -adv * r1
        loss2 = -adv * rc
        use2 = loss2 > loss1
        lc = tl.where(use2, loss2, loss1)
        dr = tl.where(use2, tl.where(in_clip, -adv, zero), tl.where(r <= ratio_cap, -adv, zero))
        if DUAL:
            loss3 = -adv * dual_c
            dual = (adv < 0) & (lc > loss3)
            loss = tl.where(dual, loss3, lc)
            dlogp = tl.where(dual, zero, dr * r * passes)
        else:
            dual = r != r  # all false (r is finite)
            loss = lc
            dlogp = dr * r * passes
        clipped = use2
        low = (r < lo) & (adv < 0)
        high = (r > hi) & (adv > 0)
    elif OBJECTIVE == CISPO:
        loss = -rc * adv * logp
        dlogp = -rc * adv
        low = r < lo
        high = r > hi
        clipped = low | high
        dual = r != r  # all false (r is finite)
    elif OBJECTIVE == SAPO:
        tau = tl.where(adv > 0, tau_pos, tau_neg)
        s = 1.0 / (1.0 + tl.exp(-tau * (r - 1.0)))
        loss = -adv * s * (4.0 / tau)
        dlogp = -adv * 4.0 * s * (1.0 - s) * r * passes
        clipped = r != r
        low = clipped
        high = clipped
        dual = clipped
    elif OBJECTIVE == GPG:
        loss = -adv * logp
        dlogp = -adv
        clipped = r != r
        low = clipped
        high = clipped
        dual = clipped
    elif OBJECTIVE == DRO:
        lr = logp - old
        loss = -adv * logp + 0.5 * dro_beta * lr * lr
        dlogp = -adv + dro_beta * lr
        clipped = r != r
        low = clipped
        high = clipped
        dual = clipped
    elif OBJECTIVE == GEO_MEAN:
        raw = logp - old
        outside = (raw < -delta_low) | (raw > delta_high)
        token_pass = tl.where(adv > 0, raw <= delta_high, raw >= -delta_low)
        loss = -adv * r
        dlogp = tl.where(token_pass, -adv * r * passes, zero)
        low = outside & (adv < 0)
        high = outside & (adv > 0)
        clipped = low | high
        dual = r != r
    elif OBJECTIVE == VESPO:
        pos = adv >= 0
        k = tl.where(pos, k_pos, k_neg)
        lam = tl.where(pos, lam_pos, lam_neg)
        e = tl.exp(lam + k * tl.log(r) - lam * r)
        phi = tl.where(e - e == 0, e, zero)  # e - e is NaN for inf and NaN
        loss = -phi * adv * logp
        dlogp = -phi * adv
        clipped = r != r
        low = clipped
        high = clipped
        dual = clipped
    else:  # DPPO_TV, DPPO_KL
        kept = dppo_kept(logp, old, adv, delta_low, delta_high, OBJECTIVE == DPPO_KL)
        truncated = tl.where(r < ratio_cap, r, ratio_cap)
        loss = tl.where(kept, -adv * truncated * logp, zero)
        dlogp = tl.where(kept, -adv * truncated, zero)
        clipped = ~kept
        low = clipped & (adv <= 0)
        high = clipped & (adv > 0)
        dual = kept & (r > ratio_cap)
    return loss, dlogp, clipped, low, high, dual


@triton.jit
def _token_terms(
    logp_ptr,
    old_ptr,
    adv_ptr,
    mask_ptr,
    ref_ptr,
    ent_ptr,
    isw_ptr,
    ld_logp,
    ld_old,
    ld_adv,
    ld_mask,
    ld_ref,
    ld_ent,
    ld_isw,
    row,
    offs,
    T,
    seq_mean,
    lo,
    hi,
    delta_low,
    delta_high,
    dual_c,
    ratio_cap,
    tau_pos,
    tau_neg,
    dro_beta,
    k_pos,
    lam_pos,
    k_neg,
    lam_neg,
    kl_coef,
    kl_clamp,
    entropy_coef,
    OBJECTIVE: tl.constexpr,
    DUAL: tl.constexpr,
    SEQ_LEVEL: tl.constexpr,
    ADV_PER_TOKEN: tl.constexpr,
    ISW_MODE: tl.constexpr,
    KL_KIND: tl.constexpr,
    HAS_ENT: tl.constexpr,
    MASK_KIND: tl.constexpr,
):
    """Per-token terms of tokens `offs` of `row`: (m, lr, m·L, m·dL/dlogp, flags..., kl, entropy, bad) with
    masked tokens giving exact zeros. ISW_MODE: 0 none, 1 per row, 2 per token. KL_KIND < 0: no KL. `bad`
    flags the input values the op rejects (the public function's contract): a NaN log-prob (logp, old_logp,
    ref_logp) at a token the mask keeps, a non-finite advantage, a negative or non-finite IS weight or mask
    weight, an integer mask value other than 0 and 1. Each input's rows lie at its row stride ld_*: element
    (row, t) of a [B, T] input at row * ld + t, the row's of a [B] one at row * ld (inputs of one stride share
    one index, row * ld + offs)."""
    inb = offs < T
    lp = to_acc(tl.load(logp_ptr + (row * ld_logp + offs), mask=inb, other=0.0))
    old = to_acc(tl.load(old_ptr + (row * ld_old + offs), mask=inb, other=0.0))
    # The options (the kernels' tl.float64 arguments) in the accumulation dtype; kl_clamp: in kl_value.
    acc = lp.dtype
    lo, hi, dual_c, ratio_cap = (
        float_arg(lo, acc),
        float_arg(hi, acc),
        float_arg(dual_c, acc),
        float_arg(ratio_cap, acc),
    )
    delta_low, delta_high = float_arg(delta_low, acc), float_arg(delta_high, acc)
    tau_pos, tau_neg, dro_beta = float_arg(tau_pos, acc), float_arg(tau_neg, acc), float_arg(dro_beta, acc)
    k_pos, lam_pos = float_arg(k_pos, acc), float_arg(lam_pos, acc)
    k_neg, lam_neg = float_arg(k_neg, acc), float_arg(lam_neg, acc)
    kl_coef, entropy_coef = float_arg(kl_coef, acc), float_arg(entropy_coef, acc)
    m, bad = load_mask(mask_ptr + (row * ld_mask + offs), inb, MASK_KIND, lp.dtype)
    on = m != 0
    bad = bad | (on & ((lp != lp) | (old != old)))
    if ADV_PER_TOKEN:
        adv = to_acc(tl.load(adv_ptr + (row * ld_adv + offs), mask=inb, other=0.0))
    else:
        adv = tl.zeros_like(lp) + to_acc(tl.load(adv_ptr + row * ld_adv))
    bad = bad | (inb & ~(tl.abs(adv) < float("inf")))
    raw = lp - old
    lr = clamp(raw, -BOUND, BOUND)
    if SEQ_LEVEL:
        if OBJECTIVE == VESPO:
            log_w_min = float_arg(LOG_W_MIN, acc)
            seq_lr = clamp(seq_mean, log_w_min, BOUND)
            passes = tl.zeros_like(lp) + clamp_passes(seq_mean, log_w_min, BOUND).to(lp.dtype)
        else:
            seq_lr = clamp(seq_mean, -BOUND, BOUND)
            passes = tl.zeros_like(lp) + clamp_passes(seq_mean, -BOUND, BOUND).to(lp.dtype)
        r = tl.zeros_like(lp) + tl.exp(seq_lr)
    else:
        passes = clamp_passes(raw, -BOUND, BOUND).to(lp.dtype)
        r = tl.exp(lr)
    loss, dlogp, clipped, low, high, dual = pg_token(
        lp, old, r, passes, adv, lo, hi, delta_low, delta_high, dual_c, ratio_cap, tau_pos, tau_neg, dro_beta,
        k_pos, lam_pos, k_neg, lam_neg, OBJECTIVE, DUAL,
    )  # fmt: skip
    if OBJECTIVE == VESPO:  # its IS weights are folded into the row's weight (_seq_log_ratio_kernel)
        if ISW_MODE == 2:  # checked here all the same
            w = to_acc(tl.load(isw_ptr + (row * ld_isw + offs), mask=inb, other=1.0))
            bad = bad | (inb & ~((w >= 0) & (w < float("inf"))))
    elif ISW_MODE == 1:
        w = tl.zeros_like(lp) + to_acc(tl.load(isw_ptr + row * ld_isw))
        bad = bad | (inb & ~((w >= 0) & (w < float("inf"))))
        loss = loss * w
        dlogp = dlogp * w
    elif ISW_MODE == 2:
        w = to_acc(tl.load(isw_ptr + (row * ld_isw + offs), mask=inb, other=0.0))
        bad = bad | (inb & ~((w >= 0) & (w < float("inf"))))
        loss = loss * w
        dlogp = dlogp * w
    zero = tl.zeros_like(lp)
    kl = zero
    if KL_KIND >= 0:
        ref = to_acc(tl.load(ref_ptr + (row * ld_ref + offs), mask=inb, other=0.0))
        bad = bad | (on & (ref != ref))
        kl = kl_value(lp, ref, kl_clamp, KL_KIND)
        loss = loss + kl_coef * kl
        dlogp = dlogp + kl_coef * kl_grad(lp, ref, kl_clamp, KL_KIND)
    ent = zero
    if HAS_ENT:
        ent = to_acc(tl.load(ent_ptr + (row * ld_ent + offs), mask=inb, other=0.0))
        loss = loss - entropy_coef * ent
    flags = (
        kept_flag(on, m, clipped, MASK_KIND),
        kept_flag(on, m, low, MASK_KIND),
        kept_flag(on, m, high, MASK_KIND),
        kept_flag(on, m, dual, MASK_KIND),
    )
    return (
        m,
        kept(on, m, -lr, MASK_KIND),
        kept(on, m, loss, MASK_KIND),
        kept(on, m, dlogp, MASK_KIND),
        flags,
        kept(on, m, kl, MASK_KIND),
        kept(on, m, ent, MASK_KIND),
        bad,
    )


@triton.jit
def _seq_log_ratio_kernel(
    logp_ptr,  # [B, T]
    old_ptr,  # [B, T]
    adv_ptr,  # [B] or [B, T] (geo_mean)
    mask_ptr,  # [B, T] bool or acc
    isw_ptr,  # [B, T] (vespo with is_weights)
    part_ptr,  # [B, chunks, 2]: Σ m, Σ m·(the token's term of the row's statistic)
    ld_logp,  # the inputs' row strides (_token_terms)
    ld_old,
    ld_adv,
    ld_mask,
    ld_isw,
    T,
    delta_low: tl.float64,
    delta_high: tl.float64,
    OBJECTIVE: tl.constexpr,
    ADV_PER_TOKEN: tl.constexpr,
    ISW_MODE: tl.constexpr,
    MASK_KIND: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Each (row, chunk)'s Σ m and Σ m·x, x as policy_loss.h sequence_token_log_ratio: GSPO's lr, geo_mean's
    lr clipped toward the side A pushes it, vespo's ±20-clamped lr plus its folded log IS weight."""
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    offs = chunk * BLOCK + tl.arange(0, BLOCK)
    inb = offs < T
    lp = to_acc(tl.load(logp_ptr + row * ld_logp + offs, mask=inb, other=0.0))
    old = to_acc(tl.load(old_ptr + row * ld_old + offs, mask=inb, other=0.0))
    m, _ = load_mask(mask_ptr + row * ld_mask + offs, inb, MASK_KIND, lp.dtype)
    zero = tl.zeros_like(lp)
    term = lp - old
    if OBJECTIVE == GEO_MEAN:
        if ADV_PER_TOKEN:
            adv = to_acc(tl.load(adv_ptr + row * ld_adv + offs, mask=inb, other=0.0))
        else:
            adv = zero + to_acc(tl.load(adv_ptr + row * ld_adv))
        lrc = clamp(term, -float_arg(delta_low, lp.dtype), float_arg(delta_high, lp.dtype))
        term = tl.where(adv > 0, tl.minimum(term, lrc), tl.where(adv < 0, tl.maximum(term, lrc), zero))
    elif OBJECTIVE == VESPO:
        term = clamp(term, -BOUND, BOUND)
        if ISW_MODE == 2:
            w = to_acc(tl.load(isw_ptr + row * ld_isw + offs, mask=inb, other=1.0))
            term = term + clamp(tl.log(w), float_arg(LOG_W_MIN, lp.dtype), BOUND)
    x = kept(m != 0, m, term, MASK_KIND)
    base = part_ptr + (row * tl.num_programs(1) + chunk) * 2
    tl.store(base, tl.sum(m, axis=0))
    tl.store(base + 1, tl.sum(x, axis=0))


@triton.jit
def _row_seq_statistic(seq_part_ptr, row, chunks, OBJECTIVE: tl.constexpr, ACC: tl.constexpr):
    """The row's log-ratio statistic from _seq_log_ratio_kernel's [B, chunks, 2] partials, summed in chunk
    order: vespo's sum, else the masked mean (0 for a row without tokens)."""
    count = tl.zeros([1], ACC)
    total = tl.zeros([1], ACC)
    for c in range(0, chunks):
        count += tl.load(seq_part_ptr + (row * chunks + c) * 2)
        total += tl.load(seq_part_ptr + (row * chunks + c) * 2 + 1)
    if OBJECTIVE == VESPO:
        out = total
    else:
        out = tl.where(count > 0, total / tl.where(count > 0, count, 1.0), 0.0)
    return tl.sum(out, axis=0)


@triton.jit
def _tile_partials(
    logp_ptr, old_ptr, adv_ptr, mask_ptr, ref_ptr, ent_ptr, isw_ptr, seq_part_ptr, part_ptr, saved_ptr,
    ld_logp, ld_old, ld_adv, ld_mask, ld_ref, ld_ent, ld_isw, row, chunk, chunks, T,
    lo, hi, delta_low, delta_high, dual_c, ratio_cap, tau_pos, tau_neg, dro_beta, k_pos, lam_pos, k_neg,
    lam_neg, kl_coef, kl_clamp, entropy_coef,
    OBJECTIVE: tl.constexpr, DUAL: tl.constexpr, SEQ_LEVEL: tl.constexpr, ADV_PER_TOKEN: tl.constexpr,
    ISW_MODE: tl.constexpr, KL_KIND: tl.constexpr, HAS_ENT: tl.constexpr, MASK_KIND: tl.constexpr,
    SAVE_GRAD: tl.constexpr, ACC: tl.constexpr, BLOCK: tl.constexpr, RELAXED: tl.constexpr,
):  # fmt: skip
    """The forward's work on the (row, chunk) tile: its tokens' terms, their saved gradient, and its
    partials published (RELAXED in a persistent program, whose one ticket after its last tile releases
    them all; else released where the program's ticket follows)."""
    offs = chunk * BLOCK + tl.arange(0, BLOCK)
    seq_mean = 0.0
    if SEQ_LEVEL:
        seq_mean = _row_seq_statistic(seq_part_ptr, row, chunks, OBJECTIVE, ACC)
    m, neg_lr, wl, wd, flags, kl, ent, bad = _token_terms(
        logp_ptr, old_ptr, adv_ptr, mask_ptr, ref_ptr, ent_ptr, isw_ptr,
        ld_logp, ld_old, ld_adv, ld_mask, ld_ref, ld_ent, ld_isw, row, offs, T, seq_mean,
        lo, hi, delta_low, delta_high, dual_c, ratio_cap, tau_pos, tau_neg, dro_beta, k_pos, lam_pos, k_neg,
        lam_neg, kl_coef, kl_clamp, entropy_coef,
        OBJECTIVE, DUAL, SEQ_LEVEL, ADV_PER_TOKEN, ISW_MODE, KL_KIND, HAS_ENT, MASK_KIND,
    )  # fmt: skip
    if SAVE_GRAD:
        tl.store(saved_ptr + row * T + offs, wd, mask=offs < T)
    s_loss, s_m, s_clip, s_low, s_high, s_dual, s_lr, s_kl, s_ent, s_bad = sums10(
        wl, m, flags[0], flags[1], flags[2], flags[3], neg_lr, kl, ent, bad.to(ACC)
    )
    cols = tl.arange(0, NUM_PARTS_PAD)
    zero = tl.zeros([NUM_PARTS_PAD], ACC)
    part = tl.where(cols == LOSS_PART, s_loss, zero)
    part = tl.where(cols == COUNT_PART, s_m, part)
    part = tl.where((cols == SEQ_LOG_RATIO_PART) & (chunk == 0), seq_mean, part)  # once per row
    part = tl.where(cols == CLIPFRAC_PART, s_clip, part)
    part = tl.where(cols == CLIPFRAC_LOW_PART, s_low, part)
    part = tl.where(cols == CLIPFRAC_HIGH_PART, s_high, part)
    part = tl.where(cols == CLIPFRAC_DUAL_PART, s_dual, part)
    part = tl.where(cols == APPROX_KL_PART, s_lr, part)
    part = tl.where(cols == KL_PART, s_kl, part)
    part = tl.where(cols == ENTROPY_PART, s_ent, part)
    part = tl.where(cols == BAD_PART, s_bad, part)
    if RELAXED:
        publish_relaxed(part_ptr + (row * chunks + chunk) * NUM_PARTS + cols, part, cols < NUM_PARTS)
    else:
        publish(part_ptr + (row * chunks + chunk) * NUM_PARTS + cols, part, cols < NUM_PARTS)


@triton.jit
def _policy_forward_kernel(
    logp_ptr,  # [B, T] row stride ld_logp (each input: its own)
    old_ptr,  # [B, T]
    adv_ptr,  # [B] or [B, T]
    mask_ptr,  # [B, T] bool, integer or float
    ref_ptr,  # [B, T] (unused without KL)
    ent_ptr,  # [B, T] (unused without entropy)
    isw_ptr,  # [B] or [B, T] (unused without is_weights)
    seq_part_ptr,  # [B, chunks, 2] _seq_log_ratio_kernel's partials (SEQ_LEVEL)
    part_ptr,  # [B, chunks, NUM_PARTS] acc: this launch's partials
    saved_ptr,  # [B, T] acc, contiguous: m · dL/dlogp (unused unless SAVE_GRAD)
    counter_ptr,  # [1] int32, zero (_finish.launch_counter)
    loss_ptr,  # [] acc
    stats_ptr,  # [len(STAT_KEYS)] acc
    weights_ptr,  # [B] acc: d loss / d row sum
    row_stats_ptr,  # [B, len(ROW_STATS)] acc
    ok_ptr,  # [] bool
    tokens_ptr,  # [1] num_tokens as a tensor (TOKENS == 2)
    seqs_ptr,  # [1] num_seqs as a tensor (SEQS == 2)
    ld_logp,
    ld_old,
    ld_adv,
    ld_mask,
    ld_ref,
    ld_ent,
    ld_isw,
    B,
    T,
    lo: tl.float64,
    hi: tl.float64,
    delta_low: tl.float64,
    delta_high: tl.float64,
    dual_c: tl.float64,
    ratio_cap: tl.float64,
    tau_pos: tl.float64,
    tau_neg: tl.float64,
    dro_beta: tl.float64,
    k_pos: tl.float64,
    lam_pos: tl.float64,
    k_neg: tl.float64,
    lam_neg: tl.float64,
    kl_coef: tl.float64,
    kl_clamp: tl.float64,
    entropy_coef: tl.float64,
    dp: tl.float64,
    norm_len: tl.float64,
    tokens_value: tl.float64,
    seqs_value: tl.float64,
    OBJECTIVE: tl.constexpr,
    DUAL: tl.constexpr,
    SEQ_LEVEL: tl.constexpr,
    ADV_PER_TOKEN: tl.constexpr,
    ISW_MODE: tl.constexpr,
    KL_KIND: tl.constexpr,
    HAS_ENT: tl.constexpr,
    MASK_KIND: tl.constexpr,
    SAVE_GRAD: tl.constexpr,
    AGG: tl.constexpr,
    TOKENS: tl.constexpr,
    SEQS: tl.constexpr,
    ACC: tl.constexpr,
    BLOCK: tl.constexpr,
    FINISH_ROWS: tl.constexpr,
    FINISH_GROUP: tl.constexpr,
    PERSISTENT: tl.constexpr,
    ROW_STRIDES: tl.constexpr,  # False: every input contiguous (the ld_* are T, or 1 for a [B] input)
    CHECK_MSG: tl.constexpr,  # the device assert's message, or None (_device_assert)
):
    """A program per (row, chunk) tile on a grid (B, chunks); PERSISTENT: a grid (programs,), each program
    taking every programs-th tile in row-major order with the next tile's loads in flight while it reduces
    and publishes this one (FORWARD_STAGES; at the token level: the sequence level's row statistic is a loop
    of its own, which the pipeliner does not cross), and one ticket a program instead of one a tile. (One
    tile a program is not that loop run once: its loop-invariant arguments then live in registers, 16 more
    a thread, and 3 programs an SM become 2.)

    Contiguous inputs (not ROW_STRIDES) share one index, row * T + offs: a row stride of each input's own
    costs registers the heaviest specializations do not have (docs/gpu_token_ops.md, "Rows where they
    lie")."""
    if not ROW_STRIDES:
        ld_logp, ld_old, ld_mask, ld_ref, ld_ent = T, T, T, T, T
        ld_adv = T if ADV_PER_TOKEN else 1
        ld_isw = T if ISW_MODE == 2 else 1
    if PERSISTENT:
        chunks = tl.cdiv(T, BLOCK)
        for tile in tl.range(tl.program_id(0), B * chunks, tl.num_programs(0), num_stages=FORWARD_STAGES):
            _tile_partials(
                logp_ptr, old_ptr, adv_ptr, mask_ptr, ref_ptr, ent_ptr, isw_ptr, seq_part_ptr, part_ptr,
                saved_ptr, ld_logp, ld_old, ld_adv, ld_mask, ld_ref, ld_ent, ld_isw,
                (tile // chunks).to(tl.int64), tile % chunks, chunks, T,
                lo, hi, delta_low, delta_high, dual_c, ratio_cap, tau_pos, tau_neg, dro_beta, k_pos, lam_pos,
                k_neg, lam_neg, kl_coef, kl_clamp, entropy_coef,
                OBJECTIVE, DUAL, SEQ_LEVEL, ADV_PER_TOKEN, ISW_MODE, KL_KIND, HAS_ENT, MASK_KIND, SAVE_GRAD,
                ACC, BLOCK, True,
            )  # fmt: skip
    else:
        chunks = tl.num_programs(1)
        _tile_partials(
            logp_ptr, old_ptr, adv_ptr, mask_ptr, ref_ptr, ent_ptr, isw_ptr, seq_part_ptr, part_ptr,
            saved_ptr, ld_logp, ld_old, ld_adv, ld_mask, ld_ref, ld_ent, ld_isw,
            tl.program_id(0).to(tl.int64), tl.program_id(1), chunks, T,
            lo, hi, delta_low, delta_high, dual_c, ratio_cap, tau_pos, tau_neg, dro_beta, k_pos, lam_pos,
            k_neg, lam_neg, kl_coef, kl_clamp, entropy_coef,
            OBJECTIVE, DUAL, SEQ_LEVEL, ADV_PER_TOKEN, ISW_MODE, KL_KIND, HAS_ENT, MASK_KIND, SAVE_GRAD, ACC,
            BLOCK, False,
        )  # fmt: skip
    if last_program(counter_ptr, tl.num_programs(0) * tl.num_programs(1)):  # programs: (B, chunks) or (P,)
        finish_aggregation(
            part_ptr, B, chunks, row_stats_ptr, weights_ptr, loss_ptr, stats_ptr, ok_ptr,
            dp, norm_len, tokens_value, tokens_ptr, seqs_value, seqs_ptr,
            NUM_PARTS, NUM_PARTS_PAD, LOSS_PART, COUNT_PART, COUNT_PART, NUM_ROW_STATS, FIRST_STAT_PART,
            NUM_STATS, BAD_PART, AGG, TOKENS, SEQS, ACC, FINISH_ROWS, FINISH_GROUP, CHECK_MSG,
        )  # fmt: skip


@triton.jit
def _backward_tile(grad_loss_ptr, weights_ptr, T, ACC: tl.constexpr, BLOCK: tl.constexpr):
    """A backward program's tile: (row, its token offsets, which are in the row, their indices in the
    contiguous [B, T] buffers, and g_b = d output / d loss · c_b, the row's d output / d row sum)."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inb = offs < T
    g = tl.load(grad_loss_ptr).to(ACC) * tl.load(weights_ptr + row)
    return row, offs, inb, row * T + offs, g


@triton.jit
def _policy_backward_kernel(
    grad_loss_ptr,  # [1] d output / d loss
    weights_ptr,  # [B] acc: d loss / d row sum (the forward's)
    row_stats_ptr,  # [B, len(ROW_STATS)] acc (column SEQ_LOG_RATIO: the row's log-ratio statistic)
    logp_ptr,  # [B, T]
    old_ptr,  # [B, T]
    adv_ptr,  # [B] or [B, T]
    mask_ptr,  # [B, T] bool, integer or acc
    ref_ptr,  # [B, T]
    ent_ptr,  # [B, T]
    isw_ptr,  # [B] or [B, T]
    grad_logp_ptr,  # [B, T] out
    grad_ent_ptr,  # [B, T] out (written when ENT_GRAD)
    ld_logp,  # the inputs' row strides (_token_terms); the outputs are contiguous
    ld_old,
    ld_adv,
    ld_mask,
    ld_ref,
    ld_ent,
    ld_isw,
    T,
    lo: tl.float64,
    hi: tl.float64,
    delta_low: tl.float64,
    delta_high: tl.float64,
    dual_c: tl.float64,
    ratio_cap: tl.float64,
    tau_pos: tl.float64,
    tau_neg: tl.float64,
    dro_beta: tl.float64,
    k_pos: tl.float64,
    lam_pos: tl.float64,
    k_neg: tl.float64,
    lam_neg: tl.float64,
    kl_coef: tl.float64,
    kl_clamp: tl.float64,
    entropy_coef: tl.float64,
    OBJECTIVE: tl.constexpr,
    DUAL: tl.constexpr,
    SEQ_LEVEL: tl.constexpr,
    ADV_PER_TOKEN: tl.constexpr,
    ISW_MODE: tl.constexpr,
    KL_KIND: tl.constexpr,
    HAS_ENT: tl.constexpr,
    MASK_KIND: tl.constexpr,
    LOGP_GRAD: tl.constexpr,
    ENT_GRAD: tl.constexpr,
    ACC: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """The backward without the forward's saved values (a forward that saved none: no gradient was wanted
    then, or a caller of the registered op passed none): d logp = g_b · m · d L / d logp recomputed from
    the inputs, d entropy = -g_b · entropy_coef · m, with g_b = d output / d loss · c_b."""
    row, offs, inb, idx, g = _backward_tile(grad_loss_ptr, weights_ptr, T, ACC, BLOCK)
    if LOGP_GRAD:
        seq_mean = 0.0
        if SEQ_LEVEL:
            seq_mean = tl.load(row_stats_ptr + row * NUM_ROW_STATS + SEQ_LOG_RATIO)
        m, neg_lr, wl, wd, flags, kl, ent, _ = _token_terms(
            logp_ptr, old_ptr, adv_ptr, mask_ptr, ref_ptr, ent_ptr, isw_ptr,
            ld_logp, ld_old, ld_adv, ld_mask, ld_ref, ld_ent, ld_isw, row, offs, T, seq_mean,
            lo, hi, delta_low, delta_high, dual_c, ratio_cap, tau_pos, tau_neg, dro_beta, k_pos, lam_pos,
            k_neg, lam_neg, kl_coef, kl_clamp, entropy_coef,
            OBJECTIVE, DUAL, SEQ_LEVEL, ADV_PER_TOKEN, ISW_MODE, KL_KIND, HAS_ENT, MASK_KIND,
        )  # fmt: skip
        tl.store(grad_logp_ptr + idx, (g * wd).to(grad_logp_ptr.dtype.element_ty), mask=inb)
    else:  # d entropy needs the mask only
        m, _ = load_mask(mask_ptr + row * ld_mask + offs, inb, MASK_KIND, ACC)
    if ENT_GRAD:
        d_ent = -g * float_arg(entropy_coef, ACC) * m
        tl.store(grad_ent_ptr + idx, d_ent.to(grad_ent_ptr.dtype.element_ty), mask=inb)


@triton.jit
def _policy_backward_saved_kernel(
    grad_loss_ptr,  # [1] d output / d loss
    weights_ptr,  # [B] acc: d loss / d row sum (the forward's)
    saved_ptr,  # [B, T] acc, contiguous: the forward's m · d L / d logp
    mask_ptr,  # [B, T] bool, integer or acc, row stride ld_mask
    grad_logp_ptr,  # [B, T] out (may be saved_ptr: each element is read, then written, by one thread)
    grad_ent_ptr,  # [B, T] out (written when ENT_GRAD)
    ld_mask,
    T,
    entropy_coef: tl.float64,
    MASK_KIND: tl.constexpr,
    LOGP_GRAD: tl.constexpr,
    ENT_GRAD: tl.constexpr,
    ACC: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """The backward from the forward's saved values, the usual one: d logp = g_b · saved, d entropy =
    -g_b · entropy_coef · m, with g_b = d output / d loss · c_b. It reads the saved buffer and the mask
    only, and takes no option it does not use (each launch argument costs host time)."""
    row, offs, inb, idx, g = _backward_tile(grad_loss_ptr, weights_ptr, T, ACC, BLOCK)
    if LOGP_GRAD:
        wd = tl.load(saved_ptr + idx, mask=inb, other=0.0)
        tl.store(grad_logp_ptr + idx, (g * wd).to(grad_logp_ptr.dtype.element_ty), mask=inb)
    if ENT_GRAD:
        m, _ = load_mask(mask_ptr + row * ld_mask + offs, inb, MASK_KIND, ACC)
        d_ent = -g * float_arg(entropy_coef, ACC) * m
        tl.store(grad_ent_ptr + idx, d_ent.to(grad_ent_ptr.dtype.element_ty), mask=inb)


# Tokens per program on a GPU: up to 1024 (4 warps x 8 elements, 128-bit loads); short rows take a narrower
# block (at most 4x their length), and three widths keep first-call compiles few.
TOKEN_BLOCKS = (64, 256, 1024)
# The forward's programs on rows longer than that: 2048 tokens with 8 warps (8 elements a thread, as 1024
# with 4), the fastest of 1024-8192 tokens x 4-8 warps in the 2026-11-27 H200 sweep at B=512 T=8192
# (benchmarks/policy_forward_sweep.py; benchmarks/results/h200/2026-11-27/).
FORWARD_BLOCK, FORWARD_WARPS = 2048, 8
# The forward as a persistent kernel: this many programs an SM, each looping over the tiles with the next
# tiles' loads in flight (FORWARD_STAGES) while it reduces and publishes the current one, where a program per
# tile waits for its reductions, its partials' release and its ticket with no load in flight
# (docs/gpu_token_ops.md, "The forward, persistent"). 1 is what its registers allow at 8 warps (149 a thread
# under Triton 3.9). None: a program per tile, the measured default, until a GPU times the persistent one
# (benchmarks/policy_forward_sweep.py).
FORWARD_PROGRAMS_PER_SM = None
# The tiles a persistent program holds: the one it computes and 2 on their way, 76 KB of shared memory (fp32,
# sm_90); 2 tiles in flight an SM are about 2.5x the bytes that keep HBM busy at a microsecond's latency.
FORWARD_STAGES = tl.constexpr(3)


def _block(T: int) -> int:
    """A TOKEN_BLOCKS entry on a GPU; the interpreter runs one numpy op per block, so there whole rows up
    to 8192 tokens."""
    if triton_interpreting():
        return max(16, min(8192, next_pow2(max(T, 1))))
    return next((b for b in TOKEN_BLOCKS if b >= T), TOKEN_BLOCKS[-1])


def _forward_tile(T: int) -> tuple[int, int]:
    """(tokens per program, warps) of the forward's kernels."""
    if T > TOKEN_BLOCKS[-1] and not triton_interpreting():
        return FORWARD_BLOCK, FORWARD_WARPS
    return _block(T), 4


def _inf(x):
    return float("inf") if x is None else float(x)


@functools.lru_cache(maxsize=256)  # a training run passes the same options every step
def _common_args(config: PolicyConfig):
    """(runtime scalars, constexpr kwargs) of the kernels from the op's options: the scalars in the
    kernels' order (lo ... entropy_coef), the options that select code paths as constexprs (read-only: the
    pair is cached)."""
    scalars = (
        1.0 - config.clip_low,
        1.0 + config.clip_high,
        float(config.clip_low),
        float(config.clip_high),
        _inf(config.dual_clip),
        _inf(config.ratio_cap),
        float(config.tau_pos),
        float(config.tau_neg),
        float(config.dro_beta),
        float(config.vespo_k_pos),
        max(float(config.vespo_lambda_pos), VESPO_LAMBDA_MIN),
        float(config.vespo_k_neg),
        max(float(config.vespo_lambda_neg), VESPO_LAMBDA_MIN),
        float(config.kl_coef),
        _inf(config.kl_clamp),
        float(config.entropy_coef),
    )
    return scalars, types.MappingProxyType(
        dict(
            OBJECTIVE=OBJECTIVE_CODES[config.objective],
            DUAL=config.dual_clip is not None,
            SEQ_LEVEL=bool(config.seq_level),
        )
    )


def _data_kwargs(advantages, ref_logp, entropy, is_weights, kl_kind: str):
    isw_mode = 0 if is_weights is None else (2 if is_weights.dim() == 2 else 1)
    return dict(
        ADV_PER_TOKEN=advantages.dim() == 2,
        ISW_MODE=isw_mode,
        KL_KIND=KL_KIND_CODES[kl_kind] if ref_logp is not None else -1,
        HAS_ENT=entropy is not None,
    )


def policy_loss_forward(
    logp, old_logp, advantages, mask, ref_logp, entropy, is_weights, config: PolicyConfig, agg, save_grad
):
    """The forward op in one launch (two with a per-row ratio): -> (loss [], stat means [len(STAT_KEYS)],
    row weights [B], row sums [B, len(ROW_STATS)], saved m · d L / d logp [B, T] or [0, 0], ok [] bool), in
    the accumulation type. `agg` is the op's AggConfig; `mask` bool, integer or float. ok is False when an
    input value is rejected (_token_terms)."""
    B, T = logp.shape
    inputs, strides, strided = unit_rows(T, logp, old_logp, advantages, mask, ref_logp, entropy, is_weights)
    logp, old_logp, advantages, mask, ref_logp, entropy, is_weights = inputs
    ld_logp, ld_old, ld_adv, ld_mask, ld_ref, ld_ent, ld_isw = strides
    strided = strided and B > 1  # one row: its stride is never read
    acc = acc_dtype(logp.dtype)
    empty = functools.partial(logp.new_empty, dtype=acc)
    saved = empty((B, T) if save_grad else (0, 0))
    loss, stats, weights, row_stats = empty(()), empty(len(STAT_KEYS)), empty(B), empty(B, len(ROW_STATS))
    ok = logp.new_empty((), dtype=torch.bool)
    if B == 0 or T == 0:  # no token: loss and stats 0
        return loss.zero_(), stats.zero_(), weights.zero_(), row_stats.zero_(), saved, ok.fill_(True)
    block, warps = _forward_tile(T)
    chunks = cdiv(T, block)
    scalars, cfg = _common_args(config)
    kw = dict(cfg, **_data_kwargs(advantages, ref_logp, entropy, is_weights, config.kl_kind))
    kw["MASK_KIND"] = mask_kind(mask)
    seq_part = weights  # a placeholder pointer without a per-row ratio
    if cfg["SEQ_LEVEL"]:
        seq_part = empty(B, chunks, 2)
        _seq_log_ratio_kernel[(B, chunks)](
            logp, old_logp, advantages, mask, logp if is_weights is None else is_weights, seq_part,
            ld_logp, ld_old, ld_adv, ld_mask, ld_isw, T, float(config.clip_low), float(config.clip_high),
            OBJECTIVE=cfg["OBJECTIVE"],
            ADV_PER_TOKEN=kw["ADV_PER_TOKEN"], ISW_MODE=kw["ISW_MODE"], MASK_KIND=kw["MASK_KIND"],
            BLOCK=block, num_warps=warps,
        )  # fmt: skip
    tokens, tokens_t, tokens_mode = normalizer_args(agg.num_tokens, agg.num_tokens_tensor)
    seqs, seqs_t, seqs_mode = normalizer_args(agg.num_seqs, agg.num_seqs_tensor)
    finish_rows, finish_group = finish_tile(block, warps, NUM_PARTS_PAD.value)
    persistent = FORWARD_PROGRAMS_PER_SM is not None
    grid = (B, chunks)
    if persistent:
        # Imported here: a line more above the kernels would move them, and Triton's cache keys hold each
        # function's line (every token kernel that uses this file's helpers would recompile).
        from rlkernels.triton._common import num_sms

        grid = (min(B * chunks, FORWARD_PROGRAMS_PER_SM * num_sms(logp.device)),)
    _policy_forward_kernel[grid](
        logp, old_logp, advantages, mask,
        logp if ref_logp is None else ref_logp,
        logp if entropy is None else entropy,
        logp if is_weights is None else is_weights,
        seq_part, empty(B, chunks, NUM_PARTS), saved if save_grad else weights, launch_counter(logp.device),
        loss, stats, weights, row_stats, ok,
        weights if tokens_t is None else tokens_t, weights if seqs_t is None else seqs_t,
        ld_logp, ld_old, ld_adv, ld_mask, ld_ref, ld_ent, ld_isw,
        B, T, *scalars, float(agg.dp_size), float(agg.norm_len), tokens, seqs,
        SAVE_GRAD=bool(save_grad), AGG=AGG_CODES[agg.agg], TOKENS=tokens_mode, SEQS=seqs_mode,
        ACC=tl_acc(acc), BLOCK=block, FINISH_ROWS=finish_rows,
        FINISH_GROUP=finish_group, PERSISTENT=persistent, ROW_STRIDES=strided, num_warps=warps, **kw,
        **check(logp, BAD_VALUES),
    )  # fmt: skip
    return loss, stats, weights, row_stats, saved, ok


def policy_loss_backward(
    grad_loss, row_weights, row_stats, saved, logp, old_logp, advantages, mask, ref_logp, entropy, is_weights,
    config: PolicyConfig, logp_grad, entropy_grad, into_saved=False,
):  # fmt: skip
    """The backward op in one launch: -> (d logp [B, T] or [0, 0], d entropy [B, T] or [0, 0]), in logp's
    dtype; from the forward's saved values when `saved` holds them, else recomputed from the inputs.
    into_saved: d logp is written over `saved` (its last read; the caller's buffer of logp's dtype)."""
    saved = saved.contiguous()  # before it may become d logp
    B, T = logp.shape
    acc = tl_acc(acc_dtype(logp.dtype))
    out_dtype = store_dtype(logp.dtype)
    if into_saved:
        grad_logp = saved
    else:
        grad_logp = logp.new_empty((B, T) if logp_grad else (0, 0), dtype=out_dtype)
    grad_ent = logp.new_empty((B, T) if entropy_grad else (0, 0), dtype=out_dtype)
    # An output not wanted is never written: its pointer stands in for the other.
    outs = (grad_logp if logp_grad else grad_ent, grad_ent if entropy_grad else grad_logp)
    flags = dict(MASK_KIND=mask_kind(mask), LOGP_GRAD=bool(logp_grad), ENT_GRAD=bool(entropy_grad), ACC=acc)
    block = _block(T)
    if not (B and T and (logp_grad or entropy_grad)):
        pass
    elif saved.numel():
        (mask,), (ld_mask,), _ = unit_rows(T, mask)
        _policy_backward_saved_kernel[(B, cdiv(T, block))](
            grad_loss, row_weights, saved, mask, *outs, ld_mask, T, float(config.entropy_coef),
            BLOCK=block, **flags,
        )  # fmt: skip
    else:
        row_stats = row_stats.contiguous()
        inputs, strides, _ = unit_rows(T, logp, old_logp, advantages, mask, ref_logp, entropy, is_weights)
        logp, old_logp, advantages, mask, ref_logp, entropy, is_weights = inputs
        scalars, cfg = _common_args(config)
        kw = dict(cfg, **_data_kwargs(advantages, ref_logp, entropy, is_weights, config.kl_kind))
        _policy_backward_kernel[(B, cdiv(T, block))](
            grad_loss, row_weights, row_stats, logp, old_logp, advantages, mask,
            logp if ref_logp is None else ref_logp,
            logp if entropy is None else entropy,
            logp if is_weights is None else is_weights,
            *outs, *strides, T, *scalars, BLOCK=block, **flags, **kw,
        )  # fmt: skip
    return grad_logp.to(logp.dtype), grad_ent.to(logp.dtype)


def _persistent(launch):
    """`launch()` with the forward persistent (FORWARD_PROGRAMS_PER_SM 1)."""
    from unittest import mock

    with mock.patch.dict(globals(), FORWARD_PROGRAMS_PER_SM=1):
        return launch()


def compile_cases():
    """Every option, dtype and mask dtype of the forward and backward kernels in a covering design (every
    pair of values of any two), plus every dtype x token block with every option on
    (rlkernels/triton/_specializations.py): the full product is ~10^5 specializations."""
    from rlkernels.ops._aggregation import AggConfig  # the op's argument table (the launchers take it as is)

    rows = covering(
        features={
            "objective": tuple(OBJECTIVE_CODES),
            "dual": (False, True),
            "level": ("token", "sequence"),
            "adv": ("row", "token"),
            "isw": (None, "row", "token"),
            "kl": (None, *KL_KIND_CODES),
            "entropy": (False, True),
            "saved": (False, True),
            "grads": ("logp", "entropy", "both"),
            "size": ("aligned", "odd"),
            "dtype": FLOAT_DTYPES,
            "mask": ("bool", "int", "float"),
            "agg": tuple(AGG_CODES),
            "normalizer": ("none", "value", "tensor"),
            "layout": ("contiguous", "rows"),
        },
        resources={"dtype": FLOAT_DTYPES, "block": (*TOKEN_BLOCKS, FORWARD_BLOCK)},
        heaviest={
            "objective": "clip",
            "dual": True,
            "level": "sequence",
            "adv": "token",
            "isw": "token",
            "kl": "k3",
            "entropy": True,
            "saved": False,
            "grads": "both",
            "size": "odd",
            "mask": "float",
            "agg": "seq-mean-token-mean",
            "normalizer": "tensor",
            "layout": "rows",
        },
    )
    for row, resource_row in rows:
        dtype = row["dtype"]
        B, T = 3, row["block"] - (row["size"] == "odd")

        pad = int(row["layout"] == "rows")  # rows at a stride of T + 1: a view, read in place (ROW_STRIDES)
        x = meta(B, T + pad, dtype=dtype)[:, pad:]
        mask_dtype = {"bool": torch.bool, "int": torch.int64, "float": acc_dtype(dtype)}[row["mask"]]
        mask = meta(B, T + pad, dtype=mask_dtype)[:, pad:]
        per = {"row": meta(B, dtype=dtype), "token": x, None: None}
        adv, isw = per[row["adv"]], per[row["isw"]]
        ref = x if row["kl"] else None
        ent = x if row["entropy"] or row["grads"] != "logp" else None
        config = PolicyConfig(
            objective=row["objective"], clip_low=0.2, clip_high=0.28,
            seq_level=row["level"] == "sequence" or row["objective"] in SEQUENCE_OBJECTIVES,
            dual_clip=3.0 if row["dual"] else None, ratio_cap=None, tau_pos=1.0, tau_neg=1.05, dro_beta=0.1,
            vespo_k_pos=2.0, vespo_lambda_pos=3.0, vespo_k_neg=3.0, vespo_lambda_neg=2.0, kl_coef=0.1,
            kl_kind=row["kl"] or "k3", kl_clamp=10.0, entropy_coef=0.01,
        )  # fmt: skip
        acc = acc_dtype(dtype)
        saved = meta(B, T, dtype=acc) if row["saved"] else meta(0, 0, dtype=acc)
        count = meta(1, dtype=acc)
        normalizer = {"none": (None, None), "value": (40.0, None), "tensor": (None, count)}[row["normalizer"]]
        agg = AggConfig(row["agg"], 1, float(T), *normalizer, *normalizer)
        label = ",".join(str(v) for v in row.values()).replace("torch.", "")
        forward = functools.partial(
            policy_loss_forward, x, x, adv, mask, ref, ent, isw, config, agg, row["saved"]
        )
        yield CompileCase(f"policy_loss_forward[{label}]", forward)
        if resource_row and row["block"] == FORWARD_BLOCK:  # every option on, the long rows' tile
            yield CompileCase(
                f"policy_loss_forward_persistent[{label}]", functools.partial(_persistent, forward)
            )
        yield CompileCase(
            f"policy_loss_backward[{label}]",
            functools.partial(
                policy_loss_backward, meta(1, dtype=acc), meta(B, dtype=acc),
                meta(B, len(ROW_STATS), dtype=acc), saved, x, x, adv, mask, ref, ent, isw, config,
                row["grads"] != "entropy", row["grads"] != "logp",
            ),
        )  # fmt: skip
