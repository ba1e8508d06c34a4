"""kl_penalty: every backend x dtype x kind x clamp against the float64 reference, forward and backward;
every name verl 0.9.1's kl_penalty accepts against verl's own function (skipped without verl)."""

import functools
import math
import os

import pytest
import torch
from oracle import DTYPES, assert_oracle, cpu_kernel_backends

import rlkernels as rk
from rlkernels.reference.kl import KL_KIND_CODES, KL_KINDS
from rlkernels.reference.kl import kl_penalty as kl_reference

KINDS = list(KL_KIND_CODES)  # every canonical kind: k1, abs, k2, k3, k1+, abs+, k2+, k3+
BACKENDS = cpu_kernel_backends()


def make_inputs(shape, dtype):
    """Log-probs with ref - logp spread over [-4, 4], plus points past k3's inner clamp (|d| > 20),
    inside its output clamp's flat region, and exact ties (the kink of abs)."""
    logp = -torch.rand(shape, dtype=torch.float64) * 6
    ref = logp + torch.randn(shape, dtype=torch.float64) * 1.5
    flat_l, flat_r = logp.view(-1), ref.view(-1)
    n = flat_l.numel()
    for i, delta in zip(range(0, n, max(1, n // 5)), (25.0, -25.0, 0.0, 3.0, -8.0), strict=False):
        flat_r[i] = flat_l[i] + delta
    return logp.to(dtype), ref.to(dtype)


def run(fn, logp, ref, grad, **kw):
    """Value and gradients of fn(logp, ref) for upstream `grad`, on fresh leaves."""
    logp = logp.detach().clone().requires_grad_()
    ref = ref.detach().clone().requires_grad_()
    out = fn(logp, ref, **kw)
    g_logp, g_ref = torch.autograd.grad(out, (logp, ref), grad.to(out.dtype))
    return out, g_logp, g_ref


@pytest.mark.parametrize("shape", [(41,), (3, 1271)])
@pytest.mark.parametrize("clamp", [10.0, None, 1.5])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_matches_float64_reference(backend, dtype, kind, clamp, shape, seed):
    logp, ref = make_inputs(shape, dtype)
    grad = torch.randn(shape, dtype=torch.float64).to(dtype)
    out = run(rk.kl_penalty, logp, ref, grad, kind=kind, clamp=clamp, backend=backend)
    same = run(kl_reference, logp, ref, grad, kind=kind, clamp=clamp)
    oracle = run(kl_reference, logp.double(), ref.double(), grad.double(), kind=kind, clamp=clamp)
    assert out[0].dtype == dtype and out[0].shape == logp.shape
    for name, o, s, r in zip(("value", "d logp", "d ref_logp"), out, same, oracle, strict=True):
        assert_oracle(f"{backend}/{kind}/{name}", o, s, r)


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b.name in ("cuda", "cuda-on-cpu")])
def test_more_elements_than_one_grid(backend, seed):
    """1_081_601 elements: more than the CUDA kernels' capped grid covers (4224 blocks of 256 threads), so
    their grid-stride loops take a second pass (the other kernels have no such cap: the CUDA flavors only)."""
    shape = (1_081_601,)
    logp, ref = make_inputs(shape, torch.float32)
    grad = torch.randn(shape, dtype=torch.float64).to(torch.float32)
    out = run(rk.kl_penalty, logp, ref, grad, kind="k3", clamp=10.0, backend=backend)
    same = run(kl_reference, logp, ref, grad, kind="k3", clamp=10.0)
    oracle = run(kl_reference, logp.double(), ref.double(), grad.double(), kind="k3", clamp=10.0)
    for name, o, s, r in zip(("value", "d logp", "d ref_logp"), out, same, oracle, strict=True):
        assert_oracle(f"{backend}/{name}", o, s, r)


@pytest.mark.parametrize("offset", [0, 1, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("backend", BACKENDS)
def test_inputs_at_any_alignment(backend, dtype, offset, seed):
    """Inputs that start off a 16-byte boundary (views at a storage offset into wider leaves): the CUDA
    kernels stream 16-byte packs only when every pointer is aligned, else one element a thread; n = 1031
    leaves a tail after the last whole pack. Values and gradients (a random upstream gradient and the
    broadcast one of .sum()) against the float64 oracle."""
    n = 1031
    logp, ref = (x.double() for x in make_inputs((n + 8,), dtype))  # the oracle's inputs: the same values
    grad = torch.randn(n, dtype=torch.float64).to(dtype).double()

    def call(fn, lp, rf, upstream, dt):
        lp, rf = lp.to(dt).requires_grad_(), rf.to(dt).requires_grad_()
        out = fn(lp[offset : offset + n], rf[offset : offset + n], "k3")
        if upstream is None:
            return (out, *torch.autograd.grad(2.5 * out.sum(), (lp, rf)))
        return (out, *torch.autograd.grad(out, (lp, rf), upstream.to(dt)))

    for upstream in (grad, None):
        got = call(functools.partial(rk.kl_penalty, backend=backend), logp, ref, upstream, dtype)
        same = call(kl_reference, logp, ref, upstream, dtype)
        want = call(kl_reference, logp, ref, upstream, torch.float64)
        for name, o, s, r in zip(("value", "d logp", "d ref_logp"), got, same, want, strict=True):
            assert_oracle(f"{backend}/{offset}/{name}", o, s, r, dtype=dtype)


@pytest.mark.parametrize("pad", [9, 16])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("backend", BACKENDS)
def test_rows_at_any_stride(backend, dtype, pad, seed):
    """[B, T] inputs whose rows lie T + pad apart, read where they lie: logp sliced out of a padded
    [B, T + pad] leaf as verl's actor takes its response's log-probs ([:, pad - 1:-1]: off a 16-byte boundary
    with pad 9, every row 16-byte aligned with pad 16 and fp32), ref_logp a contiguous [B, T] or another view.
    T = 1031 leaves a tail after the last 16-byte pack of each row. Values and gradients (through the views,
    into the leaves: zero outside them) against the float64 oracle, for a random upstream gradient and the
    broadcast one of .sum()."""
    B, T = 5, 1031
    logp, ref = (x.double() for x in make_inputs((B, T + pad), dtype))
    grad = torch.randn(B, T, dtype=torch.float64).to(dtype).double()

    def call(fn, lp, rf, upstream, dt, ref_view):
        lp, rf = lp.to(dt).requires_grad_(), rf.to(dt).requires_grad_()
        rows = rf[:, pad - 1 : -1] if ref_view else rf[:, :T]
        out = fn(lp[:, pad - 1 : -1], rows, "k3")
        if upstream is None:
            return (out, *torch.autograd.grad(2.5 * out.sum(), (lp, rf)))
        return (out, *torch.autograd.grad(out, (lp, rf), upstream.to(dt)))

    for upstream, ref_view in ((grad, False), (None, True), (grad, True)):
        args = (logp, ref if ref_view else ref[:, :T].contiguous(), upstream)
        got = call(functools.partial(rk.kl_penalty, backend=backend), *args, dtype, ref_view)
        same = call(kl_reference, *args, dtype, ref_view)
        want = call(kl_reference, *args, torch.float64, ref_view)
        for name, o, s, r in zip(("value", "d logp", "d ref_logp"), got, same, want, strict=True):
            assert_oracle(f"{backend}/{pad}/{ref_view}/{name}", o, s, r, dtype=dtype)
        assert not got[1][:, : pad - 1].any() and not got[1][:, -1].any()


@pytest.mark.parametrize("backend", BACKENDS)
def test_strided_inputs_and_expanded_grad(backend):
    """Transposed inputs and the stride-0 upstream gradient of .sum(), with a scaled loss."""
    logp, ref = make_inputs((33, 17), torch.float32)
    logp, ref = logp.t(), ref.t()  # non-contiguous
    for kind in KINDS:
        got = run(
            lambda a, b, kind=kind: 3.5 * rk.kl_penalty(a, b, kind, backend=backend).sum(),
            logp,
            ref,
            torch.tensor(1.0),
        )
        want = run(
            lambda a, b, kind=kind: 3.5 * kl_reference(a, b, kind).sum(),
            logp.double(),
            ref.double(),
            torch.tensor(1.0),
        )
        for o, r in zip(got[1:], want[1:], strict=True):
            assert_oracle(f"{backend}/{kind}", o, None, r)


@pytest.mark.parametrize("wanted", ["logp", "ref_logp"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_gradient_of_one_input(backend, wanted, seed):
    """One backward launch writes whichever of d logp and d ref_logp (its negative) autograd asks for: each
    alone against the float64 oracle, with a random upstream gradient."""
    logp, ref = make_inputs((5, 203), torch.float32)
    grad = torch.randn(5, 203, dtype=torch.float64)

    def gradient(fn, lp, rf, upstream):
        leaves = {"logp": lp.clone(), "ref_logp": rf.clone()}
        leaves[wanted].requires_grad_()
        out = fn(leaves["logp"], leaves["ref_logp"], "k3")
        return torch.autograd.grad(out, leaves[wanted], upstream.to(out.dtype))[0]

    got = gradient(functools.partial(rk.kl_penalty, backend=backend), logp, ref, grad)
    same_dtype = gradient(kl_reference, logp, ref, grad)
    want = gradient(kl_reference, logp.double(), ref.double(), grad)
    assert_oracle(f"{backend}/d {wanted}", got, same_dtype, want)


@pytest.mark.parametrize("backend", BACKENDS)
def test_gradcheck_float64(backend):
    logp, ref = make_inputs((23,), torch.float64)
    for kind in KINDS:
        for clamp in (10.0, None):
            fn = lambda a, b: rk.kl_penalty(a, b, kind, clamp=clamp, backend=backend)  # noqa: B023
            want = lambda a, b: kl_reference(a, b, kind, clamp)  # noqa: B023
            # "+" kinds are straight-through: compare with the reference's gradient, not finite differences.
            if kind.endswith("+"):
                grad = torch.randn(23, dtype=torch.float64)
                assert torch.allclose(run(fn, logp, ref, grad)[1], run(want, logp, ref, grad)[1], rtol=1e-12)
            else:
                a = logp.clone().requires_grad_()
                b = ref.clone().requires_grad_()
                # Keep finite differences away from the kinks of abs and the clamps.
                with torch.no_grad():
                    b += 1e-3 * torch.sign(b - a)
                    b.clamp_(a - 2, a + 2)
                assert torch.autograd.gradcheck(fn, (a, b))


@pytest.mark.parametrize("backend", BACKENDS + ["reference"])
def test_mixed_dtypes_promote(backend):
    logp, ref = make_inputs((19,), torch.float32)
    out = rk.kl_penalty(logp, ref.to(torch.bfloat16), backend=backend)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, kl_reference(logp, ref.to(torch.bfloat16).float()))


@pytest.mark.parametrize("backend", BACKENDS + ["reference"])
def test_empty(backend):
    logp = torch.zeros(0, 5, requires_grad=True)
    out = rk.kl_penalty(logp, torch.zeros(0, 5), backend=backend)
    assert out.shape == (0, 5)
    out.sum().backward()
    assert logp.grad.shape == (0, 5)


def test_no_grad_saves_nothing():
    logp, ref = make_inputs((8,), torch.float32)
    with torch.no_grad():
        out = rk.kl_penalty(logp.requires_grad_(), ref)
    assert out.grad_fn is None


def test_reference_hand_computed():
    """Values worked out by hand from the formulas in docs/semantics.md."""
    logp = torch.tensor([-1.0, -2.0, -10.0, -30.0, -3.0], dtype=torch.float64)
    ref = torch.tensor([-2.0, -1.0, 0.0, -5.0, -3.0], dtype=torch.float64)
    k1 = kl_reference(logp, ref, "k1")
    assert k1.tolist() == [1.0, -1.0, -10.0, -25.0, 0.0]
    assert kl_reference(logp, ref, "abs").tolist() == [1.0, 1.0, 10.0, 25.0, 0.0]
    assert kl_reference(logp, ref, "k2").tolist() == [0.5, 0.5, 50.0, 312.5, 0.0]
    # k3: d = ref - logp = [-1, 1, 10, 25 -> 20, 0]
    k3 = kl_reference(logp, ref, "k3", clamp=None).tolist()
    want = [math.exp(-1), math.e - 2, math.exp(10) - 11, math.exp(20) - 21, 0.0]
    assert k3 == pytest.approx(want, rel=1e-15)
    assert kl_reference(logp, ref, "k3", clamp=10.0).tolist() == pytest.approx(
        [math.exp(-1), math.e - 2, 10.0, 10.0, 0.0], rel=1e-15
    )
    # k3 below the inner clamp: d = -25 -> -20: e^-20 + 19, then the output clamp.
    assert kl_reference(torch.tensor([0.0]), torch.tensor([-25.0]), "k3", clamp=None).item() == pytest.approx(
        math.exp(-20) + 19
    )


def test_reference_gradients_hand_computed():
    logp = torch.tensor([-1.0, -2.0, -10.0, -3.0], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([-2.0, -1.0, 0.0, -3.0], dtype=torch.float64)
    (g,) = torch.autograd.grad(kl_reference(logp, ref, "k3").sum(), logp)
    # d k3 / d logp = 1 - e^d (d = ref - logp), 0 where the output is clamped (third element).
    assert g.tolist() == pytest.approx([1 - math.exp(-1), 1 - math.e, 0.0, 0.0])
    for kind in ("k1+", "abs+", "k3+", "k2+", "k2"):
        (g,) = torch.autograd.grad(kl_reference(logp, ref, kind).sum(), logp)
        assert g.tolist() == pytest.approx([1.0, -1.0, -10.0, 0.0])  # k2's gradient: logp - ref
    (g,) = torch.autograd.grad(kl_reference(logp, ref, "abs").sum(), logp)
    assert g.tolist() == [1.0, -1.0, -1.0, 0.0]


# Every name verl 0.9.1's kl_penalty accepts: its four estimators under both names, each with and without
# the "+" suffix (it strips one "+" and dispatches the rest; "full" raises NotImplementedError there).
VERL_NAMES = [n + plus for n in ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3") for plus in ("", "+")]


def test_names_are_verls():
    assert sorted(KL_KINDS) == sorted(VERL_NAMES)


@pytest.mark.parametrize("backend", BACKENDS + ["reference"])
@pytest.mark.parametrize("name", VERL_NAMES)
def test_matches_verl(name, backend, seed):
    """Value and both gradients against the installed verl's own kl_penalty, in float64 (its k3 clamp is
    10, our default), on inputs that cross k3's inner and outer clamps and abs's kink."""
    core_algos = pytest.importorskip(
        "verl.trainer.ppo.core_algos", reason="verl is installed by the [integrations] extra (README)"
    )
    logp, ref = make_inputs((5, 37), torch.float64)
    grad = torch.randn(logp.shape, dtype=torch.float64)
    got = run(rk.kl_penalty, logp, ref, grad, kind=name, backend=backend)
    want = run(core_algos.kl_penalty, logp, ref, grad, kl_penalty=name)
    for what, g, w in zip(("value", "d logp", "d ref_logp"), got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12, msg=f"{backend}/{name}: {what}")


def non_finite_inputs():
    """Every pairing of NaN, ±inf and a finite log-prob for logp and ref_logp (float64)."""
    values = [float("nan"), float("inf"), float("-inf"), -1.5]
    pairs = [(a, b) for a in values for b in values]
    logp = torch.tensor([a for a, _ in pairs], dtype=torch.float64)
    ref = torch.tensor([b for _, b in pairs], dtype=torch.float64)
    return logp, ref


@pytest.mark.parametrize("backend", BACKENDS + ["reference"])
@pytest.mark.parametrize("name", VERL_NAMES)
def test_non_finite_inputs_as_verl(name, backend):
    """kl_penalty takes no mask, so it cannot tell padding from data: a NaN or infinite log-prob is not
    rejected but gives what verl's kl_penalty gives, NaN for NaN, on every backend (a "+" kind's value is
    verl's k2 - k2.detach() + value.detach(), NaN where the log-ratio is infinite: the kernels gave k3's
    clamp, 10, before). Against the reference without verl."""
    logp, ref = non_finite_inputs()
    grad = torch.ones_like(logp)
    got = run(rk.kl_penalty, logp, ref, grad, kind=name, backend=backend)
    core_algos = None
    if not os.environ.get("RLK_TEST_WITHOUT_PEERS"):
        try:
            from verl.trainer.ppo import core_algos
        except ImportError:
            pass
    if core_algos is not None:
        want = run(core_algos.kl_penalty, logp, ref, grad, kl_penalty=name)
    else:
        want = run(kl_reference, logp, ref, grad, kind=name)
    for what, g, w in zip(("value", "d logp", "d ref_logp"), got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=0, equal_nan=True, msg=f"{backend}/{name}: {what}")
