"""`tl.associative_scan` under Triton's interpreter, in log2(n) vectorized steps instead of one Python call of
the combine function per element.

The interpreter scans a combine function other than + and * (`ScanOps.generic_scan`) element by element: for a
segmented scan over a 32-wide chunk that is 31 calls of the combine function on one-element tensors, each a
few dozen interpreted ops. The group-advantage and GAE chunk tests spent most of their time there (the slowest
tests of the suite). `install()` replaces it with a Hillis-Steele scan: step d combines every element with the
one d places before it (d = 1, 2, 4, ...), each step one call of the combine function on whole arrays.

The answer is the same scan in another association order, as a GPU's is: a warp scans in a tree, not left to
right, so this order is nearer the compiled kernels' than the interpreter's own. An exact (integer, max/min,
or segmented-flag) combine gives the same bits; a floating-point sum may round differently in its last bits,
within the float64 oracles' bounds. A combine that is not associative gives a different answer here, as on a
GPU. `test_interpreter_tree_scan.py` compares the two scans. Where the interpreter lacks these internals
(another Triton), nothing is installed and the tests only run slower."""

from __future__ import annotations

import numpy as np

_original = None  # the interpreter's own ScanOps.generic_scan


def _tree_scan(self, input):
    """ScanOps.generic_scan's contract (tensors in, inclusive scans along self.axis out, reversed by the
    caller), in Hillis-Steele steps."""
    import triton.language as tl

    arrays = [np.array(arg.handle.data) for arg in input]
    dtypes = [arg.dtype for arg in input]
    n = arrays[0].shape[self.axis]
    d = 1
    while d < n:
        # Whole-length operands (the interpreter's blocks are powers of 2): each element and the one d
        # before it, rolled round; the first d results are dropped.
        earlier = [np.roll(a, d, axis=self.axis) for a in arrays]
        with np.errstate(all="ignore"):  # the dropped results combine unrelated elements
            out = self.combine_fn.fn(
                *(self.to_tensor(a, t) for a, t in zip(earlier, dtypes, strict=True)),
                *(self.to_tensor(a, t) for a, t in zip(arrays, dtypes, strict=True)),
            )
        out = out if isinstance(out, tuple) else (out,)
        index = [slice(None)] * arrays[0].ndim
        index[self.axis] = slice(d, n)
        index = tuple(index)
        arrays = [a.copy() for a in arrays]
        for a, o in zip(arrays, out, strict=True):
            value = o.handle.data if isinstance(o, tl.core.tensor) else o
            a[index] = np.broadcast_to(np.asarray(value).astype(a.dtype), a.shape)[index]
        d *= 2
    return [self.to_tensor(a, t) for a, t in zip(arrays, dtypes, strict=True)]


def install() -> bool:
    """Installs the tree scan (idempotent); False where the interpreter's internals are not the ones known."""
    global _original
    try:
        from triton.runtime import interpreter
    except ImportError:
        return False
    scan_ops = getattr(interpreter, "ScanOps", None)
    if scan_ops is None or not hasattr(scan_ops, "generic_scan"):
        return False
    if scan_ops.generic_scan is not _tree_scan:
        _original = scan_ops.generic_scan
        scan_ops.generic_scan = _tree_scan
    return True


def uninstall() -> None:
    """Puts the interpreter's own element-by-element scan back (tests compare the two)."""
    from triton.runtime import interpreter

    if installed():
        interpreter.ScanOps.generic_scan = _original


def installed() -> bool:
    try:
        from triton.runtime import interpreter
    except ImportError:
        return False
    return getattr(getattr(interpreter, "ScanOps", None), "generic_scan", None) is _tree_scan
