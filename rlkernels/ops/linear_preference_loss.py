"""linear_preference_loss: DPO-family, SimPO, CPO, ORPO and KTO losses straight from hidden states.

The composition `sequence loss(Σ_t linear_logprobs(...))`: one fused log-prob pass over the tokens that
count (labels != ignore_index; prompt and padding rows are dropped before the GEMMs), summed per sequence,
then the [B]-sized math of rlkernels/reference/preference.py (whose DPO kinds are rk.dpo_loss's
`dpo_per_pair`). No [N, V] tensor is made: the log-prob pass is linear_logprobs, whose backward recomputes
the logits in chunks (4 GEMM-equivalents with a trainable head, 2 with a frozen one). A sweep that forms
the gradients in the forward (as linear_policy_loss) would save nothing here: a token's gradient needs its
whole sequence's log-prob first, so it costs the same 4. The reference model's log-probs (and KTO's KL
completions) take a no-grad forward pass: 1 GEMM each.

Layout (TRL's concatenated forward, Liger's chunked losses): for the paired kinds the batch holds 2B
sequences, rows [0, B) the chosen completions and rows [B, 2B) the rejected ones of the same prompts, in the
same order; KTO's batch holds B unpaired sequences with a desirable / undesirable flag each.
"""

from __future__ import annotations

import torch

from rlkernels import _validate as v
from rlkernels._dtypes import acc_dtype
from rlkernels.ops.logprobs import linear_logprobs
from rlkernels.reference.dpo import DPO_KINDS
from rlkernels.reference.preference import (
    NO_REFERENCE_KINDS,
    PreferenceOptions,
    kto_loss,
    paired_loss,
    sequence_logps,
)

OP = "linear_preference_loss"
_KTO_ONLY = ("preference_labels", "kl", "kl_hidden", "kl_labels", "ref_kl_hidden", "ref_kl_logps")


@v.keyword_options
def linear_preference_loss(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    *,
    kind: str = "sigmoid",
    beta: float = 0.1,
    bias: torch.Tensor | None = None,
    ref_logps: torch.Tensor | None = None,
    ref_hidden: torch.Tensor | None = None,
    ref_weight: torch.Tensor | None = None,
    ref_bias: torch.Tensor | None = None,
    nll_labels: torch.Tensor | None = None,
    preference_labels: torch.Tensor | None = None,
    kl: float | torch.Tensor | None = None,
    kl_hidden: torch.Tensor | None = None,
    kl_labels: torch.Tensor | None = None,
    ref_kl_hidden: torch.Tensor | None = None,
    ref_kl_logps: torch.Tensor | None = None,
    temperature: float | torch.Tensor = 1.0,
    softcap: float | None = None,
    ignore_index: int = -100,
    chunk_size: int | None = None,
    backend: str = "auto",
    **options,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """A preference loss from the policy's final hidden states and LM head, never materializing the [N, V]
    logits (docs/semantics.md, "Preference losses from hidden states"). Semantics pinned to TRL 1.16.0
    (DPOTrainer, experimental CPOTrainer / ORPOTrainer, KTOTrainer) and Liger-Kernel 0.8.5
    (liger_kernel.chunked_loss).

    Args:
        hidden: [R, T, D] float32/bfloat16/float16/float64, the policy's final hidden states (shifted: row t
            predicts labels[:, t]). Paired kinds: R = 2B, rows [0, B) the chosen completions, rows [B, 2B)
            the rejected ones of the same prompts in the same order. kind="kto": R unpaired sequences.
        weight: [V, D] same dtype, the LM head (lm_head.weight). bias: [V] or None.
        labels: [R, T] int32/int64 in [0, V), `ignore_index` on prompt and padding tokens: the completion
            tokens whose log-probs are summed into each sequence's log-prob (averaged for ipo, simpo, orpo).
        kind: "sigmoid" | "ipo" | "hinge" | "robust" (the DPO family, rk.dpo_loss's math) | "simpo" | "cpo" |
            "orpo" (no reference model) | "kto" (unpaired). beta: > 0.
        ref_logps: [R] float, the reference model's sequence log-probs summed over the same tokens (TRL's
            precomputed ref_chosen_logps then ref_rejected_logps), treated as constants; or
        ref_hidden, ref_weight, ref_bias: the reference model's [R, T, D_ref] hidden states, [V, D_ref] head
            and [V] bias, whose log-probs are computed here without gradient (1 GEMM, no [N, V]). Neither:
            reference-free (reference log-probs 0). The no-reference kinds take neither.
        nll_labels: [B, T] int or None (paired kinds): the chosen rows' targets of the NLL term (Liger's
            nll_target; TRL's ORPO takes the NLL over prompt and completion), equal to labels wherever both
            are not ignore_index. None: labels' chosen rows. (Liger's nll_target is [2B, T], of which it
            reads rows [0, B): pass those.)
        preference_labels: [R] bool (or integer 0/1), kind="kto" only and required: True for desirable.
        kl: KTO's KL reference point z given as a number or 0-dim tensor (used as given, detached: Liger's
            `kl`); or kl_hidden [R', T', D] and kl_labels [R', T'], the policy's hidden states of the
            mismatched KL completions (TRL's KL_input_ids), with ref_kl_hidden [R', T', D_ref] (when the
            reference is ref_hidden) or ref_kl_logps [R'] (when it is ref_logps): z = max(0, mean(KL logps -
            reference KL logps)), without gradient, as TRL 1.16 on one process (under data parallelism TRL
            means over all ranks first: compute z yourself and pass kl=). Neither: z = 0 (TRL's
            calculate_KL=False).
        temperature, softcap, ignore_index, chunk_size, backend: as rk.linear_logprobs (temperature a float
            or an [R, T] tensor; the reference and KL passes use them too).
        **options: the rest of PreferenceOptions (rlkernels/reference/preference.py): label_smoothing,
            gamma or gamma_beta_ratio (simpo), nll_coef, desirable_weight, undesirable_weight (kto).

    Returns:
        (loss, metrics): the 0-dim loss (fp32; fp64 for fp64 inputs), differentiable in hidden, weight and
        bias, and detached 0-dim metrics under TRL's names. Paired kinds: "rewards/chosen",
        "rewards/rejected", "rewards/margins", "rewards/accuracies", "logps/chosen", "logps/rejected" (batch
        means; the DPO kinds' rewards β·(logp - ref_logp) and logps from the summed log-probs, as
        DPOTrainer logs them, the others' from the log-probs their loss takes, as CPOTrainer / ORPOTrainer),
        "nll_loss" when nll_coef != 0, "log_odds_ratio" and "log_odds_chosen" for orpo. kto: "kl",
        "rewards/chosen", "rewards/rejected", "rewards/margins", "logps/chosen", "logps/rejected" (means over
        the desirable / undesirable sequences; NaN where there are none, where TRL logs nothing). Without
        softcap also "logits/chosen", "logits/rejected": the mean over the completion tokens of each
        token's vocabulary-mean logit (TRL 1.16's mean_logits), from h·ΣW, no [N, V].
    """
    opts = _options(kind, beta, options)
    acc = acc_dtype(hidden.dtype) if isinstance(hidden, torch.Tensor) else torch.float32
    tensors = dict(
        ref_logps=ref_logps, ref_hidden=ref_hidden, ref_weight=ref_weight, ref_bias=ref_bias,
        nll_labels=nll_labels, preference_labels=preference_labels, kl=kl, kl_hidden=kl_hidden,
        kl_labels=kl_labels, ref_kl_hidden=ref_kl_hidden, ref_kl_logps=ref_kl_logps,
    )  # fmt: skip
    _check_policy(hidden, weight, labels, bias, opts, ignore_index)
    R, T, _ = hidden.shape
    if opts.kind == "kto":
        _check_kto(tensors, R, hidden, weight)
    else:
        given = [name for name in _KTO_ONLY if tensors[name] is not None]
        if given:
            raise ValueError(f"{OP}: {given[0]} is KTO's (unpaired data), not used by kind={opts.kind!r}")
        if nll_labels is not None:
            v.check_index(OP, nll_labels, "nll_labels")
            v.check_shape(OP, nll_labels, "nll_labels", (R // 2, T), "the chosen rows of labels")
    _check_reference(tensors, opts, R, T, weight)
    if isinstance(temperature, torch.Tensor):
        v.check_shape(OP, v.check_float(OP, temperature, "temperature"), "temperature", (R, T), "labels")
        if kl_hidden is not None:
            raise ValueError(
                f"{OP}: a per-token temperature tensor does not apply to kl_hidden; pass a float"
            )
    device = v.check_same_device(
        OP, hidden=hidden, weight=weight, labels=labels, bias=bias,
        **{k: t for k, t in tensors.items() if isinstance(t, torch.Tensor)},
    )  # fmt: skip
    common = dict(temperature=temperature, softcap=softcap, ignore_index=ignore_index, chunk_size=chunk_size,
                  backend=backend)  # fmt: skip

    keep = labels != ignore_index  # the completion tokens of the preference term
    counts = keep.sum(-1)
    targets = labels
    if nll_labels is not None:  # one pass: the NLL's extra (prompt) tokens join the chosen rows
        B = R // 2
        both = keep[:B] & (nll_labels != ignore_index)
        _check_agree(nll_labels, labels[:B], both)
        targets = torch.cat([torch.where(keep[:B], labels[:B], nll_labels), labels[B:]])
    logp = _token_logps(hidden, weight, bias, targets, common)
    sums = torch.where(keep, logp, 0).sum(-1)
    seq = sequence_logps(sums, counts, opts.kind)
    with torch.no_grad():
        ref_sums = _reference_sums(tensors, labels, common, acc, device)
    ref_seq = None if ref_sums is None else sequence_logps(ref_sums, counts, opts.kind)
    metrics = {}
    if opts.kind == "kto":
        desirable = preference_labels.bool()
        z = _kl_point(tensors, weight, bias, common, acc, device)
        logratios = seq if ref_seq is None else seq - ref_seq
        loss = kto_loss(logratios, desirable, z, opts).mean()
        metrics["kl"] = z
        rewards = opts.beta * logratios.detach()
        for name, rows in (("chosen", desirable), ("rejected", ~desirable)):
            n = rows.sum().to(acc)  # 0 -> NaN, where TRL logs nothing
            metrics[f"rewards/{name}"] = torch.where(rows, rewards, 0).sum() / n
            metrics[f"logps/{name}"] = torch.where(rows, seq.detach(), 0).sum() / n
        metrics["rewards/margins"] = metrics["rewards/chosen"] - metrics["rewards/rejected"]
        groups = (desirable, ~desirable)
    else:
        B = R // 2
        c, r = seq[:B], seq[B:]
        ref_c, ref_r = (None, None) if ref_seq is None else (ref_seq[:B], ref_seq[B:])
        per_pair, extra = paired_loss(c, r, ref_c, ref_r, opts)
        loss = per_pair.mean()
        if opts.nll_coef != 0:
            nll_keep = keep[:B] if nll_labels is None else nll_labels != ignore_index
            nll = -torch.where(nll_keep, logp[:B], 0).sum() / nll_keep.sum().clamp(min=1).to(acc)
            loss = loss + opts.nll_coef * nll
            metrics["nll_loss"] = nll.detach()
        # DPOTrainer logs summed log-probs and rewards; CPOTrainer / ORPOTrainer those their losses take.
        logged = (sums if opts.kind in DPO_KINDS else seq).detach()
        rewards = opts.beta * (
            logged if ref_sums is None or opts.kind not in DPO_KINDS else logged - ref_sums
        )
        chosen_r, rejected_r = rewards[:B], rewards[B:]
        metrics.update({
            "rewards/chosen": chosen_r.mean(),
            "rewards/rejected": rejected_r.mean(),
            "rewards/accuracies": (chosen_r > rejected_r).to(acc).mean(),
            "rewards/margins": (chosen_r - rejected_r).mean(),
            "logps/chosen": logged[:B].mean(),
            "logps/rejected": logged[B:].mean(),
            **extra,
        })  # fmt: skip
        half = torch.arange(R, device=device) < B
        groups = (half, ~half)
    if softcap is None:
        with torch.no_grad():
            mean_logit = _mean_logits(hidden, weight, bias, temperature, acc)
            for name, rows in zip(("chosen", "rejected"), groups, strict=True):
                m = keep & rows[:, None]
                metrics[f"logits/{name}"] = torch.where(m, mean_logit, 0).sum() / m.sum().to(acc)
    return loss, metrics


def _options(kind, beta, options) -> PreferenceOptions:
    unknown = sorted(set(options) - set(PreferenceOptions._fields))
    if unknown:
        raise TypeError(
            f"{OP}: unknown option(s) {unknown}; the options are {PreferenceOptions._fields[2:]} "
            "besides kind and beta"
        )
    return PreferenceOptions(kind=kind, beta=beta, **options).checked(OP)


def _check_policy(hidden, weight, labels, bias, opts, ignore_index):
    v.check_ndim(OP, v.check_float(OP, hidden, "hidden"), "hidden", (3,))
    v.check_linear_weight(OP, hidden, weight)
    v.check_index(OP, labels, "labels")
    v.check_shape(OP, labels, "labels", hidden.shape[:2], "hidden.shape[:2]")
    if bias is not None:
        v.check_shape(OP, v.check_float(OP, bias, "bias"), "bias", weight.shape[:1], "weight.shape[:1]")
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, int):
        raise TypeError(f"{OP}: ignore_index must be an int, got {type(ignore_index).__name__}")
    R = hidden.shape[0]
    if opts.kind == "kto":
        if R == 0:
            raise ValueError(
                f"{OP}: kind='kto' needs at least one sequence, got hidden shape {tuple(hidden.shape)}"
            )
    elif R == 0 or R % 2:
        raise ValueError(
            f"{OP}: kind={opts.kind!r} takes pairs: hidden.shape[0] must be 2B > 0 (B chosen rows, then "
            f"the B rejected rows), got hidden shape {tuple(hidden.shape)}"
        )


def _check_head(hidden, weight, bias, names, vocab):
    """A second head (the reference model's): hidden [.., .., D], weight [vocab, D], bias [vocab] or None."""
    h, w, b = names
    v.check_ndim(OP, v.check_float(OP, hidden, h), h, (3,))
    if weight is None:
        raise ValueError(f"{OP}: {h} needs {w}, the reference model's LM head [V, D]")
    v.check_ndim(OP, v.check_float(OP, weight, w), w, (2,))
    if weight.shape != (vocab, hidden.shape[-1]):
        raise ValueError(
            f"{OP}: {w} must be [V, D] = {(vocab, hidden.shape[-1])} (V of weight, D of {h}), got "
            f"{tuple(weight.shape)}"
        )
    if bias is not None:
        v.check_shape(OP, v.check_float(OP, bias, b), b, (vocab,), f"{w}.shape[:1]")


def _check_reference(t, opts, R, T, weight):
    has_logps, has_hidden = t["ref_logps"] is not None, t["ref_hidden"] is not None
    if has_logps and has_hidden:
        raise ValueError(f"{OP}: pass ref_logps or ref_hidden (with ref_weight), not both")
    if not has_hidden:
        for name in ("ref_weight", "ref_bias"):
            if t[name] is not None:
                raise ValueError(f"{OP}: {name} is given without ref_hidden")
    if opts.kind in NO_REFERENCE_KINDS and (has_logps or has_hidden):
        raise ValueError(f"{OP}: kind={opts.kind!r} takes no reference model; got ref_logps or ref_hidden")
    if has_logps:
        lp = t["ref_logps"]
        v.check_ndim(OP, v.check_float(OP, lp, "ref_logps"), "ref_logps", (1,))
        v.check_shape(OP, lp, "ref_logps", (R,), "hidden.shape[:1]")
    if has_hidden:
        _check_head(t["ref_hidden"], t["ref_weight"], t["ref_bias"], ("ref_hidden", "ref_weight", "ref_bias"),
                    weight.shape[0])  # fmt: skip
        if t["ref_hidden"].shape[:2] != (R, T):
            raise ValueError(
                f"{OP}: ref_hidden has shape {tuple(t['ref_hidden'].shape)} but labels has shape {(R, T)}"
            )


def _check_kto(t, R, hidden, weight):
    pl = t["preference_labels"]
    if pl is None:
        raise ValueError(f"{OP}: kind='kto' needs preference_labels, [R] bool (True: desirable)")
    v.check_tensor(OP, pl, "preference_labels")
    if pl.dtype != torch.bool and pl.dtype not in v.INT_MASK_DTYPES:
        raise TypeError(f"{OP}: preference_labels must be a bool or integer 0/1 tensor, got {pl.dtype}")
    v.check_shape(OP, pl, "preference_labels", (R,), "hidden.shape[:1]")
    v.mask_values(OP, pl, "preference_labels")
    kl, kl_hidden = t["kl"], t["kl_hidden"]
    if kl is not None:
        if kl_hidden is not None:
            raise ValueError(f"{OP}: pass kl or kl_hidden (with kl_labels), not both")
        if isinstance(kl, torch.Tensor):
            v.check_ndim(OP, v.check_float(OP, kl, "kl"), "kl", (0,))
            v.check_finite(OP, kl, "kl")
        else:
            v.check_number(OP, kl, "kl")
    if kl_hidden is None:
        for name in ("kl_labels", "ref_kl_hidden", "ref_kl_logps"):
            if t[name] is not None:
                raise ValueError(f"{OP}: {name} is given without kl_hidden")
        return
    v.check_ndim(OP, v.check_float(OP, kl_hidden, "kl_hidden"), "kl_hidden", (3,))
    if kl_hidden.shape[-1] != hidden.shape[-1] or kl_hidden.dtype != hidden.dtype:
        raise ValueError(
            f"{OP}: kl_hidden must be [R', T', D] of hidden's D and dtype, got {tuple(kl_hidden.shape)} "
            f"{kl_hidden.dtype} (hidden {tuple(hidden.shape)} {hidden.dtype})"
        )
    if t["kl_labels"] is None:
        raise ValueError(f"{OP}: kl_hidden needs kl_labels, [R', T'] int")
    v.check_index(OP, t["kl_labels"], "kl_labels")
    v.check_shape(OP, t["kl_labels"], "kl_labels", kl_hidden.shape[:2], "kl_hidden.shape[:2]")
    if t["ref_hidden"] is not None:
        if t["ref_kl_hidden"] is None or t["ref_kl_logps"] is not None:
            raise ValueError(f"{OP}: with ref_hidden, the KL completions' reference takes ref_kl_hidden")
        _check_head(t["ref_kl_hidden"], t["ref_weight"], None, ("ref_kl_hidden", "ref_weight", "ref_bias"),
                    weight.shape[0])  # fmt: skip
        if t["ref_kl_hidden"].shape[:2] != kl_hidden.shape[:2]:
            raise ValueError(
                f"{OP}: ref_kl_hidden has shape {tuple(t['ref_kl_hidden'].shape)} but kl_hidden has shape "
                f"{tuple(kl_hidden.shape)}"
            )
    elif t["ref_logps"] is not None:
        if t["ref_kl_logps"] is None or t["ref_kl_hidden"] is not None:
            raise ValueError(f"{OP}: with ref_logps, the KL completions' reference takes ref_kl_logps")
        lp = t["ref_kl_logps"]
        v.check_ndim(OP, v.check_float(OP, lp, "ref_kl_logps"), "ref_kl_logps", (1,))
        v.check_shape(OP, lp, "ref_kl_logps", kl_hidden.shape[:1], "kl_hidden.shape[:1]")
    elif t["ref_kl_hidden"] is not None or t["ref_kl_logps"] is not None:
        raise ValueError(f"{OP}: ref_kl_hidden / ref_kl_logps given for a reference-free loss")


def _check_agree(nll_labels, labels, both):
    """nll_labels equal labels wherever both are targets (one log-prob pass serves both terms)."""
    bad = both & (nll_labels != labels)
    if v.checks_eagerly(bad):
        if bool(bad.any()):
            index = tuple(int(i) for i in bad.nonzero()[0])
            raise ValueError(
                f"{OP}: nll_labels must equal labels wherever neither is ignore_index, found "
                f"{int(nll_labels[index])} != {int(labels[index])} at chosen row, token {index}"
            )
    else:
        v.assert_async(~bad.any(), f"{OP}: nll_labels must equal labels where neither is ignored")


def _token_logps(hidden, weight, bias, labels, common):
    """[R, T] per-token log-probs from the fused pass over the rows whose label is not ignore_index (0 at
    the others): prompt and padding tokens cost no GEMM."""
    R, T, D = hidden.shape
    flat = labels.reshape(-1)
    rows = (flat != common["ignore_index"]).nonzero().squeeze(1)
    kw = dict(common)
    if isinstance(kw["temperature"], torch.Tensor):
        kw["temperature"] = kw["temperature"].reshape(-1)[rows]
    logp = linear_logprobs(hidden.reshape(-1, D)[rows], weight, flat[rows], bias=bias, **kw)
    return logp.new_zeros(R * T).index_put((rows,), logp).view(R, T)


def _sums(hidden, weight, bias, labels, common):
    return _token_logps(hidden, weight, bias, labels, common).sum(-1)


def _reference_sums(t, labels, common, acc, device):
    """The reference's summed sequence log-probs [R] (None: reference-free); call under no_grad."""
    if t["ref_hidden"] is not None:
        return _sums(t["ref_hidden"], t["ref_weight"], t["ref_bias"], labels, common).to(acc)
    if t["ref_logps"] is not None:
        return t["ref_logps"].detach().to(acc)
    return None


def _kl_point(t, weight, bias, common, acc, device):
    """KTO's reference point z, detached (see the public docstring)."""
    if t["kl"] is not None:
        kl = t["kl"]
        if isinstance(kl, torch.Tensor):
            return kl.detach().to(acc)
        return torch.full((), float(kl), dtype=acc, device=device)  # a fill: no host-to-device copy
    if t["kl_hidden"] is None:
        return torch.zeros((), dtype=acc, device=device)
    with torch.no_grad():
        sums = _sums(t["kl_hidden"], weight, bias, t["kl_labels"], common).to(acc)
        if t["ref_kl_hidden"] is not None:
            ref_sums = _sums(t["ref_kl_hidden"], t["ref_weight"], t["ref_bias"], t["kl_labels"], common)
            sums = sums - ref_sums.to(acc)
        elif t["ref_kl_logps"] is not None:
            sums = sums - t["ref_kl_logps"].to(acc)
        return sums.mean().clamp(min=0)


def _mean_logits(hidden, weight, bias, temperature, acc):
    """[R, T] each token's logit averaged over the vocabulary: (h·Σ_v W_v + Σ_v b_v) / (V·temperature)."""
    R, T, D = hidden.shape
    mean = hidden.reshape(-1, D).to(acc) @ weight.sum(0, dtype=acc)
    if bias is not None:
        mean = mean + bias.sum(dtype=acc)
    mean = mean.view(R, T) / weight.shape[0]
    return mean / (temperature.to(acc) if isinstance(temperature, torch.Tensor) else temperature)
