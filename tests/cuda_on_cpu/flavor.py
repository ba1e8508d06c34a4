"""The `cuda-on-cpu` test flavor: the backend string "cpu" on CPU tensors, with the native ops' CPU kernels
swapped for the CUDA bindings and kernels compiled for the host (build.py).

Inside the context, every `rlkernels::` op that has a CUDA binding runs the sim's copy of it
(`rlkernels_sim::<op>`), and every other native op raises: a GPU never runs those CPU-only ops
(logprobs_from_logits_backward_into_logits, which ops/linear_sweep.py takes for CPU tensors only and is
switched to the GPU's path here). So no C++ CPU kernel can
stand in for a CUDA one in this flavor. The overrides live in torch.library.Library objects
destroyed on exit, which restores the real CPU kernels.
Tests that reach no native op at all in the flavor (input validation before dispatch) are listed in the
session summary (summary_lines) rather than counted silently as CUDA coverage.
"""

from __future__ import annotations

import contextlib
import os
import warnings

import torch

from . import build, cublas


class Stats:
    """Per session: tests run in the flavor, sim op calls, and the tests that made none."""

    def __init__(self) -> None:
        self.tests = 0
        self.calls = 0
        self.without_calls: list[str] = []

    def as_dict(self) -> dict:
        """What a pytest-xdist worker sends its controller (plain data)."""
        return dict(tests=self.tests, calls=self.calls, without_calls=list(self.without_calls))

    def add(self, other: dict) -> None:
        """A worker's as_dict() added into the controller's."""
        self.tests += other["tests"]
        self.calls += other["calls"]
        self.without_calls += other["without_calls"]


STATS = Stats()


def _native_ops() -> list[str]:
    """Every op of the real extension (schemas in csrc/rlkernels.cpp) with a CPU or a CUDA kernel, by name
    (the CUDA-only ones, logp_jacobian_chunk / _finish, get a CPU kernel here: the sim's)."""
    return sorted(
        name.split("::", 1)[1]
        for name in torch._C._dispatch_get_all_op_names()
        if name.startswith("rlkernels::")
        and any(torch._C._dispatch_has_kernel_for_dispatch_key(name, key) for key in ("CPU", "CUDA"))
    )


def _sim_kernel(name: str, calls: list[int]):
    sim_op = getattr(torch.ops.rlkernels_sim, name).default

    def kernel(*args, **kwargs):
        calls[0] += 1
        with torch._C._AutoDispatchBelowAutograd():
            return sim_op(*args, **kwargs)

    return kernel


def _no_cuda_kernel(name: str):
    def kernel(*args, **kwargs):
        raise NotImplementedError(
            f"rlkernels::{name} has no CUDA kernel (a GPU never runs it); "
            "the cuda-on-cpu flavor runs CUDA kernels only"
        )

    return kernel


@contextlib.contextmanager
def cuda_on_cpu():
    """Run the native ops of the rlkernels extension on the CUDA sources compiled for the host."""
    from rlkernels.ops import linear_sweep, policy_loss

    sim = build.load()
    calls = [0]
    ops = torch.library.Library("rlkernels", "IMPL")
    aten = torch.library.Library("aten", "IMPL")
    saved_into, into_logits = policy_loss._into_saved, linear_sweep._into_logits
    try:
        with warnings.catch_warnings():  # "Overriding a previously registered kernel": that is the point
            warnings.simplefilter("ignore")
            for name in _native_ops():
                ops.impl(name, _sim_kernel(name, calls) if name in sim.ops else _no_cuda_kernel(name), "CPU")
            cublas.register(aten)
        policy_loss._into_saved = None  # the GPU's path: the op's CUDA kernel (policy_loss.py)
        linear_sweep._into_logits = None  # likewise (ops/linear_sweep.py _logits_ops)
        yield sim
    finally:
        policy_loss._into_saved, linear_sweep._into_logits = saved_into, into_logits
        aten._destroy()
        ops._destroy()
        STATS.tests += 1
        STATS.calls += calls[0]
        if calls[0] == 0:
            STATS.without_calls.append(os.environ.get("PYTEST_CURRENT_TEST", "?").rsplit(" ", 1)[0])


def summary_lines() -> list[str]:
    if STATS.tests == 0:
        return []
    lines = [f"cuda-on-cpu: {STATS.tests} tests, {STATS.calls} calls of the CUDA bindings"]
    if STATS.without_calls:
        n = len(STATS.without_calls)
        lines.append(f"cuda-on-cpu: {n} tests reached no native op (checks before dispatch):")
        lines += [f"  {t}" for t in STATS.without_calls]
    return lines


def register() -> None:
    """Add the flavor to tests/oracle.py's kernel_flavors() (Linux; kernel_flavors() leaves it out when a
    GPU is present, where the CUDA kernels run for real)."""
    import oracle

    if build.platform_supported():
        oracle.register_flavor_context("cuda-on-cpu", cuda_on_cpu)
