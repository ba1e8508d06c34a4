"""`tl.associative_scan` and `tl.reduce` with a combine function under Triton's interpreter, in log2(n)
vectorized steps instead of one Python call of the combine function per element.

The interpreter scans and reduces with a combine function other than its built-in ones (+, *, max, min,
argmax, argmin: numpy) element by element (`ScanOps.generic_scan`, `ReduceOps.generic_reduce`): for a
segmented scan over a 32-wide chunk that is 31 calls of the combine function on one-element tensors, each a
few dozen interpreted ops, and policy_loss's ten sums in one reduction over a 2048-token tile (`sums10` in
`rlkernels/triton/_aggregation.py`) 2047 calls. The group-advantage, GAE and token-loss tests spent most of
their time there (the slowest tests of the suite). `install()` replaces both:
- the scan by a Hillis-Steele scan: step d combines every element with the one d places before it (d = 1, 2,
  4, ...);
- the reduction by a pairwise tree: each step combines elements 2i and 2i + 1 (their order kept, so a
  combine need not commute).
Each step is one call of the combine function on whole arrays.

The answer is the same scan or reduction in another association order, as a GPU's is: a warp combines in a
tree, not left to right, so this order is nearer the compiled kernels' than the interpreter's own (whose
tl.sum is numpy's pairwise sum already). An exact combine (integers, flags, max) gives the same bits; a
floating-point sum may round differently in its last bits, within the float64 oracles' bounds. A combine
that is not associative gives a different answer here, as on a GPU. `test_interpreter_tree_combines.py`
compares them with the interpreter's own. Where the interpreter lacks these internals (another Triton),
nothing is installed and the tests only run slower."""

from __future__ import annotations

import numpy as np

_own_scan = None  # the interpreter's own ScanOps.generic_scan
_own_reduce = None  # and ReduceOps.generic_reduce


def _combine(self, dtypes, first, second):
    """The combine function over two equal-shaped lists of arrays, elementwise -> a list of arrays of
    `first`'s dtypes and shape."""
    import triton.language as tl

    out = self.combine_fn.fn(
        *(self.to_tensor(a, t) for a, t in zip(first, dtypes, strict=True)),
        *(self.to_tensor(a, t) for a, t in zip(second, dtypes, strict=True)),
    )
    out = out if isinstance(out, tuple) else (out,)
    values = (o.handle.data if isinstance(o, tl.core.tensor) else o for o in out)
    return [
        np.broadcast_to(np.asarray(v).astype(a.dtype), a.shape) for v, a in zip(values, first, strict=True)
    ]


def _tree_scan(self, input):
    """ScanOps.generic_scan's contract (tensors in, inclusive scans along self.axis out, reversed by the
    caller), in Hillis-Steele steps."""
    arrays = [np.array(arg.handle.data) for arg in input]
    dtypes = [arg.dtype for arg in input]
    n = arrays[0].shape[self.axis]
    index = [slice(None)] * arrays[0].ndim
    d = 1
    while d < n:
        # Whole-length operands (the interpreter's blocks are powers of 2): each element and the one d
        # before it, rolled round; the first d results are dropped.
        earlier = [np.roll(a, d, axis=self.axis) for a in arrays]
        with np.errstate(all="ignore"):  # the dropped results combine unrelated elements
            out = _combine(self, dtypes, earlier, arrays)
        index[self.axis] = slice(d, n)
        for a, o in zip(arrays, out, strict=True):
            a[tuple(index)] = o[tuple(index)]
        d *= 2
    return [self.to_tensor(a, t) for a, t in zip(arrays, dtypes, strict=True)]


def _tree_reduce(self, input):
    """ReduceOps.generic_reduce's contract (tensors in, their reductions along self.axis out: every axis
    when it is None; keep_dims as asked), in pairwise steps."""
    original_axis = self.axis
    flat, axis = self.unravel(input, self.axis)
    arrays = [np.array(arg.handle.data) for arg in flat]
    dtypes = [arg.dtype for arg in flat]
    shape = arrays[0].shape
    n = shape[axis]
    if n & (n - 1):  # not a power of 2 (no block is): the interpreter's own loop
        return _own_reduce(self, input)
    while n > 1:
        pairs = [[np.take(a, np.arange(start, n, 2), axis=axis) for a in arrays] for start in (0, 1)]
        arrays = _combine(self, dtypes, *pairs)
        n //= 2
    ret = []
    for a, t in zip(arrays, dtypes, strict=True):
        data = np.take(a, 0, axis=axis)
        if self.keep_dims and original_axis is not None:
            data = np.expand_dims(data, axis)
        elif self.keep_dims:
            data = np.reshape(data, (1,) * len(shape))
        elif original_axis is None:
            data = data.item()  # a scalar, as the interpreter's own
        ret.append(self.to_tensor(data, t))
    return ret


def install() -> bool:
    """Installs the tree scan and reduction (idempotent); False where the interpreter's internals are not
    the ones known."""
    global _own_scan, _own_reduce
    try:
        from triton.runtime import interpreter
    except ImportError:
        return False
    scan_ops, reduce_ops = getattr(interpreter, "ScanOps", None), getattr(interpreter, "ReduceOps", None)
    if not (hasattr(scan_ops, "generic_scan") and hasattr(reduce_ops, "generic_reduce")):
        return False
    if scan_ops.generic_scan is not _tree_scan:
        _own_scan = scan_ops.generic_scan
        scan_ops.generic_scan = _tree_scan
    if reduce_ops.generic_reduce is not _tree_reduce:
        _own_reduce = reduce_ops.generic_reduce
        reduce_ops.generic_reduce = _tree_reduce
    return True


def uninstall() -> None:
    """Puts the interpreter's own element-by-element scan and reduction back (tests compare them)."""
    from triton.runtime import interpreter

    if installed():
        interpreter.ScanOps.generic_scan = _own_scan
        interpreter.ReduceOps.generic_reduce = _own_reduce


def installed() -> bool:
    try:
        from triton.runtime import interpreter
    except ImportError:
        return False
    return (
        getattr(getattr(interpreter, "ScanOps", None), "generic_scan", None) is _tree_scan
        and getattr(getattr(interpreter, "ReduceOps", None), "generic_reduce", None) is _tree_reduce
    )
