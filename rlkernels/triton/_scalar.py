"""Exact fp64 hyper-parameters for Triton kernels.

Triton passes Python floats as fp32 arguments, which would round gamma = 0.99 or eps = 1e-6 in a
float64 kernel. `split3` writes a float as three fp32 numbers whose exact sum is the float (fp64 has 53
significant bits, three fp32 carry 72), and `join3` rebuilds it inside the kernel: exactly in fp64, or as
the fp32 rounding in fp32 kernels. No device tensor and no host-to-device copy is needed.
"""

import numpy as np
import triton
import triton.language as tl


def split3(x: float) -> tuple[float, float, float]:
    """(hi, mid, lo), each representable in fp32, with hi + mid + lo == x exactly (x finite)."""
    x = float(x)
    hi = float(np.float32(x))
    mid = float(np.float32(x - hi))  # x - hi is exact in fp64
    lo = float(np.float32(x - hi - mid))
    return hi, mid, lo


@triton.jit
def join3(hi, mid, lo, ACC: tl.constexpr):
    """The float that `split3` split, in the accumulation dtype ACC (fp32: hi, its fp32 rounding)."""
    if ACC == tl.float64:
        out = (tl.cast(hi, tl.float64) + tl.cast(mid, tl.float64)) + tl.cast(lo, tl.float64)
    else:
        out = tl.cast(hi, tl.float32)
    return out
