"""Loss aggregation over a [B, T] token loss (verl 0.9.1 `agg_loss`, verl/trainer/ppo/core_algos.py), with
the global normalizers that make every mode invariant to data-parallel sharding.

Every mode is a function of two per-row quantities, the masked row sums `S_b = Σ_t m_bt L_bt` and the row
token counts `n_b = Σ_t m_bt`, so the kernels only reduce these per row and `aggregate_rows` finishes:

    token-mean               dp · Σ_b S_b / N           N = num_tokens, else Σ_b n_b
    token-sum                dp · Σ_b S_b
    seq-mean-token-sum       dp · Σ_b S_b / S           S = num_seqs, else #{b : n_b > 0}
    seq-mean-token-mean      dp · Σ_{b: n_b>0} (S_b / n_b) / S
    seq-mean-token-sum-norm  dp · Σ_b S_b / S / norm_len  (verl's loss_scale_factor; defaults to T)

`dp` is `dp_size`. Split a batch into k shards, give each shard the global `num_tokens` / `num_seqs` and
`dp_size=k`: the mean of the k shard losses (what DDP/FSDP gradient averaging computes) is the whole-batch
loss, for every mode. A zero normalizer (a fully masked batch) gives a loss of 0, never NaN.

Differences from verl 0.9.1, on purpose: `seq-mean-token-mean` divides by n_b exactly (verl by n_b + 1e-8,
the same number in fp32); a zero normalizer gives 0 where verl divides by it (NaN for a fully masked
micro-batch); a masked-out token adds exactly 0, where verl's product with the mask carries a NaN at padding
into the loss.
"""

from __future__ import annotations

import torch

AGG_MODES = (
    "token-mean",
    "token-sum",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)
# The keyword arguments that choose the aggregation (of agg_loss, rk.policy_loss and rk.value_loss).
AGG_KEYWORDS = ("agg", "num_tokens", "num_seqs", "dp_size", "norm_len")


def scale_by(total: torch.Tensor, numerator: float, denom) -> torch.Tensor:
    """total * numerator / denom, and 0 where denom == 0 (denom: a number or a 0-dim tensor)."""
    if isinstance(denom, torch.Tensor):
        # numerator / 0 = inf is never selected; no gradient flows through denom.
        return total * torch.where(denom > 0, numerator / denom.to(total.dtype), 0)
    return total * (numerator / denom) if denom > 0 else total * 0


def row_weights(row_counts: torch.Tensor, agg: str) -> torch.Tensor | None:
    """The per-row factor applied to S_b before the batch sum: 1/n_b (0 for empty rows) for
    seq-mean-token-mean, None (all ones) for the other modes."""
    if agg != "seq-mean-token-mean":
        return None
    nonempty = row_counts > 0
    return torch.where(nonempty, 1 / torch.where(nonempty, row_counts, 1), 0)


def row_loss_weights(
    row_counts: torch.Tensor,
    agg: str,
    *,
    num_tokens=None,
    num_seqs=None,
    dp_size: int = 1,
    norm_len: float,
) -> torch.Tensor:
    """The weights c_b [B] of loss = Σ_b c_b S_b (= d loss / d S_b), from the row counts n_b [B] and the
    normalizers only (no gradient flows through them)."""
    if agg not in AGG_MODES:
        raise ValueError(f"unknown agg {agg!r} (expected one of {AGG_MODES})")
    weights = row_weights(row_counts, agg)
    if weights is None:
        weights = torch.ones_like(row_counts)
    if agg == "token-sum":
        return weights * dp_size
    if agg == "token-mean":
        denom = row_counts.sum() if num_tokens is None else num_tokens
    else:  # the seq-mean modes: over the rows with tokens
        denom = (row_counts > 0).sum() if num_seqs is None else num_seqs
    if agg == "seq-mean-token-sum-norm":  # the seq-mean, then / norm_len (verl 0.9.1)
        weights = scale_by(weights, 1.0, norm_len)
    return scale_by(weights, dp_size, denom)


def aggregate_rows(
    row_sums: torch.Tensor,
    row_counts: torch.Tensor,
    agg: str,
    *,
    num_tokens=None,
    num_seqs=None,
    dp_size: int = 1,
    norm_len: float,
) -> torch.Tensor:
    """The aggregated loss from row_sums [B] (S_b) and row_counts [B] (n_b); a 0-dim tensor."""
    weights = row_loss_weights(
        row_counts.to(row_sums.dtype), agg, num_tokens=num_tokens, num_seqs=num_seqs, dp_size=dp_size,
        norm_len=norm_len,
    )  # fmt: skip
    return (row_sums * weights).sum()


def agg_loss(
    loss_mat: torch.Tensor,
    mask: torch.Tensor,
    agg: str = "token-mean",
    *,
    num_tokens=None,
    num_seqs=None,
    dp_size: int = 1,
    norm_len: float | None = None,
) -> torch.Tensor:
    """Aggregate loss_mat [B, T] under mask [B, T] (bool or float weights) into a 0-dim tensor."""
    m = mask.to(loss_mat.dtype)
    return aggregate_rows(
        torch.where(m != 0, loss_mat * m, 0).sum(-1),  # a masked-out token adds 0, even a NaN there
        m.sum(-1),
        agg,
        num_tokens=num_tokens,
        num_seqs=num_seqs,
        dp_size=dp_size,
        norm_len=loss_mat.shape[-1] if norm_len is None else norm_len,
    )


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Σ m·x / Σ m over all elements (a masked-out element adds 0, even a NaN there), 0 when Σ m == 0
    (for stats)."""
    m = mask.to(x.dtype)
    return scale_by(torch.where(m != 0, x * m, 0).sum(), 1.0, m.sum())
