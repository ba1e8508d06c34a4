"""rollout_correction: a float64 per-row oracle written from the formulas (docs/semantics.md), verl 0.9.1's
own rollout_corr_helper and TRL 1.16's own code block (exec'd from its source, so a change there fails
here), hand-made cases, empty masks, no host sync, policy_loss(is_weights=) accepting the weights, bad
inputs. The eager path (backend "reference") and the fused pass (the C++ CPU and Triton flavors) both meet
the oracle; the peers are compared with the eager path, the spec."""

import importlib.util
import math
import pathlib
import textwrap
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch
from oracle import assert_oracle, drawn_on_cpu, kernel_flavors
from torch.utils._python_dispatch import TorchDispatchMode

import rlkernels as rk
from rlkernels.ops.rollout_correction import from_trl, from_verl

V, S = "rollout_corr/", "sampling/"
# The eager path and every flavor of the one fused pass: C++ CPU, CUDA C++ (on a GPU, or cuda-on-cpu), Triton
# (the interpreter on a CPU-only machine).
BACKENDS = ["reference"] + kernel_flavors()


def _on(backend, *tensors):
    """The test tensors on the backend's device (the GPU flavor's; CPU for the others)."""
    device = getattr(backend, "device", torch.device("cpu"))
    return tuple(t.to(device) for t in tensors)


@drawn_on_cpu
def _batch(seed, b=6, t=9, scale=0.2, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    rollout = -3 * torch.rand(b, t, dtype=torch.float64, generator=gen)
    old = rollout + scale * torch.randn(b, t, dtype=torch.float64, generator=gen)
    mask = torch.rand(b, t, generator=gen) > 0.25
    mask[0] = True
    mask[1] = False  # an empty row
    return old.to(dtype), rollout.to(dtype), mask


# ---------------------------------------------------------------------------------------------------------
# The oracle: one row at a time, in Python floats, from the formulas.


def _oracle(old, rollout, mask, level="token", mode="truncate", clip_max=2.0, clip_min=None, rejection=None,
            rejection_max=None, rejection_min=None, batch_normalize=False, log_ratio_clamp=20.0):  # fmt: skip
    old, rollout, mask = old.double().tolist(), rollout.double().tolist(), mask.bool().tolist()
    c = math.inf if log_ratio_clamp is None else log_ratio_clamp

    def clamp(x, lo, hi):
        return min(max(x, lo), hi)

    def bound(rho):
        lo = -math.inf if clip_min is None else clip_min
        hi = math.inf if clip_max is None else clip_max
        if mode == "truncate":
            return clamp(rho, lo, hi)
        return rho if lo <= rho <= hi else 0.0

    b, t = len(old), len(old[0])
    d = [[(o - r if not math.isnan(o - r) else 0.0) if m else 0.0 for o, r, m in zip(*row, strict=True)]
         for row in zip(old, rollout, mask, strict=True)]  # fmt: skip
    n = [sum(row) for row in mask]
    tokens = sum(n)
    w = [[0.0] * t for _ in range(b)]
    for i in range(b):
        s = clamp(sum(d[i]), -c, c)
        for j in range(t):
            if mask[i][j]:
                w[i][j] = bound(math.exp(clamp(d[i][j], -c, c)) if level == "token" else math.exp(s))
    valid_w = [w[i][j] for i in range(b) for j in range(t) if mask[i][j]]
    m = {
        V + "kl": -sum(map(sum, d)) / max(tokens, 1),
        V + "k3_kl": sum(math.exp(x) - x - 1 for i in range(b) for j, x in enumerate(d[i]) if mask[i][j])
        / max(tokens, 1),
        V + "log_ppl_diff": sum(-sum(d[i]) / max(n[i], 1) for i in range(b)) / b,
        S + "sampling_logp_difference/mean": sum(abs(x) for row in d for x in row) / max(tokens, 1),
        S + "sampling_logp_difference/max": max(abs(x) for row in d for x in row),
    }
    rows = [i for i in range(b) if n[i]]
    m[V + "seq_kl_k1"] = sum(-sum(d[i]) for i in rows) / max(len(rows), 1)
    sc = [clamp(sum(d[i]), -c, c) for i in rows]
    m[V + "seq_kl_k3"] = sum(math.exp(x) - x - 1 for x in sc) / max(len(rows), 1)
    m[V + "rollout_is_mean"] = sum(valid_w) / max(tokens, 1)
    if level == "sequence":
        seq_w = [w[i][[j for j in range(t) if mask[i][j]][0]] for i in rows]
        m[S + "importance_sampling_ratio/mean"] = sum(seq_w) / max(len(rows), 1)
        m[S + "importance_sampling_ratio/min"] = min(seq_w, default=0.0)
        m[S + "importance_sampling_ratio/max"] = max(seq_w, default=0.0)
    else:
        m[S + "importance_sampling_ratio/mean"] = m[V + "rollout_is_mean"]
        m[S + "importance_sampling_ratio/min"] = min(valid_w, default=0.0)
        m[S + "importance_sampling_ratio/max"] = max(valid_w, default=0.0)
    if batch_normalize:
        norm = m[V + "rollout_is_mean"] if level == "token" else m[S + "importance_sampling_ratio/mean"]
        if norm > 1e-8:
            w = [[x / norm for x in row] for row in w]
    keep = [[True] * t for _ in range(b)]
    if rejection is not None:
        agg, kind = rejection.rsplit("_", 1)
        stat = [[{"k1": -x, "k2": 0.5 * x * x, "k3": math.exp(x) - 1 - x}[kind] for x in
                 (clamp(y, -c, c) for y in row)] for row in d]  # fmt: skip

        def ok(x):
            if kind != "k1":
                return x <= rejection_max
            low = 1 / rejection_max if rejection_min is None else rejection_min
            return math.log(low) <= x <= math.log(rejection_max)

        for i in range(b):
            vals = [stat[i][j] for j in range(t) if mask[i][j]]
            if agg == "token":
                keep[i] = [ok(x) for x in stat[i]]
            else:
                v = {"seq_sum": sum(vals), "seq_mean": sum(vals) / max(len(vals), 1),
                     "seq_max": max(vals, default=0.0)}[agg]  # fmt: skip
                keep[i] = [ok(v)] * t
        rejected = sum(mask[i][j] and not keep[i][j] for i in range(b) for j in range(t))
        m[V + "rollout_rs_masked_fraction"] = rejected / max(tokens, 1)
        m[V + "rollout_rs_seq_masked_fraction"] = (
            sum(any(mask[i][j] and not keep[i][j] for j in range(t)) for i in range(b)) / b
        )
    new_mask = [[mask[i][j] and keep[i][j] for j in range(t)] for i in range(b)]
    return torch.tensor(w, dtype=torch.float64), torch.tensor(new_mask), m


CONFIGS = [
    dict(),
    dict(level="sequence"),
    dict(mode="mask", clip_min=0.8, clip_max=1.25),  # IcePop
    dict(level="sequence", mode="mask", clip_max=1.5),  # MIS, open below
    dict(mode="truncate", clip_min=0.9, clip_max=1.1),  # TRL's two-sided truncation
    dict(batch_normalize=True, clip_max=1.1),
    dict(level="sequence", batch_normalize=True, clip_max=1.3),
    dict(level="sequence", clip_max=1e12, log_ratio_clamp=None),  # TRL: unclamped
    dict(rejection="token_k1", rejection_max=1.2),
    dict(rejection="seq_mean_k1", rejection_min=0.97, rejection_max=1.04),  # Geo-RS
    dict(rejection="seq_sum_k1", rejection_max=1.5, level="sequence"),  # Seq-MIS
    dict(rejection="seq_mean_k3", rejection_max=0.02),
    dict(rejection="seq_max_k2", rejection_max=0.05),
    dict(rejection="token_k2", rejection_max=0.01),  # near the median k2 of _batch(1): each factor counts
    dict(rejection="token_k3", rejection_max=0.02, level=None),
    dict(log_ratio_clamp=1000.0, rejection="token_k3", rejection_max=0.02),  # e^1000 overflows a float
]


def _check_against_oracle(out, want_w, want_mask, want_m, mask, level, exact):
    tol = dict(rtol=1e-12, atol=1e-14) if exact else None
    if level is None:
        assert out.weights is None
    else:
        got_w = out.weights if level == "token" else out.weights * mask
        assert got_w.shape == want_w.shape
        if exact:
            torch.testing.assert_close(got_w.double(), want_w, **tol)
        else:
            assert_oracle("weights", got_w, None, want_w)
    assert torch.equal(out.mask.bool(), want_mask)
    for key, want in want_m.items():
        if key.startswith(V + "rollout_is") or key.startswith(S + "importance"):
            if level is None:
                assert key not in out.metrics
                continue
        got = out.metrics[key]
        assert got.dim() == 0
        if exact:
            assert got.item() == pytest.approx(want, rel=1e-12, abs=1e-14), key
        else:
            assert_oracle(key, got, None, torch.tensor(want, dtype=torch.float64))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "options", CONFIGS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "tis"
)
def test_against_the_oracle_float64(options, backend):
    old, rollout, mask = _on(backend, *_batch(1))
    out = rk.rollout_correction(old, rollout, mask, **options, backend=backend)
    want = _oracle(old, rollout, mask, **options)
    _check_against_oracle(out, *want, mask, options.get("level", "token"), exact=True)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    "options", [dict(), dict(level="sequence", mode="mask", clip_min=0.5)], ids=["tis", "mis"]
)
def test_low_precision_inputs_against_the_float64_oracle(dtype, options, backend):
    """16-bit and fp32 log-probs: the weights and metrics (fp32) are within fp32 rounding of the float64
    oracle on the same rounded inputs (the error rule with no reference excuse)."""
    old, rollout, mask = _on(backend, *_batch(2, b=8, t=33, dtype=dtype))
    out = rk.rollout_correction(old, rollout, mask, **options, backend=backend)
    assert out.weights.dtype == torch.float32
    want = _oracle(old, rollout, mask, **options)
    _check_against_oracle(out, *want, mask, options.get("level", "token"), exact=False)


# ---------------------------------------------------------------------------------------------------------
# verl 0.9.1's own functions.

VERL_CASES = [
    dict(rollout_is="token", rollout_is_threshold=2.0),
    dict(rollout_is="token", rollout_is_threshold=1.1),
    dict(rollout_is="sequence", rollout_is_threshold=1.3),
    dict(rollout_is="token", rollout_is_threshold="0.8_1.25"),  # IcePop
    dict(rollout_is="sequence", rollout_is_threshold="0.7_1.4"),
    dict(rollout_is="token", rollout_is_threshold=1.2, rollout_is_batch_normalize=True),
    dict(rollout_is="sequence", rollout_is_threshold=1.2, rollout_is_batch_normalize=True),
    dict(
        rollout_is="sequence",
        rollout_is_threshold=2.0,
        rollout_rs="seq_sum_k1",
        rollout_rs_threshold="0.5_2.0",
    ),
    dict(rollout_is=None, rollout_rs="seq_mean_k1", rollout_rs_threshold="0.97_1.03"),
    dict(rollout_is=None, rollout_rs="seq_mean_k3", rollout_rs_threshold=0.003),
    dict(rollout_is="token", rollout_rs="token_k1", rollout_rs_threshold=1.2),
    dict(rollout_is="token", rollout_rs="token_k2", rollout_rs_threshold=0.02),
    dict(rollout_is="token", rollout_rs="token_k3", rollout_rs_threshold=0.02),
    dict(rollout_is="token", rollout_rs="seq_sum_k2", rollout_rs_threshold=0.03),
    dict(rollout_is="token", rollout_rs="seq_sum_k3", rollout_rs_threshold=0.03),
    dict(rollout_is="token", rollout_rs="seq_mean_k2", rollout_rs_threshold=0.003),
    dict(rollout_is="token", rollout_rs="seq_max_k2", rollout_rs_threshold=0.01),
    dict(rollout_is="token", rollout_rs="seq_max_k3", rollout_rs_threshold=0.01),
]


@pytest.mark.parametrize("case", VERL_CASES, ids=lambda c: "-".join(str(v) for v in c.values()))
def test_matches_verl(case):
    """verl's compute_rollout_correction_and_rejection_mask on the same float64 batch: the weights, the
    rejection mask and every metric both report. verl's masked means divide by count + 1e-8 (ours by the
    count) and it compares sequence log-ratios with a float32 log of the threshold: rtol 1e-7."""
    helper = pytest.importorskip("verl.trainer.ppo.rollout_corr_helper")
    old, rollout, mask = _batch(3, b=7, t=13, scale=0.08)
    maskf = mask.double()
    proto, verl_mask, verl_metrics = helper.compute_rollout_correction_and_rejection_mask(
        old, rollout, maskf, **case
    )
    out = rk.rollout_correction(old, rollout, maskf, **from_verl(**case))
    if case.get("rollout_is") is None:
        assert proto is None and out.weights is None
    else:
        verl_w = proto.batch["rollout_is_weights"]
        ours = out.weights if out.weights.shape == verl_w.shape else out.weights * maskf
        torch.testing.assert_close(ours, verl_w, rtol=1e-7, atol=1e-12)
    assert out.mask.dtype == maskf.dtype
    torch.testing.assert_close(out.mask, verl_mask, rtol=0, atol=0)
    shared = [k for k in out.metrics if k in verl_metrics]
    assert {V + "kl", V + "k3_kl", V + "log_ppl_diff"} <= set(shared)
    if case.get("rollout_is") is not None:
        assert {V + "rollout_is_mean", V + "rollout_is_ratio_fraction_high"} <= set(shared)
    if case.get("rollout_rs") is not None:
        assert {V + "rollout_rs_masked_fraction", V + "rollout_rs_seq_masked_fraction"} <= set(shared)
        assert 0 < out.metrics[V + "rollout_rs_masked_fraction"] < 1  # the case rejects some, not all
    for key in shared:
        assert out.metrics[key].item() == pytest.approx(verl_metrics[key], rel=1e-7, abs=1e-12), key


# ---------------------------------------------------------------------------------------------------------
# TRL 1.16's own code: the importance-sampling block and its metrics block of
# GRPOTrainer._generate_and_score_completions, cut from the installed source and run as they are.


def _trl_block(start: str, end: str) -> str:
    spec = importlib.util.find_spec("trl")
    if spec is None:
        pytest.skip("trl is not installed")
    text = (pathlib.Path(spec.submodule_search_locations[0]) / "trainer" / "grpo_trainer.py").read_text()
    i = text.index(start)
    i = text.rindex("\n", 0, i) + 1
    j = text.index(end, i)
    j = text.rindex("\n", 0, j) + 1
    return textwrap.dedent(text[i:j])


def _run_trl(old, rollout, mask, mode, clip_max, clip_min):
    trainer = SimpleNamespace(
        use_vllm=True, vllm_importance_sampling_correction=True, vllm_importance_sampling_mode=mode,
        vllm_importance_sampling_clip_max=clip_max, vllm_importance_sampling_clip_min=clip_min,
        accelerator=SimpleNamespace(gather=lambda x: x.reshape(1)),
        _metrics=defaultdict(lambda: defaultdict(list)),
    )  # fmt: skip
    scope = dict(
        self=trainer, torch=torch, math=math, completion_mask=mask.long(), tool_mask=None,
        old_per_token_logps=old, sampling_per_token_logps=rollout, mode="train", device=old.device,
        nanmin=lambda x: x[~x.isnan()].min(), nanmax=lambda x: x[~x.isnan()].max(),
    )  # fmt: skip
    exec(_trl_block("# Compute the importance sampling ratio when using vLLM", "# Compute the per-token log "
                    "probabilities for the reference model"), scope)  # fmt: skip
    exec(_trl_block("delta = torch.abs(old_per_token_logps - sampling_per_token_logps)", "output = {"), scope)
    return scope["vllm_importance_sampling_ratio"], {k: v[0] for k, v in trainer._metrics["train"].items()}


@pytest.mark.parametrize("mode", ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"])
@pytest.mark.parametrize("bounds", [(3.0, None), (1.1, 0.9), (None, 0.95)], ids=["max", "both", "min"])
def test_matches_trl(mode, bounds):
    clip_max, clip_min = bounds
    if clip_max is None and mode.endswith("truncate"):
        clip_max = 1e30  # TRL clamps with max=None as well; keep both sides explicit
    old, rollout, mask = _batch(4, b=7, t=13, scale=0.05)
    mask[1] = True  # TRL's sequence metrics count every row: no empty row here
    ratio, metrics = _run_trl(old, rollout, mask, mode, clip_max, clip_min)
    out = rk.rollout_correction(old, rollout, mask, **from_trl(mode, clip_max, clip_min))
    if mode.startswith("token"):
        torch.testing.assert_close(out.weights[mask], ratio[mask], rtol=1e-12, atol=0)
    else:
        torch.testing.assert_close(out.weights, ratio, rtol=1e-12, atol=0)
    assert metrics  # the block ran and logged
    for key, want in metrics.items():
        assert out.metrics[key].item() == pytest.approx(want, rel=1e-12, abs=1e-15), key


def test_trl_nan_sampling_logprob_counts_as_ratio_one():
    """TRL zeroes a NaN log-ratio (a token vLLM could not score): ratio 1, as here."""
    old, rollout, mask = _batch(5, b=4, t=6)
    mask[:] = True
    rollout[0, 2] = math.nan
    for mode in ("token_truncate", "sequence_mask"):
        ratio, _ = _run_trl(old, rollout, mask, mode, 5.0, None)
        out = rk.rollout_correction(old, rollout, mask, **from_trl(mode, 5.0, None))
        torch.testing.assert_close(out.weights, ratio, rtol=1e-12, atol=0)
    assert out.weights.isfinite().all()


# ---------------------------------------------------------------------------------------------------------
# Hand-made cases.


def test_hand_computed_token_weights():
    """Ratios 3, 0.6, 1, 2 and one padding token (rollout log-probs 0, so d is the log of each ratio)."""
    d = torch.tensor([[math.log(3), math.log(0.6), 0.0, math.log(2.0), 5.0]], dtype=torch.float64)
    rollout = torch.zeros_like(d)
    mask = torch.tensor([[True, True, True, True, False]])
    tis = rk.rollout_correction(d, rollout, mask, clip_max=2.5)
    torch.testing.assert_close(tis.weights, torch.tensor([[2.5, 0.6, 1.0, 2.0, 0.0]], dtype=torch.float64))
    assert tis.metrics[V + "rollout_is_ratio_fraction_high"].item() == pytest.approx(0.25)  # only 3 > 2.5
    assert tis.metrics[V + "rollout_is_ratio_fraction_low"].item() == 0.0  # 0.6 is not < 1/2.5
    assert tis.metrics[V + "rollout_is_mean"].item() == pytest.approx((2.5 + 0.6 + 1 + 2) / 4)
    icepop = rk.rollout_correction(d, rollout, mask, mode="mask", clip_min=0.7, clip_max=2.5)
    torch.testing.assert_close(icepop.weights, torch.tensor([[0.0, 0.0, 1.0, 2.0, 0.0]], dtype=torch.float64))
    assert icepop.metrics[V + "rollout_is_oob_ratio"].item() == pytest.approx(0.5)
    assert icepop.metrics[S + "importance_sampling_ratio/min"].item() == 0.0
    # Sequence level: Σd = ln(3 · 0.6 · 2) = ln 3.6 -> ratio 3.6.
    seq = rk.rollout_correction(d, rollout, mask, level="sequence", clip_max=10.0)
    torch.testing.assert_close(seq.weights, torch.tensor([[3.6]], dtype=torch.float64))
    assert seq.metrics[V + "seq_kl_k1"].item() == pytest.approx(-math.log(3.6))
    assert seq.metrics[V + "seq_kl_k3"].item() == pytest.approx(3.6 - math.log(3.6) - 1)


def test_hand_computed_rejection():
    """Geo-RS keeps a row whose mean log-ratio stays within the ratio bounds and drops the other."""
    rollout = torch.full((2, 3), -1.0, dtype=torch.float64)
    d = torch.tensor([[0.01, -0.01, 0.0], [0.3, 0.2, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])  # an integer attention mask: returned as integers
    out = rk.rollout_correction(
        rollout + d, rollout, mask, level=None, rejection="seq_mean_k1", rejection_max=1.1
    )
    assert out.mask.dtype == torch.int64
    assert out.mask.tolist() == [[1, 1, 1], [0, 0, 0]]  # -mean d = -0.25 < log(1/1.1)
    assert out.metrics[V + "rollout_rs_masked_fraction"].item() == pytest.approx(2 / 5)
    assert out.metrics[V + "rollout_rs_seq_masked_fraction"].item() == pytest.approx(0.5)
    assert out.weights is None


@pytest.mark.parametrize("backend", BACKENDS)
def test_float_mask_keeps_its_weights(backend):
    """A float mask comes back in its dtype with the rejected tokens at 0 and the kept ones at their weight:
    token_k2 rejects d²/2 > 1e-3, here the tokens of |d| = 0.5 (two of weight > 0, one of weight 0)."""
    rollout = torch.full((3, 4), -1.0, dtype=torch.float64)
    d = torch.tensor([[0.0, 0.5, 0.0, 0.01], [0.5, 0.0, 0.5, -0.02], [0.01] * 4], dtype=torch.float64)
    mask = torch.tensor([[0.5, 1.0, 0.0, 2.0]] * 3, dtype=torch.float64)
    old, rollout, mask = _on(backend, rollout + d, rollout, mask)
    out = rk.rollout_correction(old, rollout, mask, rejection="token_k2", rejection_max=1e-3, backend=backend)
    assert out.mask.dtype == torch.float64
    want = [[0.5, 0.0, 0.0, 2.0], [0.0, 1.0, 0.0, 2.0], [0.5, 1.0, 0.0, 2.0]]
    assert out.mask.cpu().tolist() == want
    assert (out.weights[:, 2] == 0).all()  # a zero mask weight: no token, weight 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_padding_garbage_does_not_leak(backend):
    """NaN / inf log-probs on padding change nothing."""
    old, rollout, mask = _on(backend, *_batch(7))
    options = dict(level="sequence", rejection="seq_max_k3", rejection_max=0.1, backend=backend)
    clean = rk.rollout_correction(old, rollout, mask, **options)
    old2, rollout2 = old.clone(), rollout.clone()
    old2[~mask] = math.nan
    rollout2[~mask] = -math.inf
    dirty = rk.rollout_correction(old2, rollout2, mask, **options)
    torch.testing.assert_close(dirty.weights, clean.weights)
    assert torch.equal(dirty.mask, clean.mask)
    for k in clean.metrics:
        torch.testing.assert_close(dirty.metrics[k], clean.metrics[k])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_empty_mask_gives_zeros_never_nan(level, backend):
    old, rollout, _ = _on(backend, *_batch(8))
    mask = torch.zeros_like(old, dtype=torch.bool)
    options = dict(level=level, batch_normalize=True, rejection="seq_mean_k3", rejection_max=0.01)
    out = rk.rollout_correction(old, rollout, mask, **options, backend=backend)
    assert not out.weights.isnan().any() and (out.weights == 0).all()
    for key, value in out.metrics.items():
        assert torch.isfinite(value), key
    for shape in [(0, 5), (3, 0)]:  # no rows, no tokens
        (e,) = _on(backend, torch.zeros(shape))
        out = rk.rollout_correction(
            e, e, e.bool(), level=level, rejection="seq_sum_k1", rejection_max=2.0, backend=backend
        )
        assert all(torch.isfinite(v) for v in out.metrics.values())


@pytest.mark.parametrize("backend", BACKENDS[1:])
@pytest.mark.parametrize(
    "options", CONFIGS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "tis"
)
def test_fused_rows_of_several_blocks(options, backend):
    """Rows of 2500 tokens (3 of the kernel's blocks), NaN differences, a strided input and a float mask:
    the fused pass against the oracle."""
    old, rollout, mask = _batch(11, b=5, t=2500, scale=0.05)
    old[2, 7], rollout[2, 7] = -math.inf, -math.inf  # a token neither could score: ratio 1
    weights = mask.double() * 0.5
    strided = old.t().contiguous().t()
    old, strided, rollout, weights = _on(backend, old, strided, rollout, weights)
    out = rk.rollout_correction(strided, rollout, weights, **options, backend=backend)
    want = _oracle(old, rollout, weights, **options)
    _check_against_oracle(out, *want, weights != 0, options.get("level", "token"), exact=True)


@pytest.mark.parametrize("backend", BACKENDS[1:])
def test_fused_op_opcheck(backend):
    """The fused op (schema, fake, no aliasing, under torch.compile's tracing), at both levels and without
    weights, with each rejection aggregation and batch normalization."""
    old, rollout, mask = _on(backend, *_batch(12))
    ops = torch.ops.rlkernels
    op = ops.rollout_correction_triton if backend.kind == "triton" else ops.rollout_correction
    log2 = math.log(2.0)
    for args in [
        (old, rollout, mask, 1, False, 20.0, 0.0, 2.0, 0.5, "token_k1", -0.5, 0.5, True, log2, -log2),
        (old.float(), rollout.float(), mask.long(), 2, True, math.inf, 0.5, 2.0, 0.5, "seq_max_k3", -math.inf,
         0.1, True, log2, -log2),
        (old, rollout, mask.double(), 1, True, 20.0, 0.8, 1.25, 0.8, None, -math.inf, math.inf, False,
         math.log(1.25), math.log(0.8)),
        (old, rollout, mask, 0, False, 20.0, 0.0, math.inf, 0.0, "seq_mean_k2", -math.inf, 0.5, False,
         math.inf, -math.inf),
    ]:  # fmt: skip
        torch.library.opcheck(op, args)


@pytest.mark.fires_device_asserts
@pytest.mark.parametrize("backend", BACKENDS[1:])
def test_the_kernels_check_the_mask(backend):
    """The fused op flags a mask value the op rejects (an integer other than 0 and 1, a negative or
    non-finite weight) into its fourth output; on CPU tensors the public function then raises the eager
    check's ValueError naming it."""
    old, rollout, mask = _on(backend, *_batch(13))
    ops = torch.ops.rlkernels
    op = ops.rollout_correction_triton if backend.kind == "triton" else ops.rollout_correction
    options = (1, False, 20.0, 0.0, 2.0, 0.5, "seq_sum_k1", -0.5, 0.5, True, math.log(2.0), -math.log(2.0))
    assert bool(op(old, rollout, mask.long(), *options)[3])
    two = mask.long()
    two[0, 2] = 2
    negative = mask.double()
    negative[3, 1] = -1.0
    for bad, message in ((two, "must hold only 0 and 1"), (negative, "mask weights must be finite and >= 0")):
        assert not bool(op(old, rollout, bad, *options)[3])
        if backend.device.type == "cpu":
            with pytest.raises(ValueError, match=message):
                rk.rollout_correction(old, rollout, bad, backend=backend)


class _NoSync(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        assert func is not torch.ops.aten._local_scalar_dense.default, "host sync (.item(), bool(tensor))"
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("options", CONFIGS[:2] + CONFIGS[5:7] + CONFIGS[8:10])
def test_no_host_sync(options, backend, monkeypatch):
    """The op never reads a tensor value back (.item(), bool(), int()) on the path GPU tensors take (the
    mask's flag asserted on the device; on CPU tensors it is read, for the eager check's message); with such
    a read it would stall a GPU stream."""
    from rlkernels import _validate

    monkeypatch.setattr(_validate, "checks_eagerly", lambda x: False)
    old, rollout, mask = _on(backend, *_batch(9))
    with _NoSync():
        rk.rollout_correction(old, rollout, mask, **options, backend=backend)


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_weights_feed_policy_loss(level):
    old, rollout, mask = _batch(10)
    out = rk.rollout_correction(old, rollout, mask, level=level, clip_max=1.2)
    logp = old.clone().requires_grad_()
    adv = torch.randn(old.shape[0], dtype=torch.float64)
    loss, _ = rk.policy_loss(logp, old, adv, mask, is_weights=out.weights, backend="reference")
    plain, _ = rk.policy_loss(logp, old, adv, mask, backend="reference")
    w = out.weights.expand_as(old)
    # At logp = old the clipped surrogate is -A per token: the weighted token mean of -A.
    want = -(adv[:, None] * w * mask).sum() / mask.sum()
    torch.testing.assert_close(loss, want)
    assert not torch.equal(loss, plain)


# ---------------------------------------------------------------------------------------------------------
# Bad inputs.

_rc = rk.rollout_correction
_G = torch.zeros(2, 3)
_M = torch.ones(2, 3, dtype=torch.bool)


@pytest.mark.parametrize(
    "call,error,match",
    [
        (lambda: _rc([1.0], _G, _M), TypeError, "logp_old must be a torch.Tensor"),
        (lambda: _rc(_G.long(), _G, _M), TypeError, "logp_old must be float"),
        (lambda: _rc(_G[0], _G[0], _M[0]), ValueError, "logp_old must be 2-D"),
        (lambda: _rc(_G, _G[:1], _M), ValueError, "logp_rollout has shape"),
        (lambda: _rc(_G, _G, _M[:, :2]), ValueError, "mask has shape"),
        (lambda: _rc(_G, _G, _M.long() * 2), ValueError, "mask of dtype torch.int64 must hold"),
        (lambda: _rc(_G, _G, -_M.double()), ValueError, "mask weights must be finite and >= 0"),
        (lambda: _rc(_G, _G, _M, level="seq"), ValueError, "level must be one of"),
        (lambda: _rc(_G, _G, _M, mode="clip"), ValueError, "mode must be one of"),
        (lambda: _rc(_G, _G, _M, clip_max=0.0), ValueError, "clip_max must be > 0"),
        (lambda: _rc(_G, _G, _M, clip_max="2"), TypeError, "clip_max must be a number"),
        (lambda: _rc(_G, _G, _M, clip_max=None), ValueError, "give clip_max or clip_min"),
        (lambda: _rc(_G, _G, _M, clip_min=3.0), ValueError, "clip_min .* must be <= clip_max"),
        (lambda: _rc(_G, _G, _M, rejection="seq_max_k1", rejection_max=2.0), ValueError,
         "rejection must be one of"),
        (lambda: _rc(_G, _G, _M, rejection="token_k1"), ValueError, "needs rejection_max"),
        (lambda: _rc(_G, _G, _M, rejection="token_k2", rejection_max=1.0, rejection_min=0.5),
         ValueError, "rejection_min applies to the k1"),
        (lambda: _rc(_G, _G, _M, rejection_max=1.0), ValueError, "need rejection="),
        (lambda: _rc(_G, _G, _M, batch_normalize=1), TypeError, "batch_normalize must be a bool"),
        (lambda: _rc(_G, _G, _M, log_ratio_clamp=math.inf), ValueError, "log_ratio_clamp"),
        (lambda: _rc(_G, _G, _M, backend="cuda"), rk.BackendUnavailableError, "'cuda' is unavailable"),
        (lambda: _rc(_G, _G, _M, "token"), TypeError, "keyword-only"),
        (lambda: from_verl(rollout_is="token", rollout_rs="token_k1,seq_mean_k3", rollout_rs_threshold=2.0),
         ValueError, "one rollout_rs option"),
        (lambda: from_trl("token"), ValueError, "mode must be one of"),
    ],
)  # fmt: skip
def test_bad_inputs(call, error, match):
    with pytest.raises(error, match=match):
        call()
