"""The CUDA C++ half of the compile check: every csrc/cuda/*.cu compiled to cubin for each target with
`nvcc -Xptxas -v`, and every kernel instantiation's registers, spills and static shared memory held to the
budgets (budgets.py). The .cu files include no torch headers, so this takes seconds per file.

A file's kernels are kept in a cache (`cache_dir()`) under a key of everything that decides them: the nvcc
build, the target, the flags, the source, every header it may include and this checker's own code. CI's clean
clone then recompiles only what changed since the last check on that machine, as Triton's cache does for the
Triton half (docs/compile_check.md)."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import json
import os
import pathlib
import re
import shutil
import subprocess
import tempfile

from rlkernels import _cache
from rlkernels.compile_check.budgets import CUDA_FP64_SPILL_BYTES, CUDA_MAX_REGISTERS, CUDA_SPILL_BYTES
from rlkernels.compile_check.launch import cubin_sass
from rlkernels.compile_check.targets import TARGETS

CSRC = pathlib.Path(__file__).resolve().parents[2] / "csrc"
# The flags the extension build gives nvcc (torch.utils.cpp_extension.COMMON_NVCC_FLAGS and setup.py);
# C++17, the oldest standard the torch versions we support build CUDA with.
NVCC_FLAGS = (
    "-O3",
    "-std=c++17",
    "--expt-relaxed-constexpr",
    "-D__CUDA_NO_HALF_OPERATORS__",
    "-D__CUDA_NO_HALF_CONVERSIONS__",
    "-D__CUDA_NO_BFLOAT16_CONVERSIONS__",
    "-D__CUDA_NO_HALF2_OPERATORS__",
)


@dataclasses.dataclass
class CudaKernel:
    arch: int
    source: str
    name: str  # demangled
    registers: int
    stack: int
    spill_stores: int
    spill_loads: int
    shared: int
    # 128-bit global loads in its SASS (LDG.E.128), counted in the sources of PACKED_KERNELS and
    # TOKEN_PACKED (else None); and its 128-bit stores (STG.E.128)
    wide_loads: int | None = None
    mangled: str = ""
    wide_stores: int | None = None

    @property
    def streams_packs(self) -> bool:
        """One of PACKED_KERNELS: held to 128-bit loads."""
        return any(f"{name}<" in self.name for name in PACKED_KERNELS)

    @property
    def token_packs(self) -> bool:
        """A token kernel's 16-byte-pack instantiation (TOKEN_PACKED): held to 128-bit loads or stores."""
        return TOKEN_PACKED.search(self.name) is not None

    @property
    def fp64(self) -> bool:
        return "<double" in self.name or ", double" in self.name


def nvcc() -> str | None:
    return shutil.which("nvcc")


def sources() -> list[pathlib.Path]:
    return sorted((CSRC / "cuda").glob("*.cu"))


# The kernels that stream large arrays (rows of logits, kl_penalty's inputs) and must load 16-byte packs: one
# 2-byte load a thread in flight held the bf16 logits row loop at a third of HBM's rate (the second H200 run's
# CUDA C++ logprobs_from_logits, docs/gpu_token_ops.md, "The CUDA C++ kernels in 16-byte packs").
PACKED_KERNELS = (
    "logits_rows_kernel", "row_stats_kernel", "row_grad_kernel", "kl_forward_kernel", "kl_backward_kernel",
    "kl_forward_rows_kernel", "kl_backward_rows_kernel",
    "::chunk_kernel",  # the frozen head's stream (logp_jacobian.cu), not the estimators' *_chunk_kernel
)  # fmt: skip

# The token kernels' instantiations on rows that take packs (csrc/cuda/token_packs.cuh): the fp32 and fp64
# ones, whose packs are 16 bytes (V > 1, the last template argument), must load or store 128 bits at a time;
# the fourth H200 run timed the CUDA C++ forwards at 1.8x the Triton ones with 32-bit loads.
_TOKEN_KERNELS = r"((value|agg|policy)_(forward|backward)|seq_partial|into_saved)_kernel"
TOKEN_PACKED = re.compile(rf"::{_TOKEN_KERNELS}<(float|double), [^<>]*, [2-9]>\(")

_ENTRY = re.compile(r"Compiling entry function '(\S+)' for 'sm_(\d+)'")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers(?:.*?, (\d+) bytes smem)?")


def parse_ptxas(log: str, source: str) -> list[CudaKernel]:
    """The kernels of a `-Xptxas -v` log (mangled names)."""
    kernels, current = [], None
    for line in log.splitlines():
        if m := _ENTRY.search(line):
            current = {"name": m.group(1), "arch": int(m.group(2))}
        elif current is not None and (m := _FRAME.search(line)):
            current.update(stack=int(m.group(1)), stores=int(m.group(2)), loads=int(m.group(3)))
        elif current is not None and (m := _USED.search(line)):
            kernels.append(
                CudaKernel(
                    arch=current["arch"],
                    source=source,
                    name=current["name"],
                    registers=int(m.group(1)),
                    stack=current.get("stack", 0),
                    spill_stores=current.get("stores", 0),
                    spill_loads=current.get("loads", 0),
                    shared=int(m.group(2) or 0),
                )
            )
            current = None
    return kernels


_SASS_FUNCTION = re.compile(r"^\s*Function : (\S+)", re.MULTILINE)
_WIDE_LOAD = re.compile(r"\bLDG\.E\.128\b")
_WIDE_STORE = re.compile(r"\bSTG\.E\.128\b")


def wide_loads(sass: str, pattern: re.Pattern = _WIDE_LOAD) -> dict[str, int]:
    """{mangled kernel name: its 128-bit global loads} of `cuobjdump -sass` output (its 128-bit stores with
    pattern=_WIDE_STORE)."""
    starts = list(_SASS_FUNCTION.finditer(sass))
    ends = [m.start() for m in starts[1:]] + [len(sass)]
    spans = zip(starts, ends, strict=True)
    return {m.group(1): len(pattern.findall(sass, m.end(), end)) for m, end in spans}


def _demangle(names: list[str]) -> list[str]:
    filt = shutil.which("c++filt")
    if not filt or not names:
        return names
    out = subprocess.run([filt], input="\n".join(names), capture_output=True, text=True, check=True).stdout
    return out.splitlines()


def cache_dir() -> pathlib.Path | None:
    """Where compiled files' kernels are kept: $RLKERNELS_CACHE_DIR/nvcc-check, else
    ~/.cache/rlkernels/nvcc-check; None (every file compiled) with RLKERNELS_NVCC_CHECK_CACHE=0."""
    return _cache.cache_dir("nvcc-check", "RLKERNELS_NVCC_CHECK_CACHE")


@functools.lru_cache(maxsize=8)
def _nvcc_version(path: str) -> str:
    return subprocess.run([path, "--version"], capture_output=True, text=True, check=True).stdout


def cache_key(source: pathlib.Path, arch: int) -> str:
    """A digest of what decides `source`'s kernels for sm_`arch`: nvcc's version, the target and flags, the
    source, every header under csrc/include and csrc/cuda (the include paths), and the checker's code."""
    headers = [p for p in sorted(CSRC.rglob("*")) if p.suffix in (".h", ".cuh")]
    checker = (pathlib.Path(__file__), pathlib.Path(cubin_sass.__code__.co_filename))
    parts = (_nvcc_version(nvcc()), str(arch), *NVCC_FLAGS, source.name)
    return _cache.digest(parts, (source, *headers, *checker), CSRC)


def compile_source(source: pathlib.Path, arch: int) -> list[CudaKernel]:
    """The kernels of `source` compiled for sm_`arch`, from the cache when its inputs are unchanged."""
    where = cache_dir()
    entry = None if where is None else where / f"{source.stem}-sm{arch}-{cache_key(source, arch)}.json"
    if entry is not None and entry.exists():
        return [CudaKernel(**k) for k in json.loads(entry.read_text())]
    kernels = _compile(source, arch)
    if entry is not None:
        text = json.dumps([dataclasses.asdict(k) for k in kernels])
        _cache.store(entry, lambda path: path.write_text(text))
    return kernels


def _compile(source: pathlib.Path, arch: int) -> list[CudaKernel]:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            nvcc(), "-cubin", f"-arch=sm_{arch}", *NVCC_FLAGS, "-Xptxas", "-v",
            f"-I{CSRC / 'include'}", f"-I{CSRC / 'cuda'}", str(source), "-o", os.path.join(tmp, "out.cubin"),
        ]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"nvcc failed on {source.name} for sm_{arch}:\n{done.stderr[-4000:]}")
        kernels = parse_ptxas(done.stdout + done.stderr, source.name)
        for k, name in zip(kernels, _demangle([k.name for k in kernels]), strict=True):
            k.mangled, k.name = k.name, name
        # The SASS of the sources with a kernel held to 16-byte packs only: a large one's dump takes seconds.
        if any(k.streams_packs or k.token_packs for k in kernels):
            sass = cubin_sass(pathlib.Path(tmp, "out.cubin").read_bytes())
            loads, stores = wide_loads(sass), wide_loads(sass, _WIDE_STORE)
            for k in kernels:
                k.wide_loads, k.wide_stores = loads.get(k.mangled, 0), stores.get(k.mangled, 0)
    return kernels


def run(archs, jobs: int | None = None) -> tuple[list[CudaKernel], list[str]]:
    """(kernels, errors): every .cu for every arch, compiled in parallel."""
    tasks = [(s, a) for a in archs for s in sources()]
    kernels, errors = [], []
    with concurrent.futures.ThreadPoolExecutor(jobs or os.cpu_count() or 1) as pool:
        for (source, arch), fut in zip(
            tasks, [pool.submit(compile_source, s, a) for s, a in tasks], strict=True
        ):
            try:
                kernels += fut.result()
            except RuntimeError as e:
                errors.append(f"sm_{arch} {source.name}: {e}")
    return kernels, errors


def findings(kernels: list[CudaKernel]) -> list[str]:
    """Budget violations: registers above CUDA_MAX_REGISTERS, spills above the budget (fp64 has its own)."""
    out = []
    for k in kernels:
        where = f"sm_{k.arch} {k.source}: {k.name}"
        if k.registers > CUDA_MAX_REGISTERS:
            out.append(f"{where}: {k.registers} registers > {CUDA_MAX_REGISTERS}")
        budget = CUDA_FP64_SPILL_BYTES if k.fp64 else CUDA_SPILL_BYTES
        spilled = max(k.spill_stores, k.spill_loads)
        if spilled > budget:
            out.append(f"{where}: spills {spilled} B > {budget} B")
        if k.streams_packs and not k.wide_loads:
            out.append(f"{where}: no 128-bit loads (nvcc.PACKED_KERNELS stream 16-byte packs)")
        if k.token_packs and not (k.wide_loads or k.wide_stores):
            out.append(f"{where}: no 128-bit loads or stores (nvcc.TOKEN_PACKED take 16-byte packs)")
        if k.shared > TARGETS[k.arch].max_shared_mem:
            out.append(f"{where}: static shared memory {k.shared} B > {TARGETS[k.arch].max_shared_mem} B")
    return out
