"""cuBLAS's mixed-precision GEMM for the cuda-on-cpu flavor.

csrc/cuda/logprobs_binding.cpp multiplies 16-bit hidden states and weights into fp32 logits with
`at::mm(a, b, out_dtype)` / `at::mm_out(out, a, b, out_dtype)` (cuBLAS, fp32 accumulation), and adds such
products into its fp32 d hidden with `at::addmm_out(out, out, a, b, out_dtype)`. ATen implements
`aten::mm.dtype`, `aten::mm.dtype_out` and `aten::addmm.dtype_out` for CUDA only, so the flavor supplies
CPU kernels for the three while it is active: the product of the operands upcast to fp32, which is what
cuBLAS accumulates (the product of two bf16 or two fp16 values is exact in fp32); only the summation order
differs, as it does between GPUs. The GEMM is cuBLAS's, not the code under test: the row kernels and the
binding's blocking are.
"""

from __future__ import annotations

import torch

FP32_OUT_INPUTS = (torch.float16, torch.bfloat16, torch.float32)


def _check(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype) -> None:
    if out_dtype != torch.float32 or a.dtype not in FP32_OUT_INPUTS or b.dtype != a.dtype:
        raise NotImplementedError(
            f"cuda-on-cpu: mm with out_dtype={out_dtype} on {a.dtype} x {b.dtype} "
            "(the stand-in is cuBLAS's fp32-output GEMM only)"
        )


def mm_dtype(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    _check(a, b, out_dtype)
    return torch.mm(a.to(torch.float32), b.to(torch.float32))


def mm_dtype_out(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype, *, out: torch.Tensor):
    _check(a, b, out_dtype)
    torch.mm(a.to(torch.float32), b.to(torch.float32), out=out)
    return out


def addmm_dtype_out(self, a, b, out_dtype, *, beta=1, alpha=1, out):
    _check(a, b, out_dtype)
    torch.addmm(self, a.to(torch.float32), b.to(torch.float32), beta=beta, alpha=alpha, out=out)
    return out


def register(lib: torch.library.Library) -> None:
    """Register the three kernels for the CPU key on `lib`, a Library("aten", "IMPL") owned by the caller."""
    lib.impl("mm.dtype", mm_dtype, "CPU")
    lib.impl("mm.dtype_out", mm_dtype_out, "CPU")
    lib.impl("addmm.dtype_out", addmm_dtype_out, "CPU")
