"""Float options reach the Triton kernels exactly (rlkernels/triton/_common.py float_arg): a `tl.float64`
argument or a float constexpr, taken in fp64, is the Python float itself; in fp32, its rounding. On a GPU the
kernel is compiled (an undeclared float argument would arrive as fp32: the H200 run's float64 policy loss was
off by 1.7e-8); without one it runs under the interpreter, where tl.cast would round through fp32."""

import numpy as np
import pytest
import torch
import triton
import triton.language as tl
from oracle import kernel_flavors

from rlkernels.triton._common import float_arg

LOG_1E_8 = tl.constexpr(-18.420680743952367)  # not an fp32 number, as vespo's log-weight floor


@triton.jit
def _options_kernel(out_ptr, x: tl.float64, ACC: tl.constexpr):
    tl.store(out_ptr, float_arg(x, ACC).to(tl.float64))
    tl.store(out_ptr + 1, float_arg(LOG_1E_8, ACC).to(tl.float64))
    below = tl.full([], -18.42068074395237, ACC)  # just under the floor in fp64, above its fp32 rounding
    tl.store(out_ptr + 2, tl.where(below < float_arg(LOG_1E_8, ACC), 1.0, 0.0).to(tl.float64))


TRITON = [f for f in kernel_flavors() if f.kind == "triton"]


@pytest.mark.parametrize("value", [0.9, 1e-8, 1 / 3, -0.2, 1e300])
@pytest.mark.parametrize("backend", TRITON)
def test_float_arg_is_exact_in_fp64_and_rounded_in_fp32(backend, value):
    for acc, exact in ((tl.float64, True), (tl.float32, False)):
        out = torch.full((3,), float("nan"), dtype=torch.float64, device=backend.device)
        _options_kernel[(1,)](out, value, ACC=acc)
        got = out.tolist()
        if exact:
            assert got[0] == value and got[1] == LOG_1E_8.value
            assert got[2] == 1.0  # the comparison saw the fp64 floor
        else:
            assert got[0] == float(np.float32(value)) and got[1] == float(np.float32(LOG_1E_8.value))
