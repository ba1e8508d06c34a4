"""The selftest's first question: does this checkout's C++ extension load here and run its kernels on this
device? If not, the command that builds it here, for this GPU's architecture only.

    python -m rlkernels.selftest_ext --device cuda --out check.json   # exit 0: usable; 1: not, and why

It runs in its own process: the selftest itself never loads the extension it may have to replace.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import json
import pathlib
import platform
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]


def device_arch() -> str:
    """This GPU's compute capability as TORCH_CUDA_ARCH_LIST spells it ("9.0")."""
    import torch

    major, minor = torch.cuda.get_device_capability(0)
    return f"{major}.{minor}"


def check(device: str) -> dict:
    """What a report needs about this machine, plus "problem": None when the extension loads and one of
    its ops runs on `device` (through the CUDA C++ kernels on a GPU), else why not."""
    import torch

    info = {"python": platform.python_version(), "torch": torch.__version__, "torch_cuda": torch.version.cuda}
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    if device == "cuda":
        p = torch.cuda.get_device_properties(0)
        info["gpu"] = (
            f"{p.name}, sm_{p.major}{p.minor}, {p.multi_processor_count} SMs, {p.total_memory >> 30} GiB"
        )
        info["device_arch"] = device_arch()
    from rlkernels import _ext

    if not _ext.ext_available():
        return {**info, "problem": f"the extension does not load: {_ext.ext_error()}"}
    build = _ext.build_info()
    info.update(ext_cuda=bool(build.get("cuda")), ext_archs=build.get("cuda_archs") or "")
    if device == "cuda" and not info["ext_cuda"]:
        return {**info, "problem": "the extension was built without its CUDA kernels"}
    try:  # the decisive test: an arch the build lacks fails here ("no kernel image is available")
        import rlkernels as rk

        x = torch.linspace(-1.0, 0.0, 37, device=device)
        rk.kl_penalty(x, x.flip(0), "k3", backend="cuda" if device == "cuda" else "cpu").sum().item()
    except Exception as e:  # any failure to run means: build it here
        return {**info, "problem": f"a kernel does not run: {type(e).__name__}: {str(e).splitlines()[0]}"}
    return {**info, "problem": None}


def build_command(arch: str, cpus: int) -> tuple[list[str], dict]:
    """The README's editable install, for `arch` only and on every CPU; no index (the lent machines have no
    package registry, and the build needs nothing from one)."""
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--no-build-isolation",
        "--no-deps",
        "--no-index",
        "-e",
        ".",
    ]
    env = {"RLKERNELS_CUDA": "1", "TORCH_CUDA_ARCH_LIST": arch, "MAX_JOBS": str(cpus)}
    return cmd, env


def remove_built_library() -> list[pathlib.Path]:
    """Unlink this interpreter's rlkernels/_C library before a rebuild: a process that has it mapped keeps
    the old file, instead of seeing it rewritten under it."""
    removed = []
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = REPO / "rlkernels" / f"_C{suffix}"
        if path.exists():
            path.unlink()
            removed.append(path)
    return removed


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rlkernels.selftest_ext", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--out", required=True, help="where the JSON answer goes")
    args = parser.parse_args(argv)
    try:
        info = check(args.device)
    except Exception as e:  # the answer must still say why
        info = {"problem": f"the check itself failed: {type(e).__name__}: {str(e).splitlines()[0]}"}
    pathlib.Path(args.out).write_text(json.dumps(info, indent=1) + "\n")
    print(json.dumps(info))
    return 0 if info["problem"] is None else 1


if __name__ == "__main__":
    sys.exit(main())
