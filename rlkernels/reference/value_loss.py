"""Clipped PPO critic loss in eager PyTorch (the spec of rk.value_loss).

Follows verl 0.9.1 `compute_value_loss` (itself from TRL's PPO trainer; tests/test_verl.py runs the installed
verl's against it):
    v_clip = clip(values, old_values - clip, old_values + clip)
    L = max((values - returns)^2, (v_clip - returns)^2),  loss = 0.5 · agg(L)
clip=None gives the unclipped 0.5 · agg((values - returns)^2). old_values, returns and mask are data.
"""

from __future__ import annotations

import torch

from rlkernels.reference.aggregation import agg_loss, masked_mean


def value_terms(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, clip: float | None):
    """Per-token 0.5·max(...) [B, T] and the boolean [B, T] mask of tokens where the clipped branch wins."""
    loss1 = (values - returns).square()
    if clip is None:
        return 0.5 * loss1, torch.zeros_like(loss1, dtype=torch.bool)
    clipped = torch.clamp(values, old_values - clip, old_values + clip)
    loss2 = (clipped - returns).square()
    return 0.5 * torch.maximum(loss1, loss2), loss2 > loss1


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip: float | None = 0.2,
    agg: str = "token-mean",
    num_tokens=None,
    num_seqs=None,
    dp_size: int = 1,
    norm_len: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(loss, {"clipfrac"}) in the dtype of the inputs; all tensors [B, T]."""
    terms, flags = value_terms(values, old_values, returns, clip)
    loss = agg_loss(
        terms, mask, agg, num_tokens=num_tokens, num_seqs=num_seqs, dp_size=dp_size, norm_len=norm_len
    )
    return loss, {"clipfrac": masked_mean(flags.to(values.dtype), mask)}
