"""The blocked backward's logits recompute and d logits epilogue as one persistent Triton GEMM: each tile of
z = hidden[group] @ weight[slice]ᵀ becomes d z in registers and is stored in the operand dtype, where the
blocked path has cuBLAS write the fp32 logits block for `_block_dlogits_kernel` to read back
(docs/gpu_linear.md, "The GEMMs with the softmax in their epilogues").

The kernel is linear_gemm_stats.py's (TMA operands, `wgmma` on sm_90, one program per SM walking the tiles
in `grouped_tile`'s order), with `dlogits_store` as its epilogue; d weight and d hidden stay cuBLAS GEMMs on
the d z slice (linear_blocked.backward_blocks). Same operands as the forward kernel
(`linear_gemm_stats.supported`: 16-bit, aligned rows, no bias, sm_90 and later); which backward runs is
`BACKWARD`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rlkernels.triton import linear_gemm_stats as gs
from rlkernels.triton._common import float_arg, round_up
from rlkernels.triton._softmax import dlogits_rows, dlogits_store, transform_args, transform_options
from rlkernels.triton._specializations import meta

# The tile, warps, K stages and tile order of the forward's kernel (linear_gemm_stats.py), whose numbers the
# compile check gave; the epilogue by column halves, as there.
SUBTILES = 2

# Which backward linear_blocked runs for operands this kernel takes: "blocked" (cuBLAS writes each fp32
# logits block, `_block_dlogits_kernel` reads it) or "gemm_dlogits" (this kernel). "blocked" until a GPU run
# measures this one (benchmarks/linear_blocked_sweep.py "backward gemm_dlogits").
BACKWARD = "blocked"


def used(hidden: torch.Tensor, weight: torch.Tensor, bias) -> bool:
    """Whether the blocked backward takes this kernel for these operands (BACKWARD, the forward's rules)."""
    return BACKWARD == "gemm_dlogits" and bias is None and gs.supported(hidden, weight)


@triton.jit
def _store_columns(x, first, cols_left, local_labels, row_mask, live, g_logp, g_ent, entropy, lse_hi, lse_lo,
                   dz_rows, inv_temp, cap, inv_cap, temp_over_cap, SOFTCAP: tl.constexpr,
                   ENTROPY: tl.constexpr, WIDTH: tl.constexpr):  # fmt: skip
    """d z of x [rows, WIDTH], the tile's columns [first, first + WIDTH), stored from `dz_rows` (the rows'
    pointers at the tile's first column); `cols_left` and `local_labels` relative to that column."""
    cols = tl.arange(0, WIDTH)
    dlogits_store(
        x, x, cols, cols < cols_left - first, row_mask, local_labels - first, live, g_logp, g_ent, entropy,
        lse_hi, lse_lo, dz_rows[:, None] + (first + cols)[None, :], x, inv_temp, cap, inv_cap, temp_over_cap,
        False, False, SOFTCAP, ENTROPY,
    )  # fmt: skip


@triton.jit
def _gemm_dlogits_kernel(
    h_desc,  # [G, D] tensor descriptor over the row group's hidden, blocks [BLOCK_N, BLOCK_D]
    w_desc,  # [C, D] tensor descriptor over the vocabulary slice's weight, blocks [BLOCK_V, BLOCK_D]
    labels_ptr,  # [G]
    lse_ptr,  # [G] float64
    entropy_ptr,  # [G] (unused without ENTROPY)
    g_logp_ptr,  # [G]
    g_ent_ptr,  # [G] (unused without ENTROPY)
    dz_ptr,  # [G, C] in the operand dtype, row stride lddz
    G,
    C,
    D,
    v0,
    lddz,
    ignore_index,
    inv_temp: tl.float64,
    cap: tl.float64,
    inv_cap: tl.float64,
    temp_over_cap: tl.float64,
    SOFTCAP: tl.constexpr,
    ENTROPY: tl.constexpr,
    INTERPRETED: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_D: tl.constexpr,
    STAGES: tl.constexpr,  # K steps in flight
    SUBTILES: tl.constexpr,  # 1 or 2: the epilogue's column subtiles
):
    inv_temp, cap, inv_cap = transform_options(inv_temp, cap, inv_cap, tl.float32)  # once, not per tile
    temp_over_cap = float_arg(temp_over_cap, tl.float32)
    num_row_blocks = tl.cdiv(G, BLOCK_N)
    num_col_blocks = tl.cdiv(C, BLOCK_V)
    k_steps = tl.cdiv(D, BLOCK_D)
    for tile in range(tl.program_id(0), num_row_blocks * num_col_blocks, tl.num_programs(0)):
        r0, cb, acc = gs.tile_logits(
            h_desc, w_desc, tile, num_row_blocks, num_col_blocks, k_steps, INTERPRETED, GROUP, BLOCK_N,
            BLOCK_V, BLOCK_D, STAGES,
        )  # fmt: skip
        c0 = cb * BLOCK_V
        rows = r0.to(tl.int64) + tl.arange(0, BLOCK_N)
        row_mask = rows < G
        labels, live, g_logp, g_ent, entropy, lse_hi, lse_lo = dlogits_rows(
            labels_ptr, lse_ptr, entropy_ptr, g_logp_ptr, g_ent_ptr, rows, row_mask, ignore_index, ENTROPY
        )
        # Columns and labels relative to the tile's first column, in int32 (as the forward's kernel).
        first = v0 + c0
        here = live & (labels >= first) & (labels < first + BLOCK_V)
        local_labels = tl.where(here, labels - first, -1).to(tl.int32)
        dz_rows = dz_ptr + rows * lddz + c0
        if SUBTILES == 1:
            _store_columns(
                acc, 0, C - c0, local_labels, row_mask, live, g_logp, g_ent, entropy, lse_hi, lse_lo, dz_rows,
                inv_temp, cap, inv_cap, temp_over_cap, SOFTCAP, ENTROPY, BLOCK_V,
            )  # fmt: skip
        else:
            left, right = gs.column_halves(acc, BLOCK_N, BLOCK_V)
            _store_columns(
                left, 0, C - c0, local_labels, row_mask, live, g_logp, g_ent, entropy, lse_hi, lse_lo,
                dz_rows, inv_temp, cap, inv_cap, temp_over_cap, SOFTCAP, ENTROPY, BLOCK_V // 2,
            )  # fmt: skip
            _store_columns(
                right, BLOCK_V // 2, C - c0, local_labels, row_mask, live, g_logp, g_ent, entropy, lse_hi,
                lse_lo, dz_rows, inv_temp, cap, inv_cap, temp_over_cap, SOFTCAP, ENTROPY, BLOCK_V // 2,
            )  # fmt: skip


def dlogits_slice(hidden, weight, v0, labels, lse, entropy, g_logp, g_ent, dz, temperature, softcap,
                  ignore_index):  # fmt: skip
    """d z [G, C] (a view with unit column stride, in the operand dtype) of a row group hidden [G, D] against
    a vocabulary slice weight [C, D] starting at column v0, with `_gemm_dlogits_kernel` (the per-row inputs
    [G]: labels, lse in float64, entropy and g_ent or None, g_logp)."""
    (g, d), c = hidden.shape, weight.shape[0]
    h_desc, w_desc, grid, launch = gs.operand_tiles(hidden, weight)
    with_entropy = g_ent is not None
    _gemm_dlogits_kernel[grid](
        h_desc, w_desc, labels, lse, entropy if with_entropy else g_logp, g_logp,
        g_ent if with_entropy else g_logp, dz, g, c, d, v0, dz.stride(0), ignore_index,
        *transform_args(temperature, softcap), SOFTCAP=softcap is not None, ENTROPY=with_entropy,
        SUBTILES=SUBTILES, **launch,
    )  # fmt: skip


def compile_cases():
    """bf16 and fp16 x the options (a covering design) x the forward kernel's sizes; sm_90 only."""
    return gs.sm90_compile_cases("gemm_dlogits", ("softcap", "entropy"), _compile)


def _compile(row):
    n, vocab, d = gs.SIZES[row["size"]]
    dtype = row["dtype"]
    g = meta(n, dtype=torch.float32)
    dz = meta(n, round_up(vocab, 16), dtype=dtype)[:, :vocab]  # rows 16-element aligned, as the backward's
    dlogits_slice(
        meta(n, d, dtype=dtype), meta(vocab, d, dtype=dtype), 0, meta(n, dtype=torch.int64),
        meta(n, dtype=torch.float64), g if row["entropy"] else None, g, g if row["entropy"] else None, dz,
        0.9, 30.0 if row["softcap"] else None, -100,
    )  # fmt: skip
