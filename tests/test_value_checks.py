"""Value checks at the API boundary (rlkernels/_validate.py): non-finite rewards, values, returns and
advantages, negative or non-finite weights (float masks, is_weights) and integer masks other than 0/1 raise
a ValueError naming the op, the argument and the first bad element, on every backend and in every mode;
integer 0/1 masks (Hugging Face's attention_mask) are accepted wherever a bool mask is.

The errors are raised eagerly for CPU tensors only; GPU tensors and torch.compile go through
torch._assert_async (tested here under torch.compile on CPU, and with the eager check forced off)."""

import re

import pytest
import torch
from oracle import cpu_kernel_backends, raises_on_host

import rlkernels as rk
from rlkernels import _validate as v

NAN, INF = float("nan"), float("inf")
B, T = 3, 5
VALID, MASKED = (0, 1), (1, 4)  # a response token, and a padding position of _mask()


def _mask() -> torch.Tensor:
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[1, 3:] = False
    return mask


def _call(op: str, mask=None, **override):
    """Call `op` on small valid inputs (made on the default device), with tensors in `override` swapped
    in."""
    mask = _mask() if mask is None else mask
    if op == "policy_loss":
        args = dict(logp=-torch.rand(B, T), old_logp=-torch.rand(B, T), advantages=torch.randn(B), mask=mask)
    elif op == "value_loss":
        args = dict(
            values=torch.randn(B, T), old_values=torch.randn(B, T), returns=torch.randn(B, T), mask=mask
        )
    elif op in ("gae", "discounted_returns"):
        args = dict(rewards=torch.randn(B, T), mask=mask)
        if op == "gae":
            args["values"] = torch.randn(B, T)
    elif op == "group_advantages":
        args = dict(rewards=torch.randn(B), group_size=1, mask=mask)
    elif op == "linear_policy_loss":
        args = dict(
            hidden=torch.randn(B, T, 4), weight=torch.randn(7, 4), labels=torch.randint(0, 7, (B, T)),
            old_logp=-torch.rand(B, T), advantages=torch.randn(B), mask=mask,
        )  # fmt: skip
    else:
        raise AssertionError(op)
    args.update(override)
    return getattr(rk, op)(**args)


def _poisoned(x: torch.Tensor, index, value: float) -> torch.Tensor:
    x = x.clone()
    x[index] = value
    return x


# (op, argument, its shape): every argument whose values the check covers
FINITE_ARGS = [
    ("group_advantages", "rewards", (B,)),
    ("policy_loss", "advantages", (B,)),
    ("policy_loss", "advantages", (B, T)),
    ("policy_loss", "is_weights", (B, T)),
    ("linear_policy_loss", "advantages", (B, T)),
    ("value_loss", "values", (B, T)),
    ("value_loss", "old_values", (B, T)),
    ("value_loss", "returns", (B, T)),
    ("gae", "rewards", (B, T)),
    ("gae", "values", (B, T)),
    ("discounted_returns", "rewards", (B, T)),
]


@pytest.mark.parametrize("backend", ["auto", "reference"])
@pytest.mark.parametrize("bad", [NAN, INF, -INF], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("op,arg,shape", FINITE_ARGS, ids=[f"{o}-{a}-{len(s)}d" for o, a, s in FINITE_ARGS])
def test_non_finite_raises(op, arg, shape, bad, backend):
    index = (2,) if len(shape) == 1 else VALID
    x = _poisoned(torch.rand(shape), index, bad)
    with pytest.raises(
        ValueError, match=rf"{op}: {arg} must be finite.* " + re.escape(f"the first {bad} at index {index}")
    ):
        _call(op, backend=backend, **{arg: x})


@pytest.mark.parametrize(
    "op,arg", [("policy_loss", "advantages"), ("value_loss", "returns"), ("gae", "values")]
)
def test_non_finite_under_the_mask_raises(op, arg):
    """Masked positions are checked too: the reference formulas multiply by the mask, so a NaN there
    would still reach the result (verl's GAE carries it into the sequence's advantages)."""
    x = _poisoned(torch.rand(B, T), MASKED, NAN)
    with pytest.raises(
        ValueError, match=rf"{arg} must be finite, found 1 non-finite value\(s\) \(1 NaN, 0 inf\)"
    ):
        _call(op, **{arg: x})


@pytest.mark.parametrize("mode", ["grpo", "dr_grpo", "rloo", "batch"])
@pytest.mark.parametrize("grouping", ["group_size", "group_ids"])
def test_non_finite_rewards_raise_in_every_mode(mode, grouping):
    """Before: a NaN reward zeroed its group (grpo), the whole batch (batch) or propagated (dr_grpo, rloo)."""
    rewards = _poisoned(torch.randn(8), (5,), NAN)
    groups = dict(group_size=4) if grouping == "group_size" else dict(group_ids=torch.arange(8) % 2)
    for backend in ["reference"] + cpu_kernel_backends():
        with pytest.raises(ValueError, match=r"rewards must be finite.*the first nan at index \(5,\)"):
            rk.group_advantages(rewards, mode=mode, backend=str(backend), **groups)


def test_finite_check_survives_an_overflowing_sum():
    """The CPU check sums first; a sum that overflows from finite values falls back to the exact test."""
    assert v.check_finite("op", torch.tensor([3e38, 3e38, -1.0]), "x") is not None
    assert v.check_finite("op", torch.tensor([6e4, 6e4], dtype=torch.float16), "x") is not None
    with pytest.raises(
        ValueError, match=r"op: x must be finite, found 2 non-finite value\(s\) \(1 NaN, 1 inf\)"
    ):
        v.check_finite("op", torch.tensor([3e38, INF, NAN]), "x")


MASK_OPS = [
    "policy_loss",
    "value_loss",
    "gae",
    "discounted_returns",
    "group_advantages",
    "linear_policy_loss",
]


@pytest.mark.parametrize("bad", [-1.0, NAN, INF], ids=["negative", "nan", "inf"])
@pytest.mark.parametrize("op", MASK_OPS)
def test_bad_mask_weights_raise(op, bad):
    """Before: a -1 weight was accepted and moved a loss from 0.071 to 0.445."""
    mask = _poisoned(_mask().float(), VALID, bad)
    with pytest.raises(
        ValueError, match=rf"{op}: mask weights must be finite and >= 0.*the first {bad} at index"
    ):
        _call(op, mask=mask)


def test_bad_is_weights_raise():
    isw = _poisoned(torch.ones(B), (1,), -0.5)
    with pytest.raises(
        ValueError, match=r"is_weights must be finite and >= 0.*\(1 negative\).* -0.5 at index \(1,\)"
    ):
        _call("policy_loss", is_weights=isw)


@pytest.mark.parametrize("bad", [2, -1])
@pytest.mark.parametrize("op", MASK_OPS)
def test_integer_mask_other_than_0_1_raises(op, bad):
    mask = _poisoned(_mask().long(), VALID, bad)
    with pytest.raises(
        ValueError, match=rf"{op}: mask of dtype torch.int64 must hold only 0 and 1.*found {bad}"
    ):
        _call(op, mask=mask)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8], ids=str)
@pytest.mark.parametrize("op", MASK_OPS)
@pytest.mark.parametrize("backend", cpu_kernel_backends() + ["reference"])
def test_integer_mask_equals_bool_mask(backend, op, dtype):
    """An integer 0/1 mask (Hugging Face's attention_mask is int64) gives exactly the bool mask's result."""
    torch.manual_seed(0)
    want = _call(op, backend=backend)
    torch.manual_seed(0)
    got = _call(op, mask=_mask().to(dtype), backend=backend)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("backend", cpu_kernel_backends() + ["reference"])
def test_minus_inf_log_probs_are_accepted(backend):
    """Log-probs are not checked: -inf is a log-prob (a token outside a truncated sampler's support), and
    the clamped log-ratio gives it a finite loss and finite gradients."""
    logp = (-torch.rand(B, T)).requires_grad_()
    old = _poisoned(-torch.rand(B, T), VALID, -INF)
    loss, stats = rk.policy_loss(logp, old, torch.randn(B), _mask(), backend=backend)
    (grad,) = torch.autograd.grad(loss, logp)
    assert torch.isfinite(loss) and torch.isfinite(grad).all()
    loss, _ = rk.policy_loss(
        _poisoned(logp.detach(), VALID, -INF), -torch.rand(B, T), torch.randn(B), _mask(), backend=backend
    )
    assert torch.isfinite(loss)


# ---- GPU tensors and torch.compile: torch._assert_async, no host read ----


@pytest.fixture
def async_path(monkeypatch):
    """Take the path GPU tensors take: no eager check, and no Python read of a tensor's value."""
    monkeypatch.setattr(v, "checks_eagerly", lambda x: False)

    def no_host_read(*args, **kwargs):
        raise AssertionError("a value check read a tensor back to the host")

    monkeypatch.setattr(torch.Tensor, "item", no_host_read)
    monkeypatch.setattr(torch.Tensor, "__bool__", no_host_read)


def test_async_path_asserts_on_device(async_path):
    good = torch.rand(4, 3)
    assert v.check_finite("op", good, "x") is good
    assert v.check_nonnegative("op", good, "w") is good
    assert v.mask_values("op", torch.tensor([[1, 0, 1]])).dtype == torch.bool
    cases = [
        (lambda: v.check_finite("op", _poisoned(good, (1, 2), NAN), "x"), "op: x must be finite"),
        (
            lambda: v.check_nonnegative("op", _poisoned(good, (0, 0), -1.0), "w"),
            "op: w must be finite and >= 0",
        ),
        (
            lambda: v.mask_values("op", torch.tensor([[1, 2]])),
            "op: mask of dtype torch.int64 must hold only 0 and 1",
        ),
    ]
    for call, message in cases:
        with pytest.raises(RuntimeError, match=message):  # _assert_async on a CPU tensor fails right away
            call()


@pytest.mark.slow
def test_checks_under_torch_compile():
    """Under torch.compile(fullgraph=True) the checks are graph ops (torch._assert_async): no graph break,
    the same results as eager for valid inputs, and a RuntimeError for bad ones (naming the argument where
    the check runs before the op; listing what is checked where the kernel checks the values it reads)."""
    torch._dynamo.reset()

    @torch.compile(fullgraph=True)
    def step(rewards, logp, old_logp, mask):
        adv = rk.group_advantages(rewards, group_size=2)
        return rk.policy_loss(logp, old_logp, adv, mask)[0]

    rewards, logp, old, mask = (
        torch.randn(4),
        -torch.rand(4, 6),
        -torch.rand(4, 6),
        torch.ones(4, 6, dtype=torch.int64),
    )
    want = rk.policy_loss(logp, old, rk.group_advantages(rewards, group_size=2), mask.bool())[0]
    torch.testing.assert_close(step(rewards, logp, old, mask), want)
    with pytest.raises(RuntimeError, match="group_advantages: rewards must be finite"):
        step(_poisoned(rewards, (1,), NAN), logp, old, mask)
    # The kernel checks the mask it reads; under compile its flag fails one torch._assert_async, whose
    # message lists what the kernels reject (policy_loss.py BAD_VALUES: the device cannot say which value).
    with pytest.raises(
        RuntimeError, match="policy_loss: an input value is invalid: .*an integer mask value other"
    ):
        step(rewards, logp, old, _poisoned(mask, (0, 0), 2))
    torch._dynamo.reset()


LOG_PROBS = ("logp", "old_logp", "ref_logp")


@pytest.mark.fires_device_asserts(guarded=True)
@pytest.mark.parametrize("arg", LOG_PROBS)
@pytest.mark.parametrize("backend", cpu_kernel_backends() + ["reference"])
def test_nan_log_prob_at_a_kept_token_raises_on_every_backend(backend, arg):
    """A NaN log-prob where the mask keeps the token is rejected, the same on every backend (the C++ CPU
    kernel once returned inf there and the reference NaN); at padding, and -inf anywhere, are accepted."""

    def call(index, value):
        kw = dict(ref_logp=-torch.rand(B, T), kl_coef=0.1)
        kw[arg] = _poisoned(-torch.rand(B, T), index, value)
        return _call("policy_loss", **kw, backend=backend)

    if raises_on_host(backend):
        with pytest.raises(ValueError, match=rf"policy_loss: {arg} is NaN at 1 token\(s\) the mask keeps"):
            call(VALID, NAN)
    loss, stats = call(MASKED, NAN)
    assert torch.isfinite(loss) and all(torch.isfinite(s) for s in stats.values())
    loss, stats = call(VALID, -INF)  # the clamped log-ratio keeps the loss finite
    assert torch.isfinite(loss)


@pytest.mark.parametrize("backend", [b for b in cpu_kernel_backends() if b.kind == "triton"])
def test_values_the_triton_kernel_checks_raise_by_name(backend):
    """The Triton kernel checks the values it reads and returns a flag (on a GPU, one torch._assert_async);
    on CPU tensors a raised flag gives the eager check's ValueError naming the argument."""
    if not raises_on_host(backend):
        pytest.skip("on a GPU the flag fails a device-side assert (tests/oracle.py raises_on_host)")
    cases = [
        (dict(advantages=_poisoned(torch.randn(B), 1, NAN)), "advantages must be finite"),
        (dict(is_weights=_poisoned(torch.rand(B, T), VALID, -1.0)), "is_weights must be finite and >= 0"),
        (dict(mask=_poisoned(_mask().long(), VALID, 2)), "must hold only 0 and 1"),
        (dict(mask=_poisoned(_mask().float(), VALID, INF)), "mask weights must be finite and >= 0"),
    ]
    for override, message in cases:
        with pytest.raises(ValueError, match=message):
            _call("policy_loss", **override, backend=backend)
