"""linear_logprobs on a GPU as cuBLAS GEMMs with Triton epilogues (docs/gpu_linear.md): the GEMMs run at
cuBLAS speed, and each logits block stays small enough to live in the GPU's L2 cache between the GEMM that
writes it and the epilogue that reads it, so nothing of size [N, V] exists and the logits do not round
trip through memory.

Forward: for each block of R rows and each vocabulary slice of C columns, z = h_block @ W_sliceᵀ in fp32
(cuBLAS; 16-bit operands accumulate in fp32) into one [R, C] buffer, then `_block_stats_kernel` reduces it to
the rows' softmax statistics of that slice ((m, s, a[, q]) and the label's logit), the layout of the fused
forward's vocabulary splits; the fused path's `_combine_kernel` merges the slices.

Backward: for each group of G rows, for each vocabulary slice of C_b columns, the rows' softmax gradient
d z [G, C_b] is formed block by block (z recomputed by cuBLAS into the L2 buffer, `_block_dlogits_kernel`
writes d z in the operand dtype), then d weight[slice] (+)= d zᵀ @ hidden[group] (cuBLAS; the first group
writes the slice, each later one adds to it in weight's dtype, rounded once per group) and d hidden[group] +=
d z @ weight[slice] (cuBLAS, into the group's fp32 accumulator, written out in hidden's dtype after its last
slice). The three buffers (the group's fp32 d hidden, d z, the logits block) take WORK_PER_HIDDEN x the bytes
of d hidden, within [WORK_MIN_BYTES, WORK_CAP_BYTES]: no [N, V], no [V, D] and no [N, D] fp32 buffer.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from rlkernels._dtypes import acc_dtype
from rlkernels._gemm import gemm_fp32
from rlkernels.triton import linear_gemm_dlogits
from rlkernels.triton._common import cdiv, float_arg, round_up, store_dtype, tl_acc
from rlkernels.triton._softmax import (
    add_logits_tile,
    dlogits_rows,
    dlogits_store,
    store_split_stats,
    transform_args,
    transform_options,
)
from rlkernels.triton._specializations import CompileCase, covering, meta

# Bytes of the fp32 logits block between a GEMM and its epilogue: small enough to stay in the L2 cache
# (50 MiB on H100 / H200) next to the GEMM's operand panels.
BLOCK_BYTES = 32 << 20
# Rows per forward block (8192 x 1024 columns at BLOCK_BYTES): the statistics epilogue runs one program per
# EPI_ROWS rows, so 8192 rows give it 256 programs for 132 SMs, where 2048 gave 64 and left half the SMs idle
# (the H200 sweep, benchmarks/results/h200/: 1.19x the GEMM floor without a gradient, against 1.49x at 2048).
FORWARD_ROWS = 8192
# The backward's working buffers (a row group's fp32 d hidden, its d z slice, the logits block; a third each)
# at most this many times the bytes of d hidden: Liger's chunked logits take about twice those bytes at every
# shape (its chunk is N·D/V rows of V logits, kept with their gradient), so the path needs no more memory.
WORK_PER_HIDDEN = 1.5
# But never less than this: a logits block under ~32 MiB (8M fp32 outputs, 256 cuBLAS tiles) leaves most of
# the 132 SMs idle in the GEMM that recomputes it; below N·D = 32M (N = 8192 at D = 4096) the path takes this
# much, more than Liger's there (docs/gpu_linear.md, "Memory").
WORK_MIN_BYTES = 96 << 20
# And at most this many bytes: more rows than that fits take more row groups, each one more pass of d weight's
# read-modify-write (a fraction FLOPs / (2·G·HBM bytes/s) of the GEMMs' time: about 1% with G = 8192 rows).
WORK_CAP_BYTES = 384 << 20
# Fewest columns per slice: keeps the slice GEMMs wide enough for the tensor cores.
MIN_COLS = 1024
# The epilogues' tiles: rows x columns per step, over 8 warps (16 values per thread: no spills with every
# option on); fp64 (gradchecks, not speed) a quarter of the columns.
EPI_ROWS, EPI_COLS, EPI_WARPS = 32, 128, 8
# Column tiles each statistics program has in flight: Triton pipelines its column loop's loads (cp.async into
# shared memory), two tiles on their way while one is reduced. A block's column tile (8192 rows x 128 fp32
# columns, 4 MiB) spread over 132 SMs is 32 KB an SM, whatever the programs' shape; a loop that loads as it
# reduces has only that in flight, and only while it loads (the 2026-11-27 sweep: 2.1 TB/s at every shape).
EPI_STAGES = 3
# Column tiles each d logits program loops over, the loop's loads pipelined as the statistics epilogue's
# (EPI_STAGES): a program per tile had one tile in flight (the 2026-11-27 kernel times: 2.95 TB/s). 8 tiles
# (1024 columns) give the backward's 1024 x 8192 blocks (D=4096) 256 programs, about two an SM.
DLOGITS_TILES = 8
# The epilogues' extra launch options. {}: Triton's default, which under 3.6 contracts a product and the add
# after it into one fma (z - m in the statistics, z - LSE in d logits: both kernels alike, so consistent);
# `_softmax.UNFUSED` would round each product, as logprobs_from_logits' kernels must (docs/semantics.md, "The
# saved LSE"). `benchmarks/linear_blocked_sweep.py` times both ("epi unfused") for the next GPU run.
EPI_LAUNCH: dict = {}


def _epi_cols(acc: torch.dtype) -> int:
    return EPI_COLS // 4 if acc == torch.float64 else EPI_COLS


# Row stride of the d z slice buffers (here and in the fused path's backward), a multiple of this many
# elements: rows start 32-128 B aligned for any slice width (an odd vocabulary such as 50257), so that the
# tensor-core loads of the GEMMs reading them stay vectorized (unaligned rows made every tile of the fused
# d hidden GEMM spill hundreds of bytes per thread).
DZ_ROW_ALIGN = 16


# Where the Triton flavor's linear_logprobs runs as cuBLAS GEMMs + these epilogues: on a GPU (its GEMMs then
# run at cuBLAS speed); on CPU tensors (Triton's interpreter) the fused kernels, unless a test asks for this
# path to check it (tests/test_linear_blocked.py).
USE_ON = {"cuda": True, "cpu": False}


def used(device: torch.device) -> bool:
    return USE_ON.get(device.type, False)


@triton.jit
def _block_tile(z_ptr, local, row_mask, ldz, c0, v0, C, ACC: tl.constexpr, BLOCK_V: tl.constexpr):
    """Columns [c0, c0 + BLOCK_V) of the block's rows `local`: (block columns, vocabulary columns, column
    mask, the logits in ACC)."""
    offs = c0 + tl.arange(0, BLOCK_V)
    col_mask = offs < C
    x = tl.load(
        z_ptr + local[:, None] * ldz + offs[None, :], mask=row_mask[:, None] & col_mask[None, :], other=0.0
    ).to(ACC)
    return offs, v0 + offs, col_mask, x


@triton.jit
def _block_stats_kernel(
    z_ptr,  # [R, C] ACC logits block, row stride ldz
    bias_ptr,  # [V] (unused without HAS_BIAS)
    labels_ptr,  # [N]
    part_ptr,  # [3 + SUM_SQ, num_splits, N] ACC: (m, s, a[, q]) per slice
    target_ptr,  # [N] ACC: transformed logit of the label, from the slice that holds it
    N,
    r0,
    R,
    v0,
    C,
    ldz,
    split,
    num_splits,
    ignore_index,
    inv_temp: tl.float64,
    cap: tl.float64,
    inv_cap: tl.float64,
    HAS_BIAS: tl.constexpr,
    SOFTCAP: tl.constexpr,
    ENTROPY: tl.constexpr,
    SUM_SQ: tl.constexpr,
    ACC: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_V: tl.constexpr,
    STAGES: tl.constexpr,  # column tiles in flight (EPI_STAGES)
):
    inv_temp, cap, inv_cap = transform_options(inv_temp, cap, inv_cap, ACC)  # once, not per tile
    local = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_mask = local < R
    rows = r0 + local
    labels = tl.load(labels_ptr + rows, mask=row_mask, other=ignore_index).to(tl.int64)
    live = row_mask & (labels != ignore_index)
    m = tl.full((BLOCK_R,), float("-inf"), ACC)
    s = tl.zeros((BLOCK_R,), ACC)
    a = tl.zeros((BLOCK_R,), ACC)
    q = tl.zeros((BLOCK_R,), ACC)
    z_target = tl.zeros((BLOCK_R,), ACC)
    for c0 in tl.range(0, C, BLOCK_V, num_stages=STAGES):
        offs, cols, col_mask, x = _block_tile(z_ptr, local, row_mask, ldz, c0, v0, C, ACC, BLOCK_V)
        m, s, a, q, z_target = add_logits_tile(
            x, bias_ptr, cols, col_mask, labels, m, s, a, q, z_target, inv_temp, cap, inv_cap, HAS_BIAS,
            SOFTCAP, ENTROPY, SUM_SQ,
        )  # fmt: skip
    store_split_stats(part_ptr, split, rows, row_mask, m, s, a, q, N, num_splits, ENTROPY, SUM_SQ)
    tl.store(target_ptr + rows, z_target, mask=live & (labels >= v0) & (labels < v0 + C))


@triton.jit
def _block_dlogits_kernel(
    z_ptr,  # [R, C] ACC logits block, row stride ldz
    bias_ptr,  # [V] (unused without HAS_BIAS)
    labels_ptr,  # [N]
    lse_ptr,  # [N] float64
    entropy_ptr,  # [N] (unused without ENTROPY)
    g_logp_ptr,  # [N]
    g_ent_ptr,  # [N] (unused without ENTROPY)
    dz_ptr,  # [N, C] slice buffer in the operand dtype, row stride lddz
    db_ptr,  # [V] ACC, atomically accumulated (unused without HAS_DBIAS)
    r0,
    R,
    v0,
    C,
    ldz,
    lddz,
    ignore_index,
    inv_temp: tl.float64,
    cap: tl.float64,
    inv_cap: tl.float64,
    temp_over_cap: tl.float64,
    HAS_BIAS: tl.constexpr,
    HAS_DBIAS: tl.constexpr,
    SOFTCAP: tl.constexpr,
    ENTROPY: tl.constexpr,
    ACC: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_V: tl.constexpr,
    TILES: tl.constexpr,  # column tiles a program loops over (DLOGITS_TILES)
    STAGES: tl.constexpr,  # column tiles in flight (EPI_STAGES)
):
    """d loss / d raw logits of BLOCK_R rows x TILES column tiles of BLOCK_V of the block, from its logits in
    memory (the fused path's _dlogits_kernel epilogue, dlogits_store, on z read instead of recomputed)."""
    inv_temp, cap, inv_cap = transform_options(inv_temp, cap, inv_cap, ACC)  # once, not per tile
    temp_over_cap = float_arg(temp_over_cap, ACC)
    num_col_groups = tl.cdiv(C, BLOCK_V * TILES)
    pid = tl.program_id(0)
    local = (pid // num_col_groups).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    first = (pid % num_col_groups).to(tl.int64) * (BLOCK_V * TILES)
    row_mask = local < R
    rows = r0 + local
    labels, live, g_logp, g_ent, entropy, lse_hi, lse_lo = dlogits_rows(
        labels_ptr, lse_ptr, entropy_ptr, g_logp_ptr, g_ent_ptr, rows, row_mask, ignore_index, ENTROPY
    )
    last = tl.minimum(first + BLOCK_V * TILES, C)
    for c0 in tl.range(first, last, BLOCK_V, num_stages=STAGES):
        offs, cols, col_mask, x = _block_tile(z_ptr, local, row_mask, ldz, c0, v0, C, ACC, BLOCK_V)
        dlogits_store(
            x, bias_ptr, cols, col_mask, row_mask, labels, live, g_logp, g_ent, entropy, lse_hi, lse_lo,
            dz_ptr + rows[:, None] * lddz + offs[None, :], db_ptr, inv_temp, cap, inv_cap, temp_over_cap,
            HAS_BIAS, HAS_DBIAS, SOFTCAP, ENTROPY,
        )  # fmt: skip


def forward_shape(n: int, vocab: int, chunk_size: int | None) -> tuple[int, int]:
    """(rows, columns) of the forward's logits block: FORWARD_ROWS rows (fewer for a smaller batch) and the
    columns BLOCK_BYTES leaves, or chunk_size columns when given."""
    rows = max(1, min(n, FORWARD_ROWS))
    cols = chunk_size if chunk_size is not None else max(MIN_COLS, _aligned(BLOCK_BYTES // (4 * rows)))
    return rows, max(1, min(vocab, cols))


def _aligned(cols: int) -> int:
    """cols rounded down to a multiple of DZ_ROW_ALIGN: the fp32 logits block's rows then start 64-byte
    aligned, as cuBLAS's fast kernels want of the output it writes (an odd width, 7170 columns at D=3584,
    V=152064, came with a backward 4x slower on the H200: benchmarks/results/h200/2026-11-26/)."""
    return max(DZ_ROW_ALIGN, cols - cols % DZ_ROW_ALIGN)


def backward_shape(n: int, vocab: int, d: int, itemsize: int, chunk_size: int | None) -> tuple[int, int, int]:
    """(rows per group, columns per slice, rows per logits block) of the backward: each of the three buffers
    (the group's fp32 d hidden [G, D], d z [G, C] in the operand dtype, the fp32 logits block [R, C]) within a
    third of WORK_PER_HIDDEN x N·D·itemsize, clamped to [WORK_MIN_BYTES, WORK_CAP_BYTES]; the block also
    within BLOCK_BYTES; at least MIN_COLS columns (chunk_size when given)."""
    acc_size = 8 if itemsize == 8 else 4  # the accumulation dtype's (fp64 for fp64 operands, else fp32)
    work = min(max(WORK_PER_HIDDEN * n * d * itemsize, WORK_MIN_BYTES), WORK_CAP_BYTES)
    part = max(1, int(work) // 3)
    group = max(1, min(n, part // (acc_size * d)))
    cols = chunk_size if chunk_size is not None else max(MIN_COLS, _aligned(part // (group * itemsize)))
    cols = max(1, min(vocab, cols))
    rows = max(1, min(group, min(part, BLOCK_BYTES) // (acc_size * cols)))
    return group, cols, rows


def forward_blocks(hidden, weight, labels, bias, part, target, temperature, softcap, ignore_index,
                   return_entropy, return_sum_pi_squared, chunk_size):  # fmt: skip
    """Fill the fused forward's per-slice statistics `part` [3 + SUM_SQ, slices, N] and the label logits
    `target` [N] (the slices: `forward_shape` columns each) with cuBLAS GEMMs and `_block_stats_kernel`."""
    n, d = hidden.shape
    vocab = weight.shape[0]
    acc = acc_dtype(hidden.dtype)
    rows, cols = forward_shape(n, vocab, chunk_size)
    splits = cdiv(vocab, cols)
    z = torch.empty(rows * round_up(cols, DZ_ROW_ALIGN), dtype=acc, device=hidden.device)  # every block's
    inv_temp, cap, inv_cap, _ = transform_args(temperature, softcap)
    flags = dict(
        HAS_BIAS=bias is not None, SOFTCAP=softcap is not None, ENTROPY=return_entropy,
        SUM_SQ=return_sum_pi_squared, ACC=tl_acc(acc), BLOCK_R=EPI_ROWS, BLOCK_V=_epi_cols(acc),
        STAGES=EPI_STAGES, num_warps=EPI_WARPS, **EPI_LAUNCH,
    )  # fmt: skip
    for r0 in range(0, n, rows):
        r = min(rows, n - r0)
        for split in range(splits):
            v0 = split * cols
            c = min(cols, vocab - v0)
            ldz = round_up(c, DZ_ROW_ALIGN)  # aligned rows for an odd last slice too (cuBLAS writes them)
            block = z[: r * ldz].view(r, ldz)[:, :c]
            gemm_fp32(hidden[r0 : r0 + r], weight[v0 : v0 + c].t(), block)
            _block_stats_kernel[(cdiv(r, EPI_ROWS),)](
                block, bias if bias is not None else z, labels, part, target, n, r0, r, v0, c, ldz, split,
                splits, ignore_index, inv_temp, cap, inv_cap, **flags,
            )  # fmt: skip
    return splits


def num_slices(n: int, vocab: int, chunk_size: int | None) -> int:
    """The forward's vocabulary slices (the combine kernel's splits)."""
    return cdiv(vocab, forward_shape(n, vocab, chunk_size)[1])


def backward_blocks(hidden, weight, labels, bias, lse, entropy, g_logp, g_ent, temperature, softcap,
                    ignore_index, need, chunk_size):  # fmt: skip
    """(d hidden [N, D] in hidden's dtype or None, d weight [V, D] in weight's dtype or None, d bias [V] in
    the accumulation dtype or None) with cuBLAS GEMMs and `_block_dlogits_kernel` (`need`: which of the
    three), row group by row group (`backward_shape`)."""
    need_h, need_w, need_b = need
    n, d = hidden.shape
    vocab = weight.shape[0]
    acc = acc_dtype(hidden.dtype)
    dev = hidden.device
    group, cols, rows = backward_shape(n, vocab, d, hidden.element_size(), chunk_size)
    dh = torch.empty((n, d), dtype=hidden.dtype, device=dev) if need_h else None
    # The group's d hidden accumulates in fp32 (fp64): in dh itself when that is hidden's dtype.
    dh_acc = torch.empty((group, d), dtype=acc, device=dev) if need_h and acc != hidden.dtype else None
    gw = torch.empty_like(weight, memory_format=torch.contiguous_format) if need_w else None
    db = torch.zeros(vocab, dtype=acc, device=dev) if need_b else None
    fused = linear_gemm_dlogits.used(hidden, weight, bias)  # the logits never written: no block buffer
    z = None if fused else torch.empty(rows * round_up(cols, DZ_ROW_ALIGN), dtype=acc, device=dev)
    # d z in the operand dtype (the tensor-core operand of the next two GEMMs), rows DZ_ROW_ALIGN-aligned
    # (under the interpreter bf16 is written as fp32 and rounded by torch: store_dtype).
    dz_flat = torch.empty(group * round_up(cols, DZ_ROW_ALIGN), dtype=store_dtype(hidden.dtype), device=dev)
    with_entropy = g_ent is not None
    options = transform_args(temperature, softcap)  # (inv_temp, cap, inv_cap, temp_over_cap)
    flags = dict(
        HAS_BIAS=bias is not None, HAS_DBIAS=need_b, SOFTCAP=softcap is not None, ENTROPY=with_entropy,
        ACC=tl_acc(acc), BLOCK_R=EPI_ROWS, BLOCK_V=_epi_cols(acc), TILES=DLOGITS_TILES, STAGES=EPI_STAGES,
        num_warps=EPI_WARPS, **EPI_LAUNCH,
    )  # fmt: skip
    for g0 in range(0, n, group):
        g = min(group, n - g0)
        h = hidden[g0 : g0 + g]
        # The group's rows of the [N] inputs: views, so the kernel indexes them from the group's first row.
        per_row = [x[g0 : g0 + g] if x is not None else None for x in (labels, lse, entropy, g_logp, g_ent)]
        g_labels, g_lse, g_entropy, g_g_logp, g_g_ent = per_row
        dh_g = None
        if need_h:
            dh_g = dh[g0 : g0 + g] if dh_acc is None else dh_acc[:g]
            dh_g.zero_()
        for v0 in range(0, vocab, cols):
            c = min(cols, vocab - v0)
            w = weight[v0 : v0 + c]
            ldc = round_up(c, DZ_ROW_ALIGN)
            dz = dz_flat[: g * ldc].view(g, ldc)[:, :c]
            if fused:  # the recompute and the d logits epilogue in one GEMM kernel (linear_gemm_dlogits.py)
                linear_gemm_dlogits.dlogits_slice(
                    h, w, v0, g_labels, g_lse, g_entropy, g_g_logp, g_g_ent, dz, temperature, softcap,
                    ignore_index,
                )  # fmt: skip
            else:  # cuBLAS writes each fp32 logits block, `_block_dlogits_kernel` reads it back
                for r0 in range(0, g, rows):
                    r = min(rows, g - r0)
                    block = z[: r * ldc].view(r, ldc)[:, :c]  # aligned rows, as d z's
                    gemm_fp32(h[r0 : r0 + r], w.t(), block)
                    grid = (cdiv(r, EPI_ROWS) * cdiv(c, _epi_cols(acc) * DLOGITS_TILES),)
                    _block_dlogits_kernel[grid](
                        block, bias if bias is not None else z, g_labels, g_lse,
                        g_entropy if with_entropy else g_g_logp, g_g_logp,
                        g_g_ent if with_entropy else g_g_logp, dz, db if need_b else z, r0, r, v0, c, ldc,
                        ldc, ignore_index, *options, **flags,
                    )  # fmt: skip
            dz_op = dz.to(hidden.dtype)  # a no-op on a GPU
            if need_w:
                if g0 == 0:
                    torch.mm(dz_op.t(), h, out=gw[v0 : v0 + c])
                else:  # the later groups add to the slice: one rounding to weight's dtype per group
                    gw[v0 : v0 + c].addmm_(dz_op.t(), h)
            if need_h:
                gemm_fp32(dz_op, w, dh_g, accumulate=True)
        if dh_acc is not None:
            dh[g0 : g0 + g].copy_(dh_g)
    return dh, gw, db


def compile_cases():
    """Both epilogue kernels x float dtype x options (a covering design), at an aligned and an odd block."""
    rows = covering(
        features={
            "dtype": (torch.float32, torch.bfloat16, torch.float16, torch.float64),
            "bias": (False, True),
            "softcap": (False, True),
            "entropy": (False, True),
            "sum_sq": (False, True),
            "size": ((64, 4096), (61, 4001)),
        },
        resources={"dtype": (torch.float32, torch.float64)},
        heaviest={"bias": True, "softcap": True, "entropy": True, "sum_sq": True, "size": (61, 4001)},
    )
    for row, _ in rows:
        dtype, (n, vocab) = row["dtype"], row["size"]
        acc = acc_dtype(dtype)
        hidden, weight = meta(n, 64, dtype=dtype), meta(vocab, 64, dtype=dtype)
        labels = meta(n, dtype=torch.int64)
        bias = meta(vocab, dtype=dtype) if row["bias"] else None
        softcap = 30.0 if row["softcap"] else None
        label = ",".join(str(v) for v in row.values()).replace("torch.", "")
        yield CompileCase(
            f"block_stats[{label}]",
            functools.partial(_compile_forward, hidden, weight, labels, bias, softcap, row, acc),
        )
        yield CompileCase(
            f"block_dlogits[{label}]",
            functools.partial(_compile_backward, hidden, weight, labels, bias, softcap, row, acc),
        )


# The forward's slice width in the compile cases: two slices or more, so that the second launch's split = 1,
# which Triton specializes as a constexpr (a Python int of 1 has no .to(): the H200 run's compile error).
COMPILE_CHUNK = 2048


def _compile_forward(hidden, weight, labels, bias, softcap, row, acc):
    n, vocab = hidden.shape[0], weight.shape[0]
    splits = num_slices(n, vocab, COMPILE_CHUNK)
    part = meta(4 if row["sum_sq"] else 3, splits, n, dtype=acc)
    forward_blocks(hidden, weight, labels, bias, part, meta(n, dtype=acc), 0.9, softcap, -100, row["entropy"],
                   row["sum_sq"], COMPILE_CHUNK)  # fmt: skip


def _compile_backward(hidden, weight, labels, bias, softcap, row, acc):
    n = hidden.shape[0]
    g = meta(n, dtype=acc)
    g_ent = g if row["entropy"] else None
    lse = meta(n, dtype=torch.float64)
    need = (True, True, bias is not None)
    backward_blocks(hidden, weight, labels, bias, lse, g, g, g_ent, 0.9, softcap, -100, need, None)
