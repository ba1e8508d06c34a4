"""Kernels the real Triton compiler rejects or a GPU cannot run, each behind a launcher with compile cases,
so that tests/test_compile_check.py can show that the compile check reports every kind of defect."""

import functools

import torch
import triton
import triton.language as tl

from rlkernels.triton._common import float_arg
from rlkernels.triton._device_assert import check, require
from rlkernels.triton._specializations import CompileCase, meta

ANNOTATED: tl.constexpr = 3  # the form the interpreter accepts and the compiler rejects
SCALE = tl.constexpr(2)  # the form the compiler accepts


@triton.jit
def _annotated_global_kernel(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * ANNOTATED, mask=offs < n)


@triton.jit
def _scale_kernel(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * SCALE, mask=offs < n)


@triton.jit
def _deep_pipeline_kernel(a_ptr, b_ptr, c_ptr, K, BLOCK: tl.constexpr, BLOCK_K: tl.constexpr):
    # c = a @ b with the K loop software-pipelined num_stages deep: each stage keeps an (a, b) pair of
    # [BLOCK, BLOCK_K] bf16 tiles in shared memory.
    offs = tl.arange(0, BLOCK)
    ks = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK, BLOCK), tl.float32)
    for k in range(0, K, BLOCK_K):
        a = tl.load(a_ptr + offs[:, None] * K + (k + ks)[None, :])
        b = tl.load(b_ptr + (k + ks)[:, None] * BLOCK + offs[None, :])
        acc = tl.dot(a, b, acc)
    tl.store(c_ptr + offs[:, None] * BLOCK + offs[None, :], acc)


@triton.jit
def _scaled_by_kernel(x_ptr, n, scale, BLOCK: tl.constexpr):
    # `scale` undeclared: Triton passes the Python float as fp32, so a float64 x is scaled by its rounding.
    offs = tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * scale, mask=offs < n)


@triton.jit
def _scaled_by_fp64_kernel(x_ptr, n, scale: tl.float64, BLOCK: tl.constexpr):
    # The library's form: declared fp64, taken in x's dtype where it is read.
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    tl.store(x_ptr + offs, x * float_arg(scale, x.dtype), mask=offs < n)


@triton.jit
def _checked_kernel(x_ptr, n, BLOCK: tl.constexpr, CHECK_MSG: tl.constexpr):
    # The library's device assert (rlkernels/triton/_device_assert.py) on an integer index computation.
    offs = tl.arange(0, BLOCK) * 2 + 1
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    require(tl.sum(tl.where(x != x, 1, 0), axis=0) == 0, CHECK_MSG)
    tl.store(x_ptr + offs, x + 1, mask=offs < n)


def _launch(kernel, x, **kw):
    kernel[(1,)](x, x.numel(), **kw)


def compile_cases():
    x = meta(64)
    yield CompileCase("scale[ok]", functools.partial(_launch, _scale_kernel, x, BLOCK=64))
    yield CompileCase("annotated[global]", functools.partial(_launch, _annotated_global_kernel, x, BLOCK=64))
    # A launcher that misses a constexpr argument: the binding error a GPU launch would raise.
    yield CompileCase("scale[missing BLOCK]", functools.partial(_scale_kernel[(1,)], x, 64))
    for dtype in (torch.float32, torch.float64):
        y = meta(64, dtype=dtype)
        for kernel in (_scaled_by_kernel, _scaled_by_fp64_kernel):
            launch = functools.partial(kernel[(1,)], y, 64, 0.1, BLOCK=64)
            yield CompileCase(f"{kernel.__name__}[{str(dtype).removeprefix('torch.')}]", launch)
    # The device assert: with _device_assert's options; asked for without debug (compiled out: a finding);
    # with debug alone (its integer-overflow checks compiled in too).
    checked = functools.partial(_launch, _checked_kernel, x, BLOCK=64)
    message = "rlkernels planted: NaN"
    yield CompileCase("checked[asserting]", functools.partial(checked, **check(x, message)))
    yield CompileCase("checked[no debug]", functools.partial(checked, CHECK_MSG=message))
    yield CompileCase("checked[sanitized]", functools.partial(checked, CHECK_MSG=message, debug=True))
    # 5 stages x (128 + 128) x 128 bf16: ~256 KiB of shared memory, more than A100 or H100 give a block.
    a, c = meta(128, 4096, dtype=torch.bfloat16), meta(128, 128)
    deep = functools.partial(_deep_pipeline_kernel[(1,)], a, a, c, 4096, BLOCK=128, BLOCK_K=128, num_stages=5)
    yield CompileCase("deep_pipeline[5 stages]", deep)
