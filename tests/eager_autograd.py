"""What the tests of the C++ eager autograd nodes (csrc/autograd/, tests/test_*_eager_autograd.py) share:
their cases, a dispatch mode that sees the registered op, and a call without a gradient that records no
node."""

from collections.abc import Callable, Iterable

import pytest
import torch
from kernel_calls import KernelCalls
from oracle import cpu_kernel_backends

# The flavors that run the native ops here: the C++ CPU kernels, and the CUDA kernels emulated on the CPU.
NATIVE = [f for f in cpu_kernel_backends() if f.kind.startswith("native")]
DTYPES = (torch.float32, torch.float64, torch.bfloat16)


def needs_eager_op(ops_module, name: str):
    """The test module's mark: skipped where the extension lacks `rlkernels::<name>` (built before it)."""
    return pytest.mark.skipif(ops_module._native_eager is None, reason=f"the extension has no {name}")


def cases(options: Iterable, emulated: set) -> list[tuple]:
    """(flavor, option, dtype): every option and dtype on the C++ CPU kernels; on the emulated CUDA kernels
    (seconds a call) only the (option, dtype) pairs in `emulated`."""
    return [
        (flavor, option, dtype)
        for flavor in NATIVE
        for option in options
        for dtype in DTYPES
        if flavor.kind == "native-cpu" or (option, dtype) in emulated
    ]


def assert_a_dispatch_mode_sees_the_registered_op(op: str, call: Callable[[], torch.Tensor]) -> None:
    """Under a dispatch mode (fake tensors, the GPU cost counter) the public function calls the registered
    op `rlkernels::<op>`, with its fake kernel and Python autograd formula, never `<op>_autograd`. `call`
    returns the output that carries the gradient. The mode sits below autograd, so it sees `<op>` on either
    path (the C++ node calls it too): the node the output carries is what tells them apart."""
    with KernelCalls() as mode:
        out = call()
    assert op in mode.ops, mode.ops
    assert out.requires_grad and type(out.grad_fn).__name__ != "CppFunction", type(out.grad_fn)


def assert_no_grad_and_inference_mode_record_nothing(call: Callable[[bool], torch.Tensor]) -> None:
    """call(detach) returns the differentiable output of the public function on the test's inputs (detached
    from their graph when `detach`): with a gradient it carries a node, under no_grad and inference_mode
    none, and all three values agree."""
    out = call(False)
    with torch.no_grad():
        no_grad = call(False)
    with torch.inference_mode():
        inference = call(True)
    assert out.requires_grad and not no_grad.requires_grad and not inference.requires_grad
    assert torch.equal(no_grad, out.detach()) and torch.equal(inference, out.detach())
