"""Log-probs under the rollout's sampling distribution (a per-token temperature, top_k, top_p, min_p):
vLLM 0.33.0's kept sets worked out by hand, every backend x dtype against the float64 reference that sorts
whole rows (logprobs_from_logits, linear_logprobs, linear_policy_loss), labels outside the kept set, the
bounded candidate search, and argument checks."""

import math

import pytest
import torch
from oracle import DTYPES, assert_oracle, cpu_kernel_backends

import rlkernels as rk
from rlkernels.ops import sampling
from rlkernels.reference.sampling import kept_tokens

BACKENDS = cpu_kernel_backends()
F64 = dict(dtype=torch.float64)


def _row(probs):
    return torch.tensor([probs], **F64).log()


def _one(x, dtype=torch.int64):
    return torch.tensor([x], dtype=dtype)


# ---- the kept set, by hand (vLLM 0.33.0: min_p, then top_k, then top_p renormalized) ----


def test_kept_set_by_hand():
    z = _row([0.4, 0.3, 0.2, 0.1])
    keep = lambda **kw: kept_tokens(z, **kw)[0].tolist()  # noqa: E731
    assert keep(top_k=_one(2)) == [True, True, False, False]
    assert keep(top_k=_one(0)) == [True] * 4 and keep(top_k=_one(4)) == [True] * 4  # off
    # top_p: keep v while the mass of the more likely tokens is < p.
    assert keep(top_p=_one(0.7, torch.float64)) == [True, True, False, False]  # before token 2: 0.7
    assert keep(top_p=_one(0.71, torch.float64)) == [True, True, True, False]
    assert keep(top_p=_one(0.1, torch.float64)) == [True, False, False, False]  # the top token always
    # min_p: p >= min_p * p_max.
    assert keep(min_p=_one(0.5, torch.float64)) == [True, True, True, False]  # 0.2 = 0.5 * 0.4: kept
    assert keep(min_p=_one(0.6, torch.float64)) == [True, True, False, False]
    # top_p after top_k is renormalized: [4, 3, 2] / 9, the mass before token 2 is 7/9 >= 0.75 (over the
    # whole row it would be 0.7 < 0.75: SGLang's torch sampler keeps it, vLLM does not).
    both = keep(top_k=_one(3), top_p=_one(0.75, torch.float64))
    assert both == [True, True, False, False]
    # min_p before top_k: min_p leaves 2 tokens, so top_k = 3 removes nothing more.
    assert keep(min_p=_one(0.6, torch.float64), top_k=_one(3)) == [True, True, False, False]


def test_ties_keep_the_whole_group():
    z = torch.tensor([[2.0, 1.0, 1.0, 1.0, 0.0]], **F64)
    assert kept_tokens(z, top_k=_one(2))[0].tolist() == [True, True, True, True, False]
    # top_p: mass before the tied group is q0 < 0.5, so all of it stays.
    assert kept_tokens(z, top_p=_one(0.5, torch.float64))[0].tolist() == [True, True, True, True, False]


@pytest.mark.parametrize("backend", BACKENDS + ["reference"])
def test_hand_derived_logp(backend):
    """Kept {0, 1} of q = [.4, .3, .2, .1]: logp(0) = ln(4/7), d logp / dz = onehot - q' with q' = [4, 3,
    0, 0] / 7; a label outside the set: -inf and a zero gradient row."""
    x = _row([0.4, 0.3, 0.2, 0.1]).repeat(2, 1).requires_grad_()
    logp = rk.logprobs_from_logits(x, torch.tensor([0, 2]), top_k=2, backend=backend)
    assert logp[0].item() == pytest.approx(math.log(4 / 7), abs=1e-12)
    assert logp[1].item() == -math.inf
    (grad,) = torch.autograd.grad(logp[0] + 0 * logp[1].clamp_min(-1e9), x)
    assert grad[0].tolist() == pytest.approx([3 / 7, -3 / 7, 0.0, 0.0], abs=1e-12)
    assert grad[1].abs().max().item() == 0.0


# ---- every backend against the float64 reference ----

OPTIONS = {
    "temperature-tensor": dict(temperature="rows"),
    "top_k": dict(top_k=20),
    "top_k-rows": dict(top_k="rows", return_entropy=True),
    "top_p": dict(top_p=0.9, return_sum_pi_squared=True),
    "min_p": dict(min_p=0.05, temperature=0.8),
    "all": dict(
        temperature="rows",
        top_k="rows",
        top_p="rows",
        min_p=0.02,
        softcap=6.0,
        ignore=True,
        return_entropy=True,
        return_sum_pi_squared=True,
    ),  # fmt: skip
}


def _options(option, lead):
    """The call's keywords: "rows" becomes a per-token tensor (top_k rows include <= 0: off)."""
    kw = dict(OPTIONS[option])
    kw.pop("ignore", None)
    rows = {
        "temperature": lambda: torch.rand(lead, **F64) + 0.5,
        "top_k": lambda: torch.randint(-2, 80, lead),
        "top_p": lambda: torch.where(torch.rand(lead) < 0.2, 1.0, torch.rand(lead, **F64) * 0.9 + 0.05),
    }
    return {k: rows[k]() if x == "rows" else x for k, x in kw.items()}


def _f32(kw):
    """Per-token float options in fp32, as a trainer holds them (the reference gets the same values)."""
    return {
        k: x.float() if isinstance(x, torch.Tensor) and x.is_floating_point() else x for k, x in kw.items()
    }


def _sampling_rows(z64, kw):
    """(the transformed float64 logits, the truncation options as per-row tensors) of a call's keywords."""
    from rlkernels.reference.logprobs import transform_logits

    t = kw.get("temperature", 1.0)
    z = transform_logits(z64, t.double() if isinstance(t, torch.Tensor) else t, kw.get("softcap"))
    as_rows = {k: (x if isinstance(x, torch.Tensor) else torch.full(z.shape[:-1], x)) for k, x in kw.items()
               if k in ("top_k", "top_p", "min_p")}  # fmt: skip
    return z, {k: x.double() if k != "top_k" else x for k, x in as_rows.items()}


# A kept set decided by rounding: top_p / min_p within this relative distance of a token's boundary (the mass
# before it, its share of the top probability). There fp32 arithmetic in any order may keep the token or not
# (seen: the mass before a token 1.6e-7 under top_p = 0.9), and the truncated outputs jump.
AMBIGUOUS_REL = 1e-5


def _kept_set_is_ambiguous(z64, kw) -> bool:
    z, as_rows = _sampling_rows(z64, kw)
    if not set(as_rows) & {"top_p", "min_p"}:
        return False

    def scaled(factor):  # top_k as it is, and a top_p of 1 stays off
        return {
            k: x if k == "top_k" else torch.where((k == "top_p") & (x >= 1), x, x * factor)
            for k, x in as_rows.items()
        }

    lo, hi = scaled(1 - AMBIGUOUS_REL), scaled(1 + AMBIGUOUS_REL)
    return bool((kept_tokens(z, **lo) != kept_tokens(z, **hi)).any())


def _unambiguous_draw(draw, kw):
    """draw() -> (..., the float64 logits last), redrawn while a row's kept set is decided by rounding (the
    oracle rule cannot judge a truncation at its boundary); the seed fixes the sequence of draws."""
    for _ in range(50):
        out = draw()
        if not _kept_set_is_ambiguous(out[-1], kw):
            return out
    raise AssertionError("50 draws in a row had a kept set within rounding of its boundary")


def _labels(z64, kw, ignore):
    """Labels drawn from the sampling distribution (every fifth row: the least likely token, outside any
    truncated set), every third row ignored when `ignore`."""
    z, as_rows = _sampling_rows(z64, kw)
    keep = kept_tokens(z, **as_rows) if as_rows else torch.ones_like(z, dtype=torch.bool)
    probs = torch.softmax(torch.where(keep, z, -torch.inf), -1)
    labels = torch.multinomial(probs.reshape(-1, z.shape[-1]), 1).view(z.shape[:-1])
    flat = labels.view(-1)
    flat[::5] = z.reshape(-1, z.shape[-1])[::5].argmin(-1)
    if ignore:
        flat[1::3] = -100
    return labels


def _loss(logp, ent, g_logp, g_ent):
    """Σ g·logp over finite logp (a label outside the kept set has no gradient) + Σ g·entropy."""
    loss = (torch.where(torch.isfinite(logp), logp, 0) * g_logp).sum()
    return loss + ((ent * g_ent).sum() if ent is not None else 0.0)


def _unpack(out, kw):
    out = out if isinstance(out, tuple) else (out,)
    ent = out[1] if kw.get("return_entropy") else None
    sum_sq = out[-1] if kw.get("return_sum_pi_squared") else None
    return out[0], ent, sum_sq


def _run_logits(logits, labels, g, *, backend, **kw):
    x = logits.detach().clone().requires_grad_()
    logp, ent, sum_sq = _unpack(rk.logprobs_from_logits(x, labels, backend=backend, **kw), kw)
    (grad,) = torch.autograd.grad(_loss(logp, ent, *g), x)
    return [logp, ent, grad, sum_sq]


@pytest.mark.parametrize("option", list(OPTIONS))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_logprobs_from_logits_matches_reference(backend, dtype, option, seed):
    lead, vocab = (6, 7), 1000
    kw = _options(option, lead)
    (logits,) = _unambiguous_draw(lambda: ((torch.randn(*lead, vocab, **F64) * 3).to(dtype).double(),), kw)
    logits = logits.to(dtype)
    labels = _labels(logits.double(), kw, OPTIONS[option].get("ignore", False))
    g = (torch.randn(lead, **F64), torch.randn(lead, **F64))
    out = _run_logits(logits, labels, g, backend=backend, **_f32(kw))
    same = _run_logits(logits, labels, g, backend="reference", **_f32(kw))
    oracle = _run_logits(logits.double(), labels, g, backend="reference", **kw)
    if option in ("top_k", "top_p", "min_p"):
        assert (out[0] == -math.inf).sum() > 0  # the argmin rows
    names = ("logp", "entropy", "d logits", "sum_pi_squared")
    for name, o, s, r in zip(names, out, same, oracle, strict=True):
        if r is not None:
            grad_dtype = dtype if name == "d logits" else None
            assert_oracle(f"{backend}/{option}/{name}", o, s, r, dtype=grad_dtype)


def _run_linear(h, w, b, labels, g, *, backend, **kw):
    h, w, b = (t.detach().clone().requires_grad_() for t in (h, w, b))
    logp, ent, sum_sq = _unpack(rk.linear_logprobs(h, w, labels, bias=b, backend=backend, **kw), kw)
    grads = torch.autograd.grad(_loss(logp, ent, *g), (h, w, b))
    return [logp, ent, *grads, sum_sq]


@pytest.mark.parametrize("option", ["temperature-tensor", "top_p", "all"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_linear_logprobs_matches_reference(backend, dtype, option, seed, monkeypatch):
    for device in rk.ops.linear_sweep.BLOCK_BYTES:  # several blocks of 16 rows, on every flavor
        monkeypatch.setitem(rk.ops.linear_sweep.BLOCK_BYTES, device, 16 * 4 * 700)
    lead, dim, vocab = (5, 9), 32, 700
    kw = _options(option, lead)

    def draw():
        h = torch.randn(*lead, dim, **F64).to(dtype)
        w = (torch.randn(vocab, dim, **F64) / 2).to(dtype)
        b = torch.randn(vocab, **F64).to(dtype)
        return h, w, b, torch.nn.functional.linear(h.double(), w.double(), b.double())

    h, w, b, logits64 = _unambiguous_draw(draw, kw)
    labels = _labels(logits64, kw, OPTIONS[option].get("ignore", False))
    g = (torch.randn(lead, **F64), torch.randn(lead, **F64))
    out = _run_linear(h, w, b, labels, g, backend=backend, **_f32(kw))
    same = _run_linear(h, w, b, labels, g, backend="reference", **_f32(kw))
    oracle = _run_linear(h.double(), w.double(), b.double(), labels, g, backend="reference", **kw)
    names = ("logp", "entropy", "d hidden", "d weight", "d bias", "sum_pi_squared")
    for name, o, s, r in zip(names, out, same, oracle, strict=True):
        if r is not None:
            grad_dtype = dtype if name.startswith("d ") else None
            assert_oracle(f"{backend}/{option}/{name}", o, s, r, dtype=grad_dtype)


@pytest.mark.parametrize("backend", BACKENDS)
def test_linear_policy_loss_matches_composition(backend, seed):
    """The sweep with sampling (gradients in the forward) against the reference composition."""
    B, T, D, V = 3, 8, 16, 300
    h = torch.randn(B, T, D, **F64).float()
    w = (torch.randn(V, D, **F64) / 2).float()
    temp = torch.rand(B, T) + 0.5
    kw = dict(temperature=temp, top_p=0.95, top_k=torch.randint(0, 50, (B, T)), min_p=0.01)
    logits = torch.nn.functional.linear(h.double(), w.double())
    labels = _labels(logits, {**kw, "temperature": temp.double()}, False)
    labels.view(-1)[::5] = 0  # some may fall outside: masked out below
    mask = torch.ones(B, T, dtype=torch.bool)
    ref_keep = torch.isfinite(rk.linear_logprobs(h.double(), w.double(), labels, backend="reference", **kw))
    mask &= ref_keep
    old = torch.randn(B, T) * 0.1 - 2
    adv = torch.randn(B)
    results = []
    for be, dt in ((backend, torch.float32), ("reference", torch.float64)):
        hh, ww = h.detach().to(dt).requires_grad_(), w.detach().to(dt).requires_grad_()
        loss, _ = rk.linear_policy_loss(
            hh, ww, labels, old.to(dt), adv.to(dt), mask, backend=be, entropy_coef=0.01, **kw
        )
        loss.backward()
        results.append((loss, hh.grad, ww.grad))
    for name, o, r in zip(("loss", "d hidden", "d weight"), *results, strict=True):
        assert_oracle(f"{backend}/{name}", o, None, r)


@pytest.mark.parametrize("backend", BACKENDS)
def test_top_p_search_widens(backend, monkeypatch):
    """A flat row holds top_p in thousands of tokens: the candidate search must widen (8x per round) until
    it does, up to the whole row; top_k larger than the first candidate count too."""
    monkeypatch.setattr(sampling, "TOP_P_CANDIDATES", 16)
    torch.manual_seed(0)
    logits = torch.randn(5, 3000, **F64) * 0.1
    logits[0, :] = 0.0  # all tied: everything is kept
    labels = torch.randint(0, 3000, (5,))
    for kw in (dict(top_p=0.99), dict(top_p=0.5, top_k=2500), dict(top_k=700)):
        out = rk.logprobs_from_logits(logits.float(), labels, backend=backend, return_entropy=True, **kw)
        ref = rk.logprobs_from_logits(logits, labels, backend="reference", return_entropy=True, **kw)
        for name, o, r in zip(("logp", "entropy"), out, ref, strict=True):
            assert_oracle(f"{backend}/{kw}/{name}", o, None, r)


def test_plain_options_take_the_plain_path():
    """A float temperature alone is the fused path (no Sampling); top_p = 1 and top_k >= V agree with it."""
    assert (
        sampling.check_sampling("op", 0.7, None, None, None, torch.zeros(3, dtype=torch.long), torch.float32)
        is None
    )
    logits, labels = torch.randn(4, 50), torch.randint(0, 50, (4,))
    plain = rk.logprobs_from_logits(logits, labels, backend="reference")
    untruncated = rk.logprobs_from_logits(logits, labels, top_p=1.0, top_k=50, backend="reference")
    assert torch.allclose(untruncated, plain)


# ---- arguments ----


@pytest.mark.parametrize(
    "kw, error, match",
    [
        (dict(top_p=0.0), ValueError, "top_p must be in"),
        (dict(top_p=1.5), ValueError, "top_p must be in"),
        (dict(min_p=-0.1), ValueError, "min_p must be in"),
        (dict(top_k=0), ValueError, "top_k must be >= 1"),
        (dict(top_k=2.5), TypeError, "top_k must be an int"),
        (dict(top_k=True), TypeError, "top_k must be an int"),
        (dict(top_p="0.9"), TypeError, "top_p must be a number"),
        (dict(temperature=torch.zeros(2, 3)), ValueError, "temperature must be finite and > 0"),
        (dict(temperature=torch.full((2, 3), math.inf)), ValueError, "temperature must be finite and > 0"),
        (dict(temperature=torch.ones(3)), ValueError, "temperature has shape"),
        (dict(top_p=torch.full((2, 3), 2.0)), ValueError, "top_p must be in"),
        (dict(top_k=torch.ones(2, 3)), TypeError, "top_k"),
    ],
)
def test_bad_arguments(kw, error, match):
    logits, labels = torch.randn(2, 3, 10), torch.randint(0, 10, (2, 3))
    with pytest.raises(error, match=match):
        rk.logprobs_from_logits(logits, labels, **kw)
    with pytest.raises(error, match=match):
        rk.linear_logprobs(torch.randn(2, 3, 4), torch.randn(10, 4), labels, **kw)


def test_not_with_process_group():
    with pytest.raises(ValueError, match="not supported with process_group"):
        rk.linear_logprobs(torch.randn(3, 4), torch.randn(10, 4), torch.zeros(3, dtype=torch.long), top_p=0.9,
                           process_group=object())  # fmt: skip


def test_matches_installed_vllm():
    """Where vLLM is installed: its own masking code (MinPLogitsProcessor's rule, then
    apply_top_k_top_p_pytorch) keeps the same tokens as the reference. Fails when a vLLM release changes
    the rules this module is pinned to (0.33.0)."""
    topk_topp = pytest.importorskip("vllm.v1.sample.ops.topk_topp_sampler")
    torch.manual_seed(0)
    for _ in range(50):
        vocab = int(torch.randint(2, 300, ()))
        z = torch.randn(8, vocab, **F64) * 3
        k = torch.randint(1, vocab + 1, (8,))
        p, mp = torch.rand(8, **F64) * 0.9 + 0.05, torch.rand(8, **F64) * 0.3
        x = z.clone()
        probs = torch.softmax(x, -1)
        x.masked_fill_(probs < mp[:, None] * probs.amax(-1, keepdim=True), -math.inf)
        x = topk_topp.apply_top_k_top_p_pytorch(x, k, p)
        assert torch.equal(x > -math.inf, kept_tokens(z, k, p, mp))
