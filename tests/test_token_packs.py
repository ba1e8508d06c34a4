"""The CUDA C++ token kernels' two load paths (csrc/cuda/token_packs.cuh): rows whose every input starts on a
pack boundary take 16-byte packs (V tokens a load), any other rows a token a load. On the cuda-on-cpu
harness, each layout must launch the path it qualifies for (the harness records the kernels a launcher
chose, as its launch site spells them) and give the float64 reference's answer, forward and gradient.
(policy_loss's fp64 kernels take a token a load on every layout: its kVec<double> is 1.)"""

from __future__ import annotations

import pytest
import torch
from cuda_on_cpu import build, flavor
from oracle import assert_oracle
from policy_inputs import loss_magnitude, reference_fn
from policy_inputs import make_inputs as policy_inputs
from policy_inputs import run as policy_run
from test_value_loss import make_inputs as value_inputs

import rlkernels as rk
from rlkernels.reference.aggregation import agg_loss as agg_reference
from rlkernels.reference.value_loss import value_loss as value_reference

pytestmark = pytest.mark.skipif(
    not build.platform_supported() or torch.cuda.is_available(),
    reason="the harness runs on Linux without a GPU",
)

B = 5
# (layout, T, packed): how the [B, T] inputs lie, and whether their rows take packs (T a multiple of 4: every
# pack size of fp32 / bf16 / fp64 divides it).
LAYOUTS = [
    ("contiguous", 64, True),
    ("rows of a wider tensor, on pack boundaries", 64, True),  # [:, 4:-4] of [B, T + 8]: stride T + 8
    ("odd length", 67, False),
    ("sliced out of padded rows", 64, False),  # [:, 3:-1] of [B, T + 4]: each row 12 bytes off
]


def _lay(x: torch.Tensor, layout: str) -> torch.Tensor:
    """x [B, T] laid out as `layout` says, with its values (a view where the layout is one)."""
    b, t = x.shape
    if layout in ("contiguous", "odd length"):
        return x.clone()
    before, after = (4, 4) if layout.startswith("rows of a wider") else (3, 1)
    wide = torch.zeros(b, t + before + after, dtype=x.dtype)
    wide[:, before : before + t] = x
    return wide[:, before : before + t]


def _launched() -> list[str]:
    return list(torch.ops.rlkernels_sim_stats.launched())


def _check_path(label: str, names: list[str], kernels: tuple[str, ...], packed: bool, launched=None) -> None:
    """Every launch of `kernels` took the packed path (its V the kTokenPack or kVec template argument) or
    V = 1, and each of `launched` (default: all of `kernels`) ran."""
    mine = [n for n in names if n.split("<")[0] in kernels]
    assert {n.split("<")[0] for n in mine} >= set(kernels if launched is None else launched), (
        f"{label}: {names}"
    )
    want = ("kTokenPack", "kVec") if packed else (", 1>",)
    assert all(any(w in n for w in want) for n in mine), f"{label}: packed={packed}, launched {mine}"


def _mask(t: int, kind: str) -> torch.Tensor:
    gen = torch.Generator().manual_seed(t)
    keep = torch.rand(B, t, generator=gen) > 0.25
    keep[1] = False
    return {"bool": keep, "int": keep.to(torch.int64), "float": keep * torch.rand(B, t, generator=gen) * 2}[
        kind
    ]


@pytest.mark.parametrize("mask_kind", ["bool", "int", "float"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("layout,t,packed", LAYOUTS, ids=[x[0] for x in LAYOUTS])
def test_value_loss_paths(layout, t, packed, dtype, mask_kind):
    inputs = value_inputs(B, t, dtype, 0.2, float_mask=mask_kind == "float")  # values away from the kinks
    if mask_kind == "int":
        inputs["mask"] = inputs["mask"].to(torch.int64)
    agg = "seq-mean-token-mean"

    def run(fn, x, lay):
        x = {k: (_lay(v, layout) if lay else v) for k, v in x.items()}
        leaf = x["values"].detach().requires_grad_()
        loss, stats = fn(leaf, x["old_values"], x["returns"], x["mask"], clip=0.2, agg=agg)
        (g,) = torch.autograd.grad(loss * -1.3, leaf)
        return loss, stats["clipfrac"], g

    with flavor.cuda_on_cpu():
        _launched()
        got = run(lambda *a, **k: rk.value_loss(*a, **k, backend="cpu"), inputs, True)
        names = _launched()
    _check_path(layout, names, ("value_forward_kernel", "value_backward_kernel"), packed)
    same = run(value_reference, inputs, False)
    oracle = run(
        value_reference, {k: v.double() if v.is_floating_point() else v for k, v in inputs.items()}, False
    )
    for name, o, s, r in zip(("loss", "clipfrac", "d values"), got, same, oracle, strict=True):
        assert_oracle(f"{layout}/{dtype}/{mask_kind}/{name}", o, s, r)


@pytest.mark.parametrize("mask_kind", ["bool", "int", "float"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("layout,t,packed", LAYOUTS, ids=[x[0] for x in LAYOUTS])
def test_agg_loss_paths(layout, t, packed, dtype, mask_kind):
    gen = torch.Generator().manual_seed(11)
    raw = (torch.rand(B, t, dtype=torch.float64, generator=gen) * 3 - 1).to(dtype)
    mask = _mask(t, mask_kind)

    def run(fn, cast, lay):
        leaf = (_lay(raw, layout) if lay else raw).to(cast).detach().requires_grad_()
        loss = fn(leaf, _lay(mask, layout) if lay else mask, "seq-mean-token-sum")
        (g,) = torch.autograd.grad(loss * 0.7, leaf)
        return loss, g

    with flavor.cuda_on_cpu():
        _launched()
        got = run(lambda *a: rk.agg_loss(*a, backend="cpu"), dtype, True)
        names = _launched()
    _check_path(layout, names, ("agg_forward_kernel", "agg_backward_kernel"), packed)
    same = run(agg_reference, dtype, False)
    oracle = run(agg_reference, torch.float64, False)
    magnitude = float((raw.double().abs() * mask.double()).sum())
    assert_oracle(f"{layout}/{dtype}/{mask_kind}/loss", got[0], same[0], oracle[0], magnitude=magnitude)
    assert_oracle(f"{layout}/{dtype}/{mask_kind}/d loss_mat", got[1], same[1], oracle[1])


POLICY_OPTIONS = {
    "clip, kl, entropy": dict(clip_low=0.2, clip_high=0.28, dual_clip=3.0, kl_coef=0.05, entropy_coef=0.01),
    "gspo": dict(level="sequence", agg="seq-mean-token-mean", entropy_coef=0.01),
}


@pytest.mark.parametrize("options", POLICY_OPTIONS)
@pytest.mark.parametrize("mask_kind", ["bool", "int", "float"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("layout,t,packed", LAYOUTS, ids=[x[0] for x in LAYOUTS])
def test_policy_loss_paths(layout, t, packed, dtype, mask_kind, options):
    """Per-token advantages and IS weights, ref_logp and entropy: every [B, T] input a token reads, each laid
    out as `layout` says (d logp and d entropy reach the leaves through the layout's copy)."""
    kw = POLICY_OPTIONS[options]
    packed = packed and dtype != torch.float64  # kVec<double> is 1
    inputs = policy_inputs(B, t, dtype, kw, per_token_adv=True, float_mask=mask_kind == "float", isw="token")
    if mask_kind == "int":
        inputs["mask"] = inputs["mask"].to(torch.int64)

    def kernel(**x):
        laid = {k: (_lay(v, layout) if v.dim() == 2 else v) for k, v in x.items()}
        return rk.policy_loss(**laid, **kw, backend="cpu")

    with flavor.cuda_on_cpu():
        _launched()
        got = policy_run(kernel, inputs, {}, 1.7)
        names = _launched()
    kernels = ("seq_partial_kernel", "policy_forward_kernel", "policy_backward_kernel")
    _check_path(layout, names, kernels, packed, launched=("policy_forward_kernel",))
    # The eager backward's scaling of the saved gradients reads the mask only, which the op converts (a
    # contiguous copy) where the kernels do not read its dtype (a float64 mask of fp32 inputs): packed
    # wherever the inputs are, and on a converted mask.
    if packed:
        _check_path(layout, names, ("into_saved_kernel",), True, launched=())
    same = policy_run(reference_fn, inputs, kw, 1.7)
    inputs64 = {k: (v.double() if v.is_floating_point() else v) for k, v in inputs.items()}
    oracle = policy_run(reference_fn, inputs64, kw, 1.7)
    name = f"{layout}/{dtype}/{mask_kind}/{options}"
    assert_oracle(f"{name}/loss", got[0], same[0], oracle[0], magnitude=loss_magnitude(inputs64, kw))
    for key in oracle[1]:
        assert_oracle(f"{name}/{key}", got[1][key], same[1][key], oracle[1][key])
    for label, g, s, r in zip(("d logp", "d entropy"), got[2], same[2], oracle[2], strict=True):
        assert_oracle(f"{name}/{label}", g, s, r)
