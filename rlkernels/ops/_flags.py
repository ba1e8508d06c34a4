"""The validity flag of a kernel that checks the input values it reads (docs/gpu_token_ops.md, "Input values
without a host sync"), turned into the op's error, with no host sync: on CPU tensors a raised flag runs the
eager checks, which raise a ValueError naming the argument and the first bad element; on a GPU the kernels
of both flavors fail a device-side assert where they lower the flag, and a flag that no kernel asserted
(Triton's interpreter under torch.compile's tracing) takes one torch._assert_async."""

from __future__ import annotations

from collections.abc import Callable

import torch

from rlkernels import _validate as v


def asserted_in_kernel(backend: str, ok: torch.Tensor) -> bool:
    """Whether the kernels of `backend` that wrote `ok` have already failed a device-side assert on a bad
    value, so that the flag needs no torch._assert_async (a launch of its own): the CUDA C++ kernels
    always (csrc/cuda/common.cuh RLK_REQUIRE_VALUES), the Triton ones on CUDA tensors
    (rlkernels/triton/_device_assert.py `check`; check_flag asks only off the eager path, so
    its test-only FORCE on CPU tensors never reaches here)."""
    return backend == "cuda" or (backend == "triton" and ok.is_cuda)


def check_flag(
    op: str, ok: torch.Tensor, message: str, eager_checks: Callable[[], object], *, backend: str
) -> None:
    """Raise if `ok` (a one-element bool or integer tensor, 0 where the kernel found a bad input value) is 0.

    message: what a failed torch._assert_async reports (the device cannot say which value was bad, so it
    lists what is checked). eager_checks: the op's eager value checks, run only once the flag is down, to
    raise the error that names the value. backend: the flavor whose kernels wrote `ok`, every one of them
    (see asserted_in_kernel)."""
    if not v.checks_eagerly(ok):
        if not asserted_in_kernel(backend, ok):
            v.assert_async(ok, message)
        return
    if bool(ok):
        return
    eager_checks()
    raise AssertionError(f"{op}: the kernel flagged an input value the eager checks accept ({message})")
