"""A float mask weighs a token in the op's accumulation dtype, which the mask's own dtype does not change: a
float64 mask of weights on float32 inputs gives, bit for bit, what the same weights rounded to float32 give,
on every flavor and every op whose kernels read mask weights. The C++ kernels read a float mask as
`mask_weight<A>` (csrc/include/rlkernels/aggregation.h) and their bindings convert it to the accumulation
dtype; the Triton kernels read it through `rlkernels/triton/_mask.py` `load_mask`. Before that loader was
shared, the Triton scans of gae, the estimators and the group pass kept a float64 mask's weights in float64
while their other terms were float32."""

import functools

import pytest
import torch
from mask_forms import assert_same_bits
from oracle import cpu_kernel_backends
from policy_inputs import make_inputs as policy_inputs
from policy_inputs import run as policy_run
from test_advantage_estimators import call as estimator_call
from test_advantage_estimators import make_data as estimator_data

import rlkernels as rk

BACKENDS = cpu_kernel_backends()
B, T = 6, 37


def weights64(keep: torch.Tensor) -> torch.Tensor:
    """float64 weights in (0.25, 2) at the kept tokens (nonzero in `keep`), 0 elsewhere, none of them a
    float32 number: rounding each to float32 changes it."""
    w = torch.rand(keep.shape, dtype=torch.float64) * 1.75 + 0.25 + 2.0**-40
    w = torch.where(keep != 0, w, 0.0)
    kept = w[keep != 0]
    assert (kept.float().double() != kept).all()
    return w


def _grad_run(fn, x: torch.Tensor, upstream: float = -0.7):
    """(fn(x), d fn(x) / d x) for an upstream gradient."""
    x = x.detach().clone().requires_grad_()
    out = fn(x)
    loss = out[0] if isinstance(out, tuple) else out
    (g,) = torch.autograd.grad(loss * upstream, x)
    return out, g


def _policy(d, mask, backend):
    kw = dict(kl_coef=0.1, kl_kind="k3", entropy_coef=0.01, dual_clip=3.0)
    return policy_run(
        functools.partial(rk.policy_loss, backend=backend), dict(d["policy"], mask=mask), kw, -0.7
    )


def _value(d, mask, backend):
    old, ret = d["x"][1], d["x"][2]
    return _grad_run(lambda v: rk.value_loss(v, old, ret, mask, clip=0.2, backend=backend), d["x"][0])


def _agg(d, mask, backend, agg):
    return _grad_run(lambda x: rk.agg_loss(x, mask, agg=agg, backend=backend), d["x"][0])


def _gae(d, mask, backend, whiten):
    return rk.gae(d["x"][0], d["x"][1], mask, gamma=0.99, lam=0.95, whiten=whiten, backend=backend)


def _returns(d, mask, backend):
    return rk.discounted_returns(d["x"][0], mask, gamma=0.9, backend=backend)


def _group(d, mask, backend):
    return rk.group_advantages(d["x"][0][:, 0], group_size=3, mask=mask, backend=backend)


def _estimator(name, d, mask, backend):
    return estimator_call(name, dict(d["estimator"], mask=mask), torch.float32, backend)


CASES = {
    "policy_loss": _policy,
    "value_loss": _value,
    "agg_loss token-mean": functools.partial(_agg, agg="token-mean"),
    "agg_loss seq-mean-token-mean": functools.partial(_agg, agg="seq-mean-token-mean"),
    "gae": functools.partial(_gae, whiten=False),
    "gae whitened": functools.partial(_gae, whiten=True),
    "discounted_returns": _returns,
    "group_advantages": _group,
    **{f"advantages {name}": functools.partial(_estimator, name) for name in rk.ADVANTAGE_ESTIMATORS},
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_float64_mask_weighs_as_its_float32_rounding(backend, case, seed):
    """The case's outputs (and a loss's gradient) for the float64 weights and for their float32 rounding."""
    d = {
        "policy": policy_inputs(B, T, torch.float32, float_mask=True),
        "estimator": estimator_data(b=70, t=T),  # 70 responses: the chunk paths under the interpreter
        "x": torch.randn(3, B, T),
    }
    keep = {"policy": d["policy"]["mask"], "advantages": d["estimator"]["mask"]}
    w64 = weights64(keep.get(case.split()[0], torch.rand(B, T) > 0.25))
    run = CASES[case]
    assert_same_bits({"float64 mask": run(d, w64, backend), "float32 mask": run(d, w64.float(), backend)})
