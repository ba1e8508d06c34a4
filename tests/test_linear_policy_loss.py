"""reference.linear_policy_loss: `linear_logprobs` composed with `policy_loss`, against an independent eager
composition (logits -> log_softmax -> gather -> policy loss) with ignored labels left out of the loss."""

import sys
import types

import pytest
import torch
import torch.nn.functional as F

from rlkernels.reference.policy_loss import linear_policy_loss, policy_loss


def _eager_logprobs(hidden, weight, labels, *, bias=None, temperature=1.0, softcap=None, ignore_index=-100,
                    return_entropy=False):  # fmt: skip
    """DESIGN.md §3: z = (h·Wᵀ + b) / temperature (softcap before it); logp = z_y - LSE(z); ignored -> 0."""
    z = hidden @ weight.T
    if bias is not None:
        z = z + bias
    if softcap is not None:
        z = softcap * torch.tanh(z / softcap)
    z = z / temperature
    logsm = F.log_softmax(z, dim=-1)
    valid = labels != ignore_index
    logp = logsm.gather(-1, torch.where(valid, labels, 0).unsqueeze(-1)).squeeze(-1) * valid
    entropy = -(logsm.exp() * logsm).sum(-1)
    return (logp, entropy) if return_entropy else logp


def _inputs(seed=0):
    gen = torch.Generator().manual_seed(seed)
    B, T, D, V = 3, 7, 5, 11
    hidden = torch.randn(B, T, D, generator=gen, dtype=torch.float64)
    weight = torch.randn(V, D, generator=gen, dtype=torch.float64) * 0.5
    labels = torch.randint(0, V, (B, T), generator=gen)
    labels[0, 2] = labels[2, 6] = -100
    old = torch.randn(B, T, generator=gen, dtype=torch.float64) * 0.2 - 2.5
    adv = torch.randn(B, generator=gen, dtype=torch.float64)
    mask = torch.rand(B, T, generator=gen) > 0.2
    return hidden, weight, labels, old, adv, mask


def _check(linear_logprobs_impl):
    hidden, weight, labels, old, adv, mask = _inputs()
    kw = dict(temperature=0.7, entropy_coef=0.01, dual_clip=3.0, agg="seq-mean-token-mean")
    h1, w1 = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    loss, stats = linear_policy_loss(h1, w1, labels, old, adv, mask, **kw)
    g1 = torch.autograd.grad(loss, (h1, w1))
    h2, w2 = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    logp, ent = _eager_logprobs(h2, w2, labels, temperature=0.7, return_entropy=True)
    want, want_stats = policy_loss(
        logp, old, adv, mask & (labels != -100), entropy=ent, entropy_coef=0.01, dual_clip=3.0,
        agg="seq-mean-token-mean",
    )  # fmt: skip
    g2 = torch.autograd.grad(want, (h2, w2))
    torch.testing.assert_close(loss, want)
    assert set(stats) == set(want_stats) and "entropy" in stats
    for a, b in zip(g1, g2, strict=True):
        torch.testing.assert_close(a, b)


def test_composition_with_a_stand_in_linear_logprobs(monkeypatch):
    """Runs before rlkernels/reference/logprobs.py lands: a stand-in module with the agreed signature."""
    module = types.ModuleType("rlkernels.reference.logprobs")
    module.linear_logprobs = _eager_logprobs
    monkeypatch.setitem(sys.modules, "rlkernels.reference.logprobs", module)
    _check(_eager_logprobs)


def test_composition_with_the_reference_linear_logprobs():
    logprobs = pytest.importorskip("rlkernels.reference.logprobs")
    _check(logprobs.linear_logprobs)
