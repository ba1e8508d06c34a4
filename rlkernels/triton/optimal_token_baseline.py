"""The optimal token baseline in two launches after the ids' sort (rlkernels/reference/advantage_estimators.py
optimal_token_baseline; verl 0.9.1 compute_optimal_token_baseline_advantage).

    rows    (a program per response) the reward-to-go G_t = m_t (r_t + Σ_{j>t} m_j r_j) (discounted_returns
            at gamma 1: the running return carries through masked positions) into `returns`, scanned from
            the right; the masked cumulative path variance W_t m_t, W_t = Σ_{j<=t} w_j m_j with
            w = (1 - 2 e^{old_logp}) + Σπ², times ρ², into `adv` (scratch until the groups pass), scanned
            from the left; the row's length Σ m and its count of rejected values.
    groups  (a program per sorted position and block of positions; the programs at a group's head work,
            the others return) the group's members are the run of equal ids from the head; at each
            position of the block: b = Σ_g G W m / (Σ_g W m + eps) (0 in a group of one), then every
            member's adv = (G - b) m, b = 0 in a unique longest response's tail (verl's handle_zero_tail,
            from the group's lengths). Each program reads the members' scratch of its own block before it
            overwrites it, and no other program reads that block.

The flag: the rows pass's first program sets it, and a group's head program at block 0 lowers it when a
member's inputs held a rejected value (non-finite rewards; Σπ² or importance weights not finite and >= 0;
a mask value other than 0 / 1 (integer) or finite >= 0 (float)): one launch after the other, so no race.
"""

import functools

import torch
import triton
import triton.language as tl

from rlkernels.triton._common import cdiv, float_arg, tl_acc, to_acc
from rlkernels.triton._device_assert import check, require
from rlkernels.triton._mask import load_mask, mask_kind
from rlkernels.triton._specializations import CompileCase, meta, pairwise
from rlkernels.triton.gae import _block

# Columns of the rows pass's per-response scratch: the length Σ m, the count of rejected values.
ROW_STATS = tl.constexpr(2)
# The groups pass's device assert (_device_assert), csrc/cuda/optimal_token_baseline.cu's message.
BAD_VALUES = (
    "rlkernels optimal_token_baseline: NaN or inf rewards, sum_pi_squared or rollout_is_weights negative "
    "or not finite, or a mask value not 0 / 1 (integer) or finite and >= 0 (float)"
)
# Members whose lengths the zero tail reads at a time: one value a thread at 4 warps (a larger group takes
# several steps).
MEMBERS = tl.constexpr(128)


@triton.jit
def _rows_kernel(
    r_ptr,  # [B, T] rewards
    m_ptr,  # [B, T] mask: bool, integer (0 / 1) or float weights
    lp_ptr,  # [B, T] old log-probs
    sp_ptr,  # [B, T] Σπ²
    isw_ptr,  # [B, T] importance weights ρ (HAS_ISW)
    ret_ptr,  # [B, T] out: the returns G
    wm_ptr,  # [B, T] out: W m (the advantages' buffer, scratch)
    row_ptr,  # [B, ROW_STATS] out, ACC: length, rejected values
    ok_ptr,  # [] bool: set here, lowered by the groups pass
    T,
    HAS_ISW: tl.constexpr,
    MASK_KIND: tl.constexpr,
    ACC: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Row program_id(0): the module docstring's rows pass."""
    row = tl.program_id(0)
    if row == 0:
        tl.store(ok_ptr, tl.full([], 1, tl.int1))
    base = row.to(tl.int64) * T
    lanes = tl.arange(0, BLOCK)
    w_run = tl.zeros([1], ACC)  # Σ w m left of the block
    length = tl.zeros([1], ACC)
    bad = tl.zeros([1], ACC)
    for t0 in range(0, T, BLOCK):  # from the left: W m
        offs = t0 + lanes
        valid = offs < T
        m, bad_m = load_mask(m_ptr + base + offs, valid, MASK_KIND, ACC)
        lp = to_acc(tl.load(lp_ptr + base + offs, mask=valid, other=0.0))
        sp = to_acc(tl.load(sp_ptr + base + offs, mask=valid, other=0.0))
        w = (1.0 - 2.0 * tl.exp(lp)) + sp  # the reference's order of operations
        rejected = bad_m | ~((sp >= 0) & (sp < float("inf")))
        if HAS_ISW:
            rho = to_acc(tl.load(isw_ptr + base + offs, mask=valid, other=0.0))
            w = w * (rho * rho)
            rejected = rejected | ~((rho >= 0) & (rho < float("inf")))
        wm = tl.where(valid, w * m, 0.0)
        cum = tl.cumsum(wm, axis=0) + w_run
        tl.store(wm_ptr + base + offs, (cum * m).to(wm_ptr.dtype.element_ty), mask=valid)
        w_run += tl.sum(wm, axis=0, keep_dims=True)
        length += tl.sum(m, axis=0, keep_dims=True)
        bad += tl.sum(tl.where(valid & rejected, 1.0, 0.0), axis=0, keep_dims=True)
    g_run = tl.zeros([1], ACC)  # Σ m r right of the block
    for c in range(0, tl.cdiv(T, BLOCK)):  # from the right: G
        offs = T - (c + 1) * BLOCK + lanes
        valid = offs >= 0
        m, _ = load_mask(m_ptr + base + offs, valid, MASK_KIND, ACC)
        r = to_acc(tl.load(r_ptr + base + offs, mask=valid, other=0.0))
        bad += tl.sum(tl.where(valid & ((r - r) != 0), 1.0, 0.0), axis=0, keep_dims=True)
        mr = m * r
        # m (r + Σ_{j>t} m_j r_j) without taking m_t r_t back out of the inclusive sum
        g = m * ((tl.cumsum(mr, axis=0, reverse=True) + g_run) + (1.0 - m) * r)
        tl.store(ret_ptr + base + offs, g.to(ret_ptr.dtype.element_ty), mask=valid)
        g_run += tl.sum(mr, axis=0, keep_dims=True)
    cols = tl.arange(0, ROW_STATS)
    tl.store(
        row_ptr + row * ROW_STATS + cols, tl.where(cols == 0, tl.sum(length, axis=0), tl.sum(bad, axis=0))
    )


@triton.jit
def _run_end(ids_ptr, head, b, CHUNK: tl.constexpr):
    """The sorted position after the run of ids equal to ids[head]."""
    key = tl.load(ids_ptr + head)
    q0 = head + 1
    end = tl.zeros([], tl.int64) + b
    searching = q0 < b
    while searching:
        q = q0 + tl.arange(0, CHUNK)
        ids = tl.load(ids_ptr + q, mask=q < b, other=0)
        stop = (q >= b) | (ids != key)
        first = tl.min(tl.where(stop, q, b), axis=0)
        end = first
        searching = (first == b) & (q0 + CHUNK < b)
        q0 += CHUNK
    return end


@triton.jit
def _zero_tail(perm_ptr, row_ptr, head, n, ZERO_TAIL: tl.constexpr, ACC: tl.constexpr):
    """(the member whose baseline is 0 from `cut` on, cut): the group's unique longest response, when longer
    than the second longest (verl: sorted(lengths)[-2]; both floored, as verl's int()); member -1 if none."""
    lanes = tl.arange(0, MEMBERS)
    alone = tl.full([], -1, tl.int64)
    cut = tl.zeros([], ACC)
    if ZERO_TAIL:
        longest = tl.full([MEMBERS], float("-inf"), ACC)
        for k0 in range(0, n, MEMBERS):
            inside = k0 + lanes < n
            idx = tl.load(perm_ptr + head + k0 + lanes, mask=inside, other=0)
            length = tl.load(row_ptr + idx * ROW_STATS, mask=inside, other=float("-inf"))
            longest = tl.maximum(longest, length)
        top = tl.max(longest, axis=0)
        ties = tl.zeros([MEMBERS], ACC)
        below = tl.full([MEMBERS], float("-inf"), ACC)
        hits = tl.zeros([MEMBERS], ACC)
        hit = tl.full([MEMBERS], -1, tl.int64)
        for k0 in range(0, n, MEMBERS):
            inside = k0 + lanes < n
            idx = tl.load(perm_ptr + head + k0 + lanes, mask=inside, other=0)
            length = tl.load(row_ptr + idx * ROW_STATS, mask=inside, other=float("-inf"))
            ties += tl.where(inside & (length == top), 1.0, 0.0)
            below = tl.maximum(below, tl.where(inside & (length != top), length, float("-inf")))
            is_hit = inside & (length == tl.floor(top))
            hits += tl.where(is_hit, 1.0, 0.0)
            hit = tl.maximum(hit, tl.where(is_hit, idx, -1))
        second = tl.where(tl.sum(ties, axis=0) > 1, top, tl.max(below, axis=0))
        cut = tl.floor(second)
        unique = (tl.sum(hits, axis=0) == 1) & (tl.floor(top) > cut) & (n > 1)
        alone = tl.where(unique, tl.max(hit, axis=0), -1)
    return alone, cut


@triton.jit
def _groups_kernel(
    ret_ptr,  # [B, T] the returns G
    m_ptr,  # [B, T] mask
    ids_ptr,  # [B] sorted group ids
    perm_ptr,  # [B] int64 their original indices
    row_ptr,  # [B, ROW_STATS] ACC: the rows pass's length, rejected values
    adv_ptr,  # [B, T] in: W m (scratch), out: the advantages
    ok_ptr,  # [] bool: lowered on a rejected value
    b,
    T,
    eps: tl.float64,
    ZERO_TAIL: tl.constexpr,
    MASK_KIND: tl.constexpr,
    ACC: tl.constexpr,
    BLOCK: tl.constexpr,
    CHECK_MSG: tl.constexpr,  # the device assert's message, or None (_device_assert)
):
    """Sorted position program_id(0), positions block program_id(1): the module docstring's groups pass."""
    head = tl.program_id(0).to(tl.int64)
    is_head = head == 0
    if head > 0:
        is_head = tl.load(ids_ptr + head - 1) != tl.load(ids_ptr + head)
    if is_head:
        n = _run_end(ids_ptr, head, b, MEMBERS) - head
        if tl.program_id(1) == 0:
            lanes = tl.arange(0, MEMBERS)
            bad = tl.zeros([MEMBERS], ACC)
            for k0 in range(0, n, MEMBERS):
                inside = k0 + lanes < n
                idx = tl.load(perm_ptr + head + k0 + lanes, mask=inside, other=0)
                bad += tl.load(row_ptr + idx * ROW_STATS + 1, mask=inside, other=0.0)
            require(tl.sum(bad, axis=0) == 0, CHECK_MSG)  # the group's rows, as the rows pass counted them
            if tl.sum(bad, axis=0) > 0:
                tl.store(ok_ptr, tl.full([], 0, tl.int1))
        alone, cut = _zero_tail(perm_ptr, row_ptr, head, n, ZERO_TAIL, ACC)
        offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        valid = offs < T
        num = tl.zeros([BLOCK], ACC)
        den = tl.zeros([BLOCK], ACC)
        for k in range(0, n):
            base = tl.load(perm_ptr + head + k) * T
            g = to_acc(tl.load(ret_ptr + base + offs, mask=valid, other=0.0))
            wm = to_acc(tl.load(adv_ptr + base + offs, mask=valid, other=0.0))
            num += g * wm
            den += wm
        baseline = tl.where(n > 1, num / (den + float_arg(eps, ACC)), 0.0)
        tail = offs.to(ACC) >= cut
        for k in range(0, n):
            idx = tl.load(perm_ptr + head + k)
            base = idx * T
            m, _ = load_mask(m_ptr + base + offs, valid, MASK_KIND, ACC)
            g = to_acc(tl.load(ret_ptr + base + offs, mask=valid, other=0.0))
            b_row = tl.where((idx == alone) & tail, 0.0, baseline)
            tl.store(adv_ptr + base + offs, ((g - b_row) * m).to(adv_ptr.dtype.element_ty), mask=valid)


def optimal_token_baseline_forward(
    rewards: torch.Tensor,
    mask: torch.Tensor,
    group_ids: torch.Tensor,
    old_logp: torch.Tensor,
    sum_pi_squared: torch.Tensor,
    rollout_is_weights: torch.Tensor | None,
    handle_zero_tail: bool,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """rewards, old_logp, sum_pi_squared, rollout_is_weights [B, T] fp32/fp64 (one dtype), mask [B, T] bool,
    integer (0 / 1) or float weights, group_ids [B] int32/int64 -> (advantages, returns [B, T] in rewards'
    dtype, ok [] bool: every value valid, the module docstring). torch.sort, then two launches."""
    dtype = rewards.dtype
    if dtype not in (torch.float32, torch.float64):
        raise TypeError(f"rewards must be float32 or float64 (the estimator's compute dtypes), got {dtype}")
    r, m = rewards.contiguous(), mask.contiguous()
    lp, sp = old_logp.contiguous(), sum_pi_squared.contiguous()
    isw = rollout_is_weights.contiguous() if rollout_is_weights is not None else r
    b, t = r.shape
    adv, returns = torch.empty_like(r), torch.empty_like(r)
    if b * t == 0:
        return adv, returns, torch.ones((), dtype=torch.bool, device=r.device)
    ok = r.new_empty((), dtype=torch.bool)
    ids, perm = torch.sort(group_ids, stable=True)
    rows = r.new_empty((b, ROW_STATS.value))
    block = _block(t)
    kind = mask_kind(m)
    _rows_kernel[(b,)](
        r, m, lp, sp, isw, returns, adv, rows, ok, t,
        HAS_ISW=rollout_is_weights is not None, MASK_KIND=kind, ACC=tl_acc(dtype), BLOCK=block,
    )  # fmt: skip
    _groups_kernel[(b, cdiv(t, block))](
        returns, m, ids, perm, rows, adv, ok, b, t, float(eps),
        ZERO_TAIL=handle_zero_tail, MASK_KIND=kind, ACC=tl_acc(dtype), BLOCK=block, **check(r, BAD_VALUES),
    )  # fmt: skip
    return adv, returns, ok


def compile_cases():
    """Every pair of dtype, mask kind, importance weights, zero tail and row length (blocks 1024 and 128)."""
    masks = {"bool": torch.bool, "int": torch.int64, "float": None}
    axes = {
        "dtype": (torch.float32, torch.float64), "mask": tuple(masks), "isw": (False, True),
        "tail": (True, False), "t": (4096, 100),
    }  # fmt: skip
    for row in pairwise(axes):
        dtype = row["dtype"]
        x = meta(64, row["t"], dtype=dtype)
        m = meta(64, row["t"], dtype=masks[row["mask"]] or dtype)
        ids = meta(64, dtype=torch.int64)
        label = ",".join(f"{k}={str(v).removeprefix('torch.')}" for k, v in row.items())
        yield CompileCase(
            f"optimal_token_baseline_forward[{label}]",
            functools.partial(
                optimal_token_baseline_forward, x, m, ids, x, x, x if row["isw"] else None, row["tail"], 1e-8
            ),
        )
