"""The tests' tree scan under Triton's interpreter (tests/interpreter_tree_scan.py): installed with the
Triton the tests pin, and the same scan as the interpreter's own element-by-element one: bit for bit for an
exact combine, forward and reversed, along either axis of a block, and within float64's bound for a
floating-point sum."""

import os

import interpreter_tree_scan
import numpy as np
import pytest
import torch
import triton
import triton.language as tl

pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="the tree scan is for Triton's interpreter"
)


@triton.jit
def _segmented_sum(a_start, a_sum, b_start, b_sum):
    """A segmented sum: b starts a new segment where its flag is set (the library's group scans' shape)."""
    return a_start | b_start, tl.where(b_start != 0, b_sum, a_sum + b_sum)


@triton.jit
def _scan_kernel(
    starts_ptr,  # [R, C] int32 0/1
    values_ptr,  # [R, C]
    out_ptr,  # [R, C]
    R: tl.constexpr,
    C: tl.constexpr,
    AXIS: tl.constexpr,
    REVERSE: tl.constexpr,
):
    offsets = tl.arange(0, R)[:, None] * C + tl.arange(0, C)[None, :]
    starts, values = tl.load(starts_ptr + offsets), tl.load(values_ptr + offsets)
    _, sums = tl.associative_scan((starts, values), AXIS, _segmented_sum, reverse=REVERSE)
    tl.store(out_ptr + offsets, sums)


def _scan(starts, values, axis, reverse):
    out = torch.empty_like(values)
    _scan_kernel[(1,)](starts, values, out, *values.shape, AXIS=axis, REVERSE=reverse)
    return out


def _segmented_sums(starts: np.ndarray, values: np.ndarray, axis: int, reverse: bool) -> np.ndarray:
    """The numpy answer, left to right (right to left when reversed) along `axis`."""
    s, v = np.moveaxis(starts, axis, -1), np.moveaxis(values, axis, -1)
    out = np.empty_like(v)
    order = range(v.shape[-1] - 1, -1, -1) if reverse else range(v.shape[-1])
    for row in np.ndindex(v.shape[:-1]):
        acc = None
        for j in order:
            acc = v[row + (j,)] if acc is None or s[row + (j,)] else acc + v[row + (j,)]
            out[row + (j,)] = acc
    return np.moveaxis(out, -1, axis)


def _inputs(dtype):
    g = torch.Generator().manual_seed(0)
    starts = (torch.rand(8, 64, generator=g) < 0.15).int()
    if dtype.is_floating_point:
        return starts, torch.randn(8, 64, generator=g, dtype=dtype)
    return starts, torch.randint(-1000, 1000, (8, 64), generator=g, dtype=dtype)


def test_installed_with_the_tests_triton():
    """Fails when a Triton update renames the interpreter's internals: the scan tests would run ~2x slower."""
    assert interpreter_tree_scan.installed()


@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("reverse", [False, True])
def test_an_exact_combine_gives_the_interpreters_bits(axis, reverse):
    starts, values = _inputs(torch.int64)
    tree = _scan(starts, values, axis, reverse)
    interpreter_tree_scan.uninstall()
    try:
        assert not interpreter_tree_scan.installed()
        own = _scan(starts, values, axis, reverse)
    finally:
        interpreter_tree_scan.install()
    assert torch.equal(tree, own)
    assert np.array_equal(tree.numpy(), _segmented_sums(starts.numpy(), values.numpy(), axis, reverse))


@pytest.mark.parametrize("reverse", [False, True])
def test_a_floating_point_sum_within_float64s_bound(reverse):
    """Another association order than the interpreter's: the error against float64 stays that of a float32
    sum of at most 64 terms (64 ulps of the largest partial sum's magnitude)."""
    starts, values = _inputs(torch.float32)
    tree = _scan(starts, values, 1, reverse).double()
    exact = torch.from_numpy(_segmented_sums(starts.numpy(), values.double().numpy(), 1, reverse))
    bound = 64 * torch.finfo(torch.float32).eps * values.abs().double().sum()
    assert (tree - exact).abs().max() <= bound
    assert not torch.equal(tree, torch.zeros_like(tree))
