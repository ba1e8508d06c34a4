"""agg_loss's native flavor in plain eager mode runs rlkernels::agg_loss_autograd, whose autograd node is C++
(csrc/autograd/agg_loss.cpp). It must be the Python formula of rlkernels/ops/agg_loss.py exactly: the same
kernels, so the same bits, for every mode, normalizer form, dtype and gradient request (an upstream
gradient, retain_graph). Under a dispatch mode the public function takes the registered op instead; without a
gradient the node records nothing."""

import pytest
import torch
from eager_autograd import (
    NATIVE,
    assert_a_dispatch_mode_sees_the_registered_op,
    assert_no_grad_and_inference_mode_record_nothing,
    cases,
    needs_eager_op,
)

import rlkernels.ops.agg_loss as ops
from rlkernels.reference.aggregation import AGG_MODES

pytestmark = needs_eager_op(ops, "agg_loss_autograd")

# The emulated CUDA kernels: two modes in fp32.
CASES = cases(AGG_MODES, {("token-mean", torch.float32), ("seq-mean-token-mean", torch.float32)})


@pytest.mark.parametrize("normalizer", ["none", "tensor"])
@pytest.mark.parametrize("backend,agg,dtype", CASES)
def test_cpp_node_is_the_python_formula(backend, agg, dtype, normalizer, monkeypatch, seed):
    loss_mat = (torch.rand(6, 41, dtype=torch.float64) * 3).to(dtype).requires_grad_()
    mask = torch.rand(6, 41) > 0.3
    glob = (
        {} if normalizer == "none" else dict(num_tokens=mask.sum() * 2.0, num_seqs=torch.tensor(9), dp_size=2)
    )
    upstream = torch.randn((), dtype=torch.float64).float()

    def requests(out):
        return {
            "upstream": lambda: torch.autograd.grad(
                out, [loss_mat], upstream.to(out.dtype), retain_graph=True
            ),
            "retain_graph, twice": lambda: (
                torch.autograd.grad(out, [loss_mat], retain_graph=True) + torch.autograd.grad(out, [loss_mat])
            ),
        }

    results = {}
    for path in ("cpp", "python"):
        if path == "python":
            monkeypatch.setattr(ops, "_native_eager", None)
        out = ops.agg_loss(loss_mat, mask, agg, **glob, backend=backend)
        results[path] = (type(out.grad_fn).__name__, out, {k: r() for k, r in requests(out).items()})
    node, out, grads = results["cpp"]
    py_node, py_out, py_grads = results["python"]
    assert node == "CppFunction" and py_node != "CppFunction"
    assert torch.equal(out, py_out)
    for name in grads:
        assert all(torch.equal(g, p) for g, p in zip(grads[name], py_grads[name], strict=True)), name


@pytest.mark.parametrize("backend", NATIVE)
def test_no_grad_and_inference_mode_record_nothing(backend):
    loss_mat, mask = torch.rand(5, 9).requires_grad_(), torch.rand(5, 9) > 0.3

    def call(detach):
        return ops.agg_loss(loss_mat.detach() if detach else loss_mat, mask, backend=backend)

    assert_no_grad_and_inference_mode_record_nothing(call)


def test_a_dispatch_mode_sees_the_registered_op():
    loss_mat, mask = torch.rand(5, 9).requires_grad_(), torch.rand(5, 9) > 0.3
    assert_a_dispatch_mode_sees_the_registered_op(
        "agg_loss", lambda: ops.agg_loss(loss_mat, mask, backend="cpu")
    )
