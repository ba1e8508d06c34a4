"""reference.linear_policy_loss: `linear_logprobs` composed with `policy_loss`, against an independent eager
composition (logits -> log_softmax -> gather -> policy loss) with ignored labels left out of the loss."""

import pytest
import torch
import torch.nn.functional as F
from oracle import cpu_kernel_backends, drawn_on_cpu

import rlkernels as rk
from rlkernels.reference.policy_loss import linear_policy_loss, policy_loss


def _eager_logprobs(hidden, weight, labels, *, bias=None, temperature=1.0, softcap=None, ignore_index=-100,
                    return_entropy=False):  # fmt: skip
    """docs/semantics.md: z = (h·Wᵀ + b) / temperature (softcap before it); logp = z_y - LSE(z);
    ignored -> 0."""
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


@drawn_on_cpu
def _inputs(seed=0):
    """Seeded inputs, drawn on the CPU (a CPU generator) and moved to the test's device."""
    gen = torch.Generator().manual_seed(seed)
    cpu = dict(generator=gen, device="cpu")
    B, T, D, V = 3, 7, 5, 11
    hidden = torch.randn(B, T, D, dtype=torch.float64, **cpu)
    weight = torch.randn(V, D, dtype=torch.float64, **cpu) * 0.5
    labels = torch.randint(0, V, (B, T), **cpu)
    labels[0, 2] = labels[2, 6] = -100
    old = torch.randn(B, T, dtype=torch.float64, **cpu) * 0.2 - 2.5
    adv = torch.randn(B, dtype=torch.float64, **cpu)
    mask = torch.rand(B, T, **cpu) > 0.2
    device = torch.get_default_device()
    return tuple(t.to(device) for t in (hidden, weight, labels, old, adv, mask))


def _check(impl):
    hidden, weight, labels, old, adv, mask = _inputs()
    kw = dict(temperature=0.7, entropy_coef=0.01, dual_clip=3.0, agg="seq-mean-token-mean")
    h1, w1 = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    loss, stats = impl(h1, w1, labels, old, adv, mask, **kw)
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


def test_composition_with_the_reference_linear_logprobs():
    _check(linear_policy_loss)


# The sweep (per-token objectives) and the composition (per-row ratios: geo_mean, vespo) paths.
OBJECTIVES = {
    "clip": {},
    "dro": dict(dro_beta=0.5),
    "geo_mean": {},
    "vespo": {},
    "kl_cov": dict(cov_options=rk.CovOptions(ratio=0.2)),
}


@pytest.mark.parametrize("objective", list(OBJECTIVES))
@pytest.mark.parametrize("backend", cpu_kernel_backends() + ["reference"])
def test_public_function_matches_the_eager_composition(backend, objective):
    """rk.linear_policy_loss on every backend against the float64 eager composition (loss, stats, gradients
    of hidden and weight), with ignored labels, a KL term and the entropy bonus."""
    hidden, weight, labels, old, adv, mask = _inputs(seed=1)
    noise = torch.randn(old.shape, generator=torch.Generator().manual_seed(2), dtype=old.dtype, device="cpu")
    ref = old + 0.1 * noise.to(old.device)
    kw = dict(clip_low=0.2, clip_high=0.28, agg="seq-mean-token-sum", ref_logp=ref, kl_coef=0.05)
    kw.update(objective=objective, **OBJECTIVES[objective])
    dtype = torch.float64 if backend == "reference" else torch.float32
    h1 = hidden.to(dtype).requires_grad_()
    w1 = weight.to(dtype).requires_grad_()
    loss, stats = rk.linear_policy_loss(
        h1, w1, labels, old, adv, mask, temperature=0.9, softcap=4.0, entropy_coef=0.02, backend=backend, **kw
    )
    g1 = torch.autograd.grad(loss, (h1, w1))
    h2, w2 = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    logp, ent = _eager_logprobs(h2, w2, labels, temperature=0.9, softcap=4.0, return_entropy=True)
    want, want_stats = policy_loss(
        logp, old, adv, mask & (labels != -100), entropy=ent, entropy_coef=0.02, **kw
    )
    g2 = torch.autograd.grad(want, (h2, w2))
    tol = dict(rtol=1e-12, atol=1e-12) if dtype == torch.float64 else dict(rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(loss.double(), want, **tol)
    assert set(stats) == set(want_stats)
    for key in stats:
        torch.testing.assert_close(stats[key].double(), want_stats[key], **tol)
    for a, b in zip(g1, g2, strict=True):
        torch.testing.assert_close(a.double(), b, **tol)


def test_bad_inputs():
    hidden, weight, labels, old, adv, mask = _inputs()
    with pytest.raises(TypeError, match="entropy"):
        rk.linear_policy_loss(hidden, weight, labels, old, adv, mask, entropy=old)
    with pytest.raises(ValueError, match="hidden"):
        rk.linear_policy_loss(hidden[0], weight, labels, old, adv, mask)
    with pytest.raises(ValueError, match="mask"):
        rk.linear_policy_loss(hidden, weight, labels, old, adv, mask[:, :3])
    with pytest.raises(TypeError, match="labels"):
        rk.linear_policy_loss(hidden, weight, labels.float(), old, adv, mask)
