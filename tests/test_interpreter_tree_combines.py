"""The tests' tree scan and reduction under Triton's interpreter (tests/interpreter_tree_combines.py):
installed with the Triton the tests pin, and the same answers as the interpreter's own element-by-element
ones: bit for bit for an exact combine (one that does not commute), forward and reversed, along either axis
of a block or all of it, and within float64's bound for a floating-point sum."""

import os

import interpreter_tree_combines
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
def _combine_kernel(
    starts_ptr,  # [R, C] int32 0/1
    values_ptr,  # [R, C]
    out_ptr,  # [R, C] (SCAN); [C] (AXIS 0) or [R] (AXIS 1) (a reduction)
    R: tl.constexpr,
    C: tl.constexpr,
    AXIS: tl.constexpr,
    SCAN: tl.constexpr,
    FLAG: tl.constexpr,  # the scan's reverse, the reduction's keep_dims
):
    offsets = tl.arange(0, R)[:, None] * C + tl.arange(0, C)[None, :]
    starts, values = tl.load(starts_ptr + offsets), tl.load(values_ptr + offsets)
    if SCAN:
        _, sums = tl.associative_scan((starts, values), AXIS, _segmented_sum, reverse=FLAG)
        tl.store(out_ptr + offsets, sums)
    else:
        _, sums = tl.reduce((starts, values), AXIS, _segmented_sum, keep_dims=FLAG)
        if AXIS == 0:
            tl.store(out_ptr + tl.arange(0, C)[None, :] if FLAG else out_ptr + tl.arange(0, C), sums)
        else:
            tl.store(out_ptr + tl.arange(0, R)[:, None] if FLAG else out_ptr + tl.arange(0, R), sums)


def _reduce(starts, values, axis, keep):
    r, c = values.shape
    out = values.new_empty((c, r)[axis])
    _combine_kernel[(1,)](starts, values, out, r, c, AXIS=axis, SCAN=False, FLAG=keep)
    return out


def _scan(starts, values, axis, reverse):
    out = torch.empty_like(values)
    _combine_kernel[(1,)](starts, values, out, *values.shape, AXIS=axis, SCAN=True, FLAG=reverse)
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
    """Fails when a Triton update renames the interpreter's internals: the scan and multi-sum tests would run
    several times slower."""
    assert interpreter_tree_combines.installed()


def _interpreters_own(call):
    interpreter_tree_combines.uninstall()
    try:
        assert not interpreter_tree_combines.installed()
        return call()
    finally:
        interpreter_tree_combines.install()


@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("reverse", [False, True])
def test_an_exact_combine_gives_the_interpreters_bits(axis, reverse):
    starts, values = _inputs(torch.int64)
    tree = _scan(starts, values, axis, reverse)
    assert torch.equal(tree, _interpreters_own(lambda: _scan(starts, values, axis, reverse)))
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


@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("keep", [False, True])
def test_an_exact_reduction_gives_the_interpreters_bits(axis, keep):
    """The segmented sum reduced (the last segment's sum: its order matters) along each axis. (A tuple
    reduced over every axis, axis=None, fails in the interpreter's own reduction: it flattens the first
    tensor only.)"""
    starts, values = _inputs(torch.int64)
    tree = _reduce(starts, values, axis, keep)
    assert torch.equal(tree, _interpreters_own(lambda: _reduce(starts, values, axis, keep)))
    rows = (starts.T, values.T) if axis == 0 else (starts, values)
    want = _segmented_sums(rows[0].numpy(), rows[1].numpy(), 1, False)[:, -1]
    assert np.array_equal(tree.numpy(), want)
