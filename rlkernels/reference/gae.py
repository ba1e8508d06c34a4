"""GAE and discounted returns by the verl-style loop over positions (right to left), with verl's
masked whitening. This is the executable spec, the "reference" backend, the test oracle and the
benchmark baseline ("the verl-style loop").

GAE (verl `compute_gae_advantage_return`), per row, t = T-1 .. 0, starting from nextV = A = 0:
    delta_t = r_t + gamma * nextV - V_t
    a_t     = delta_t + gamma * lam * A
    nextV   = V_t * m_t + (1 - m_t) * nextV     # masked positions carry nextV ...
    A       = a_t * m_t + (1 - m_t) * A         # ... and A unchanged
    advantages_t = A,  returns_t = A + V_t
Discounted returns (verl 0.9.1 REINFORCE++ `compute_reinforce_plus_plus_outcome_advantage`), from C = 0:
    G = r_t + gamma * C;  returns_t = G * m_t;  C = G * m_t + (1 - m_t) * C
    # a masked position (an observation token) returns 0 and carries the running return C through unchanged
Whitening (verl `masked_whiten`): (x - mean) * rsqrt(var + 1e-8) at every position, mean and var over
the masked positions with mask weights, var unbiased (sum / (W - 1)); with one valid token (W <= 1) the
variance is taken as 0, so there is no NaN.

Packed layout: `[N]` tensors with `cu_seqlens` [S + 1] (sequence s is [cu[s], cu[s+1])) is the same as
padding every sequence on the right with mask-0 positions (they carry zeros into the sequence).
"""

from __future__ import annotations

import torch

# verl masked_whiten: (x - mean) * rsqrt(var + 1e-8).
WHITEN_EPS = 1e-8


def masked_whiten(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """verl masked_whiten over all elements (a batch-wide mean and unbiased variance)."""
    m = mask.to(values.dtype)
    w = m.sum()
    mean = torch.where(w > 0, (values * m).sum() / torch.where(w > 0, w, 1), 0)
    m2 = ((values - mean).square() * m).sum()
    var = torch.where(w > 1, m2 / torch.where(w > 1, w - 1, 1), 0)
    return (values - mean) * torch.rsqrt(var + WHITEN_EPS)


def _gae_padded(rewards, values, mask, gamma, lam):
    m = mask.to(rewards.dtype)
    next_values = rewards.new_zeros(rewards.shape[0])
    last = rewards.new_zeros(rewards.shape[0])
    out = []
    for t in reversed(range(rewards.shape[-1])):
        delta = rewards[:, t] + gamma * next_values - values[:, t]
        last_ = delta + gamma * lam * last
        next_values = values[:, t] * m[:, t] + (1 - m[:, t]) * next_values
        last = last_ * m[:, t] + (1 - m[:, t]) * last
        out.append(last)
    adv = torch.stack(out[::-1], dim=1) if out else torch.zeros_like(rewards)
    return adv, adv + values


def _returns_padded(rewards, mask, gamma):
    m = mask.to(rewards.dtype)
    running = rewards.new_zeros(rewards.shape[0])
    returns = torch.zeros_like(rewards)
    for t in reversed(range(rewards.shape[-1])):
        new = rewards[:, t] + gamma * running
        returns[:, t] = new * m[:, t]
        running = new * m[:, t] + running * (1 - m[:, t])
    return returns


def pad_packed(x: torch.Tensor, cu_seqlens: torch.Tensor, fill=0) -> torch.Tensor:
    """[N] packed -> [S, max_len], each sequence left-aligned, padded on the right with `fill`."""
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()
    out = torch.full((len(lengths), max(lengths, default=0)), fill, dtype=x.dtype, device=x.device)
    for s, n in enumerate(lengths):
        start = int(cu_seqlens[s])
        out[s, :n] = x[start : start + n]
    return out


def unpad_packed(x: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """Inverse of pad_packed: [S, max_len] -> [N]."""
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()
    if not lengths:
        return x.new_zeros(0)
    return torch.cat([x[s, :n] for s, n in enumerate(lengths)])


def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 1.0,
    whiten: bool = False,
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """rewards, values, mask [B, T] (or packed [N] with cu_seqlens [S + 1]) -> (advantages, returns),
    computed in rewards' dtype; returns are taken before whitening (verl)."""
    if cu_seqlens is not None:
        padded = [pad_packed(x, cu_seqlens) for x in (rewards, values, mask)]
        adv, ret = _gae_padded(*padded, gamma, lam)
        adv, ret = unpad_packed(adv, cu_seqlens), unpad_packed(ret, cu_seqlens)
    else:
        adv, ret = _gae_padded(rewards, values, mask, gamma, lam)
    if whiten:
        adv = masked_whiten(adv, mask)
    return adv, ret


def discounted_returns(
    rewards: torch.Tensor,
    mask: torch.Tensor,
    gamma: float = 1.0,
    cu_seqlens: torch.Tensor | None = None,
) -> torch.Tensor:
    """rewards, mask [B, T] (or packed [N] with cu_seqlens) -> REINFORCE++ returns, in rewards' dtype."""
    if cu_seqlens is not None:
        ret = _returns_padded(pad_packed(rewards, cu_seqlens), pad_packed(mask, cu_seqlens), gamma)
        return unpad_packed(ret, cu_seqlens)
    return _returns_padded(rewards, mask, gamma)
