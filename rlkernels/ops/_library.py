"""Registration helpers shared by the ops modules.

An op exists in up to two flavors with the same schema: the native `rlkernels::<name>` defined in
csrc/rlkernels.cpp (CPU and CUDA kernels, present when the extension is built) and the Python custom op
`rlkernels::<name>_triton` around a Triton launcher. Both get the same fake implementation and the same
autograd formula, whose backward calls the flavor's own backward op.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rlkernels import _ext


def has_native(name: str) -> bool:
    """True when the extension is loaded and defines `rlkernels::<name>`."""
    return _ext.has_native_op(name)


def op(name: str):
    """The op packet `torch.ops.rlkernels.<name>`."""
    return getattr(torch.ops.rlkernels, name)


def register_op_pair(
    forward: str,
    backward: str,
    *,
    fake: Callable,
    fake_backward: Callable,
    setup_context: Callable | None = None,
    make_backward: Callable | None = None,
) -> None:
    """Register the fake kernels of a forward op and its backward op, and, when `make_backward` is
    given, the forward's autograd formula `make_backward(backward_op)`."""
    torch.library.register_fake(f"rlkernels::{forward}")(fake)
    torch.library.register_fake(f"rlkernels::{backward}")(fake_backward)
    if make_backward is not None:
        torch.library.register_autograd(
            f"rlkernels::{forward}", make_backward(op(backward)), setup_context=setup_context
        )
