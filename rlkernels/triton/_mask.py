"""A token kernel's mask, once: how a kernel is told its kind (each kernel that reads a mask takes it as the
constexpr MASK_KIND: bool; integer, whose values must be 0 or 1, a Hugging Face attention_mask; or float
weights, finite and >= 0), how it reads the mask as weights and finds the values the op rejects, and how it
weighs a token's term by it."""

import torch
import triton
import triton.language as tl

MASK_KINDS = {"bool": 0, "int": 1, "float": 2}
MASK_INT = tl.constexpr(MASK_KINDS["int"])
MASK_FLOAT = tl.constexpr(MASK_KINDS["float"])


def mask_kind(mask: torch.Tensor) -> int:
    """The kernels' MASK_KIND of a mask tensor."""
    if mask.dtype == torch.bool:
        return MASK_KINDS["bool"]
    return MASK_KINDS["float"] if mask.dtype.is_floating_point else MASK_KINDS["int"]


@triton.jit
def mask_bad(raw, m, inb, MASK_KIND: tl.constexpr):
    """Which of the mask values `raw` (read where `inb`) the op rejects: an integer other than 0 and 1, a
    float weight `m` (raw as the kernel weighs with it) that is negative or not finite. A bool has none."""
    if MASK_KIND == MASK_INT:
        return inb & (raw != 0) & (raw != 1)
    if MASK_KIND == MASK_FLOAT:
        return inb & ~((m >= 0) & (m < float("inf")))
    return inb & (raw != raw)  # never: a bool mask has no bad value


@triton.jit
def load_mask(ptrs, inb, MASK_KIND: tl.constexpr, ACC: tl.constexpr):
    """(m, bad): the mask's values at `ptrs` as weights of dtype ACC, 0 where not `inb` (an integer mask:
    nonzero -> 1; a float mask rounded to ACC, as the C++ kernels' mask_weight reads it), and which of them
    the op rejects (mask_bad)."""
    raw = tl.load(ptrs, mask=inb, other=0)
    if MASK_KIND == MASK_INT:
        m = (raw != 0).to(ACC)
    else:
        m = raw.to(ACC)
    return m, mask_bad(raw, m, inb, MASK_KIND)


@triton.jit
def kept(on, m, x, MASK_KIND: tl.constexpr):
    """m·x at the kept tokens (`on`: m != 0), an exact 0 at the others whatever x holds there. A bool or
    integer mask weighs a kept token 1, so there the product, which would change no bit, is left out."""
    if MASK_KIND == MASK_FLOAT:
        x = m * x
    return tl.where(on, x, 0.0)


@triton.jit
def kept_flag(on, m, flag, MASK_KIND: tl.constexpr):
    """kept() of a boolean flag as 0 / 1 (m where the mask weighs)."""
    if MASK_KIND == MASK_FLOAT:
        return tl.where(on, m * flag.to(m.dtype), 0.0)
    return (on & flag).to(m.dtype)
