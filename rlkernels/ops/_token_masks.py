"""A token mask as the native (C++ and CUDA C++) kernels read it, so the common masks reach them with no
conversion launch. Two families:
- kernel_mask: the advantage, GAE and rollout-correction ops (the host side of csrc/cpu/token_masks.h;
  csrc/include/rlkernels/torch_utils.h check_kernel_mask and gae_host.h scan_mask_dtype_ok check it);
- native_mask: the loss family (policy_loss, value_loss, agg_loss, linear_policy_loss), whose kernels read
  more integer widths (csrc/include/rlkernels/aggregation.h MaskType).
The Triton kernels read any mask dtype (triton/_mask.py load_mask)."""

from __future__ import annotations

import torch

from rlkernels import _validate as v
from rlkernels._dtypes import acc_dtype

# Integer masks the native kernels read as they are (a Hugging Face attention_mask is int64; their values are
# checked by the kernels). Other integer widths are checked on the host, then become bool.
NATIVE_INT_MASKS = (torch.int64,)


def kernel_mask(op: str, mask: torch.Tensor, dtype: torch.dtype, backend: str) -> torch.Tensor:
    """mask [B, T] (or packed [N]) as `backend`'s kernels read it for inputs of `dtype`, with no conversion
    launch in the common cases: bool and int64 as they are, float weights in the accumulation dtype of `dtype`
    (the kernels compute in it: a float64 mask on float32 inputs, or a float32 one on bfloat16 inputs, weighs
    as its rounding to that dtype, never to the inputs' 16 bits). The Triton kernels read any mask dtype
    (triton/_mask.py load_mask rounds float weights to the accumulation dtype alike)."""
    if backend == "triton" or mask.dtype == torch.bool or mask.dtype in NATIVE_INT_MASKS:
        return mask
    if mask.dtype.is_floating_point:
        acc = acc_dtype(dtype)
        return mask if mask.dtype == acc else mask.to(acc)
    return v.mask_values(op, mask)  # other integer widths: checked, then bool


def native_mask(mask: torch.Tensor, acc: torch.dtype) -> torch.Tensor:
    """The mask as the native kernels read it (csrc/include/rlkernels/aggregation.h MaskType): bool, uint8,
    int32 and int64 as they are (a Hugging Face attention_mask: no conversion), float weights of the
    accumulation type; int8 / int16 and other float dtypes converted (a copy, values kept)."""
    if mask.dtype in (torch.bool, torch.uint8, torch.int32, torch.int64, acc):
        return mask
    return mask.to(acc if mask.dtype.is_floating_point else torch.int32)
