"""Sequence-level preference losses beyond the DPO family: the math of rk.linear_preference_loss once its
fused log-prob pass has summed each sequence's token log-probs (docs/semantics.md, "Preference losses from
hidden states"). Inputs are [B] per-sequence values, so this eager code is the implementation, as for
rk.dpo_loss, whose per-pair math (`dpo_per_pair`) the DPO kinds and SimPO / CPO reuse.

Pinned peers: TRL 1.16.0 (DPOTrainer._compute_loss, experimental CPOTrainer.cpo_loss, ORPOTrainer.
odds_ratio_loss, KTOTrainer._compute_loss) and Liger-Kernel 0.8.5 (liger_kernel.chunked_loss).
With c, r the chosen / rejected sequence log-probs (summed over the completion, or averaged where the kind
averages: ipo, simpo, orpo), rc, rr the reference's, β = beta, ε = label_smoothing:
    sigmoid, ipo, hinge, robust   dpo_per_pair(Δ), Δ = (c - rc) - (r - rr)              (TRL DPOTrainer)
    cpo                           dpo_per_pair("sigmoid", c - r)                        (CPO, no reference)
    simpo                         dpo_per_pair("sigmoid", c - r - γ/β)                  = -log σ(β(c - r) - γ)
    orpo                          -β log σ(log_odds), log_odds = (c - r) - (log(1 - e^c) - log(1 - e^r))
    kto (unpaired, per sequence)  w_d (1 - σ(β(lr - z))) if desirable, w_u (1 - σ(β(z - lr))) otherwise,
                                  lr = logp - ref_logp, z the KL reference point (detached)
plus nll_coef x the chosen sequences' token-mean negative log-likelihood (CPO's and ORPO's NLL term).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F

from rlkernels import _validate as v
from rlkernels.reference.dpo import DPO_KINDS, dpo_per_pair

PAIRED_KINDS = (*DPO_KINDS, "simpo", "cpo", "orpo")
PREFERENCE_KINDS = (*PAIRED_KINDS, "kto")
NO_REFERENCE_KINDS = ("simpo", "cpo", "orpo")  # their losses take no reference model
AVERAGED_KINDS = ("ipo", "simpo", "orpo")  # sequence log-prob = token mean (TRL / Liger), the rest: sum
SMOOTHED_KINDS = ("sigmoid", "robust", "simpo", "cpo")  # take label_smoothing
DEFAULT_NLL_COEF = {"cpo": 1.0, "orpo": 1.0}  # TRL CPOConfig.cpo_alpha; ORPO's NLL (Liger alpha); others 0
DEFAULT_SIMPO_GAMMA = 0.5  # TRL CPOConfig.simpo_gamma, Liger's gamma: the margin γ itself


class PreferenceOptions(NamedTuple):
    """The options of rk.linear_preference_loss besides its tensors, defined once here.

    kind: one of PREFERENCE_KINDS. beta: > 0 (β of every kind; ORPO's λ, the weight of its odds-ratio term).
    label_smoothing: ε in [0, 0.5) for sigmoid / robust / simpo / cpo (cDPO, robust DPO, TRL CPO); 0 for the
        rest.
    gamma: SimPO's target margin γ (TRL simpo_gamma, Liger gamma; default 0.5); gamma_beta_ratio: the
        same margin given as γ/β (the SimPO paper's and repository's parameter); at most one of the two,
        simpo only.
    nll_coef: weight of the chosen sequences' NLL term; None: 1.0 for cpo (TRL cpo_alpha) and orpo, else 0.
        Any paired kind takes it (Liger's compute_nll_loss / alpha); not kto.
    desirable_weight, undesirable_weight: >= 0, KTO's λ_D and λ_U (TRL KTOConfig); kto only.
    """

    kind: str = "sigmoid"
    beta: float = 0.1
    label_smoothing: float = 0.0
    gamma: float | None = None
    gamma_beta_ratio: float | None = None
    nll_coef: float | None = None
    desirable_weight: float = 1.0
    undesirable_weight: float = 1.0

    def checked(self, op: str) -> PreferenceOptions:
        """Validated, with the defaults of the kind filled in: gamma set for simpo (gamma_beta_ratio folded
        into it), nll_coef a number. Raises ValueError / TypeError naming the option."""
        kind = v.check_choice(op, self.kind, "kind", PREFERENCE_KINDS)
        beta = float(v.check_number(op, self.beta, "beta", gt=0))
        eps = float(v.check_number(op, self.label_smoothing, "label_smoothing", ge=0))
        if kind in SMOOTHED_KINDS and not eps < 0.5:
            raise ValueError(f"{op}: label_smoothing must be in [0, 0.5) for kind={kind!r}, got {eps}")
        if kind not in SMOOTHED_KINDS and eps != 0:
            raise ValueError(f"{op}: label_smoothing is not used by kind={kind!r}; got {eps}")
        gamma = v.check_number(op, self.gamma, "gamma", optional=True)
        ratio = v.check_number(op, self.gamma_beta_ratio, "gamma_beta_ratio", optional=True)
        if kind != "simpo" and (gamma is not None or ratio is not None):
            which = "gamma" if gamma is not None else "gamma_beta_ratio"
            raise ValueError(f"{op}: {which} is SimPO's margin, not used by kind={kind!r}")
        if gamma is not None and ratio is not None:
            raise ValueError(f"{op}: pass gamma or gamma_beta_ratio (= gamma / beta), not both")
        if kind == "simpo":
            gamma = float(
                ratio * beta if ratio is not None else DEFAULT_SIMPO_GAMMA if gamma is None else gamma
            )
            if not math.isfinite(gamma):
                raise ValueError(f"{op}: gamma must be finite, got {gamma}")
        nll = v.check_number(op, self.nll_coef, "nll_coef", ge=0, optional=True)
        if kind == "kto" and nll:
            raise ValueError(f"{op}: nll_coef is not used by kind='kto' (unpaired data), got {nll}")
        nll = float(DEFAULT_NLL_COEF.get(kind, 0.0) if nll is None else nll)
        weights = []
        for name in ("desirable_weight", "undesirable_weight"):
            w = float(v.check_number(op, getattr(self, name), name, ge=0))
            if kind != "kto" and w != 1.0:
                raise ValueError(f"{op}: {name} is KTO's, not used by kind={kind!r}; got {w}")
            weights.append(w)
        return PreferenceOptions(kind, beta, eps, gamma, None, nll, *weights)


def log1mexp(x: torch.Tensor) -> torch.Tensor:
    """log(1 - e^x) for x <= 0, without cancellation (branch at -log 2, as TRL's ORPOTrainer)."""
    return torch.where(x < -math.log(2), torch.log1p(-torch.exp(x)), torch.log(-torch.expm1(x)))


def sequence_logps(sums: torch.Tensor, counts: torch.Tensor, kind: str) -> torch.Tensor:
    """The sequence log-prob a kind's loss takes: the token sum, or the token mean for AVERAGED_KINDS (an
    all-ignored sequence counts one token, as TRL's clamp(min=1))."""
    return sums / counts.clamp(min=1).to(sums.dtype) if kind in AVERAGED_KINDS else sums


def paired_loss(c, r, ref_c, ref_r, options: PreferenceOptions):
    """(per-pair loss [B], extra metrics) for the paired kinds from the sequence log-probs the kind takes
    (ref_c, ref_r None: reference-free, as rk.dpo_loss)."""
    kind, beta, eps = options.kind, options.beta, options.label_smoothing
    if kind in DPO_KINDS:
        delta = (c if ref_c is None else c - ref_c) - (r if ref_r is None else r - ref_r)
        return dpo_per_pair(delta, beta, kind, eps), {}
    if kind == "cpo":
        return dpo_per_pair(c - r, beta, "sigmoid", eps), {}
    if kind == "simpo":
        return dpo_per_pair(c - r - options.gamma / beta, beta, "sigmoid", eps), {}
    if kind == "orpo":
        log_odds = (c - r) - (log1mexp(c) - log1mexp(r))
        ratio = F.logsigmoid(log_odds)
        extra = {"log_odds_ratio": ratio.detach().mean(), "log_odds_chosen": log_odds.detach().mean()}
        return -beta * ratio, extra
    raise ValueError(f"unknown paired kind {kind!r} (expected one of {PAIRED_KINDS})")


def kto_loss(logratios: torch.Tensor, desirable: torch.Tensor, kl: torch.Tensor, options: PreferenceOptions):
    """KTO's per-sequence loss [B] (TRL KTOTrainer 1.16, loss_type="kto"): desirable sequences
    w_d·(1 - σ(β(lr - kl))), undesirable ones w_u·(1 - σ(β(kl - lr))); `kl` the detached reference point."""
    beta = options.beta
    chosen = options.desirable_weight * (1 - torch.sigmoid(beta * (logratios - kl)))
    rejected = options.undesirable_weight * (1 - torch.sigmoid(beta * (kl - logratios)))
    return torch.where(desirable, chosen, rejected)
