"""A float mask weighs a token in the op's accumulation dtype, which the mask's own dtype does not change: a
float64 mask of weights on float32 inputs gives, bit for bit, what the same weights rounded to float32 give,
on every flavor and every op whose kernels read mask weights. The C++ kernels read a float mask as
`mask_weight<A>` (csrc/include/rlkernels/aggregation.h) and their bindings convert it to the accumulation
dtype; the Triton kernels read it through `rlkernels/triton/_mask.py` `load_mask`. Before that loader was
shared, the Triton scans of gae, the estimators and the group pass kept a float64 mask's weights in float64
while their other terms were float32.

On 16-bit inputs the weights stay those of the float32 mask: never rounded to 16 bits before the fp32
arithmetic (the C++ and CUDA C++ scans and token broadcast did, until their bindings passed float weights in
the accumulation dtype)."""

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


def weights32(keep: torch.Tensor) -> torch.Tensor:
    """float32 weights in (0.25, 2) at the kept tokens, 0 elsewhere, none of them a bfloat16 or float16
    number (one that is moves up one float32 step)."""
    w = weights64(keep).float()
    for sixteen in (torch.bfloat16, torch.float16):
        w = torch.where((keep != 0) & (w.to(sixteen).float() == w), torch.nextafter(w, torch.tensor(4.0)), w)
    for sixteen in (torch.bfloat16, torch.float16):
        assert (w[keep != 0].to(sixteen).float() != w[keep != 0]).all()
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


def _data(dtype: torch.dtype) -> dict:
    """policy_loss's and the other cases' inputs in `dtype` (not the estimators': they upcast the scores)."""
    return {"policy": policy_inputs(B, T, dtype, float_mask=True), "x": torch.randn(3, B, T).to(dtype)}


def _as_float64(d: dict) -> dict:
    return {k: {n: t.double() if t.is_floating_point() else t for n, t in x.items()} if isinstance(x, dict)
            else x.double() for k, x in d.items()}  # fmt: skip


def _pairs(out, truth) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(output, its float64 truth) for every output tensor (a dict's: the keys both have)."""
    if isinstance(out, torch.Tensor):
        return [(out, truth)]
    if isinstance(out, dict):
        return [p for k in sorted(out.keys() & truth.keys()) for p in _pairs(out[k], truth[k])]
    return [p for o, t in zip(out, truth, strict=True) for p in _pairs(o, t)]


def _error(out, truth) -> float:
    """Σ |out - truth| in float64 over the outputs kept in fp32 where the op has any (a loss and its
    statistics: there a 16-bit weight's rounding is 2^15 times fp32's), else over all (the scans' 16-bit
    outputs, whose fp32 carries add up the weights' errors along each row)."""
    pairs = _pairs(out, truth)
    fp32 = [(o, t) for o, t in pairs if o.dtype == torch.float32]
    return sum(float((o.double() - t.double()).abs().sum()) for o, t in fp32 or pairs)


# The scans and losses on 16-bit inputs (the estimators upcast their scores; the group token broadcast
# multiplies advantages already rounded to 16 bits: its own test below).
SIXTEEN_BIT = [c for c in CASES if not c.startswith("advantages ") and c != "group_advantages"]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("case", SIXTEEN_BIT)
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_float32_mask_on_16_bit_inputs_keeps_its_weights(backend, case, dtype, seed):
    """16-bit inputs with a float32 mask: the outputs are those of float32 weights, against the float64
    reference on the same inputs and weights, more accurate than with the weights rounded to 16 bits (_error),
    and a float64 mask gives the float32 one's bits."""
    d = _data(dtype)
    keep = d["policy"]["mask"] if case == "policy_loss" else torch.rand(B, T) > 0.25
    w32 = weights32(keep)
    run = CASES[case]
    got = run(d, w32, backend)
    assert_same_bits({"float32 mask": got, "float64 mask": run(d, w32.double(), backend)})
    truth = run(_as_float64(d), w32.double(), "reference")
    rounded = run(d, w32.to(dtype).float(), backend)
    err, err_rounded = _error(got, truth), _error(rounded, truth)
    assert err < err_rounded, (
        f"{backend}/{case}: error {err:.4e} with float32 weights, {err_rounded:.4e} rounded"
    )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("backend", BACKENDS)
def test_the_16_bit_token_broadcast_multiplies_by_the_float32_weights(backend, dtype, seed):
    """group_advantages' tokens on 16-bit rewards are adv[:, None] * mask computed in fp32 and rounded once
    to the rewards' dtype, adv being the op's own 16-bit advantages without a mask: the float32 weights
    themselves, not their 16-bit rounding (whose product, rounded twice, differs in some tokens)."""
    rewards = torch.randn(B).to(dtype)
    w32 = weights32(torch.rand(B, T) > 0.25)
    adv = rk.group_advantages(rewards, group_size=3, backend=backend)
    want = (adv.float()[:, None] * w32).to(dtype)
    got = rk.group_advantages(rewards, group_size=3, mask=w32, backend=backend)
    assert_same_bits({"adv[:, None] * mask": want, "float32 mask": got})
    assert not torch.equal(
        want, (adv.float()[:, None] * w32.to(dtype).float()).to(dtype)
    )  # a case that tells


def test_the_native_ops_take_float_weights_in_the_accumulation_dtype():
    """The C++ ops' contract, for torch.ops callers (the public functions convert the mask first): float
    weights in the accumulation dtype of 16-bit inputs (float32), never in the inputs' own dtype, which
    would round them (csrc/include/rlkernels/gae_host.h, torch_utils.h check_kernel_mask)."""
    r = torch.randn(B, T).bfloat16()
    yes = torch.ones((), dtype=torch.bool)
    w = torch.rand(B, T) * 2
    adv, ret, ok = torch.ops.rlkernels.gae(r, r, w, None, 0.99, 0.95, False)
    tokens, tokens_ok = torch.ops.rlkernels.advantage_tokens(r[:, 0], w, yes)
    assert bool(ok) and bool(tokens_ok) and adv.dtype == tokens.dtype == torch.bfloat16
    with pytest.raises(
        RuntimeError, match=r"mask must be bool, int64 or float weights of rewards' accumulation"
    ):
        torch.ops.rlkernels.gae(r, r, w.bfloat16(), None, 0.99, 0.95, False)
    with pytest.raises(RuntimeError, match=r"float weights of adv's accumulation dtype \(Float\)"):
        torch.ops.rlkernels.advantage_tokens(r[:, 0], w.bfloat16(), yes)
