"""logprobs_from_logits: every backend x dtype x option against the float64 reference (values and gradients
with random upstream gradients for logp and entropy together, and sum_pi_squared), hand-derived values, edge
cases, opcheck and torch.compile."""

import math

import pytest
import torch
from oracle import DTYPES, assert_oracle, cpu_kernel_backends, plain, raises_on_host

import rlkernels as rk
from rlkernels.ops import logprobs as ops
from rlkernels.ops import logprobs_checked

BACKENDS = cpu_kernel_backends()
ALL_BACKENDS = BACKENDS + ["reference"]
OPTIONS = {
    "plain": dict(),
    "temperature": dict(temperature=0.7),
    "entropy": dict(return_entropy=True),
    "softcap+ignore+entropy": dict(softcap=4.0, ignore=True, return_entropy=True),
    "temperature+sum_sq": dict(temperature=0.7, return_sum_pi_squared=True),
    "all": dict(temperature=1.3, softcap=8.0, ignore=True, return_entropy=True, return_sum_pi_squared=True),
}


def make_case(lead, vocab, dtype, ignore=False):
    """Peaky logits (scale 4, and rows with one dominant logit where q ~ 1) and labels, every third row
    ignored when `ignore`."""
    logits = torch.randn(*lead, vocab, dtype=torch.float64) * 4
    flat = logits.view(-1, vocab)
    flat[::4, 0] += 30.0
    labels = torch.randint(0, vocab, lead)
    flat_labels = labels.view(-1)
    flat_labels[1::5] = 0  # the dominant logit is the label on some rows: logp ~ 0
    if ignore:
        flat_labels[::3] = -100
    return logits.to(dtype), labels


def unpack(out, kw):
    """(logp, entropy or None, sum_pi_squared or None) of a call with options `kw`."""
    out = out if isinstance(out, tuple) else (out,)
    ent = out[1] if kw.get("return_entropy") else None
    sum_sq = out[-1] if kw.get("return_sum_pi_squared") else None
    assert len(out) == 1 + (ent is not None) + (sum_sq is not None)
    return out[0], ent, sum_sq


def run(logits, labels, g_logp, g_ent, *, backend, scale=1.0, **kw):
    """(logp, entropy or None, d loss / d logits) of loss = scale * (Σ g_logp·logp + Σ g_ent·entropy), then
    sum_pi_squared (detached) when asked for."""
    x = logits.detach().clone().requires_grad_()
    logp, ent, sum_sq = unpack(rk.logprobs_from_logits(x, labels, backend=backend, **kw), kw)
    loss = (logp * g_logp).sum() + ((ent * g_ent).sum() if ent is not None else 0.0)
    (grad,) = torch.autograd.grad(scale * loss, x)
    if sum_sq is None:
        return logp, ent, grad
    assert not sum_sq.requires_grad and sum_sq.grad_fn is None
    return logp, ent, grad, sum_sq


def _kwargs(option):
    kw = dict(OPTIONS[option])
    kw.pop("ignore", None)
    return kw


@pytest.mark.parametrize("shape", [((41,), 1271), ((3, 5), 64)], ids=["41x1271", "3x5x64"])
@pytest.mark.parametrize("option", list(OPTIONS))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_matches_float64_reference(backend, dtype, option, shape, seed):
    lead, vocab = shape
    logits, labels = make_case(lead, vocab, dtype, OPTIONS[option].get("ignore", False))
    g_logp, g_ent = torch.randn(lead, dtype=torch.float64), torch.randn(lead, dtype=torch.float64)
    kw = _kwargs(option)
    out = run(logits, labels, g_logp, g_ent, backend=backend, **kw)
    same = run(logits, labels, g_logp, g_ent, backend="reference", **kw)
    oracle = run(logits.double(), labels, g_logp, g_ent, backend="reference", **kw)
    assert out[0].dtype == torch.float32 and out[0].shape == lead
    assert out[2].dtype == dtype
    names = ("logp", "entropy", "d logits", "sum_pi_squared")[: len(out)]
    if kw.get("return_sum_pi_squared"):
        assert out[3].dtype == torch.float32 and out[3].shape == lead
        assert ((out[3] > 0) & (out[3] <= 1) | (labels == -100)).all()
    for name, o, s, r in zip(names, out, same, oracle, strict=True):
        if r is not None:
            assert_oracle(f"{backend}/{option}/{name}", o, s, r, dtype=dtype if name == "d logits" else None)


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_hand_derived_values(backend):
    """Worked out by hand from docs/semantics.md (q = softmax(z), z = softcap(x) / temperature)."""
    ln2, ln3 = math.log(2), math.log(3)
    f64 = dict(dtype=torch.float64)

    # Uniform over 2: logp = -ln 2, H = ln 2, d logp / dz = onehot - q = [1/2, -1/2].
    logp, ent, grad = run(
        torch.zeros(1, 2, **f64),
        torch.tensor([0]),
        torch.ones(1, **f64),
        torch.zeros(1, **f64),
        backend=backend,
        return_entropy=True,
    )
    assert logp.item() == pytest.approx(-ln2, abs=1e-12) and ent.item() == pytest.approx(ln2, abs=1e-12)
    assert grad[0].tolist() == pytest.approx([0.5, -0.5], abs=1e-12)

    # q = [1, 2, 3] / 6: logp(2) = ln(1/2), H = ln6/6 + ln3/3 + ln2/2.
    x = torch.tensor([[0.0, ln2, ln3]], **f64)
    logp, ent, _ = run(
        x, torch.tensor([2]), torch.ones(1, **f64), torch.ones(1, **f64), backend=backend, return_entropy=True
    )
    assert logp.item() == pytest.approx(-ln2, abs=1e-12)
    assert ent.item() == pytest.approx(math.log(6) / 6 + ln3 / 3 + ln2 / 2, abs=1e-12)

    # Temperature 2 on [0, 2 ln 2] -> z = [0, ln 2], q = [1/3, 2/3]: H = ln 3 - (2/3) ln 2, and
    # dH/dz_j = -q_j (log q_j + H) = [(2/9) ln 2, -(2/9) ln 2], so dH/dx = dH/dz / 2 = ±(1/9) ln 2.
    x = torch.tensor([[0.0, 2 * ln2]], **f64)
    logp, ent, grad = run(
        x,
        torch.tensor([1]),
        torch.zeros(1, **f64),
        torch.ones(1, **f64),
        backend=backend,
        temperature=2.0,
        return_entropy=True,
    )
    assert logp.item() == pytest.approx(math.log(2 / 3), abs=1e-12)
    assert ent.item() == pytest.approx(ln3 - 2 * ln2 / 3, abs=1e-12)
    assert grad[0].tolist() == pytest.approx([ln2 / 9, -ln2 / 9], abs=1e-12)

    # Softcap 2 on [0, 2 atanh(1/2)] -> z = [0, 1]: logp(0) = -ln(1 + e); dz/dx = 1 - tanh^2 = [1, 3/4],
    # d logp/dz = [1 - q0, -q1] = [e, -e] / (1 + e).
    x = torch.tensor([[0.0, 2 * math.atanh(0.5)]], **f64)
    logp, _, grad = run(x, torch.tensor([0]), torch.ones(1, **f64), None, backend=backend, softcap=2.0)
    e = math.e
    assert logp.item() == pytest.approx(-math.log(1 + e), abs=1e-12)
    assert grad[0].tolist() == pytest.approx([e / (1 + e), -0.75 * e / (1 + e)], abs=1e-12)


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_sum_pi_squared_hand_derived(backend):
    """Σ q² by hand: uniform over V gives 1 / V; q = [1, 2, 3] / 6 gives 14 / 36; one logit 30 above V - 1
    others gives 1 / (1 + (V - 1) e^-30)² + (V - 1) e^-60 / (...)² ~ 1; temperature 2 on [0, 2 ln 2] gives
    q = [1/3, 2/3] -> 5/9; softcap 2 on [0, 2 atanh(1/2)] gives z = [0, 1] -> (1 + e²) / (1 + e)²."""
    ln2, ln3, e = math.log(2), math.log(3), math.e
    f64 = dict(dtype=torch.float64)
    call = lambda x, **kw: rk.logprobs_from_logits(
        x, torch.zeros(x.shape[0], dtype=torch.long), backend=backend, return_sum_pi_squared=True, **kw
    )[1]
    for vocab in (1, 2, 7, 1000):
        assert call(torch.zeros(1, vocab, **f64)).item() == pytest.approx(1 / vocab, rel=1e-12)
    assert call(torch.tensor([[0.0, ln2, ln3]], **f64)).item() == pytest.approx(14 / 36, rel=1e-12)
    peak = torch.zeros(1, 50, **f64)
    peak[0, 3] = 30.0
    den = (1 + 49 * math.exp(-30)) ** 2
    assert call(peak).item() == pytest.approx((1 + 49 * math.exp(-60)) / den, rel=1e-12)
    assert call(torch.tensor([[0.0, 2 * ln2]], **f64), temperature=2.0).item() == pytest.approx(
        5 / 9, rel=1e-12
    )
    x = torch.tensor([[0.0, 2 * math.atanh(0.5)]], **f64)
    assert call(x, softcap=2.0).item() == pytest.approx((1 + e * e) / (1 + e) ** 2, rel=1e-12)
    # fp32 with huge logits: the kernels' terms are relative to the max, so nothing is lost (the reference
    # follows verl's exp(LSE(2z) - 2 LSE(z)), whose fp32 LSEs near 2e4 are only ~1e-3 apart from exact).
    if backend != "reference":
        assert call(torch.tensor([[1e4, 1e4, -1e4]])).item() == pytest.approx(0.5, rel=1e-6)


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_ignored_rows_are_exactly_zero(backend):
    logits, labels = make_case((12,), 33, torch.float32, ignore=True)
    ignored = labels == -100
    g = torch.randn(12)
    logp, ent, grad, sum_sq = run(
        logits,
        labels,
        g,
        g,
        backend=backend,
        return_entropy=True,
        return_sum_pi_squared=True,
        temperature=0.5,
    )
    assert (logp[ignored] == 0).all() and (ent[ignored] == 0).all() and (sum_sq[ignored] == 0).all()
    assert (sum_sq[~ignored] > 0).all()
    assert (grad[ignored] == 0).all() and (grad[~ignored] != 0).any()


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_huge_logits_stay_finite(backend):
    """Logits of ±1e4 (and a row of identical huge logits): logp <= 0, entropy in [0, log V], no NaN/inf."""
    vocab = 300
    logits = (torch.rand(17, vocab) * 2 - 1) * 1e4
    logits[3] = 1e4
    labels = torch.randint(0, vocab, (17,))
    logp, ent, grad = run(
        logits, labels, torch.ones(17), torch.ones(17), backend=backend, return_entropy=True
    )
    assert torch.isfinite(logp).all() and torch.isfinite(ent).all() and torch.isfinite(grad).all()
    assert (logp <= 0).all()
    assert (ent >= 0).all() and (ent <= math.log(vocab) + 1e-5).all()
    assert ent[3].item() == pytest.approx(math.log(vocab), rel=1e-5)


def masked_case(dtype):
    """Logits a logits processor masked with -inf (Hugging Face's TopKLogitsWarper, a padded vocabulary's
    tail), over 4500 columns: wider than a C++ CPU block (2048) and an interpreted Triton tile (512), so that
    whole blocks and tiles hold -inf only. Rows: the top 20 kept; the first 2100 masked; none masked; the
    label on a masked logit (logp -inf, d logp / d logits finite); every other logit masked; ignored."""
    vocab = 4500
    logits = torch.randn(6, vocab, dtype=torch.float64) * 3
    labels = torch.randint(0, vocab, (6,))
    top = logits[0].topk(20).indices
    kept = torch.zeros(vocab, dtype=torch.bool).index_fill(0, top, True)
    logits[0] = logits[0].where(kept, -torch.inf)
    labels[0] = top[3]
    logits[1, :2100] = -torch.inf
    labels[1] = 3000
    logits[3, 100:] = -torch.inf
    labels[3] = 2000
    logits[4, ::2] = -torch.inf
    labels[4] = 7
    logits[5, 50:] = -torch.inf
    labels[5] = -100
    return logits.to(dtype), labels


@pytest.mark.parametrize("option", ["plain", "entropy", "temperature+sum_sq"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_masked_logits(backend, dtype, option, seed):
    """A -inf logit is a token of probability 0: it adds nothing to the log-sum-exp or the entropy (0, the
    limit of q log q, where torch's q * log q is NaN) and gets no gradient unless it is the label (d logp /
    d z_y = 1 - q_y = 1). Every flavor against the float64 reference, values and gradients."""
    logits, labels = masked_case(dtype)
    g_logp, g_ent = torch.randn(6, dtype=torch.float64), torch.randn(6, dtype=torch.float64)
    kw = _kwargs(option)
    out = run(logits, labels, g_logp, g_ent, backend=backend, **kw)
    same = run(logits, labels, g_logp, g_ent, backend="reference", **kw)
    oracle = run(logits.double(), labels, g_logp, g_ent, backend="reference", **kw)
    assert oracle[0][3] == -math.inf and torch.isfinite(oracle[0][[0, 1, 2, 4]]).all()
    assert torch.isfinite(oracle[2]).all() and (oracle[2][logits == -math.inf] == 0).sum() > 8000
    if oracle[1] is not None:
        assert torch.isfinite(oracle[1]).all()
    names = ("logp", "entropy", "d logits", "sum_pi_squared")[: len(out)]
    for name, o, s, r in zip(names, out, same, oracle, strict=True):
        if r is not None:
            assert not o.isnan().any(), f"{backend}/{option}/{name}: NaN"
            assert_oracle(f"{backend}/{option}/{name}", o, s, r, dtype=dtype if name == "d logits" else None)


def _peer_log_softmax_and_entropy(peer: str):
    """(logp(logits, labels), entropy(logits)) of the installed peer's actor utilities."""
    if peer == "verl":
        pytest.importorskip("verl", reason="verl is installed by the [integrations] extra (README)")
        from verl.utils.torch_functional import entropy_from_logits, logprobs_from_logits

        return logprobs_from_logits, entropy_from_logits
    pytest.importorskip("trl", reason="TRL is installed by the [integrations] extra (README)")
    from trl.trainer.utils import entropy_from_logits, selective_log_softmax

    return selective_log_softmax, entropy_from_logits


@pytest.mark.parametrize("peer", ["verl", "trl"])
def test_log_softmax_and_entropy_as_the_peers(peer):
    """The installed verl 0.9.1 / TRL 1.16 actor utilities (log-softmax then gather, the softmax entropy) in
    float64: the same log-probs and entropies on finite logits; on logits masked with -inf the same log-probs,
    and the entropy of the unmasked logits alone where the peers' formulas return NaN (docs/semantics.md,
    "Masked logits")."""
    peer_logp, peer_entropy = _peer_log_softmax_and_entropy(peer)
    exact = dict(rtol=1e-12, atol=1e-12)
    logits = torch.randn(5, 300, dtype=torch.float64) * 3
    labels = torch.randint(100, 300, (5,))
    logp, ent = rk.logprobs_from_logits(logits, labels, return_entropy=True, backend="reference")
    torch.testing.assert_close(logp, peer_logp(logits, labels), **exact)
    torch.testing.assert_close(ent, peer_entropy(logits), **exact)
    masked = logits.clone()
    masked[:, :100] = -torch.inf
    logp, ent = rk.logprobs_from_logits(masked, labels, return_entropy=True, backend="reference")
    torch.testing.assert_close(logp, peer_logp(masked, labels), **exact)
    assert peer_entropy(masked).isnan().all()
    torch.testing.assert_close(ent, peer_entropy(logits[:, 100:]), **exact)


@pytest.mark.parametrize("backend", BACKENDS)
def test_lse_of_large_logits_keeps_its_low_bits(backend):
    """Rows [24, 24 − δ] with the label on the second logit: LSE ≈ 24.4, which fp32 holds only to
    ulp(24)/2 ≈ 1e-6, ~8 ulps of logp ≈ −1. The kernels keep the LSE in float64 (docs/semantics.md, "The
    saved LSE"), so logp and d logp / d logits stay within a few ulps of their own size."""
    delta = torch.linspace(0.3, 1.2, 64, dtype=torch.float64)
    logits = torch.stack((torch.full_like(delta, 24.0), 24.0 - delta), 1).float()  # [64, 2]
    exact = logits.double().requires_grad_()
    want_logp = exact.log_softmax(-1)[:, 1]
    (want_grad,) = torch.autograd.grad(want_logp.sum(), exact)
    lse = torch.logsumexp(logits.double(), -1)
    bound = 4 * torch.finfo(torch.float32).eps * want_logp.abs().detach()
    # The case discriminates: an LSE rounded to fp32 alone would miss the bound on half the rows.
    assert ((lse.float().double() - lse).abs() > bound).float().mean() >= 0.5
    x = logits.clone().requires_grad_()
    logp = rk.logprobs_from_logits(x, torch.ones(64, dtype=torch.long), backend=backend)
    (grad,) = torch.autograd.grad(logp.sum(), x)
    assert ((logp.double() - want_logp.detach()).abs() <= bound).all()
    assert ((grad.double() - want_grad).abs() <= 4 * torch.finfo(torch.float32).eps).all()


@pytest.mark.parametrize("offset", [0, 1, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("backend", BACKENDS)
def test_rows_at_any_alignment(backend, dtype, offset, seed):
    """Rows that start off a 16-byte boundary, in a wider buffer (a view at a storage offset, row stride
    V + 5): the kernels that read a row in 16-byte packs take its first and last columns one at a time, and
    the gradient, a fresh tensor aligned otherwise, is written value by value where its packs would
    straddle."""
    vocab = 1001
    logits, labels = make_case((9,), vocab + 5, dtype, ignore=True)
    view = logits[:, offset : offset + vocab]
    labels = labels.clamp(max=vocab - 1).where(labels != -100, -100)
    g_logp, g_ent = torch.randn(9, dtype=torch.float64), torch.randn(9, dtype=torch.float64)
    kw = dict(return_entropy=True, temperature=0.9)
    out = run(view, labels, g_logp, g_ent, backend=backend, **kw)
    same = run(view, labels, g_logp, g_ent, backend="reference", **kw)
    oracle = run(view.double(), labels, g_logp, g_ent, backend="reference", **kw)
    for name, o, s, r in zip(("logp", "entropy", "d logits"), out, same, oracle, strict=True):
        assert_oracle(f"{backend}/{offset}/{name}", o, s, r, dtype=dtype if name == "d logits" else None)


# [B, T, V] views whose rows do not collapse into one stride: (the full tensor's shape, the view of it).
BATCH_SLICES = {
    "logits[:, :-1]": ((3, 13), lambda full: full[:, :-1]),  # a causal LM's next-token logits
    "response logits[:, 5:-1]": ((3, 13), lambda full: full[:, 5:-1]),  # verl's response slice
    "time-major [T, B, V] transposed": ((12, 3), lambda full: full.transpose(0, 1)),
}


@pytest.mark.parametrize("layout", list(BATCH_SLICES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("backend", BACKENDS)
def test_batch_slices_are_read_in_place(backend, dtype, layout, seed, monkeypatch):
    """Logits whose rows sit at two strides (a batch's and a row's) reach the kernel op as that [B, T, V]
    view, not an [N, V] copy of it (the GPU kernels read them in place; the C++ CPU kernel copies its rows
    together), and give the float64 oracle's log-probs, entropy and gradient, in the view's shape."""
    lead, take = BATCH_SLICES[layout]
    vocab = 517
    full, _ = make_case(lead, vocab, dtype)
    view = take(full)
    assert view.dim() == 3
    with pytest.raises(RuntimeError):
        view.view(-1, vocab)  # the rows do not collapse: reshape would copy them
    labels = torch.randint(
        0, vocab, view.shape[:-1], generator=torch.Generator().manual_seed(seed), device="cpu"
    )
    labels = labels.to(view.device)
    labels[0, ::4] = -100
    received = []
    for name, launch in list(logprobs_checked.LAUNCH.items()):

        def recording(logits, *args, _launch=launch):
            received.append(logits)
            return _launch(logits, *args)

        monkeypatch.setitem(logprobs_checked.LAUNCH, name, recording)
    g_logp, g_ent = (
        torch.randn(view.shape[:-1], dtype=torch.float64),
        torch.randn(view.shape[:-1], dtype=torch.float64),
    )
    kw = dict(return_entropy=True, temperature=0.8)
    x = view.detach().requires_grad_()  # the view's own strides (run() clones: a contiguous copy)
    logp, ent = rk.logprobs_from_logits(x, labels, backend=backend, **kw)
    assert len(received) == 1 and received[0].shape == view.shape
    assert received[0].data_ptr() == view.data_ptr() and received[0].stride() == view.stride()
    (grad,) = torch.autograd.grad((logp * g_logp).sum() + (ent * g_ent).sum(), x)
    assert grad.shape == view.shape
    out = (logp, ent, grad)
    same = run(view, labels, g_logp, g_ent, backend="reference", **kw)
    oracle = run(view.double(), labels, g_logp, g_ent, backend="reference", **kw)
    for name, o, s_, r in zip(("logp", "entropy", "d logits"), out, same, oracle, strict=True):
        assert_oracle(f"{backend}/{layout}/{name}", o, s_, r, dtype=dtype if name == "d logits" else None)


@pytest.mark.parametrize("backend", BACKENDS)
def test_strided_logits_and_expanded_grad(backend):
    """Non-contiguous logits (a transposed view) and the stride-0 gradient of a scaled .sum()."""
    logits, labels = make_case((7,), 45, torch.float32)
    strided = logits.t().contiguous().t()
    assert not strided.is_contiguous()
    for return_entropy in (False, True):
        got = run(
            strided,
            labels,
            torch.ones(7),
            torch.ones(7),
            backend=backend,
            scale=2.5,
            return_entropy=return_entropy,
        )
        same = run(
            logits,
            labels,
            torch.ones(7),
            torch.ones(7),
            backend="reference",
            scale=2.5,
            return_entropy=return_entropy,
        )
        want = run(
            logits.double(),
            labels,
            torch.ones(7),
            torch.ones(7),
            backend="reference",
            scale=2.5,
            return_entropy=return_entropy,
        )
        for o, s, r in zip(got, same, want, strict=True):
            if r is not None:
                assert_oracle(backend, o, s, r)


@pytest.mark.parametrize("backend", BACKENDS)
def test_gradcheck_float64(backend):
    logits, labels = make_case((4,), 9, torch.float64, ignore=True)
    logits[:, 0] -= 30.0  # keep q away from 1 so that finite differences are informative
    x = logits.clone().requires_grad_()

    def fn(z):
        logp, ent = rk.logprobs_from_logits(
            z, labels, temperature=0.8, softcap=6.0, return_entropy=True, backend=backend
        )
        return logp, ent

    assert torch.autograd.gradcheck(fn, (x,))


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_empty_and_int32_labels(backend):
    x = torch.zeros(0, 7, requires_grad=True)
    logp = rk.logprobs_from_logits(x, torch.zeros(0, dtype=torch.int32), backend=backend)
    assert logp.shape == (0,)
    logp.sum().backward()
    assert x.grad.shape == (0, 7)
    logits, labels = make_case((4,), 9, torch.float32)
    got = rk.logprobs_from_logits(logits, labels.int(), backend=backend)
    torch.testing.assert_close(got, rk.logprobs_from_logits(logits, labels, backend="reference"))


def test_no_grad_saves_nothing():
    logits, labels = make_case((6,), 10, torch.float32)
    with torch.no_grad():
        logp = rk.logprobs_from_logits(logits.requires_grad_(), labels)
    assert logp.grad_fn is None


def test_validation_errors():
    logits, labels = make_case((4,), 9, torch.float32)
    with pytest.raises(ValueError, match="labels must lie in"):
        rk.logprobs_from_logits(logits, torch.tensor([0, 1, 9, 2]))
    with pytest.raises(ValueError, match="labels has shape"):
        rk.logprobs_from_logits(logits, labels[:3])
    with pytest.raises(TypeError, match="labels must be an int32 or int64"):
        rk.logprobs_from_logits(logits, labels.float())
    with pytest.raises(TypeError, match="logits must be"):
        rk.logprobs_from_logits(logits.long(), labels)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        rk.logprobs_from_logits(logits, labels, temperature=0.0)
    with pytest.raises(TypeError, match="return_sum_pi_squared must be a bool"):
        rk.logprobs_from_logits(logits, labels, return_sum_pi_squared=1)
    with pytest.raises(TypeError, match="return_sum_pi_squared must be a bool"):
        rk.linear_logprobs(torch.randn(4, 3), torch.randn(9, 3), labels, return_sum_pi_squared="yes")
    with pytest.raises(ValueError, match="softcap must be > 0"):
        rk.logprobs_from_logits(logits, labels, softcap=-1.0)
    with pytest.raises(ValueError, match="V >= 1"):
        rk.logprobs_from_logits(torch.zeros(4, 0), labels)
    with pytest.raises(ValueError, match="one device"):
        rk.logprobs_from_logits(logits, labels.to("meta"))
    with pytest.raises(rk.BackendUnavailableError):
        rk.logprobs_from_logits(logits, labels, backend="cuda")


@pytest.mark.parametrize("backend", BACKENDS)
def test_opcheck(backend):
    """The op of each flavor that runs here, on its device (as test_linear_logprobs.test_opcheck)."""
    flavor = ops.LOGITS_FLAVORS[backend]
    logits, labels = make_case((6,), 37, torch.float32, ignore=True)
    op = getattr(torch.ops.rlkernels, flavor)
    for softcap, entropy, sum_sq in ((None, False, False), (3.0, True, True), (None, False, True)):
        x = logits.clone().requires_grad_()
        torch.library.opcheck(op, (x, labels, 0.9, softcap, -100, entropy, sum_sq))
        logp, ent, lse, _ = op(logits, labels, 0.9, softcap, -100, entropy, sum_sq)
        g_ent = torch.randn(6) if entropy else None
        backward = getattr(torch.ops.rlkernels, flavor + "_backward")
        torch.library.opcheck(backward, (torch.randn(6), g_ent, logits, labels, lse, ent, 0.9, softcap, -100))


@pytest.mark.parametrize("backend", BACKENDS)
def test_checked_op_opcheck(backend):
    """The public function's op pair (ops/logprobs_checked.py): schema, fake, and its backward with a None
    d logp (a loss of the entropy alone) and with expanded upstream gradients."""
    flavor = logprobs_checked.FLAVORS[backend]
    op, backward = getattr(torch.ops.rlkernels, flavor), getattr(torch.ops.rlkernels, flavor + "_backward")
    logits, labels = make_case((6,), 37, torch.float32, ignore=True)
    for softcap, entropy, sum_sq in ((None, False, False), (3.0, True, True)):
        torch.library.opcheck(
            op, (logits.clone().requires_grad_(), labels, 0.9, softcap, -100, entropy, sum_sq)
        )
    logp, ent, lse, _, ok = op(logits, labels, 0.9, 3.0, -100, True, False)
    assert bool(ok)
    for g_logp, g_ent in ((None, torch.randn(6)), (torch.ones(()).expand(6), torch.ones(()).expand(6))):
        torch.library.opcheck(backward, (g_logp, g_ent, logits, labels, lse, ent, 0.9, 3.0, -100))


@pytest.mark.parametrize("backend", BACKENDS)
def test_entropy_alone_and_expanded_gradients(backend, seed):
    """A loss of the entropy alone (no d logp reaches the backward) and the stride-0 gradients of .sum()
    (read as they are): against the float64 reference."""
    logits, labels = make_case((9,), 61, torch.float32, ignore=True)

    def entropy_alone(x, be, scale):
        leaf = x.detach().clone().requires_grad_()
        _, ent = rk.logprobs_from_logits(leaf, labels, return_entropy=True, softcap=5.0, backend=be)
        (grad,) = torch.autograd.grad(scale * ent.sum(), leaf)
        return grad

    def both_summed(x, be, scale):
        leaf = x.detach().clone().requires_grad_()
        logp, ent = rk.logprobs_from_logits(leaf, labels, return_entropy=True, backend=be)
        (grad,) = torch.autograd.grad(scale * (logp.sum() + ent.sum()), leaf)
        return grad

    for fn in (entropy_alone, both_summed):
        got = fn(logits, backend, 1.5)
        same = fn(logits, "reference", 1.5)
        want = fn(logits.double(), "reference", 1.5)
        assert_oracle(f"{backend}/{fn.__name__}", got, same, want)


@pytest.mark.fires_device_asserts
@pytest.mark.parametrize("backend", BACKENDS)
def test_the_kernel_checks_the_labels(backend):
    """The forward kernel flags a label outside [0, V) (a row it then reads nowhere): the op's flag is down
    and, on CPU tensors, the public function raises the eager check's ValueError naming the label. (On a GPU
    it asserts on the device instead, which ends the process's CUDA context: a GPU flavor checks the flag.)"""
    logits, labels = make_case((5,), 13, torch.float32, ignore=True)
    op = getattr(torch.ops.rlkernels, logprobs_checked.FLAVORS[backend])
    for bad in (13, -1, 10**9):
        y = labels.clone()
        y[3] = bad
        *_, ok = op(logits, y, 1.0, None, -100, False, False)
        assert not bool(ok), bad
        if raises_on_host(backend):
            with pytest.raises(ValueError, match=rf"labels must lie in \[0, 13\).*found {bad}"):
                rk.logprobs_from_logits(logits, y, backend=backend)
    *_, ok = op(logits, labels, 1.0, None, -100, False, False)
    assert bool(ok)


@pytest.mark.parametrize("backend", BACKENDS)
def test_torch_compile_fullgraph(backend):
    backend = plain(backend)
    logits, labels = make_case((2, 5), 23, torch.float32, ignore=True)

    def loss_fn(x):
        logp, ent = rk.logprobs_from_logits(x, labels, temperature=0.9, return_entropy=True, backend=backend)
        return (logp * 2.0 - 0.1 * ent).sum()

    compiled = torch.compile(loss_fn, fullgraph=True)
    x1, x2 = logits.clone().requires_grad_(), logits.clone().requires_grad_()
    torch.testing.assert_close(compiled(x1), loss_fn(x2))
    (g1,) = torch.autograd.grad(compiled(x1), x1)
    (g2,) = torch.autograd.grad(loss_fn(x2), x2)
    torch.testing.assert_close(g1, g2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_sum_pi_squared_under_torch_compile(backend):
    backend = plain(backend)
    logits, labels = make_case((2, 5), 23, torch.float32, ignore=True)

    def fn(x):
        logp, sum_sq = rk.logprobs_from_logits(
            x, labels, temperature=0.9, return_sum_pi_squared=True, backend=backend
        )
        return (logp * 2.0).sum(), sum_sq

    compiled = torch.compile(fn, fullgraph=True)
    x1, x2 = logits.clone().requires_grad_(), logits.clone().requires_grad_()
    (loss1, sq1), (loss2, sq2) = compiled(x1), fn(x2)
    torch.testing.assert_close(loss1, loss2)
    torch.testing.assert_close(sq1, sq2)
    assert not sq1.requires_grad and sq1.shape == (2, 5)
    torch.testing.assert_close(torch.autograd.grad(loss1, x1)[0], torch.autograd.grad(loss2, x2)[0])
