"""policy_loss: every backend x dtype x objective x level x agg x options against the float64 reference,
forward (loss and stats) and gradients; hand-computed values; masking, sharding and broadcasting
properties; gradcheck in float64; strided inputs."""

import functools
import math
from unittest import mock

import pytest
import torch
from mask_forms import assert_same_bits, zero_one_masks
from oracle import DTYPES, assert_oracle, cpu_kernel_backends
from policy_inputs import check_against_oracle, loss_magnitude, make_inputs, reference_fn, run

import rlkernels as rk
from rlkernels.ops._token_masks import native_mask
from rlkernels.policy_config import OBJECTIVES, SEQUENCE_OBJECTIVES
from rlkernels.reference.aggregation import AGG_MODES
from rlkernels.reference.kl import KL_KIND_CODES
from rlkernels.triton import _common as triton_common
from rlkernels.triton import policy_loss as triton_policy_loss

BACKENDS = cpu_kernel_backends()
ALL_BACKENDS = BACKENDS + ["reference"]
# Every objective at the token level; the sequence level (GSPO) is clip-only.
OBJECTIVE_LEVELS = [(objective, "token") for objective in OBJECTIVES] + [("clip", "sequence")]
# Every option at once: asymmetric clip, KL, entropy bonus, per-token IS weights, and each objective's own
# options (the dual clip; DRO's beta; DPPO's truncation cap, below which the random ratios reach ~e^1).
FULL = dict(clip_low=0.2, clip_high=0.28, kl_coef=0.1, kl_kind="k3", entropy_coef=0.01)
OBJECTIVE_OPTIONS = {
    "clip": dict(dual_clip=3.0),
    "dro": dict(dro_beta=0.3),
    "dppo_tv": dict(ratio_cap=1.5),
    "dppo_kl": dict(ratio_cap=1.5, clip_low=0.05, clip_high=0.1),
}


def tol(backend):
    """Relative tolerance of the hand-computed float64 checks: Triton takes hyper-parameters as fp32
    scalars (docs/design.md), so its float64 results carry their ~6e-8 relative rounding."""
    return 1e-6 if backend == "triton" else 1e-12


def kernel(backend):
    return lambda **x: rk.policy_loss(**x, backend=backend)


# The aggregation is one code path after the per-row sums, whatever the objective: clip, cispo, sapo and GSPO
# run every agg mode, the later objectives two each, in turn (tests/test_verl.py runs every mode for each).
MATRIX = [
    (objective, level, agg)
    for i, (objective, level) in enumerate(OBJECTIVE_LEVELS)
    for j, agg in enumerate(AGG_MODES)
    if objective in ("clip", "cispo", "sapo") or j in (i % len(AGG_MODES), (i + 2) % len(AGG_MODES))
]


@pytest.mark.parametrize("objective,level,agg", MATRIX)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_matches_float64_reference(backend, dtype, objective, level, agg, seed):
    kw = dict(FULL, objective=objective, level=level, agg=agg, **OBJECTIVE_OPTIONS.get(objective, {}))
    inputs = make_inputs(5, 67, dtype, kw, isw="token")
    check_against_oracle(f"{backend}/{objective}/{level}/{agg}", kernel(backend), inputs, kw)


OPTION_CASES = {
    "plain": dict(),
    "ratio_cap": dict(ratio_cap=2.5, clip_high=0.28),
    "ratio_cap+dual": dict(ratio_cap=4.0, dual_clip=2.0),
    "per_token_adv": dict(dual_clip=3.0, _per_token_adv=True),
    "float_mask": dict(kl_coef=0.05, _float_mask=True),
    "row_is_weights": dict(_isw="row", entropy_coef=0.02),
    "entropy_only": dict(entropy_coef=0.05, kl_coef=0.0),
    "kl_no_clamp": dict(kl_coef=0.3, kl_clamp=None),
    "sapo_taus": dict(objective="sapo", sapo_tau_pos=0.7, sapo_tau_neg=2.0, kl_coef=0.1),
    "cispo_trl": dict(objective="cispo", clip_low=1.0, clip_high=4.0),
    "gspo_per_token_adv": dict(level="sequence", _per_token_adv=True, agg="seq-mean-token-mean"),
    "global_counts": dict(agg="token-mean", num_tokens=1000, dp_size=4),
}


@pytest.mark.parametrize("case", list(OPTION_CASES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("backend", BACKENDS)
def test_options_match_float64_reference(backend, dtype, case, seed):
    kw = dict(OPTION_CASES[case])
    data = {k[1:]: kw.pop(k) for k in list(kw) if k.startswith("_")}
    inputs = make_inputs(
        4,
        45,
        dtype,
        kw,
        per_token_adv=data.get("per_token_adv", False),
        float_mask=data.get("float_mask", False),
        isw=data.get("isw"),
    )
    check_against_oracle(f"{backend}/{case}", kernel(backend), inputs, kw)


@pytest.mark.parametrize("kl_clamp", [10.0, 1.5, None])
@pytest.mark.parametrize("kl_kind", list(KL_KIND_CODES))
@pytest.mark.parametrize("backend", BACKENDS)
def test_kl_kinds(backend, kl_kind, kl_clamp, seed):
    kw = dict(kl_coef=0.2, kl_kind=kl_kind, kl_clamp=kl_clamp, agg="seq-mean-token-sum")
    check_against_oracle(f"{backend}/{kl_kind}", kernel(backend), make_inputs(3, 41, torch.float32, kw), kw)


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_rows_longer_than_a_chunk(backend, level, seed):
    """2100-token rows: the CUDA kernels split a row into 1024-token blocks (two full, one partial) whose
    partial sums are combined per row, for the loss, the stats and GSPO's sequence log-ratio."""
    kw = dict(FULL, level=level, agg="seq-mean-token-mean")
    inputs = make_inputs(3, 2100, torch.bfloat16, kw, isw="token")
    check_against_oracle(f"{backend}/{level}/multi-chunk", kernel(backend), inputs, kw)


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("backend", [b for b in BACKENDS if b.kind == "triton"])
def test_gpu_token_tiles_under_the_interpreter(backend, level, monkeypatch, seed):
    """The tiles a GPU takes (where the interpreter takes whole rows): the forward's FORWARD_BLOCK tokens a
    program (2100-token rows: one full tile, one of 52), the backward's 1024, against the float64 oracle."""
    monkeypatch.setattr(triton_policy_loss, "triton_interpreting", lambda: False)
    assert triton_policy_loss._forward_tile(2100) == (triton_policy_loss.FORWARD_BLOCK, 8)
    assert triton_policy_loss._block(2100) == 1024
    kw = dict(FULL, level=level, agg="seq-mean-token-mean")
    inputs = make_inputs(3, 2100, torch.float32, kw, isw="token")
    check_against_oracle(f"{backend}/{level}/GPU tiles", kernel(backend), inputs, kw)


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("backend", [b for b in BACKENDS if b.kind == "triton"])
def test_persistent_forward_gives_the_tiled_forwards_answer(backend, level, monkeypatch, seed):
    """FORWARD_PROGRAMS_PER_SM: 4 programs over the 9 tiles of 3 rows of 600 tokens in 256-token tiles (each
    program takes two or three, from different rows) give the loss, the stats and the gradients of a program
    per tile bit for bit (the same partials, reduced in the same order), which
    test_gpu_token_tiles_under_the_interpreter holds to the float64 oracle."""
    monkeypatch.setattr(triton_policy_loss, "_forward_tile", lambda T: (256, 4))
    kw = dict(FULL, level=level, agg="seq-mean-token-mean")
    inputs = make_inputs(3, 600, torch.float32, kw, isw="token")
    tiled = run(kernel(backend), inputs, kw, upstream=1.5)
    grids, forward = [], triton_policy_loss._policy_forward_kernel
    launches = mock.Mock(__getitem__=lambda _, grid: grids.append(grid) or forward[grid])
    monkeypatch.setattr(triton_policy_loss, "_policy_forward_kernel", launches)
    monkeypatch.setattr(triton_policy_loss, "FORWARD_PROGRAMS_PER_SM", 4)
    # one SM, as on the CPU (an H200's 132 would give every tile its own program: the 2026-11-30 run)
    monkeypatch.setattr(triton_common, "num_sms", lambda device: 1)
    persistent = run(kernel(backend), inputs, kw, upstream=1.5)
    assert grids == [(4,)]
    for got, want in zip(persistent[2], tiled[2], strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    torch.testing.assert_close(persistent[0], tiled[0], rtol=0, atol=0)
    assert persistent[1].keys() == tiled[1].keys()
    for key in tiled[1]:
        torch.testing.assert_close(persistent[1][key], tiled[1][key], rtol=0, atol=0)


def test_kl_kind_aliases_and_ref_without_coef():
    inputs = make_inputs(3, 20, torch.float32)
    a = rk.policy_loss(**inputs, kl_coef=0.1, kl_kind="low_var_kl")
    b = rk.policy_loss(**inputs, kl_coef=0.1, kl_kind="k3")
    torch.testing.assert_close(a[0], b[0], rtol=0, atol=0)
    # ref_logp without kl_coef: the KL stat only.
    loss, stats = rk.policy_loss(**inputs)
    no_kl = dict(inputs)
    no_kl.pop("ref_logp")
    loss2, stats2 = rk.policy_loss(**no_kl)
    assert "kl" in stats and "kl" not in stats2
    torch.testing.assert_close(loss, loss2, rtol=0, atol=0)


# ---- hand-computed values (worked out from docs/semantics.md, independently of the code) ----


def _case(r, adv, logp=None, mask=None):
    """float64 inputs with old_logp = logp - log(r)."""
    r = torch.tensor(r, dtype=torch.float64)
    logp = torch.full_like(r, -1.0) if logp is None else torch.tensor(logp, dtype=torch.float64)
    mask = torch.ones_like(r, dtype=torch.bool) if mask is None else torch.tensor(mask)
    return logp, logp - r.log(), torch.tensor(adv, dtype=torch.float64), mask


def _loss_and_grad(backend, logp, old, adv, mask, **kw):
    logp = logp.clone().requires_grad_()
    loss, stats = rk.policy_loss(logp, old, adv, mask, backend=backend, **kw)
    (g,) = torch.autograd.grad(loss, logp)
    return loss.item(), {k: v.item() for k, v in stats.items()}, g


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_hand_computed_clip_dual(backend):
    # r = [[1.5, 0.5, 0.5], [5, 2, 1.1]], A = [[1, 1, -2], [-1, -1, 0.5]], clip (0.8, 1.28), dual c = 3:
    #   1.5, A=1:  max(-1.5, -1.28) = -1.28 (clipped high, no gradient)
    #   0.5, A=1:  max(-0.5, -0.8) = -0.5 (d/dlogp = -A r = -0.5)
    #   0.5, A=-2: max(1.0, 1.6) = 1.6 (clipped low), min(1.6, 6) = 1.6
    #   5,   A=-1: max(5, 1.28) = 5, min(5, 3) = 3 (dual clip, no gradient)
    #   2,   A=-1: max(2, 1.28) = 2, min(2, 3) = 2 (d/dlogp = 2)
    #   1.1, A=.5: -0.55 (d/dlogp = -0.55)
    inputs = _case([[1.5, 0.5, 0.5], [5.0, 2.0, 1.1]], [[1.0, 1.0, -2.0], [-1.0, -1.0, 0.5]])
    loss, stats, g = _loss_and_grad(backend, *inputs, clip_low=0.2, clip_high=0.28, dual_clip=3.0)
    assert loss == pytest.approx((-1.28 - 0.5 + 1.6 + 3 + 2 - 0.55) / 6, rel=tol(backend))
    want = torch.tensor([[0.0, -0.5, 0.0], [0.0, 2.0, -0.55]], dtype=torch.float64) / 6
    torch.testing.assert_close(g, want, rtol=tol(backend), atol=1e-15)
    assert stats["clipfrac"] == pytest.approx(2 / 6)
    assert stats["clipfrac_low"] == pytest.approx(1 / 6)
    assert stats["clipfrac_high"] == pytest.approx(1 / 6)
    assert stats["clipfrac_dual"] == pytest.approx(1 / 6)
    assert stats["approx_kl"] == pytest.approx(-math.log(1.5 * 0.5 * 0.5 * 5 * 2 * 1.1) / 6, rel=tol(backend))


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_hand_computed_ratio_cap(backend):
    # clip (0.8, 1.2), cap 4, token-sum:
    #   r=5, A=-1: max(min(5,4)=4, 1.2) = 4, no gradient (capped); r=2, A=-1: 2, d = 2;
    #   r=5, A=1: max(-4, -1.2) = -1.2, no gradient (clipped).
    loss, stats, g = _loss_and_grad(
        backend, *_case([[5.0, 2.0, 5.0]], [[-1.0, -1.0, 1.0]]), ratio_cap=4.0, agg="token-sum"
    )
    assert loss == pytest.approx(4 + 2 - 1.2, rel=tol(backend))
    torch.testing.assert_close(g, torch.tensor([[0.0, 2.0, 0.0]], dtype=torch.float64))
    assert stats["clipfrac"] == pytest.approx(1 / 3)


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_hand_computed_gspo(backend):
    # level="sequence", clip (0.8, 1.2):
    #   row 0: log-ratios [ln2, ln.5, ln4], mask [1, 1, 0]: mean 0, s = 1, A = 1: L = -1 per token, d = -1
    #   row 1: [ln2] x 3, s = 2, A = 1: max(-2, -1.2) = -1.2 clipped, d = 0
    #   row 2: [ln2] x 3, s = 2, A = -1: max(2, 1.2) = 2, d = -A s = 2 per token
    logp, old, adv, mask = _case(
        [[2.0, 0.5, 4.0], [2.0, 2.0, 2.0], [2.0, 2.0, 2.0]],
        [1.0, 1.0, -1.0],
        mask=[[True, True, False], [True, True, True], [True, True, True]],
    )
    rows = [-2.0, -3.6, 6.0]
    d = torch.tensor([[-1.0, -1.0, 0.0], [0.0, 0.0, 0.0], [2.0, 2.0, 2.0]], dtype=torch.float64)
    loss, stats, g = _loss_and_grad(backend, logp, old, adv, mask, level="sequence", agg="token-mean")
    assert loss == pytest.approx(sum(rows) / 8, rel=tol(backend))
    torch.testing.assert_close(g, d / 8, rtol=tol(backend), atol=1e-15)
    assert stats["clipfrac"] == pytest.approx(3 / 8)
    assert stats["clipfrac_high"] == pytest.approx(3 / 8)
    loss, _, g = _loss_and_grad(backend, logp, old, adv, mask, level="sequence", agg="seq-mean-token-mean")
    assert loss == pytest.approx((-2 / 2 - 3.6 / 3 + 6 / 3) / 3, rel=tol(backend))
    torch.testing.assert_close(g, d / torch.tensor([[2.0], [3.0], [3.0]], dtype=torch.float64) / 3)


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_hand_computed_cispo(backend):
    # clip (0.8, 1.28), token-sum: L = -clip(r)·A·logp, d/dlogp = -clip(r)·A
    #   r=1.5, A=1, logp=-.7: -1.28·1·(-.7) = .896, d = -1.28
    #   r=0.5, A=-2, logp=-1: -0.8·(-2)·(-1) = -1.6, d = 1.6
    #   r=1.1, A=.5, logp=-2: -1.1·.5·(-2) = 1.1, d = -.55
    inputs = _case([[1.5, 0.5, 1.1]], [[1.0, -2.0, 0.5]], logp=[[-0.7, -1.0, -2.0]])
    loss, stats, g = _loss_and_grad(
        backend, *inputs, objective="cispo", clip_low=0.2, clip_high=0.28, agg="token-sum"
    )
    assert loss == pytest.approx(0.896 - 1.6 + 1.1, rel=tol(backend))
    torch.testing.assert_close(g, torch.tensor([[-1.28, 1.6, -0.55]], dtype=torch.float64))
    assert (stats["clipfrac"], stats["clipfrac_low"], stats["clipfrac_high"]) == pytest.approx(
        (2 / 3, 1 / 3, 1 / 3)
    )


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_hand_computed_sapo(backend):
    # τ+ = 1, τ- = 1.05, token-sum: L = -A·σ(τ(r-1))·4/τ, d/dlogp = -A·4σ(1-σ)·r
    #   A=1, r=1:  σ = 1/2: L = -2, d = -1
    #   A=-1, r=1: L = 2/1.05, d = 1
    #   A=2, r=3:  σ = σ(2): L = -8σ(2), d = -2·4σ(2)(1-σ(2))·3
    s2 = 1 / (1 + math.exp(-2))
    loss, stats, g = _loss_and_grad(
        backend, *_case([[1.0, 1.0, 3.0]], [[1.0, -1.0, 2.0]]), objective="sapo", agg="token-sum"
    )
    assert loss == pytest.approx(-2 + 2 / 1.05 - 8 * s2, rel=tol(backend))
    want = torch.tensor([[-1.0, 1.0, -24 * s2 * (1 - s2)]], dtype=torch.float64)
    torch.testing.assert_close(g, want, rtol=tol(backend), atol=1e-15)
    assert set(stats) == {"approx_kl"}


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_hand_computed_kl_entropy_is_weights(backend):
    # r = 1, A = 1, is_weights w = [2, .5]: policy terms -w; k3 with d = ref - logp = [-1, 1]:
    # [e^-1, e - 2], d k3/d logp = 1 - e^d; entropy H = [.5, 1.5]; kl_coef .1, entropy_coef .01.
    logp = torch.tensor([[-1.0, -2.0]], dtype=torch.float64, requires_grad=True)
    ent = torch.tensor([[0.5, 1.5]], dtype=torch.float64, requires_grad=True)
    loss, stats = rk.policy_loss(
        logp,
        logp.detach(),
        torch.tensor([1.0], dtype=torch.float64),
        torch.ones(1, 2, dtype=torch.bool),
        ref_logp=torch.tensor([[-2.0, -1.0]], dtype=torch.float64),
        kl_coef=0.1,
        entropy=ent,
        entropy_coef=0.01,
        is_weights=torch.tensor([[2.0, 0.5]], dtype=torch.float64),
        backend=backend,
    )
    e = math.e
    tokens = [-2 + 0.1 / e - 0.005, -0.5 + 0.1 * (e - 2) - 0.015]
    assert loss.item() == pytest.approx(sum(tokens) / 2, rel=tol(backend))
    g_logp, g_ent = torch.autograd.grad(loss, (logp, ent))
    want = torch.tensor([[-2 + 0.1 * (1 - 1 / e), -0.5 + 0.1 * (1 - e)]], dtype=torch.float64) / 2
    torch.testing.assert_close(g_logp, want, rtol=tol(backend), atol=1e-15)
    torch.testing.assert_close(g_ent, torch.full((1, 2), -0.005, dtype=torch.float64))
    assert stats["kl"].item() == pytest.approx((1 / e + e - 2) / 2, rel=tol(backend))
    assert stats["entropy"].item() == pytest.approx(1.0)
    assert stats["approx_kl"].item() == 0.0


# ---- properties ----


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("agg", AGG_MODES)
@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_sharding_invariance(backend, agg, level, seed):
    """k shards with the global counts (as tensors: no host sync) and dp_size=k average to the whole-batch
    loss, gradients too."""
    kw = dict(level=level, agg=agg, kl_coef=0.1, entropy_coef=0.01, dual_clip=3.0, backend=backend)
    inputs = make_inputs(7, 23, torch.float64, kw, isw="token")
    m = inputs["mask"].double()
    glob = dict(num_tokens=m.sum(), num_seqs=(m.sum(-1) > 0).sum(), dp_size=3)
    whole, _, whole_grads = run(rk.policy_loss, inputs, kw, 1.0)
    losses, grads = [], []
    for part in zip(*[t.split([3, 2, 2]) for t in inputs.values()], strict=True):
        loss, _, g = run(rk.policy_loss, dict(zip(inputs, part, strict=True)), dict(kw, **glob), 1 / 3)
        losses.append(loss)
        grads.append(g)
    torch.testing.assert_close(sum(losses) / 3, whole, rtol=1e-12, atol=1e-14)
    for i, want in enumerate(whole_grads):
        torch.testing.assert_close(torch.cat([g[i] for g in grads]), want, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_zero_global_normalizers_give_zero(backend):
    """A fully masked shard whose global counts are 0 too (numbers or tensors): loss 0 and zero gradients in
    every mode, never NaN."""
    inputs = make_inputs(3, 9, torch.float32, {})
    inputs["mask"][:] = False
    zeros = (dict(num_tokens=0, num_seqs=0), dict(num_tokens=torch.tensor(0), num_seqs=torch.tensor(0.0)))
    for agg in AGG_MODES:
        for norm in zeros:
            kw = dict(agg=agg, kl_coef=0.1, entropy_coef=0.01, dp_size=2, backend=backend, **norm)
            loss, stats, (g_logp, g_ent) = run(rk.policy_loss, inputs, kw, 1.0)
            assert loss.item() == 0.0 and all(s.item() == 0.0 for s in stats.values()), (agg, norm)
            assert (g_logp == 0).all() and (g_ent == 0).all(), (agg, norm)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # NaN inputs, interpreter
@pytest.mark.parametrize("agg", AGG_MODES)
@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_fully_masked_rows_and_batch(backend, agg):
    """Masked rows get zero gradient; a fully masked batch gives a loss of 0 and zero gradients. The
    kernels ignore whatever masked positions hold (here NaN and -inf)."""
    for level in ("token", "sequence"):
        inputs = make_inputs(4, 19, torch.float32, dict(level=level))
        inputs["mask"][2] = False
        if backend != "reference":
            inputs["logp"][2, :3] = float("-inf")
            inputs["old_logp"][2, 3:6] = float("nan")
            inputs["entropy"][2, 5] = float("nan")
        kw = dict(level=level, agg=agg, kl_coef=0.1, entropy_coef=0.01, backend=backend)
        loss, stats, (g_logp, g_ent) = run(rk.policy_loss, inputs, kw, 1.0)
        assert torch.isfinite(loss) and all(torch.isfinite(s) for s in stats.values())
        assert torch.isfinite(g_logp).all() and torch.isfinite(g_ent).all()
        assert (g_logp[~inputs["mask"]] == 0).all() and (g_ent[~inputs["mask"]] == 0).all()
        inputs["mask"][:] = False
        loss, stats, (g_logp, g_ent) = run(rk.policy_loss, inputs, dict(kw, num_tokens=None), 1.0)
        assert loss.item() == 0.0 and all(s.item() == 0.0 for s in stats.values())
        assert (g_logp == 0).all() and (g_ent == 0).all()


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_row_advantages_equal_broadcast(backend, seed):
    """advantages [B] (and is_weights [B]) agree with the same values broadcast to [B, T]."""
    inputs = make_inputs(4, 33, torch.float32, isw="row")
    wide = dict(inputs)
    wide["advantages"] = inputs["advantages"][:, None].expand(4, 33)
    wide["is_weights"] = inputs["is_weights"][:, None].expand(4, 33).contiguous()
    kw = dict(dual_clip=3.0, kl_coef=0.1, entropy_coef=0.01, agg="seq-mean-token-mean", backend=backend)
    column = dict(inputs, advantages=inputs["advantages"][:, None], is_weights=inputs["is_weights"][:, None])
    a, b = run(rk.policy_loss, inputs, kw, 1.0), run(rk.policy_loss, wide, kw, 1.0)
    c = run(rk.policy_loss, column, kw, 1.0)  # [B, 1], as TRL's sequence-level tensors
    torch.testing.assert_close(a[0], b[0], rtol=0, atol=0)
    torch.testing.assert_close(a[0], c[0], rtol=0, atol=0)
    for x, y in zip(a[2], b[2], strict=True):
        torch.testing.assert_close(x, y, rtol=0, atol=0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_strided_inputs_and_scaled_loss(backend):
    """Transposed (non-contiguous) inputs and a scaled loss."""
    inputs = make_inputs(31, 6, torch.float32, per_token_adv=True, isw="token", empty_row=False)
    strided = {k: (t.t().contiguous().t() if t.dim() == 2 else t) for k, t in inputs.items()}
    assert not strided["logp"].is_contiguous()
    kw = dict(kl_coef=0.1, entropy_coef=0.01, dual_clip=3.0)
    check_against_oracle(f"{backend}/strided", kernel(backend), strided, kw, upstream=-3.5)


def verl_views(inputs: dict, pad: int = 9) -> tuple[dict, dict]:
    """(views, padded): the [B, T] inputs as verl hands them to its loss, rows at a stride other than T: logp
    and entropy sliced out of padded [B, T + pad] tensors ([:, -T - 1:-1], as verl's actor takes its
    response's log-probs from the whole sequence's), the mask an int64 attention mask's [:, -T:], ref_logp and
    per-token advantages views at another offset, per-token is_weights one row broadcast to every row (stride
    0). `padded` holds logp's and entropy's padded leaves, for their gradients."""
    B, T = inputs["logp"].shape
    views, padded = {}, {}
    for key, t in inputs.items():
        if t.dim() != 2:
            views[key] = t
            continue
        if key == "is_weights":
            views[key] = t[:1].expand(B, T)
            continue
        dtype = torch.int64 if key == "mask" else t.dtype
        wide = torch.zeros(B, T + pad, dtype=dtype)
        start = {"mask": pad, "ref_logp": 2, "advantages": 3}.get(key, pad - 1)
        wide[:, start : start + T] = t
        if key in ("logp", "entropy"):
            wide.requires_grad_()
            padded[key] = wide
        views[key] = wide[:, start : start + T]
    return views, padded


@pytest.mark.parametrize("save_grad", [True, False])
@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_rows_at_any_stride(backend, level, save_grad, monkeypatch, seed):
    """verl's inputs (verl_views: row-strided views, a broadcast row) give the float64 reference's loss,
    stats and gradients, which reach the padded tensors through the views and nothing else of them. The
    kernels read the views in place (no copy: tests/test_gpu_budgets.py counts the launches)."""
    from rlkernels.ops import policy_loss as module

    monkeypatch.setattr(module, "SAVE_GRAD_IN_FORWARD", save_grad)
    kw = dict(FULL, level=level, agg="seq-mean-token-mean", dual_clip=3.0)
    inputs = make_inputs(5, 67, torch.float32, kw, per_token_adv=True, isw="token")
    inputs["is_weights"] = inputs["is_weights"][:1].expand(5, 67).contiguous()  # the rows verl_views keeps
    views, padded = verl_views(inputs)
    assert all(views[k].stride(0) != 67 for k in ("logp", "old_logp", "mask", "entropy", "ref_logp"))
    loss, stats = rk.policy_loss(**views, **kw, backend=backend)
    wrt = [padded["logp"], padded["entropy"]]
    grads = torch.autograd.grad(loss * 1.7, wrt)
    same = run(reference_fn, inputs, kw, 1.7)
    inputs64 = {k: t.double() if t.is_floating_point() else t for k, t in inputs.items()}
    oracle = run(reference_fn, inputs64, kw, 1.7)
    name = f"{backend}/{level}/{save_grad}"
    assert_oracle(f"{name}/loss", loss, same[0], oracle[0], magnitude=loss_magnitude(inputs64, kw))
    for key in oracle[1]:
        assert_oracle(f"{name}/stats[{key}]", stats[key], same[1][key], oracle[1][key])
    for label, g, s, r in zip(("d logp", "d entropy"), grads, same[2], oracle[2], strict=True):
        start = 8
        assert_oracle(f"{name}/{label}", g[:, start : start + 67], s, r)
        assert not g[:, :start].any() and not g[:, start + 67 :].any(), label


@pytest.mark.parametrize("save_grad", [True, False])
@pytest.mark.parametrize("backend", BACKENDS)
def test_gradient_designs_agree(backend, save_grad, monkeypatch):
    """The saved-gradient backward and the recomputing backward give the same gradients."""
    from rlkernels.ops import policy_loss as module

    monkeypatch.setattr(module, "SAVE_GRAD_IN_FORWARD", save_grad)
    for level in ("token", "sequence"):
        kw = dict(FULL, level=level, agg="seq-mean-token-mean", dual_clip=3.0)
        check_against_oracle(
            f"{backend}/{save_grad}", kernel(backend), make_inputs(4, 29, torch.float32, kw), kw
        )


@pytest.mark.parametrize("backend", BACKENDS)
def test_retain_graph_and_partial_gradients(backend):
    """A second backward through a retained graph (the saved gradients were consumed in place by the first
    only when the graph is freed), and gradients of entropy alone or logp alone."""
    kw = dict(FULL, dual_clip=3.0, agg="seq-mean-token-mean")
    inputs = make_inputs(4, 37, torch.float32, kw)
    want = run(
        reference_fn, {k: t.double() if t.is_floating_point() else t for k, t in inputs.items()}, kw, 1.0
    )
    x = {k: t.clone() for k, t in inputs.items()}
    x["logp"].requires_grad_()
    x["entropy"].requires_grad_()
    loss, _ = rk.policy_loss(**x, **kw, backend=backend)
    first = torch.autograd.grad(loss, (x["logp"], x["entropy"]), retain_graph=True)
    second = torch.autograd.grad(loss, (x["logp"], x["entropy"]))
    for a, b, w in zip(first, second, want[2], strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
        torch.testing.assert_close(a.double(), w, rtol=1e-5, atol=1e-7)
    for wrt in ("logp", "entropy"):
        x = {k: t.clone() for k, t in inputs.items()}
        x[wrt].requires_grad_()
        (g,) = torch.autograd.grad(rk.policy_loss(**x, **kw, backend=backend)[0], x[wrt])
        torch.testing.assert_close(g.double(), want[2][0 if wrt == "logp" else 1], rtol=1e-5, atol=1e-7)


def test_peak_memory_of_forward_and_backward():
    """Structural: fwd+bwd (fp32, KL and entropy terms) allocates at most 2 x B x T x 4 bytes beyond the
    inputs (the two gradients), plus [B]-sized bookkeeping; the eager reference needs far more."""
    from rlkernels.memory import cpu_peak_bytes

    B, T = 16, 2048
    inputs = make_inputs(B, T, torch.float32, empty_row=False)
    kw = dict(FULL, dual_clip=3.0)

    def step(fn):
        x = {k: t.clone() for k, t in inputs.items()}
        x["logp"].requires_grad_()
        x["entropy"].requires_grad_()

        def once():
            return torch.autograd.grad(fn(**x, **kw)[0], (x["logp"], x["entropy"]))

        once()
        return cpu_peak_bytes(once)

    bound = 2 * B * T * 4
    assert step(kernel("cpu")) <= bound + 16 * 1024
    assert step(reference_fn) > 2 * bound


@pytest.mark.parametrize("backend", BACKENDS)
def test_gradcheck_float64(backend):
    """Finite differences where the gradient is the true one (not CISPO's detached ratio; GSPO's
    straight-through gradient equals the true one when A and w are per row)."""
    for kw in (
        dict(dual_clip=3.0, kl_coef=0.1, entropy_coef=0.05, clip_high=0.28),
        dict(objective="sapo", kl_coef=0.2, kl_kind="k2", agg="seq-mean-token-mean"),
        dict(level="sequence", agg="seq-mean-token-sum", entropy_coef=0.1),
    ):
        inputs = make_inputs(3, 11, torch.float64, kw)
        rest = {k: t for k, t in inputs.items() if k not in ("logp", "entropy")}

        def fn(logp, entropy):
            return rk.policy_loss(logp, entropy=entropy, **rest, **kw, backend=backend)[0]  # noqa: B023

        args = (inputs["logp"].clone().requires_grad_(), inputs["entropy"].clone().requires_grad_())
        assert torch.autograd.gradcheck(fn, args, fast_mode=True)


# Options whose stats use every flag (clip with a dual clip; dppo's truncation), and the row statistics of
# the sequence-level objectives (a pass of their own: GSPO, geo_mean).
ZERO_ONE_MASK_OPTIONS = {
    "clip+dual": dict(FULL, dual_clip=3.0),
    "dppo_tv": dict(FULL, objective="dppo_tv", ratio_cap=2.0),
    "gspo": dict(FULL, level="sequence"),
    "geo_mean": dict(FULL, objective="geo_mean", agg="seq-mean-token-mean"),
}


@pytest.mark.parametrize("option", list(ZERO_ONE_MASK_OPTIONS))
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_zero_one_mask_gives_the_same_bits_in_any_dtype(backend, option, seed):
    """A 0/1 mask as bool, int64 or float weights: the loss, every stat and both gradients agree bit for
    bit."""
    kw = ZERO_ONE_MASK_OPTIONS[option]
    inputs = make_inputs(4, 67, torch.float32, kw)
    fn = functools.partial(rk.policy_loss, backend=backend)
    masks = zero_one_masks(inputs["mask"])
    assert_same_bits({name: run(fn, dict(inputs, mask=mask), kw, -0.7) for name, mask in masks.items()})


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_mixed_dtypes_and_float_mask(backend):
    inputs = make_inputs(3, 17, torch.float32, float_mask=True)
    mixed = dict(inputs, logp=inputs["logp"].to(torch.bfloat16), advantages=inputs["advantages"].double())
    loss, stats = rk.policy_loss(**mixed, backend=backend)
    assert loss.dtype == torch.float64 and all(s.dtype == torch.float64 for s in stats.values())
    loss, _ = rk.policy_loss(**dict(inputs, logp=inputs["logp"].to(torch.bfloat16)), backend=backend)
    assert loss.dtype == torch.float32


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_empty_batch(backend):
    for shape in ((0, 5), (3, 0)):
        logp = torch.zeros(shape, requires_grad=True)
        loss, stats = rk.policy_loss(
            logp,
            torch.zeros(shape),
            torch.zeros(shape[0]),
            torch.ones(shape, dtype=torch.bool),
            backend=backend,
        )
        assert loss.item() == 0.0 and stats["approx_kl"].item() == 0.0
        loss.backward()
        assert logp.grad.shape == shape


def test_no_grad_saves_nothing():
    inputs = make_inputs(2, 8, torch.float32)
    with torch.no_grad():
        loss, _ = rk.policy_loss(**dict(inputs, logp=inputs["logp"].requires_grad_()))
    assert loss.grad_fn is None


def test_returns_no_host_sync_tensors():
    """stats are 0-dim tensors on the inputs' device (never Python floats)."""
    loss, stats = rk.policy_loss(**make_inputs(2, 8, torch.float32), entropy_coef=0.1, kl_coef=0.1)
    assert all(isinstance(s, torch.Tensor) and s.dim() == 0 for s in stats.values())
    assert set(stats) == {"clipfrac", "clipfrac_low", "clipfrac_high", "approx_kl", "kl", "entropy"}


def _probs(p, p_old, adv):
    """float64 inputs from token probabilities: logp = ln p, old_logp = ln p_old, all tokens unmasked."""
    logp = torch.tensor(p, dtype=torch.float64).log()
    old = torch.tensor(p_old, dtype=torch.float64).log()
    return logp, old, torch.tensor(adv, dtype=torch.float64), torch.ones_like(logp, dtype=torch.bool)


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_hand_computed_gpg_reinforce_dro(backend):
    # gpg, token-sum: L = -A·logp, d = -A: logp [-.5, -2], A [1, -3]: .5 - 6 = -5.5, d = [-1, 3].
    logp = torch.tensor([[-0.5, -2.0]], dtype=torch.float64)
    old = torch.tensor([[-0.1, -3.0]], dtype=torch.float64)  # unused by gpg
    adv, mask = torch.tensor([[1.0, -3.0]], dtype=torch.float64), torch.ones(1, 2, dtype=torch.bool)
    for objective in ("gpg", "reinforce"):
        loss, stats, g = _loss_and_grad(backend, logp, old, adv, mask, objective=objective, agg="token-sum")
        assert loss == pytest.approx(-5.5, rel=tol(backend))
        torch.testing.assert_close(g, torch.tensor([[-1.0, 3.0]], dtype=torch.float64))
        assert set(stats) == {"approx_kl"}
    # dro, β = .5, token-sum: L = -(A·logp - β/2·lr²), d = -A + β·lr; logp [-1, -2], lr [.4, -1], A [2, -1]:
    #   -(-2 - .25·.16) = 2.04, d = -2 + .2 = -1.8;  -(2 - .25) = -1.75, d = 1 - .5 = .5.
    logp = torch.tensor([[-1.0, -2.0]], dtype=torch.float64)
    old = torch.tensor([[-1.4, -1.0]], dtype=torch.float64)
    adv = torch.tensor([[2.0, -1.0]], dtype=torch.float64)
    loss, _, g = _loss_and_grad(backend, logp, old, adv, mask, objective="dro", dro_beta=0.5, agg="token-sum")
    assert loss == pytest.approx(2.04 - 1.75, rel=tol(backend))
    torch.testing.assert_close(g, torch.tensor([[-1.8, 0.5]], dtype=torch.float64), rtol=tol(backend), atol=0)


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_hand_computed_dppo_tv(backend):
    # δ_low = .1, δ_high = .2, truncation c = 1.5, token-sum; L = -A·min(r, c)·logp on kept tokens:
    #   p .4 -> .5, A=1:  rise .1 <= .2 kept, r = 1.25: L = -1.25 ln .5, d = -1.25
    #   p .4 -> .7, A=1:  rise .3 > .2 dropped (high)
    #   p .25 -> .2, A=-2: fall .05 <= .1 kept, r = .8: L = 1.6 ln .2, d = 1.6
    #   p .1 -> .3, A=-1: a rise, kept (A <= 0 tests falls only), r = 3 truncated to 1.5:
    #                      L = 1.5 ln .3, d = 1.5
    #   p .3 -> .1, A=-1: fall .2 > .1 dropped (low)
    inputs = _probs([[0.5, 0.7, 0.2, 0.3, 0.1]], [[0.4, 0.4, 0.25, 0.1, 0.3]], [[1.0, 1.0, -2.0, -1.0, -1.0]])
    loss, stats, g = _loss_and_grad(
        backend, *inputs, objective="dppo_tv", clip_low=0.1, clip_high=0.2, ratio_cap=1.5, agg="token-sum"
    )
    want = -1.25 * math.log(0.5) + 1.6 * math.log(0.2) + 1.5 * math.log(0.3)
    assert loss == pytest.approx(want, rel=tol(backend))
    d = torch.tensor([[-1.25, 0.0, 1.6, 1.5, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(g, d, rtol=tol(backend), atol=1e-15)
    got = [stats[k] for k in ("clipfrac", "clipfrac_low", "clipfrac_high", "clipfrac_dual")]
    assert got == pytest.approx([2 / 5, 1 / 5, 1 / 5, 1 / 5])


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_hand_computed_dppo_kl(backend):
    # δ = .1 both ways, no truncation, A = 1; the binary KL of p_old -> p:
    # p_old ln(p_old/p) + (1-p_old) ln((1-p_old)/(1-p))
    #   .4 -> .7: .4 ln(4/7) + .6 ln 2 = .192 > .1 dropped
    #   .4 -> .3: p fell while A > 0: kept whatever the KL, r = .75: L = -.75 ln .3, d = -.75
    #   .4 -> .45: .4 ln(.4/.45) + .6 ln(.6/.55) = .0051 kept, r = 1.125: L = -1.125 ln .45, d = -1.125
    inputs = _probs([[0.7, 0.3, 0.45]], [[0.4, 0.4, 0.4]], [[1.0, 1.0, 1.0]])
    loss, stats, g = _loss_and_grad(
        backend, *inputs, objective="dppo_kl", clip_low=0.1, clip_high=0.1, agg="token-sum"
    )
    assert loss == pytest.approx(-0.75 * math.log(0.3) - 1.125 * math.log(0.45), rel=tol(backend))
    torch.testing.assert_close(
        g, torch.tensor([[0.0, -0.75, -1.125]], dtype=torch.float64), rtol=tol(backend), atol=0
    )
    assert (stats["clipfrac"], stats["clipfrac_high"]) == pytest.approx((1 / 3, 1 / 3))
    assert "clipfrac_dual" not in stats


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_hand_computed_geo_mean(backend):
    # clip range [-.2, .3] in log space, seq-mean-token-mean; lr clipped toward the side A pushes it:
    #   row 0, A=1, lr [.5, -.5, .1]: min(lr, clamp(lr)) = [.3, -.5, .1], mean -1/30, R0 = e^(-1/30),
    #     row loss -R0; d/dlogp = -A·R0/3 where lr passes (not token 0, clipped above); outside: 2, A > 0
    #   row 1, A=-2, lr [.5, -.5, (masked)]: max(lr, clamp(lr)) = [.5, -.2], mean .15, R1 = e^.15,
    #     row loss 2·R1; d/dlogp = 2·R1/2 on token 0 (token 1 clipped below); outside: 2, A < 0
    r = [[math.exp(0.5), math.exp(-0.5), math.exp(0.1)], [math.exp(0.5), math.exp(-0.5), 7.0]]
    inputs = _case(r, [1.0, -2.0], mask=[[True, True, True], [True, True, False]])
    loss, stats, g = _loss_and_grad(
        backend, *inputs, objective="geo_mean", clip_low=0.2, clip_high=0.3, agg="seq-mean-token-mean"
    )
    r0, r1 = math.exp(-1 / 30), math.exp(0.15)
    assert loss == pytest.approx((-r0 + 2 * r1) / 2, rel=tol(backend))
    d = torch.tensor([[0.0, -r0 / 3, -r0 / 3], [r1, 0.0, 0.0]], dtype=torch.float64) / 2
    torch.testing.assert_close(g, d, rtol=tol(backend), atol=1e-15)
    got = [stats[k] for k in ("clipfrac", "clipfrac_low", "clipfrac_high")]
    assert got == pytest.approx([4 / 5, 2 / 5, 2 / 5])


def _vespo_phi(lw, k, lam):
    """φ(w) = e^λ · w^k · e^(-λw) at log w = lw."""
    return math.exp(lam + k * lw - lam * math.exp(lw))


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_hand_computed_vespo(backend):
    # (k, λ) = (2, 3) for A >= 0, (3, 2) for A < 0; token-sum; L = -φ·A·logp, d/dlogp = -φ·A:
    #   row 0, A=1, lr [.1, .2, (masked)], logp [-1, -2]: log w = .3, L = 3·φ+
    #   row 1, A=-.5, lr [23, -21, .5] clamped to [20, -20, .5] first: log w = .5, logp -1: L = -1.5·φ-
    #   row 2, A=1, lr [15, 15, 15]: log w = 45 clamped to 20, φ = e^(3 + 40 - 3e^20) = 0
    lr = torch.tensor([[0.1, 0.2, 0.0], [23.0, -21.0, 0.5], [15.0, 15.0, 15.0]], dtype=torch.float64)
    logp = torch.tensor([[-1.0, -2.0, -1.0], [-1.0, -1.0, -1.0], [-1.0, -1.0, -1.0]], dtype=torch.float64)
    adv = torch.tensor([1.0, -0.5, 1.0], dtype=torch.float64)
    mask = torch.tensor([[True, True, False], [True, True, True], [True, True, True]])
    loss, stats, g = _loss_and_grad(backend, logp, logp - lr, adv, mask, objective="vespo", agg="token-sum")
    p0, p1 = _vespo_phi(0.3, 2, 3), _vespo_phi(0.5, 3, 2)
    assert loss == pytest.approx(3 * p0 - 1.5 * p1, rel=tol(backend))
    d = torch.tensor([[-p0, -p0, 0.0], [0.5 * p1] * 3, [0.0] * 3], dtype=torch.float64)
    torch.testing.assert_close(g, d, rtol=tol(backend), atol=1e-15)
    assert set(stats) == {"approx_kl"}
    # Per-token IS weights fold into log w (each ln w clamped to [ln 1e-8, 20]) and do not multiply L:
    #   row 0: .3 + .2 - .1 = .4;  row 1: .5 + ln 1e-8 (from 1e-12);  row 2: still clamped.
    w = torch.tensor(
        [[math.exp(0.2), math.exp(-0.1), 5.0], [1e-12, 1.0, 1.0], [1.0] * 3], dtype=torch.float64
    )
    loss, _, g = _loss_and_grad(
        backend, logp, logp - lr, adv, mask, objective="vespo", agg="token-sum", is_weights=w
    )
    p0, p1 = _vespo_phi(0.4, 2, 3), _vespo_phi(0.5 + math.log(1e-8), 3, 2)
    assert loss == pytest.approx(3 * p0 - 1.5 * p1, rel=tol(backend))
    torch.testing.assert_close(
        g[0, :2], torch.tensor([-p0, -p0], dtype=torch.float64), rtol=tol(backend), atol=0
    )


# clip_cov takes every candidate at ratio 1 (no random choice left); kl_cov its top 10 %.
COV_CASES = {
    "clip_cov": dict(objective="clip_cov", cov_options=rk.CovOptions(ratio=1.0, lower=0.05, upper=5.0)),
    "kl_cov": dict(objective="kl_cov", cov_options=rk.CovOptions(ratio=0.1, kl_coef=0.5)),
}


@pytest.mark.parametrize("case", list(COV_CASES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("backend", BACKENDS)
def test_cov_objectives_match_float64_reference(backend, dtype, case, seed):
    kw = dict(FULL, agg="seq-mean-token-mean", **COV_CASES[case])
    inputs = make_inputs(5, 67, dtype, kw, per_token_adv=True, isw="token")
    check_against_oracle(f"{backend}/{case}", kernel(backend), inputs, kw)


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_cov_selection_counts_and_generator(backend):
    """clip_cov selects max(floor(ratio·Σm), 1) of its candidates, the same ones for the same seed;
    kl_cov the max(floor(ratio·N), 1) tokens of largest covariance."""
    x = make_inputs(6, 50, torch.float64, dict(objective="clip_cov"), per_token_adv=True)
    n = int(x["mask"].sum())
    opts = rk.CovOptions(ratio=0.1, lower=-10.0, upper=10.0)

    def call(seed, **kw):
        gen = torch.Generator().manual_seed(seed)
        return rk.policy_loss(
            x["logp"], x["old_logp"], x["advantages"], x["mask"], objective="clip_cov", cov_options=opts,
            generator=gen, backend=backend, **kw,
        )  # fmt: skip

    (a, sa), (b, _), (c, _) = call(0), call(0), call(1)
    assert sa["cov_selected"].item() * n == pytest.approx(math.floor(0.1 * n))
    assert a.item() == b.item() and a.item() != c.item()
    _, stats = rk.policy_loss(
        x["logp"], x["old_logp"], x["advantages"], x["mask"], objective="kl_cov", backend=backend,
        cov_options=rk.CovOptions(ratio=1e-6),
    )  # fmt: skip
    assert stats["cov_selected"].item() * n == pytest.approx(1.0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_cov_objectives_take_per_row_is_weights(backend, seed):
    """[B] rollout weights multiply the whole clip_cov / kl_cov term (kl_cov's penalty included)."""
    for case in COV_CASES:
        kw = dict(agg="token-mean", **COV_CASES[case])
        inputs = make_inputs(4, 33, torch.float32, kw, per_token_adv=True, isw="row")
        check_against_oracle(f"{backend}/{case}/row-weights", kernel(backend), inputs, kw)


@pytest.mark.parametrize("objective", [o for o in OBJECTIVES if o not in SEQUENCE_OBJECTIVES])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("backend", BACKENDS)
def test_token_sum_grad_matches_float64_reference(backend, dtype, objective, seed):
    """policy_loss.token_sum_grad, linear_policy_loss's d loss / d logp a row block (the forward op's saved
    gradient, no autograd node, no backward launch): the float64 reference's gradient of the token-sum loss
    over one row, with per-token advantages and IS weights, float mask weights and a KL term, at the
    accumulation dtypes the sweep passes."""
    from rlkernels._backend import select_backend
    from rlkernels.ops import policy_loss as module

    kw = dict(FULL, objective=objective, **OBJECTIVE_OPTIONS.get(objective, {}))
    del kw["entropy_coef"]  # d entropy is -entropy_coef·m: linear_policy_loss forms it without a kernel
    x = make_inputs(1, 300, dtype, kw, per_token_adv=True, float_mask=True, isw="token")
    del x["entropy"]
    x["mask"] = x["mask"].to(dtype)
    resolved = select_backend(module.OP, backend, x["logp"].device, implemented=tuple(module._FLAVORS))
    mask = x["mask"] if resolved == "triton" else native_mask(x["mask"], dtype)
    inputs = module.PolicyInputs(
        x["logp"], x["old_logp"], x["advantages"], mask, x["ref_logp"], None, x["is_weights"]
    )
    config = module.check_options(kw, True, False, x["logp"].device)
    grad = module.token_sum_grad(inputs, config, resolved)
    assert grad.shape == (1, 300) and grad.dtype == dtype

    def reference_grad(inputs):
        logp = inputs["logp"].detach().clone().requires_grad_()
        loss, _ = reference_fn(**{**inputs, "logp": logp}, agg="token-sum", **kw)
        return torch.autograd.grad(loss, [logp])[0]

    x64 = {k: t.double() for k, t in x.items()}
    assert_oracle(f"{backend}/{objective}/d logp", grad, reference_grad(x), reference_grad(x64))
