"""agg_loss: every flavor x dtype x agg x mask kind against the float64 reference (forward and d loss_mat);
hand-computed values; NaN at masked and kept tokens; sharding; empty masks; rows at any stride; opcheck and
torch.compile; bad inputs."""

import pytest
import torch
from mask_forms import assert_same_bits, zero_one_masks
from oracle import DTYPES, assert_oracle, cpu_kernel_backends, plain

import rlkernels as rk
from rlkernels.reference.aggregation import AGG_MODES
from rlkernels.reference.aggregation import agg_loss as agg_reference

BACKENDS = cpu_kernel_backends()
ALL_BACKENDS = BACKENDS + ["reference"]


def make_inputs(B, T, dtype, mask_kind="bool"):
    """A token loss (an entropy-like positive term plus a signed one) and a mask with an empty row."""
    loss_mat = (torch.rand(B, T, dtype=torch.float64) * 3 + torch.randn(B, T, dtype=torch.float64)).to(dtype)
    keep = torch.rand(B, T) > 0.25
    if B > 2:
        keep[1] = False
    mask = {
        "bool": keep,
        "int": keep.to(torch.int64),
        "float": keep * torch.rand(B, T, dtype=torch.float64) * 2,
    }[mask_kind]
    return loss_mat, mask


def run(fn, loss_mat, mask, upstream, **kw):
    """(loss, d loss_mat) of fn with an upstream gradient."""
    x = loss_mat.clone().requires_grad_()
    loss = fn(x, mask, **kw)
    (g,) = torch.autograd.grad(loss * upstream, x)
    return loss, g


def check_against_oracle(name, backend, loss_mat, mask, upstream, **kw):
    out = run(lambda x, m, **k: rk.agg_loss(x, m, **k, backend=backend), loss_mat, mask, upstream, **kw)
    same = run(agg_reference, loss_mat, mask, upstream, **kw)
    mask64 = mask.double() if mask.is_floating_point() else mask
    oracle = run(agg_reference, loss_mat.double(), mask64, upstream, **kw)
    magnitude = float((loss_mat.double().abs() * mask64.double()).sum())
    assert out[0].dtype == (torch.float64 if loss_mat.dtype == torch.float64 else torch.float32)
    assert_oracle(f"{name}/loss", out[0], same[0], oracle[0], magnitude=magnitude)
    assert out[1].dtype == loss_mat.dtype
    assert_oracle(f"{name}/d loss_mat", out[1], same[1], oracle[1])


@pytest.mark.parametrize("mask_kind", ["bool", "int", "float"])
@pytest.mark.parametrize("agg", AGG_MODES)
@pytest.mark.parametrize("dtype", (*DTYPES, torch.float64))
@pytest.mark.parametrize("backend", BACKENDS)
def test_matches_float64_reference(backend, dtype, agg, mask_kind, seed):
    loss_mat, mask = make_inputs(5, 67, dtype, mask_kind)
    check_against_oracle(f"{backend}/{agg}/{mask_kind}", backend, loss_mat, mask, -1.3, agg=agg)


@pytest.mark.parametrize("backend", BACKENDS)
def test_rows_longer_than_a_chunk(backend, seed):
    """3000-token rows: the CUDA kernels split a row into 1024-token blocks (two full, one partial), the
    Triton ones on a GPU into 1024-token programs."""
    loss_mat, mask = make_inputs(3, 3000, torch.bfloat16, "float")
    check_against_oracle(f"{backend}/multi-chunk", backend, loss_mat, mask, 0.7, agg="seq-mean-token-mean")


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])  # the kernel's terms: any mode's
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_zero_one_mask_gives_the_same_bits_in_any_dtype(backend, agg, seed):
    """A 0/1 mask as bool, int64 or float weights: the loss and its gradient agree bit for bit."""
    loss_mat, mask = make_inputs(4, 67, torch.float32)
    runs = {
        name: run(rk.agg_loss, loss_mat, m, -0.7, agg=agg, backend=backend)
        for name, m in zero_one_masks(mask).items()
    }
    assert_same_bits(runs)


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_hand_computed(backend):
    # Row 0 keeps 1, 2 (mask weights 1, 1); row 1 keeps 4 with weight 0.5; row 2 keeps nothing.
    loss_mat = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 0.0], [0.5, 0.0, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    # S = (3, 2, 0), n = (2, 0.5, 0); two rows with tokens.
    want = {
        "token-mean": (5 / 2.5, [[1 / 2.5, 1 / 2.5, 0], [0.5 / 2.5, 0, 0]]),
        "token-sum": (5.0, [[1, 1, 0], [0.5, 0, 0]]),
        "seq-mean-token-sum": (5 / 2, [[0.5, 0.5, 0], [0.25, 0, 0]]),
        "seq-mean-token-mean": ((3 / 2 + 2 / 0.5) / 2, [[0.25, 0.25, 0], [0.5, 0, 0]]),
        "seq-mean-token-sum-norm": (5 / 2 / 4, [[0.125, 0.125, 0], [0.0625, 0, 0]]),
    }
    for agg, (value, grad) in want.items():
        x = loss_mat.clone().requires_grad_()
        norm = dict(norm_len=4.0) if agg == "seq-mean-token-sum-norm" else {}
        loss = rk.agg_loss(x, mask, agg, **norm, backend=backend)
        assert loss.item() == pytest.approx(value, rel=1e-12), agg
        (g,) = torch.autograd.grad(loss, x)
        expected = torch.tensor([*grad, [0, 0, 0]], dtype=torch.float64)
        torch.testing.assert_close(g, expected, rtol=1e-12, atol=0, msg=agg)


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_nan_at_masked_and_kept_tokens(backend):
    """A masked-out NaN adds exactly 0 (verl's product with the mask carries it: the difference on purpose,
    reference/aggregation.py); a kept NaN is the loss's, as in verl. Neither is rejected."""
    loss_mat, mask = make_inputs(4, 9, torch.float32)
    loss_mat[~mask] = float("nan")
    got = rk.agg_loss(loss_mat, mask, "seq-mean-token-mean", backend=backend)
    want = agg_reference(torch.where(mask, loss_mat, 0).double(), mask, "seq-mean-token-mean")
    assert torch.isfinite(got)
    torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=0)
    loss_mat[0, mask[0].nonzero()[0, 0]] = float("nan")
    assert rk.agg_loss(loss_mat, mask, "token-mean", backend=backend).isnan()


@pytest.mark.parametrize("agg", AGG_MODES)
@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_sharding_and_empty_masks(backend, agg, seed):
    """Shards given the global normalizers and dp_size: the mean of their losses and their gradients are the
    whole batch's. A fully masked batch: loss 0 and gradient 0, no NaN."""
    loss_mat, mask = make_inputs(7, 19, torch.float64, "float")
    m = mask.double()
    glob = dict(num_tokens=m.sum(), num_seqs=(m.sum(-1) > 0).sum(), dp_size=3)
    kw = dict(agg=agg, backend=backend)
    whole = run(rk.agg_loss, loss_mat, mask, 1.0, **kw)
    parts = [
        run(rk.agg_loss, x, mk, 1 / 3, **kw, **glob)
        for x, mk in zip(loss_mat.split([3, 2, 2]), mask.split([3, 2, 2]), strict=True)
    ]
    torch.testing.assert_close(sum(p[0] for p in parts) / 3, whole[0], rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(torch.cat([p[1] for p in parts]), whole[1], rtol=1e-12, atol=1e-14)
    assert (whole[1][mask == 0] == 0).all()
    loss, g = run(rk.agg_loss, loss_mat, torch.zeros_like(mask), 1.0, **kw)
    assert loss.item() == 0.0 and (g == 0).all()
    for shape in ((0, 5), (3, 0)):
        loss, g = run(rk.agg_loss, torch.zeros(shape, dtype=torch.float64), torch.ones(shape), 1.0, **kw)
        assert loss.item() == 0.0 and g.shape == shape


@pytest.mark.parametrize("backend", BACKENDS)
def test_rows_at_any_stride(backend, seed):
    """verl's entropy sliced out of the padded sequence ([:, -T - 1:-1] of [B, T + 9]) and an int64
    attention mask's [:, -T:], read in place; the gradient reaches the padded tensor through the view."""
    B, T, pad = 5, 67, 9
    loss_mat, mask = make_inputs(B, T, torch.float32)
    wide = torch.zeros(B, T + pad)
    wide[:, pad - 1 : -1] = loss_mat
    wide.requires_grad_()
    attention = torch.zeros(B, T + pad, dtype=torch.int64)
    attention[:, pad:] = mask
    loss = rk.agg_loss(wide[:, pad - 1 : -1], attention[:, pad:], "seq-mean-token-sum", backend=backend)
    (g,) = torch.autograd.grad(loss * 2.0, wide)
    same = run(agg_reference, loss_mat, mask, 2.0, agg="seq-mean-token-sum")
    oracle = run(agg_reference, loss_mat.double(), mask, 2.0, agg="seq-mean-token-sum")
    assert_oracle(f"{backend}/loss", loss, same[0], oracle[0], magnitude=float(loss_mat.abs().sum()))
    assert_oracle(f"{backend}/d loss_mat", g[:, pad - 1 : -1], same[1], oracle[1])
    assert not g[:, : pad - 1].any() and not g[:, -1].any()


@pytest.mark.parametrize("backend", BACKENDS)
def test_gradcheck(backend):
    loss_mat, mask = make_inputs(6, 13, torch.float64, "float")
    fn = lambda x: rk.agg_loss(x, mask, "seq-mean-token-mean", backend=backend)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (loss_mat.requires_grad_(),), fast_mode=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_opcheck(backend):
    from rlkernels.ops.agg_loss import _FLAVORS

    flavor = _FLAVORS[backend]
    loss_mat, mask = make_inputs(3, 10, torch.float32)
    # (agg, dp_size, norm_len, num_tokens, num_tokens_tensor, num_seqs, num_seqs_tensor): a global count
    # as a tensor, and one as a number.
    for agg_args in (
        ("token-mean", 2, 10.0, None, torch.tensor(40.0), None, None),
        ("seq-mean-token-mean", 1, 10.0, None, None, 4.0, None),
    ):
        args = (loss_mat.clone().requires_grad_(), mask, *agg_args)
        torch.library.opcheck(getattr(torch.ops.rlkernels, flavor), args)
        _loss, row_weights, _ok = getattr(torch.ops.rlkernels, flavor)(*args)
        bargs = (torch.randn(()), row_weights, loss_mat, mask)
        torch.library.opcheck(getattr(torch.ops.rlkernels, flavor + "_backward"), bargs)


@pytest.mark.parametrize("backend", BACKENDS)
def test_torch_compile_fullgraph(backend):
    backend = plain(backend)
    torch._dynamo.reset()
    loss_mat, mask = make_inputs(4, 16, torch.float32)
    fn = lambda x, m: rk.agg_loss(x, m, "seq-mean-token-sum", backend=backend)  # noqa: E731
    got = run(torch.compile(fn, fullgraph=True), loss_mat, mask, 1.0)
    want = run(fn, loss_mat, mask, 1.0)
    torch.testing.assert_close(got[0], want[0])
    torch.testing.assert_close(got[1], want[1])


@pytest.mark.parametrize(
    "kwargs,exc,match",
    [
        (dict(agg="sum"), ValueError, "agg must be one of"),
        (dict(mask=torch.ones(2, 4)), ValueError, r"mask has shape \(2, 4\) but loss_mat has shape \(2, 3\)"),
        (dict(loss_mat=torch.zeros(6)), ValueError, "loss_mat must be 2-D"),
        (dict(loss_mat=torch.zeros(2, 3, dtype=torch.int64)), TypeError, "loss_mat"),
        (dict(mask=torch.ones(2, 3, dtype=torch.complex64)), TypeError, r"mask must be a bool, integer"),
        (dict(mask=torch.full((2, 3), 2, dtype=torch.int32)), ValueError, "must hold only 0 and 1"),
        (dict(mask=torch.full((2, 3), -1.0)), ValueError, "mask"),
        (dict(dp_size=0), ValueError, "dp_size must be an int >= 1"),
        (dict(num_tokens=torch.ones(2)), ValueError, "num_tokens must be a number or a one-element tensor"),
        (dict(norm_len=0.0), ValueError, "norm_len"),
    ],
)
@pytest.mark.parametrize("backend", ["cpu", "reference"])
def test_bad_inputs(backend, kwargs, exc, match):
    args = dict(dict(loss_mat=torch.zeros(2, 3), mask=torch.ones(2, 3)), **kwargs)
    with pytest.raises(exc, match=match):
        rk.agg_loss(**args, backend=backend)
