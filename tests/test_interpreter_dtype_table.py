"""The tests' kept dtype map under Triton's interpreter (tests/interpreter_dtype_table.py): installed with the
Triton the tests pin, the interpreter's own answer for every dtype a kernel can hold, and a kernel's outputs
bit for bit those of the interpreter's own path."""

import os

import interpreter_dtype_table
import pytest
import torch
import triton.language as tl

import rlkernels as rk

pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="the kept map is for Triton's interpreter"
)

SCALARS = (
    tl.int1, tl.int8, tl.uint8, tl.int16, tl.uint16, tl.int32, tl.uint32, tl.int64, tl.uint64, tl.float16,
    tl.bfloat16, tl.float32, tl.float64, tl.float8e5, tl.float8e4nv,
)  # fmt: skip


def test_installed_with_the_tests_triton():
    """Fails when a Triton update renames the interpreter's internals: the suite would run slower."""
    assert interpreter_dtype_table.installed()


def test_every_dtype_maps_as_the_interpreter_maps_it():
    own = interpreter_dtype_table._original
    types = [
        *SCALARS,
        *(tl.block_type(t, [16]) for t in SCALARS),
        *(tl.pointer_type(t) for t in SCALARS),
        tl.block_type(tl.pointer_type(tl.float32), [4, 8]),
    ]
    for t in types:
        assert interpreter_dtype_table._np_dtype_of(t) == own(t), t
        assert interpreter_dtype_table._np_dtype_of(t) == own(t), t  # kept: the same answer again


def test_a_kernel_computes_the_same():
    torch.manual_seed(0)
    logp, ref = -torch.rand(3, 37), -torch.rand(3, 37)
    got = rk.kl_penalty(logp, ref, kind="k3", backend="triton")
    interpreter_dtype_table.uninstall()
    try:
        assert not interpreter_dtype_table.installed()
        want = rk.kl_penalty(logp, ref, kind="k3", backend="triton")
    finally:
        interpreter_dtype_table.install()
    assert torch.equal(got, want)
