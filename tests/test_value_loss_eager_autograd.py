"""value_loss's native flavor in plain eager mode runs rlkernels::value_loss_autograd, whose autograd node is
C++ (csrc/autograd/value_loss.cpp). It must be the Python formula of rlkernels/ops/value_loss.py exactly: the
same kernels, so the same bits, for every mode, clip, normalizer form, dtype and gradient request (an
upstream gradient, retain_graph). Under a dispatch mode the public function takes the registered op instead;
without a gradient the node records nothing."""

import pytest
import torch
from eager_autograd import (
    NATIVE,
    assert_a_dispatch_mode_sees_the_registered_op,
    assert_no_grad_and_inference_mode_record_nothing,
    cases,
    needs_eager_op,
)

import rlkernels.ops.value_loss as ops
from rlkernels.reference.aggregation import AGG_MODES

pytestmark = needs_eager_op(ops, "value_loss_autograd")

# The emulated CUDA kernels: two modes in fp32.
CASES = cases(AGG_MODES, {("token-mean", torch.float32), ("seq-mean-token-sum", torch.float32)})


def _inputs(dtype, b=6, t=41):
    cpu = dict(generator=torch.Generator().manual_seed(b * t), device="cpu")
    values = torch.randn(b, t, dtype=torch.float64, **cpu).to(dtype).requires_grad_()
    old = (values.detach().double() + 0.3 * torch.randn(b, t, dtype=torch.float64, **cpu)).to(dtype)
    returns = torch.randn(b, t, dtype=torch.float64, **cpu).to(dtype)
    return values, old, returns, torch.rand(b, t, **cpu) > 0.3


@pytest.mark.parametrize("clip", [0.2, None])
@pytest.mark.parametrize("normalizer", ["none", "tensor"])
@pytest.mark.parametrize("backend,agg,dtype", CASES)
def test_cpp_node_is_the_python_formula(backend, agg, dtype, normalizer, clip, monkeypatch, seed):
    values, old, returns, mask = _inputs(dtype)
    glob = (
        {} if normalizer == "none" else dict(num_tokens=mask.sum() * 2.0, num_seqs=torch.tensor(9), dp_size=2)
    )
    upstream = torch.randn((), dtype=torch.float64).float()

    def requests(out):
        return {
            "upstream": lambda: torch.autograd.grad(out, [values], upstream.to(out.dtype), retain_graph=True),
            "retain_graph, twice": lambda: (
                torch.autograd.grad(out, [values], retain_graph=True) + torch.autograd.grad(out, [values])
            ),
        }

    results = {}
    for path in ("cpp", "python"):
        if path == "python":
            monkeypatch.setattr(ops, "_native_eager", None)
        out, stats = ops.value_loss(values, old, returns, mask, clip=clip, agg=agg, **glob, backend=backend)
        grads = {k: r() for k, r in requests(out).items()}
        results[path] = (type(out.grad_fn).__name__, out, stats, grads)
    node, out, stats, grads = results["cpp"]
    py_node, py_out, py_stats, py_grads = results["python"]
    assert node == "CppFunction" and py_node != "CppFunction"
    assert torch.equal(out, py_out) and torch.equal(stats["clipfrac"], py_stats["clipfrac"])
    assert not stats["clipfrac"].requires_grad
    for name in grads:
        assert all(torch.equal(g, p) for g, p in zip(grads[name], py_grads[name], strict=True)), name


@pytest.mark.parametrize("backend", NATIVE)
def test_no_grad_and_inference_mode_record_nothing(backend):
    values, old, returns, mask = _inputs(torch.float32, 5, 9)

    def call(detach):
        return ops.value_loss(values.detach() if detach else values, old, returns, mask, backend=backend)[0]

    assert_no_grad_and_inference_mode_record_nothing(call)


def test_a_dispatch_mode_sees_the_registered_op():
    values, old, returns, mask = _inputs(torch.float32, 5, 9)
    assert_a_dispatch_mode_sees_the_registered_op(
        "value_loss", lambda: ops.value_loss(values, old, returns, mask, backend="cpu")[0]
    )
