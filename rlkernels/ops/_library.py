"""Registration helpers shared by the ops modules.

An op exists in up to two flavors with the same schema: the native `rlkernels::<name>` defined in
csrc/rlkernels.cpp (CPU and CUDA kernels, present when the extension is built) and the Python custom op
`rlkernels::<name>_triton` around a Triton launcher. Both get the same fake implementation and the same
autograd formula, whose backward calls the flavor's own backward op.

Calling a custom op from Python costs a dispatcher round trip through torch.library's Python autograd
kernel (~20 us), which dominates for per-token tensors of a few thousand elements on a GPU. In eager mode
`register_op_pair` therefore also returns a launcher that skips it: below the autograd dispatch key when
no gradient is needed, or through an equivalent torch.autograd.Function built from the same
`setup_context` / `backward` when one is; and a Python custom op (the Triton flavors) is then called as
its function, with no dispatcher at all, unless a dispatch mode is active (fake tensors, a counter), which
must see the op. Under torch.compile the launcher calls the registered op, so that graphs see one opaque,
fake-able node (the quack approach).
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


def _needs_grad(args) -> bool:
    return torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args)


def _eager_autograd_function(name: str, forward_op, setup_context: Callable, backward: Callable) -> Callable:
    """torch.autograd.Function running `forward_op` below the autograd key, with the op's own formulas."""

    def forward(
        ctx, *args
    ):  # ctx-style forward: a separate setup_context costs an inspect.signature per call
        with torch._C._AutoDispatchBelowAutograd():
            output = forward_op(*args)
        setup_context(ctx, args, output)
        # Called by the public functions only, which return none of the op's internal outputs: a backward
        # may recycle their buffers (policy_loss's saved gradients), which it must not do for a direct
        # call of the registered op, whose caller holds every output.
        ctx.fast_path = True
        return output

    fn = type(
        f"{name}_eager",
        (torch.autograd.Function,),
        {"forward": staticmethod(forward), "backward": staticmethod(backward)},
    )
    return fn.apply


def register_op_pair(
    forward: str,
    backward: str,
    *,
    fake: Callable,
    fake_backward: Callable,
    setup_context: Callable,
    make_backward: Callable,
) -> Callable:
    """Register the fake kernels of `rlkernels::<forward>` and `rlkernels::<backward>`, and the forward's
    autograd formula `make_backward(backward_op)` with `setup_context`. Returns launch(*args), which
    runs the op (see the module docstring for the eager fast path)."""
    torch.library.register_fake(f"rlkernels::{forward}")(fake)
    torch.library.register_fake(f"rlkernels::{backward}")(fake_backward)
    backward_fn = make_backward(op(backward))
    torch.library.register_autograd(f"rlkernels::{forward}", backward_fn, setup_context=setup_context)
    forward_op = op(forward).default
    eager_autograd = _eager_autograd_function(forward, forward_op, setup_context, backward_fn)
    direct = _python_impl(forward)
    if direct is not None:  # a Python custom op (Triton): in plain eager mode, its function itself
        eager_direct = _eager_autograd_function(
            forward, direct, setup_context, make_backward(direct_or_op(backward))
        )
    else:
        eager_direct = eager_autograd

    def launch(*args):
        if torch.compiler.is_compiling():
            return forward_op(*args)
        plain = direct is not None and torch._C._len_torch_dispatch_stack() == 0
        if _needs_grad(args):
            return eager_direct(*args) if plain else eager_autograd(*args)
        with torch._C._AutoDispatchBelowAutograd():
            return direct(*args) if plain else forward_op(*args)

    return launch


def takes_native_eager(native_eager, backend: str, t: torch.Tensor) -> bool:
    """Whether a call on `t` takes its op's native eager op, the one with its autograd node in C++
    (`rlkernels::<op>_autograd`, `native_eager`; None where the extension lacks it): a native backend in plain
    eager mode, that is no torch.compile trace, no dispatch mode (fake tensors, a counter: they must see the
    registered op) and a plain tensor."""
    return (
        backend != "triton"
        and native_eager is not None
        and not torch.compiler.is_compiling()
        and torch._C._len_torch_dispatch_stack() == 0
        and type(t) is torch.Tensor
    )


def _python_impl(name: str) -> Callable | None:
    """The Python function behind the custom op `rlkernels::<name>` (torch.library.custom_op), or None for
    a native op. Called directly it skips the dispatcher's Python round trip (the eager fast path)."""
    from torch._library.custom_ops import OPDEFS

    opdef = OPDEFS.get(f"rlkernels::{name}")
    return None if opdef is None else opdef._init_fn


class _Direct:
    """A Python custom op's function under the op's name (`op_name`), for the eager fast path's backward."""

    def __init__(self, name: str, fn: Callable):
        self.qualname, self.fn = f"rlkernels::{name}", fn

    def __call__(self, *args):
        if torch._C._len_torch_dispatch_stack():  # a mode (fake tensors, a counter) sees the registered op
            return op(self.qualname.split("::")[1])(*args)
        return self.fn(*args)


def direct_or_op(name: str):
    """`rlkernels::<name>` as the eager fast path calls it: a Python custom op's function itself outside any
    dispatch mode (_Direct), a native op as the registered op."""
    fn = _python_impl(name)
    return op(name) if fn is None else _Direct(name, fn)


def op_name(backward_op) -> str:
    """'rlkernels::<name>' of an op packet or of the eager fast path's direct call of it."""
    return getattr(backward_op, "qualname", None) or backward_op._qualified_op_name


def register_backends(name: str, **registration: Callable) -> tuple[dict[str, str], dict[str, Callable]]:
    """Register every flavor of op `name` with `register_op_pair` (same fake kernels and autograd formula):
    the Triton op `<name>_triton`, and the native op `<name>` (serving "cpu" and "cuda") when the extension
    is built. Returns (backend -> op name in torch.ops.rlkernels, backend -> launcher)."""
    flavors = {"triton": f"{name}_triton"}
    if has_native(name):
        flavors["cpu"] = flavors["cuda"] = name
    launchers = {f: register_op_pair(f, f + "_backward", **registration) for f in set(flavors.values())}
    return flavors, {backend: launchers[f] for backend, f in flavors.items()}


def register_constant_backends(name: str, *, fake: Callable) -> dict[str, Callable]:
    """Register every flavor of the constant op `name` with `register_constant_op` (same fake kernel): the
    Triton op `<name>_triton`, and the native op `<name>` (serving "cpu" and "cuda") when the extension is
    built. Returns backend -> launcher."""
    launchers = {"triton": register_constant_op(f"{name}_triton", fake=fake)}
    if has_native(name):
        launchers["cpu"] = launchers["cuda"] = register_constant_op(name, fake=fake)
    return launchers


def register_constant_op(name: str, *, fake: Callable) -> Callable:
    """Register the fake kernel of `rlkernels::<name>`, an op whose outputs are constants for the losses
    (advantages, returns: no autograd formula; callers pass detached inputs). Returns launch(*args):
    below the autograd dispatch key in eager mode (skipping torch.library's Python autograd kernel), the
    registered op under torch.compile."""
    torch.library.register_fake(f"rlkernels::{name}")(fake)
    forward_op = op(name).default
    direct = _python_impl(name)

    def launch(*args):
        if torch.compiler.is_compiling():
            return forward_op(*args)
        with torch._C._AutoDispatchBelowAutograd():
            if direct is not None and torch._C._len_torch_dispatch_stack() == 0:
                return direct(*args)
            return forward_op(*args)

    return launch
