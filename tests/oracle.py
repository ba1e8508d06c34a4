"""The error rule of DESIGN.md §5 and the backends a test runs on CPU tensors.

A kernel's output is compared with the float64 reference run on the same (rounded) inputs:
    err(kernel) <= 2 * err(reference at the kernel's dtype) + atol
where err is the largest absolute difference to the float64 result and atol is a small slack relative to
the result's magnitude (a few fp32 ulps), so that exact-in-fp32 references do not demand bit-exactness.
For outputs stored in bf16/fp16 the slack is at least one step of that dtype's grid at the result's largest
magnitude: both the kernel and the reference round to that grid, and two results whose unrounded values
differ by much less than a step can still land on neighboring grid points (seen: a bf16 d weight 0.74 ulp off
where the reference happened to be 0.3 ulp off everywhere, i.e. "2.5x the reference's error").
"""

from __future__ import annotations

import math

import torch

from rlkernels import _backend, _ext

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# Slack relative to max(1, |reference|): ~16 fp32 ulps; fp64 kernels get ~16 fp64 ulps.
ATOL = {torch.float64: 4e-15, torch.float32: 2e-6, torch.bfloat16: 2e-6, torch.float16: 2e-6}


def cpu_kernel_backends() -> list[str]:
    """The kernel backends that run on CPU tensors here: the C++ kernels (when the extension is built)
    and Triton under TRITON_INTERPRET=1."""
    out = []
    if _ext.ext_available():
        out.append("cpu")
    if _backend.triton_installed() and _backend.triton_interpreting():
        out.append("triton")
    return out


def max_err(x: torch.Tensor, ref64: torch.Tensor) -> float:
    """Largest |x - ref64|; a NaN/inf where the oracle is finite (or vice versa) counts as infinite."""
    x = x.detach().to(torch.float64)
    ref64 = ref64.detach().to(torch.float64)
    if x.shape != ref64.shape:
        raise AssertionError(f"shape {tuple(x.shape)} != oracle shape {tuple(ref64.shape)}")
    if x.numel() == 0:
        return 0.0
    same_nonfinite = (
        (~torch.isfinite(x)) & (~torch.isfinite(ref64)) & ((x == ref64) | (x.isnan() & ref64.isnan()))
    )
    diff = (x - ref64).abs()
    diff = torch.where(same_nonfinite, torch.zeros_like(diff), diff)
    diff = torch.where(diff.isnan(), torch.full_like(diff, float("inf")), diff)
    return float(diff.max())


def output_grid_step(dtype: torch.dtype, magnitude: float) -> float:
    """Spacing of a 16-bit float grid at `magnitude` (one ulp there); 0 for fp32/fp64 outputs."""
    if dtype not in (torch.bfloat16, torch.float16):
        return 0.0
    return torch.finfo(dtype).eps * 2.0 ** math.floor(math.log2(magnitude))


def assert_oracle(name: str, out, ref_same_dtype, ref64, *, atol: float | None = None, dtype=None) -> None:
    """Assert the error rule for one output against the float64 oracle.

    Elements whose true value does not fit in `dtype` (|oracle| > finfo.max) are left out; the
    reference's own error is taken over the elements where it stayed finite, so that an overflow in the
    low-precision reference never excuses the kernel elsewhere."""
    dtype = dtype or out.dtype
    ref64 = ref64.detach().to(torch.float64)
    fits = ref64.abs() <= torch.finfo(dtype).max
    fits |= ref64.isnan()
    if ref_same_dtype is not None:
        ref_same = ref_same_dtype.detach().to(torch.float64)
        ok = fits & torch.isfinite(ref_same)
        err_r = max_err(ref_same[ok], ref64[ok])
    else:
        err_r = 0.0
    finite_ref = ref64[fits].nan_to_num(0.0, 0.0, 0.0)
    scale = max(1.0, float(finite_ref.abs().max())) if finite_ref.numel() else 1.0
    slack = max((ATOL.get(dtype, 2e-6) if atol is None else atol) * scale, output_grid_step(out.dtype, scale))
    err_k = max_err(out.detach()[fits], ref64[fits])
    assert err_k <= 2 * err_r + slack, (
        f"{name}: kernel error {err_k:.3e} > 2 x reference error {err_r:.3e} + {slack:.1e} (dtype {dtype})"
    )
