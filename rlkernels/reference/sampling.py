"""The rollout's sampling distribution: which tokens a truncated sampler keeps (docs/sampling.md).

Pinned to vLLM 0.33.0's `Sampler.sample` (vllm/v1/sample/sampler.py), in its order, on temperature-scaled
logits z [..., V]:
1. min_p (`MinPLogitsProcessor.apply`): drop v when p_v < min_p · max_u p_u;
2. top_k (`apply_top_k_top_p_pytorch`): drop v when z_v is below the k-th largest z of the row (ties with
   the k-th are kept); k <= 0 or k >= V turns it off for the row, as vLLM's input batch does;
3. top_p (same function), over the distribution renormalized after 1 and 2: drop v when the ascending
   cumulative probability up to and including v is <= 1 - top_p; the most likely token is always kept.
   Stated without a sort order: keep v iff the renormalized mass of the tokens with z_u > z_v is < top_p.
   The two agree but at ties, where vLLM's unstable sort keeps an arbitrary part of a tied group at the
   boundary; this rule keeps the whole group (so does its top_k).

The kept set is always {v : z_v >= tau} for a per-row threshold tau. Sorting the whole row, as here, is the
spec; the kernels search tau in bounded memory (rlkernels/ops/sampling.py).
"""

from __future__ import annotations

import torch


def kept_tokens(
    z: torch.Tensor,  # [..., V] temperature-scaled logits (fp32 or fp64)
    top_k: torch.Tensor | None = None,  # [...] int; <= 0 or >= V: off
    top_p: torch.Tensor | None = None,  # [...] float in (0, 1]; 1: off
    min_p: torch.Tensor | None = None,  # [...] float in [0, 1]; 0: off
) -> torch.Tensor:
    """[..., V] bool: the tokens the sampler may draw, by sorting each row (vLLM 0.33.0's order)."""
    vocab = z.shape[-1]
    keep = torch.ones_like(z, dtype=torch.bool)
    if min_p is not None:
        probs = torch.softmax(z, dim=-1)
        keep &= ~(probs < min_p[..., None] * probs.amax(-1, keepdim=True))
    if top_k is not None:
        active = (top_k > 0) & (top_k < vocab)
        ascending = torch.where(keep, z, -torch.inf).sort(dim=-1).values
        kth = ascending.gather(-1, (vocab - top_k.clamp(1, vocab)).long()[..., None])
        keep &= ~(active[..., None] & (z < kth))
    if top_p is not None:
        masked = torch.where(keep, z, -torch.inf)
        probs = torch.softmax(masked, dim=-1)
        descending, order = masked.sort(dim=-1, descending=True)
        q = probs.gather(-1, order)
        above = q.cumsum(-1) - q  # mass before each position of the descending order
        # A tied group's mass strictly above it is `above` at the group's first position.
        first = torch.searchsorted(-descending.contiguous(), -descending.contiguous(), side="left")
        strictly_above = above.gather(-1, first)
        keep_sorted = (strictly_above < top_p[..., None]) | (top_p[..., None] >= 1)
        keep &= torch.zeros_like(keep).scatter(-1, order, keep_sorted)
    return keep
