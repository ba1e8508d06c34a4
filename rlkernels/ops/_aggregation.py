"""Validation of the aggregation arguments shared by policy_loss, value_loss and agg_loss, and their form in
the ops' schemas. The kernels finish the loss themselves (docs/gpu_token_ops.md:
rlkernels/triton/_aggregation.py, csrc/include/rlkernels/aggregation.h; the math is
rlkernels/reference/aggregation.py)."""

from __future__ import annotations

from typing import NamedTuple

import torch

from rlkernels import _validate as v
from rlkernels.reference.aggregation import AGG_MODES


class AggConfig(NamedTuple):
    """The aggregation arguments of the policy_loss, value_loss and agg_loss ops, as their schemas pass them
    (csrc/include/rlkernels/agg_config.h, generated from this table: rlkernels/cxx_headers.py). A global
    normalizer goes to its number or to its one-element tensor slot, never both."""

    agg: str
    dp_size: int
    norm_len: float
    num_tokens: float | None
    num_tokens_tensor: torch.Tensor | None
    num_seqs: float | None
    num_seqs_tensor: torch.Tensor | None


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


def agg_op_args(agg: str, agg_args: dict, seq_len: int) -> AggConfig:
    """The ops' aggregation arguments from the validated keyword arguments of check_agg_args; norm_len
    defaults to the sequence length."""

    def split(value):
        if isinstance(value, torch.Tensor):
            return None, value
        return (None if value is None else float(value)), None

    norm_len = agg_args["norm_len"]
    num_tokens, num_tokens_tensor = split(agg_args["num_tokens"])
    num_seqs, num_seqs_tensor = split(agg_args["num_seqs"])
    return AggConfig(
        agg=agg, dp_size=agg_args["dp_size"], norm_len=float(seq_len if norm_len is None else norm_len),
        num_tokens=num_tokens, num_tokens_tensor=num_tokens_tensor, num_seqs=num_seqs,
        num_seqs_tensor=num_seqs_tensor,
    )  # fmt: skip
