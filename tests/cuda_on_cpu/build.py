"""Builds and loads the cuda-on-cpu simulator: csrc/cuda's kernels and bindings compiled by the host
compiler against the harness (tests/cuda_on_cpu/include, src), as the torch library `rlkernels_sim`.

The rewritten sources (preprocess.py) go to build/cuda_on_cpu/src, and torch.utils.cpp_extension.load
compiles them with ninja in build/cuda_on_cpu: a source that did not change is not rewritten (its mtime
stays) and is not recompiled. The sim's ops get the schemas of the real `rlkernels::` ops they implement,
copied at load time, so that the two cannot drift apart.

The built library is also kept under a digest of everything that decides it (`sim_digest`: the rewritten
sources, the headers they may include, the flags, torch's and the compiler's versions, this builder and the
rewriter), in ~/.cache/rlkernels/cuda_on_cpu (or $RLKERNELS_CACHE_DIR; RLKERNELS_SIM_CACHE=0 turns it
off): a fresh clone of unchanged sources (CI's) loads it instead of compiling 31 sources (about 370
CPU-seconds).
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

from . import preprocess

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CUDA_SRC = ROOT / "csrc" / "cuda"
BUILD_DIR = ROOT / "build" / "cuda_on_cpu"
GENERATED = BUILD_DIR / "src"
# Harness kernels of tests/test_cuda_on_cpu.py, compiled like csrc/cuda's .cu files.
SELFTEST = HERE / "selftest.cu"
# -Drlk=...: the sim's copy of the rlk namespace gets its own symbols, so that nothing in it can bind to
# the real extension's (loaded in the same process). -O2: the kernels run once per simulated thread.
CFLAGS = ["-O2", "-std=c++20", "-Drlk=rlk_cuda_on_cpu", "-Wno-unknown-pragmas", "-fno-math-errno"]


# Built libraries kept in the cache: the newest ones (a few development states), 4-5 MB each.
KEEP_BUILDS = 8


class BuildError(RuntimeError):
    pass


def platform_supported() -> bool:
    """The harness needs g++ (or a compatible compiler) with C++20's <barrier> on Linux."""
    return sys.platform.startswith("linux")


def _write_if_changed(path: pathlib.Path, text: str) -> None:
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


def generate() -> tuple[list[pathlib.Path], list[str]]:
    """Rewrite csrc/cuda (and the harness's own kernels) into GENERATED; returns the sources to compile and
    the ops the bindings implement."""
    GENERATED.mkdir(parents=True, exist_ok=True)
    sources, ops = [], []
    for path in sorted(CUDA_SRC.iterdir()):
        text = path.read_text()
        if path.suffix == ".cu":
            out = GENERATED / (path.name + ".cpp")
            _write_if_changed(out, preprocess.rewrite_cuda_source(text, str(path), prologue=True))
            sources.append(out)
        elif path.name.endswith("_binding.cpp"):
            body, names = preprocess.rewrite_binding(text, str(path))
            _write_if_changed(GENERATED / path.name, body)
            sources.append(GENERATED / path.name)
            ops += names
        elif path.suffix in (".h", ".cuh"):
            header = preprocess.rewrite_cuda_source(text, str(path), prologue=False)
            _write_if_changed(GENERATED / path.name, header)
        else:
            raise BuildError(f"{path}: a file of csrc/cuda the harness does not know how to build")
    out = GENERATED / "selftest.cu.cpp"
    _write_if_changed(out, preprocess.rewrite_cuda_source(SELFTEST.read_text(), str(SELFTEST), prologue=True))
    sources.append(out)
    sources += sorted((HERE / "src").glob("*.cpp"))
    return sources, sorted(ops)


def _define_schemas(ops: list[str]) -> object:
    """A library `rlkernels_sim` with the schema of each real `rlkernels::<op>` (the extension must load)."""
    import torch

    from rlkernels import _ext

    if not _ext.ext_available():
        raise BuildError(f"rlkernels._C does not load ({_ext.ext_error()}); the sim copies its schemas")
    lib = torch.library.Library(preprocess.SIM_LIBRARY, "DEF")
    for name in ops:
        schema = str(getattr(torch.ops.rlkernels, name).default._schema)
        lib.define(schema.split("::", 1)[1])
    return lib


class Sim:
    """The loaded simulator: `ops` (the rlkernels ops with a CUDA binding, now also under
    torch.ops.rlkernels_sim) and `path` (the shared library, also for ctypes: the harness's self-tests)."""

    def __init__(self, path: str, ops: list[str], library) -> None:
        self.path = path
        self.ops = ops
        self._library = library  # keeps the schemas defined


_SIM: Sim | None = None
_FAILURE: BuildError | None = None  # a failed build is not retried in the same process


def load(verbose: bool = False) -> Sim:
    """Build (incrementally) and load the simulator once per process; a failure raises BuildError."""
    global _SIM, _FAILURE
    if _SIM is not None:
        return _SIM
    if _FAILURE is not None:
        raise _FAILURE
    try:
        _SIM = _build_and_load(verbose)
    except BuildError as e:
        _FAILURE = e
        raise
    return _SIM


def _build_and_load(verbose: bool) -> Sim:
    # One process at a time: the pytest-xdist workers each load the harness, and generate() rewrites the
    # sources that another worker's compiler may be reading (cpp.load locks only its own build step).
    if not platform_supported():
        raise BuildError(f"the cuda-on-cpu harness runs on Linux only, not {sys.platform}")
    import fcntl

    BUILD_DIR.mkdir(parents=True, exist_ok=True)
    with open(BUILD_DIR / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _build_and_load_locked(verbose)


def _build_and_load_locked(verbose: bool) -> Sim:
    if shutil.which(os.environ.get("CXX", "c++")) is None:
        raise BuildError("the cuda-on-cpu harness needs a C++20 compiler (c++ / $CXX) on PATH")
    import torch
    import torch.utils.cpp_extension as cpp

    sources, ops = generate()
    library = _define_schemas(ops)
    kept = _kept_build(sources)
    if kept is not None and kept.exists():
        torch.ops.load_library(str(kept))  # what cpp.load does with a library it built
        return _checked(Sim(str(kept), ops, library))
    try:
        path = cpp.load(
            name="rlkernels_cuda_on_cpu",
            sources=[str(s) for s in sources],
            extra_include_paths=[str(HERE / "include"), str(ROOT / "csrc" / "include")],
            extra_cflags=CFLAGS,
            build_directory=str(BUILD_DIR),
            is_python_module=False,
            verbose=verbose,
        )
    except Exception as e:  # compiler output is in the exception (or above with verbose=True)
        raise BuildError(f"building the cuda-on-cpu simulator failed: {e}") from e
    sim = _checked(Sim(path, ops, library))
    if kept is not None:
        _keep(pathlib.Path(path), kept)
    return sim


def _checked(sim: Sim) -> Sim:
    import torch

    has_kernel = torch._C._dispatch_has_kernel_for_dispatch_key
    missing = [op for op in sim.ops if not has_kernel(f"{preprocess.SIM_LIBRARY}::{op}", "CPU")]
    if missing:
        raise BuildError(f"the simulator registered no kernel for {missing}")
    return sim


def cache_dir() -> pathlib.Path | None:
    """Where built simulators are kept: $RLKERNELS_CACHE_DIR/cuda_on_cpu, else ~/.cache/rlkernels/cuda_on_cpu;
    None (every clone builds its own) with RLKERNELS_SIM_CACHE=0."""
    from rlkernels import _cache

    return _cache.cache_dir("cuda_on_cpu", "RLKERNELS_SIM_CACHE")


def sim_digest(sources: list[pathlib.Path]) -> str:
    """A digest of what decides the built simulator: the sources (rewritten), every header they may include
    (the rewritten csrc/cuda headers, the harness's and csrc/include), the flags, torch's and the compiler's
    versions, and this builder and the rewriter; the checkout's path left out (the rewritten sources' #line
    directives name it: a kept build's assert messages name the files of the checkout that built it)."""
    import torch

    from rlkernels import _cache

    compiler = shutil.which(os.environ.get("CXX", "c++")) or "c++"
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout
    headers = [
        p
        for root in (GENERATED, HERE / "include", ROOT / "csrc" / "include")
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.suffix in (".h", ".cuh")
    ]
    builder = (pathlib.Path(__file__), pathlib.Path(preprocess.__file__))
    return _cache.digest((torch.__version__, version, *CFLAGS), (*sources, *headers, *builder), ROOT)


def _kept_build(sources: list[pathlib.Path]) -> pathlib.Path | None:
    where = cache_dir()
    return None if where is None else where / f"rlkernels_cuda_on_cpu-{sim_digest(sources)[:32]}.so"


def _keep(built: pathlib.Path, kept: pathlib.Path) -> None:
    """Copies the built library to the cache (whole: no other process sees half of it) and drops all but
    the KEEP_BUILDS newest."""
    from rlkernels import _cache

    _cache.store(kept, lambda path: shutil.copyfile(built, path))
    builds = sorted(kept.parent.glob("rlkernels_cuda_on_cpu-*.so"), key=lambda p: p.stat().st_mtime)
    for old in builds[:-KEEP_BUILDS]:
        old.unlink(missing_ok=True)


if __name__ == "__main__":  # cd tests && python -m cuda_on_cpu.build: build (verbosely), list the ops
    sim = load(verbose=True)
    print(sim.path)
    print("\n".join(sim.ops))
