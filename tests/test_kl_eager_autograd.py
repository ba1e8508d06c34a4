"""kl_penalty's native flavor in plain eager mode runs rlkernels::kl_penalty_autograd, whose autograd node is
C++ (csrc/autograd/kl_penalty.cpp). It must be the Python formula of rlkernels/ops/kl.py exactly: the same
kernels, so the same bits, for every gradient request (both inputs, one, an upstream gradient expanded from
one element, retain_graph), kind, clamp and dtype. Under a dispatch mode the public function takes the
registered op instead; without a gradient the node records nothing."""

import pytest
import torch
from eager_autograd import (
    NATIVE,
    assert_a_dispatch_mode_sees_the_registered_op,
    assert_no_grad_and_inference_mode_record_nothing,
    cases,
    needs_eager_op,
)

import rlkernels as rk
import rlkernels.ops.kl as ops

pytestmark = needs_eager_op(ops, "kl_penalty_autograd")

KINDS = ("k1", "abs", "k2", "k3", "k1+", "k3+")
# The emulated CUDA kernels: k3 and k1+ in fp32.
CASES = cases(KINDS, {("k3", torch.float32), ("k1+", torch.float32)})


def _requests(logp, ref, upstream):
    return [
        ("sum, both", lambda out: torch.autograd.grad(out.sum(), [logp, ref])),
        ("upstream, logp only", lambda out: torch.autograd.grad(out, [logp], upstream)),
        ("upstream, ref only", lambda out: torch.autograd.grad(out, [ref], upstream)),
        (
            "retain_graph, then both",
            lambda out: (
                torch.autograd.grad(out.sum(), [logp], retain_graph=True)
                + torch.autograd.grad(out, [logp, ref], upstream)
            ),
        ),
    ]


@pytest.mark.parametrize("clamp", [10.0, None])
@pytest.mark.parametrize("backend,kind,dtype", CASES)
def test_cpp_node_is_the_python_formula(backend, kind, dtype, clamp, monkeypatch, seed):
    logp = (-torch.rand(6, 41, dtype=torch.float64) * 3).to(dtype).requires_grad_()
    ref = (-torch.rand(6, 41, dtype=torch.float64) * 3).to(dtype).requires_grad_()
    upstream = torch.randn(6, 41, dtype=torch.float64).to(dtype)
    results = {}
    for path in ("cpp", "python"):
        if path == "python":
            monkeypatch.setattr(ops, "_native_eager", None)
        for name, request in _requests(logp, ref, upstream):
            out = rk.kl_penalty(logp, ref, kind, clamp=clamp, backend=backend)
            results[path, name] = (type(out.grad_fn).__name__, out, request(out))
    for name, _ in _requests(logp, ref, upstream):
        node, out, grads = results["cpp", name]
        py_node, py_out, py_grads = results["python", name]
        assert node == "CppFunction" and py_node != "CppFunction"
        assert torch.equal(out, py_out), name
        assert len(grads) == len(py_grads), name
        assert all(torch.equal(g, p) for g, p in zip(grads, py_grads, strict=True)), name


@pytest.mark.parametrize("backend", NATIVE)
def test_no_grad_and_inference_mode_record_nothing(backend):
    logp, ref = (-torch.rand(5, 9)).requires_grad_(), -torch.rand(5, 9)

    def call(detach):
        return rk.kl_penalty(logp.detach() if detach else logp, ref, backend=backend)

    assert_no_grad_and_inference_mode_record_nothing(call)


def test_a_dispatch_mode_sees_the_registered_op():
    logp, ref = (-torch.rand(5, 9)).requires_grad_(), -torch.rand(5, 9)
    assert_a_dispatch_mode_sees_the_registered_op(
        "kl_penalty", lambda: rk.kl_penalty(logp, ref, backend="cpu")
    )
