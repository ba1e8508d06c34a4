"""dpo_loss: the public function. Its inputs are [B] per-sequence log-probs, so the loss is a handful of
[B]-sized elementwise ops: there is no [B, T] traffic for a fused kernel to save (torch.compile fuses it
anyway), and the only implementation is the eager one (reference/dpo.py), which runs on any device."""

from __future__ import annotations

import torch

from rlkernels import _validate as v
from rlkernels._backend import select_backend
from rlkernels.reference import dpo as reference
from rlkernels.reference.dpo import DPO_KINDS

OP = "dpo_loss"


@v.keyword_options
def dpo_loss(
    chosen_logps: torch.Tensor,
    rejected_logps: torch.Tensor,
    ref_chosen_logps: torch.Tensor | None = None,
    ref_rejected_logps: torch.Tensor | None = None,
    *,
    beta: float = 0.1,
    kind: str = "sigmoid",
    label_smoothing: float = 0.0,
    backend: str = "auto",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Sequence-level preference losses (TRL DPOTrainer semantics, see rlkernels/reference/dpo.py).

    With Δ = (chosen - ref_chosen) - (rejected - ref_rejected) and ε = label_smoothing:
    "sigmoid" -(1-ε)·log σ(βΔ) - ε·log σ(-βΔ); "robust" (-(1-ε)·log σ(βΔ) + ε·log σ(-βΔ)) / (1-2ε);
    "hinge" relu(1 - βΔ); "ipo" (Δ - 1/(2β))^2 (pass length-averaged log-probs, as TRL does).

    Args:
        chosen_logps, rejected_logps: [B] float log-probs of the chosen / rejected completions (summed
            over their tokens), differentiable.
        ref_chosen_logps, ref_rejected_logps: [B] under the reference model; both None: reference-free.
        beta: > 0. kind: "sigmoid" | "ipo" | "hinge" | "robust".
        label_smoothing: in [0, 0.5) for "sigmoid" / "robust"; must be 0 for "hinge" and "ipo".
        backend: "auto" | "reference" (the only implementation; see the module docstring).

    Returns:
        (loss, stats): the batch-mean loss (0-dim, the inputs' promoted dtype) and detached 0-dim stats
        "rewards_chosen", "rewards_rejected" (mean β·(logp - ref_logp)), "reward_margin" (their mean
        difference) and "reward_accuracy" (fraction of pairs with the larger chosen reward).
    """
    tensors = dict(
        chosen_logps=chosen_logps,
        rejected_logps=rejected_logps,
        ref_chosen_logps=ref_chosen_logps,
        ref_rejected_logps=ref_rejected_logps,
    )
    for name, t in tensors.items():
        if t is None and name.startswith("ref_"):
            continue
        v.check_float(OP, t, name)
        v.check_ndim(OP, t, name, (1,))
        v.check_shape(OP, t, name, chosen_logps.shape, "chosen_logps")
    if (ref_chosen_logps is None) != (ref_rejected_logps is None):
        raise ValueError(
            f"{OP}: pass both ref_chosen_logps and ref_rejected_logps, or neither (reference-free)"
        )
    device = v.check_same_device(OP, **tensors)
    beta = float(v.check_number(OP, beta, "beta", gt=0))
    kind = v.check_choice(OP, kind, "kind", DPO_KINDS)
    label_smoothing = float(v.check_number(OP, label_smoothing, "label_smoothing", ge=0))
    if kind in ("sigmoid", "robust") and not label_smoothing < 0.5:
        raise ValueError(
            f"{OP}: label_smoothing must be in [0, 0.5) for kind={kind!r}, got {label_smoothing}"
        )
    if kind in ("hinge", "ipo") and label_smoothing != 0:
        raise ValueError(f"{OP}: label_smoothing is not used by kind={kind!r}; got {label_smoothing}")
    select_backend(OP, backend, device, implemented=())
    return reference.dpo_loss(
        chosen_logps,
        rejected_logps,
        ref_chosen_logps,
        ref_rejected_logps,
        beta=beta,
        kind=kind,
        label_smoothing=label_smoothing,
    )
