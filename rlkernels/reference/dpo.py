"""Sequence-level preference losses (DPO family) in eager PyTorch: the spec and the implementation of
rk.dpo_loss (inputs are [B] per-sequence log-probs, so there is nothing for a fused kernel to save).

Follows TRL's DPOTrainer (dpo_trainer.py at TRL f2cd577), with Δ = (chosen - ref_chosen) - (rejected -
ref_rejected) and ε = label_smoothing:
    sigmoid  -(1-ε)·log σ(βΔ) - ε·log σ(-βΔ)         (ε > 0: conservative DPO, as TRL before it
                                                     dropped ε from "sigmoid"; ε = 0 is today's TRL)
    robust   (-(1-ε)·log σ(βΔ) + ε·log σ(-βΔ)) / (1 - 2ε)
    hinge    relu(1 - βΔ)
    ipo      (Δ - 1/(2β))^2    (TRL feeds IPO length-averaged log-probs: pass those)
The loss is the batch mean. Stats (detached): the implicit rewards β·(logp - ref_logp) of chosen and
rejected, their mean margin, and the fraction of pairs whose chosen reward is the larger.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

DPO_KINDS = ("sigmoid", "ipo", "hinge", "robust")


def dpo_per_pair(delta: torch.Tensor, beta: float, kind: str, label_smoothing: float) -> torch.Tensor:
    """The per-pair loss [B] from Δ [B]."""
    eps = label_smoothing
    if kind == "sigmoid":
        return -(1 - eps) * F.logsigmoid(beta * delta) - eps * F.logsigmoid(-beta * delta)
    if kind == "robust":
        return (-(1 - eps) * F.logsigmoid(beta * delta) + eps * F.logsigmoid(-beta * delta)) / (1 - 2 * eps)
    if kind == "hinge":
        return torch.relu(1 - beta * delta)
    if kind == "ipo":
        return (delta - 1 / (2 * beta)).square()
    raise ValueError(f"unknown kind {kind!r} (expected one of {DPO_KINDS})")


def dpo_loss(
    chosen_logps: torch.Tensor,
    rejected_logps: torch.Tensor,
    ref_chosen_logps: torch.Tensor | None = None,
    ref_rejected_logps: torch.Tensor | None = None,
    *,
    beta: float = 0.1,
    kind: str = "sigmoid",
    label_smoothing: float = 0.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(loss, stats) for [B] log-probs (summed over each completion); no reference: reference-free (0)."""
    chosen_lr = chosen_logps if ref_chosen_logps is None else chosen_logps - ref_chosen_logps
    rejected_lr = rejected_logps if ref_rejected_logps is None else rejected_logps - ref_rejected_logps
    per_pair = dpo_per_pair(chosen_lr - rejected_lr, beta, kind, label_smoothing)
    n = per_pair.numel()
    loss = per_pair.sum() / n if n else per_pair.sum()
    chosen_r = beta * chosen_lr.detach()
    rejected_r = beta * rejected_lr.detach()

    def mean(x):
        return x.sum() / n if n else x.sum()

    stats = {
        "rewards_chosen": mean(chosen_r),
        "rewards_rejected": mean(rejected_r),
        "reward_margin": mean(chosen_r - rejected_r),
        "reward_accuracy": mean((chosen_r > rejected_r).to(chosen_r.dtype)),
    }
    return loss, stats
