"""The Triton kernels' device-side asserts of their ops' value checks (docs/gpu_token_ops.md, "Input values
without a host sync").

A Triton kernel that lowers its op's validity flag also fails `tl.device_assert` there on a GPU, as the
CUDA C++ kernels do (csrc/cuda/common.cuh RLK_REQUIRE_VALUES), so the op enqueues no torch._assert_async
after it: one launch fewer a call (rlkernels/ops/_flags.py `asserted_in_kernel`). The kernel takes the
assert's message as the constexpr CHECK_MSG, None where it does not assert, and calls `require(ok,
CHECK_MSG)` where it lowers the flag, on what it checks itself (a flag AND-ed over several kernels is
asserted by each on its own part). The messages are the CUDA C++ kernels' (tests/test_device_asserts.py
holds both flavors to the same text).

Triton compiles `tl.device_assert` only with the launch option debug=True. On its own, debug also turns on
sanitize_overflow, which checks every 32-bit integer add, subtract and multiply for overflow; the options
here turn that off, so the compiled kernel is the plain one plus the assert. The compile check counts each
specialization's __assertfail calls (its `asserts` column) and fails one given a CHECK_MSG without any.

On CPU tensors (Triton's interpreter, the tests) the kernels do not assert: the flag runs the op's eager
checks, which raise the ValueError naming the value. `FORCE` makes them assert there too (the tests, with
the interpreter's own debug switched on: tests/test_device_asserts.py)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

FORCE = False  # tests: assert on CPU tensors too


def check(t: torch.Tensor, message: str | None) -> dict:
    """A flag-lowering kernel's launch arguments: CHECK_MSG (the assert's message, or None: this launch does
    not lower the flag) and the options that compile the assert: debug=True (tl.device_assert compiled),
    sanitize_overflow=False (no integer-overflow checks)."""
    # CUDA tensors, and meta ones, where the compile check builds the GPU's specializations
    if message is not None and (FORCE or t.device.type in ("cuda", "meta")):
        return {"CHECK_MSG": message, "debug": True, "sanitize_overflow": False}
    return {"CHECK_MSG": None}


@triton.jit
def require(ok, CHECK_MSG: tl.constexpr):
    """Fail the device-side assert with CHECK_MSG where `ok` (a scalar) is false; nothing when CHECK_MSG is
    None."""
    if CHECK_MSG is not None:
        tl.device_assert(ok, CHECK_MSG)
