"""linear_logprobs backward in Triton: recompute the logits tile by tile, never an [N, V] buffer.

The vocabulary is processed in slices of C columns. Per slice:
  1. `_dlogits_kernel` recomputes the [N, C] logits tile by tile with tl.dot (the 1st GEMM) and writes the
     softmax gradient d loss / d logits (logp and entropy terms, softcap and temperature chain rule) into one
     reused [N, C] buffer in the input dtype — the tensor-core operand the next two GEMMs read. The bias
     gradient is reduced per tile and added with fp32 atomics (one per column per row block).
  2. d weight[slice] = dzᵀ @ hidden (2nd GEMM, cuBLAS via torch.mm). How d weight is reduced across row
     blocks: it is not split at all — each slice's d weight is ONE GEMM whose K dimension is every row, so the
     reduction over rows happens inside the GEMM's K loop: no atomics, deterministic, rounded once (as eager).
  3. d hidden += dz @ weight[slice] (3rd GEMM, `_matmul_acc_kernel`): d hidden is the one reduced across
     slices, in an fp32 [N, D] accumulator read and written once per slice (N·D·8 bytes per slice, small
     next to the GEMM), converted to the input dtype at the end.
With a frozen head (weight needs no grad) step 2 is skipped (2 GEMMs); with frozen hidden, step 3.

Small N with large V: the grid of both kernels is (row blocks x column tiles of the slice), i.e.
cdiv(N, BLOCK_N) * C / BLOCK_V programs, so even one row block fills the GPU when C is wide; C defaults to a
memory budget for the dz buffer (at least 4096 columns).
"""

import functools

import torch
import triton
import triton.language as tl

from rlkernels._backend import triton_interpreting
from rlkernels._dtypes import acc_dtype
from rlkernels.triton import linear_blocked
from rlkernels.triton._common import cdiv, float_arg, grouped_tile, round_up, store_dtype
from rlkernels.triton._dot import dot_acc
from rlkernels.triton._gemm import (
    MATMUL_TILES,
    OPERANDS,
    UNALIGNED_MATMUL_TILES,
    Tiles,
    with_operand,
)
from rlkernels.triton._softmax import dlogits_rows, dlogits_store, transform_args, transform_options
from rlkernels.triton._specializations import INDEX_DTYPES, CompileCase, covering, meta
from rlkernels.triton.linear_blocked import DZ_ROW_ALIGN
from rlkernels.triton.linear_logprobs import (
    GROUP_N,
    INTERPRETER_TILE,
    LOGIT_TILES,
    SIZES,
    dot_args,
    logits_tile,
)

# Bytes of the dz slice buffer on a GPU when chunk_size is not given: 256 MiB keeps C >= 16k columns for
# 8k tokens (few slices, so few passes over the fp32 d hidden accumulator) at 1/16 of bf16 [N, V].
_DZ_BUDGET_BYTES = 256 << 20
# Fewest columns per automatic slice: keeps the slice GEMMs wide enough for the tensor cores.
_MIN_COLS = 4096


@triton.jit
def _dlogits_kernel(
    hidden_ptr,  # [N, D]
    weight_ptr,  # [V, D]
    bias_ptr,  # [V] (unused without HAS_BIAS)
    labels_ptr,  # [N]
    lse_ptr,  # [N] float64
    entropy_ptr,  # [N] (unused without ENTROPY)
    g_logp_ptr,  # [N]
    g_ent_ptr,  # [N] (unused without ENTROPY)
    dz_ptr,  # [N, C] slice buffer, row stride ldz
    db_ptr,  # [V] ACC, atomically accumulated (unused without HAS_DBIAS)
    N,
    V,
    D,
    v0,
    C,
    ldz,
    stride_hn,
    stride_hd,
    stride_wv,
    stride_wd,
    ignore_index,
    inv_temp: tl.float64,
    cap: tl.float64,
    inv_cap: tl.float64,
    temp_over_cap: tl.float64,
    HAS_BIAS: tl.constexpr,
    HAS_DBIAS: tl.constexpr,
    SOFTCAP: tl.constexpr,
    ENTROPY: tl.constexpr,
    INTERPRETED: tl.constexpr,
    ACC: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    inv_temp, cap, inv_cap = transform_options(inv_temp, cap, inv_cap, ACC)  # once, not per tile
    temp_over_cap = float_arg(temp_over_cap, ACC)
    rb, cb = grouped_tile(tl.program_id(0), tl.cdiv(N, BLOCK_N), tl.cdiv(C, BLOCK_V), GROUP)
    rows = rb.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < N
    local = cb.to(tl.int64) * BLOCK_V + tl.arange(0, BLOCK_V)
    col_mask = local < C
    cols = v0 + local
    labels, live, g_logp, g_ent, entropy, lse_hi, lse_lo = dlogits_rows(
        labels_ptr, lse_ptr, entropy_ptr, g_logp_ptr, g_ent_ptr, rows, row_mask, ignore_index, ENTROPY
    )
    # All-ignored row blocks (prompt tokens) skip the product; their gradient rows are written as zeros.
    d_stop = tl.where(tl.max(live.to(tl.int32)) > 0, D, 0)
    x = logits_tile(
        hidden_ptr,
        weight_ptr,
        rows,
        row_mask,
        cols,
        col_mask,
        D,
        d_stop,
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
    dlogits_store(
        x, bias_ptr, cols, col_mask, row_mask, labels, live, g_logp, g_ent, entropy, lse_hi, lse_lo,
        dz_ptr + rows[:, None] * ldz + local[None, :], db_ptr, inv_temp, cap, inv_cap, temp_over_cap,
        HAS_BIAS, HAS_DBIAS, SOFTCAP, ENTROPY,
    )  # fmt: skip


@triton.jit
def _matmul_acc_kernel(
    a_ptr,  # [M, K]
    b_ptr,  # [K, N]
    c_ptr,  # [M, N] ACC, read and written: c += a @ b
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    stride_cm,
    stride_cn,
    INTERPRETED: tl.constexpr,
    ACC: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pm, pn = grouped_tile(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP)
    rm = pm.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pn.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask = rm < M
    n_mask = rn < N
    c_ptrs = c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn
    c_mask = m_mask[:, None] & n_mask[None, :]
    acc = tl.load(c_ptrs, mask=c_mask, other=0.0).to(ACC)
    offs_k = tl.arange(0, BLOCK_K)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + offs_k
        k_mask = ks < K
        a = tl.load(
            a_ptr + rm[:, None] * stride_am + ks[None, :] * stride_ak,
            mask=m_mask[:, None] & k_mask[None, :],
            other=0.0,
        )
        b = tl.load(
            b_ptr + ks[:, None] * stride_bk + rn[None, :] * stride_bn,
            mask=k_mask[:, None] & n_mask[None, :],
            other=0.0,
        )
        acc = dot_acc(a, b, acc, INTERPRETED, ACC, INPUT_PRECISION)
    tl.store(c_ptrs, acc, mask=c_mask)


# Tiles of c += a @ b (the d logits kernel shares the forward's LOGIT_TILES).
MATMUL_ACC_TILES = Tiles(
    MATMUL_TILES,
    UNALIGNED_MATMUL_TILES,
    ("BLOCK_M", "BLOCK_N", "BLOCK_K"),
    operand_arg="a_ptr",
    row_strides=("stride_am", "stride_bk"),
)
_dlogits_tuned = LOGIT_TILES.autotune(
    _dlogits_kernel,
    key=["D", "C", "HAS_BIAS", "HAS_DBIAS", "SOFTCAP", "ENTROPY", "INPUT_PRECISION"],
    restore_value=["db_ptr"],  # the atomics accumulate: benchmarking runs must not leave their sums behind
)
_matmul_acc_tuned = MATMUL_ACC_TILES.autotune(
    _matmul_acc_kernel,
    key=["M", "N", "K", "INPUT_PRECISION"],
    restore_value=["c_ptr"],  # c is read-modify-written
)


def _slice_columns(n: int, vocab: int, itemsize: int, chunk_size: int | None) -> int:
    if chunk_size is not None:
        return min(chunk_size, vocab)
    if triton_interpreting():
        return vocab
    return min(vocab, max(_MIN_COLS, _DZ_BUDGET_BYTES // max(1, n * itemsize)))


def _matmul_acc(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> None:
    """c [M, N] (fp32/fp64) += a [M, K] @ b [K, N], any strides."""
    m, k = a.shape
    n = b.shape[1]
    args = (a, b, c, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1))
    flags = dict(GROUP=GROUP_N, **dot_args(a.dtype))
    if triton_interpreting():
        bm, bn, bk = INTERPRETER_TILE["BLOCK_N"], INTERPRETER_TILE["BLOCK_V"], INTERPRETER_TILE["BLOCK_D"]
        grid = (cdiv(m, bm) * cdiv(n, bn),)
        _matmul_acc_kernel[grid](*args, **flags, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk)
    else:
        grid = lambda meta: (cdiv(m, meta["BLOCK_M"]) * cdiv(n, meta["BLOCK_N"]),)  # noqa: E731
        _matmul_acc_tuned[grid](*args, **flags)


def linear_logprobs_backward(
    grad_logp: torch.Tensor,
    grad_entropy: torch.Tensor | None,
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    bias: torch.Tensor | None,
    lse: torch.Tensor,
    entropy: torch.Tensor,
    temperature: float,
    softcap: float | None,
    ignore_index: int,
    output_mask,
    chunk_size: int | None,
):
    """(d hidden [N, D], d weight [V, D], d bias [V]), each an empty [0] tensor where output_mask is False.
    Upstream gradients may have any strides (e.g. the expanded gradient of .sum())."""
    need_h, need_w, need_b = (bool(x) for x in output_mask)
    need_b = need_b and bias is not None
    if hidden.shape[0] > 0 and linear_blocked.used(hidden.device):  # cuBLAS GEMMs + Triton epilogues
        need = (need_h, need_w, need_b)
        return _backward_blocked(grad_logp, grad_entropy, hidden, weight, labels, bias, lse, entropy,
                                 temperature, softcap, ignore_index, need, chunk_size)  # fmt: skip
    n, d = hidden.shape
    vocab = weight.shape[0]
    acc = acc_dtype(hidden.dtype)
    dev = hidden.device
    dh = torch.zeros((n, d), dtype=acc, device=dev) if need_h else None
    gw = torch.empty_like(weight, memory_format=torch.contiguous_format) if need_w else None
    db = torch.zeros(vocab, dtype=acc, device=dev) if need_b else None
    if n == 0 and gw is not None:
        gw.zero_()
    if n > 0 and (need_h or need_w or need_b):
        with_entropy = grad_entropy is not None
        labels = labels.contiguous()
        g_logp = grad_logp.contiguous()
        g_ent = grad_entropy.contiguous() if with_entropy else g_logp
        ent = entropy.contiguous() if with_entropy else g_logp
        lse = lse.to(torch.float64).contiguous()
        cols = _slice_columns(n, vocab, hidden.element_size(), chunk_size)
        dz_flat = torch.empty(n * round_up(cols, DZ_ROW_ALIGN), dtype=store_dtype(hidden.dtype), device=dev)
        options = transform_args(temperature, softcap)  # (inv_temp, cap, inv_cap, temp_over_cap)
        flags = dict(
            HAS_BIAS=bias is not None,
            HAS_DBIAS=need_b,
            SOFTCAP=softcap is not None,
            ENTROPY=with_entropy,
            GROUP=GROUP_N,
            **dot_args(hidden.dtype),
        )
        for v0 in range(0, vocab, cols):
            c = min(cols, vocab - v0)
            ldz = round_up(c, DZ_ROW_ALIGN)
            dz = dz_flat[: n * ldz].view(n, ldz)[:, :c]
            args = (
                hidden,
                weight,
                bias if bias is not None else weight,
                labels,
                lse,
                ent,
                g_logp,
                g_ent,
                dz,
                db if need_b else g_logp,
                n,
                vocab,
                d,
                v0,
                c,
                ldz,
                hidden.stride(0),
                hidden.stride(1),
                weight.stride(0),
                weight.stride(1),
                ignore_index,
                *options,
            )
            if triton_interpreting():
                grid = (cdiv(n, INTERPRETER_TILE["BLOCK_N"]) * cdiv(c, INTERPRETER_TILE["BLOCK_V"]),)
                _dlogits_kernel[grid](*args, **flags, **INTERPRETER_TILE)
            else:
                grid = lambda meta: (  # noqa: E731
                    cdiv(n, meta["BLOCK_N"]) * cdiv(c, meta["BLOCK_V"]),  # noqa: B023
                )
                _dlogits_tuned[grid](*args, **flags)
            g = dz.to(
                hidden.dtype
            )  # no-op on a GPU; under the interpreter bf16 is stored as fp32 then rounded
            if need_w:
                torch.mm(g.t(), hidden, out=gw[v0 : v0 + c])
            if need_h:
                _matmul_acc(g, weight[v0 : v0 + c], dh)

    def empty(like):
        return like.new_empty(0)

    return (
        dh.to(hidden.dtype) if need_h else empty(hidden),
        gw if need_w else empty(weight),
        db.to(bias.dtype) if need_b else empty(weight),
    )


def _backward_blocked(grad_logp, grad_entropy, hidden, weight, labels, bias, lse, entropy, temperature,
                      softcap, ignore_index, need, chunk_size):  # fmt: skip
    """linear_logprobs_backward through triton/linear_blocked.py, with the same outputs."""
    with_entropy = grad_entropy is not None
    dh, gw, db = linear_blocked.backward_blocks(
        hidden, weight, labels.contiguous(), bias, lse.to(torch.float64).contiguous(),
        entropy.contiguous() if with_entropy else None, grad_logp.contiguous(),
        grad_entropy.contiguous() if with_entropy else None, temperature, softcap, ignore_index, need,
        chunk_size,
    )  # fmt: skip
    return (
        dh.to(hidden.dtype) if dh is not None else hidden.new_empty(0),
        gw if gw is not None else weight.new_empty(0),
        db.to(bias.dtype) if db is not None else weight.new_empty(0),
    )


def compile_cases():
    """Every operand class with every option on and both gradients (every tile autotune keeps, of the d
    logits kernel and of c += a @ b); the options (bias absent / frozen / trained, softcap, entropy), the
    gradients asked for, labels dtype and size class in a covering design (first tile only)
    (rlkernels/triton/_specializations.py)."""
    rows = covering(
        features={
            "bias": ("none", "frozen", "trained"),
            "softcap": (None, 30.0),
            "entropy": (False, True),
            "grads": ("hidden+weight", "weight", "hidden"),
            "labels": INDEX_DTYPES,
            "size": tuple(SIZES),
            "operand": tuple(OPERANDS),
        },
        resources={"operand": tuple(OPERANDS), "size": ("odd", "odd-hidden")},
        heaviest={
            "bias": "trained",
            "softcap": 30.0,
            "entropy": True,
            "grads": "hidden+weight",
            "labels": torch.int64,
        },
    )
    for row, all_tiles in rows:
        dtype = OPERANDS[row["operand"]][0]
        acc = acc_dtype(dtype)
        n, vocab, d = SIZES[row["size"]]
        stat, lse = meta(n, dtype=acc), meta(n, dtype=torch.float64)
        output_mask = ("hidden" in row["grads"], "weight" in row["grads"], row["bias"] == "trained")
        args = (
            stat, stat if row["entropy"] else None, meta(n, d, dtype=dtype), meta(vocab, d, dtype=dtype),
            meta(n, dtype=row["labels"]), None if row["bias"] == "none" else meta(vocab, dtype=dtype),
            lse, stat, 0.7, row["softcap"], -100, output_mask, None,
        )  # fmt: skip
        label = ",".join(str(v) for v in row.values()).replace("torch.", "")
        yield CompileCase(
            f"linear_logprobs_backward[{label}]",
            functools.partial(with_operand, row["operand"], linear_logprobs_backward, *args),
            all_configs=all_tiles,
        )
