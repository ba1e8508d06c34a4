"""Thin nn.Module wrappers around the functional API, for trainers that configure a loss once and call it
per step. Each module stores its hyper-parameters and forwards to the function of the same name."""

from __future__ import annotations

import torch
from torch import nn

from rlkernels.ops.kl import kl_penalty
from rlkernels.ops.logprobs import linear_logprobs
from rlkernels.ops.policy_loss import policy_loss
from rlkernels.ops.value_loss import value_loss


class _Configured(nn.Module):
    """Holds keyword options passed to `fn` on every call."""

    fn = None

    def __init__(self, **options):
        super().__init__()
        self.options = options

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v!r}" for k, v in self.options.items())


class KLPenalty(_Configured):
    """`kl_penalty(logp, ref_logp, kind, clamp=..., backend=...)` as a module; forward(logp, ref_logp)."""

    def __init__(self, kind: str = "k3", *, clamp: float | None = 10.0, backend: str = "auto"):
        super().__init__(kind=kind, clamp=clamp, backend=backend)

    def forward(self, logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
        return kl_penalty(logp, ref_logp, **self.options)


class PolicyLoss(_Configured):
    """`policy_loss` as a module: the options (clip_low, clip_high, objective, agg, kl_coef, ...) are given
    once; forward(logp, old_logp, advantages, mask, **per_step) -> (loss, stats), where per-step tensors
    (ref_logp, entropy, is_weights) and global normalizers (num_tokens, num_seqs) go as keywords."""

    def forward(self, logp, old_logp, advantages, mask, **per_step):
        return policy_loss(logp, old_logp, advantages, mask, **self.options, **per_step)


class ValueLoss(_Configured):
    """`value_loss` as a module; forward(values, old_values, returns, mask, **per_step) -> (loss, stats)."""

    def forward(self, values, old_values, returns, mask, **per_step):
        return value_loss(values, old_values, returns, mask, **self.options, **per_step)


class LinearLogprobs(_Configured):
    """`linear_logprobs` as a module: the options (temperature, softcap, ignore_index, return_entropy,
    return_sum_pi_squared, chunk_size, backend) are given once; forward(hidden [..., D], weight [V, D],
    labels [...], bias=None) -> logp [...] fp32 (or the tuple (logp, entropy if asked, sum_pi_squared if
    asked)). The head is an argument, not a parameter of this module, so the
    model keeps owning (and tying) its output embedding."""

    def forward(self, hidden, weight, labels, bias=None):
        return linear_logprobs(hidden, weight, labels, bias=bias, **self.options)
