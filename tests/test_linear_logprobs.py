"""linear_logprobs: every backend x dtype x {temperature, softcap, ignore_index rows, bias, entropy} x odd and
multi-chunk shapes against the float64 reference (values, and gradients of hidden / weight / bias with random
upstream gradients for logp and entropy together), hand-derived values, fast paths (no_grad, frozen head),
edge cases, a structural memory bound, opcheck and torch.compile."""

import math

import pytest
import torch
from oracle import DTYPES, assert_oracle, cpu_kernel_backends, plain
from torch.profiler import ProfilerActivity, profile

import rlkernels as rk
from rlkernels.memory import cpu_peak_bytes
from rlkernels.ops import logprobs as ops
from rlkernels.triton import linear_blocked

BACKENDS = cpu_kernel_backends()
ALL_BACKENDS = BACKENDS + ["reference"]
OPTIONS = {
    "plain": dict(),
    "entropy": dict(return_entropy=True),
    "temperature+bias+entropy": dict(temperature=0.7, bias=True, return_entropy=True),
    "softcap+ignore": dict(softcap=5.0, ignore=True),
    "softcap+sum_sq": dict(softcap=5.0, return_sum_pi_squared=True),
    "all": dict(
        temperature=1.3, softcap=8.0, bias=True, ignore=True, return_entropy=True, return_sum_pi_squared=True
    ),
}
# (leading shape, D, V, chunk_size): an odd single-chunk case and multi-chunk ones (several vocabulary
# slices / splits, a last partial slice); the C++ kernel also gets a bigger multi-row-block case.
SHAPES = {
    "37x19x271": ((37,), 19, 271, None),
    "3x13x32x300/128": ((3, 13), 32, 300, 128),
    # 34 vocabulary splits: the Triton combine merges them 16 at a time (COMBINE_SPLITS), two partial chunks.
    "37x19x271/8": ((37,), 19, 271, 8),
}
CPU_SHAPES = {"2100x32x1271/300": ((2100,), 32, 1271, 300)}  # 2 row blocks x 5 slices


def make_case(lead, d, vocab, dtype, *, bias=False, ignore=False, scale=3.0):
    """hidden ~ N(0, 1), weight ~ N(0, scale^2 / D) (logits of std ~scale), labels with every third row
    ignored when `ignore` and some rows labelled with their most likely token."""
    hidden = torch.randn(*lead, d, dtype=torch.float64)
    weight = torch.randn(vocab, d, dtype=torch.float64) * (scale / math.sqrt(d))
    b = torch.randn(vocab, dtype=torch.float64) if bias else None
    labels = torch.randint(0, vocab, lead)
    flat = labels.view(-1)
    logits = (hidden @ weight.T).view(-1, vocab)
    flat[1::5] = logits[1::5].argmax(-1)
    if ignore:
        flat[::3] = -100
    cast = lambda t: None if t is None else t.to(dtype)
    return cast(hidden), cast(weight), cast(b), labels


def run(hidden, weight, bias, labels, g_logp, g_ent, *, backend, scale=1.0, wrt=(True, True, True), **kw):
    """(logp, entropy or None, d hidden, d weight, d bias) of loss = scale * (Σ g_logp·logp + Σ g_ent·H);
    gradients only for the inputs flagged in `wrt` (None for the others); then sum_pi_squared (detached)
    when asked for."""
    leaves = []
    for t, want in zip((hidden, weight, bias), wrt, strict=True):
        leaves.append(None if t is None else t.detach().clone().requires_grad_(want))
    h, w, b = leaves
    out = rk.linear_logprobs(h, w, labels, bias=b, backend=backend, **kw)
    out = out if isinstance(out, tuple) else (out,)
    ent = out[1] if kw.get("return_entropy") else None
    sum_sq = out[-1] if kw.get("return_sum_pi_squared") else None
    assert len(out) == 1 + (ent is not None) + (sum_sq is not None)
    logp = out[0]
    loss = (logp * g_logp).sum() + ((ent * g_ent).sum() if ent is not None else 0.0)
    inputs = [t for t in leaves if t is not None and t.requires_grad]
    grads = iter(torch.autograd.grad(scale * loss, inputs))
    result = (logp, ent) + tuple(next(grads) if t is not None and t.requires_grad else None for t in leaves)
    if sum_sq is None:
        return result
    assert not sum_sq.requires_grad and sum_sq.grad_fn is None
    return result + (sum_sq,)


def matches_reference(backend, dtype, kw, label, shape=(41, 24, 301)):
    """Every output and gradient of linear_logprobs (`shape` = (tokens, D, V), random upstream gradients)
    against float64 by the error rule; `kw`: the call's options, with "bias" and "ignore" for make_case.
    Through the GEMM kernels under the interpreter (tests/test_linear_gemm_*.py), the default shape is three
    row blocks x ten vocabulary tiles of the interpreter's 16 x 32 x 16 blocks, the last 13 columns wide, K
    in a step of 16 and one of 8."""
    kw = dict(kw)
    case_kw = {k: kw.pop(k) for k in ("bias", "ignore") if k in kw}
    n, d, vocab = shape
    hidden, weight, bias, labels = make_case((n,), d, vocab, dtype, **case_kw)
    g_logp = torch.randn(n, dtype=torch.float64)
    g_ent = torch.randn(n, dtype=torch.float64) if kw.get("return_entropy") else None
    cast = lambda t: None if t is None else t.to(dtype)  # noqa: E731
    got = run(hidden, weight, bias, labels, cast(g_logp), cast(g_ent), backend=backend, **kw)
    same = run(hidden, weight, bias, labels, cast(g_logp), cast(g_ent), backend="reference", **kw)
    up = lambda t: None if t is None else t.double()  # noqa: E731
    want = run(up(hidden), up(weight), up(bias), labels, g_logp, g_ent, backend="reference", **kw)
    names = ("logp", "entropy", "d hidden", "d weight", "d bias", "sum_pi_squared")
    for name, g, s, w in zip(names, got, same, want, strict=False):
        if w is None:
            assert g is None
            continue
        assert_oracle(f"{backend}/{label}/{name}", g, s, w)


def _split(option):
    kw = dict(OPTIONS[option])
    return kw.pop("bias", False), kw.pop("ignore", False), kw


def _check_against_oracle(backend, dtype, option, shape):
    lead, d, vocab, chunk = shape
    with_bias, ignore, kw = _split(option)
    hidden, weight, bias, labels = make_case(lead, d, vocab, dtype, bias=with_bias, ignore=ignore)
    g_logp, g_ent = torch.randn(lead, dtype=torch.float64), torch.randn(lead, dtype=torch.float64)
    out = run(hidden, weight, bias, labels, g_logp, g_ent, backend=backend, chunk_size=chunk, **kw)
    same = run(hidden, weight, bias, labels, g_logp, g_ent, backend="reference", **kw)
    as64 = lambda t: None if t is None else t.double()
    oracle = run(as64(hidden), as64(weight), as64(bias), labels, g_logp, g_ent, backend="reference", **kw)
    assert out[0].dtype == torch.float32 and out[0].shape == lead
    names = ("logp", "entropy", "d hidden", "d weight", "d bias", "sum_pi_squared")[: len(out)]
    if kw.get("return_sum_pi_squared"):
        assert out[5].shape == lead and ((out[5] > 0) & (out[5] <= 1) | (labels == -100)).all()
    for name, o, s, r in zip(names, out, same, oracle, strict=True):
        if r is not None:
            assert o.dtype == (dtype if name.startswith("d ") else torch.float32)
            assert_oracle(
                f"{backend}/{option}/{name}", o, s, r, dtype=dtype if name.startswith("d ") else None
            )


# Every backend x dtype x option x shape, but the 34-split shape on the CUDA-on-CPU harness with every
# option at once only (~14 s a case there: 15 cases were a quarter of the suite's time); its options one by
# one run there at the other shapes, and every option at every shape on the other flavors.
SLOW = ("cuda-on-cpu", "37x19x271/8")
MATRIX = [
    (backend, dtype, option, shape)
    for backend in BACKENDS
    for dtype in DTYPES
    for option in OPTIONS
    for shape in SHAPES
    if (backend.name, shape) != SLOW or option == "all"
]


@pytest.mark.parametrize(
    "backend,dtype,option,shape",
    MATRIX,
    ids=[f"{b}-{str(d).removeprefix('torch.')}-{o}-{s}" for b, d, o, s in MATRIX],
)
def test_matches_float64_reference(backend, dtype, option, shape, seed):
    _check_against_oracle(backend, dtype, option, SHAPES[shape])


@pytest.mark.skipif("cpu" not in BACKENDS, reason="the C++ extension is not built")
@pytest.mark.parametrize("shape", list(CPU_SHAPES))
@pytest.mark.parametrize("option", ["plain", "all"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_cpu_multi_block_matches_float64_reference(dtype, option, shape, seed):
    _check_against_oracle("cpu", dtype, option, CPU_SHAPES[shape])


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_hand_derived_values(backend):
    """hidden = I, weight rows e0, e1, e0 + e1: logits row 0 = [1, 0, 1], row 1 = [0, 1, 1].
    Row 0, label 0: logp = 1 - ln(2e + 1); q = [e, 1, e] / (2e + 1);
    d logp / d hidden_0 = (onehot - q) @ W = [1 / (2e + 1), -(1 + e) / (2e + 1)],
    d logp / d W_j = (onehot - q)_j h_0.
    With bias [0, 0, -1], row 0 = [1, 0, 0]: logp = 1 - ln(e + 2)."""
    f64 = dict(dtype=torch.float64)
    hidden = torch.eye(2, **f64)
    weight = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], **f64)
    labels = torch.tensor([0, 2])
    e = math.e
    g = torch.tensor([1.0, 0.0], **f64)
    logp, _, dh, dw, _ = run(hidden, weight, None, labels, g, None, backend=backend)
    assert logp.tolist() == pytest.approx([1 - math.log(2 * e + 1), 1 - math.log(2 * e + 1)], abs=1e-12)
    z = 2 * e + 1
    assert dh[0].tolist() == pytest.approx([1 / z, -(1 + e) / z], abs=1e-12)
    assert dh[1].tolist() == pytest.approx([0.0, 0.0], abs=1e-15)
    for got, want in zip(dw.tolist(), [[1 - e / z, 0.0], [-1 / z, 0.0], [-e / z, 0.0]], strict=True):
        assert got == pytest.approx(want, abs=1e-12)
    bias = torch.tensor([0.0, 0.0, -1.0], **f64)
    logp, *_ = run(hidden, weight, bias, labels, g, None, backend=backend)
    assert logp[0].item() == pytest.approx(1 - math.log(e + 2), abs=1e-12)
    # Entropy of row 1 with bias: logits [0, 1, 0] -> q = [1, e, 1] / (e + 2), H = ln(e + 2) - e / (e + 2).
    _, ent, *_ = run(hidden, weight, bias, labels, g, g, backend=backend, return_entropy=True)
    assert ent[1].item() == pytest.approx(math.log(e + 2) - e / (e + 2), abs=1e-12)
    # Σ q² of row 1 with bias: (1 + e² + 1) / (e + 2)²; of row 0 without: (2e² + 1) / (2e + 1)².
    *_, sum_sq = run(hidden, weight, bias, labels, g, g, backend=backend, return_sum_pi_squared=True)
    assert sum_sq[1].item() == pytest.approx((2 + e * e) / (e + 2) ** 2, rel=1e-12)
    *_, sum_sq = run(hidden, weight, None, labels, g, g, backend=backend, return_sum_pi_squared=True)
    assert sum_sq[0].item() == pytest.approx((2 * e * e + 1) / (2 * e + 1) ** 2, rel=1e-12)
    # A zero head gives uniform logits: Σ q² = 1 / V, over one chunk and over many.
    flat = torch.zeros(1000, 2, **f64)
    for chunk in (None, 7):
        kw = dict(backend=backend, return_sum_pi_squared=True, chunk_size=chunk)
        if backend == "reference":
            kw.pop("chunk_size")
        *_, sum_sq = run(hidden, flat, None, labels, g, g, **kw)
        assert sum_sq.tolist() == pytest.approx([1e-3, 1e-3], rel=1e-12)


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_ignored_rows_get_zero_and_no_gradient(backend):
    hidden, weight, bias, labels = make_case((20,), 8, 50, torch.float32, bias=True, ignore=True)
    ignored = labels == -100
    g = torch.randn(20, dtype=torch.float64)
    logp, ent, dh, dw, db, sum_sq = run(
        hidden,
        weight,
        bias,
        labels,
        g,
        g,
        backend=backend,
        return_entropy=True,
        return_sum_pi_squared=True,
        softcap=3.0,
    )
    assert (logp[ignored] == 0).all() and (ent[ignored] == 0).all() and (sum_sq[ignored] == 0).all()
    assert (sum_sq[~ignored] > 0).all()
    assert (dh[ignored] == 0).all() and (dh[~ignored] != 0).any()
    # Every row ignored: zero outputs and exactly zero gradients, no NaN anywhere.
    none = torch.full_like(labels, -100)
    logp, ent, dh, dw, db = run(hidden, weight, bias, none, g, g, backend=backend, return_entropy=True)
    for t in (logp, ent, dh, dw, db):
        assert (t == 0).all()


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_huge_logits_stay_finite(backend):
    """Logits of magnitude up to ~1e4: logp <= 0, entropy in [0, log V], finite values and gradients."""
    vocab = 97
    hidden, weight, bias, labels = make_case((19,), 16, vocab, torch.float32, bias=True)
    hidden = hidden * (1e4 / 16)
    weight = weight.sign()
    g = torch.ones(19, dtype=torch.float64)
    logp, ent, dh, dw, db = run(hidden, weight, bias, labels, g, g, backend=backend, return_entropy=True)
    for t in (logp, ent, dh, dw, db):
        assert torch.isfinite(t).all()
    assert (logp <= 0).all()
    assert (ent >= 0).all() and (ent <= math.log(vocab) + 1e-5).all()


MASKED_BIAS_OPTIONS = {
    "entropy": dict(return_entropy=True),
    "temperature+sum_sq": dict(temperature=0.7, return_entropy=True, return_sum_pi_squared=True),
    "softcap": dict(softcap=5.0, return_entropy=True),  # softcap(-inf) = -5: no longer masked
}


@pytest.mark.parametrize("option", list(MASKED_BIAS_OPTIONS))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_masked_bias(backend, dtype, option, seed):
    masked_bias_matches_reference(backend, dtype, option)


def masked_bias_matches_reference(backend, dtype, option):
    """A head bias of -inf masks its token as a -inf logit does in logprobs_from_logits (docs/semantics.md,
    "Masked logits"): the first 40 columns (five whole 8-column slices) and every third, one of them a row's
    label (logp -inf). Every output and gradient against the float64 reference, with no NaN."""
    kw = MASKED_BIAS_OPTIONS[option]
    hidden, weight, bias, labels = make_case((41,), 24, 301, dtype, bias=True, ignore=True)
    bias[:40] = -math.inf
    bias[::3] = -math.inf
    live = labels != -100
    labels[live] = 41 + 3 * torch.randint(0, 86, (int(live.sum()),))  # unmasked columns
    labels[2] = 33
    g_logp, g_ent = torch.randn(41, dtype=torch.float64), torch.randn(41, dtype=torch.float64)
    cast = lambda t: t.to(dtype)  # noqa: E731
    got = run(hidden, weight, bias, labels, cast(g_logp), cast(g_ent), backend=backend, chunk_size=8, **kw)
    same = run(hidden, weight, bias, labels, cast(g_logp), cast(g_ent), backend="reference", **kw)
    up = lambda t: t.double()  # noqa: E731
    want = run(up(hidden), up(weight), up(bias), labels, g_logp, g_ent, backend="reference", **kw)
    masked_label = want[0][2] == -math.inf
    assert masked_label == ("softcap" not in kw)
    assert torch.isfinite(want[0][3:]).all() and all(torch.isfinite(w).all() for w in want[1:])
    assert (want[4][bias == -math.inf] == 0).sum() > 100  # most masked columns get no gradient
    names = ("logp", "entropy", "d hidden", "d weight", "d bias", "sum_pi_squared")[: len(want)]
    for name, g, s, w in zip(names, got, same, want, strict=True):
        assert not g.isnan().any(), f"{backend}/{option}/{name}: NaN"
        assert_oracle(f"{backend}/{option}/{name}", g, s, w, dtype=dtype if name.startswith("d ") else None)


@pytest.mark.parametrize("backend", BACKENDS)
def test_leading_shape_strided_int32_and_expanded_grad(backend):
    """hidden [B, T, D] as a non-contiguous view, int32 labels, the stride-0 gradient of a scaled .sum()."""
    hidden, weight, bias, labels = make_case((3, 7), 24, 61, torch.float32, bias=True, ignore=True)
    strided = hidden.transpose(0, 1).contiguous().transpose(0, 1)
    assert not strided.is_contiguous()
    ones = torch.ones(3, 7, dtype=torch.float64)
    for kw in (dict(), dict(return_entropy=True, temperature=0.6)):
        got = run(strided, weight, bias, labels.int(), ones, ones, backend=backend, scale=2.5, **kw)
        same = run(hidden, weight, bias, labels, ones, ones, backend="reference", scale=2.5, **kw)
        want = run(
            hidden.double(),
            weight.double(),
            bias.double(),
            labels,
            ones,
            ones,
            backend="reference",
            scale=2.5,
            **kw,
        )
        assert got[0].shape == (3, 7) and got[2].shape == (3, 7, 24)
        for o, s, r in zip(got, same, want, strict=True):
            if r is not None:
                assert_oracle(backend, o, s, r)


def _gemm_calls(fn) -> int:
    """Number of ATen matrix products (mm / addmm, in place or not) that fn() runs."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    names = ("aten::mm", "aten::addmm", "aten::addmm_")
    return sum(1 for e in prof.events() if e.name in names)


@pytest.mark.parametrize("backend", BACKENDS)
def test_frozen_head_and_no_grad_fast_paths(backend):
    """A frozen (or LoRA) head: d logp / d hidden formed in the forward (logits + one GEMM per block of rows,
    per vocabulary chunk on the C++ CPU flavor: ops/frozen_head.py), no GEMM in the backward; frozen hidden:
    no d hidden work; under no_grad: nothing saved."""
    hidden, weight, _, labels = make_case((40,), 16, 300, torch.float32)
    g = torch.randn(40, dtype=torch.float64)
    chunks = 3

    def gemms(wrt):
        """(ATen GEMMs of the forward, of the backward)."""
        h = hidden.clone().requires_grad_(wrt[0])
        w = weight.clone().requires_grad_(wrt[1])
        out = []
        forward = _gemm_calls(
            lambda: out.append(rk.linear_logprobs(h, w, labels, chunk_size=100, backend=backend))
        )
        wanted = [t for t in (h, w) if t.requires_grad]
        return forward, _gemm_calls(lambda: torch.autograd.grad((out[0] * g).sum(), wanted))

    full, frozen_head, frozen_hidden = gemms((True, True)), gemms((True, False)), gemms((False, True))
    assert frozen_head == (2, 0)  # one block of 40 rows, one chunk of 300: logits, then d logp / d hidden
    if backend.kind != "triton" or linear_blocked.used(backend.device):
        # per chunk (cuBLAS on CUDA, also the Triton flavor's blocks there): logits; backward: logits,
        # d hidden, d weight
        assert (full, frozen_hidden) == ((chunks, 3 * chunks), (chunks, 2 * chunks))
    else:  # Triton: the d weight GEMM is the only ATen one
        assert (full, frozen_hidden) == ((0, chunks), (0, chunks))
    got = run(hidden, weight, None, labels, g, None, backend=backend, wrt=(True, False, False))
    same = run(hidden, weight, None, labels, g, None, backend="reference", wrt=(True, False, False))
    want = run(
        hidden.double(), weight.double(), None, labels, g, None, backend="reference", wrt=(True, False, False)
    )
    assert got[3] is None
    assert_oracle(backend, got[2], same[2], want[2])
    with torch.no_grad():
        logp = rk.linear_logprobs(hidden.requires_grad_(), weight.requires_grad_(), labels, backend=backend)
    assert logp.grad_fn is None


@pytest.mark.parametrize("backend", BACKENDS)
def test_gradcheck_float64(backend):
    hidden, weight, bias, labels = make_case((4,), 3, 7, torch.float64, bias=True, ignore=True, scale=1.0)
    h, w, b = (t.clone().requires_grad_() for t in (hidden, weight, bias))

    def fn(h, w, b):
        return rk.linear_logprobs(
            h,
            w,
            labels,
            bias=b,
            temperature=0.8,
            softcap=2.5,
            return_entropy=True,
            chunk_size=3,
            backend=backend,
        )

    assert torch.autograd.gradcheck(fn, (h, w, b))


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_empty_rows(backend):
    h = torch.zeros(0, 5, requires_grad=True)
    w = torch.randn(9, 5, requires_grad=True)
    logp, ent = rk.linear_logprobs(
        h, w, torch.zeros(0, dtype=torch.long), return_entropy=True, backend=backend
    )
    assert logp.shape == (0,) and ent.shape == (0,)
    (logp.sum() + ent.sum()).backward()
    assert h.grad.shape == (0, 5) and (w.grad == 0).all()


@pytest.mark.skipif("cpu" not in BACKENDS, reason="the C++ extension is not built")
def test_cpu_chunk_sizes_agree():
    """One column per chunk, a prime chunk, and the whole vocabulary give the oracle's answer."""
    hidden, weight, bias, labels = make_case((9,), 6, 23, torch.float32, bias=True, ignore=True)
    g = torch.randn(9, dtype=torch.float64)
    want = run(
        hidden.double(),
        weight.double(),
        bias.double(),
        labels,
        g,
        g,
        backend="reference",
        return_entropy=True,
    )
    same = run(hidden, weight, bias, labels, g, g, backend="reference", return_entropy=True)
    for chunk in (1, 7, 23, 1000):
        got = run(hidden, weight, bias, labels, g, g, backend="cpu", return_entropy=True, chunk_size=chunk)
        for o, s, r in zip(got, same, want, strict=True):
            assert_oracle(f"chunk {chunk}", o, s, r)


NATIVE_CUDA = [b for b in BACKENDS if b.kind == "native-cuda"]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend", NATIVE_CUDA)
def test_cuda_row_groups_and_blocks(backend, dtype, monkeypatch, seed):
    """The CUDA C++ flavor's blocked path (csrc/cuda/logprobs_binding.cpp) with its sizes overridden so that
    every loop runs several times at 41 rows, D=24, V=301 in 8-column slices: logits blocks of 8 rows (256
    bytes at 8 fp32 columns), 6 of them forward; backward row groups of 16 rows (a work budget of three
    16-row fp32 d hidden buffers), the last of 9 rows in blocks of 8 and 1. Every output and gradient
    against float64 with every option on; in fp32 (one ATen GEMM a product) the GEMMs those loops make: 6
    row blocks x 38 slices forward; 3 groups x 38 slices x 2 blocks recomputed, and per group and slice one
    d weight and one d hidden product."""
    monkeypatch.setenv("RLK_CUDA_LINEAR_WORK_BYTES", str(3 * 16 * 24 * 4))
    monkeypatch.setenv("RLK_CUDA_LINEAR_BLOCK_BYTES", str(8 * 8 * 4))
    shape = ((41,), 24, 301, 8)
    _check_against_oracle(backend, dtype, "all", shape)
    if dtype == torch.float32:
        hidden, weight, bias, labels = make_case((41,), 24, 301, dtype, bias=True)
        g = torch.randn(41, dtype=torch.float64)
        calls = _gemm_calls(lambda: run(hidden, weight, bias, labels, g, g, backend=backend, chunk_size=8))
        assert calls == 6 * 38 + 3 * 38 * 2 + 3 * 38 * 2


@pytest.mark.skipif("cpu" not in BACKENDS, reason="the C++ extension is not built")
def test_cpu_peak_memory_excludes_logits():
    """Forward + backward at N=4096, V=32000 allocate under 10% of N·V·4 (the fp32 logits eager makes),
    gradients of hidden and weight included."""
    n, d, vocab = 4096, 64, 32000
    hidden = torch.randn(n, d, requires_grad=True)
    weight = (torch.randn(vocab, d) / 8).requires_grad_()
    labels = torch.randint(0, vocab, (n,))

    def step():
        logp, ent = rk.linear_logprobs(hidden, weight, labels, return_entropy=True, backend="cpu")
        (logp.sum() + ent.sum()).backward()

    peak = cpu_peak_bytes(step)
    assert peak < 0.10 * n * vocab * 4, f"peak {peak / 2**20:.1f} MiB"
    assert hidden.grad is not None and weight.grad is not None


def test_validation_errors():
    hidden, weight, bias, labels = make_case((4,), 5, 9, torch.float32, bias=True)
    with pytest.raises(ValueError, match="labels must lie in"):
        rk.linear_logprobs(hidden, weight, torch.tensor([0, 1, 9, 2]))
    with pytest.raises(ValueError, match="labels has shape"):
        rk.linear_logprobs(hidden, weight, labels[:3])
    with pytest.raises(TypeError, match="labels must be an int32 or int64"):
        rk.linear_logprobs(hidden, weight, labels.float())
    with pytest.raises(ValueError, match="D = weight.shape"):
        rk.linear_logprobs(hidden[:, :4], weight, labels)
    with pytest.raises(ValueError, match="weight must be 2-D"):
        rk.linear_logprobs(hidden, weight[None], labels)
    with pytest.raises(TypeError, match="same dtype"):
        rk.linear_logprobs(hidden, weight.double(), labels)
    with pytest.raises(TypeError, match="hidden must be"):
        rk.linear_logprobs(hidden.long(), weight, labels)
    with pytest.raises(ValueError, match="bias has shape"):
        rk.linear_logprobs(hidden, weight, labels, bias=bias[:5])
    with pytest.raises(ValueError, match="temperature must be > 0"):
        rk.linear_logprobs(hidden, weight, labels, temperature=-1.0)
    with pytest.raises(ValueError, match="softcap must be > 0"):
        rk.linear_logprobs(hidden, weight, labels, softcap=0.0)
    with pytest.raises(ValueError, match="chunk_size must be >= 1"):
        rk.linear_logprobs(hidden, weight, labels, chunk_size=0)
    with pytest.raises(TypeError, match="ignore_index must be an int"):
        rk.linear_logprobs(hidden, weight, labels, ignore_index=1.5)
    with pytest.raises(ValueError, match="at least one row"):
        rk.linear_logprobs(hidden, weight[:0], labels)
    with pytest.raises(ValueError, match="one device"):
        rk.linear_logprobs(hidden, weight, labels.to("meta"))
    with pytest.raises(rk.BackendUnavailableError):
        rk.linear_logprobs(hidden, weight, labels, backend="cuda")
    # A bias of another float dtype is cast (its gradient comes back in its own dtype).
    b = bias.double().requires_grad_()
    rk.linear_logprobs(hidden, weight, labels, bias=b).sum().backward()
    assert b.grad.dtype == torch.float64


@pytest.mark.parametrize("backend", BACKENDS)
def test_opcheck(backend):
    """The op of each flavor that runs here, on its device (a Triton op runs only where Triton can: under a
    usable interpreter, or compiled on CUDA tensors)."""
    hidden, weight, bias, labels = make_case((6,), 8, 37, torch.float32, bias=True, ignore=True)
    op = getattr(torch.ops.rlkernels, ops.LINEAR_FLAVORS[backend])
    backward = getattr(torch.ops.rlkernels, ops.LINEAR_FLAVORS[backend] + "_backward")
    cases = ((None, None, False, False, None), (bias, 3.0, True, True, 16), (None, None, False, True, None))
    for b, softcap, entropy, sum_sq, chunk in cases:
        args = (
            hidden.clone().requires_grad_(),
            weight.clone().requires_grad_(),
            labels,
            b,
            0.9,
            softcap,
            -100,
            entropy,
            sum_sq,
            chunk,
        )
        torch.library.opcheck(op, args)
        logp, ent, lse, _ = op(hidden, weight, labels, b, 0.9, softcap, -100, entropy, sum_sq, chunk)
        g_ent = torch.randn(6) if entropy else None
        for mask in ([True, True, b is not None], [True, False, False]):
            torch.library.opcheck(
                backward,
                (torch.randn(6), g_ent, hidden, weight, labels, b, lse, ent, 0.9, softcap, -100, mask, chunk),
            )


@pytest.mark.parametrize("backend", BACKENDS)
def test_torch_compile_fullgraph(backend):
    backend = plain(backend)
    hidden, weight, bias, labels = make_case((2, 5), 8, 29, torch.float32, bias=True, ignore=True)

    def loss_fn(h, w, b):
        logp, ent = rk.linear_logprobs(
            h, w, labels, bias=b, temperature=0.9, return_entropy=True, backend=backend
        )
        return (logp * 2.0 - 0.1 * ent).sum()

    compiled = torch.compile(loss_fn, fullgraph=True)
    leaves1 = [t.clone().requires_grad_() for t in (hidden, weight, bias)]
    leaves2 = [t.clone().requires_grad_() for t in (hidden, weight, bias)]
    out1, out2 = compiled(*leaves1), loss_fn(*leaves2)
    torch.testing.assert_close(out1, out2)
    for g1, g2 in zip(torch.autograd.grad(out1, leaves1), torch.autograd.grad(out2, leaves2), strict=True):
        torch.testing.assert_close(g1, g2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_sum_pi_squared_under_torch_compile(backend):
    """The extra output traces (fake kernel, fourth output of the op) and stays detached: the loss's gradient
    is the one without it."""
    backend = plain(backend)
    hidden, weight, bias, labels = make_case((2, 5), 8, 29, torch.float32, bias=True, ignore=True)

    def fn(h, w, b):
        logp, ent, sum_sq = rk.linear_logprobs(
            h,
            w,
            labels,
            bias=b,
            softcap=4.0,
            return_entropy=True,
            return_sum_pi_squared=True,
            backend=backend,
        )
        return (logp - 0.1 * ent).sum(), sum_sq

    compiled = torch.compile(fn, fullgraph=True)
    leaves1 = [t.clone().requires_grad_() for t in (hidden, weight, bias)]
    leaves2 = [t.clone().requires_grad_() for t in (hidden, weight, bias)]
    (loss1, sq1), (loss2, sq2) = compiled(*leaves1), fn(*leaves2)
    torch.testing.assert_close(loss1, loss2)
    torch.testing.assert_close(sq1, sq2)
    assert not sq1.requires_grad and sq1.shape == (2, 5)
    for g1, g2 in zip(torch.autograd.grad(loss1, leaves1), torch.autograd.grad(loss2, leaves2), strict=True):
        torch.testing.assert_close(g1, g2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_non_finite_hidden_propagates_as_the_reference(backend):
    """A NaN or infinite hidden state is not rejected (a diverged model's activations, which eager log_softmax
    and the peers pass through too): its row's log-prob, entropy and every gradient it touches are NaN on
    every backend, exactly where the reference's are, and the other rows are unchanged."""
    hidden, weight, bias, labels = make_case((7,), 16, 301, torch.float64, bias=True, ignore=True)
    hidden[1, 3], hidden[4, 0] = float("nan"), float("inf")
    g_logp, g_ent = torch.randn(7, dtype=torch.float64), torch.randn(7, dtype=torch.float64)
    kw = dict(return_entropy=True)
    got = run(hidden, weight, bias, labels, g_logp, g_ent, backend=backend, **kw)
    want = run(hidden, weight, bias, labels, g_logp, g_ent, backend="reference", **kw)
    live = labels != -100
    assert live[1] and live[4]  # both poisoned rows are scored
    for name, g, w in zip(("logp", "entropy", "d hidden", "d weight", "d bias"), got, want, strict=True):
        assert torch.equal(g.isnan(), w.isnan()), name
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-9, equal_nan=True, msg=name)
    clean = torch.tensor([i not in (1, 4) for i in range(7)])
    assert got[0][clean].isfinite().all() and got[0][~clean].isnan().all()
