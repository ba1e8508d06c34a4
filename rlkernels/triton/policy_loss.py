"""policy_loss Triton kernels: the per-token math of csrc/include/rlkernels/policy_loss.h, a forward pass that
reduces per-row masked sums, and a backward pass writing d logp and d entropy.

Grid: (row, chunk of BLOCK tokens). Each program writes its chunk's partial sums to a small
[B, chunks, NUM_PARTS] buffer that torch sums over chunks in a fixed order (deterministic, no atomics);
level="sequence" first reduces each row's masked log-ratio the same way.
"""

import functools

import torch
import triton
import triton.language as tl

from rlkernels._backend import triton_interpreting
from rlkernels.policy_config import OBJECTIVES, ROW_STATS, SEQUENCE_OBJECTIVES, PolicyConfig
from rlkernels.reference.kl import KL_KIND_CODES
from rlkernels.reference.policy_loss import LOG_RATIO_BOUND, VESPO_LAMBDA_MIN, VESPO_LOG_W_MIN
from rlkernels.triton._common import clamp, clamp_passes, store_dtype, to_acc
from rlkernels.triton._specializations import FLOAT_DTYPES, CompileCase, covering, meta
from rlkernels.triton.kl import kl_grad, kl_value

# The objectives' codes (rlkernels/policy_config.py OBJECTIVES; C++ PGObjective).
OBJECTIVE_CODES = {name: code for code, name in enumerate(OBJECTIVES)}
CLIP = tl.constexpr(OBJECTIVE_CODES["clip"])
CISPO = tl.constexpr(OBJECTIVE_CODES["cispo"])
SAPO = tl.constexpr(OBJECTIVE_CODES["sapo"])
GPG = tl.constexpr(OBJECTIVE_CODES["gpg"])
DRO = tl.constexpr(OBJECTIVE_CODES["dro"])
DPPO_KL = tl.constexpr(OBJECTIVE_CODES["dppo_kl"])
GEO_MEAN = tl.constexpr(OBJECTIVE_CODES["geo_mean"])
VESPO = tl.constexpr(OBJECTIVE_CODES["vespo"])
LOG_W_MIN = tl.constexpr(VESPO_LOG_W_MIN)
BOUND = tl.constexpr(LOG_RATIO_BOUND)
# The per-row stats' column that holds the row's mean log-ratio (ROW_STATS).
SEQ_LOG_RATIO = tl.constexpr(ROW_STATS.index("seq_log_ratio"))
# Columns of the chunk partials [B, chunks, NUM_PARTS]: Σ m·L, then the ROW_STATS columns.
NUM_PARTS = tl.constexpr(1 + len(ROW_STATS))
LOSS_PART = tl.constexpr(0)


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
):
    """Per-token terms of tokens `offs` of `row`: (m, lr, m·L, m·dL/dlogp, flags..., kl, entropy) with
    masked tokens giving exact zeros. ISW_MODE: 0 none, 1 per row, 2 per token. KL_KIND < 0: no KL."""
    inb = offs < T
    idx = row * T + offs
    lp = to_acc(tl.load(logp_ptr + idx, mask=inb, other=0.0))
    old = to_acc(tl.load(old_ptr + idx, mask=inb, other=0.0))
    m = tl.load(mask_ptr + idx, mask=inb, other=0).to(lp.dtype)
    on = m != 0
    if ADV_PER_TOKEN:
        adv = to_acc(tl.load(adv_ptr + idx, mask=inb, other=0.0))
    else:
        adv = tl.zeros_like(lp) + to_acc(tl.load(adv_ptr + row))
    raw = lp - old
    lr = clamp(raw, -BOUND, BOUND)
    if SEQ_LEVEL:
        if OBJECTIVE == VESPO:
            seq_lr = clamp(seq_mean, LOG_W_MIN, BOUND)
            passes = tl.zeros_like(lp) + clamp_passes(seq_mean, LOG_W_MIN, BOUND).to(lp.dtype)
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
        pass
    elif ISW_MODE == 1:
        w = to_acc(tl.load(isw_ptr + row))
        loss = loss * w
        dlogp = dlogp * w
    elif ISW_MODE == 2:
        w = to_acc(tl.load(isw_ptr + idx, mask=inb, other=0.0))
        loss = loss * w
        dlogp = dlogp * w
    zero = tl.zeros_like(lp)
    kl = zero
    if KL_KIND >= 0:
        ref = to_acc(tl.load(ref_ptr + idx, mask=inb, other=0.0))
        kl = kl_value(lp, ref, kl_clamp, KL_KIND)
        loss = loss + kl_coef * kl
        dlogp = dlogp + kl_coef * kl_grad(lp, ref, kl_clamp, KL_KIND)
    ent = zero
    if HAS_ENT:
        ent = to_acc(tl.load(ent_ptr + idx, mask=inb, other=0.0))
        loss = loss - entropy_coef * ent
    wl = tl.where(on, m * loss, zero)
    wd = tl.where(on, m * dlogp, zero)
    flags = (
        tl.where(on, m * clipped.to(lp.dtype), zero),
        tl.where(on, m * low.to(lp.dtype), zero),
        tl.where(on, m * high.to(lp.dtype), zero),
        tl.where(on, m * dual.to(lp.dtype), zero),
    )
    return (
        m,
        tl.where(on, -m * lr, zero),
        wl,
        wd,
        flags,
        tl.where(on, m * kl, zero),
        tl.where(on, m * ent, zero),
    )


@triton.jit
def _seq_log_ratio_kernel(
    logp_ptr,  # [B, T]
    old_ptr,  # [B, T]
    adv_ptr,  # [B] or [B, T] (geo_mean)
    mask_ptr,  # [B, T] bool or acc
    isw_ptr,  # [B, T] (vespo with is_weights)
    part_ptr,  # [B, chunks, 2]: Σ m, Σ m·(the token's term of the row's statistic)
    T,
    delta_low,
    delta_high,
    OBJECTIVE: tl.constexpr,
    ADV_PER_TOKEN: tl.constexpr,
    ISW_MODE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Each (row, chunk)'s Σ m and Σ m·x, x as policy_loss.h sequence_token_log_ratio: GSPO's lr, geo_mean's
    lr clipped toward the side A pushes it, vespo's ±20-clamped lr plus its folded log IS weight."""
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    offs = chunk * BLOCK + tl.arange(0, BLOCK)
    inb = offs < T
    idx = row * T + offs
    lp = to_acc(tl.load(logp_ptr + idx, mask=inb, other=0.0))
    old = to_acc(tl.load(old_ptr + idx, mask=inb, other=0.0))
    m = tl.load(mask_ptr + idx, mask=inb, other=0).to(lp.dtype)
    zero = tl.zeros_like(lp)
    term = lp - old
    if OBJECTIVE == GEO_MEAN:
        if ADV_PER_TOKEN:
            adv = to_acc(tl.load(adv_ptr + idx, mask=inb, other=0.0))
        else:
            adv = zero + to_acc(tl.load(adv_ptr + row))
        lrc = clamp(term, -delta_low, delta_high)
        term = tl.where(adv > 0, tl.minimum(term, lrc), tl.where(adv < 0, tl.maximum(term, lrc), zero))
    elif OBJECTIVE == VESPO:
        term = clamp(term, -BOUND, BOUND)
        if ISW_MODE == 2:
            w = to_acc(tl.load(isw_ptr + idx, mask=inb, other=1.0))
            term = term + clamp(tl.log(w), LOG_W_MIN, BOUND)
    x = tl.where(m != 0, m * term, zero)
    base = part_ptr + (row * tl.num_programs(1) + chunk) * 2
    tl.store(base, tl.sum(m, axis=0))
    tl.store(base + 1, tl.sum(x, axis=0))


@triton.jit
def _policy_forward_kernel(
    logp_ptr,  # [B, T]
    old_ptr,  # [B, T]
    adv_ptr,  # [B] or [B, T]
    mask_ptr,  # [B, T] bool or acc
    ref_ptr,  # [B, T] (unused without KL)
    ent_ptr,  # [B, T] (unused without entropy)
    isw_ptr,  # [B] or [B, T] (unused without is_weights)
    seq_mean_ptr,  # [B] row mean log-ratios (unused at token level)
    part_ptr,  # [B, chunks, NUM_PARTS] acc
    saved_ptr,  # [B, T] acc: m · dL/dlogp (unused unless SAVE_GRAD)
    T,
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
    SAVE_GRAD: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    offs = chunk * BLOCK + tl.arange(0, BLOCK)
    seq_mean = 0.0
    if SEQ_LEVEL:
        seq_mean = tl.load(seq_mean_ptr + row)
    m, neg_lr, wl, wd, flags, kl, ent = _token_terms(
        logp_ptr, old_ptr, adv_ptr, mask_ptr, ref_ptr, ent_ptr, isw_ptr, row, offs, T, seq_mean,
        lo, hi, delta_low, delta_high, dual_c, ratio_cap, tau_pos, tau_neg, dro_beta, k_pos, lam_pos, k_neg,
        lam_neg, kl_coef, kl_clamp, entropy_coef,
        OBJECTIVE, DUAL, SEQ_LEVEL, ADV_PER_TOKEN, ISW_MODE, KL_KIND, HAS_ENT,
    )  # fmt: skip
    if SAVE_GRAD:
        tl.store(saved_ptr + row * T + offs, wd, mask=offs < T)
    base = part_ptr + (row * tl.num_programs(1) + chunk) * NUM_PARTS
    tl.store(base + LOSS_PART, tl.sum(wl, axis=0))
    tl.store(base + COUNT_PART, tl.sum(m, axis=0))
    tl.store(base + SEQ_LOG_RATIO_PART, 0.0)  # filled by the launcher
    tl.store(base + CLIPFRAC_PART, tl.sum(flags[0], axis=0))
    tl.store(base + CLIPFRAC_LOW_PART, tl.sum(flags[1], axis=0))
    tl.store(base + CLIPFRAC_HIGH_PART, tl.sum(flags[2], axis=0))
    tl.store(base + CLIPFRAC_DUAL_PART, tl.sum(flags[3], axis=0))
    tl.store(base + APPROX_KL_PART, tl.sum(neg_lr, axis=0))
    tl.store(base + KL_PART, tl.sum(kl, axis=0))
    tl.store(base + ENTROPY_PART, tl.sum(ent, axis=0))


@triton.jit
def _policy_backward_kernel(
    grad_rows_ptr,  # [B] acc
    row_stats_ptr,  # [B, NUM_STATS] acc (column SEQ_LOG_RATIO: the row's mean log-ratio)
    saved_ptr,  # [B, T] acc (used when USE_SAVED)
    logp_ptr,  # [B, T]
    old_ptr,  # [B, T]
    adv_ptr,  # [B] or [B, T]
    mask_ptr,  # [B, T] bool or acc
    ref_ptr,  # [B, T]
    ent_ptr,  # [B, T]
    isw_ptr,  # [B] or [B, T]
    grad_logp_ptr,  # [B, T] out
    grad_ent_ptr,  # [B, T] out (written when ENT_GRAD)
    T,
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
    USE_SAVED: tl.constexpr,
    LOGP_GRAD: tl.constexpr,
    ENT_GRAD: tl.constexpr,
    NUM_STATS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    offs = chunk * BLOCK + tl.arange(0, BLOCK)
    inb = offs < T
    idx = row * T + offs
    g = tl.load(grad_rows_ptr + row)
    if LOGP_GRAD:
        if USE_SAVED:
            wd = tl.load(saved_ptr + idx, mask=inb, other=0.0)
            m = tl.load(mask_ptr + idx, mask=inb, other=0).to(wd.dtype)
        else:
            seq_mean = 0.0
            if SEQ_LEVEL:
                seq_mean = tl.load(row_stats_ptr + row * NUM_STATS + SEQ_LOG_RATIO)
            m, neg_lr, wl, wd, flags, kl, ent = _token_terms(
                logp_ptr, old_ptr, adv_ptr, mask_ptr, ref_ptr, ent_ptr, isw_ptr, row, offs, T, seq_mean,
                lo, hi, delta_low, delta_high, dual_c, ratio_cap, tau_pos, tau_neg, dro_beta, k_pos, lam_pos,
                k_neg, lam_neg, kl_coef, kl_clamp, entropy_coef,
                OBJECTIVE, DUAL, SEQ_LEVEL, ADV_PER_TOKEN, ISW_MODE, KL_KIND, HAS_ENT,
            )  # fmt: skip
        tl.store(grad_logp_ptr + idx, (g * wd).to(grad_logp_ptr.dtype.element_ty), mask=inb)
    else:  # d entropy needs the mask only
        m = tl.load(mask_ptr + idx, mask=inb, other=0).to(g.dtype)
    if ENT_GRAD:
        tl.store(grad_ent_ptr + idx, (-g * entropy_coef * m).to(grad_ent_ptr.dtype.element_ty), mask=inb)


# Tokens per program on a GPU: up to 1024 (4 warps x 8 elements, 128-bit loads); short rows take a narrower
# block (at most 4x their length), and three widths keep first-call compiles few.
TOKEN_BLOCKS = (64, 256, 1024)


def _block(T: int) -> int:
    """A TOKEN_BLOCKS entry on a GPU; the interpreter runs one numpy op per block, so there whole rows up
    to 8192 tokens."""
    if triton_interpreting():
        return max(16, min(8192, triton.next_power_of_2(max(T, 1))))
    return next((b for b in TOKEN_BLOCKS if b >= T), TOKEN_BLOCKS[-1])


def _inf(x):
    return float("inf") if x is None else float(x)


def _common_args(config: PolicyConfig):
    """(runtime scalars, constexpr kwargs) of the kernels from the op's options: the scalars in the
    kernels' order (lo ... entropy_coef), the options that select code paths as constexprs."""
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
    return scalars, dict(
        OBJECTIVE=OBJECTIVE_CODES[config.objective],
        DUAL=config.dual_clip is not None,
        SEQ_LEVEL=bool(config.seq_level),
    )


def _data_kwargs(advantages, ref_logp, entropy, is_weights, kl_kind: str):
    isw_mode = 0 if is_weights is None else (2 if is_weights.dim() == 2 else 1)
    return dict(
        ADV_PER_TOKEN=advantages.dim() == 2,
        ISW_MODE=isw_mode,
        KL_KIND=KL_KIND_CODES[kl_kind] if ref_logp is not None else -1,
        HAS_ENT=entropy is not None,
    )


def _contiguous(*tensors):
    return [t.contiguous() if t is not None else None for t in tensors]


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def policy_loss_forward(
    logp, old_logp, advantages, mask, ref_logp, entropy, is_weights, config: PolicyConfig, save_grad
):
    """-> (row sums [B], row stats [B, len(ROW_STATS)], saved d/dlogp [B, T] or [0, 0]), in the accumulation
    type."""
    logp, old_logp, advantages, mask, ref_logp, entropy, is_weights = _contiguous(
        logp, old_logp, advantages, mask, ref_logp, entropy, is_weights
    )
    B, T = logp.shape
    acc = acc_dtype(logp.dtype)
    saved = logp.new_empty((B, T) if save_grad else (0, 0), dtype=acc)
    if B == 0 or T == 0:
        return logp.new_zeros(B, dtype=acc), logp.new_zeros(B, len(ROW_STATS), dtype=acc), saved.zero_()
    block = _block(T)
    chunks = triton.cdiv(T, block)
    scalars, cfg = _common_args(config)
    kw = dict(cfg, **_data_kwargs(advantages, ref_logp, entropy, is_weights, config.kl_kind))
    seq_mean = logp.new_zeros(B, dtype=acc)
    if cfg["SEQ_LEVEL"]:
        part = logp.new_empty(B, chunks, 2, dtype=acc)
        _seq_log_ratio_kernel[(B, chunks)](
            logp, old_logp, advantages, mask, logp if is_weights is None else is_weights, part, T,
            float(config.clip_low), float(config.clip_high), OBJECTIVE=cfg["OBJECTIVE"],
            ADV_PER_TOKEN=kw["ADV_PER_TOKEN"], ISW_MODE=kw["ISW_MODE"], BLOCK=block,
        )  # fmt: skip
        count, total = part.sum(1).unbind(-1)
        if config.objective == "vespo":  # its statistic is the sum (a strided view of part: copied)
            seq_mean = total.contiguous()
        else:
            seq_mean = torch.where(count > 0, total / torch.where(count > 0, count, 1), 0)
    part = logp.new_empty(B, chunks, NUM_PARTS, dtype=acc)
    _policy_forward_kernel[(B, chunks)](
        logp, old_logp, advantages, mask,
        logp if ref_logp is None else ref_logp,
        logp if entropy is None else entropy,
        logp if is_weights is None else is_weights,
        seq_mean, part, saved if save_grad else part, T, *scalars,
        SAVE_GRAD=bool(save_grad), BLOCK=block, **kw,
    )  # fmt: skip
    sums = part.sum(1)
    row_stats = sums[:, LOSS_PART.value + 1 :].clone()
    row_stats[:, SEQ_LOG_RATIO.value] = seq_mean
    return sums[:, LOSS_PART.value].contiguous(), row_stats, saved


def policy_loss_backward(
    grad_rows, row_stats, saved, logp, old_logp, advantages, mask, ref_logp, entropy, is_weights,
    config: PolicyConfig, logp_grad, entropy_grad,
):  # fmt: skip
    """-> (d logp [B, T] or [0, 0], d entropy [B, T] or [0, 0]), in logp's dtype."""
    grad_rows, row_stats, saved, logp, old_logp, advantages, mask, ref_logp, entropy, is_weights = (
        _contiguous(
            grad_rows, row_stats, saved, logp, old_logp, advantages, mask, ref_logp, entropy, is_weights
        )
    )
    B, T = logp.shape
    out_dtype = store_dtype(logp.dtype)
    grad_logp = logp.new_empty((B, T) if logp_grad else (0, 0), dtype=out_dtype)
    grad_ent = logp.new_empty((B, T) if entropy_grad else (0, 0), dtype=out_dtype)
    if B and T and (logp_grad or entropy_grad):
        block = _block(T)
        scalars, cfg = _common_args(config)
        kw = dict(cfg, **_data_kwargs(advantages, ref_logp, entropy, is_weights, config.kl_kind))
        use_saved = saved.numel() > 0
        _policy_backward_kernel[(B, triton.cdiv(T, block))](
            grad_rows, row_stats, saved if use_saved else row_stats, logp, old_logp, advantages, mask,
            logp if ref_logp is None else ref_logp,
            logp if entropy is None else entropy,
            logp if is_weights is None else is_weights,
            grad_logp if logp_grad else grad_ent, grad_ent if entropy_grad else grad_logp, T, *scalars,
            USE_SAVED=use_saved, LOGP_GRAD=bool(logp_grad), ENT_GRAD=bool(entropy_grad),
            NUM_STATS=len(ROW_STATS), BLOCK=block, **kw,
        )  # fmt: skip
    return grad_logp.to(logp.dtype), grad_ent.to(logp.dtype)


def compile_cases():
    """Every option, dtype and mask dtype of the forward and backward kernels in a covering design (every
    pair of values of any two), plus every dtype x token block with every option on
    (rlkernels/triton/_specializations.py): the full product is ~10^5 specializations."""
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
            "mask": ("bool", "float"),
        },
        resources={"dtype": FLOAT_DTYPES, "block": TOKEN_BLOCKS},
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
        },
    )
    for row, _ in rows:
        dtype = row["dtype"]
        B, T = 3, row["block"] - (row["size"] == "odd")
        x = meta(B, T, dtype=dtype)
        mask = meta(B, T, dtype=torch.bool if row["mask"] == "bool" else acc_dtype(dtype))
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
        label = ",".join(str(v) for v in row.values()).replace("torch.", "")
        yield CompileCase(
            f"policy_loss_forward[{label}]",
            functools.partial(policy_loss_forward, x, x, adv, mask, ref, ent, isw, config, row["saved"]),
        )
        yield CompileCase(
            f"policy_loss_backward[{label}]",
            functools.partial(
                policy_loss_backward, meta(B, dtype=acc), meta(B, len(ROW_STATS), dtype=acc), saved,
                x, x, adv, mask, ref, ent, isw, config, row["grads"] != "entropy", row["grads"] != "logp",
            ),
        )  # fmt: skip
