"""The row sweep (ops/linear_sweep.py): rk.linear_policy_loss with its gradients formed in the forward (3
GEMMs per block of rows, 2 with a frozen head) and rk.linear_logprobs with a frozen head (2 GEMMs, none in
the backward), on every kernel flavor, several blocks per call, against the float64 reference composition;
gradient scaling and further ops after the loss, one backward only, GEMM counts, memory, edge cases."""

import pytest
import torch
from oracle import assert_oracle, cpu_kernel_backends, drawn_on_cpu
from torch.profiler import ProfilerActivity, profile

import rlkernels as rk
from rlkernels.memory import cpu_peak_bytes
from rlkernels.ops import linear_sweep, logp_jacobian
from rlkernels.reference.policy_loss import linear_policy_loss as reference
from rlkernels.triton import linear_blocked

BACKENDS = cpu_kernel_backends()
B, T, D, V = 3, 9, 16, 211
# Rows of [R, V] fp32 logits per block in these tests: 16 (MIN_ROWS), so 27 tokens take 2 blocks.
SMALL_BLOCK = 16 * 4 * V

# name -> (policy options, which of hidden / weight / bias require a gradient)
CASES = {
    "clip+bias+softcap": (
        dict(temperature=0.8, softcap=6.0, clip_high=0.28, dual_clip=3.0, ratio_cap=4.0),
        (True, True, True),
    ),
    "cispo+entropy+kl+is_weights, frozen head": (
        dict(
            objective="cispo",
            agg="seq-mean-token-mean",
            entropy_coef=0.02,
            kl_coef=0.1,
            kl_kind="k2",
            ref=True,
            is_weights="row",
        ),  # fmt: skip
        (True, False, False),
    ),
    "dual clip+kl+softcap, frozen head, no entropy (streamed on the C++ CPU flavor)": (
        dict(temperature=1.3, softcap=5.0, dual_clip=3.0, kl_coef=0.05, ref=True, agg="seq-mean-token-sum"),
        (True, False, False),
    ),
    "sapo+seq-mean-token-sum-norm+dp, frozen hidden": (
        dict(objective="sapo", agg="seq-mean-token-sum-norm", dp_size=2, norm_len=5.0, is_weights="token"),
        (False, True, True),
    ),
    "token-mean with a global num_tokens tensor": (
        dict(agg="token-mean", num_tokens="tensor", entropy_coef=-0.01, kl_coef=0.05, ref=True),
        (True, True, False),
    ),
    # Packed sequences: no token masked or ignored, so the sweep takes the flat rows as they are.
    "every token kept, frozen head": (
        dict(every_token=True, entropy_coef=0.01, kl_coef=0.05, ref=True, agg="seq-mean-token-mean"),
        (True, False, False),
    ),
}


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
    for device in linear_sweep.BLOCK_BYTES:  # every flavor's blocks, the GPU's too
        monkeypatch.setitem(linear_sweep.BLOCK_BYTES, device, SMALL_BLOCK)
    # The C++ CPU flavor's frozen head (ops/logp_jacobian.py): 16-row blocks, 4 vocabulary chunks of 64
    # fp32 columns (of 32 fp64 ones), so the online rescaling runs across chunks and blocks.
    monkeypatch.setattr(logp_jacobian, "ROWS", 16)
    monkeypatch.setattr(logp_jacobian, "CHUNK_BYTES", 16 * 64 * 4)
    monkeypatch.setattr(logp_jacobian, "MIN_COLUMNS", 1)
    # The Triton flavor's (GPU) stream: 16-row blocks, vocabulary chunks of 64 columns.
    monkeypatch.setattr(logp_jacobian, "GPU_ROWS", 16)
    monkeypatch.setattr(logp_jacobian, "GPU_COLUMNS", 64)
    monkeypatch.setattr(logp_jacobian, "GPU_MIN_COLUMNS", 64)


@drawn_on_cpu
def _inputs(seed: int):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(B, T, D, dtype=torch.float64, generator=gen)
    weight = torch.randn(V, D, dtype=torch.float64, generator=gen) * (2.0 / D**0.5)
    bias = torch.randn(V, dtype=torch.float64, generator=gen) * 0.5
    labels = torch.randint(0, V, (B, T), generator=gen)
    labels[0, :3] = -100  # prompt tokens
    labels[2, 5] = -100
    old = torch.randn(B, T, dtype=torch.float64, generator=gen) * 0.3 - 5.0
    adv = torch.randn(B, dtype=torch.float64, generator=gen)
    mask = torch.rand(B, T, generator=gen) > 0.25
    ref = old + 0.2 * torch.randn(B, T, dtype=torch.float64, generator=gen)
    rows = torch.rand(B, dtype=torch.float64, generator=gen) + 0.5
    tokens = torch.rand(B, T, dtype=torch.float64, generator=gen) + 0.5
    return hidden, weight, bias, labels, old, adv, mask, ref, {"row": rows, "token": tokens}


def _kwargs(options: dict, ref, is_weights):
    kw = dict(options)
    kw.pop("every_token", None)
    if kw.pop("ref", False):
        kw["ref_logp"] = ref
    if "is_weights" in kw:
        kw["is_weights"] = is_weights[kw["is_weights"]]
    if kw.get("num_tokens") == "tensor":
        kw["num_tokens"] = torch.tensor(40.0)
    return kw


def _run(fn, dtype, wrt, seed, options, scale=lambda loss: loss, rounded_to=None, **extra):
    """(loss, stats, grads of the inputs in wrt) of fn at `dtype` for the seeded case; rounded_to: the
    hidden / weight / bias rounded to that dtype first."""
    hidden, weight, bias, labels, old, adv, mask, ref, is_weights = _inputs(seed)
    if options.get("every_token"):
        labels, mask = labels.clamp_min(0), torch.ones_like(mask)
    if rounded_to is not None:
        hidden, weight, bias = (t.to(rounded_to).to(torch.float64) for t in (hidden, weight, bias))
    h, w, b = (t.to(dtype).requires_grad_(r) for t, r in zip((hidden, weight, bias), wrt, strict=True))
    loss, stats = fn(h, w, labels, old, adv, mask, bias=b, **_kwargs(options, ref, is_weights), **extra)
    wanted = [t for t in (h, w, b) if t.requires_grad]
    grads = torch.autograd.grad(scale(loss), wanted)
    return loss, stats, grads


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("backend", BACKENDS)
def test_linear_policy_loss_matches_float64_reference(backend, case, dtype):
    """Loss, every stat and every gradient by the error rule (oracle.py) against the reference composition in
    float64 on the same rounded inputs, the loss scaled and fed to a further op before backward."""
    options, wrt = CASES[case]

    def scale(loss):  # not the last layer, and not scaled by 1
        return 3.0 * loss + loss**2

    got = _run(rk.linear_policy_loss, dtype, wrt, 0, options, scale, backend=backend)
    same = _run(reference, dtype, wrt, 0, options, scale)

    # The reference in float64 on the inputs rounded to dtype.
    want = _run(reference, torch.float64, wrt, 0, options, scale, rounded_to=dtype)

    assert_oracle(f"{backend} loss", got[0], same[0], want[0], dtype=torch.float32)
    assert set(got[1]) == set(want[1])
    for key in want[1]:
        assert_oracle(f"{backend} {key}", got[1][key], same[1][key], want[1][key], dtype=torch.float32)
    names = [n for n, r in zip(("d hidden", "d weight", "d bias"), wrt, strict=True) if r]
    for name, g, s, r in zip(names, *(x[2] for x in (got, same, want)), strict=True):
        assert g.dtype == dtype
        assert_oracle(f"{backend} {name}", g, s, r)


@pytest.mark.parametrize("backend", BACKENDS)
def test_float64_is_exact(backend):
    options, wrt = CASES["cispo+entropy+kl+is_weights, frozen head"]
    got = _run(rk.linear_policy_loss, torch.float64, (True, True, True), 1, options, backend=backend)
    want = _run(reference, torch.float64, (True, True, True), 1, options)
    torch.testing.assert_close(got[0], want[0], rtol=1e-12, atol=1e-13)
    for g, r in zip(got[2], want[2], strict=True):
        torch.testing.assert_close(g, r, rtol=1e-10, atol=1e-13)


def _gemms(fn) -> int:
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return sum(1 for e in prof.events() if e.name in ("aten::mm", "aten::addmm", "aten::addmm_"))


@pytest.mark.parametrize("backend", BACKENDS)
def test_gemm_counts(backend):
    """Trainable head: 3 GEMMs per block in the forward, none in the backward; frozen head: 2 (per block and
    vocabulary chunk, every flavor); no gradient wanted: the fused linear_logprobs forward
    only; GSPO (level="sequence"): the composition."""
    hidden, weight, bias, labels, old, adv, mask, *_ = _inputs(2)
    mask = torch.ones_like(mask)
    rows = int(((labels != -100) & mask).sum())  # masked-out and ignored tokens are dropped first
    blocks = -(-rows // 16)
    assert blocks == 2

    def count(wrt, **kw):
        h, w = hidden.float().requires_grad_(wrt[0]), weight.float().requires_grad_(wrt[1])
        out = []
        forward = _gemms(
            lambda: out.append(rk.linear_policy_loss(h, w, labels, old, adv, mask, backend=backend, **kw))
        )
        loss = out[0][0]
        backward = _gemms(lambda: loss.backward()) if loss.requires_grad else None
        return forward, backward

    if linear_sweep.sweeps(backend.device, rows, V, D, trainable_head=True):
        assert count((True, True)) == (3 * blocks, 0)
    else:  # the composition: the logits GEMM; in the backward the logits again, d hidden, d weight
        assert count((True, True)) == (1, 3)
    chunks = -(-V // 64)  # every flavor streams the frozen head's vocabulary
    assert count((True, False)) == (2 * blocks * chunks, 0)
    with torch.no_grad():
        no_grad = count((True, True))
    gspo = count((True, True), level="sequence")
    if backend.kind != "triton" or linear_blocked.used(backend.device):
        # the native kernels' vocabulary-slice GEMMs (cuBLAS on CUDA), or the Triton flavor's cuBLAS blocks
        # on a GPU: one here
        assert no_grad == (1, None) and gspo == (1, 3)
    else:  # the Triton forward has no ATen GEMM; its backward's d weight is one
        assert no_grad == (0, None) and gspo == (0, 1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_backward_runs_once_and_checks_come_first(backend):
    hidden, weight, bias, labels, old, adv, mask, *_ = _inputs(3)
    h, w = hidden.float().requires_grad_(), weight.float().requires_grad_()
    loss, _ = rk.linear_policy_loss(h, w, labels, old, adv, mask, backend=backend)
    loss.backward(retain_graph=True)
    if linear_sweep.sweeps(backend.device, int(mask.numel()), V, D, trainable_head=True):
        with pytest.raises(RuntimeError, match="runs once"):
            loss.backward()
    else:  # the composition (a trainable head on a GPU) is plain autograd: a retained graph runs again
        loss.backward()


@pytest.mark.parametrize("path", ["sweep", "composition"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_policy_options_raise_before_any_gemm(backend, path, monkeypatch):
    """On either path: the composition is what a GPU takes for a trainable head at small shapes (the
    2026-11-27 H200 run found its checks after the log-prob GEMM)."""
    if path == "composition":
        monkeypatch.setattr(linear_sweep, "sweeps", lambda *args: False)
    hidden, weight, bias, labels, old, adv, mask, *_ = _inputs(3)
    h, w = hidden.float().requires_grad_(), weight.float().requires_grad_()
    bad_options = (
        (dict(kl_coef=0.1), ValueError, "ref_logp"),
        (dict(clip_low=-1.0), ValueError, "clip_low"),
        (dict(agg="mean"), ValueError, "agg"),
        (dict(objective="dro"), ValueError, "dro_beta"),
        (dict(clip_lo=0.1), TypeError, "clip_lo"),
    )
    for bad, error, match in bad_options:
        errors = []

        def call(bad=bad, error=error, errors=errors):
            try:
                rk.linear_policy_loss(h, w, labels, old, adv, mask, backend=backend, **bad)
            except error as e:
                errors.append(str(e))

        assert _gemms(call) == 0 and errors and match in errors[0], (bad, errors)


@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_mask_gives_zero_loss_and_gradients(backend):
    hidden, weight, bias, labels, old, adv, mask, *_ = _inputs(4)
    for empty in (torch.zeros_like(mask), torch.zeros(B, T)):
        h, w = hidden.float().requires_grad_(), weight.float().requires_grad_()
        loss, stats = rk.linear_policy_loss(h, w, labels, old, adv, empty, entropy_coef=0.01, backend=backend)
        loss.backward()
        assert float(loss.detach()) == 0.0 and all(torch.isfinite(s) for s in stats.values())
        assert (h.grad == 0).all() and (w.grad == 0).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_frozen_head_linear_logprobs(backend):
    """linear_logprobs with a frozen head: d logp / d hidden from the forward, against the float64 reference
    (several blocks, bias, softcap, temperature, ignored rows, Σπ² alongside)."""
    hidden, weight, bias, labels, *_ = _inputs(5)
    labels = labels.reshape(-1)
    g = torch.randn(B * T, dtype=torch.float64, generator=torch.Generator().manual_seed(6), device="cpu")
    g = g.to(hidden.device)
    kw = dict(temperature=0.9, softcap=7.0, return_sum_pi_squared=True)

    def run(dtype, **extra):  # called in the loop below, for its dtype
        h = hidden.reshape(-1, D).to(dtype).requires_grad_()
        logp, sum_sq = rk.linear_logprobs(h, weight.to(dtype), labels, bias=bias.to(dtype), **kw, **extra)
        (grad,) = torch.autograd.grad((logp * g.to(logp.dtype)).sum(), [h])
        return logp, sum_sq, grad

    for dtype in (torch.float32, torch.bfloat16):
        got = run(dtype, backend=backend)
        same = run(dtype, backend="reference")
        h64, w64, b64 = (t.to(dtype).double() for t in (hidden, weight, bias))
        h = h64.reshape(-1, D).requires_grad_()
        logp, sum_sq = rk.linear_logprobs(h, w64, labels, bias=b64, **kw, backend="reference")
        want = (logp, sum_sq, torch.autograd.grad((logp * g).sum(), [h])[0])
        for name, o, s, r in zip(("logp", "sum_pi_squared", "d hidden"), got, same, want, strict=True):
            assert_oracle(f"{backend} {name}", o, s, r)
        assert (got[2][labels == -100] == 0).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_frozen_head_masked_bias(backend):
    """A frozen head whose bias masks tokens with -inf (docs/semantics.md, "Masked logits"): the first 64
    columns (the whole first chunk of the Triton flavor's stream here, whose rows then hold no max yet) and
    every third one, one row's label among them (logp -inf, a finite gradient). logp, Σπ² and d hidden
    against the float64 reference, with no NaN."""
    gen = torch.Generator(device="cpu").manual_seed(12)
    cpu = dict(dtype=torch.float64, generator=gen, device="cpu")
    n = 21
    hidden = torch.randn(n, D, **cpu)
    weight = torch.randn(V, D, **cpu) * (2.0 / D**0.5)
    bias = torch.randn(V, **cpu) * 0.5
    bias[:64] = -torch.inf
    bias[::3] = -torch.inf
    labels = 64 + 3 * torch.randint(0, 40, (n,), generator=gen, device="cpu") + 1
    labels[2], labels[5] = 30, -100
    g = torch.randn(n, **cpu)
    hidden, weight, bias, labels, g = (t.to(backend.device) for t in (hidden, weight, bias, labels, g))

    def run(dtype, backend):
        h = hidden.to(dtype).requires_grad_()
        logp, sum_sq = rk.linear_logprobs(
            h, weight.to(dtype), labels, bias=bias.to(dtype), temperature=0.8, return_sum_pi_squared=True,
            backend=backend,
        )  # fmt: skip
        return (
            logp,
            sum_sq,
            torch.autograd.grad((logp * g.to(logp.dtype)).where(labels != 2, 0).sum(), [h])[0],
        )

    got, same, want = (
        run(torch.float32, backend),
        run(torch.float32, "reference"),
        run(torch.float64, "reference"),
    )
    assert want[0][2] == -torch.inf and torch.isfinite(want[2]).all()
    for name, o, s, r in zip(("logp", "sum_pi_squared", "d hidden"), got, same, want, strict=True):
        assert not o.isnan().any(), f"{backend} {name}: NaN"
        assert_oracle(f"{backend} {name}", o, s, r)


@pytest.mark.parametrize("backend", BACKENDS)
def test_frozen_head_strided_inputs(backend):
    """A frozen head given as views: the head column-major (a transposed copy viewed back), the bias and
    int32 labels every other element of longer tensors, hidden a non-contiguous view. logp and d hidden
    against the float64 reference."""
    gen = torch.Generator(device="cpu").manual_seed(14)
    cpu = dict(dtype=torch.float64, generator=gen, device="cpu")
    n = 19
    hidden = torch.randn(D, n, **cpu).t()
    weight = (torch.randn(V, D, **cpu) * (2.0 / D**0.5)).t().contiguous().t()
    bias = torch.randn(2 * V, **cpu)[::2]
    labels = torch.randint(0, V, (2 * n,), generator=gen, device="cpu")[::2].int()
    labels[4] = -100
    g = torch.randn(n, **cpu)
    assert weight.stride(1) != 1 and not hidden.is_contiguous()
    hidden, weight, bias, labels, g = (t.to(backend.device) for t in (hidden, weight, bias, labels, g))

    def run(dtype, backend):
        h = hidden.to(dtype).requires_grad_()
        logp = rk.linear_logprobs(
            h, weight.to(dtype), labels, bias=bias.to(dtype), softcap=6.0, backend=backend
        )
        return logp, torch.autograd.grad((logp * g.to(logp.dtype)).sum(), [h])[0]

    got, same, want = (
        run(torch.float32, backend),
        run(torch.float32, "reference"),
        run(torch.float64, "reference"),
    )
    for name, o, s, r in zip(("logp", "d hidden"), got, same, want, strict=True):
        assert_oracle(f"{backend} {name}", o, s, r)


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b.kind == "triton"])
def test_logp_jacobian_triton_ops_opcheck(backend):
    """torch.library.opcheck on the Triton stream's two ops (ops/logp_jacobian.py): schema, fake kernel,
    the arguments they mutate and none else, with a bias, a softcap and an ignored row; and their direct
    calls in plain eager mode, which the stream makes, against the registered ops."""
    gen = torch.Generator(device="cpu").manual_seed(13)
    rows, columns, dim, vocab = 6, 40, 16, 100
    z = (3 * torch.randn(rows, columns, generator=gen, device="cpu")).to(backend.device)
    weight = torch.randn(vocab, dim, generator=gen, device="cpu").to(backend.device, torch.bfloat16)
    bias = torch.randn(vocab, generator=gen, device="cpu").to(backend.device, torch.bfloat16)
    labels = torch.randint(0, vocab, (rows,), generator=gen, device="cpu").to(backend.device)
    labels[1] = -100
    e = z.new_empty(rows, columns, dtype=torch.bfloat16)
    acc = torch.randn(rows, dim, generator=gen, device="cpu").to(backend.device)
    state = logp_jacobian._state_start(rows, torch.float32, z.device)
    options = (0.8, 7.0, -100)
    chunk_args = (z, e, acc, labels, bias, state, 20, vocab, *options)
    torch.library.opcheck(torch.ops.rlkernels.logp_jacobian_chunk_triton, chunk_args)
    out = acc.new_empty(rows, dim, dtype=torch.bfloat16)
    logp, sum_sq = acc.new_empty(rows), acc.new_empty(rows)
    finish_args = (acc, state, labels, weight, out, logp, sum_sq, *options)
    torch.library.opcheck(torch.ops.rlkernels.logp_jacobian_finish_triton, finish_args)

    # The stream calls them as their Python functions in plain eager mode (ops/_library.direct_or_op): the
    # same bits as through the dispatcher, a chunk then the finish.
    def run(chunk, finish):
        c = [a.clone() if isinstance(a, torch.Tensor) else a for a in chunk_args]
        chunk(*c)
        f = (c[2], c[5], labels, weight, out.clone(), logp.clone(), sum_sq.clone(), *options)
        finish(*f)
        return c[1], c[2], c[5], *f[4:7]

    direct = logp_jacobian.KERNELS["triton"]()
    assert not any(isinstance(x, torch._ops.OpOverloadPacket) for x in direct)
    ops = torch.ops.rlkernels
    registered = ops.logp_jacobian_chunk_triton, ops.logp_jacobian_finish_triton
    for a, b in zip(run(*direct), run(*registered), strict=True):
        assert not a.isnan().any() and torch.equal(a, b)


@pytest.mark.parametrize("out", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("backend", [b for b in BACKENDS if b.kind == "triton"])
def test_triton_logits_backward_writes_the_operand_dtype_over_the_logits(backend, out):
    """The Triton logits backward as the row sweep calls it on a GPU with a 16-bit head
    (linear_sweep._logits_ops): the fp32 gradient rounded to `out` bit for bit, as an [R, V] copy would round
    it (compiled, the kernel rounds; under the interpreter, torch), written over the fp32 logits themselves,
    each row's in its own first bytes. 1100 columns take several column blocks: the later ones are read
    after the earlier ones' gradients landed. Ignored rows: zeros."""
    gen = torch.Generator(device="cpu").manual_seed(11)
    g_logp, g_ent = torch.randn(2, 6, generator=gen, device="cpu").to(backend.device)
    for vocab in (V, 1100):
        z = (3 * torch.randn(6, vocab, generator=gen, device="cpu")).to(backend.device)
        labels = torch.randint(0, vocab, (6,), generator=gen, device="cpu").to(backend.device)
        labels[2] = -100
        _, entropy, lse, _ = torch.ops.rlkernels.logprobs_from_logits_triton(
            z, labels, 0.8, 7.0, -100, True, False
        )
        args = (g_logp, g_ent, z, labels, lse, entropy, 0.8, 7.0, -100)
        full = torch.ops.rlkernels.logprobs_from_logits_triton_backward(*args)
        over = z.clone()
        torch.ops.rlkernels.logprobs_from_logits_triton_backward_into(*args[:2], over, *args[3:], out)
        rounded = linear_sweep.logits_into_view(over, out)
        assert full.dtype == torch.float32 and rounded.dtype == out and rounded.shape == z.shape
        assert torch.equal(rounded, full.to(out)) and (rounded[2] == 0).all()
    into_args = (*args[:2], z.clone(), *args[3:], out)
    torch.library.opcheck(torch.ops.rlkernels.logprobs_from_logits_triton_backward_into, into_args)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("growth", ["steep", "gentle"])
def test_streamed_frozen_head_rescales_across_chunks(backend, growth):
    """The frozen head's vocabulary stream (ops/logp_jacobian.py; every flavor). Steep: logits
    growing chunk by chunk up to ~60 make every chunk raise the running max by a lot, so every rescale of
    the accumulated d logp / d hidden and Σπ² matters. Gentle: the max grows by less than the GPU
    kernels' lazy threshold (e^8) from chunk to chunk, so their reference stays behind the max and e exceeds
    1. Against the float64 reference by the error rule, in fp32 and (GPU flavors) bf16, with ignored rows."""
    gen = torch.Generator(device="cpu").manual_seed(11)
    cpu = dict(dtype=torch.float64, generator=gen, device="cpu")
    hidden = torch.randn(2 * 16 + 5, D, **cpu)
    top = 15.0 if growth == "steep" else 1.2
    ramp = torch.linspace(0.1, top, V, dtype=torch.float64, device="cpu")[:, None]
    weight = torch.randn(V, D, **cpu) * ramp / D**0.5
    labels = torch.randint(0, V, (hidden.shape[0],), generator=gen, device="cpu")
    labels[[3, 20]] = -100
    g = torch.randn(hidden.shape[0], **cpu)
    hidden, weight, labels, g = (t.to(backend.device) for t in (hidden, weight, labels, g))

    def run(dtype, backend):
        h = hidden.to(dtype).requires_grad_()
        logp, sum_sq = rk.linear_logprobs(
            h, weight.to(dtype), labels, return_sum_pi_squared=True, temperature=0.7, backend=backend
        )
        return logp, sum_sq, torch.autograd.grad((logp * g.to(logp.dtype)).sum(), [h])[0]

    for dtype in (torch.float32,) if backend.kind == "native-cpu" else (torch.float32, torch.bfloat16):
        rounded = hidden.to(dtype).double(), weight.to(dtype).double()
        got, same = run(dtype, backend), run(dtype, "reference")
        h64 = rounded[0].requires_grad_()
        logp, sum_sq = rk.linear_logprobs(
            h64, rounded[1], labels, return_sum_pi_squared=True, temperature=0.7, backend="reference"
        )
        want = (logp, sum_sq, torch.autograd.grad((logp * g).sum(), [h64])[0])
        if growth == "steep":
            assert want[0][labels != -100].min() < -20  # the log-probs span the range the rescaling keeps
        for name, o, s, r in zip(("logp", "sum_pi_squared", "d hidden"), got, same, want, strict=True):
            assert_oracle(f"{backend} {dtype} {name}", o, s, r)
        assert (got[2][labels == -100] == 0).all() and (got[0][labels == -100] == 0).all()


@pytest.mark.skipif("cpu" not in BACKENDS, reason="the C++ extension is not built")
def test_cpu_peak_memory_is_one_block(monkeypatch):
    """Forward + backward at N=4096, V=32000 with 4 MiB blocks allocate under 10% of N·V·4 (eager's fp32
    logits) beyond the returned gradients: no buffer grows with N·V."""
    monkeypatch.setitem(linear_sweep.BLOCK_BYTES, "cpu", 4 << 20)
    b, t, d, vocab = 4, 1024, 64, 32000
    hidden = torch.randn(b, t, d, requires_grad=True)
    weight = (torch.randn(vocab, d) / 8).requires_grad_()
    labels = torch.randint(0, vocab, (b, t))
    old, adv, mask = torch.randn(b, t) - 10, torch.randn(b), torch.ones(b, t, dtype=torch.bool)

    def step():
        loss, _ = rk.linear_policy_loss(
            hidden, weight, labels, old, adv, mask, entropy_coef=0.01, backend="cpu"
        )
        loss.backward()

    peak = cpu_peak_bytes(step) - (hidden.numel() + weight.numel()) * 4
    assert peak < 0.10 * b * t * vocab * 4, f"peak beyond the gradients {peak / 2**20:.1f} MiB"
    assert hidden.grad is not None and weight.grad is not None


@pytest.mark.parametrize("backend", BACKENDS)
def test_torch_compile_takes_the_custom_ops(backend):
    """Under torch.compile(fullgraph=True) both calls trace (the composition / fused op) and agree with
    the eager sweep."""
    backend = str(backend)
    hidden, weight, bias, labels, old, adv, mask, *_ = _inputs(7)

    def loss_fn(h, w):
        loss, _ = rk.linear_policy_loss(h, w, labels, old, adv, mask, entropy_coef=0.01, backend=backend)
        logp = rk.linear_logprobs(h, w.detach(), labels, backend=backend)
        return loss + 0.1 * logp.sum()

    compiled = torch.compile(loss_fn, fullgraph=True)
    leaves1 = [hidden.float().requires_grad_(), weight.float().requires_grad_()]
    leaves2 = [hidden.float().requires_grad_(), weight.float().requires_grad_()]
    out1, out2 = compiled(*leaves1), loss_fn(*leaves2)
    torch.testing.assert_close(out1, out2)
    for g1, g2 in zip(torch.autograd.grad(out1, leaves1), torch.autograd.grad(out2, leaves2), strict=True):
        torch.testing.assert_close(g1, g2)


@pytest.mark.skipif(linear_sweep._into_logits is None, reason="the C++ extension is not built")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=str)
def test_backward_into_logits_equals_the_out_of_place_backward(dtype):
    """The CPU op the sweep uses writes exactly logprobs_from_logits_backward's gradient over the logits
    (target column, ignored rows, softcap, entropy), and refuses a non-contiguous block."""
    gen = torch.Generator().manual_seed(8)
    z = (torch.randn(13, 301, generator=gen) * 4).to(dtype)
    labels = torch.randint(0, 301, (13,), generator=gen)
    labels[[2, 7]] = -100
    fwd = torch.ops.rlkernels.logprobs_from_logits
    bwd = torch.ops.rlkernels.logprobs_from_logits_backward
    into = torch.ops.rlkernels.logprobs_from_logits_backward_into_logits
    for softcap, entropy in ((None, False), (5.0, True)):
        _, ent, lse, _ = fwd(z, labels, 0.8, softcap, -100, entropy, False)
        g, ge = torch.randn(13, generator=gen), torch.randn(13, generator=gen) if entropy else None
        want = bwd(g, ge, z, labels, lse, ent, 0.8, softcap, -100)
        got = z.clone()
        into(g, ge, got, labels, lse, ent, 0.8, softcap, -100)
        assert torch.equal(got, want)
    with pytest.raises(RuntimeError, match="contiguous"):
        into(g, None, z.t().contiguous().t(), labels, lse, ent, 0.8, None, -100)
