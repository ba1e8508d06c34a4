"""torch.library.opcheck on every custom op: schema, fake (meta) kernel, autograd registration and
AOT dispatch, for the native (C++) flavor and the Triton flavor (under the interpreter)."""

import pytest
import torch
from oracle import cpu_kernel_backends

FLAVOR = {"cpu": "", "cuda": "", "triton": "_triton"}  # backend -> op name suffix


def kl_samples(suffix):
    logp = -torch.rand(3, 37, dtype=torch.float32)
    ref = logp + torch.randn(3, 37)
    grad = torch.randn(3, 37)
    fwd = getattr(torch.ops.rlkernels, f"kl_penalty{suffix}")
    bwd = getattr(torch.ops.rlkernels, f"kl_penalty{suffix}_backward")
    for kind, clamp in (("k3", 10.0), ("k1+", None), ("abs", None)):
        yield fwd, (logp.clone().requires_grad_(), ref.clone().requires_grad_(), kind, clamp)
        yield bwd, (grad, logp, ref, kind, clamp)


SAMPLES = {"kl_penalty": kl_samples}


@pytest.mark.parametrize("backend", cpu_kernel_backends())
@pytest.mark.parametrize("op", sorted(SAMPLES))
def test_opcheck(op, backend):
    for fn, args in SAMPLES[op](FLAVOR[backend]):
        torch.library.opcheck(fn, args)
