"""value_loss: every backend x dtype x agg x clip against the float64 reference, forward and gradients;
hand-computed values; masking and sharding; opcheck and torch.compile; bad inputs."""

import pytest
import torch
from mask_forms import assert_same_bits, zero_one_masks
from oracle import DTYPES, assert_oracle, cpu_kernel_backends, plain

import rlkernels as rk
from rlkernels.reference.aggregation import AGG_MODES
from rlkernels.reference.value_loss import value_loss as value_reference

BACKENDS = cpu_kernel_backends()
ALL_BACKENDS = BACKENDS + ["reference"]
MARGIN = 2e-3  # distance kept from the kinks, so fp32 kernels and the fp64 oracle take the same branches


def make_inputs(B, T, dtype, clip, *, float_mask=False):
    """values straddling old_values ± clip, away from the clip edges and from the ties of the two branches."""
    old = torch.randn(B, T, dtype=torch.float64)
    ret = old + torch.randn(B, T, dtype=torch.float64)
    values = old + torch.randn(B, T, dtype=torch.float64) * 0.4
    for _ in range(200):
        v, o, r = (x.to(dtype).double() for x in (values, old, ret))
        bad = torch.zeros_like(v, dtype=torch.bool)
        if clip is not None:
            bad |= ((v - o).abs() - clip).abs() < MARGIN
            vc = torch.clamp(v, o - clip, o + clip)
            bad |= (((vc - r).abs() - (v - r).abs()).abs() < MARGIN) & ((v - o).abs() > clip)
        if not bad.any():
            break
        values[bad] = old[bad] + torch.randn(int(bad.sum()), dtype=torch.float64) * 0.4
    else:
        raise AssertionError("could not draw values away from the kinks")
    mask = torch.rand(B, T) > 0.2
    if float_mask:
        mask = mask * torch.rand(B, T, dtype=torch.float64) * 2
    if B > 2:
        mask[1] = 0
    return dict(values=values.to(dtype), old_values=old.to(dtype), returns=ret.to(dtype), mask=mask)


def run(fn, inputs, upstream, **kw):
    x = {k: t.clone() for k, t in inputs.items()}
    x["values"].requires_grad_()
    loss, stats = fn(**x, **kw)
    (g,) = torch.autograd.grad(loss * upstream, x["values"])
    return loss, stats, g


@pytest.mark.parametrize("clip", [0.2, None])
@pytest.mark.parametrize("agg", AGG_MODES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_matches_float64_reference(backend, dtype, agg, clip, seed):
    inputs = make_inputs(5, 67, dtype, clip, float_mask=agg == "seq-mean-token-mean")
    kw = dict(clip=clip, agg=agg)
    out = run(lambda **x: rk.value_loss(**x, backend=backend), inputs, -1.3, **kw)
    same = run(value_reference, inputs, -1.3, **kw)
    inputs64 = {k: (t.double() if t.is_floating_point() else t) for k, t in inputs.items()}
    oracle = run(value_reference, inputs64, -1.3, **kw)
    assert_oracle(f"{backend}/loss", out[0], same[0], oracle[0])
    assert_oracle(f"{backend}/clipfrac", out[1]["clipfrac"], same[1]["clipfrac"], oracle[1]["clipfrac"])
    assert out[2].dtype == dtype
    assert_oracle(f"{backend}/d values", out[2], same[2], oracle[2])


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_zero_one_mask_gives_the_same_bits_in_any_dtype(backend, seed):
    """A 0/1 mask as bool, int64 or float weights: the loss, clipfrac and d values agree bit for bit."""
    inputs = make_inputs(4, 67, torch.float32, 0.2)
    masks = zero_one_masks(inputs["mask"])
    runs = {
        name: run(rk.value_loss, dict(inputs, mask=m), -0.7, clip=0.2, backend=backend)
        for name, m in masks.items()
    }
    assert_same_bits(runs)


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_hand_computed(backend):
    # clip 0.5, old = 0:
    #   v=1, R=2:   clip(v) = .5: max((1-2)^2, (.5-2)^2) = 2.25 -> 1.125, clipped, no gradient
    #   v=.2, R=1:  inside: .64 -> .32, d = v - R = -.8
    #   v=-1, R=0:  clip(v) = -.5: max(1, .25) = 1 -> .5, d = -1
    values = torch.tensor([[1.0, 0.2, -1.0]], dtype=torch.float64, requires_grad=True)
    old, ret = torch.zeros(1, 3, dtype=torch.float64), torch.tensor([[2.0, 1.0, 0.0]], dtype=torch.float64)
    mask = torch.ones(1, 3, dtype=torch.bool)
    tol = 1e-6 if backend == "triton" else 1e-12  # Triton takes the clip as an fp32 scalar
    loss, stats = rk.value_loss(values, old, ret, mask, clip=0.5, backend=backend)
    assert loss.item() == pytest.approx((1.125 + 0.32 + 0.5) / 3, rel=tol)
    assert stats["clipfrac"].item() == pytest.approx(1 / 3)
    (g,) = torch.autograd.grad(loss, values)
    torch.testing.assert_close(g, torch.tensor([[0.0, -0.8, -1.0]], dtype=torch.float64) / 3)
    loss, stats = rk.value_loss(values, old, ret, mask, clip=None, agg="token-sum", backend=backend)
    assert loss.item() == pytest.approx(0.5 * (1 + 0.64 + 1), rel=tol)
    (g,) = torch.autograd.grad(loss, values)
    torch.testing.assert_close(g, torch.tensor([[-1.0, -0.8, -1.0]], dtype=torch.float64))
    assert stats["clipfrac"].item() == 0.0


@pytest.mark.parametrize("backend", BACKENDS)
def test_rows_longer_than_a_chunk(backend, seed):
    """2100-token rows: the CUDA kernels split a row into 1024-token blocks (two full, one partial)."""
    inputs = make_inputs(3, 2100, torch.bfloat16, 0.2)
    kw = dict(clip=0.2, agg="seq-mean-token-sum")
    out = run(lambda **x: rk.value_loss(**x, backend=backend), inputs, 0.7, **kw)
    same = run(value_reference, inputs, 0.7, **kw)
    inputs64 = {k: (t.double() if t.is_floating_point() else t) for k, t in inputs.items()}
    oracle = run(value_reference, inputs64, 0.7, **kw)
    for name, o, s, r in zip(("loss", "d values"), out[::2], same[::2], oracle[::2], strict=True):
        assert_oracle(f"{backend}/multi-chunk/{name}", o, s, r)
    clipfrac = [x[1]["clipfrac"] for x in (out, same, oracle)]
    assert_oracle(f"{backend}/multi-chunk/clipfrac", *clipfrac)


@pytest.mark.parametrize("agg", AGG_MODES)
@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_sharding_and_masking(backend, agg, seed):
    inputs = make_inputs(7, 19, torch.float64, 0.2)
    m = inputs["mask"].double()
    kw = dict(clip=0.2, agg=agg, backend=backend)
    glob = dict(num_tokens=m.sum(), num_seqs=(m.sum(-1) > 0).sum(), dp_size=3)
    whole = run(rk.value_loss, inputs, 1.0, **kw)
    parts = [
        run(rk.value_loss, dict(zip(inputs, p, strict=True)), 1 / 3, **kw, **glob)
        for p in zip(*[t.split([3, 2, 2]) for t in inputs.values()], strict=True)
    ]
    torch.testing.assert_close(sum(p[0] for p in parts) / 3, whole[0], rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(torch.cat([p[2] for p in parts]), whole[2], rtol=1e-12, atol=1e-14)
    assert (whole[2][~inputs["mask"]] == 0).all()
    inputs["mask"][:] = False
    loss, stats, g = run(rk.value_loss, inputs, 1.0, **kw)
    assert loss.item() == 0.0 and stats["clipfrac"].item() == 0.0 and (g == 0).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_strided_and_gradcheck(backend):
    inputs = make_inputs(13, 6, torch.float64, 0.3)
    strided = {k: t.t().contiguous().t() for k, t in inputs.items()}
    got = run(lambda **x: rk.value_loss(**x, clip=0.3, backend=backend), strided, 2.0)
    want = run(value_reference, inputs, 2.0, clip=0.3)
    torch.testing.assert_close(got[0], want[0])
    torch.testing.assert_close(got[2], want[2])
    rest = {k: t for k, t in inputs.items() if k != "values"}
    fn = lambda v: rk.value_loss(v, **rest, clip=0.3, agg="seq-mean-token-mean", backend=backend)[0]  # noqa: E731
    assert torch.autograd.gradcheck(fn, (inputs["values"].clone().requires_grad_(),), fast_mode=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_rows_at_any_stride(backend, seed):
    """verl's critic inputs: the values sliced out of the padded sequence's ([:, -T - 1:-1] of [B, T + 9]),
    the mask an int64 attention mask's [:, -T:], the returns one row broadcast (stride 0): the float64
    reference's loss, clipfrac and d values, which reach the padded values through the view alone."""
    B, T, pad = 5, 67, 9
    inputs = make_inputs(B, T, torch.float32, 0.2)
    inputs["returns"] = inputs["returns"][:1].expand(B, T).contiguous()
    wide = torch.zeros(B, T + pad)
    wide[:, pad - 1 : -1] = inputs["values"]
    wide.requires_grad_()
    attention = torch.zeros(B, T + pad, dtype=torch.int64)
    attention[:, pad:] = inputs["mask"]
    views = dict(
        values=wide[:, pad - 1 : -1], old_values=inputs["old_values"],
        returns=inputs["returns"][:1].expand(B, T), mask=attention[:, pad:],
    )  # fmt: skip
    loss, stats = rk.value_loss(**views, clip=0.2, agg="seq-mean-token-mean", backend=backend)
    (g,) = torch.autograd.grad(loss * -1.3, wide)
    kw = dict(clip=0.2, agg="seq-mean-token-mean")
    same = run(value_reference, inputs, -1.3, **kw)
    inputs64 = {k: (t.double() if t.is_floating_point() else t) for k, t in inputs.items()}
    oracle = run(value_reference, inputs64, -1.3, **kw)
    assert_oracle(f"{backend}/loss", loss, same[0], oracle[0])
    assert_oracle(f"{backend}/clipfrac", stats["clipfrac"], same[1]["clipfrac"], oracle[1]["clipfrac"])
    assert_oracle(f"{backend}/d values", g[:, pad - 1 : -1], same[2], oracle[2])
    assert not g[:, : pad - 1].any() and not g[:, -1].any()


@pytest.mark.parametrize("backend", BACKENDS)
def test_opcheck(backend):
    from rlkernels.ops.value_loss import _FLAVORS

    flavor = _FLAVORS[backend]
    x = make_inputs(3, 10, torch.float32, 0.2)
    # (agg, dp_size, norm_len, num_tokens, num_tokens_tensor, num_seqs, num_seqs_tensor): a global count
    # as a number, and one as a tensor.
    aggs = {0.2: ("token-mean", 2, 10.0, None, torch.tensor(40.0), None, None),
            None: ("seq-mean-token-mean", 1, 10.0, None, None, 4.0, None)}  # fmt: skip
    for clip, agg_args in aggs.items():
        args = (x["values"].requires_grad_(), x["old_values"], x["returns"], x["mask"], clip, *agg_args)
        torch.library.opcheck(getattr(torch.ops.rlkernels, flavor), args)
        _loss, _clipfrac, row_weights, _ok = getattr(torch.ops.rlkernels, flavor)(*args)
        data = (x["values"].detach(), x["old_values"], x["returns"], x["mask"], clip)
        bargs = (torch.randn(()), row_weights, *data)
        torch.library.opcheck(getattr(torch.ops.rlkernels, flavor + "_backward"), bargs)


@pytest.mark.parametrize("backend", BACKENDS)
def test_torch_compile_fullgraph(backend):
    backend = plain(backend)
    torch._dynamo.reset()
    inputs = make_inputs(4, 16, torch.float32, 0.2)
    fn = lambda **x: rk.value_loss(**x, agg="seq-mean-token-sum", backend=backend)  # noqa: E731
    got = run(torch.compile(fn, fullgraph=True), inputs, 1.0)
    want = run(fn, inputs, 1.0)
    torch.testing.assert_close(got[0], want[0])
    torch.testing.assert_close(got[2], want[2])


GOOD = dict(
    values=torch.zeros(2, 3), old_values=torch.zeros(2, 3), returns=torch.zeros(2, 3), mask=torch.ones(2, 3)
)


@pytest.mark.parametrize(
    "kwargs,exc,match",
    [
        (dict(clip=0.0), ValueError, "clip must be > 0"),
        (dict(agg="sum"), ValueError, "agg must be one of"),
        (
            dict(returns=torch.zeros(2, 4)),
            ValueError,
            r"returns has shape \(2, 4\) but values has shape \(2, 3\)",
        ),
        (dict(values=torch.zeros(3)), ValueError, "values must be 2-D"),
        (
            dict(mask=torch.ones(2, 3, dtype=torch.complex64)),
            TypeError,
            r"mask must be a bool, integer \(0/1\)",
        ),
        (dict(mask=torch.full((2, 3), 2, dtype=torch.int32)), ValueError, "must hold only 0 and 1"),
        (dict(dp_size=2.5), ValueError, "dp_size must be an int >= 1"),
    ],
)
def test_bad_inputs(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        rk.value_loss(**dict(GOOD, **kwargs))
