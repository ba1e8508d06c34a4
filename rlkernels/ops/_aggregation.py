"""Validation of the aggregation arguments shared by policy_loss and value_loss, and the step that turns
a kernel's per-row sums into the loss (the math itself is rlkernels/reference/aggregation.py)."""

from __future__ import annotations

import torch

from rlkernels import _validate as v
from rlkernels.reference.aggregation import AGG_MODES, aggregate_rows, scale_by


def check_count(op: str, value, name: str, device: torch.device):
    """A global normalizer: None, a number >= 0, or a one-element tensor on `device` (e.g. an all-reduced
    token count, used without a host sync)."""
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(
                f"{op}: {name} must be a number or a one-element tensor, got shape {tuple(value.shape)}"
            )
        if value.device != device:
            raise ValueError(f"{op}: {name} is on {value.device} but the inputs are on {device}")
        if value.dtype == torch.bool or value.is_complex():
            raise TypeError(f"{op}: {name} must be a real tensor, got {value.dtype}")
        return value.reshape(())
    return v.check_number(op, value, name, ge=0)


def check_agg_args(op: str, agg, num_tokens, num_seqs, dp_size, norm_len, device: torch.device) -> dict:
    """The validated aggregation keyword arguments of aggregate_rows (norm_len resolved later)."""
    v.check_choice(op, agg, "agg", AGG_MODES)
    if isinstance(dp_size, bool) or not isinstance(dp_size, int) or dp_size < 1:
        raise ValueError(f"{op}: dp_size must be an int >= 1, got {dp_size!r}")
    return dict(
        num_tokens=check_count(op, num_tokens, "num_tokens", device),
        num_seqs=check_count(op, num_seqs, "num_seqs", device),
        dp_size=dp_size,
        norm_len=v.check_number(op, norm_len, "norm_len", gt=0, optional=True),
    )


def finish_rows(row_loss: torch.Tensor, row_counts: torch.Tensor, agg: str, seq_len: int, agg_args: dict):
    """The loss (0-dim) from a kernel's per-row masked sums."""
    args = dict(agg_args)
    if args["norm_len"] is None:
        args["norm_len"] = seq_len
    return aggregate_rows(row_loss, row_counts, agg, **args)


def stat_means(row_sums: torch.Tensor, row_counts: torch.Tensor) -> torch.Tensor:
    """Masked means over the batch's tokens ([K]) from per-row sums [B, K]; 0 without tokens."""
    return scale_by(row_sums.sum(0), 1.0, row_counts.sum())
