"""Backward passes on fake CUDA tensors without a GPU: the C++ autograd engine asks the CUDA runtime for the
device's streams before it runs a node, so the graph is walked from Python instead."""

from __future__ import annotations

import contextlib

import torch


def walk_backward(outputs, inputs, grad_outputs=None) -> tuple:
    """torch.autograd.grad(outputs, inputs, grad_outputs, allow_unused=True), computed by calling each node
    of the autograd graph from Python in topological order. The C++ engine cannot run a backward on fake
    CUDA tensors without a GPU (it asks the CUDA runtime for the device's streams); a node called directly
    does not. Tensor hooks are not run (the library registers none); no graph of the gradients is built."""
    outputs = [outputs] if isinstance(outputs, torch.Tensor) else list(outputs)
    inputs = [inputs] if isinstance(inputs, torch.Tensor) else list(inputs)
    if grad_outputs is None or isinstance(grad_outputs, torch.Tensor):
        grad_outputs = [grad_outputs] * len(outputs) if len(outputs) == 1 else [None] * len(outputs)
    pending: dict = {}
    found: dict[int, torch.Tensor] = {}
    for out, g in zip(outputs, grad_outputs, strict=True):
        g = torch.ones_like(out) if g is None else g
        if out.grad_fn is None:
            found[id(out)] = g
        else:
            slot = pending.setdefault(out.grad_fn, {})
            index = out.output_nr
            slot[index] = g if index not in slot else slot[index] + g
    post, seen = [], set()
    stack = [(out.grad_fn, False) for out in outputs]
    while stack:  # iterative depth-first post-order
        node, expanded = stack.pop()
        if node is None or (not expanded and node in seen):
            continue
        if expanded:
            post.append(node)
            continue
        seen.add(node)
        stack.append((node, True))
        stack.extend((nxt, False) for nxt, _ in node.next_functions if nxt is not None)
    wanted = {id(x) for x in inputs}
    with torch.no_grad():
        for node in reversed(post):  # each node after every node that feeds it a gradient
            grads = pending.pop(node, {})
            if type(node).__name__ == "AccumulateGrad":
                if 0 in grads:
                    found[id(node.variable)] = grads[0]
                continue
            materialize = not hasattr(node, "apply") or node.__dict__.get("_walk_materialize", True)
            args = [
                grads[i] if i in grads else _zeros_or_none(m, materialize)
                for i, m in enumerate(node._input_metadata)
            ]
            for (nxt, index), g in _edges(node, args):
                if g is None:
                    continue
                slot = pending.setdefault(nxt, {})
                slot[index] = g if index not in slot else slot[index] + g
    if any(i not in found and x.grad_fn is not None for i, x in ((id(x), x) for x in inputs) if i in wanted):
        raise NotImplementedError("walk_backward: gradients with respect to non-leaf tensors")
    return tuple(found.get(id(x)) for x in inputs)


def _edges(node, grads: list) -> list:
    """((next node, its input index), gradient) for every edge of `node` that leads somewhere. A C++ node
    returns a gradient per edge. A Python autograd.Function's backward returns one per forward argument,
    tensors or not, while its edges are its tensor arguments; those that require a gradient (which alone
    have a next node) are the arguments whose `needs_input_grad` is set, in order."""
    if not hasattr(node, "apply"):
        outs = node(*grads)
        outs = outs if isinstance(outs, tuple) else (outs,)
        return [(e, g) for e, g in zip(node.next_functions, outs, strict=True) if e[0] is not None]
    outs = node.apply(*grads)
    outs = outs if isinstance(outs, tuple) else (outs,)
    edges = [e for e in node.next_functions if e[0] is not None]
    positions = [p for p, need in enumerate(node.needs_input_grad) if need]
    return [(e, outs[p]) for e, p in zip(edges, positions, strict=True)]


def _zeros_or_none(metadata, materialize: bool):
    """The gradient of an output nobody differentiated: zeros, as the engine gives a node, or None for an
    autograd.Function that called ctx.set_materialize_grads(False) (the engine passes an undefined
    tensor, and launches nothing)."""
    if not materialize:
        return None
    return torch.zeros(metadata.shape, dtype=metadata.dtype, device=metadata.device)


@contextlib.contextmanager
def python_autograd():
    """torch.autograd.grad (what the library and this module call) through walk_backward, for fake CUDA
    tensors; autograd.Functions remember set_materialize_grads (the C++ flag cannot be read back)."""
    from torch.autograd.function import BackwardCFunction

    real = torch.autograd.grad
    real_set = BackwardCFunction.set_materialize_grads

    def set_materialize_grads(self, value):
        self.__dict__["_walk_materialize"] = bool(value)
        return real_set(self, value)

    def grad(
        outputs, inputs, grad_outputs=None, retain_graph=None, create_graph=False, allow_unused=None, **kwargs
    ):
        first = outputs if isinstance(outputs, torch.Tensor) else outputs[0]
        if first.device.type != "cuda" or create_graph:
            return real(
                outputs, inputs, grad_outputs, retain_graph, create_graph, allow_unused=allow_unused, **kwargs
            )
        return walk_backward(outputs, inputs, grad_outputs)

    torch.autograd.grad = grad
    BackwardCFunction.set_materialize_grads = set_materialize_grads
    try:
        yield
    finally:
        torch.autograd.grad = real
        BackwardCFunction.set_materialize_grads = real_set
