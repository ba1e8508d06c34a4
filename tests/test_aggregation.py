"""Loss aggregation (reference/aggregation.py): hand-computed values of every mode, global normalizers,
fully masked inputs, and the sharding invariance of every mode, forward and gradients."""

import pytest
import torch

from rlkernels.reference.aggregation import AGG_MODES, agg_loss, masked_mean

LOSS = torch.tensor(
    [[1.0, 2.0, 3.0, 10.0], [4.0, 5.0, 6.0, 20.0], [7.0, 8.0, 9.0, 30.0]], dtype=torch.float64
)
MASK = torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0]], dtype=torch.bool)


def test_hand_computed_bool_mask():
    # Row sums S = [1+2, 4, 0] = [3, 4, 0], counts n = [2, 1, 0]; the third row is fully masked.
    want = {
        "token-mean": 7 / 3,
        "token-sum": 7.0,
        "seq-mean-token-sum": 7 / 2,  # the empty row is excluded from the count
        "seq-mean-token-mean": (3 / 2 + 4 / 1) / 2,
        "seq-mean-token-sum-norm": 7 / 2 / 4,  # the seq-mean, then / T = 4 (verl 0.9.1)
    }
    for agg, value in want.items():
        assert agg_loss(LOSS, MASK, agg).item() == pytest.approx(value, rel=1e-15), agg


def test_hand_computed_float_mask_and_normalizers():
    mask = torch.tensor([[0.5, 1.0, 0, 0], [2.0, 0, 0, 0], [0, 0, 0, 0]], dtype=torch.float64)
    # S = [0.5 + 2, 8, 0] = [2.5, 8, 0], n = [1.5, 2, 0]
    assert agg_loss(LOSS, mask, "token-mean").item() == pytest.approx(10.5 / 3.5)
    assert agg_loss(LOSS, mask, "seq-mean-token-mean").item() == pytest.approx((2.5 / 1.5 + 8 / 2) / 2)
    assert agg_loss(LOSS, mask, "seq-mean-token-sum-norm", norm_len=2.0).item() == pytest.approx(10.5 / 2 / 2)
    assert agg_loss(
        LOSS, MASK, "seq-mean-token-sum-norm", num_seqs=3, dp_size=2, norm_len=8.0
    ).item() == pytest.approx(2 * 7 / 3 / 8)
    # Global normalizers and dp_size: dp · Σ S / N.
    assert agg_loss(LOSS, MASK, "token-mean", num_tokens=6, dp_size=2).item() == pytest.approx(2 * 7 / 6)
    assert agg_loss(LOSS, MASK, "token-sum", dp_size=3).item() == pytest.approx(21.0)
    assert agg_loss(
        LOSS, MASK, "seq-mean-token-sum", num_seqs=torch.tensor(5), dp_size=2
    ).item() == pytest.approx(2 * 7 / 5)
    assert agg_loss(LOSS, MASK, "seq-mean-token-mean", num_seqs=4).item() == pytest.approx(5.5 / 4)


@pytest.mark.parametrize("agg", AGG_MODES)
def test_fully_masked_batch_is_zero_without_nan(agg):
    loss_mat = LOSS.clone().requires_grad_()
    mask = torch.zeros_like(MASK)
    for kw in ({}, {"num_tokens": 0, "num_seqs": 0}, {"num_tokens": torch.tensor(0.0)}):
        loss = agg_loss(loss_mat, mask, agg, **kw)
        (g,) = torch.autograd.grad(loss, loss_mat)
        assert loss.item() == 0.0
        assert torch.equal(g, torch.zeros_like(g))


def test_masked_mean():
    x = torch.tensor([[1.0, 3.0], [5.0, 7.0]])
    assert masked_mean(x, torch.tensor([[True, False], [True, False]])).item() == 3.0
    assert masked_mean(x, torch.zeros(2, 2, dtype=torch.bool)).item() == 0.0


def shard_invariance(loss_fn, tensors, mask, agg, k, *, splits=None):
    """(whole-batch loss, mean of k shard losses, whole grads, sharded grads) of loss_fn over rows; the
    shards get the global num_tokens / num_seqs and dp_size=k."""
    B = mask.shape[0]
    splits = splits or [B // k + (1 if i < B % k else 0) for i in range(k)]
    m = mask.to(torch.float64)
    glob = dict(num_tokens=m.sum(), num_seqs=(m.sum(-1) > 0).sum())
    leaves = [t.detach().clone().requires_grad_() for t in tensors]
    whole = loss_fn(*leaves, mask, agg=agg)
    g_whole = torch.autograd.grad(whole, leaves)
    parts = [t.detach().clone().requires_grad_() for t in tensors]
    losses = []
    for rows in zip(*[p.split(splits) for p in parts], mask.split(splits), strict=True):
        *xs, mk = rows
        losses.append(loss_fn(*xs, mk, agg=agg, dp_size=k, **glob))
    mean = torch.stack(losses).mean()
    g_shards = torch.autograd.grad(mean, parts)
    return whole, mean, g_whole, g_shards


@pytest.mark.parametrize("agg", AGG_MODES)
@pytest.mark.parametrize("k", [2, 3])
def test_sharding_invariance(agg, k, seed):
    B, T = 7, 9
    loss_mat = torch.randn(B, T, dtype=torch.float64)
    mask = torch.rand(B, T) > 0.3
    mask[2] = False  # a fully masked sequence
    whole, mean, gw, gs = shard_invariance(lambda x, m, **kw: agg_loss(x, m, **kw), [loss_mat], mask, agg, k)
    torch.testing.assert_close(mean, whole, rtol=1e-13, atol=1e-15)
    torch.testing.assert_close(gs[0], gw[0], rtol=1e-13, atol=1e-15)
