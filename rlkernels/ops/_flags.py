"""The validity flag of a kernel that checks the input values it reads (docs/gpu_token_ops.md, "Input values
without a host sync"), turned into the op's error: one torch._assert_async on a GPU (and under torch.compile),
no host sync; on CPU tensors a raised flag runs the eager checks, which raise a ValueError naming the argument
and the first bad element."""

from __future__ import annotations

from collections.abc import Callable

import torch

from rlkernels import _validate as v


def check_flag(op: str, ok: torch.Tensor, message: str, eager_checks: Callable[[], object]) -> None:
    """Raise if `ok` (a one-element bool or integer tensor, 0 where the kernel found a bad input value) is 0.

    message: what a failed torch._assert_async reports (the device cannot say which value was bad, so it
    lists what is checked). eager_checks: the op's eager value checks, run only once the flag is down, to
    raise the error that names the value."""
    if not v.checks_eagerly(ok):
        v.assert_async(ok, message)
        return
    if bool(ok):
        return
    eager_checks()
    raise AssertionError(f"{op}: the kernel flagged an input value the eager checks accept ({message})")
