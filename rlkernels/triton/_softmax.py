"""Triton building blocks of the log-prob kernels: the logit transform, the online softmax statistics and the
per-logit gradient (the same math as csrc/include/rlkernels/logprobs.h).

A set of logits z is summarized relative to its max m by s = Σ e^{z−m} and a = Σ e^{z−m}(z − m); then
LSE = m + log s and entropy = log s − a / s; with SUM_SQ also q = Σ e^{2(z−m)}, and Σ softmax² = q / s²
(verl's sum_pi_squared). Sets merge exactly (online log-sum-exp); every term is bounded, so huge logits lose
nothing to cancellation. Without SUM_SQ, q is 0 and passes through untouched.

LSE is stored in float64 and split into hi + lo in the compute type where it is used, so that
log q = (z − hi) − lo keeps the bits a float32 LSE of large logits rounds off (docs/semantics.md, "The saved
LSE"; csrc/include/rlkernels/logprobs.h).
"""

import triton
import triton.language as tl

from rlkernels.triton._common import float_arg, to_acc

# Launch options of the kernels that save a row's LSE and of those that recompute log q = z − LSE from it: no
# product fused into the add after it. Fused (Triton 3.6's default on a GPU), the forward's z − max becomes
# fma(x, 1/τ, −max), unrounded z, while the backward's z passes a select and is rounded: log q misses by up to
# ulp(z)/2, and q ~ 1 at a dominant logit carries it into the gradient (on the 2026-11-30 H200 lease, 5e-6 at
# z ~ 38, 40x the fp32 reference's error). Unfused, both round z as the interpreter (which never fuses) and
# the C++ kernels (csrc/include/rlkernels/logprobs.h as_stored) do; Triton 3.10 makes it the default.
UNFUSED = {"enable_fp_fusion": False}


@triton.jit
def tanh(x):
    """fp32 tanh within a few ulp (as csrc/include/rlkernels/vmath.h): the odd Cephes polynomial for
    |x| < 0.625, else sign(x)·(1 − 2 / (e^{2|x|} + 1)) (no cancellation near 0, exact ±1 limits)."""
    ax = tl.abs(x)
    z = x * x
    p = -5.70498872745e-3
    p = p * z + 2.06390887954e-2
    p = p * z - 5.37397155531e-2
    p = p * z + 1.33314422036e-1
    p = p * z - 3.33332819422e-1
    small = p * z * x + x
    large = 1.0 - 2.0 / (tl.exp(2.0 * tl.minimum(ax, 44.0)) + 1.0)
    large = tl.where(x < 0, -large, large)
    if x.dtype == tl.float64:  # fp64 (gradchecks): the exp form alone loses only ~1e-16 / |x| near 0
        out = large
    else:
        out = tl.where(ax < 0.625, small, large)
    return out


@triton.jit
def transform_logit(x, inv_temp, cap, inv_cap, SOFTCAP: tl.constexpr):
    """z = softcap(x) / temperature with softcap(x) = c·tanh(x / c); the options in x's dtype (float_arg)."""
    if SOFTCAP:
        x = cap * tanh(x * inv_cap)
    return x * inv_temp


def transform_args(temperature: float, softcap: float | None) -> tuple[float, float, float, float]:
    """(inv_temp, cap, inv_cap, temp_over_cap): the kernels' tl.float64 arguments for transform_logit and
    transform_grad (cap, inv_cap 1 and temp_over_cap 0 without a softcap)."""
    if softcap is None:
        return 1.0 / temperature, 1.0, 1.0, 0.0
    return 1.0 / temperature, float(softcap), 1.0 / softcap, temperature / softcap


@triton.jit
def transform_options(inv_temp, cap, inv_cap, ACC: tl.constexpr):
    """transform_logit's options (the kernels' tl.float64 arguments) in dtype ACC, taken once per program."""
    return float_arg(inv_temp, ACC), float_arg(cap, ACC), float_arg(inv_cap, ACC)


@triton.jit
def transform_grad(z, inv_temp, temp_over_cap, SOFTCAP: tl.constexpr):
    """dz/dx in terms of z: (1 − tanh²(x / c)) / temperature, tanh(x / c) = z·temperature / c."""
    if SOFTCAP:
        t = z * temp_over_cap
        g = (1.0 - t * t) * inv_temp
    else:
        g = inv_temp + 0.0 * z
    return g


@triton.jit
def merge_stats(m, s, a, q, m_new_part, s_part, a_part, q_part, SUM_SQ: tl.constexpr):
    """Merge running (m, s, a, q) with the statistics of a disjoint part; an empty side (s == 0) adds nothing.
    q is only merged with SUM_SQ (else returned as is)."""
    m_new = tl.maximum(m, m_new_part)
    d_old = tl.where(s > 0, m - m_new, 0.0)
    d_part = tl.where(s_part > 0, m_new_part - m_new, 0.0)
    e_old = tl.where(s > 0, tl.exp(d_old), 0.0)
    e_part = tl.where(s_part > 0, tl.exp(d_part), 0.0)
    s_out = e_old * s + e_part * s_part
    a_out = e_old * (a + d_old * s) + e_part * (a_part + d_part * s_part)
    if SUM_SQ:
        q_out = e_old * e_old * q + e_part * e_part * q_part
    else:
        q_out = q
    return m_new, s_out, a_out, q_out


@triton.jit
def tile_stats(z, valid, ENTROPY: tl.constexpr, SUM_SQ: tl.constexpr):
    """(m, s, a, q) along axis 1 of a [rows, cols] tile of transformed logits; `valid` masks columns. a is 0
    without ENTROPY, q without SUM_SQ."""
    m = tl.max(tl.where(valid, z, float("-inf")), axis=1)
    d = tl.where(valid, z - m[:, None], 0.0)
    e = tl.where(valid, tl.exp(d), 0.0)
    s = tl.sum(e, axis=1)
    if ENTROPY:
        a = tl.sum(e * d, axis=1)
    else:
        a = 0.0 * s
    if SUM_SQ:
        q = tl.sum(e * e, axis=1)
    else:
        q = 0.0 * s
    return m, s, a, q


@triton.jit
def sum_sq_of(s, q):
    """Σ softmax² = q / s² = exp(LSE(2z) − 2·LSE(z)), in (0, 1] (1 ≤ q ≤ s² for a non-empty set)."""
    return q / (s * s)


@triton.jit
def split_lse(lse64, like):
    """A float64 LSE as (hi, lo) in `like`'s dtype, LSE = hi + lo (lo = 0 in fp64 and where LSE is ±inf)."""
    hi = lse64.to(like.dtype)
    lo = tl.where(hi.to(tl.float64) == lse64, 0.0, lse64 - hi.to(tl.float64)).to(like.dtype)
    return hi, lo


@triton.jit
def finalize_stats(m, s, a, z_target):
    """(logp, entropy, lse in float64); logp never above 0 (z_y ≤ max ≤ LSE), NaN propagates."""
    log_s = tl.log(s)
    lse = m.to(tl.float64) + log_s.to(tl.float64)
    hi, lo = split_lse(lse, m)
    logp = (z_target - hi) - lo
    logp = tl.where(logp > 0.0, 0.0, logp)
    entropy = log_s - a / s
    return logp, entropy, lse


@triton.jit
def logit_grad(z, lse_hi, lse_lo, entropy, g_logp, g_ent, is_target, ENTROPY: tl.constexpr):
    """d(g_logp·logp + g_ent·H)/dz = [z is the target]·g_logp − q·(g_logp + g_ent·(log q + H)), q = e^{z−LSE}
    with LSE = lse_hi + lse_lo (split_lse); per-row quantities broadcast along axis 1."""
    log_q = (z - lse_hi[:, None]) - lse_lo[:, None]
    coef = g_logp[:, None]
    if ENTROPY:
        coef = coef + g_ent[:, None] * (log_q + entropy[:, None])
    return tl.where(is_target, g_logp[:, None], 0.0) - tl.exp(log_q) * coef


@triton.jit
def dlogits_rows(labels_ptr, lse_ptr, entropy_ptr, g_logp_ptr, g_ent_ptr, rows, row_mask, ignore_index,
                 ENTROPY: tl.constexpr):  # fmt: skip
    """The per-row inputs of dlogits_store for `rows` (each pointer [N]; lse float64): (labels, live, g_logp,
    g_ent, entropy, lse_hi, lse_lo). A row is live when in range and not ignored; the others load 0. Without
    ENTROPY, g_ent and entropy are g_logp (placeholders logit_grad does not read)."""
    labels = tl.load(labels_ptr + rows, mask=row_mask, other=ignore_index).to(tl.int64)
    live = row_mask & (labels != ignore_index)
    g_logp = to_acc(tl.load(g_logp_ptr + rows, mask=live, other=0.0))
    lse_hi, lse_lo = split_lse(tl.load(lse_ptr + rows, mask=live, other=0.0), g_logp)
    if ENTROPY:
        g_ent = to_acc(tl.load(g_ent_ptr + rows, mask=live, other=0.0))
        entropy = to_acc(tl.load(entropy_ptr + rows, mask=live, other=0.0))
    else:
        g_ent = g_logp
        entropy = g_logp
    return labels, live, g_logp, g_ent, entropy, lse_hi, lse_lo


@triton.jit
def dlogits_store(x, bias_ptr, cols, col_mask, row_mask, labels, live, g_logp, g_ent, entropy, lse_hi, lse_lo,
                  dz_ptrs, db_ptr, inv_temp, cap, inv_cap, temp_over_cap, HAS_BIAS: tl.constexpr,
                  HAS_DBIAS: tl.constexpr, SOFTCAP: tl.constexpr, ENTROPY: tl.constexpr):  # fmt: skip
    """From a tile of raw logits x [rows, cols] (without the bias; the per-row inputs of dlogits_rows): the
    gradient d loss / d raw logit, 0 at dead rows and columns, stored at `dz_ptrs` in their dtype, and its
    column sums added to d bias (db_ptr [V]) with HAS_DBIAS."""
    if HAS_BIAS:
        x += to_acc(tl.load(bias_ptr + cols, mask=col_mask, other=0.0))[None, :]
    z = transform_logit(x, inv_temp, cap, inv_cap, SOFTCAP)
    if HAS_BIAS:  # a -inf bias masks its token: taken 1e4 under the LSE, q = 0 and the label term alone
        z = tl.where(z == float("-inf"), lse_hi[:, None] - 1e4, z)
    dz = logit_grad(z, lse_hi, lse_lo, entropy, g_logp, g_ent, cols[None, :] == labels[:, None], ENTROPY)
    dx = tl.where(
        live[:, None] & col_mask[None, :], dz * transform_grad(z, inv_temp, temp_over_cap, SOFTCAP), 0.0
    )
    tl.store(dz_ptrs, dx.to(dz_ptrs.dtype.element_ty), mask=row_mask[:, None] & col_mask[None, :])
    if HAS_DBIAS:
        tl.atomic_add(db_ptr + cols, tl.sum(dx, axis=0), mask=col_mask)


@triton.jit
def add_logits_tile(x, bias_ptr, cols, col_mask, labels, m, s, a, q, z_target, inv_temp, cap, inv_cap,
                    HAS_BIAS: tl.constexpr, SOFTCAP: tl.constexpr, ENTROPY: tl.constexpr,
                    SUM_SQ: tl.constexpr):  # fmt: skip
    """The rows' running statistics (m, s, a, q) and label logit z_target with a tile of raw logits x
    [rows, cols] (without the bias) merged in: -> (m, s, a, q, z_target)."""
    valid = col_mask[None, :]
    if HAS_BIAS:
        x += to_acc(tl.load(bias_ptr + cols, mask=col_mask, other=0.0))[None, :]
    z = transform_logit(x, inv_temp, cap, inv_cap, SOFTCAP)
    if HAS_BIAS:  # a -inf bias masks its token (docs/semantics.md, "Masked logits"); softcap(-inf) does not
        valid = valid & (z != float("-inf"))
    m_t, s_t, a_t, q_t = tile_stats(z, valid, ENTROPY, SUM_SQ)
    m, s, a, q = merge_stats(m, s, a, q, m_t, s_t, a_t, q_t, SUM_SQ)
    z_target += tl.sum(tl.where(cols[None, :] == labels[:, None], z, 0.0), axis=1)
    return m, s, a, q, z_target


@triton.jit
def store_split_stats(part_ptr, split, rows, row_mask, m, s, a, q, N, num_splits, ENTROPY: tl.constexpr,
                      SUM_SQ: tl.constexpr):  # fmt: skip
    """One vocabulary split's statistics of `rows` into part [3 + SUM_SQ, num_splits, N] (a only with
    ENTROPY, q only with SUM_SQ), the layout the combine kernel merges."""
    offs = tl.cast(split, tl.int64) * N + rows  # tl.cast: a split of 1 arrives as a constexpr (no .to())
    tl.store(part_ptr + offs, m, mask=row_mask)
    tl.store(part_ptr + num_splits * N + offs, s, mask=row_mask)
    if ENTROPY:
        tl.store(part_ptr + 2 * num_splits * N + offs, a, mask=row_mask)
    if SUM_SQ:
        tl.store(part_ptr + 3 * num_splits * N + offs, q, mask=row_mask)
