"""Backend selection: which implementation of an op runs for the given tensors.

`backend` is one of "auto", "triton", "cuda", "cpu", "reference":
- "auto": CUDA tensors -> the op's preferred GPU backend that is available (each op names its order,
  fastest first, from the benchmarks); CPU tensors -> the C++ kernel when the extension is built, else
  "reference"; other devices -> "reference".
- an explicit backend that cannot run here raises BackendUnavailableError (never a silent fallback).
- "triton" on CPU tensors runs only under TRITON_INTERPRET=1 (the tests).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Sequence

import torch

from rlkernels import _ext
from rlkernels._errors import BackendUnavailableError

BACKENDS = ("auto", "triton", "cuda", "cpu", "reference")


_TRITON_INSTALLED: bool | None = None  # memoized without functools (dynamo traces this module)


def triton_installed() -> bool:
    global _TRITON_INSTALLED
    if _TRITON_INSTALLED is None:
        _TRITON_INSTALLED = importlib.util.find_spec("triton") is not None
    return _TRITON_INSTALLED


def triton_interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def unavailable_reason(backend: str, device: torch.device) -> str | None:
    """None when `backend` can run on `device`, else the reason it cannot."""
    if backend == "reference":
        return None
    if backend == "cpu":
        if device.type != "cpu":
            return f"backend='cpu' runs on CPU tensors, got tensors on {device}"
        return _ext.unavailable_reason()
    if backend == "cuda":
        if device.type != "cuda":
            return f"backend='cuda' runs on CUDA tensors, got tensors on {device}"
        return _ext.unavailable_reason(cuda=True)
    if backend == "triton":
        if not triton_installed():
            return "triton is not installed"
        if device.type == "cuda" or (device.type == "cpu" and triton_interpreting()):
            return None
        return (
            f"backend='triton' runs on CUDA tensors (or on CPU tensors under TRITON_INTERPRET=1), "
            f"got tensors on {device}"
        )
    raise AssertionError(backend)


def select_backend(
    op: str,
    backend: str,
    device: torch.device,
    *,
    implemented: Sequence[str],
    gpu_order: Sequence[str] = ("triton", "cuda"),
) -> str:
    """Resolve `backend` for an op whose kernels exist for `implemented` backends ("reference" always)."""
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise ValueError(f"{op}: backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        if device.type == "cuda":
            order = [b for b in gpu_order if b in implemented]
        elif device.type == "cpu":
            order = ["cpu"] if "cpu" in implemented else []
        else:
            order = []
        for candidate in order:
            if unavailable_reason(candidate, device) is None:
                return candidate
        return "reference"
    if backend != "reference" and backend not in implemented:
        raise BackendUnavailableError(
            f"{op}: backend={backend!r} is not implemented for this op (available: "
            f"{', '.join(sorted(set(implemented) | {'reference'}))})"
        )
    reason = unavailable_reason(backend, device)
    if reason is not None:
        raise BackendUnavailableError(f"{op}: backend={backend!r} is unavailable: {reason}")
    return backend
