"""group_advantages Triton kernels: one launch computes every advantage and checks every reward.

Contiguous groups (sort-free): each program holds a tile of BLOCK_G whole groups and computes each group's
mean (around its first reward as pivot, so a constant group gives exactly 0) and centered sum of squares
from registers: every reward is read once and every advantage written once. Each program publishes its bad
rewards (NaN or inf) and its tile's moments (count, mean, centered sum of squares); the last program to
finish (`_finish.last_program`) writes the validity flag and, for mode "batch", merges the moments into the
batch std and writes the advantages from the rewards and the group means the programs left (one more pass
over [B], inside the same launch: no torch std before it, docs/gpu_token_ops.md).
Arbitrary ids (and groups too wide for a tile): one program walks the rewards in the order of a stable sort
of the ids (`torch.sort`: equal ids become runs, each headed by the group's first member), chunk by chunk:
a segmented scan merges each run's moments (Chan's formula in fp64: a constant group keeps its mean exact
and its centered sum 0; an fp32 running sum would lose the small terms added after large ones), the end of
each run stores its group's statistics at the run's head, and a second walk writes the advantages (mode
"gpg", with ids only: the first walk also counts the nonzero rewards for its scale).
Past one chunk of ids (`_parallel_chunk`), a program per chunk scans its chunk with nothing carried in and
the launch's last program supplies each chunk's carry from the chunks' totals (`_chunk_scan_kernel`,
`_finish_chunks`); a second launch writes the advantages (`_chunk_write_kernel`): docs/gpu_token_ops.md.
`group_advantages_sum_forward` walks several reward columns (a [B, K] score matrix: gdpo's keys, TRL's
reward functions) in the same program, one column after the other, writing their weighted sum, and for TRL's
normalize_then_sum normalizes the sum over the batch in two more walks.
Modes beyond the public four, for the estimators: "gpg" (gpg_advantages) and the suffix "_trl" (TRL's group
of one: advantage 0), rlkernels/reference/advantages.py.
`tokens_forward` broadcasts advantages [B] to the tokens [B, T] times a mask it checks, folding the flag of
the kernel before it into its own (rlkernels/ops/advantages.py, the advantage estimators), or whitens them
with the coefficients of `whitened_group_tokens_forward`, whose group pass took verl's masked_whiten
statistics from the mask rows (mask_rows.py).
"""

import functools

import torch
import triton
import triton.language as tl

from rlkernels._backend import triton_interpreting
from rlkernels._dtypes import acc_dtype
from rlkernels.reference.advantages import GROUP_MODE_CODES, ZERO_SINGLES, group_mode_code
from rlkernels.reference.gae import WHITEN_EPS
from rlkernels.triton._common import (
    cdiv,
    elementwise_block,
    float_arg,
    next_pow2,
    store_dtype,
    tl_acc,
    to_acc,
)
from rlkernels.triton._device_assert import check, require
from rlkernels.triton._finish import last_program, launch_counter, publish
from rlkernels.triton._mask import load_mask, mask_kind
from rlkernels.triton._specializations import FLOAT_DTYPES, CompileCase, covering, meta
from rlkernels.triton.gae import FINISH_ROWS, finish_whiten
from rlkernels.triton.mask_rows import ROW_PARTS, publish_row_moments, row_block, whitening_part

# The kernels' device asserts (_device_assert), csrc/cuda/advantages.cu's messages: the group kernels'
# rewards, the token kernels' mask values.
BAD_REWARDS = "rlkernels group advantages: a reward (score) is NaN or inf"
BAD_TOKEN_MASK = "rlkernels advantage tokens: a mask value is not 0 / 1 (integer) or finite and >= 0 (float)"
GRPO = tl.constexpr(GROUP_MODE_CODES["grpo"])
DR_GRPO = tl.constexpr(GROUP_MODE_CODES["dr_grpo"])
RLOO = tl.constexpr(GROUP_MODE_CODES["rloo"])
BATCH = tl.constexpr(GROUP_MODE_CODES["batch"])
GPG = tl.constexpr(GROUP_MODE_CODES["gpg"])

# Group widths a tile holds (a group is padded to the next; masked lanes cost no memory traffic, and six
# widths keep first-call compiles few), up to 16384 (fp32: 64 KiB of registers across the program's warps);
# larger groups take the sorted walk.
GROUP_BLOCKS = (16, 64, 256, 1024, 4096, 16384)
MAX_TILE_GROUP = GROUP_BLOCKS[-1]
# Columns of each tile program's partials: bad rewards, then the tile's moments (count, mean, m2).
NUM_PARTS = tl.constexpr(4)
# Rewards the single-program passes (the finishing one, the sorted walk) take at a time: 1024 (8 per thread
# of 4 warps: the five-way fp64 segmented scan stays in registers).
WALK = tl.constexpr(1024)
# Warps of the sorted walk's one program: 8 (4 per 1024-reward chunk left the fp64 scan 40 B a thread over
# the spill budget on sm_90).
SORTED_WARPS = 8


@triton.jit
def group_advantage(r, n, mean, m2, eps, bstd, MODE: tl.constexpr, SINGLES_ZERO: tl.constexpr):
    """The advantage of r in a group of n with mean `mean` and centered sum of squares m2 (a group of one:
    mean 0, std 1, or advantage 0 with SINGLES_ZERO; a zero denominator, possible with eps = 0, gives 0);
    bstd is the batch statistic of BATCH (the std) and GPG (its scale). Mirrors rlk::group_advantage
    (csrc/include/rlkernels/advantages.h)."""
    multi = n > 1.0
    centered = tl.where(multi, r - mean, r)
    nm1 = tl.where(multi, n - 1.0, 1.0)
    if MODE == GRPO:
        denom = tl.where(multi, tl.sqrt(m2 / nm1), 1.0) + eps
        out = tl.where(denom > 0, centered / tl.where(denom > 0, denom, 1.0), 0.0)
    elif MODE == DR_GRPO:
        out = centered
    elif MODE == RLOO:
        out = tl.where(multi, n / nm1 * centered, r)
    elif MODE == GPG:  # bstd: the scale B / f_norm / max(#{r != 0}, 1)
        out = centered * bstd
    else:
        denom = bstd + eps + tl.zeros_like(centered)
        out = tl.where(denom > 0, centered / tl.where(denom > 0, denom, 1.0), 0.0)
    if SINGLES_ZERO:  # TRL: a group of one gets 0
        out = tl.where(multi, out, 0.0)
    return out


@triton.jit
def _merge(n1, mean1, m21, n2, mean2, m22):
    """Chan's pairwise merge of (count, mean, centered sum of squares); exact for an empty part."""
    n = n1 + n2
    delta = mean2 - mean1
    frac = tl.where(n > 0, n2 / tl.where(n > 0, n, 1.0), 0.0)
    return n, mean1 + delta * frac, m21 + m22 + delta * delta * n1 * frac


@triton.jit
def _block_moments(x, inside):
    """(count, mean, centered sum of squares) of x [N] fp64 where inside, each [1]: one block's part of a
    batch's moments, for _merge."""
    n = tl.sum(tl.where(inside, 1.0, 0.0), axis=0, keep_dims=True).to(tl.float64)
    mean = tl.sum(tl.where(inside, x, 0.0), axis=0, keep_dims=True) / n
    d = tl.where(inside, x - mean, 0.0)
    return n, mean, tl.sum(d * d, axis=0, keep_dims=True)


@triton.jit
def _parts_moments(n, mean, m2, inside):
    """The moments [1] of parts' (count, mean, m2) [N] where inside (the parts' count 0 elsewhere), merged in
    one step: their weighted mean, then the centered sums around it."""
    total = tl.sum(n, axis=0, keep_dims=True)
    merged = tl.sum(n * mean, axis=0, keep_dims=True) / tl.maximum(total, 1.0)
    d = tl.where(inside, mean - merged, 0.0)
    return total, merged, tl.sum(m2 + n * d * d, axis=0, keep_dims=True)


@triton.jit
def _batch_std(part_ptr, parts, b, ACC: tl.constexpr):
    """Unbiased std of all rewards (1 for a batch of one) from the tile programs' (count, mean, m2), merged
    in a fixed order: the total mean, then the centered sum of squares around it."""
    lanes = tl.arange(0, WALK)
    n_sum = tl.zeros([WALK], ACC)
    s_sum = tl.zeros([WALK], ACC)
    for p0 in range(0, parts, WALK):
        idx = p0 + lanes
        inside = idx < parts
        n = tl.load(part_ptr + idx * NUM_PARTS + 1, mask=inside, other=0.0, volatile=True)
        n_sum += n
        s_sum += n * tl.load(part_ptr + idx * NUM_PARTS + 2, mask=inside, other=0.0, volatile=True)
    mean = tl.sum(s_sum, axis=0) / tl.sum(n_sum, axis=0)
    m2_sum = tl.zeros([WALK], ACC)
    for p0 in range(0, parts, WALK):
        idx = p0 + lanes
        inside = idx < parts
        n = tl.load(part_ptr + idx * NUM_PARTS + 1, mask=inside, other=0.0, volatile=True)
        d = tl.load(part_ptr + idx * NUM_PARTS + 2, mask=inside, other=0.0, volatile=True) - mean
        m2_sum += tl.load(part_ptr + idx * NUM_PARTS + 3, mask=inside, other=0.0, volatile=True) + n * d * d
    std = tl.sqrt(tl.sum(m2_sum, axis=0) / tl.maximum(b - 1, 1).to(ACC))
    return tl.where(b > 1, std, 1.0)


@triton.jit
def _contiguous_kernel(
    r_ptr,  # [num_groups * G] rewards
    out_ptr,  # [num_groups * G]
    mean_ptr,  # [num_groups] ACC: each group's mean (BATCH: read by the last program)
    part_ptr,  # [grid, NUM_PARTS] ACC: each program's bad rewards and tile moments
    counter_ptr,  # [1] int32, zero (_finish.launch_counter)
    ok_ptr,  # [] bool: every reward finite
    num_groups,
    G,
    eps: tl.float64,
    MODE: tl.constexpr,
    SINGLES_ZERO: tl.constexpr,  # TRL's rule: a group of one gets 0 (reference/advantages.py ZERO_SINGLES)
    ACC: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CHECK_MSG: tl.constexpr,  # the device assert's message, or None (_device_assert)
):
    pid = tl.program_id(0)
    groups = pid.to(tl.int64) * BLOCK_G + tl.arange(0, BLOCK_G)
    cols = tl.arange(0, BLOCK_N)
    in_range = groups < num_groups
    offs = groups[:, None] * G + cols[None, :]
    valid = in_range[:, None] & (cols[None, :] < G)
    r = to_acc(tl.load(r_ptr + offs, mask=valid, other=0.0))
    bad = tl.sum(tl.sum(tl.where(valid & ((r - r) != 0), 1.0, 0.0), axis=1), axis=0)  # NaN or inf
    pivot = tl.sum(tl.where(cols[None, :] == 0, r, 0.0), axis=1)  # each group's first reward
    n = tl.zeros([BLOCK_G], ACC) + G
    mean = pivot + tl.sum(tl.where(valid, r - pivot[:, None], 0.0), axis=1) / n
    d = tl.where(valid, r - mean[:, None], 0.0)
    m2 = tl.sum(d * d, axis=1)
    eps = float_arg(eps, ACC)
    if MODE == BATCH:  # the last program writes the advantages, once the batch std is known
        tl.store(mean_ptr + groups, mean, mask=in_range)
    else:
        out = group_advantage(r, n[:, None], mean[:, None], m2[:, None], eps, 1.0, MODE, SINGLES_ZERO)
        out = tl.where(valid, out, 0.0)  # padding lanes of a tight group could overflow the fp16 cast
        tl.store(out_ptr + offs, out.to(out_ptr.dtype.element_ty), mask=valid)
    # The tile's moments: its groups' means and sums merged (every group of the tile has G members).
    tile_n = tl.sum(tl.where(in_range, n, 0.0), axis=0)
    tile_mean = tl.sum(tl.where(in_range, n * mean, 0.0), axis=0) / tl.maximum(tile_n, 1.0)
    dm = tl.where(in_range, mean - tile_mean, 0.0)
    tile_m2 = tl.sum(tl.where(in_range, m2 + n * dm * dm, 0.0), axis=0)
    pcols = tl.arange(0, NUM_PARTS)
    part = tl.where(pcols == 0, bad, tl.where(pcols == 1, tile_n, tl.where(pcols == 2, tile_mean, tile_m2)))
    publish(part_ptr + pid * NUM_PARTS + pcols, part, pcols < NUM_PARTS)
    parts = tl.num_programs(0)
    if last_program(counter_ptr, parts):
        lanes = tl.arange(0, WALK)
        bad_all = tl.zeros([WALK], ACC)
        for p0 in range(0, parts, WALK):
            idx = p0 + lanes
            bad_all += tl.load(part_ptr + idx * NUM_PARTS, mask=idx < parts, other=0.0, volatile=True)
        require(tl.sum(bad_all, axis=0) == 0, CHECK_MSG)
        tl.store(ok_ptr, tl.sum(bad_all, axis=0) == 0)
        if MODE == BATCH:
            b = num_groups * G
            bstd = _batch_std(part_ptr, parts, b, ACC)
            for i0 in range(0, b, WALK):
                idx = i0 + lanes
                inside = idx < b
                ri = to_acc(tl.load(r_ptr + idx, mask=inside, other=0.0))
                mi = tl.load(mean_ptr + idx // G, mask=inside, other=0.0, volatile=True)
                ni = tl.zeros([WALK], ACC) + G
                out = group_advantage(ri, ni, mi, tl.zeros_like(ri), eps, bstd, MODE, SINGLES_ZERO)
                tl.store(out_ptr + idx, out.to(out_ptr.dtype.element_ty), mask=inside)


@triton.jit
def _segment_combine(f1, n1, mean1, m21, f2, n2, mean2, m22):
    """Segmented merge for the forward scan over sorted rewards: the right part restarts at a group head
    (f2), else Chan's merge of the two parts' (count, mean, m2)."""
    n, mean, m2 = _merge(n1, mean1, m21, n2, mean2, m22)
    head = f2 != 0
    return f1 | f2, tl.where(head, n2, n), tl.where(head, mean2, mean), tl.where(head, m22, m2)


@triton.jit
def _max_combine(a, b):
    return tl.maximum(a, b)


@triton.jit
def _head_positions(head, pos, carried):
    """Each sorted position's run head: the last head at or before it (a running max), or `carried`, the
    head of the run still open from the previous chunk."""
    return tl.maximum(tl.associative_scan(tl.where(head, pos, -1).to(tl.int64), 0, _max_combine), carried)


@triton.jit
def _sorted_member(ids_ptr, perm_ptr, r_ptr, stride, pos, inside, b, G, CONTIGUOUS: tl.constexpr):
    """(reward, original index, head, run end) at sorted positions `pos`, the rewards `stride` apart: sorted
    ids and their permutation from torch.sort, or, CONTIGUOUS, the groups i // G in index order."""
    if CONTIGUOUS:
        idx = pos
        head = (pos % G) == 0
        end = ((pos + 1) % G == 0) | (pos == b - 1)
    else:
        idx = tl.load(perm_ptr + pos, mask=inside, other=0)
        key = tl.load(ids_ptr + pos, mask=inside, other=0)
        prev = tl.load(ids_ptr + pos - 1, mask=inside & (pos > 0), other=0)
        nxt = tl.load(ids_ptr + pos + 1, mask=inside & (pos + 1 < b), other=0)
        head = (pos == 0) | (key != prev)
        end = (pos == b - 1) | (key != nxt)
    r = to_acc(tl.load(r_ptr + idx * stride, mask=inside, other=0.0))
    return r, idx, head & inside, end & inside


@triton.jit
def _sorted_columns(
    r_ptr, w_ptr, ids_ptr, perm_ptr, stats_ptr, out_ptr, b, G, cols, eps,
    MODE: tl.constexpr,
    SINGLES_ZERO: tl.constexpr,
    CONTIGUOUS: tl.constexpr,
    WEIGHTED: tl.constexpr,
    ACC: tl.constexpr,
    CHUNK: tl.constexpr,
):  # fmt: skip
    """The sorted walk of the module docstring, once per column, by one program (_sorted_kernel's arguments);
    returns the number of rewards that are NaN or inf."""
    lanes = tl.arange(0, CHUNK)
    zero = tl.zeros([CHUNK], tl.float64)
    bad = tl.zeros([CHUNK], ACC)
    acc_eps = float_arg(eps, ACC)
    for k in range(0, cols):  # reward functions (columns), not groups or rows
        c_f = tl.zeros([1], tl.int32)  # the open run's merged moments, carried between chunks
        c_n = tl.zeros([1], tl.float64)
        c_mean = tl.zeros([1], tl.float64)
        c_m2 = tl.zeros([1], tl.float64)
        nonzero = tl.zeros([CHUNK], tl.float64)  # GPG
        b_n = tl.zeros([1], tl.float64)  # the batch's moments (BATCH)
        b_mean = tl.zeros([1], tl.float64)
        b_m2 = tl.zeros([1], tl.float64)
        c_head = tl.zeros([1], tl.int64)  # the sorted position of the open run's head
        for p0 in range(0, b, CHUNK):  # walk 1: each group's statistics at its head
            pos = p0 + lanes
            inside = pos < b
            r, _, head, end = _sorted_member(
                ids_ptr, perm_ptr, r_ptr + k, cols, pos, inside, b, G, CONTIGUOUS
            )
            bad += tl.where(inside & ((r - r) != 0), 1.0, 0.0)
            x = r.to(tl.float64)
            f, n, mean, m2 = tl.associative_scan(
                (head.to(tl.int32), tl.where(inside, 1.0, 0.0).to(tl.float64), x, zero), 0, _segment_combine
            )
            f, n, mean, m2 = _segment_combine(c_f, c_n, c_mean, c_m2, f, n, mean, m2)
            head_pos = _head_positions(head, pos, c_head)
            c_head = tl.max(head_pos, axis=0, keep_dims=True)
            tl.store(stats_ptr + head_pos, n, mask=end)
            tl.store(stats_ptr + b + head_pos, mean, mask=end)
            tl.store(stats_ptr + 2 * b + head_pos, m2, mask=end)
            keep = lanes == tl.minimum(b - p0, CHUNK) - 1  # the chunk's last element carries into the next
            c_f = tl.sum(tl.where(keep, f, 0), axis=0, keep_dims=True)
            c_n = tl.sum(tl.where(keep, n, 0.0), axis=0, keep_dims=True)
            c_mean = tl.sum(tl.where(keep, mean, 0.0), axis=0, keep_dims=True)
            c_m2 = tl.sum(tl.where(keep, m2, 0.0), axis=0, keep_dims=True)
            if MODE == GPG:
                nonzero += tl.where(inside & (x != 0), 1.0, 0.0)
            if MODE == BATCH:
                cn, cmean, cm2 = _block_moments(x, inside)
                b_n, b_mean, b_m2 = _merge(b_n, b_mean, b_m2, cn, cmean, cm2)
        bstd = tl.sum(tl.where(b_n > 1, tl.sqrt(b_m2 / tl.maximum(b_n - 1, 1.0)), 1.0), axis=0).to(ACC)
        if MODE == GPG:  # eps carries B / f_norm
            bstd = (float_arg(eps, tl.float64) / tl.maximum(tl.sum(nonzero, axis=0), 1.0)).to(ACC)
        if WEIGHTED:
            weight = tl.load(w_ptr + k).to(ACC)
        else:
            weight = 1.0
        tl.debug_barrier()  # walk 1's stores, made by other threads of this program, are read below
        c_head = tl.zeros([1], tl.int64)
        for p0 in range(0, b, CHUNK):  # walk 2: the advantages (the weighted sum over the columns)
            pos = p0 + lanes
            inside = pos < b
            r, idx, head, _ = _sorted_member(
                ids_ptr, perm_ptr, r_ptr + k, cols, pos, inside, b, G, CONTIGUOUS
            )
            head_pos = _head_positions(head, pos, c_head)
            c_head = tl.max(head_pos, axis=0, keep_dims=True)
            n = tl.load(stats_ptr + head_pos, mask=inside, other=1.0)
            mean = tl.load(stats_ptr + b + head_pos, mask=inside, other=0.0)
            m2 = tl.load(stats_ptr + 2 * b + head_pos, mask=inside, other=0.0)
            out = group_advantage(r, n.to(ACC), mean.to(ACC), m2.to(ACC), acc_eps, bstd, MODE, SINGLES_ZERO)
            if WEIGHTED:
                out = weight * out
            if k > 0:  # the sum so far, as the reference adds a column's term to it
                out = tl.load(out_ptr + idx, mask=inside, other=0.0).to(ACC) + out
            tl.store(out_ptr + idx, out.to(out_ptr.dtype.element_ty), mask=inside)
        tl.debug_barrier()  # walk 2 read the statistics the next column's walk 1 overwrites
    return tl.sum(bad, axis=0)


@triton.jit
def _sorted_kernel(
    r_ptr,  # [B, cols] rewards, a column per reward function (row stride cols)
    w_ptr,  # [cols] the columns' weights (WEIGHTED)
    ids_ptr,  # [B] sorted group ids (not CONTIGUOUS)
    perm_ptr,  # [B] int64 their original indices (not CONTIGUOUS)
    stats_ptr,  # [3, B] fp64 scratch: (count, mean, m2) of each group at its head's sorted position
    out_ptr,  # [B] advantages: Σ_k w_k adv(column k) (RENORM: then normalized over the batch)
    ok_ptr,  # [] bool: every reward finite
    b,
    G,  # the group size (CONTIGUOUS)
    cols,
    eps: tl.float64,
    MODE: tl.constexpr,
    SINGLES_ZERO: tl.constexpr,  # as _contiguous_kernel's
    CONTIGUOUS: tl.constexpr,
    WEIGHTED: tl.constexpr,
    RENORM: tl.constexpr,  # TRL's normalize_then_sum: the sum normalized as one group ("grpo"), singles 0
    ACC: tl.constexpr,
    CHUNK: tl.constexpr,  # rewards per step of the walk (_sorted_chunk)
    CHECK_MSG: tl.constexpr,  # the device assert's message, or None (_device_assert)
):
    """One program: the sorted walk of the module docstring (grid (1,)), once per column."""
    bad = _sorted_columns(
        r_ptr, w_ptr, ids_ptr, perm_ptr, stats_ptr, out_ptr, b, G, cols, eps,
        MODE, SINGLES_ZERO, CONTIGUOUS, WEIGHTED, ACC, CHUNK,
    )  # fmt: skip
    require(bad == 0, CHECK_MSG)
    tl.store(ok_ptr, bad == 0)
    if RENORM:
        _renormalize(
            out_ptr, ids_ptr, perm_ptr, stats_ptr, b, G, float_arg(eps, ACC), SINGLES_ZERO, CONTIGUOUS, ACC,
            CHUNK,
        )  # fmt: skip


@triton.jit
def _whitened_sorted_kernel(
    r_ptr,  # [B, cols] rewards, as _sorted_kernel's
    w_ptr,  # [cols] (WEIGHTED)
    ids_ptr,  # [B] sorted group ids
    perm_ptr,  # [B] int64 their original indices
    stats_ptr,  # [3, B] fp64 scratch (_sorted_kernel's)
    out_ptr,  # [B] advantages Σ_k w_k adv(column k), ACC
    m_ptr,  # [B, T] response mask: bool, integer (0 / 1) or float weights
    part_ptr,  # [B, 4] ACC scratch: each mask row's moments (mask_rows.py)
    white_ptr,  # [cdiv(B, FINISH_ROWS), 4] ACC scratch: each block of rows' moments of adv[b] * m
    counter_ptr,  # [1] int32, zero (_finish.launch_counter)
    coef_ptr,  # [2] ACC: verl masked_whiten's (mean, rstd) of adv[b] * m[b, t] weighted by m
    ok_ptr,  # [] bool: every reward finite and every mask value valid
    b,
    T,
    cols,
    eps: tl.float64,  # the groups' std eps
    whiten_eps: tl.float64,  # the whitening's (WHITEN_EPS)
    MODE: tl.constexpr,
    SINGLES_ZERO: tl.constexpr,
    WEIGHTED: tl.constexpr,
    MASK_KIND: tl.constexpr,
    ACC: tl.constexpr,
    CHUNK: tl.constexpr,
    ROW_BLOCK: tl.constexpr,  # mask_rows.row_block
    CHECK_MSG: tl.constexpr,  # the device assert's message on the rewards, or None (_device_assert)
    MASK_MSG: tl.constexpr,  # and on the mask's values
):
    """Grid (B,): program p publishes mask row p's moments; the last program to finish walks the sorted
    rewards (_sorted_kernel's walk), then merges the rows' moments of x = adv[b] * m weighted by m into the
    whitening coefficients (gae.py finish_whiten): the group pass and the whitening statistics in one
    launch, before the tokens'."""
    publish_row_moments(m_ptr, part_ptr, tl.program_id(0), T, MASK_KIND, ACC, ROW_BLOCK)
    if last_program(counter_ptr, tl.num_programs(0)):
        bad = _sorted_columns(
            r_ptr, w_ptr, ids_ptr, perm_ptr, stats_ptr, out_ptr, b, 1, cols, eps,
            MODE, SINGLES_ZERO, False, WEIGHTED, ACC, CHUNK,
        )  # fmt: skip
        require(bad == 0, CHECK_MSG)
        tl.debug_barrier()  # the advantages, stored by other threads of this program, are read below
        lanes = tl.arange(0, FINISH_ROWS)
        part_cols = tl.arange(0, ROW_PARTS)  # (`cols` is the reward columns' count)
        for r0 in range(0, b, FINISH_ROWS):  # as the chunk path's writing launch, a block of rows a part
            idx = r0 + lanes
            inside = idx < b
            a = tl.load(out_ptr + idx, mask=inside, other=0.0).to(ACC)
            part = whitening_part(a, part_ptr + idx * ROW_PARTS, inside)
            white = white_ptr + (r0 // FINISH_ROWS) * ROW_PARTS + part_cols
            publish(white, part.to(ACC), part_cols < ROW_PARTS)
        ok = finish_whiten(white_ptr, tl.cdiv(b, FINISH_ROWS), coef_ptr, float_arg(whiten_eps, ACC), ACC)
        require(ok, MASK_MSG)
        tl.store(ok_ptr, ok & (bad == 0))


@triton.jit
def _renormalize(
    out_ptr,
    ids_ptr,
    perm_ptr,
    stats_ptr,
    b,
    G,
    eps,
    SINGLES_ZERO: tl.constexpr,
    CONTIGUOUS: tl.constexpr,
    ACC: tl.constexpr,
    CHUNK: tl.constexpr,
):
    """TRL's normalize_then_sum after the sum: out [B] normalized as one group, (x - mean) / (std + eps) in
    "grpo"'s rule (moments merged in fp64), then, SINGLES_ZERO, a group of one (its count at its head in
    stats, from the walks) set to 0."""
    lanes = tl.arange(0, CHUNK)
    b_n = tl.zeros([1], tl.float64)
    b_mean = tl.zeros([1], tl.float64)
    b_m2 = tl.zeros([1], tl.float64)
    for p0 in range(0, b, CHUNK):  # walk 3: the sum's moments (index order)
        pos = p0 + lanes
        inside = pos < b
        cn, cmean, cm2 = _block_moments(tl.load(out_ptr + pos, mask=inside, other=0.0).to(tl.float64), inside)
        b_n, b_mean, b_m2 = _merge(b_n, b_mean, b_m2, cn, cmean, cm2)
    mean = tl.sum(b_mean, axis=0).to(ACC)
    m2 = tl.sum(b_m2, axis=0).to(ACC)
    tl.debug_barrier()  # walk 3 read what walk 4 overwrites
    c_head = tl.zeros([1], tl.int64)
    for p0 in range(0, b, CHUNK):  # walk 4: normalized (sorted order: each response's group count)
        pos = p0 + lanes
        inside = pos < b
        x, idx, head, _ = _sorted_member(ids_ptr, perm_ptr, out_ptr, 1, pos, inside, b, G, CONTIGUOUS)
        head_pos = _head_positions(head, pos, c_head)
        c_head = tl.max(head_pos, axis=0, keep_dims=True)
        n = tl.load(stats_ptr + head_pos, mask=inside, other=1.0)
        nb = tl.zeros([CHUNK], ACC) + b
        y = group_advantage(x, nb, mean, m2, eps, 1.0, GRPO, False)
        if SINGLES_ZERO:
            y = tl.where(n > 1.0, y, 0.0)
        tl.store(out_ptr + idx, y.to(out_ptr.dtype.element_ty), mask=inside)


# Columns of each chunk's partials in the chunk-parallel sorted path (published, fp64): the chunk's total as a
# segmented-scan element (has a head, count, mean, m2, its last head or -1), its leading run (the positions
# before its first head: count, mean, m2, whether that run ends in the chunk), its bad rewards, all its
# rewards' moments (BATCH) and its nonzero rewards (GPG).
CHUNK_PARTS = tl.constexpr(16)
TOT_F, TOT_N, TOT_MEAN, TOT_M2, TOT_H = (tl.constexpr(c) for c in range(5))
LEAD_N, LEAD_MEAN, LEAD_M2, LEAD_ENDS = (tl.constexpr(c) for c in range(5, 9))
BAD, ALL_N, ALL_MEAN, ALL_M2, NONZERO = (tl.constexpr(c) for c in range(9, 14))


@triton.jit
def _chunk_scan_kernel(
    r_ptr,  # [B] rewards, `stride` apart (a column of the reward columns' sum)
    stride,
    ids_ptr,  # [B] sorted group ids (not CONTIGUOUS)
    perm_ptr,  # [B] int64 their original indices (not CONTIGUOUS)
    G,  # the group size (CONTIGUOUS)
    stats_ptr,  # [3, B] fp64: (count, mean, m2) of each group at its head's sorted position
    head_ptr,  # [B] int64: each sorted position's head if it lies in the same chunk, else -1
    part_ptr,  # [chunks, CHUNK_PARTS] fp64 (see CHUNK_PARTS)
    open_ptr,  # [chunks] int64: the head of the run open at each chunk's start (-1: none)
    coef_ptr,  # [1] fp64: the batch statistic of BATCH / GPG
    counter_ptr,  # [1] int32, zero (_finish.launch_counter)
    ok_ptr,  # [] bool: every reward finite
    m_ptr,  # [B, T] response mask (ROWS)
    rows_ptr,  # [B, 4] ACC: each mask row's moments (ROWS; mask_rows.publish_row_moments)
    b,
    T,
    chunks,  # the programs of the scan; ROWS: a program per mask row after them
    eps: tl.float64,
    MODE: tl.constexpr,
    AND_OK: tl.constexpr,  # a later column of the sum: ok_ptr already holds the columns' before
    CONTIGUOUS: tl.constexpr,  # groups of G in index order (no ids)
    ROWS: tl.constexpr,  # the whitening's mask rows too (whitened_group_tokens_forward, the first column)
    MASK_KIND: tl.constexpr,
    ACC: tl.constexpr,
    CHUNK: tl.constexpr,
    FINISH: tl.constexpr,  # chunks the last program takes at a time
    ROW_BLOCK: tl.constexpr,
    CHECK_MSG: tl.constexpr,  # the device assert's message, or None (_device_assert)
):
    """A program per chunk of CHUNK sorted positions: the sorted walk's segmented scan of its chunk with
    nothing carried in. A run that starts and ends in the chunk gets its statistics here; the chunk publishes
    its total and its leading run, and the last program scans the chunks' totals (the carry each chunk lacked)
    and finishes every run that began in an earlier chunk (grid (chunks,); ROWS: then a program per mask
    row, for the last column's writing launch)."""
    pid = tl.program_id(0)
    mask_row = False  # without ROWS no program is a mask row's, and none of their code is compiled
    if ROWS:
        mask_row = pid >= chunks
    if mask_row:
        publish_row_moments(m_ptr, rows_ptr, pid - chunks, T, MASK_KIND, ACC, ROW_BLOCK)
    else:
        _chunk_scan(
            r_ptr, stride, ids_ptr, perm_ptr, G, stats_ptr, head_ptr, part_ptr, open_ptr, coef_ptr,
            counter_ptr, ok_ptr, b, chunks, eps, MODE, AND_OK, CONTIGUOUS, CHUNK, FINISH, CHECK_MSG,
        )  # fmt: skip


@triton.jit
def _chunk_scan(
    r_ptr, stride, ids_ptr, perm_ptr, G, stats_ptr, head_ptr, part_ptr, open_ptr, coef_ptr, counter_ptr,
    ok_ptr, b, chunks, eps,
    MODE: tl.constexpr,
    AND_OK: tl.constexpr,
    CONTIGUOUS: tl.constexpr,
    CHUNK: tl.constexpr,
    FINISH: tl.constexpr,
    CHECK_MSG: tl.constexpr,
):  # fmt: skip
    """_chunk_scan_kernel's work in a chunk's program."""
    pid = tl.program_id(0)
    lanes = tl.arange(0, CHUNK)
    pos = pid.to(tl.int64) * CHUNK + lanes
    inside = pos < b
    r, _, head, end = _sorted_member(ids_ptr, perm_ptr, r_ptr, stride, pos, inside, b, G, CONTIGUOUS)
    x = r.to(tl.float64)
    ones = tl.where(inside, 1.0, 0.0).to(tl.float64)
    f, n, mean, m2 = tl.associative_scan(
        (head.to(tl.int32), ones, x, tl.zeros([CHUNK], tl.float64)), 0, _segment_combine
    )
    head_pos = _head_positions(head, pos, tl.full([1], -1, tl.int64))
    tl.store(head_ptr + pos, head_pos, mask=inside)
    local = end & (head_pos >= 0)  # a run that started in this chunk ends here: its statistics are whole
    tl.store(stats_ptr + head_pos, n, mask=local)
    tl.store(stats_ptr + b + head_pos, mean, mask=local)
    tl.store(stats_ptr + 2 * b + head_pos, m2, mask=local)
    last = lanes == tl.minimum(b - pid.to(tl.int64) * CHUNK, CHUNK) - 1
    lead_len = tl.sum(tl.where(inside & (head_pos < 0), 1, 0), axis=0)
    lead_last = lanes == lead_len - 1
    all_n, all_mean, all_m2 = _block_moments(x, inside)
    cols = tl.arange(0, CHUNK_PARTS)
    vals = tl.zeros([CHUNK_PARTS], tl.float64)
    vals = tl.where(cols == TOT_F, tl.sum(tl.where(last, f, 0), axis=0).to(tl.float64), vals)
    vals = tl.where(cols == TOT_N, tl.sum(tl.where(last, n, 0.0), axis=0), vals)
    vals = tl.where(cols == TOT_MEAN, tl.sum(tl.where(last, mean, 0.0), axis=0), vals)
    vals = tl.where(cols == TOT_M2, tl.sum(tl.where(last, m2, 0.0), axis=0), vals)
    vals = tl.where(cols == TOT_H, tl.max(tl.where(inside, head_pos, -1), axis=0).to(tl.float64), vals)
    vals = tl.where(cols == LEAD_N, tl.sum(tl.where(lead_last, n, 0.0), axis=0), vals)
    vals = tl.where(cols == LEAD_MEAN, tl.sum(tl.where(lead_last, mean, 0.0), axis=0), vals)
    vals = tl.where(cols == LEAD_M2, tl.sum(tl.where(lead_last, m2, 0.0), axis=0), vals)
    vals = tl.where(cols == LEAD_ENDS, tl.sum(tl.where(lead_last & end, 1.0, 0.0), axis=0), vals)
    vals = tl.where(cols == BAD, tl.sum(tl.where(inside & ((r - r) != 0), 1.0, 0.0), axis=0), vals)
    vals = tl.where(cols == ALL_N, tl.sum(all_n, axis=0), vals)
    vals = tl.where(cols == ALL_MEAN, tl.sum(all_mean, axis=0), vals)
    vals = tl.where(cols == ALL_M2, tl.sum(all_m2, axis=0), vals)
    vals = tl.where(cols == NONZERO, tl.sum(tl.where(inside & (x != 0), 1.0, 0.0), axis=0), vals)
    publish(part_ptr + pid * CHUNK_PARTS + cols, vals, cols < CHUNK_PARTS)
    if last_program(counter_ptr, chunks):
        _finish_chunks(
            part_ptr, stats_ptr, open_ptr, coef_ptr, ok_ptr, chunks, b, eps, MODE, AND_OK, FINISH, CHECK_MSG
        )


@triton.jit
def _part(part_ptr, idx, inside, col, other):
    return tl.load(part_ptr + idx * CHUNK_PARTS + col, mask=inside, other=other, volatile=True)


@triton.jit
def _finish_chunks(
    part_ptr,
    stats_ptr,
    open_ptr,
    coef_ptr,
    ok_ptr,
    chunks,
    b,
    eps,
    MODE: tl.constexpr,
    AND_OK: tl.constexpr,
    FINISH: tl.constexpr,
    CHECK_MSG: tl.constexpr,
):
    """The chunk-parallel path's last program: each chunk's carry (the segmented scan of the totals of the
    chunks before it, FINISH chunks at a time), the statistics of each run that began before its chunk and
    ends in it, each chunk's open head, the validity flag and the batch statistic (moments merged in chunk
    order)."""
    lanes = tl.arange(0, FINISH)
    c_f = tl.zeros([1], tl.int32)
    c_n = tl.zeros([1], tl.float64)
    c_mean = tl.zeros([1], tl.float64)
    c_m2 = tl.zeros([1], tl.float64)
    c_h = tl.full([1], -1, tl.int64)
    bad = tl.zeros([FINISH], tl.float64)
    nonzero = tl.zeros([FINISH], tl.float64)
    b_n = tl.zeros([1], tl.float64)
    b_mean = tl.zeros([1], tl.float64)
    b_m2 = tl.zeros([1], tl.float64)
    for c0 in range(0, chunks, FINISH):
        idx = c0 + lanes
        inside = idx < chunks
        prev = inside & (idx > 0)  # the chunk before each: its total is the carry's next element
        pf = _part(part_ptr, idx - 1, prev, TOT_F, 0.0).to(tl.int32)
        pn = _part(part_ptr, idx - 1, prev, TOT_N, 0.0)
        pmean = _part(part_ptr, idx - 1, prev, TOT_MEAN, 0.0)
        pm2 = _part(part_ptr, idx - 1, prev, TOT_M2, 0.0)
        ph = _part(part_ptr, idx - 1, prev, TOT_H, -1.0).to(tl.int64)
        f, n, mean, m2 = tl.associative_scan((pf, pn, pmean, pm2), 0, _segment_combine)
        f, n, mean, m2 = _segment_combine(c_f, c_n, c_mean, c_m2, f, n, mean, m2)
        h = tl.maximum(tl.associative_scan(ph, 0, _max_combine), c_h)
        lead_n = _part(part_ptr, idx, inside, LEAD_N, 0.0)
        fn, fmean, fm2 = _merge(
            n,
            mean,
            m2,
            lead_n,
            _part(part_ptr, idx, inside, LEAD_MEAN, 0.0),
            _part(part_ptr, idx, inside, LEAD_M2, 0.0),
        )
        ends = inside & (lead_n > 0) & (_part(part_ptr, idx, inside, LEAD_ENDS, 0.0) != 0)
        tl.store(stats_ptr + h, fn, mask=ends)
        tl.store(stats_ptr + b + h, fmean, mask=ends)
        tl.store(stats_ptr + 2 * b + h, fm2, mask=ends)
        tl.store(open_ptr + idx, h, mask=inside)
        keep = lanes == tl.minimum(chunks - c0, FINISH) - 1
        c_f = tl.sum(tl.where(keep, f, 0), axis=0, keep_dims=True)
        c_n = tl.sum(tl.where(keep, n, 0.0), axis=0, keep_dims=True)
        c_mean = tl.sum(tl.where(keep, mean, 0.0), axis=0, keep_dims=True)
        c_m2 = tl.sum(tl.where(keep, m2, 0.0), axis=0, keep_dims=True)
        c_h = tl.max(tl.where(inside, h, -1), axis=0, keep_dims=True)
        bad += _part(part_ptr, idx, inside, BAD, 0.0)
        nonzero += _part(part_ptr, idx, inside, NONZERO, 0.0)
        if MODE == BATCH:
            tn, tmean, tm2 = _parts_moments(
                _part(part_ptr, idx, inside, ALL_N, 0.0),
                _part(part_ptr, idx, inside, ALL_MEAN, 0.0),
                _part(part_ptr, idx, inside, ALL_M2, 0.0),
                inside,
            )
            b_n, b_mean, b_m2 = _merge(b_n, b_mean, b_m2, tn, tmean, tm2)
    ok = tl.sum(bad, axis=0) == 0
    require(ok, CHECK_MSG)  # this column's rewards (the columns before asserted on theirs)
    if AND_OK:
        ok = ok & tl.load(ok_ptr)
    tl.store(ok_ptr, ok)
    stat = tl.sum(tl.where(b_n > 1, tl.sqrt(b_m2 / tl.maximum(b_n - 1, 1.0)), 1.0), axis=0)
    if MODE == GPG:  # eps carries B / f_norm
        stat = float_arg(eps, tl.float64) / tl.maximum(tl.sum(nonzero, axis=0), 1.0)
    tl.store(coef_ptr, stat)


@triton.jit
def _chunk_write_kernel(
    r_ptr,  # [B] rewards, `stride` apart
    stride,
    w_ptr,  # [cols] the columns' weights (WEIGHTED)
    col,  # the column this launch writes (its weight)
    ids_ptr,  # [B] sorted group ids (not CONTIGUOUS)
    perm_ptr,  # [B] int64 their original indices (not CONTIGUOUS)
    G,  # the group size (CONTIGUOUS)
    stats_ptr,  # [3, B] fp64 (_chunk_scan_kernel)
    head_ptr,  # [B] int64 (_chunk_scan_kernel)
    open_ptr,  # [chunks] int64 (_finish_chunks)
    coef_ptr,  # [3] fp64: the batch statistic (_finish_chunks); MOMENTS: the sums' mean and m2 after it
    part_ptr,  # [chunks, 4] fp64: each chunk's moments of the sums (MOMENTS)
    counter_ptr,  # [1] int32, zero (_finish.launch_counter) (MOMENTS, WHITEN)
    out_ptr,  # [B] advantages (ACCUMULATE: the columns' sum so far, added to)
    rows_ptr,  # [B, 4] ACC: each mask row's (bad, W, r, C) (WHITEN; _chunk_scan_kernel's ROWS)
    white_ptr,  # [chunks, 4] ACC: each chunk's (bad, W, mean, m2) of its rows' A · m (WHITEN)
    whiten_coef_ptr,  # [2] ACC: verl masked_whiten's (mean, rstd) (WHITEN)
    ok_ptr,  # [] bool: AND-ed with every mask value valid (WHITEN)
    b,
    eps: tl.float64,
    whiten_eps: tl.float64,
    MODE: tl.constexpr,
    SINGLES_ZERO: tl.constexpr,
    WEIGHTED: tl.constexpr,
    ACCUMULATE: tl.constexpr,
    MOMENTS: tl.constexpr,  # TRL's batch pass follows: the sums' moments, merged by the last program
    WHITEN: tl.constexpr,  # the last column: verl's whitening statistics of the sums, merged likewise
    CONTIGUOUS: tl.constexpr,
    ACC: tl.constexpr,
    CHUNK: tl.constexpr,
    MASK_MSG: tl.constexpr,  # the device assert's message on the mask's values (WHITEN), or None
):
    """The chunk-parallel path's advantages: each position's group statistics at its head (in its chunk, or
    the chunk's open head); for the reward columns' sum weighted and added to the sum so far, in the
    reference's order (grid (chunks,)). WHITEN: each chunk's moments of A_b · m_bt from its rows' (W, A·r,
    A²·C) (mask_rows.py), merged by the last program into the whitening coefficients."""
    pid = tl.program_id(0)
    pos = pid.to(tl.int64) * CHUNK + tl.arange(0, CHUNK)
    inside = pos < b
    r, idx, _, _ = _sorted_member(ids_ptr, perm_ptr, r_ptr, stride, pos, inside, b, G, CONTIGUOUS)
    h = tl.load(head_ptr + pos, mask=inside, other=0)
    h = tl.where(h < 0, tl.load(open_ptr + pid), h)
    n = tl.load(stats_ptr + h, mask=inside, other=1.0)
    mean = tl.load(stats_ptr + b + h, mask=inside, other=0.0)
    m2 = tl.load(stats_ptr + 2 * b + h, mask=inside, other=0.0)
    stat = tl.load(coef_ptr).to(ACC)
    out = group_advantage(
        r, n.to(ACC), mean.to(ACC), m2.to(ACC), float_arg(eps, ACC), stat, MODE, SINGLES_ZERO
    )
    if WEIGHTED:
        out = tl.load(w_ptr + col).to(ACC) * out
    if ACCUMULATE:
        out = tl.load(out_ptr + idx, mask=inside, other=0.0).to(ACC) + out
    out = out.to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + idx, out, mask=inside)
    if MOMENTS:
        cn, cmean, cm2 = _block_moments(out.to(tl.float64), inside)
        cols = tl.arange(0, 4)
        vals = tl.where(cols == 0, cn, tl.where(cols == 1, cmean, tl.where(cols == 2, cm2, 0.0)))
        publish(part_ptr + pid * 4 + cols, vals, cols < 4)
        chunks = tl.num_programs(0)
        if last_program(counter_ptr, chunks):  # the sums' moments, merged in chunk order
            lanes = tl.arange(0, WALK)
            n_all = tl.zeros([1], tl.float64)
            mean_all = tl.zeros([1], tl.float64)
            m2_all = tl.zeros([1], tl.float64)
            for c0 in range(0, chunks, WALK):
                c = c0 + lanes
                within = c < chunks
                tn, tmean, tm2 = _parts_moments(
                    tl.load(part_ptr + c * 4, mask=within, other=0.0, volatile=True),
                    tl.load(part_ptr + c * 4 + 1, mask=within, other=0.0, volatile=True),
                    tl.load(part_ptr + c * 4 + 2, mask=within, other=0.0, volatile=True),
                    within,
                )
                n_all, mean_all, m2_all = _merge(n_all, mean_all, m2_all, tn, tmean, tm2)
            one = tl.arange(0, 1)
            tl.store(coef_ptr + 1 + one, mean_all)
            tl.store(coef_ptr + 2 + one, m2_all)
    if WHITEN:
        cols = tl.arange(0, ROW_PARTS)
        part = whitening_part(out.to(ACC), rows_ptr + idx * ROW_PARTS, inside)
        publish(white_ptr + pid * ROW_PARTS + cols, part.to(ACC), cols < ROW_PARTS)
        if last_program(counter_ptr, tl.num_programs(0)):
            ok = finish_whiten(
                white_ptr, tl.num_programs(0), whiten_coef_ptr, float_arg(whiten_eps, ACC), ACC
            )
            require(ok, MASK_MSG)
            tl.store(ok_ptr, tl.load(ok_ptr) & ok)


@triton.jit
def _chunk_renormalize_kernel(
    out_ptr,  # [B] the reward columns' sums, normalized in place
    perm_ptr,  # [B] int64 the sorted ids' original indices (not CONTIGUOUS)
    stats_ptr,  # [3, B] fp64 (_chunk_scan_kernel): each group's count at its head
    head_ptr,  # [B] int64 (_chunk_scan_kernel)
    open_ptr,  # [chunks] int64 (_finish_chunks)
    coef_ptr,  # [3] fp64: the sums' mean and m2 at 1 and 2 (_chunk_write_kernel MOMENTS)
    b,
    eps: tl.float64,
    SINGLES_ZERO: tl.constexpr,
    CONTIGUOUS: tl.constexpr,
    ACC: tl.constexpr,
    CHUNK: tl.constexpr,
):
    """TRL's batch pass of normalize_then_sum on the chunk path (as `_renormalize`): the sums as one group
    ("grpo"), a group of one 0 (grid (chunks,))."""
    pid = tl.program_id(0)
    pos = pid.to(tl.int64) * CHUNK + tl.arange(0, CHUNK)
    inside = pos < b
    idx = pos if CONTIGUOUS else tl.load(perm_ptr + pos, mask=inside, other=0)
    h = tl.load(head_ptr + pos, mask=inside, other=0)
    h = tl.where(h < 0, tl.load(open_ptr + pid), h)
    n = tl.load(stats_ptr + h, mask=inside, other=1.0)
    x = tl.load(out_ptr + idx, mask=inside, other=0.0).to(ACC)
    nb = tl.zeros([CHUNK], ACC) + b
    mean = tl.load(coef_ptr + 1).to(ACC)
    m2 = tl.load(coef_ptr + 2).to(ACC)
    y = group_advantage(x, nb, mean, m2, float_arg(eps, ACC), 1.0, GRPO, False)
    if SINGLES_ZERO:
        y = tl.where(n > 1.0, y, 0.0)
    tl.store(out_ptr + idx, y.to(out_ptr.dtype.element_ty), mask=inside)


@triton.jit
def _tokens_kernel(
    adv_ptr,  # [B] per-row values
    m_ptr,  # [B, T] mask: bool, integer (0 / 1) or float weights
    out_ptr,  # [B, T] adv[b] * m[b, t] (WHITEN: (adv[b] * m - mean) * rstd * m)
    coef_ptr,  # [2] ACC: whitening (mean, rstd) (WHITEN)
    part_ptr,  # [grid] ACC: each program's bad mask values (not WHITEN)
    counter_ptr,  # [1] int32, zero (_finish.launch_counter)
    ok_in_ptr,  # [] bool: the flag of the kernel that wrote adv (not WHITEN)
    ok_ptr,  # [] bool: ok_in and every mask value valid (not WHITEN: the moments pass checked them)
    n,
    T,
    WHITEN: tl.constexpr,
    MASK_KIND: tl.constexpr,
    ACC: tl.constexpr,
    BLOCK: tl.constexpr,
    CHECK_MSG: tl.constexpr,  # the device assert's message, or None (_device_assert); unused with WHITEN
):
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = offs < n
    m, bad = load_mask(m_ptr + offs, inside, MASK_KIND, ACC)
    x = to_acc(tl.load(adv_ptr + offs // T, mask=inside, other=0.0)) * m
    if WHITEN:
        x = (x - tl.load(coef_ptr)) * tl.load(coef_ptr + 1) * m
    tl.store(out_ptr + offs, x.to(out_ptr.dtype.element_ty), mask=inside)
    if not WHITEN:
        one = tl.arange(0, 1)
        publish(
            part_ptr + pid + one, tl.sum(tl.where(bad, 1.0, 0.0), axis=0, keep_dims=True).to(ACC), one < 1
        )
        grid = tl.num_programs(0)
        if last_program(counter_ptr, grid):
            lanes = tl.arange(0, WALK)
            total = tl.zeros([WALK], ACC)
            for p0 in range(0, grid, WALK):
                idx = p0 + lanes
                total += tl.load(part_ptr + idx, mask=idx < grid, other=0.0, volatile=True)
            require(tl.sum(total, axis=0) == 0, CHECK_MSG)  # the mask's values
            tl.store(ok_ptr, tl.load(ok_in_ptr) & (tl.sum(total, axis=0) == 0))


def _acc(dtype: torch.dtype):
    acc = acc_dtype(dtype)
    return acc, tl_acc(acc)


def _tile_elements() -> int:
    """Rewards per program of the contiguous kernel: 4096 on a GPU (32 fp32 registers per thread with 4
    warps); the interpreter runs one numpy op per tile, so bigger is faster there."""
    return 1 << 16 if triton_interpreting() else 4096


def _sorted_chunk(b: int) -> int:
    """Rewards per step of the sorted walk: WALK on a GPU. The interpreter runs the walk's segmented scan one
    combine per element of a chunk, in Python, so there a chunk is no wider than the input (at least 16)."""
    return min(WALK.value, max(16, next_pow2(b))) if triton_interpreting() else WALK.value


def _chunk_path(
    s, w, ids, perm, g, out, ok, code, singles_zero, eps, renormalize, acc_tl, whiten=None
) -> None:
    """The chunk-parallel sorted path of scores s [B, cols] (a column: group_advantages; several: the reward
    columns' sum, weights w [cols] or None), groups from the sorted ids and perm, or (ids None) of g in index
    order: per column a scan launch (`_chunk_scan_kernel`, its last program `_finish_chunks`) and a writing
    launch adding the column's advantages to out [B]; with renormalize TRL's batch pass after the last
    (`_chunk_renormalize_kernel`). ok: the flag, AND-ed over the columns. whiten: (mask [B, T], coef [2]):
    the first scan launch also takes the mask rows' moments, the last writing launch the whitening's
    coefficients into coef and the mask's validity into ok (whitened_group_tokens_forward)."""
    b, cols = s.shape
    chunk = _parallel_chunk(b)
    chunks = cdiv(b, chunk)
    stats = s.new_empty((3, b), dtype=torch.float64)  # see the module docstring
    heads, opened = s.new_empty(b, dtype=torch.int64), s.new_empty(chunks, dtype=torch.int64)
    parts = s.new_empty((chunks, CHUNK_PARTS.value), dtype=torch.float64)
    coef = s.new_empty(3, dtype=torch.float64)
    counter = launch_counter(s.device)
    finish = 16 if triton_interpreting() else WALK.value  # the interpreter: the finish's carry, tested
    w_arg = s if w is None else w
    contiguous = ids is None
    ids, perm = (s, s) if contiguous else (ids, perm)  # contiguous: unused
    mask, white_coef = (s, s) if whiten is None else whiten  # no whitening: unused
    t = 0 if whiten is None else mask.shape[1]
    rows = s.new_empty((b, ROW_PARTS.value)) if whiten is not None else s
    white = s.new_empty((chunks, ROW_PARTS.value)) if whiten is not None else s
    checks = check(s, BAD_REWARDS)
    for k in range(cols):  # reward columns, not groups or rows
        column = s[:, k]
        rows_here = whiten is not None and k == 0
        _chunk_scan_kernel[(chunks + (b if rows_here else 0),)](
            column, cols, ids, perm, g, stats, heads, parts, opened, coef, counter, ok, mask, rows, b, t,
            chunks, float(eps), MODE=code, AND_OK=k > 0, CONTIGUOUS=contiguous, ROWS=rows_here,
            MASK_KIND=mask_kind(mask) if whiten is not None else 0, ACC=acc_tl, CHUNK=chunk, FINISH=finish,
            ROW_BLOCK=row_block(max(t, 1)), num_warps=SORTED_WARPS, **checks,
        )  # fmt: skip
        last = k == cols - 1
        mask_checks = check(mask, BAD_TOKEN_MASK if whiten is not None and last else None)
        _chunk_write_kernel[(chunks,)](
            column, cols, w_arg, k, ids, perm, g, stats, heads, opened, coef, parts, counter, out, rows,
            white, white_coef, ok, b, float(eps), WHITEN_EPS, MODE=code, SINGLES_ZERO=singles_zero,
            WEIGHTED=w is not None, ACCUMULATE=k > 0, MOMENTS=renormalize and last,
            WHITEN=whiten is not None and last, CONTIGUOUS=contiguous, ACC=acc_tl, CHUNK=chunk,
            num_warps=SORTED_WARPS, MASK_MSG=mask_checks.pop("CHECK_MSG"), **mask_checks,
        )  # fmt: skip
    if renormalize:
        _chunk_renormalize_kernel[(chunks,)](
            out, perm, stats, heads, opened, coef, b, float(eps), SINGLES_ZERO=singles_zero,
            CONTIGUOUS=contiguous, ACC=acc_tl, CHUNK=chunk, num_warps=SORTED_WARPS,
        )  # fmt: skip


def _parallel_chunk(b: int) -> int | None:
    """The chunk of the chunk-parallel sorted path for b rewards (a program per chunk, two launches), or
    None: the one-program walk, which takes two steps per chunk in one launch, serves a single
    chunk. Under the interpreter chunks of 32, so that the tests' sizes take several."""
    chunk = 32 if triton_interpreting() else WALK.value
    return chunk if b > chunk else None


def group_advantages_forward(
    rewards: torch.Tensor, group_ids: torch.Tensor | None, group_size: int, mode: str, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """rewards [B] -> (advantages [B] in rewards' dtype, ok [] bool: every reward finite), groups from
    group_ids [B] or contiguous group_size. One launch (and torch.sort for group_ids)."""
    dtype = rewards.dtype
    acc, acc_tl = _acc(dtype)
    r = rewards.contiguous()
    b = r.numel()
    out = torch.empty(r.shape, dtype=store_dtype(dtype), device=r.device)
    ok = r.new_empty((), dtype=torch.bool)
    if b == 0:
        return out.to(dtype), torch.ones((), dtype=torch.bool, device=r.device)
    code = group_mode_code(mode)
    code, singles_zero = code % ZERO_SINGLES, code >= ZERO_SINGLES  # the mode, TRL's rule for singles
    if code == GPG.value and group_ids is None:
        raise ValueError("group_advantages_forward: mode gpg takes group_ids")
    if group_ids is None and group_size <= MAX_TILE_GROUP:
        block_n = next(w for w in GROUP_BLOCKS if w >= group_size)
        block_g = max(1, _tile_elements() // block_n)
        num_groups = b // group_size
        grid = cdiv(num_groups, block_g)
        # Tiles past 4096 elements (groups > 4096) spread over more warps to bound registers per thread.
        warps = min(16, max(4, block_g * block_n // 1024))
        _contiguous_kernel[(grid,)](
            r, out, r.new_empty(num_groups if code == BATCH.value else 1, dtype=acc),
            r.new_empty((grid, 4), dtype=acc), launch_counter(r.device), ok, num_groups, group_size,
            float(eps), MODE=code, SINGLES_ZERO=singles_zero, ACC=acc_tl, BLOCK_G=block_g, BLOCK_N=block_n,
            num_warps=warps, **check(r, BAD_REWARDS),
        )  # fmt: skip
        return out.to(dtype), ok
    _sorted_path(r[:, None], None, group_ids, group_size, out, ok, code, singles_zero, eps, False, acc_tl)
    return out.to(dtype), ok


def _sorted_path(s, w, group_ids, group_size, out, ok, code, singles_zero, eps, renormalize, acc_tl) -> None:
    """Scores s [B, cols] (w [cols] or None) into out [B] and ok through the sorted kernels: the ids' stable
    sort (contiguous groups, too wide for a tile or with several columns: none, index order), then past one
    chunk the chunk path (`_chunk_path`), else the one-program walk (`_sorted_kernel`)."""
    b, cols = s.shape
    contiguous = group_ids is None
    ids, perm = (None, None) if contiguous else torch.sort(group_ids, stable=True)
    if _parallel_chunk(b) is not None:
        g = max(group_size, 1)
        _chunk_path(s, w, ids, perm, g, out, ok, code, singles_zero, eps, renormalize, acc_tl)
        return
    ids, perm = (s, s) if contiguous else (ids, perm)  # contiguous: unused
    stats = s.new_empty((3, b), dtype=torch.float64)  # see the module docstring
    _sorted_kernel[(1,)](
        s, s if w is None else w, ids, perm, stats, out, ok, b, max(group_size, 1), cols, float(eps),
        MODE=code, SINGLES_ZERO=singles_zero, CONTIGUOUS=contiguous, WEIGHTED=w is not None,
        RENORM=renormalize, ACC=acc_tl, CHUNK=_sorted_chunk(b), num_warps=SORTED_WARPS,
        **check(s, BAD_REWARDS),
    )  # fmt: skip


def group_advantages_sum_forward(
    scores: torch.Tensor,
    group_ids: torch.Tensor | None,
    group_size: int,
    weights: torch.Tensor | None,
    mode: str,
    eps: float,
    renormalize: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """scores [B, K] float32/float64 (a column per reward function), weights [K] or None (all 1) ->
    (Σ_k w_k group_advantages(scores[:, k]) [B], ok [] bool: every score finite); renormalize: then the sum
    normalized over the batch as one group ("grpo") and, with the mode's "_trl" suffix, a group of one set to
    0 (TRL's normalize_then_sum). Up to one chunk of scores one launch, the sorted walk once per column
    (and torch.sort for group_ids; contiguous groups in index order); past it the chunk path, two launches
    a column (+1 to renormalize)."""
    _, acc_tl = _acc(scores.dtype)
    s = scores.contiguous()
    b, cols = s.shape
    out = torch.empty(b, dtype=scores.dtype, device=s.device)
    ok = s.new_empty((), dtype=torch.bool)
    if b == 0 or cols == 0:
        return out.zero_(), torch.ones((), dtype=torch.bool, device=s.device)
    code = group_mode_code(mode)
    code, singles_zero = code % ZERO_SINGLES, code >= ZERO_SINGLES
    w = None if weights is None else weights.contiguous()
    _sorted_path(s, w, group_ids, group_size, out, ok, code, singles_zero, eps, renormalize, acc_tl)
    return out, ok


def tokens_forward(
    adv: torch.Tensor, mask: torch.Tensor, ok: torch.Tensor, coef: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """adv [B], mask [B, T] (bool, integer or float), ok [] bool -> (adv[:, None] * mask [B, T] in adv's
    dtype, ok and every mask value valid). One launch. coef: verl's whitening (mean, rstd) [2] from the group
    pass, which checked the mask's values into ok (`whitened_group_tokens_forward`): (adv[:, None] * mask -
    mean) * rstd * mask, and ok as it is."""
    m = mask.contiguous()
    out = torch.empty(m.shape, dtype=store_dtype(adv.dtype), device=adv.device)
    n = out.numel()
    if n == 0:
        return out.to(adv.dtype), ok
    acc, acc_tl = _acc(adv.dtype)
    a = adv.contiguous()
    block = elementwise_block(n)
    grid = cdiv(n, block)
    whiten = coef is not None
    ok_out = ok if whiten else ok.new_empty(())
    parts = coef if whiten else adv.new_empty(grid, dtype=acc)
    _tokens_kernel[(grid,)](
        a, m, out, parts, parts, launch_counter(adv.device), ok, ok_out, n, m.shape[1], WHITEN=whiten,
        MASK_KIND=mask_kind(m), ACC=acc_tl, BLOCK=block, **check(m, None if whiten else BAD_TOKEN_MASK),
    )  # fmt: skip
    return out.to(adv.dtype), ok_out


def whitened_group_tokens_forward(
    scores: torch.Tensor,
    group_ids: torch.Tensor,
    weights: torch.Tensor | None,
    mode: str,
    eps: float,
    mask: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """verl's masked whitening of group advantages (reinforce_plus_plus_baseline, gdpo): scores [B, K]
    float32/float64, group ids [B], weights [K] or None, mask [B, T] (bool, integer or float weights) ->
    (masked_whiten(A[:, None] * mask, mask) * mask [B, T] in scores' dtype with A = Σ_k w_k
    group_advantages(scores[:, k]), ok [] bool: every score finite and every mask value valid).
    torch.sort, then two launches: the group walk with the mask rows' moments and the whitening statistics
    (`_whitened_sorted_kernel`), the tokens. Past one chunk of responses the chunk path (`_chunk_path`), its
    first launch with the mask rows' moments and its last with the whitening statistics, then the tokens."""
    _, acc_tl = _acc(scores.dtype)
    s, m = scores.contiguous(), mask.contiguous()
    b, cols = s.shape
    code = group_mode_code(mode)
    code, singles_zero = code % ZERO_SINGLES, code >= ZERO_SINGLES
    w = None if weights is None else weights.contiguous()
    adv = torch.empty(b, dtype=s.dtype, device=s.device)
    ok = s.new_empty((), dtype=torch.bool)
    if b == 0 or cols == 0:
        return torch.zeros(m.shape, dtype=s.dtype, device=s.device), torch.ones(
            (), dtype=torch.bool, device=s.device
        )
    ids, perm = torch.sort(group_ids, stable=True)
    coef = s.new_empty(2)
    if _parallel_chunk(b) is not None:
        _chunk_path(s, w, ids, perm, 1, adv, ok, code, singles_zero, eps, False, acc_tl, whiten=(m, coef))
        return tokens_forward(adv, m, ok, coef=coef)
    checks = check(s, BAD_REWARDS)
    _whitened_sorted_kernel[(b,)](
        s, s if w is None else w, ids, perm, s.new_empty((3, b), dtype=torch.float64), adv, m,
        s.new_empty((b, ROW_PARTS.value)), s.new_empty((cdiv(b, FINISH_ROWS.value), ROW_PARTS.value)),
        launch_counter(s.device), coef, ok, b, m.shape[1], cols,
        float(eps), WHITEN_EPS, MODE=code, SINGLES_ZERO=singles_zero, WEIGHTED=w is not None,
        MASK_KIND=mask_kind(m), ACC=acc_tl, CHUNK=_sorted_chunk(b), ROW_BLOCK=row_block(max(m.shape[1], 1)),
        num_warps=SORTED_WARPS,
        MASK_MSG=BAD_TOKEN_MASK if checks["CHECK_MSG"] is not None else None, **checks,
    )  # fmt: skip
    return tokens_forward(adv, m, ok, coef=coef)


def compile_cases():
    """Every mode x dtype x group width of the one-tile kernel (covering design plus every dtype x width at
    the heaviest mode), the sorted walk (group ids, groups wider than a tile), size classes, and the token
    broadcast per mask kind (rlkernels/triton/_specializations.py)."""
    rows = covering(
        features={
            "mode": (*GROUP_MODE_CODES, "grpo_trl", "dr_grpo_trl", "batch_trl"),
            "path": ("tile", "ids", "wide"),
            "size": ("aligned", "odd"),
            "dtype": FLOAT_DTYPES,
        },
        resources={"dtype": FLOAT_DTYPES, "width": GROUP_BLOCKS},
        heaviest={"mode": "batch", "path": "tile", "size": "odd"},
    )
    for row, _ in rows:
        if row["mode"] == "gpg":  # gpg_advantages' mode takes group ids
            row = {**row, "path": "ids"}
        width = row["width"]
        # A group of `width`, or of one less (odd; padded to `width`); 64 groups (odd: 63).
        group = width - 1 if row["size"] == "odd" else width
        if row["path"] == "wide":
            group = MAX_TILE_GROUP + 1
        groups = 63 if row["size"] == "odd" else 64
        rewards = meta(group * groups, dtype=row["dtype"])
        ids = meta(group * groups, dtype=torch.int64) if row["path"] == "ids" else None
        label = ",".join(str(v) for v in row.values()).replace("torch.", "")
        yield CompileCase(
            f"group_advantages_forward[{label}]",
            functools.partial(group_advantages_forward, rewards, ids, group, row["mode"], 1e-6),
        )
    for dtype in FLOAT_DTYPES:  # the chunk-parallel sorted path (ids, more than one chunk)
        for mode in ("grpo", "batch", "gpg", "rloo_trl"):
            yield CompileCase(
                f"group_advantages_forward[chunks,{mode},{dtype}]".replace("torch.", ""),
                functools.partial(
                    group_advantages_forward,
                    meta(5000, dtype=dtype),
                    meta(5000, dtype=torch.int64),
                    0,
                    mode,
                    1e-6,
                ),
            )
    for dtype in (torch.float32, torch.float64):  # the reward columns' sum (gdpo, TRL's normalize_then_sum)
        for path, mode, renormalize, b in (
            ("ids", "grpo", False, 4097),  # the chunk path
            ("ids", "grpo_trl", True, 4097),
            ("ids", "grpo_trl", True, 1000),  # the walk (one chunk)
            ("tile", "dr_grpo", False, 4097),  # contiguous groups: the chunk path in index order
            ("tile", "grpo_trl", True, 4097),
            ("tile", "dr_grpo", False, 1000),  # contiguous groups: the walk
        ):
            ids = meta(b, dtype=torch.int64) if path == "ids" else None
            label = f"{path},{mode},{'renormalize' if renormalize else 'sum'},{b},{dtype}".replace(
                "torch.", ""
            )
            yield CompileCase(
                f"group_advantages_sum_forward[{label}]",
                functools.partial(
                    group_advantages_sum_forward, meta(b, 3, dtype=dtype), ids, 0 if ids is not None else 17,
                    meta(3, dtype=dtype), mode, 1e-6, renormalize,
                ),
            )  # fmt: skip
    for dtype in FLOAT_DTYPES:
        for kind, mask_dtype in (("bool", torch.bool), ("int", torch.int64), ("float", dtype)):
            for whiten in (False, True):
                label = f"{kind},{dtype},{'whiten' if whiten else 'plain'}".replace("torch.", "")
                coef = meta(2, dtype=_acc(dtype)[0]) if whiten else None
                yield CompileCase(
                    f"tokens_forward[{label}]",
                    functools.partial(
                        tokens_forward, meta(64, dtype=dtype), meta(64, 1001, dtype=mask_dtype),
                        meta(dtype=torch.bool), coef,
                    ),
                )  # fmt: skip
    for dtype in (torch.float32, torch.float64):  # verl's whitening of the group advantages
        for kind, mask_dtype in (("bool", torch.bool), ("int", torch.int64), ("float", dtype)):
            for mode, weights in (("dr_grpo", None), ("grpo", meta(2, dtype=dtype))):
                cols = 1 if weights is None else 2
                for b in (1000, 4097):  # the walk, the chunk path
                    label = f"{kind},{mode},{dtype},{b}".replace("torch.", "")
                    yield CompileCase(
                        f"whitened_group_tokens_forward[{label}]",
                        functools.partial(
                            whitened_group_tokens_forward, meta(b, cols, dtype=dtype),
                            meta(b, dtype=torch.int64), weights, mode, 1e-6,
                            meta(b, 4096, dtype=mask_dtype),  # rows of 2048-position blocks
                        ),
                    )  # fmt: skip
