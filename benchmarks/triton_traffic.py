"""(Project tool, from shared/tools/triton_traffic.py.)

Count the memory traffic and matrix FLOPs of Triton kernels run under the Triton interpreter.

A GPU-free proxy for the roofline: the bytes a kernel loads and stores (every masked-in element, re-reads
included), the distinct bytes it touches, and the FLOPs of its `tl.dot`s. Compare `loaded + stored`
with the minimum the op must move (each input read once, each output written once): a ratio near 1.0
means no wasted traffic. Re-reads that a GPU's L2 would absorb are counted too, so treat GEMM-like tiles
as an upper bound.

Usage (TRITON_INTERPRET=1 must be set before triton is imported):

    from triton_traffic import traffic
    with traffic() as t:
        my_op(x, y)            # any code that launches Triton kernels
    print(t.report())          # or t.loaded, t.stored, t.unique_loaded, t.dot_flops, t.launches

Seen working with triton 3.9.0. It patches the interpreter's builder for the duration of the block.
"""

import contextlib

import numpy as np


class Traffic:
    def __init__(self):
        self.loaded = 0  # bytes loaded, re-reads included
        self.stored = 0  # bytes stored
        self.dot_flops = 0  # 2*M*N*K summed over tl.dot
        self._load_addrs = []  # int64 address arrays, for unique bytes
        self._load_sizes = []

    @property
    def unique_loaded(self):
        if not self._load_addrs:
            return 0
        total = 0
        by_size = {}
        for a, s in zip(self._load_addrs, self._load_sizes, strict=True):
            by_size.setdefault(s, []).append(a)
        for s, arrs in by_size.items():
            total += np.unique(np.concatenate(arrs)).size * s
        return total

    def report(self):
        return (
            f"loaded {self.loaded / 1e6:.3f} MB (distinct {self.unique_loaded / 1e6:.3f} MB), "
            f"stored {self.stored / 1e6:.3f} MB, dot {self.dot_flops / 1e9:.3f} GFLOP"
        )


@contextlib.contextmanager
def traffic():
    from triton.runtime import interpreter as I

    B = I.InterpreterBuilder
    t = Traffic()
    orig_load, orig_store, orig_dot = B.create_masked_load, B.create_masked_store, B.create_dot

    def _size(ptrs):
        return np.dtype(I._get_np_dtype(ptrs.get_element_ty())).itemsize

    def load(self, ptrs, mask, *a, **k):
        m = np.broadcast_to(mask.data, ptrs.data.shape).astype(bool)
        s = _size(ptrs)
        t.loaded += int(m.sum()) * s
        t._load_addrs.append(ptrs.data[m].astype(np.int64).ravel())
        t._load_sizes.append(s)
        return orig_load(self, ptrs, mask, *a, **k)

    def store(self, ptrs, value, mask, *a, **k):
        m = np.broadcast_to(mask.data, ptrs.data.shape).astype(bool)
        t.stored += int(m.sum()) * _size(ptrs)
        return orig_store(self, ptrs, value, mask, *a, **k)

    def dot(self, a, b, d, *args, **kw):
        M, K = a.data.shape[-2:]
        N = b.data.shape[-1]
        batch = int(np.prod(a.data.shape[:-2])) if a.data.ndim > 2 else 1
        t.dot_flops += 2 * M * N * K * batch
        return orig_dot(self, a, b, d, *args, **kw)

    B.create_masked_load, B.create_masked_store, B.create_dot = load, store, dot
    try:
        yield t
    finally:
        B.create_masked_load, B.create_masked_store, B.create_dot = orig_load, orig_store, orig_dot
