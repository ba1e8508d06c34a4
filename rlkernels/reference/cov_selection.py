"""The token selection of the covariance-based objectives clip_cov and kl_cov (verl 0.9.1
`compute_policy_loss_clip_cov` / `_kl_cov`, from "The Entropy Mechanism of Reinforcement Learning for
Reasoning Language Models"), in vectorized PyTorch with no host sync: the spec, and what every backend runs
before its policy_loss kernel (ops/policy_loss.py), since it ranks tokens across the whole batch.

Each response token's centered covariance cov = (A - Ā)·(logp - l̄ogp), with Ā, l̄ogp the mask-weighted means
over the batch (detached; verl's masked_mean, without its 1e-8), then:
- clip_cov: among the tokens the PPO clip leaves unclipped with clip_cov_lb < cov < clip_cov_ub, a random
  max(floor(ratio·Σm), 1) of them (all when fewer) lose their policy term. verl draws them with
  torch.randperm from the global RNG; here each candidate gets a uniform key from `generator` and the
  smallest keys win, so a seeded generator reproduces a selection.
- kl_cov: the max(floor(ratio·N), 1) tokens of largest cov among the N with m > 0 (none when N = 0) add
  coef·|logp - old_logp| to their term.
The counts stay tensors: ranks come from a sort of the whole batch, not from torch.topk's host-side k.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

# The covariance-selected objectives (their options are CovOptions).
COV_OBJECTIVES = ("clip_cov", "kl_cov")


class CovOptions(NamedTuple):
    """The options of clip_cov / kl_cov (verl 0.9.1 PolicyLossConfig names and defaults in comments)."""

    ratio: float = 2e-4  # clip_cov_ratio / kl_cov_ratio: the fraction of tokens selected
    lower: float = 1.0  # clip_cov_lb: clip_cov's candidates have lower < cov < upper
    upper: float = 5.0  # clip_cov_ub
    kl_coef: float = 0.1  # ppo_kl_coef: kl_cov's weight of |log-ratio| on its tokens


def token_covariance(logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(A - Ā)·(logp - l̄ogp) [B, T], the means mask-weighted over the batch; detached, in fp32 at least
    (the selection is a ranking: 16-bit rounding would reorder it)."""
    dtype = torch.promote_types(logp.dtype, torch.float32)
    m = mask.to(dtype)
    n = m.sum().clamp(min=1)
    lp, adv = logp.detach().to(dtype), adv.detach().to(dtype).expand_as(logp)
    mean_adv = torch.where(m != 0, adv * m, 0).sum() / n
    mean_lp = torch.where(m != 0, lp * m, 0).sum() / n
    return (adv - mean_adv) * (lp - mean_lp)


def _ranks(keys: torch.Tensor, descending: bool) -> torch.Tensor:
    """Each element's position [B, T] in the sorted flattened batch (ties in index order)."""
    order = torch.sort(keys.flatten(), descending=descending, stable=True).indices
    ranks = torch.empty_like(order)
    ranks[order] = torch.arange(order.numel(), device=order.device)
    return ranks.view_as(keys)


def cov_selection(
    objective: str,
    logp: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    options: CovOptions,
    *,
    clipped: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """The selected tokens [B, T] bool of clip_cov (clipped: the tokens the PPO clip binds) or kl_cov."""
    cov = token_covariance(logp, adv, mask)
    valid = mask != 0
    if objective == "clip_cov":
        count = torch.clamp(torch.floor(options.ratio * mask.to(cov.dtype).sum()), min=1)
        candidate = valid & ~clipped & (cov > options.lower) & (cov < options.upper)
        device = logp.device if generator is None else generator.device
        u = torch.rand(logp.shape, generator=generator, dtype=torch.float32, device=device).to(logp.device)
        keys = torch.where(candidate, u, torch.inf)
        return candidate & (_ranks(keys, descending=False) < count)
    n = valid.sum()
    count = torch.where(n > 0, torch.clamp(torch.floor(options.ratio * n), min=1), 0)
    keys = torch.where(valid, cov, -torch.inf)
    return valid & (_ranks(keys, descending=True) < count)
