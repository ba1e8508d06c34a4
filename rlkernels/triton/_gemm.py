"""GEMM tiles of the log-prob kernels, per operand class, and the autotune pruning that keeps only the tiles
the device can run.

Tiles were chosen with the compile check (`python -m rlkernels compile-check`; docs/compile_check.md):
every tile listed for a class compiles for sm_80 and sm_90 within the per-block shared memory and spills at
most the budget of rlkernels/compile_check/budgets.py, for aligned shapes, odd vocabularies (50257) and hidden
sizes whose rows are not 16-byte aligned. Why per class:
  - fp16 (bf16/fp16 operands, tensor cores): 128x128 output tiles only without an epilogue (with the
    softmax epilogue they spill 56-450 B/thread once a shape is odd), else 8192 outputs per 8 warps;
  - tf32 (fp32 operands on tensor cores): twice the operand bytes, so smaller tiles again;
  - fp32 (fp32 `ieee`, no tensor cores: FMA dot): K of 32, or ptxas spills several KB per thread;
  - fp64 (gradchecks; FMA dot on 8-byte operands): the smallest tiles.
The epilogue-heavy kernels (the forward's online softmax, the backward's d logits) hold the fp32 logit
tile in registers next to the accumulator; `c += a @ b` (`_matmul_acc_kernel`) does not.
"""

from __future__ import annotations

import collections
import contextlib

import torch
import triton

Tile = collections.namedtuple("Tile", "m n k warps stages")

# Tiles (BLOCK_M/N, BLOCK_N/V, BLOCK_K/D, warps, stages) of the kernels with a softmax epilogue.
EPILOGUE_TILES = {
    "fp16": (
        Tile(128, 64, 64, 8, 4),
        Tile(64, 128, 64, 8, 4),
        Tile(64, 64, 64, 4, 4),
        Tile(64, 64, 128, 4, 3),
    ),
    "tf32": (Tile(64, 128, 64, 8, 4), Tile(64, 64, 64, 4, 4)),
    "fp32": (Tile(64, 128, 32, 8, 3), Tile(128, 64, 32, 8, 3), Tile(32, 64, 32, 4, 3)),
    "fp64": (Tile(32, 64, 32, 4, 3), Tile(64, 32, 32, 4, 3), Tile(32, 32, 32, 4, 3)),
}
# Tiles of c += a @ b: no epilogue beyond the accumulator, so bigger output tiles fit.
MATMUL_TILES = {
    "fp16": (Tile(128, 128, 64, 8, 4), Tile(64, 128, 64, 4, 4), Tile(128, 64, 64, 4, 4)),
    "tf32": (Tile(128, 128, 32, 8, 4), Tile(64, 128, 64, 4, 4), Tile(128, 64, 64, 4, 4)),
    "fp32": (Tile(128, 64, 32, 8, 3), Tile(32, 64, 32, 4, 3)),
    "fp64": (Tile(64, 64, 32, 4, 3), Tile(128, 64, 32, 8, 3), Tile(32, 64, 32, 4, 3)),
}
# Tiles when an operand's rows are not a multiple of 16 elements apart (a hidden size such as 1000): Triton
# cannot vectorize those loads, registers run short, and only these tiles stay within the spill budget.
UNALIGNED_EPILOGUE_TILES = {
    "fp16": (Tile(64, 64, 32, 4, 4), Tile(32, 64, 64, 4, 4), Tile(64, 32, 64, 4, 4)),
    "tf32": (Tile(64, 128, 32, 8, 4),),
    "fp32": (Tile(32, 64, 32, 4, 3), Tile(32, 32, 32, 4, 3)),
    "fp64": EPILOGUE_TILES["fp64"],
}
UNALIGNED_MATMUL_TILES = {
    "fp16": (Tile(128, 128, 32, 8, 4), Tile(64, 64, 64, 4, 4)),
    "tf32": (Tile(128, 64, 64, 4, 4), Tile(64, 64, 32, 4, 4), Tile(64, 64, 64, 4, 4)),
    "fp32": MATMUL_TILES["fp32"],
    "fp64": MATMUL_TILES["fp64"],
}
OPERAND_CLASSES = ("fp16", "tf32", "fp32", "fp64")
# Triton vectorizes loads along rows whose stride it knows to be a multiple of this many elements.
_ROW_ALIGN = 16
# kernel name -> its Tiles: the compile check verifies each compiled tile against shared_memory_bytes.
REGISTRY: dict[str, Tiles] = {}
# Shared memory Triton reserves besides the operand buffers on sm_90 (mbarriers of the async pipeline).
_STATIC_SHARED = 1024


def operand_class(dtype: torch.dtype, input_precision: str) -> str:
    """The operand class of tl.dot on `dtype` operands with `input_precision` ("tf32" or "ieee")."""
    if dtype in (torch.bfloat16, torch.float16):
        return "fp16"
    if dtype == torch.float64:
        return "fp64"
    return "tf32" if input_precision == "tf32" else "fp32"


def shared_memory_bytes(tile: Tile, operand: str, arch: int) -> int:
    """Upper bound of the shared memory Triton allocates for `tile`: its software pipeline keeps
    `stages - 1` (A, B) operand buffers, `stages` on sm_90+ where the operands go through wgmma (fp16 and
    tf32 classes), plus the pipeline's barriers. The compile check verifies the bound against every
    compiled tile."""
    itemsize = {"fp16": 2, "tf32": 4, "fp32": 4, "fp64": 8}[operand]
    buffers = tile.stages if arch >= 90 and operand in ("fp16", "tf32") else tile.stages - 1
    return buffers * (tile.m + tile.n) * tile.k * itemsize + _STATIC_SHARED


class Tiles:
    """One kernel's autotune configs (every tile of every operand class, aligned or not; block-size names
    of the kernel) and its `early_config_prune`: the tiles of the launch's operand class and row alignment
    that fit the device's shared memory."""

    def __init__(
        self,
        tiles_by_class: dict,
        unaligned_by_class: dict,
        names: tuple[str, str, str],
        *,
        operand_arg: str,
        row_strides: tuple[str, ...],
    ):
        self.tiles_by_class = tiles_by_class
        self.unaligned_by_class = unaligned_by_class
        self.names = names
        self.operand_arg = operand_arg  # the kernel argument whose dtype is the operands' dtype
        self.row_strides = row_strides  # the operands' row-stride arguments
        every = [t for d in (tiles_by_class, unaligned_by_class) for tiles in d.values() for t in tiles]
        self.configs = [self.config(t) for t in dict.fromkeys(every)]

    def config(self, tile: Tile) -> triton.Config:
        m, n, k = self.names
        return triton.Config({m: tile.m, n: tile.n, k: tile.k}, num_warps=tile.warps, num_stages=tile.stages)

    def tile(self, config: triton.Config) -> Tile:
        return self.tile_of(config.kwargs, config.num_warps, config.num_stages)

    def tile_of(self, constexprs: dict, num_warps: int, num_stages: int) -> Tile:
        m, n, k = self.names
        return Tile(constexprs[m], constexprs[n], constexprs[k], num_warps, num_stages)

    def prune(self, configs, named_args, **kwargs):
        """early_config_prune: the configs of this launch's operand class whose operand buffers fit the
        current device (at least the smallest, so that the launch reports a clear out-of-resources error
        on a device with less shared memory than any tile needs)."""
        operand, tiles, arch, limit = self._launch(named_args, kwargs)
        mine = [c for c in configs if self.tile(c) in tiles]
        fits = [c for c in mine if shared_memory_bytes(self.tile(c), operand, arch) <= limit]
        return fits or [min(mine, key=lambda c: shared_memory_bytes(self.tile(c), operand, arch))]

    def too_big(self, named_args, **kwargs) -> dict:
        """{tile: reason} of this launch's operand class that `prune` drops for the device (the compile
        check's report of what autotune prunes)."""
        operand, tiles, arch, limit = self._launch(named_args, kwargs)
        out = {}
        for t in tiles:
            need = shared_memory_bytes(t, operand, arch)
            if need > limit:
                out[t] = f"{operand} operands need {need} B of shared memory > {limit} B per block"
        return out

    def _launch(self, named_args, kwargs) -> tuple[str, tuple, int, int]:
        """(operand class, its tiles for the launch's row alignment, arch, shared memory per block) of a
        launch on the current device."""
        from triton.runtime import driver

        operand = operand_class(named_args[self.operand_arg].dtype, kwargs.get("INPUT_PRECISION", "ieee"))
        aligned = all(named_args[s] % _ROW_ALIGN == 0 for s in self.row_strides)
        tiles = (self.tiles_by_class if aligned else self.unaligned_by_class)[operand]
        arch = driver.active.get_current_target().arch
        limit = driver.active.utils.get_device_properties(driver.active.get_current_device())[
            "max_shared_mem"
        ]
        return operand, tiles, arch, limit

    def autotune(self, kernel, key: list[str], **kwargs):
        """`triton.autotune` of `kernel` over these tiles, pruned per launch (the row strides join the key:
        they decide the tile set)."""
        REGISTRY[kernel.__name__] = self
        return triton.autotune(
            configs=self.configs,
            key=key + list(self.row_strides),
            prune_configs_by={"early_config_prune": self.prune},
            **kwargs,
        )(kernel)


# The operand classes as launchers see them: (dtype, whether torch allows TF32 for fp32 matmuls).
OPERANDS = {
    "bf16": (torch.bfloat16, False),
    "fp16": (torch.float16, False),
    "tf32": (torch.float32, True),
    "fp32": (torch.float32, False),
    "fp64": (torch.float64, False),
}


@contextlib.contextmanager
def allow_tf32(allowed: bool):
    """torch.backends.cuda.matmul.allow_tf32 set to `allowed` inside the block (dot_args reads it)."""
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = allowed
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous


def with_operand(operand: str, fn, *args):
    """fn(*args) with TF32 allowed exactly when `operand` is "tf32" (a compile case's body)."""
    with allow_tf32(OPERANDS[operand][1]):
        return fn(*args)
