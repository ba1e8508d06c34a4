"""linear_logprobs forward in Triton: logits tiles from tl.dot, reduced on the fly to per-row softmax
statistics; nothing of size [N, V] exists, in registers or in memory.

Work split. Program (row block, vocabulary split): BLOCK_N rows against the vocabulary columns of its split,
one [BLOCK_N, BLOCK_V] tile at a time (K loop over D with tl.dot, fp32 accumulation), then the epilogue
(bias, softcap, temperature, online max / sum-exp / entropy sum / Σ e^{2(z−m)} with SUM_SQ, target logit) on
the tile in registers. Each split writes (m, s, a[, q]) per row; a small combine kernel merges the splits into
logp, entropy, lse and Σ softmax².

Small N with large V: one row block alone would leave most SMs idle, so the vocabulary is split until there
are ~2 programs per SM (at least 16 splits); the combine costs 3·splits floats per row (4·splits with SUM_SQ).

Tile order / L2: programs are numbered in groups of GROUP_N row blocks x all splits, row block fastest. The
~#SMs programs running at once therefore cover GROUP_N row blocks and #SMs / GROUP_N splits: they stream
GROUP_N hidden panels (re-read from L2 for every vocabulary tile) and one weight panel per split, each read by
GROUP_N programs at about the same time. The weight is read from memory ~once per row-block group (re-read
factor cdiv(N, GROUP_N·BLOCK_N) from DRAM, cdiv(N, BLOCK_N) from L2); hidden ~once per split.
"""

import functools

import torch
import triton
import triton.language as tl

from rlkernels._backend import triton_interpreting
from rlkernels._dtypes import acc_dtype
from rlkernels.triton import linear_blocked, linear_gemm_stats
from rlkernels.triton._common import cdiv, grouped_tile, num_sms, tl_acc
from rlkernels.triton._dot import dot_acc
from rlkernels.triton._gemm import EPILOGUE_TILES, OPERANDS, UNALIGNED_EPILOGUE_TILES, Tiles, with_operand
from rlkernels.triton._softmax import (
    add_logits_tile,
    finalize_stats,
    merge_stats,
    store_split_stats,
    sum_sq_of,
    transform_args,
    transform_options,
)
from rlkernels.triton._specializations import INDEX_DTYPES, CompileCase, covering, meta

# Row blocks per program group (see the module docstring): 8 panels of hidden fit in L2 next to the weight
# panels of the running splits.
GROUP_N = 8


@triton.jit
def logits_tile(
    hidden_ptr,
    weight_ptr,
    rows,  # [BLOCK_N] int64
    row_mask,
    cols,  # [BLOCK_V] int64
    col_mask,
    D,
    d_stop,  # D, or 0 to skip the product (tile of an all-ignored row block)
    stride_hn,
    stride_hd,
    stride_wv,
    stride_wd,
    INTERPRETED: tl.constexpr,
    ACC: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """[BLOCK_N, BLOCK_V] = hidden[rows] @ weight[cols].T, accumulated in ACC over D in BLOCK_D steps."""
    acc = tl.zeros((BLOCK_N, BLOCK_V), ACC)
    offs_d = tl.arange(0, BLOCK_D)
    for d0 in range(0, d_stop, BLOCK_D):
        ds = d0 + offs_d
        d_mask = ds < D
        h = tl.load(
            hidden_ptr + rows[:, None] * stride_hn + ds[None, :] * stride_hd,
            mask=row_mask[:, None] & d_mask[None, :],
            other=0.0,
        )
        w = tl.load(
            weight_ptr + cols[None, :] * stride_wv + ds[:, None] * stride_wd,
            mask=col_mask[None, :] & d_mask[:, None],
            other=0.0,
        )
        acc = dot_acc(h, w, acc, INTERPRETED, ACC, INPUT_PRECISION)
    return acc


@triton.jit
def _linear_forward_kernel(
    hidden_ptr,  # [N, D]
    weight_ptr,  # [V, D]
    bias_ptr,  # [V] (unused without HAS_BIAS)
    labels_ptr,  # [N]
    part_ptr,  # [3 + SUM_SQ, num_splits, N] ACC: (m, s, a[, q]) of every split
    target_ptr,  # [N] ACC: transformed logit of the label, from the split that holds it
    N,
    V,
    D,
    stride_hn,
    stride_hd,
    stride_wv,
    stride_wd,
    num_splits,
    ignore_index,
    inv_temp: tl.float64,
    cap: tl.float64,
    inv_cap: tl.float64,
    HAS_BIAS: tl.constexpr,
    SOFTCAP: tl.constexpr,
    ENTROPY: tl.constexpr,
    SUM_SQ: tl.constexpr,
    INTERPRETED: tl.constexpr,
    ACC: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    inv_temp, cap, inv_cap = transform_options(inv_temp, cap, inv_cap, ACC)  # once, not per tile
    rb, split = grouped_tile(tl.program_id(0), tl.cdiv(N, BLOCK_N), num_splits, GROUP)
    rows = rb.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < N
    labels = tl.load(labels_ptr + rows, mask=row_mask, other=ignore_index).to(tl.int64)
    live = row_mask & (labels != ignore_index)
    v_per_split = tl.cdiv(tl.cdiv(V, num_splits), BLOCK_V) * BLOCK_V
    v_start = split.to(tl.int64) * v_per_split
    v_end = tl.minimum(V, v_start + v_per_split)
    # A row block whose labels are all ignore_index (prompt tokens) skips its GEMM work entirely.
    v_stop = tl.where(tl.max(live.to(tl.int32)) > 0, v_end, v_start)
    m = tl.full((BLOCK_N,), float("-inf"), ACC)
    s = tl.zeros((BLOCK_N,), ACC)
    a = tl.zeros((BLOCK_N,), ACC)
    q = tl.zeros((BLOCK_N,), ACC)
    z_target = tl.zeros((BLOCK_N,), ACC)
    for v0 in range(v_start, v_stop, BLOCK_V):
        cols = v0 + tl.arange(0, BLOCK_V)
        col_mask = cols < v_end
        x = logits_tile(
            hidden_ptr,
            weight_ptr,
            rows,
            row_mask,
            cols,
            col_mask,
            D,
            D,
            stride_hn,
            stride_hd,
            stride_wv,
            stride_wd,
            INTERPRETED,
            ACC,
            INPUT_PRECISION,
            BLOCK_N,
            BLOCK_V,
            BLOCK_D,
        )
        m, s, a, q, z_target = add_logits_tile(
            x, bias_ptr, cols, col_mask, labels, m, s, a, q, z_target, inv_temp, cap, inv_cap, HAS_BIAS,
            SOFTCAP, ENTROPY, SUM_SQ,
        )  # fmt: skip
    store_split_stats(part_ptr, split, rows, row_mask, m, s, a, q, N, num_splits, ENTROPY, SUM_SQ)
    tl.store(target_ptr + rows, z_target, mask=live & (labels >= v_start) & (labels < v_end))


@triton.jit
def _combine_kernel(
    part_ptr,  # [3 + SUM_SQ, num_splits, N]
    target_ptr,  # [N]
    labels_ptr,  # [N]
    logp_ptr,  # [N]
    entropy_ptr,  # [N] (unused without ENTROPY)
    lse_ptr,  # [N] float64
    sum_sq_ptr,  # [N] (unused without SUM_SQ)
    N,
    num_splits,
    ignore_index,
    ENTROPY: tl.constexpr,
    SUM_SQ: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < N
    labels = tl.load(labels_ptr + rows, mask=row_mask, other=ignore_index)
    live = row_mask & (labels != ignore_index)
    m = tl.full((BLOCK_N,), float("-inf"), part_ptr.dtype.element_ty)
    s = tl.zeros((BLOCK_N,), part_ptr.dtype.element_ty)
    a = tl.zeros((BLOCK_N,), part_ptr.dtype.element_ty)
    q = tl.zeros((BLOCK_N,), part_ptr.dtype.element_ty)
    for s0 in range(0, num_splits, BLOCK_S):  # BLOCK_S splits at a time, merged online
        splits = s0 + tl.arange(0, BLOCK_S)
        mask = live[:, None] & (splits < num_splits)[None, :]
        offs = splits[None, :].to(tl.int64) * N + rows[:, None]
        m_p = tl.load(part_ptr + offs, mask=mask, other=float("-inf"))
        s_p = tl.load(part_ptr + num_splits * N + offs, mask=mask, other=0.0)
        nonempty = s_p > 0
        m_c = tl.max(tl.where(nonempty, m_p, float("-inf")), axis=1)
        d = tl.where(nonempty, m_p - tl.where(m_c > float("-inf"), m_c, 0.0)[:, None], 0.0)
        e = tl.where(nonempty, tl.exp(d), 0.0)
        s_c = tl.sum(e * s_p, axis=1)
        if ENTROPY:
            a_p = tl.load(part_ptr + 2 * num_splits * N + offs, mask=mask, other=0.0)
            a_c = tl.sum(tl.where(nonempty, e * (a_p + d * s_p), 0.0), axis=1)
        else:
            a_c = 0.0 * s_c
        if SUM_SQ:
            q_p = tl.load(part_ptr + 3 * num_splits * N + offs, mask=mask, other=0.0)
            q_c = tl.sum(tl.where(nonempty, e * e * q_p, 0.0), axis=1)
        else:
            q_c = 0.0 * s_c
        m, s, a, q = merge_stats(m, s, a, q, m_c, s_c, a_c, q_c, SUM_SQ)
    m = tl.where(live, m, 0.0)  # ignored rows: every split is empty; keep (-inf) - (-inf) out
    z_target = tl.load(target_ptr + rows, mask=live, other=0.0)
    s = tl.where(live, s, 1.0)  # ignored rows: keep log / divide finite (their outputs are 0)
    logp, entropy, lse = finalize_stats(m, s, a, z_target)
    tl.store(logp_ptr + rows, tl.where(live, logp, 0.0), mask=row_mask)
    tl.store(lse_ptr + rows, tl.where(live, lse, 0.0), mask=row_mask)
    if ENTROPY:
        tl.store(entropy_ptr + rows, tl.where(live, entropy, 0.0), mask=row_mask)
    if SUM_SQ:
        tl.store(sum_sq_ptr + rows, tl.where(live, sum_sq_of(s, q), 0.0), mask=row_mask)


# Tiles of the kernels with a softmax epilogue per [rows, vocabulary] tile (this forward and the backward's d
# logits kernel, which name their arguments alike), pruned per launch to the operand class and the device.
LOGIT_TILES = Tiles(
    EPILOGUE_TILES,
    UNALIGNED_EPILOGUE_TILES,
    ("BLOCK_N", "BLOCK_V", "BLOCK_D"),
    operand_arg="hidden_ptr",
    row_strides=("stride_hn", "stride_wv"),
)
_forward_tuned = LOGIT_TILES.autotune(
    _linear_forward_kernel, key=["V", "D", "HAS_BIAS", "SOFTCAP", "ENTROPY", "SUM_SQ", "INPUT_PRECISION"]
)
# Combine: partials merged COMBINE_SPLITS splits at a time (any number of splits, one specialization) for
# COMBINE_ROWS rows per program: 2048 partials per statistic in registers (4096 spilled in fp64).
COMBINE_SPLITS = 16
COMBINE_ROWS = 128
# Under the interpreter: the smallest tiles tl.dot accepts, so that tests cover many tiles quickly.
INTERPRETER_TILE = {"BLOCK_N": 16, "BLOCK_V": 32, "BLOCK_D": 16}


def dot_args(dtype: torch.dtype) -> dict:
    """Constexprs shared by the GEMM kernels: whether they run under the interpreter
    (rlkernels/triton/_dot.py), the accumulation dtype, and fp32 precision following torch's matmul setting
    (TF32 only where torch would use it)."""
    interp = triton_interpreting()
    tf32 = dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32 and not interp
    return {
        "INTERPRETED": interp,
        "ACC": tl_acc(dtype),
        "INPUT_PRECISION": "tf32" if tf32 else "ieee",
    }


def _num_splits(n: int, vocab: int, chunk_size: int | None, device: torch.device) -> int:
    """Vocabulary splits of the forward: chunk_size columns each when given; on a GPU, enough for ~2 programs
    per SM counting 128-row blocks, at least 16 (the L2 grouping) and at most one per 512 columns (each
    program keeps >= 4 tiles to amortize its prologue); one split under the interpreter."""
    if chunk_size is not None:
        return cdiv(vocab, chunk_size)
    if triton_interpreting():
        return 1
    want = max(16, cdiv(2 * num_sms(device), cdiv(n, 128)))
    return max(1, min(want, cdiv(vocab, 512)))


def linear_logprobs_forward(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    bias: torch.Tensor | None,
    temperature: float,
    softcap: float | None,
    ignore_index: int,
    return_entropy: bool,
    return_sum_pi_squared: bool,
    chunk_size: int | None,
):
    """hidden [N, D], weight [V, D], labels [N], bias [V] or None -> (logp [N], entropy [N] or [0], lse [N],
    sum_pi_squared [N] or [0]) in fp32 (fp64 for fp64 inputs), lse in fp64."""
    n, d = hidden.shape
    vocab = weight.shape[0]
    acc = acc_dtype(hidden.dtype)
    dev = hidden.device
    logp = torch.empty(n, dtype=acc, device=dev)
    lse = torch.empty(n, dtype=torch.float64, device=dev)
    entropy = torch.empty(n if return_entropy else 0, dtype=acc, device=dev)
    sum_sq = torch.empty(n if return_sum_pi_squared else 0, dtype=acc, device=dev)
    if n == 0:
        return logp, entropy, lse, sum_sq
    labels = labels.contiguous()
    # One persistent GEMM with the statistics in its epilogue (triton/linear_gemm_stats.py), chunk by chunk.
    if chunk_size is None and linear_gemm_stats.used(hidden, weight, bias):
        _forward_gemm_stats(
            hidden, weight, labels, logp, entropy, lse, sum_sq, temperature, softcap, ignore_index,
            return_entropy, return_sum_pi_squared,
        )  # fmt: skip
        return logp, entropy, lse, sum_sq
    blocked = linear_blocked.used(dev)
    if blocked:
        splits = linear_blocked.num_slices(n, vocab, chunk_size)
    else:
        splits = _num_splits(n, vocab, chunk_size, dev)
    part = torch.empty((4 if return_sum_pi_squared else 3, splits, n), dtype=acc, device=dev)
    target = torch.empty(n, dtype=acc, device=dev)
    inv_temp, cap, inv_cap, _ = transform_args(temperature, softcap)
    args = (
        hidden,
        weight,
        bias if bias is not None else weight,
        labels,
        part,
        target,
        n,
        vocab,
        d,
        hidden.stride(0),
        hidden.stride(1),
        weight.stride(0),
        weight.stride(1),
        splits,
        ignore_index,
        inv_temp,
        cap,
        inv_cap,
    )
    flags = dict(
        HAS_BIAS=bias is not None,
        SOFTCAP=softcap is not None,
        ENTROPY=return_entropy,
        SUM_SQ=return_sum_pi_squared,
        GROUP=GROUP_N,
    )
    flags.update(dot_args(hidden.dtype))
    if blocked:  # cuBLAS GEMMs and Triton epilogues (triton/linear_blocked.py), the same per-slice partials
        linear_blocked.forward_blocks(
            hidden, weight, labels, bias, part, target, temperature, softcap, ignore_index, return_entropy,
            return_sum_pi_squared, chunk_size,
        )  # fmt: skip
    elif triton_interpreting():
        grid = (cdiv(n, INTERPRETER_TILE["BLOCK_N"]) * splits,)
        _linear_forward_kernel[grid](*args, **flags, **INTERPRETER_TILE)
    else:
        _forward_tuned[lambda meta: (cdiv(n, meta["BLOCK_N"]) * splits,)](*args, **flags)
    _combine(
        part, target, labels, logp, entropy, lse, sum_sq, ignore_index, return_entropy, return_sum_pi_squared
    )
    return logp, entropy, lse, sum_sq


def _combine(part, target, labels, logp, entropy, lse, sum_sq, ignore_index, return_entropy,
             return_sum_pi_squared):  # fmt: skip
    """logp, entropy, lse, sum_sq [N] of the rows whose splits' statistics are part [3 + SUM_SQ, splits, N]
    (and their label logits target [N]), with `_combine_kernel`."""
    n, splits = logp.shape[0], part.shape[1]
    rows_per_program = 64 if triton_interpreting() else COMBINE_ROWS
    _combine_kernel[(cdiv(n, rows_per_program),)](
        part,
        target,
        labels,
        logp,
        entropy if return_entropy else logp,
        lse,
        sum_sq if return_sum_pi_squared else logp,
        n,
        splits,
        ignore_index,
        ENTROPY=return_entropy,
        SUM_SQ=return_sum_pi_squared,
        BLOCK_N=rows_per_program,
        BLOCK_S=COMBINE_SPLITS,
    )


def _forward_gemm_stats(hidden, weight, labels, logp, entropy, lse, sum_sq, temperature, softcap,
                        ignore_index, return_entropy, return_sum_pi_squared):  # fmt: skip
    """linear_logprobs_forward's outputs through linear_gemm_stats.py's kernel and the combine, a chunk of
    `rows_per_launch` rows at a time: the tiles' statistics of one chunk in one buffer."""
    n, vocab = hidden.shape[0], weight.shape[0]
    stats = 4 if return_sum_pi_squared else 3
    splits = linear_gemm_stats.num_splits(vocab)
    rows = min(n, linear_gemm_stats.rows_per_launch(vocab, stats))
    buffer = torch.empty(stats * splits * rows, dtype=logp.dtype, device=hidden.device)
    target = torch.empty(rows, dtype=logp.dtype, device=hidden.device)
    for r0 in range(0, n, rows):
        chunk = slice(r0, min(n, r0 + rows))
        r = chunk.stop - r0
        part = buffer[: stats * splits * r].view(stats, splits, r)
        linear_gemm_stats.forward_tiles(
            hidden[chunk], weight, labels[chunk], part, target[:r], temperature, softcap, ignore_index,
            return_entropy, return_sum_pi_squared,
        )  # fmt: skip
        per_row = [x[chunk] if x.numel() else x for x in (logp, entropy, lse, sum_sq)]
        _combine(
            part, target[:r], labels[chunk], *per_row, ignore_index, return_entropy, return_sum_pi_squared
        )


# (N, V, D) of the compile cases: sizes divisible by 16 (Llama-like); an odd token count and vocabulary
# (GPT-2's 50257); and a hidden size whose rows are not 16-byte aligned.
SIZES = {"aligned": (512, 32000, 1024), "odd": (511, 50257, 1024), "odd-hidden": (511, 50257, 1000)}


def compile_cases():
    """Every operand class (bf16, fp16, fp32 as tf32 and as ieee, fp64) x row alignment with every option
    on, compiling every tile autotune keeps for the target; the options x labels dtype x size class in a
    covering design (first tile only) (rlkernels/triton/_specializations.py)."""
    rows = covering(
        features={
            "bias": (False, True),
            "softcap": (None, 30.0),
            "entropy": (False, True),
            "sum_sq": (False, True),
            "labels": INDEX_DTYPES,
            "size": tuple(SIZES),
            "operand": tuple(OPERANDS),
        },
        resources={"operand": tuple(OPERANDS), "size": ("odd", "odd-hidden")},
        heaviest={"bias": True, "softcap": 30.0, "entropy": True, "sum_sq": True, "labels": torch.int64},
    )
    for row, all_tiles in rows:
        dtype = OPERANDS[row["operand"]][0]
        n, vocab, d = SIZES[row["size"]]
        args = (
            meta(n, d, dtype=dtype), meta(vocab, d, dtype=dtype), meta(n, dtype=row["labels"]),
            meta(vocab, dtype=dtype) if row["bias"] else None, 0.7, row["softcap"], -100, row["entropy"],
            row["sum_sq"], None,
        )  # fmt: skip
        label = ",".join(str(v) for v in row.values()).replace("torch.", "")
        yield CompileCase(
            f"linear_logprobs_forward[{label}]",
            functools.partial(with_operand, row["operand"], linear_logprobs_forward, *args),
            all_configs=all_tiles,
        )
