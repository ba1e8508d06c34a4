"""linear_logprobs' forward as one persistent Triton GEMM whose epilogue reduces each logits tile to the
rows' softmax statistics: the logits never leave registers (docs/gpu_linear.md, "The GEMMs with the softmax
in their epilogues").

Each [BLOCK_N, BLOCK_V] tile of z = hidden @ weightᵀ is one vocabulary split of the fused forward's
layout: the tile writes its rows' (m, s, a[, q]) into part[:, split, rows] and the label's logit where the
label falls in it, and linear_logprobs' `_combine_kernel` merges the splits as it merges the blocked path's
slices. The operands arrive by TMA (tensor descriptors: on sm_90 Triton lowers the tile loads to
`cp.async.bulk.tensor` and the dot to `wgmma`), and the kernel is persistent: one program per SM walks the
tiles in `grouped_tile`'s order, so the programs running at once share their weight panels in L2. Its
epilogue takes a short path on the tiles inside the vocabulary that hold no row's label (most of them):
there no column is masked and no label sought.

16-bit operands (bf16, fp16) whose rows are 16-byte aligned, no bias (LLM heads have none), on sm_90 and
later (TMA) only: the blocked path (cuBLAS + epilogues, linear_blocked.py) serves every other case. Which of
the two runs is `FORWARD` below.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from rlkernels._backend import triton_interpreting
from rlkernels.triton._common import cdiv, compute_capability, grouped_tile, num_sms
from rlkernels.triton._dot import dot_acc
from rlkernels.triton._softmax import add_logits_tile, store_split_stats, transform_args, transform_options
from rlkernels.triton._specializations import CompileCase, covering, meta

# The GEMM tile: 128 x 128 outputs over two warpgroups (8 warps), each a 64 x 128 wgmma; the fp32
# accumulator takes 64 registers a thread. 128 x 256 (Triton's persistent-matmul tutorial's fp16 tile) spilled
# 200-470 B a thread beside the epilogue's two paths (the compile check, sm_90, Triton 3.9).
BLOCK_N, BLOCK_V, BLOCK_D = 128, 128, 64
WARPS = 8
# K steps in flight: 4 x (128 + 128) x 64 x 2 B = 128 KiB of TMA buffers, one program an SM.
STAGES = 4
# The epilogue reduces the tile half its columns at a time: the reduction's temporaries beside the
# accumulator then fit the registers with every option on (no spill in the compile check).
SUBTILES = 2
# Row blocks per group of the tile order: 16 hidden panels (16 MiB at D=4096) stay in L2 while the ~8
# vocabulary tiles a wave of the 132 programs reaches read their weight panels once per group.
GROUP_N = 16
# The tiles' statistics one launch writes, at most this many bytes (fp32, 3 or 4 a row and vocabulary tile):
# 8320 rows a launch at V=128256 with Σπ², so that the no-grad log-probs of a large batch (256k tokens) hold
# one row chunk's statistics (128 MiB), not the whole batch's (4 GB). A chunk of 8320 rows is 65 x 1002
# tiles, hundreds of waves: the launches cost nothing in the GEMM's rate.
STATS_BYTES = 128 << 20
# A measurement, never on in use: the kernel's epilogue replaced by the tile's row sums added into `target`
# (no statistics), so that a GPU run times the main loop apart from the epilogue: the time model's two
# assumptions (its GEMM rate and its epilogue's price), each measured (linear_blocked_sweep.py).
MAIN_LOOP_ONLY = False
# Under the interpreter (tests on CPU tensors) small tiles: the dot is a broadcast product there.
INTERPRETER_BLOCKS = dict(BLOCK_N=16, BLOCK_V=32, BLOCK_D=16)

# Which forward linear_logprobs runs on a GPU for operands this kernel takes: "blocked" (cuBLAS GEMMs and
# the statistics epilogue, linear_blocked.py) or "gemm_stats" (this kernel). The blocked path stays the
# default until a GPU run measures this one against it (benchmarks/linear_blocked_sweep.py "gemm_stats").
FORWARD = "blocked"


def supported(hidden: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether this kernel can take the operands: 16-bit, contiguous rows 16-byte aligned (TMA's rule for
    every stride but the last), and on a GPU of compute capability 9.0 or later (TMA) or the interpreter."""
    if hidden.dtype not in (torch.bfloat16, torch.float16) or weight.dtype != hidden.dtype:
        return False
    if hidden.stride(1) != 1 or weight.stride(1) != 1:
        return False
    # Row strides and starts (torch's CUDA allocations are 512-byte aligned: a view's offset decides).
    for t in (hidden, weight):
        if (t.stride(0) * t.element_size()) % 16 or (t.storage_offset() * t.element_size()) % 16:
            return False
    if hidden.device.type == "cpu":
        return triton_interpreting()
    return hidden.device.type == "cuda" and compute_capability(hidden.device) >= 90


def used(hidden: torch.Tensor, weight: torch.Tensor, bias) -> bool:
    """Whether linear_logprobs' forward takes this kernel for these operands (FORWARD, `supported`, no
    bias)."""
    return FORWARD == "gemm_stats" and bias is None and supported(hidden, weight)


@triton.jit
def _add_columns(x, first, cols_left, local_labels, m, s, a, q, z_target, inv_temp, cap, inv_cap,
                 SOFTCAP: tl.constexpr, ENTROPY: tl.constexpr, SUM_SQ: tl.constexpr,
                 WIDTH: tl.constexpr, PLAIN: tl.constexpr):  # fmt: skip
    """The running statistics with x [rows, WIDTH], the tile's columns [first, first + WIDTH), merged in
    (`cols_left`: the vocabulary's columns from the tile's first; `local_labels`: relative to it). PLAIN: a
    tile inside the vocabulary holding no row's label, so no column is masked and no label sought (constant
    masks: the compiler drops their selects)."""
    cols = tl.arange(0, WIDTH)
    if PLAIN:
        valid = tl.full((WIDTH,), 1, tl.int1)
        labels = tl.full(local_labels.shape, -1, tl.int32)
    else:
        valid = cols < cols_left - first
        labels = local_labels - first
    return add_logits_tile(
        x, x, cols, valid, labels, m, s, a, q, z_target, inv_temp, cap, inv_cap, False, SOFTCAP, ENTROPY,
        SUM_SQ,
    )  # fmt: skip


@triton.jit
def tile_logits(h_desc, w_desc, tile, num_row_blocks, num_col_blocks, k_steps, INTERPRETED: tl.constexpr,
                GROUP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr,
                STAGES: tl.constexpr):  # fmt: skip
    """Tile number `tile` (in `grouped_tile`'s order) of the logits h @ wᵀ: (its first row, its column
    block, the tile [BLOCK_N, BLOCK_V] in fp32), the operands by TMA, STAGES K steps in flight."""
    rb, cb = grouped_tile(tile, num_row_blocks, num_col_blocks, GROUP)
    r0 = rb * BLOCK_N
    acc = tl.zeros((BLOCK_N, BLOCK_V), tl.float32)
    for k in tl.range(0, k_steps, num_stages=STAGES):
        h = h_desc.load([r0, k * BLOCK_D])  # rows and columns past the ends read as 0 (TMA)
        w = w_desc.load([cb * BLOCK_V, k * BLOCK_D])
        acc = dot_acc(h, w.T, acc, INTERPRETED, tl.float32, "ieee")
    return r0, cb, acc


@triton.jit
def column_halves(x, ROWS: tl.constexpr, COLS: tl.constexpr):
    """The left and right column halves of x [ROWS, COLS] (an epilogue by halves: half its registers)."""
    return tl.split(tl.permute(tl.reshape(x, (ROWS, 2, COLS // 2)), (0, 2, 1)))


@triton.jit
def _tile_stats(acc, cols_left, local_labels, inv_temp, cap, inv_cap, SOFTCAP: tl.constexpr,
                ENTROPY: tl.constexpr, SUM_SQ: tl.constexpr, ROWS: tl.constexpr, WIDTH: tl.constexpr,
                SUBTILES: tl.constexpr, PLAIN: tl.constexpr):  # fmt: skip
    """(m, s, a, q, z_target) of the rows of a logits tile acc [ROWS, WIDTH], whole (SUBTILES 1) or a column
    half after the other (2: half the epilogue's registers); PLAIN as `_add_columns`."""
    m = tl.full((ROWS,), float("-inf"), tl.float32)
    s = tl.zeros((ROWS,), tl.float32)
    a = tl.zeros((ROWS,), tl.float32)
    q = tl.zeros((ROWS,), tl.float32)
    z_target = tl.zeros((ROWS,), tl.float32)
    if SUBTILES == 1:
        m, s, a, q, z_target = _add_columns(
            acc, 0, cols_left, local_labels, m, s, a, q, z_target, inv_temp, cap, inv_cap, SOFTCAP, ENTROPY,
            SUM_SQ, WIDTH, PLAIN,
        )  # fmt: skip
    else:
        left, right = column_halves(acc, ROWS, WIDTH)
        m, s, a, q, z_target = _add_columns(
            left, 0, cols_left, local_labels, m, s, a, q, z_target, inv_temp, cap, inv_cap, SOFTCAP, ENTROPY,
            SUM_SQ, WIDTH // 2, PLAIN,
        )  # fmt: skip
        m, s, a, q, z_target = _add_columns(
            right, WIDTH // 2, cols_left, local_labels, m, s, a, q, z_target, inv_temp, cap, inv_cap, SOFTCAP,
            ENTROPY, SUM_SQ, WIDTH // 2, PLAIN,
        )  # fmt: skip
    return m, s, a, q, z_target


@triton.jit
def _stats_epilogue(acc, rows, row_mask, v0, cb, labels_ptr, part_ptr, target_ptr, N, V, num_col_blocks,
                    ignore_index, inv_temp, cap, inv_cap, SOFTCAP: tl.constexpr, ENTROPY: tl.constexpr,
                    SUM_SQ: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr,
                    SUBTILES: tl.constexpr):  # fmt: skip
    """The statistics of the logits tile acc [BLOCK_N, BLOCK_V] (rows `rows`, columns from v0: vocabulary
    tile cb) into part, and the label's logit into target where the label falls in it."""
    # The tile's columns and labels relative to its first column, in int32: int64 [BLOCK_N, BLOCK_V]
    # comparisons would double the epilogue's registers.
    labels = tl.load(labels_ptr + rows, mask=row_mask, other=ignore_index)
    here = row_mask & (labels != ignore_index) & (labels >= v0) & (labels < v0 + BLOCK_V)
    local_labels = tl.where(here, labels - v0, -1).to(tl.int32)
    if (v0 + BLOCK_V <= V) & (tl.max(local_labels) < 0):
        m, s, a, q, z_target = _tile_stats(
            acc, V - v0, local_labels, inv_temp, cap, inv_cap, SOFTCAP, ENTROPY, SUM_SQ, BLOCK_N, BLOCK_V,
            SUBTILES, True,
        )  # fmt: skip
    else:
        m, s, a, q, z_target = _tile_stats(
            acc, V - v0, local_labels, inv_temp, cap, inv_cap, SOFTCAP, ENTROPY, SUM_SQ, BLOCK_N, BLOCK_V,
            SUBTILES, False,
        )  # fmt: skip
    store_split_stats(part_ptr, cb, rows, row_mask, m, s, a, q, N, num_col_blocks, ENTROPY, SUM_SQ)
    tl.store(target_ptr + rows, z_target, mask=here)


@triton.jit
def _gemm_stats_kernel(
    h_desc,  # [N, D] tensor descriptor, blocks [BLOCK_N, BLOCK_D]
    w_desc,  # [V, D] tensor descriptor, blocks [BLOCK_V, BLOCK_D]
    labels_ptr,  # [N]
    part_ptr,  # [3 + SUM_SQ, cdiv(V, BLOCK_V), N] fp32: (m, s, a[, q]) of every vocabulary tile
    target_ptr,  # [N] fp32: transformed logit of the label, from the tile that holds it
    N,
    V,
    D,
    ignore_index,
    inv_temp: tl.float64,
    cap: tl.float64,
    inv_cap: tl.float64,
    SOFTCAP: tl.constexpr,
    ENTROPY: tl.constexpr,
    SUM_SQ: tl.constexpr,
    INTERPRETED: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_D: tl.constexpr,
    STAGES: tl.constexpr,  # K steps in flight
    SUBTILES: tl.constexpr,  # 1 or 2: the epilogue's column subtiles
    MAIN_LOOP_ONLY: tl.constexpr,
):
    inv_temp, cap, inv_cap = transform_options(inv_temp, cap, inv_cap, tl.float32)  # once, not per tile
    num_row_blocks = tl.cdiv(N, BLOCK_N)
    num_col_blocks = tl.cdiv(V, BLOCK_V)
    num_tiles = num_row_blocks * num_col_blocks
    k_steps = tl.cdiv(D, BLOCK_D)
    # Not tl.range(..., flatten=True), the tile and K loops pipelined as one: the sm_90 SASS then waited for
    # each wgmma before issuing the next (WARPGROUP.DEPBAR 0 after every HGMMA, Triton 3.6 and 3.9), where
    # a K step's four HGMMAs issue back to back with a group left in flight.
    for tile in range(tl.program_id(0), num_tiles, tl.num_programs(0)):
        r0, cb, acc = tile_logits(
            h_desc, w_desc, tile, num_row_blocks, num_col_blocks, k_steps, INTERPRETED, GROUP, BLOCK_N,
            BLOCK_V, BLOCK_D, STAGES,
        )  # fmt: skip
        v0 = cb * BLOCK_V
        rows = r0.to(tl.int64) + tl.arange(0, BLOCK_N)
        row_mask = rows < N
        if MAIN_LOOP_ONLY:  # a measurement: the GEMM with an epilogue of one add a logit (`MAIN_LOOP_ONLY`)
            tl.atomic_add(target_ptr + rows, tl.sum(acc, axis=1), mask=row_mask)
        else:
            _stats_epilogue(
                acc, rows, row_mask, v0, cb, labels_ptr, part_ptr, target_ptr, N, V, num_col_blocks,
                ignore_index, inv_temp, cap, inv_cap, SOFTCAP, ENTROPY, SUM_SQ, BLOCK_N, BLOCK_V, SUBTILES,
            )  # fmt: skip


def tile_blocks() -> dict:
    """The tile's BLOCK_N, BLOCK_V, BLOCK_D: INTERPRETER_BLOCKS under the interpreter."""
    if triton_interpreting():
        return dict(INTERPRETER_BLOCKS)
    return dict(BLOCK_N=BLOCK_N, BLOCK_V=BLOCK_V, BLOCK_D=BLOCK_D)


def num_splits(vocab: int) -> int:
    """The vocabulary splits of this forward's statistics (one per BLOCK_V tile): the combine's splits."""
    return cdiv(vocab, tile_blocks()["BLOCK_V"])


def rows_per_launch(vocab: int, stats: int) -> int:
    """Rows a launch takes: as many as STATS_BYTES holds the statistics (`stats` a tile) of, in whole row
    blocks."""
    block = tile_blocks()["BLOCK_N"]
    rows = STATS_BYTES // (stats * num_splits(vocab) * 4)
    return max(block, rows - rows % block)


def programs(device: torch.device, tiles: int) -> int:
    """The persistent grid: one program per SM (a few under the interpreter), at most one per tile."""
    if device.type != "cuda":
        return min(tiles, 4)  # the interpreter: a few programs, each walking several tiles
    return min(tiles, num_sms(device))


def operand_tiles(hidden: torch.Tensor, weight: torch.Tensor) -> tuple:
    """What a launch of `tile_logits`' kernels takes for hidden [M, D] @ weight [C, D]ᵀ: (the two tensor
    descriptors, the persistent grid, the launch's tile constexprs and warps, its pipeline)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    blocks = tile_blocks()
    h_desc = TensorDescriptor.from_tensor(hidden, [blocks["BLOCK_N"], blocks["BLOCK_D"]])
    w_desc = TensorDescriptor.from_tensor(weight, [blocks["BLOCK_V"], blocks["BLOCK_D"]])
    tiles = cdiv(hidden.shape[0], blocks["BLOCK_N"]) * cdiv(weight.shape[0], blocks["BLOCK_V"])
    launch = dict(blocks, INTERPRETED=triton_interpreting(), GROUP=GROUP_N, STAGES=STAGES, num_warps=WARPS)
    return h_desc, w_desc, (programs(hidden.device, tiles),), launch


def forward_tiles(hidden, weight, labels, part, target, temperature, softcap, ignore_index, return_entropy,
                  return_sum_pi_squared):  # fmt: skip
    """Fill the statistics `part` [3 + SUM_SQ, num_splits(V), N] and the label logits `target` [N] (fp32) of
    hidden [N, D] @ weight [V, D]ᵀ with `_gemm_stats_kernel` (operands: `supported`)."""
    (n, d), vocab = hidden.shape, weight.shape[0]
    h_desc, w_desc, grid, launch = operand_tiles(hidden, weight)
    inv_temp, cap, inv_cap, _ = transform_args(temperature, softcap)
    _gemm_stats_kernel[grid](
        h_desc, w_desc, labels, part, target, n, vocab, d, ignore_index, inv_temp, cap, inv_cap,
        SOFTCAP=softcap is not None, ENTROPY=return_entropy, SUM_SQ=return_sum_pi_squared, SUBTILES=SUBTILES,
        MAIN_LOOP_ONLY=MAIN_LOOP_ONLY, **launch,
    )  # fmt: skip


# (N, V, D) of the compile cases: aligned (Llama-like) and an odd vocabulary (GPT-2's 50257: a ragged last
# tile); D keeps the rows 16-byte aligned, as `supported` requires.
SIZES = {"aligned": (512, 32000, 1024), "odd": (511, 50257, 1024)}


def compile_cases():
    """bf16 and fp16 x the options (a covering design) x both sizes; sm_90 only (TMA: `supported`)."""
    return sm90_compile_cases("gemm_stats", ("softcap", "entropy", "sum_sq"), _compile)


def sm90_compile_cases(name: str, options: tuple[str, ...], compile_row):
    """The compile cases of a `tile_logits` kernel: bf16 and fp16 x its boolean `options` x SIZES (a
    covering design, every option on and the odd size the heaviest), each `compile_row(row)`, on sm_90 and
    later only (the kernels take nothing older: `supported`)."""
    rows = covering(
        features={"dtype": (torch.bfloat16, torch.float16), **{o: (False, True) for o in options},
                  "size": tuple(SIZES)},
        resources={"dtype": (torch.bfloat16,)},
        heaviest={**{o: True for o in options}, "size": "odd"},
    )  # fmt: skip
    for row, _ in rows:
        label = ",".join(str(v) for v in row.values()).replace("torch.", "")
        yield CompileCase(f"{name}[{label}]", functools.partial(_on_sm90, compile_row, row))


def _on_sm90(compile_row, row):
    if compute_capability(torch.device("cuda")) >= 90:
        compile_row(row)


def _compile(row):
    n, vocab, d = SIZES[row["size"]]
    dtype = row["dtype"]
    part = meta(4 if row["sum_sq"] else 3, num_splits(vocab), n, dtype=torch.float32)
    forward_tiles(
        meta(n, d, dtype=dtype), meta(vocab, d, dtype=dtype), meta(n, dtype=torch.int64), part,
        meta(n, dtype=torch.float32), 0.9, 30.0 if row["softcap"] else None, -100, row["entropy"],
        row["sum_sq"],
    )  # fmt: skip
