"""Each public function under torch.compile(fullgraph=True) on every backend that runs here: no graph
breaks, and the same values and gradients as eager."""

import pytest
import torch
from oracle import cpu_kernel_backends, plain

import rlkernels as rk


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.slow
@pytest.mark.parametrize("backend", cpu_kernel_backends())
def test_kl_penalty_compiles(backend):
    backend = plain(backend)

    def loss(logp, ref):
        return (rk.kl_penalty(logp, ref, "k3", backend=backend) * 2.0).sum()

    logp = (-torch.rand(4, 33)).requires_grad_()
    ref = logp.detach() + torch.randn(4, 33)
    eager_loss = loss(logp, ref)
    (eager_grad,) = torch.autograd.grad(eager_loss, logp)
    compiled_loss = torch.compile(loss, fullgraph=True)(logp, ref)
    (compiled_grad,) = torch.autograd.grad(compiled_loss, logp)
    torch.testing.assert_close(compiled_loss, eager_loss)
    torch.testing.assert_close(compiled_grad, eager_grad)
