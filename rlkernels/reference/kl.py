"""KL-penalty estimators per token (verl `kl_penalty` semantics)."""

from __future__ import annotations

import torch

# Every accepted name -> its canonical name (the names verl and TRL use, and their k-notation).
KL_KINDS = {
    "k1": "k1",
    "kl": "k1",
    "abs": "abs",
    "k2": "k2",
    "mse": "k2",
    "k2+": "k2",  # verl: k2's value with k2's gradient is plain k2
    "mse+": "k2",
    "k3": "k3",
    "low_var_kl": "k3",
    "k1+": "k1+",
    "kl+": "k1+",
    "k3+": "k3+",
    "low_var_kl+": "k3+",
}
# Canonical name -> the code the C++ (csrc/include/rlkernels/kl.h) and Triton kernels use.
KL_KIND_CODES = {"k1": 0, "abs": 1, "k2": 2, "k3": 3, "k1+": 4, "k3+": 5}
# k3 clamps d = ref - logp to [-20, 20] before exp (verl), so exp(d) stays finite.
K3_LOG_RATIO_BOUND = 20.0


def kl_value(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str, clamp: float | None) -> torch.Tensor:
    """The estimator's value; "+" kinds take their base kind's value."""
    kind = KL_KINDS[kind].rstrip("+")
    if kind == "k1":
        return logp - ref_logp
    if kind == "abs":
        return (logp - ref_logp).abs()
    if kind == "k2":
        return 0.5 * (logp - ref_logp).square()
    d = torch.clamp(ref_logp - logp, min=-K3_LOG_RATIO_BOUND, max=K3_LOG_RATIO_BOUND)
    k3 = torch.exp(d) - d - 1
    return k3 if clamp is None else torch.clamp(k3, min=-clamp, max=clamp)


def kl_penalty(
    logp: torch.Tensor, ref_logp: torch.Tensor, kind: str = "k3", clamp: float | None = 10.0
) -> torch.Tensor:
    """Per-token KL penalty. logp, ref_logp: [...] -> [...], in their dtype.

    k1 = logp - ref; abs = |logp - ref|; k2 = (logp - ref)^2 / 2;
    k3 = clamp(e^d - d - 1, -clamp, clamp) with d = clamp(ref - logp, -20, 20);
    "k1+" / "k3+": the value of k1 / k3 with the gradient of k2 (straight-through).
    """
    value = kl_value(logp, ref_logp, kind, clamp)
    if not KL_KINDS[kind].endswith("+"):
        return value
    k2 = 0.5 * (logp - ref_logp).square()
    return k2 - k2.detach() + value.detach()
