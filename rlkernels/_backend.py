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

# backend="auto" on CUDA tensors: each op's GPU backends, preferred first, and why. Four GPU runs so far,
# all on an H200 (../shared/gpu/README.md at 632af97; benchmarks/results/h200/2026-11-26/ at 0d4bbe5;
# benchmarks/results/h200/2026-11-27/ at aad47ba; benchmarks/results/h200/2026-11-30/ at 14676c3;
# benchmarks/results/h200/2026-11-30-b/ at c4c9a9f), executed
# every kernel of both flavors; where they timed
# both, the faster eager call goes first (forward + backward at the bench's LLM shapes), elsewhere the
# better-verified flavor. Triton kernels are compiled for sm_80 and
# sm_90 through their launchers (`python -m rlkernels compile-check`) and run against the float64 oracle under
# Triton's interpreter (`pytest -k triton-interpret`); CUDA C++ kernels are compiled by nvcc and run emulated
# on the CPU (`pytest -k cuda-on-cpu`), which cannot show GPU races, memory ordering or the device math
# intrinsics.
# docs/backends.md keeps the evidence and the measured times per op.
GPU_ORDER = {
    # Both H200 runs: CUDA C++ faster at every size (host work: its autograd node is C++, csrc/autograd/).
    "kl_penalty": ("cuda", "triton"),
    "policy_loss": ("cuda", "triton"),
    "value_loss": ("cuda", "triton"),  # the 2nd run: 0.25 ms against 0.60 at B=512 T=8192
    # the 5th run (2026-11-30, benchmarks/results/h200/2026-11-30-b/): 0.065 ms against 0.27 (torch.compile
    # 0.23) at B=512 T=8192; its device time alone 29.5 us against 25.9 (CUDA graph replay): host work decides
    "agg_loss": ("cuda", "triton"),
    "group_advantages": ("cuda", "triton"),  # the 2nd run: 0.64 ms against 0.81 at B=65536 (group ids)
    "gae": ("cuda", "triton"),  # the 2nd run: 0.031 ms against 0.070 at B=256 T=8192
    "discounted_returns": ("cuda", "triton"),  # as gae (the same scan kernels); not timed itself
    # cuBLAS blocks + Triton epilogues vs (since 2026-11-29, unmeasured) the same blocks + CUDA C++ row
    # kernels; per mode (GPU_ORDER_BY_MODE)
    "linear_logprobs": ("triton", "cuda"),
    # the 2nd run: Triton 2.4 ms against 4.5 at N=8192 V=151936 (bf16); the 4th, since the CUDA C++ row
    # kernels' 16-byte packs: CUDA C++ 2.52 ms against 3.02 (1.09 against 1.30 at N=4096 V=128256)
    "logprobs_from_logits": ("cuda", "triton"),
    "dpo_loss": (),  # reference only: a few [B] elementwise ops, nothing to fuse
    "dynamic_sampling": (),  # reference only: [B] values, torch.unique + scatter_reduce
    "overlong_penalty": (),  # reference only: one [B] elementwise expression
    "rollout_correction": ("cuda", "triton"),  # the 2nd run: 0.052 / 0.091 ms against 0.14 / 0.25 (token/seq)
    # Per-response passes with atomics at each group's first member (ops/advantage_estimators.py). The 4th
    # run: CUDA C++ faster at B=128 and B=8192 (T=2048), host-bound as group_advantages.
    "grpo_passk": ("cuda", "triton"),  # 0.155 ms against 0.387 at B=8192
    "opo": ("cuda", "triton"),  # 0.085 ms against 0.202 at B=128
    "optimal_token_baseline": ("cuda", "triton"),  # 0.281 ms against 0.475 at B=8192
}


# An op whose best flavor depends on whether a gradient is wanted: "<op>:no_grad" / "<op>:grad" entries,
# looked up first (select_backend's `mode`). The 2nd H200 run (N=8192 D=4096 V=128256, bf16): without a
# gradient the Triton flavor's cuBLAS blocks (FORWARD_ROWS = 8192) 15.6 ms against the CUDA C++ flavor's 16.5,
# in 1/7 of its memory; with one 62 ms against 230 (docs/backends.md has the times, docs/gpu_linear.md the
# paths). The CUDA C++ flavor has taken the Triton flavor's blocks since (the 230 ms were its misaligned
# slices); the model puts the two on a par, and the order stays until a GPU measures them.
GPU_ORDER_BY_MODE = {
    "linear_logprobs:no_grad": ("triton", "cuda"),
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
