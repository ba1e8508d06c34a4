"""The validity flag of a kernel that checks the input values it reads (docs/gpu_token_ops.md, "Input values
without a host sync"), turned into the op's error, with no host sync: on CPU tensors a raised flag runs the
eager checks, which raise a ValueError naming the argument and the first bad element; on a GPU the CUDA C++
kernels fail a device-side assert where they lower the flag, and the other flavors' flag takes one
torch._assert_async (so does every flavor's under torch.compile's tracing, but the CUDA C++ one)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from rlkernels import _validate as v

# The backends whose kernels fail a device-side assert themselves where they lower an op's flag
# (csrc/cuda/common.cuh RLK_REQUIRE_VALUES): their flag on a GPU needs no torch._assert_async, a launch
# of its own. Triton's tl.device_assert is compiled only in debug mode, so the Triton flavor keeps it.
ASSERTED_IN_KERNEL = frozenset({"cuda"})


def check_flag(
    op: str, ok: torch.Tensor, message: str, eager_checks: Callable[[], object], *, backend: str
) -> None:
    """Raise if `ok` (a one-element bool or integer tensor, 0 where the kernel found a bad input value) is 0.

    message: what a failed torch._assert_async reports (the device cannot say which value was bad, so it
    lists what is checked). eager_checks: the op's eager value checks, run only once the flag is down, to
    raise the error that names the value. backend: the flavor whose kernels wrote `ok`, every one of them
    (a backend of ASSERTED_IN_KERNEL: its kernels have already asserted on a GPU)."""
    if not v.checks_eagerly(ok):
        if backend not in ASSERTED_IN_KERNEL:
            v.assert_async(ok, message)
        return
    if bool(ok):
        return
    eager_checks()
    raise AssertionError(f"{op}: the kernel flagged an input value the eager checks accept ({message})")
