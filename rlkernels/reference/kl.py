"""KL-penalty estimators per token (verl `kl_penalty` semantics)."""

from __future__ import annotations

import torch

# The base estimators' names (verl's and TRL's, and their k-notation) -> the canonical name.
_BASE_KINDS = {"k1": "k1", "kl": "k1", "abs": "abs", "k2": "k2", "mse": "k2", "k3": "k3", "low_var_kl": "k3"}
# Every accepted name -> its canonical name. As verl 0.9.1's `kl_penalty`, any base name may end in "+":
# the base value with k2's gradient (straight-through), k2 - k2.detach() + value.detach(). "k2+" is k2's value
# and gradient wherever the log-ratio is finite, and NaN where it is not (inf - inf), as verl's.
KL_KINDS = {**_BASE_KINDS, **{name + "+": base + "+" for name, base in _BASE_KINDS.items()}}
# A kind's code, shared with the C++ (csrc/include/rlkernels/kl.h, KLKind) and Triton kernels: the base
# estimator's code, plus the KL_STRAIGHT_THROUGH flag for a "+" kind.
KL_BASE_CODES = {"k1": 0, "abs": 1, "k2": 2, "k3": 3}
KL_STRAIGHT_THROUGH = 4
# Canonical name -> code: k1, abs, k2, k3, k1+, abs+, k2+, k3+.
KL_KIND_CODES = {
    **KL_BASE_CODES,
    **{base + "+": code | KL_STRAIGHT_THROUGH for base, code in KL_BASE_CODES.items()},
}
# k3 clamps d = ref - logp to [-20, 20] before exp (verl), so exp(d) stays finite.
K3_LOG_RATIO_BOUND = 20.0


def kl_value(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str, clamp: float | None) -> torch.Tensor:
    """The estimator's value [...] (logp's shape and dtype); "+" kinds take their base kind's value."""
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
    """Per-token KL penalty (verl 0.9.1 `kl_penalty`). logp, ref_logp: [...] float -> [...], in their dtype.

    k1 = logp - ref; abs = |logp - ref|; k2 = (logp - ref)^2 / 2;
    k3 = clamp(e^d - d - 1, -clamp, clamp) with d = clamp(ref - logp, -20, 20);
    kind: any name of KL_KINDS. "<kind>+" ("k1+", "abs+", "k3+", ...): the value of the base kind with the
    gradient of k2 (straight-through).
    """
    value = kl_value(logp, ref_logp, kind, clamp)
    if not KL_KINDS[kind].endswith("+"):
        return value
    k2 = 0.5 * (logp - ref_logp).square()
    return k2 - k2.detach() + value.detach()
