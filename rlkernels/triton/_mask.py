"""How a token kernel is told its mask's kind (each kernel that reads a mask takes it as the constexpr
MASK_KIND): bool; integer, whose values must be 0 or 1 (a Hugging Face attention_mask); or float weights,
finite and >= 0."""

import torch
import triton.language as tl

MASK_KINDS = {"bool": 0, "int": 1, "float": 2}
MASK_INT = tl.constexpr(MASK_KINDS["int"])
MASK_FLOAT = tl.constexpr(MASK_KINDS["float"])


def mask_kind(mask: torch.Tensor) -> int:
    """The kernels' MASK_KIND of a mask tensor."""
    if mask.dtype == torch.bool:
        return MASK_KINDS["bool"]
    return MASK_KINDS["float"] if mask.dtype.is_floating_point else MASK_KINDS["int"]
