"""Backend selection: which implementation of an op runs for the given tensors.

`backend` is one of "auto", "triton", "cuda", "cpu", "reference":
- "auto": CUDA tensors -> the op's preferred GPU backend that is available (GPU_ORDER, with the evidence
  behind each order); CPU tensors -> the C++ kernel when the extension is built, else "reference"; other
  devices -> "reference".
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

# backend="auto" on CUDA tensors: each op's GPU backends, preferred first, and why. One GPU run so far (an
# H200, ../shared/gpu/README.md) executed every kernel of both flavors; where it timed both, the faster goes
# first, elsewhere the better-verified flavor. Triton kernels are compiled for sm_80 / sm_90 through their
# launchers (`python -m rlkernels compile-check`) and run against the float64 oracle under Triton's
# interpreter (`pytest -k triton-interpret`); CUDA C++ kernels are compiled by nvcc and run emulated on the
# CPU (`pytest -k cuda-on-cpu`), which cannot show GPU races, memory ordering or the device math intrinsics.
# docs/backends.md keeps the evidence and the measured times per op.
GPU_ORDER = {
    # The H200 run: both flavors correct (oracle tests passed, memcheck clean), CUDA C++ faster at every size.
    "kl_penalty": ("cuda", "triton"),
    "policy_loss": ("cuda", "triton"),
    "value_loss": ("triton", "cuda"),  # unmeasured on a GPU; both deterministic (no atomics)
    "group_advantages": ("triton", "cuda"),  # unmeasured on a GPU; launch-bound at usual sizes
    "gae": ("triton", "cuda"),  # unmeasured on a GPU; CUDA scans a row per block, Triton per program
    "discounted_returns": ("triton", "cuda"),  # as gae (the same scan kernels)
    # fused GEMM + softmax vs cuBLAS slices with an [N, C] fp32 buffer; per mode (GPU_ORDER_BY_MODE)
    "linear_logprobs": ("triton", "cuda"),
    "logprobs_from_logits": ("triton", "cuda"),  # unmeasured on a GPU; both stream each row once
    "dpo_loss": (),  # reference only: a few [B] elementwise ops, nothing to fuse
    "dynamic_sampling": (),  # reference only: [B] values, torch.unique + scatter_reduce
    "overlong_penalty": (),  # reference only: one [B] elementwise expression
    "rollout_correction": ("triton", "cuda"),  # unmeasured on a GPU; both one row per program, deterministic
    # Per-response passes with atomics at each group's first member (ops/advantage_estimators.py).
    "grpo_passk": ("triton", "cuda"),  # unmeasured on a GPU; launch-bound at usual sizes, as group_advantages
    "opo": ("triton", "cuda"),  # as grpo_passk
}


# An op whose best flavor depends on whether a gradient is wanted: "<op>:no_grad" / "<op>:grad" entries,
# looked up first (select_backend's `mode`). In the H200 run (N=8192, V=128256, bf16) the CUDA C++ flavor
# (cuBLAS slices) was the faster without a gradient, Triton with one (docs/backends.md has the times,
# docs/gpu_linear.md the model of the paths since).
GPU_ORDER_BY_MODE = {
    "linear_logprobs:no_grad": ("cuda", "triton"),
    "linear_logprobs:grad": ("triton", "cuda"),
}


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
    mode: str | None = None,
) -> str:
    """Resolve `backend` for an op whose kernels exist for `implemented` backends ("reference" always); "auto"
    on CUDA tensors follows GPU_ORDER, or GPU_ORDER_BY_MODE for the op and `mode` ("grad" / "no_grad")."""
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise ValueError(f"{op}: backend must be one of {BACKENDS}, got {backend!r}")
    gpu_order = GPU_ORDER[op]  # every op has an entry, looked up on every device so a missing one shows
    if mode is not None:
        gpu_order = GPU_ORDER_BY_MODE.get(f"{op}:{mode}", gpu_order)
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
