"""The accumulation dtype, once for every op: the dtype the kernels compute in, and in which they read a float
mask's weights. fp64 inputs accumulate in fp64; fp32 and the 16-bit dtypes in fp32."""

from __future__ import annotations

import torch


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """fp64 for fp64, fp32 for every other float dtype."""
    return torch.float64 if dtype == torch.float64 else torch.float32
