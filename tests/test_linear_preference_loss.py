"""linear_preference_loss: every kind against a float64 oracle written here from the formulas (materialized
logits, values, metrics and gradients with a random upstream gradient, under assert_oracle); against
Liger-Kernel 0.8.5's chunked losses and TRL 1.16's own loss code on the same inputs; that no [N, V] tensor is
allocated; bad inputs."""

from __future__ import annotations

import functools
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from oracle import assert_oracle, cpu_kernel_backends, drawn_on_cpu

import rlkernels as rk
from rlkernels.memory import cpu_peak_bytes

B, T, D, V = 4, 9, 32, 1271  # B pairs: 2B rows, chosen first
IGNORE = -100


@drawn_on_cpu
def make_batch(seed: int, *, bias: bool = True, rows: int = 2 * B):
    """fp32 inputs (the oracle upcasts them): policy and reference heads, labels with a prompt (1-3 tokens)
    and right padding (0-2 tokens) set to IGNORE, and KL completions for KTO."""
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


# ---- the oracle: the formulas written out (TRL 1.16 / Liger 0.8.5 / the papers), on materialized logits ----


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
           undesirable_weight=1.0, sizes=None):  # fmt: skip
    """(loss, metrics) from the formulas. ref: (hidden, weight, bias) of the reference model; ref_logps: its
    summed sequence log-probs; kl_batch: (kl_hidden, kl_labels, ref_kl_hidden or ref_kl_logps or None).

    sizes, a dict, receives each metric that differences sequence sums (the rewards, their margin, KTO's kl)
    computed over the sums' sizes instead (|S| = Σ_t |log p_t|, the log-probs being <= 0): what a rounding
    error of those sums scales with, where the metric itself may cancel to near 0 (assert_oracle's
    magnitude)."""
    sizes = {} if sizes is None else sizes
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
            ref_ks = torch.zeros_like(ks)
            if isinstance(kref, torch.Tensor) and kref.dim() == 1:
                ref_ks = kref.to(acc)
            elif kref is not None:
                ref_ks = token_logps(kref, ref[1], ref[2], kls, acc)[0].sum(-1)
            z = (ks - ref_ks).mean().clamp(min=0).detach()
            sizes["kl"] = float((ks.abs() + ref_ks.abs()).mean().detach())
        lr = A - refA
        per = torch.where(
            preference,
            desirable_weight * (1 - torch.sigmoid(beta * (lr - z))),
            undesirable_weight * (1 - torch.sigmoid(beta * (z - lr))),
        )
        loss = per.mean()
        rew = (beta * lr).detach()
        rew_size = beta * (A.abs() + refA.abs()).detach()
        for name, rows in (("chosen", preference), ("rejected", ~preference)):
            m[f"rewards/{name}"] = rew[rows].mean()
            sizes[f"rewards/{name}"] = float(rew_size[rows].mean())
            m[f"logps/{name}"] = A.detach()[rows].mean()
            sel = keep & rows[:, None]
            m[f"logits/{name}"] = mean_logit[sel].mean()
        m["rewards/margins"] = m["rewards/chosen"] - m["rewards/rejected"]
        sizes["rewards/margins"] = sizes["rewards/chosen"] + sizes["rewards/rejected"]
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
    rew_size = beta * (logged.abs() + refS.abs() if dpo else logged.abs())
    sizes["rewards/chosen"] = float(rew_size[:B].mean())
    sizes["rewards/rejected"] = float(rew_size[B:].mean())
    sizes["rewards/margins"] = float((rew_size[:B] + rew_size[B:]).mean())
    m.update({
        "rewards/chosen": rew[:B].mean(), "rewards/rejected": rew[B:].mean(),
        "rewards/margins": (rew[:B] - rew[B:]).mean(),
        "rewards/accuracies": (rew[:B] > rew[B:]).to(acc).mean(),
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


def run_oracle(kind, x, or_kw, acc, sizes=None):
    h, w, b = (t.to(acc).requires_grad_() for t in (x.hidden, x.weight, x.bias))
    loss, m = oracle(kind, h, w, b, x.labels, acc, **or_kw, sizes=sizes)
    grads = torch.autograd.grad(x.grad_scale * loss, (h, w, b))
    return loss, m, grads


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{c[2]}-{'-'.join(c[1])}" for c in CASES])
def test_every_kind_against_the_float64_oracle(case, seed):
    """Loss, metrics and gradients of every kind against the float64 oracle; the metrics that difference
    sequence sums with the error rule's atol taken relative to those sums' sizes (oracle's `sizes`)."""
    x = make_batch(seed)
    rk_kw, or_kw = arguments(case, x, torch.float32)
    h, w, b = (t.clone().requires_grad_() for t in (x.hidden, x.weight, x.bias))
    loss, metrics = rk.linear_preference_loss(h, w, x.labels, bias=b, **rk_kw)
    grads = torch.autograd.grad(x.grad_scale * loss, (h, w, b))
    same = run_oracle(case[0], x, or_kw, torch.float32)
    _, or64 = arguments(case, x, torch.float64)
    sizes = {}
    want = run_oracle(case[0], x, or64, torch.float64, sizes)
    assert loss.dtype == torch.float32
    assert_oracle("loss", loss, same[0], want[0])
    assert set(metrics) == set(want[1]), sorted(set(metrics) ^ set(want[1]))
    for k in metrics:
        assert not metrics[k].requires_grad
        assert_oracle(k, metrics[k], same[1][k], want[1][k], magnitude=sizes.get(k, 0.0))
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


# ---- Liger-Kernel 0.8.5's chunked losses on the same inputs ----


def liger_run(case, x):
    """(loss, grads, {metric: value}) from liger_kernel.chunked_loss in fp32 (compiled=False: the same math
    without torch.compile)."""
    lc = pytest.importorskip("liger_kernel.chunked_loss")
    kind, opts, how = case
    h, w, b = (t.clone().requires_grad_() for t in (x.hidden, x.weight, x.bias))
    beta = opts["beta"]
    ref = dict(ref_input=x.ref_hidden, ref_weight=x.ref_weight, ref_bias=None)
    if kind in ("sigmoid", "hinge", "robust"):
        nll = opts.get("nll_coef", 0.0)
        fn = lc.LigerFusedLinearDPOLoss(
            beta=beta, loss_type=kind, label_smoothing=opts.get("label_smoothing", 0.0), compiled=False,
            use_ref_model=True, compute_nll_loss=nll != 0, alpha=nll, average_log_prob=False,
        )  # fmt: skip
        loss, aux = fn(w, h, x.labels, b, **ref)
        metrics = {
            "rewards/chosen": aux[5].mean(),
            "rewards/rejected": aux[6].mean(),
            "logps/chosen": aux[0].mean(),
        }
    elif kind == "simpo":
        fn = lc.LigerFusedLinearSimPOLoss(
            beta=beta, gamma=opts["gamma"], label_smoothing=opts.get("label_smoothing", 0.0),
            compute_nll_loss=False, compiled=False,
        )  # fmt: skip
        loss, aux = fn(w, h, x.labels, b)
        metrics = {
            "rewards/chosen": aux[5].mean(),
            "rewards/rejected": aux[6].mean(),
            "logps/chosen": aux[0].mean(),
        }
    elif kind == "cpo":
        fn = lc.LigerFusedLinearCPOLoss(
            beta=beta, alpha=opts.get("nll_coef", 1.0), label_smoothing=opts.get("label_smoothing", 0.0),
            compute_nll_loss=True, compiled=False, average_log_prob=False,
        )  # fmt: skip
        loss, aux = fn(w, h, x.labels, b)
        metrics = {"rewards/chosen": aux[5].mean(), "nll_loss": aux[4], "logps/chosen": aux[0].mean()}
    elif kind == "orpo":
        fn = lc.LigerFusedLinearORPOLoss(beta=beta, compute_nll_loss=True, compiled=False)
        # Liger's nll_target is [2B, T], of which it reads the chosen half: ours is that half.
        full = torch.cat([x.nll_labels, x.labels[B:]]) if how == "nll_labels" else None
        loss, aux = fn(w, h, x.labels, b, nll_target=full)
        metrics = {"nll_loss": aux[4], "log_odds_ratio": aux[7], "log_odds_chosen": aux[8]}
    elif kind == "kto":
        fn = lc.LigerFusedLinearKTOLoss(beta=beta, use_ref_model=True, average_log_prob=False, compiled=False)
        loss, aux = fn(h, w, x.labels, b, x.preference, **ref, kl=torch.tensor(0.37))
        n = x.preference.sum()
        metrics = {"rewards/chosen": aux[4] / n, "rewards/rejected": aux[5] / (len(x.preference) - n)}
    grads = torch.autograd.grad(x.grad_scale * loss, (h, w, b))
    return loss, grads, metrics


LIGER_CASES = [
    ("sigmoid", dict(beta=0.1), "ref_hidden"),
    ("sigmoid", dict(beta=0.1, nll_coef=0.3), "ref_hidden"),
    ("hinge", dict(beta=0.1), "ref_hidden"),
    ("robust", dict(beta=0.1, label_smoothing=0.2), "ref_hidden"),
    ("simpo", dict(beta=2.0, gamma=0.3, label_smoothing=0.1), None),
    ("cpo", dict(beta=0.1, nll_coef=0.5, label_smoothing=0.1), None),
    ("orpo", dict(beta=0.1), None),
    ("orpo", dict(beta=0.2), "nll_labels"),
    ("kto", dict(beta=0.1), "ref_hidden+kl"),
]


@pytest.mark.parametrize("case", LIGER_CASES, ids=[f"{c[0]}-{c[2]}-{'-'.join(c[1])}" for c in LIGER_CASES])
def test_against_liger_chunked_losses(case):
    """Liger's fp32 loss, gradients and metrics agree with ours to fp32 rounding: each one's error against
    the float64 oracle is within twice the other's (plus the oracle's few-ulp slack). A change of Liger's
    formulas or conventions (averaging, NLL normalization, which half is chosen) fails this test."""
    x = make_batch(23, bias=True)
    rk_kw, _ = arguments(case, x, torch.float32)
    if case[0] == "kto":  # Liger takes the reference model and a given KL point
        rk_kw.pop("ref_logps", None)
        rk_kw.update(ref_hidden=x.ref_hidden, ref_weight=x.ref_weight)
    h, w, b = (t.clone().requires_grad_() for t in (x.hidden, x.weight, x.bias))
    loss, metrics = rk.linear_preference_loss(h, w, x.labels, bias=b, **rk_kw)
    grads = torch.autograd.grad(x.grad_scale * loss, (h, w, b))
    l_loss, l_grads, l_metrics = liger_run(case, x)
    or_case = (case[0], case[1], case[2].replace("+kl", "") + "+kl" if case[0] == "kto" else case[2])
    _, or64 = arguments(or_case, x, torch.float64)
    want = run_oracle(case[0], x, or64, torch.float64)
    assert_oracle("loss", loss, l_loss, want[0])
    assert_oracle("liger loss", l_loss, loss, want[0])
    for k, lv in l_metrics.items():
        assert_oracle(k, metrics[k], lv, want[1][k])
        assert_oracle(f"liger {k}", lv, metrics[k], want[1][k])
    for name, g, lg, r in zip(("d hidden", "d weight", "d bias"), grads, l_grads, want[2], strict=True):
        assert_oracle(name, g, lg, r)
        assert_oracle(f"liger {name}", lg, g, r)


# ---- TRL 1.16's own loss code, called with stand-ins for the trainer and the model ----


class _Accelerator:  # one process: gathers are the identity
    device = torch.device("cpu")

    def gather_for_metrics(self, x):
        return x

    gather = gather_for_metrics


def _trainer(**attrs):
    return SimpleNamespace(
        model=SimpleNamespace(training=True), accelerator=_Accelerator(), aux_loss_enabled=False,
        precompute_ref_logps=True, _metrics=defaultdict(lambda: defaultdict(list)), _total_train_tokens=0,
        _tp_size=1, args=SimpleNamespace(), **attrs,
    )  # fmt: skip


def _trl_batch(h, w, b, labels):
    """The input_ids and completion_mask TRL builds: one more position, labels = input_ids[:, 1:] on the
    completion (the model stand-in below reads the labels back)."""
    R = labels.shape[0]
    input_ids = torch.zeros(R, T + 1, dtype=torch.long)
    input_ids[:, 1:] = labels.clamp(min=0)
    completion = torch.zeros(R, T + 1, dtype=torch.long)
    completion[:, 1:] = labels != IGNORE
    return input_ids, completion


def _fused_model(batches):
    """model(input_ids=..., labels=..., fused_lm_head=True) for each registered input_ids tensor."""

    def model(*, input_ids, labels, fused_lm_head, **_):
        assert fused_lm_head
        h, w, b, want = batches[id(input_ids)]
        assert torch.equal(labels[:, 1:], want)
        lp, keep, mean_logit = token_logps(h, w, b, want)
        zeros = torch.zeros_like(lp)
        return SimpleNamespace(
            log_probs=lp, entropy=zeros, mean_logits=torch.where(keep, mean_logit, 0).detach(),
            is_top1=zeros.bool(),
        )  # fmt: skip

    return model


def _float64(x):
    return [t.double().requires_grad_() for t in (x.hidden, x.weight, x.bias)]


@pytest.mark.parametrize("kind,eps", [("sigmoid", 0.0), ("ipo", 0.0), ("hinge", 0.0), ("robust", 0.2)])
def test_against_trl_dpo_trainer(kind, eps):
    """TRL 1.16 DPOTrainer._compute_loss (precomputed reference log-probs, one process) in float64 on the same
    log-probs: loss, gradients and every metric we share, to float64 rounding."""
    dpo = pytest.importorskip("trl.trainer.dpo_trainer")
    x = make_batch(5)
    ref = token_logps(x.ref_hidden.double(), x.ref_weight.double(), None, x.labels)[0].sum(-1)
    h, w, b = _float64(x)
    input_ids, completion = _trl_batch(h, w, b, x.labels)
    trainer = _trainer(ld_alpha=None, f_divergence_type="reverse_kl", loss_types=[kind], loss_weights=[1.0],
                       beta=0.3, label_smoothing=eps, use_weighting=False)  # fmt: skip
    inputs = dict(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), completion_mask=completion,
                  ref_chosen_logps=ref[:B], ref_rejected_logps=ref[B:])  # fmt: skip
    model = _fused_model({id(input_ids): (h, w, b, x.labels)})
    want = dpo.DPOTrainer._compute_loss(trainer, model, inputs, False)
    want_grads = torch.autograd.grad(want, (h, w, b))
    want_metrics = {k: v[-1] for k, v in trainer._metrics["train"].items()}
    h, w, b = _float64(x)
    loss, metrics = rk.linear_preference_loss(
        h, w, x.labels, bias=b, kind=kind, beta=0.3, label_smoothing=eps, ref_logps=ref
    )
    torch.testing.assert_close(loss, want)
    for g, wg in zip(torch.autograd.grad(loss, (h, w, b)), want_grads, strict=True):
        torch.testing.assert_close(g, wg)
    shared = set(metrics) & set(want_metrics)
    assert set(metrics) - shared == set(), "a metric TRL does not log under that name"
    for k in shared:
        assert metrics[k].item() == pytest.approx(want_metrics[k], rel=1e-12, abs=1e-12), k


def test_against_trl_kto_trainer():
    """TRL 1.16 KTOTrainer._compute_loss with its KL completions (calculate_KL=True, precomputed reference
    log-probs, one process) in float64: loss, gradients, metrics."""
    kto = pytest.importorskip("trl.trainer.kto_trainer")
    x = make_batch(9)
    ref = token_logps(x.ref_hidden.double(), x.ref_weight.double(), None, x.labels)[0].sum(-1)
    ref_kl = token_logps(x.ref_kl_hidden.double(), x.ref_weight.double(), None, x.kl_labels)[0].sum(-1)
    h, w, b = _float64(x)
    input_ids, completion = _trl_batch(h, w, b, x.labels)
    kl_ids, kl_completion = _trl_batch(h, w, b, x.kl_labels)
    batch = dict(
        input_ids=input_ids, attention_mask=torch.ones_like(input_ids), completion_mask=completion,
        KL_input_ids=kl_ids, KL_attention_mask=torch.ones_like(kl_ids), KL_completion_mask=kl_completion,
        label=x.preference, ref_logps=ref, ref_KL_logps=ref_kl,
    )  # fmt: skip
    kl_h = x.kl_hidden.double()
    model = _fused_model({id(input_ids): (h, w, b, x.labels), id(kl_ids): (kl_h, w, b, x.kl_labels)})
    trainer = _trainer(
        calculate_KL=True, loss_type="kto", beta=0.2, desirable_weight=1.3, undesirable_weight=0.7
    )
    trainer._compute_kl_logps = functools.partial(kto.KTOTrainer._compute_kl_logps, trainer)
    want = kto.KTOTrainer._compute_loss(trainer, model, batch, False)
    want_grads = torch.autograd.grad(want, (h, w, b))
    want_metrics = {k: v[-1] for k, v in trainer._metrics["train"].items()}
    h, w, b = _float64(x)
    loss, metrics = rk.linear_preference_loss(
        h, w, x.labels, bias=b, kind="kto", beta=0.2, desirable_weight=1.3, undesirable_weight=0.7,
        preference_labels=x.preference, ref_logps=ref, kl_hidden=kl_h, kl_labels=x.kl_labels,
        ref_kl_logps=ref_kl,
    )  # fmt: skip
    torch.testing.assert_close(loss, want)
    for g, wg in zip(torch.autograd.grad(loss, (h, w, b)), want_grads, strict=True):
        torch.testing.assert_close(g, wg)
    assert set(metrics) <= set(want_metrics)
    for k in metrics:
        assert metrics[k].item() == pytest.approx(want_metrics[k], rel=1e-12, abs=1e-12), k


def _trl_logps(trainer_cls, h, w, b, labels, average):
    """TRL's get_batch_logps on logits with TRL's shift (a leading position whose label is ignored)."""
    logits = h @ w.T + b
    logits = torch.cat([logits, logits[:, :1]], 1)  # the unused last position
    full = torch.cat([torch.full((labels.shape[0], 1), IGNORE), labels], 1)
    return trainer_cls.get_batch_logps(logits, full, average_log_prob=average), logits


@pytest.mark.parametrize("loss_type,eps", [("sigmoid", 0.1), ("simpo", 0.0)])
def test_against_trl_cpo_trainer(loss_type, eps):
    """TRL 1.16 CPOTrainer.cpo_loss and get_batch_logps (average for simpo), with its NLL (cross-entropy mean
    over the chosen rows) and its total `losses.mean() + cpo_alpha * nll_loss`, in float64."""
    cpo = pytest.importorskip("trl.experimental.cpo.cpo_trainer")
    x = make_batch(13)
    h, w, b = _float64(x)
    alpha = 0.5 if loss_type == "sigmoid" else 0.0
    trainer = SimpleNamespace(alpha=0.0, loss_type=loss_type, simpo_gamma=0.4, beta=1.5, label_smoothing=eps,
                              accelerator=_Accelerator())  # fmt: skip
    logps, logits = _trl_logps(cpo.CPOTrainer, h, w, b, x.labels, loss_type == "simpo")
    losses, chosen_r, rejected_r = cpo.CPOTrainer.cpo_loss(trainer, logps[:B], logps[B:])
    nll = F.cross_entropy(
        logits[:B, :-1].reshape(-1, V), x.labels[:B].reshape(-1)
    )  # TRL's cross_entropy_loss
    want = losses.mean() + alpha * nll
    want_grads = torch.autograd.grad(want, (h, w, b))
    h, w, b = _float64(x)
    kind, opts = ("cpo", dict(nll_coef=alpha)) if loss_type == "sigmoid" else ("simpo", dict(gamma=0.4))
    loss, metrics = rk.linear_preference_loss(h, w, x.labels, bias=b, kind=kind, beta=1.5,
                                              label_smoothing=eps, **opts)  # fmt: skip
    torch.testing.assert_close(loss, want)
    for g, wg in zip(torch.autograd.grad(loss, (h, w, b)), want_grads, strict=True):
        torch.testing.assert_close(g, wg)
    torch.testing.assert_close(metrics["rewards/chosen"], chosen_r.mean())
    torch.testing.assert_close(metrics["rewards/accuracies"], (chosen_r > rejected_r).double().mean())
    if alpha:
        torch.testing.assert_close(metrics["nll_loss"], nll.detach())


def test_against_trl_orpo_trainer():
    """TRL 1.16 ORPOTrainer.odds_ratio_loss on get_batch_logps(average_log_prob=True), NLL over prompt and
    completion of the chosen rows (nll_labels) and the total `nll_loss - losses.mean()`, in float64."""
    orpo = pytest.importorskip("trl.experimental.orpo.orpo_trainer")
    x = make_batch(17)
    h, w, b = _float64(x)
    trainer = SimpleNamespace(beta=0.25, accelerator=_Accelerator())
    logps, logits = _trl_logps(orpo.ORPOTrainer, h, w, b, x.labels, True)
    losses, chosen_r, _, log_odds_ratio, log_odds_chosen = orpo.ORPOTrainer.odds_ratio_loss(
        trainer, logps[:B], logps[B:]
    )
    nll = F.cross_entropy(logits[:B, :-1].reshape(-1, V), x.nll_labels.reshape(-1))
    want = nll - losses.mean()
    want_grads = torch.autograd.grad(want, (h, w, b))
    h, w, b = _float64(x)
    loss, metrics = rk.linear_preference_loss(h, w, x.labels, bias=b, kind="orpo", beta=0.25,
                                              nll_labels=x.nll_labels)  # fmt: skip
    # TRL computes the odds ratio in fp32 (odds_ratio_loss casts the log-probs to float): fp32 tolerances.
    fp32 = dict(rtol=1.3e-6, atol=1e-5)
    torch.testing.assert_close(loss, want, **fp32)
    for g, wg in zip(torch.autograd.grad(loss, (h, w, b)), want_grads, strict=True):
        torch.testing.assert_close(g, wg, **fp32)
    for k, t in (("log_odds_ratio", log_odds_ratio), ("log_odds_chosen", log_odds_chosen), ("rewards/chosen",
                 chosen_r.mean()), ("nll_loss", nll)):  # fmt: skip
        torch.testing.assert_close(metrics[k], t.detach().double(), **fp32)


# ---- memory, equivalences, bad inputs ----


def test_cpu_peak_memory_excludes_logits():
    """Forward + backward of a DPO loss with a reference model over 2 x 2 sequences x 256 tokens, V=32000:
    the peak allocation, less the gradients of hidden and weight it must hold (d weight alone is V·D·4), stays
    under 10% of the N·V·4 bytes of one fp32 logits tensor (what eager TRL, or Liger with chunk_size=2B,
    makes at least)."""
    R, L, d, vocab = 4, 256, 64, 32000
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(R, L, d, generator=g).requires_grad_()
    weight = (torch.randn(vocab, d, generator=g) / 8).requires_grad_()
    labels = torch.randint(0, vocab, (R, L), generator=g)
    labels[:, :16] = IGNORE
    ref_hidden, ref_weight = torch.randn(R, L, d, generator=g), torch.randn(vocab, d, generator=g) / 8

    def step():
        loss, _ = rk.linear_preference_loss(hidden, weight, labels, kind="sigmoid", ref_hidden=ref_hidden,
                                            ref_weight=ref_weight)  # fmt: skip
        loss.backward()

    peak = cpu_peak_bytes(step) - (hidden.numel() + weight.numel()) * 4
    assert peak < 0.10 * R * L * vocab * 4, f"peak working memory {peak / 2**20:.1f} MiB"
    assert hidden.grad is not None and weight.grad is not None


def test_equivalent_spellings():
    """gamma_beta_ratio = gamma / beta; a reference given as hidden states or as its summed log-probs; the NLL
    targets in one pass with the preference targets; TRL's layout (swapping the halves flips the margin)."""
    x = make_batch(3)
    args = (x.hidden, x.weight, x.labels)
    a = rk.linear_preference_loss(*args, kind="simpo", beta=2.0, gamma=0.6)
    b = rk.linear_preference_loss(*args, kind="simpo", beta=2.0, gamma_beta_ratio=0.3)
    torch.testing.assert_close(a[0], b[0])
    ref = token_logps(x.ref_hidden, x.ref_weight, None, x.labels)[0].sum(-1)
    a = rk.linear_preference_loss(*args, kind="robust", label_smoothing=0.1, ref_logps=ref)
    b = rk.linear_preference_loss(*args, kind="robust", label_smoothing=0.1, ref_hidden=x.ref_hidden,
                                  ref_weight=x.ref_weight)  # fmt: skip
    torch.testing.assert_close(a[0], b[0])
    swapped = torch.cat([x.hidden[B:], x.hidden[:B]]), x.weight, torch.cat([x.labels[B:], x.labels[:B]])
    s = rk.linear_preference_loss(*swapped, kind="robust", label_smoothing=0.1, ref_logps=ref.roll(B))
    torch.testing.assert_close(s[1]["rewards/margins"], -a[1]["rewards/margins"])
    labels_only = rk.linear_preference_loss(*args, kind="cpo")
    same_targets = rk.linear_preference_loss(*args, kind="cpo", nll_labels=x.labels[:B])
    torch.testing.assert_close(labels_only[0], same_targets[0])


def _bad_kwargs():
    x = make_batch(1)
    pl = x.preference
    return [
        (dict(kind="dpo"), ValueError, "kind must be one of"),
        (dict(beta=0.0), ValueError, "beta must be > 0"),
        (dict(kind="hinge", label_smoothing=0.1), ValueError, "label_smoothing is not used"),
        (dict(kind="simpo", label_smoothing=0.5), ValueError, r"label_smoothing must be in \[0, 0.5\)"),
        (dict(kind="sigmoid", gamma=0.5), ValueError, "gamma is SimPO's margin"),
        (dict(kind="simpo", gamma=0.5, gamma_beta_ratio=1.0), ValueError, "not both"),
        (dict(nll_coef=-1.0), ValueError, "nll_coef must be >= 0"),
        (dict(desirable_weight=2.0), ValueError, "desirable_weight is KTO's"),
        (dict(kind="kto", preference_labels=pl, nll_coef=1.0), ValueError, "nll_coef is not used"),
        (dict(kind="kto"), ValueError, "needs preference_labels"),
        (dict(kind="kto", preference_labels=pl[:3]), ValueError, r"preference_labels has shape \(3,\)"),
        (dict(kind="kto", preference_labels=pl.float()), TypeError, "preference_labels must be a bool"),
        (dict(kind="kto", preference_labels=pl.long() * 2), ValueError, "must hold only 0 and 1"),
        (
            dict(kind="kto", preference_labels=pl, kl=0.1, kl_hidden=x.kl_hidden),
            ValueError,
            "pass kl or kl_hidden",
        ),
        (
            dict(kind="kto", preference_labels=pl, kl_hidden=x.kl_hidden),
            ValueError,
            "kl_hidden needs kl_labels",
        ),
        (dict(kind="kto", preference_labels=pl, kl_labels=x.kl_labels), ValueError, "without kl_hidden"),
        (dict(kind="kto", preference_labels=pl, kl=torch.zeros(2)), ValueError, "kl must be 0-D"),
        (
            dict(
                kind="kto",
                preference_labels=pl,
                ref_logps=torch.zeros(8),
                kl_hidden=x.kl_hidden,
                kl_labels=x.kl_labels,
            ),
            ValueError,
            "takes ref_kl_logps",
        ),  # fmt: skip
        (dict(preference_labels=pl), ValueError, "preference_labels is KTO's"),
        (dict(kind="orpo", ref_logps=torch.zeros(8)), ValueError, "takes no reference model"),
        (dict(ref_logps=torch.zeros(7)), ValueError, r"ref_logps has shape \(7,\)"),
        (
            dict(ref_logps=torch.zeros(8), ref_hidden=x.ref_hidden, ref_weight=x.ref_weight),
            ValueError,
            "not both",
        ),
        (dict(ref_hidden=x.ref_hidden), ValueError, "ref_hidden needs ref_weight"),
        (dict(ref_weight=x.ref_weight), ValueError, "ref_weight is given without ref_hidden"),
        (dict(ref_hidden=x.ref_hidden, ref_weight=x.ref_weight[:7]), ValueError, "ref_weight must be"),
        (dict(ref_hidden=x.ref_hidden[:, :4], ref_weight=x.ref_weight), ValueError, "ref_hidden has shape"),
        (dict(nll_labels=x.nll_labels[:2]), ValueError, r"nll_labels has shape \(2, 9\)"),
        (dict(nll_labels=x.nll_labels.float()), TypeError, "nll_labels must be an int32 or int64"),
        (dict(nll_labels=(x.nll_labels + 1) % V), ValueError, "nll_labels must equal labels"),
        (dict(hidden=x.hidden[:7], labels=x.labels[:7]), ValueError, "must be 2B > 0"),
        (dict(hidden=x.hidden[0]), ValueError, "hidden must be 3-D"),
        (dict(hidden=x.hidden.long()), TypeError, "hidden must be float32"),
        (dict(weight=x.weight.T), ValueError, "weight looks transposed"),
        (dict(labels=x.labels[:, :5]), ValueError, r"labels has shape \(8, 5\)"),
        (dict(labels=x.labels.float()), TypeError, "labels must be an int32 or int64"),
        (dict(labels=x.labels.clamp(max=V - 1) + 1), ValueError, "labels must lie in"),
        (dict(temperature=torch.ones(3)), ValueError, r"temperature has shape \(3,\)"),
        (dict(ignore_index=-100.0), TypeError, "ignore_index must be an int"),
        (dict(label_smooting=0.1), TypeError, r"unknown option\(s\) \['label_smooting'\]"),
        (dict(backend="gpu"), ValueError, "backend"),
    ]


@pytest.mark.parametrize("i", range(len(_bad_kwargs())))
def test_bad_inputs(i):
    kwargs, exc, match = _bad_kwargs()[i]
    x = make_batch(1)
    args = dict(hidden=x.hidden, weight=x.weight, labels=x.labels)
    args.update(kwargs)
    with pytest.raises(exc, match=match):
        rk.linear_preference_loss(**args)


def test_positional_options_are_refused():
    x = make_batch(1)
    with pytest.raises(TypeError, match="keyword-only"):
        rk.linear_preference_loss(x.hidden, x.weight, x.labels, "ipo")
