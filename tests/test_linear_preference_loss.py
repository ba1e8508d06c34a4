"""linear_preference_loss: every kind against a float64 oracle written here from the formulas (materialized
logits, values, metrics and gradients with a random upstream gradient, under assert_oracle); against
Liger-Kernel 0.8.5's chunked losses and TRL 1.16's own loss code on the same inputs; that no [N, V] tensor is
allocated; bad inputs."""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from oracle import assert_oracle, cpu_kernel_backends

import rlkernels as rk
from rlkernels.memory import cpu_peak_bytes

B, T, D, V = 4, 9, 32, 1271  # B pairs: 2B rows, chosen first
IGNORE = -100


def make_batch(seed: int, *, bias: bool = True, rows: int = 2 * B):
    """fp32 inputs (the oracle upcasts them): policy and reference heads, labels with a prompt (1-3 tokens) and
    right padding (0-2 tokens) set to IGNORE, and KL completions for KTO."""
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(rows, T, D, generator=g)
    weight = torch.randn(V, D, generator=g) * (2 / D**0.5)
    b = torch.randn(V, generator=g) * 0.1 if bias else None
    labels = torch.randint(0, V, (rows, T), generator=g)
    prompt = torch.randint(1, 4, (rows, 1), generator=g)
    pad = torch.randint(0, 3, (rows, 1), generator=g)
    pos = torch.arange(T)
    labels[(pos < prompt) | (pos >= T - pad)] = IGNORE
    nll_labels = torch.where(labels[:B] == IGNORE, torch.randint(0, V, (B, T), generator=g), labels[:B])
    nll_labels[:, 0] = IGNORE
    return SimpleNamespace(
        hidden=hidden,
        weight=weight,
        bias=b,
        labels=labels,
        nll_labels=nll_labels,
        ref_hidden=hidden + 0.3 * torch.randn(rows, T, D, generator=g),
        ref_weight=weight + 0.05 * torch.randn(V, D, generator=g),
        kl_hidden=torch.randn(rows, T, D, generator=g),
        kl_labels=labels.roll(1, 0),  # TRL pairs each prompt with another row's completion
        ref_kl_hidden=torch.randn(rows, T, D, generator=g),
        preference=torch.tensor([True, False, True, True, False, False, True, False][:rows]),
        grad_scale=0.5 + float(torch.rand((), generator=g)),
    )


# ---- the oracle: the formulas, written out (TRL 1.16 / Liger 0.8.5 / the papers), on materialized logits ----


def token_logps(h, w, b, labels, acc=None):
    """Per-token log-probs: the GEMM in the inputs' dtype, the softmax in fp32 (fp64 for fp64 inputs)."""
    acc = torch.float64 if h.dtype == torch.float64 else torch.float32
    logits = h @ w.T + (0 if b is None else b)
    logp = torch.log_softmax(logits.to(acc), -1)
    keep = labels != IGNORE
    lp = logp.gather(-1, labels.clamp(min=0)[..., None])[..., 0]
    return torch.where(keep, lp, 0), keep, logits.to(acc).mean(-1)


def oracle(kind, h, w, b, labels, acc, *, beta=0.1, ref=None, ref_logps=None, label_smoothing=0.0, gamma=0.5,
           nll_coef=None, nll_labels=None, preference=None, kl=None, kl_batch=None, desirable_weight=1.0,
           undesirable_weight=1.0):  # fmt: skip
    """(loss, metrics) from the formulas. ref: (hidden, weight, bias) of the reference model; ref_logps: its
    summed sequence log-probs; kl_batch: (kl_hidden, kl_labels, ref_kl_hidden or ref_kl_logps or None)."""
    acc = torch.float64 if h.dtype == torch.float64 else torch.float32
    lp, keep, mean_logit = token_logps(h, w, b, labels)
    n = keep.sum(-1).clamp(min=1).to(acc)
    S = lp.sum(-1)
    refS = torch.zeros_like(S)
    if ref is not None:
        refS = token_logps(*ref, labels, acc)[0].sum(-1).detach()
    elif ref_logps is not None:
        refS = ref_logps.to(acc)
    avg = kind in ("ipo", "simpo", "orpo")
    A, refA = (S / n, refS / n) if avg else (S, refS)
    eps, m = label_smoothing, {}
    if kind == "kto":
        z = torch.zeros((), dtype=acc)
        if kl is not None:
            z = torch.as_tensor(kl, dtype=acc)
        elif kl_batch is not None:
            kh, kls, kref = kl_batch
            ks = token_logps(kh, w, b, kls, acc)[0].sum(-1)
            if isinstance(kref, torch.Tensor) and kref.dim() == 1:
                ks = ks - kref.to(acc)
            elif kref is not None:
                ks = ks - token_logps(kref, ref[1], ref[2], kls, acc)[0].sum(-1)
            z = ks.mean().clamp(min=0).detach()
        lr = A - refA
        per = torch.where(
            preference,
            desirable_weight * (1 - torch.sigmoid(beta * (lr - z))),
            undesirable_weight * (1 - torch.sigmoid(beta * (z - lr))),
        )
        loss = per.mean()
        rew = (beta * lr).detach()
        for name, rows in (("chosen", preference), ("rejected", ~preference)):
            m[f"rewards/{name}"] = rew[rows].mean()
            m[f"logps/{name}"] = A.detach()[rows].mean()
            sel = keep & rows[:, None]
            m[f"logits/{name}"] = mean_logit[sel].mean()
        m["rewards/margins"] = m["rewards/chosen"] - m["rewards/rejected"]
        m["kl"] = z
        return loss, m
    c, r, rc, rr = A[:B], A[B:], refA[:B], refA[B:]
    d = (c - rc) - (r - rr)
    if kind == "sigmoid":
        per = -(1 - eps) * F.logsigmoid(beta * d) - eps * F.logsigmoid(-beta * d)
    elif kind == "robust":
        per = (-(1 - eps) * F.logsigmoid(beta * d) + eps * F.logsigmoid(-beta * d)) / (1 - 2 * eps)
    elif kind == "hinge":
        per = torch.relu(1 - beta * d)
    elif kind == "ipo":
        per = (d - 1 / (2 * beta)) ** 2
    elif kind in ("cpo", "simpo"):
        x = beta * (c - r) - (gamma if kind == "simpo" else 0.0)
        per = -(1 - eps) * F.logsigmoid(x) - eps * F.logsigmoid(-x)
    elif kind == "orpo":
        log_odds = (c - r) - (torch.log(1 - torch.exp(c)) - torch.log(1 - torch.exp(r)))
        per = -beta * F.logsigmoid(log_odds)
        m["log_odds_ratio"] = F.logsigmoid(log_odds).mean().detach()
        m["log_odds_chosen"] = log_odds.mean().detach()
    loss = per.mean()
    nll_coef = {"cpo": 1.0, "orpo": 1.0}.get(kind, 0.0) if nll_coef is None else nll_coef
    if nll_coef:
        nlp, nkeep, _ = token_logps(h[:B], w, b, labels[:B] if nll_labels is None else nll_labels, acc)
        nll = -nlp.sum() / nkeep.sum()
        loss = loss + nll_coef * nll
        m["nll_loss"] = nll.detach()
    dpo = kind in ("sigmoid", "ipo", "hinge", "robust")
    logged = (S if dpo else A).detach()
    rew = beta * (logged - refS if dpo else logged)
    m.update({
        "rewards/chosen": rew[:B].mean(), "rewards/rejected": rew[B:].mean(),
        "rewards/margins": (rew[:B] - rew[B:]).mean(), "rewards/accuracies": (rew[:B] > rew[B:]).to(acc).mean(),
        "logps/chosen": logged[:B].mean(), "logps/rejected": logged[B:].mean(),
        "logits/chosen": mean_logit[:B][keep[:B]].mean(), "logits/rejected": mean_logit[B:][keep[B:]].mean(),
    })  # fmt: skip
    return loss, m


# Each case: kind, its options, and how the reference / KL / NLL targets are given.
CASES = [
    ("sigmoid", dict(beta=0.1), "ref_hidden"),
    ("sigmoid", dict(beta=0.2, label_smoothing=0.1), None),
    ("sigmoid", dict(beta=0.1, nll_coef=0.3), "ref_logps"),
    ("ipo", dict(beta=0.5), "ref_logps"),
    ("hinge", dict(beta=0.1), "ref_hidden"),
    ("robust", dict(beta=0.1, label_smoothing=0.2), "ref_logps"),
    ("simpo", dict(beta=2.0, gamma=0.3, label_smoothing=0.1), None),
    ("simpo", dict(beta=2.0), None),
    ("cpo", dict(beta=0.1), None),
    ("cpo", dict(beta=0.1, nll_coef=0.5, label_smoothing=0.1), None),
    ("orpo", dict(beta=0.1), None),
    ("orpo", dict(beta=0.2), "nll_labels"),
    ("kto", dict(beta=0.1), "ref_hidden+kl_hidden"),
    ("kto", dict(beta=0.1, desirable_weight=1.3, undesirable_weight=0.7), "ref_logps+kl_logps"),
    ("kto", dict(beta=0.1), "ref_logps+kl"),
    ("kto", dict(beta=0.2), None),
]


def arguments(case, x, acc):
    """(rk keyword arguments, oracle keyword arguments) of a case, tensors for the rk side in fp32."""
    kind, opts, how = case
    how = how or ""
    rk_kw, or_kw = dict(kind=kind, **opts), dict(opts)
    if "gamma" in opts:
        or_kw["gamma"] = opts["gamma"]
    up = lambda t: None if t is None else t.to(acc)  # noqa: E731
    ref_logps = token_logps(x.ref_hidden.double(), x.ref_weight.double(), None, x.labels, torch.float64)[
        0
    ].sum(-1)
    if "ref_hidden" in how:
        rk_kw.update(ref_hidden=x.ref_hidden, ref_weight=x.ref_weight)
        or_kw["ref"] = (up(x.ref_hidden), up(x.ref_weight), None)
    if "ref_logps" in how:
        rk_kw["ref_logps"] = ref_logps.float()
        or_kw["ref_logps"] = ref_logps.float()
    if "nll_labels" in how:
        rk_kw["nll_labels"] = or_kw["nll_labels"] = x.nll_labels
    if kind == "kto":
        rk_kw["preference_labels"] = or_kw["preference"] = x.preference
    if "kl_hidden" in how:
        rk_kw.update(kl_hidden=x.kl_hidden, kl_labels=x.kl_labels, ref_kl_hidden=x.ref_kl_hidden)
        or_kw["kl_batch"] = (up(x.kl_hidden), x.kl_labels, up(x.ref_kl_hidden))
    if "kl_logps" in how:
        ref_kl = token_logps(
            x.ref_kl_hidden.double(), x.ref_weight.double(), None, x.kl_labels, torch.float64
        )
        ref_kl = ref_kl[0].sum(-1).float()
        rk_kw.update(kl_hidden=x.kl_hidden, kl_labels=x.kl_labels, ref_kl_logps=ref_kl)
        or_kw["kl_batch"] = (up(x.kl_hidden), x.kl_labels, ref_kl)
    if how.endswith("+kl"):
        rk_kw["kl"] = torch.tensor(0.37)
        or_kw["kl"] = 0.37
    return rk_kw, or_kw


def run_oracle(kind, x, or_kw, acc):
    h, w, b = (t.to(acc).requires_grad_() for t in (x.hidden, x.weight, x.bias))
    loss, m = oracle(kind, h, w, b, x.labels, acc, **or_kw)
    grads = torch.autograd.grad(x.grad_scale * loss, (h, w, b))
    return loss, m, grads


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{c[2]}-{'-'.join(c[1])}" for c in CASES])
def test_every_kind_against_the_float64_oracle(case):
    x = make_batch(hash(str(case)) % 1000)
    rk_kw, or_kw = arguments(case, x, torch.float32)
    h, w, b = (t.clone().requires_grad_() for t in (x.hidden, x.weight, x.bias))
    loss, metrics = rk.linear_preference_loss(h, w, x.labels, bias=b, **rk_kw)
    grads = torch.autograd.grad(x.grad_scale * loss, (h, w, b))
    same = run_oracle(case[0], x, or_kw, torch.float32)
    _, or64 = arguments(case, x, torch.float64)
    want = run_oracle(case[0], x, or64, torch.float64)
    assert loss.dtype == torch.float32
    assert_oracle("loss", loss, same[0], want[0])
    assert set(metrics) == set(want[1]), sorted(set(metrics) ^ set(want[1]))
    for k in metrics:
        assert not metrics[k].requires_grad
        assert_oracle(k, metrics[k], same[1][k], want[1][k])
    for name, g, s, r in zip(("d hidden", "d weight", "d bias"), grads, same[2], want[2], strict=True):
        assert_oracle(name, g, s, r)


@pytest.mark.parametrize("backend", cpu_kernel_backends())
def test_kernel_flavors(backend):
    """The composition on every kernel flavor of linear_logprobs (the C++ CPU kernel, Triton under the
    interpreter, the CUDA sources on the CPU), against the oracle."""
    case = CASES[0]
    x = make_batch(7)
    rk_kw, or_kw = arguments(case, x, torch.float32)
    h, w, b = (t.clone().requires_grad_() for t in (x.hidden, x.weight, x.bias))
    loss, _ = rk.linear_preference_loss(h, w, x.labels, bias=b, backend=backend, **rk_kw)
    grads = torch.autograd.grad(x.grad_scale * loss, (h, w, b))
    same = run_oracle(case[0], x, or_kw, torch.float32)
    _, or64 = arguments(case, x, torch.float64)
    want = run_oracle(case[0], x, or64, torch.float64)
    assert_oracle("loss", loss, same[0], want[0])
    for name, g, s, r in zip(("d hidden", "d weight", "d bias"), grads, same[2], want[2], strict=True):
        assert_oracle(name, g, s, r)


def test_bf16_inputs():
    """bf16 hidden states and heads: fp32 loss, bf16 gradients, against the oracle with a bf16 GEMM."""
    x = make_batch(11)
    for k in ("hidden", "weight", "bias", "ref_hidden", "ref_weight"):
        setattr(x, k, getattr(x, k).bfloat16())
    case = CASES[0]
    rk_kw, or_same = arguments(case, x, torch.bfloat16)
    h, w, b = (t.clone().requires_grad_() for t in (x.hidden, x.weight, x.bias))
    loss, metrics = rk.linear_preference_loss(h, w, x.labels, bias=b, **rk_kw)
    grads = torch.autograd.grad(x.grad_scale * loss, (h, w, b))
    assert loss.dtype == torch.float32 and grads[0].dtype == torch.bfloat16
    same = run_oracle(case[0], x, or_same, torch.bfloat16)
    _, or64 = arguments(case, x, torch.float64)
    want = run_oracle(case[0], x, or64, torch.float64)
    assert_oracle("loss", loss, same[0], want[0], dtype=torch.bfloat16)
    assert_oracle("logps/chosen", metrics["logps/chosen"], same[1]["logps/chosen"], want[1]["logps/chosen"],
                  dtype=torch.bfloat16)  # fmt: skip
    for name, g, s, r in zip(("d hidden", "d weight", "d bias"), grads, same[2], want[2], strict=True):
        assert_oracle(name, g, s, r)
