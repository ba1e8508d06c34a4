"""Launches turned into compiles for a real GPU target, on a machine without one.

Inside `compile_only(target)`:
  - Triton's active driver is an `OfflineDriver` for the target (targets.py), so that every kernel is
    specialized and compiled exactly as Triton's own launch path does it (argument binding, constexprs,
    pointer types, alignment), all the way to cubin with Triton's bundled ptxas;
  - `JITFunction.run` compiles and returns without launching (Triton's own `warmup` path);
  - an autotuned kernel compiles every config its `prune_configs_by` keeps for the target, and records
    the ones it prunes.
Launchers run on meta tensors (rlkernels/triton/_specializations.py), so they allocate and slice as on a
GPU and nothing executes. Each compile is recorded with its resource usage, read from the cubin.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import subprocess
import tempfile
import time

from rlkernels.compile_check.targets import OfflineDriver, Target


@dataclasses.dataclass
class Compiled:
    """One kernel specialization compiled for one target (or pruned by autotune: `pruned` says why)."""

    kernel: str
    constexprs: dict  # name -> value, autotune config values included
    arg_types: dict  # name -> Triton type of every other argument ("*bf16/16": 16-byte aligned pointer)
    num_warps: int
    num_stages: int
    shared: int = 0  # bytes per block: Triton's dynamic shared memory + the cubin's static shared
    registers: int = 0  # per thread
    stack: int = 0  # bytes per thread of stack frame: register spills land here
    seconds: float = 0.0
    pruned: str | None = None
    f64_ops: int = 0  # fp64 arithmetic instructions in the PTX (conversions and moves not counted)
    async_copies: int = 0  # cp.async copies in the PTX (not their commits and waits): loads pipelined
    wgmma: int = 0  # wgmma.mma_async instructions in the PTX: the dot on Hopper's warpgroup tensor cores
    tma_loads: int = 0  # cp.async.bulk.tensor copies in the PTX: tile loads by the Tensor Memory Accelerator
    asserts: int = 0  # calls of __assertfail in the PTX: device-side asserts compiled in (_device_assert)
    fma_ops: int = 0  # fp32 fma in the PTX: products fused into an add (none under _softmax.UNFUSED)

    @property
    def signature(self) -> str:
        return ",".join(self.arg_types.values())

    def key(self) -> tuple:
        return (self.kernel, self.signature, tuple(sorted((k, str(v)) for k, v in self.constexprs.items())))


def _cuobjdump() -> str:
    import triton

    bundled = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    return bundled if os.path.exists(bundled) else "cuobjdump"


_RESOURCES = re.compile(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)")


def _cuobjdump_of(cubin: bytes, flag: str) -> str:
    """`cuobjdump <flag>`'s output for `cubin` (Triton bundles cuobjdump with its ptxas)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([_cuobjdump(), flag, f.name], capture_output=True, text=True, check=True).stdout


def cubin_resources(cubin: bytes) -> tuple[int, int, int]:
    """(registers, stack bytes, static shared bytes) of the single kernel in `cubin`, from
    `cuobjdump -res-usage`."""
    out = _cuobjdump_of(cubin, "-res-usage")
    m = _RESOURCES.search(out)
    if m is None:
        raise RuntimeError(f"cuobjdump -res-usage printed no resource line: {out!r}")
    reg, stack, shared, local = (int(x) for x in m.groups())
    return reg, stack + local, shared


def cubin_sass(cubin: bytes) -> str:
    """The SASS of `cubin` (`cuobjdump -sass`)."""
    return _cuobjdump_of(cubin, "-sass")


# A PTX instruction that computes in fp64: add.f64, fma.rn.f64, setp.lt.f64, ... (not cvt, mov, ld, st).
_F64_OP = re.compile(r"^\s*(?:@%p\d+\s+)?(?!cvt|mov|ld|st)[a-z]+(?:\.[a-z0-9]+)*\.f64\b", re.MULTILINE)


def f64_ops(ptx: str) -> int:
    """How many fp64 arithmetic instructions `ptx` holds."""
    return len(_F64_OP.findall(ptx))


# A copy from global to shared memory issued ahead of its use (cp.async.ca / .cg; not cp.async.commit_group
# or cp.async.wait_group, which every pipelined loop also has).
_ASYNC_COPY = re.compile(r"\bcp\.async\.c[ag]\.shared\.global\b")


def async_copies(ptx: str) -> int:
    """How many cp.async copies into shared memory `ptx` holds (Triton's pipelined loads)."""
    return len(_ASYNC_COPY.findall(ptx))


# Hopper's warpgroup MMA (not its fence, commit or wait) and TMA's tile copies global -> shared.
_WGMMA = re.compile(r"\bwgmma\.mma_async\.")
_TMA_LOAD = re.compile(r"\bcp\.async\.bulk\.tensor\.\dd\.shared::(?:cta|cluster)\.global\b")


# An fp32 fused multiply-add as LLVM contracts a product and the add after it (Triton's enable_fp_fusion):
# fma.rn.f32. Libdevice's own polynomials (logf's) are fma.rn.ftz.f32 in Triton 3.6-3.9 and not counted.
_FMA_F32 = re.compile(r"^\s*(?:@%p\d+\s+)?fma\.rn\.f32\b", re.MULTILINE)


def fma_ops(ptx: str) -> int:
    """How many contracted fp32 fma instructions (fma.rn.f32) `ptx` holds."""
    return len(_FMA_F32.findall(ptx))


_ASSERT_CALL = re.compile(r"\bcall(?:\.uni)?\s+__assertfail\b")


def assert_calls(ptx: str) -> int:
    """How many calls of CUDA's __assertfail (tl.device_assert, compiled with debug=True) `ptx` holds."""
    return len(_ASSERT_CALL.findall(ptx))


def wgmma_ops(ptx: str) -> int:
    """How many wgmma.mma_async instructions `ptx` holds."""
    return len(_WGMMA.findall(ptx))


def tma_loads(ptx: str) -> int:
    """How many TMA tile loads (cp.async.bulk.tensor, global to shared) `ptx` holds."""
    return len(_TMA_LOAD.findall(ptx))


def _specialization(fn, src) -> tuple[dict, dict]:
    """(constexprs, arg types) by name of the specialization Triton compiled: the declared constexprs and
    the integers it specialized to constants (== 1), then the type of every other argument, "/16" where
    Triton assumed it divisible by 16 (pointers aligned, integer sizes)."""
    names = fn.arg_names
    constexprs = {names[path[0]]: value for path, value in src.constants.items()}
    aligned = {path[0] for path, attrs in src.attrs.items() if attrs}
    types = {
        name: f"{ty}{'/16' if i in aligned else ''}"
        for i, (name, ty) in enumerate(src.signature.items())
        if ty != "constexpr" and name not in constexprs
    }
    return constexprs, types


class _Recorder:
    def __init__(self):
        self.compiled: list[Compiled] = []
        self.kernels: list = []  # Triton's compiled kernel of each compile, in order (asm: ptx, cubin)


@contextlib.contextmanager
def compile_only(target: Target, *, all_configs: bool = True):
    """Within the block, Triton launches compile for `target` and record what they compiled (yields the
    recorder: `.compiled`). An autotuned kernel compiles every config its pruning keeps, or only the first
    one when not `all_configs`."""
    from triton.runtime import driver
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.jit import JITFunction

    recorder = _Recorder()
    run, autotuner_run = JITFunction.run, Autotuner.run

    def jit_run(self, *args, grid, warmup, **kwargs):
        start = time.perf_counter()
        kernel = run(self, *args, grid=grid, warmup=True, **kwargs)
        seconds = time.perf_counter() - start
        constexprs, arg_types = _specialization(self, kernel.src)
        registers, stack, static_shared = cubin_resources(kernel.asm["cubin"])
        recorder.compiled.append(
            Compiled(
                kernel=self.fn.__name__,
                constexprs=constexprs,
                arg_types=arg_types,
                num_warps=kernel.metadata.num_warps,
                num_stages=kernel.metadata.num_stages,
                shared=kernel.metadata.shared + static_shared,
                registers=registers,
                stack=stack,
                seconds=seconds,
                f64_ops=f64_ops(kernel.asm["ptx"]),
                async_copies=async_copies(kernel.asm["ptx"]),
                wgmma=wgmma_ops(kernel.asm["ptx"]),
                tma_loads=tma_loads(kernel.asm["ptx"]),
                asserts=assert_calls(kernel.asm["ptx"]),
                fma_ops=fma_ops(kernel.asm["ptx"]),
            )
        )
        recorder.kernels.append(kernel)
        return kernel

    def tuned_run(self, *args, **kwargs):
        # Every config the kernel's pruning keeps for this target (what autotune would benchmark).
        from rlkernels.triton._gemm import REGISTRY

        self.nargs = dict(zip(self.arg_names, args, strict=False))
        launch_kwargs = {k: v for k, v in kwargs.items() if k not in ("grid", "warmup")}
        kept = self.prune_configs(launch_kwargs)
        tiles = REGISTRY.get(self.base_fn.__name__)
        for tile, reason in (tiles.too_big(self.nargs, **launch_kwargs) if tiles else {}).items():
            config = tiles.config(tile)
            recorder.compiled.append(
                Compiled(
                    kernel=self.base_fn.__name__,
                    constexprs={**launch_kwargs, **config.kwargs},
                    arg_types={tiles.operand_arg: str(self.nargs[tiles.operand_arg].dtype)},
                    num_warps=config.num_warps,
                    num_stages=config.num_stages,
                    pruned=reason,
                )
            )
        for config in kept if all_configs else kept[:1]:
            self.fn.run(*args, **kwargs, **config.all_kwargs())
        self.nargs = None

    previous = driver._active  # not `.active`: without a GPU, creating the default driver raises
    driver.set_active(OfflineDriver(target))
    JITFunction.run, Autotuner.run = jit_run, tuned_run
    try:
        yield recorder
    finally:
        JITFunction.run, Autotuner.run = run, autotuner_run
        driver._active = previous
