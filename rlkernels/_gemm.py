"""Matrix products with an fp32 (or fp64) result whatever the operands' dtype, for the GEMMs of the linear
log-prob paths (rlkernels/triton/linear_blocked.py, rlkernels/ops/linear_sweep.py). Torch only: importing it
needs no Triton."""

from __future__ import annotations

import torch


def gemm_fp32(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, accumulate: bool = False) -> None:
    """out (fp32 / fp64) = a @ b, or += with accumulate; 16-bit operands multiply in their dtype with fp32
    accumulation (cuBLAS on a GPU; on the CPU, the interpreter's tests, the fp32 product of the upcast
    operands, which is what cuBLAS accumulates)."""
    acc = out.dtype
    if a.dtype == acc:
        if accumulate:
            out.addmm_(a, b)
        else:
            torch.mm(a, b, out=out)
    elif a.device.type == "cuda":
        if accumulate:
            torch.addmm(out, a, b, out_dtype=acc, out=out)
        else:
            torch.mm(a, b, out_dtype=acc, out=out)
    else:
        if accumulate:
            out.addmm_(a.to(acc), b.to(acc))
        else:
            torch.mm(a.to(acc), b.to(acc), out=out)
