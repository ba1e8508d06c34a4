"""A token mask as the native kernels of the advantage, GAE and rollout-correction ops read it (the host side
of csrc/cpu/token_masks.h; csrc/include/rlkernels/torch_utils.h check_kernel_mask and gae_host.h
scan_mask_dtype_ok check it). The loss family reads more integer widths: policy_loss.native_mask."""

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
