"""The GEMM step of the Triton kernels, `acc + a @ b`, with the interpreter's tl.dot replaced where it is not
faithful to a GPU.

Under TRITON_INTERPRET=1, tl.dot is numpy's matmul, and that rounds an output element differently
depending on its column in the tile (the BLAS kernel does not treat every column alike): one logit comes
out one ulp apart in two tiles that place its column differently. The log-prob backward recomputes the
forward's logits in tiles of another width (its vocabulary slices), so its log q = z − LSE was off by two
ulps of z, amplified by the entropy term into a d weight error above the error rule's bound
(docs/testing.md, "The interpreter's dot"). A GPU's dot is built to compute every element the same way
wherever it sits (tests/test_triton_dot.py checks it). So the interpreter gets a plain broadcast product
summed over K instead: the same fp32 (or fp64) operations for every element, in the same order. Compiled
for a GPU, INTERPRETED is False and this is tl.dot.
"""

import triton
import triton.language as tl


@triton.jit
def dot_acc(a, b, acc, INTERPRETED: tl.constexpr, ACC: tl.constexpr, INPUT_PRECISION: tl.constexpr):
    """acc [M, N] + a [M, K] @ b [K, N], accumulated in ACC."""
    if INTERPRETED:
        # bf16 operands too: tl.dot on bf16 is wrong under the interpreter; the products are exact in fp32.
        out = acc + tl.sum(a.to(ACC)[:, :, None] * b.to(ACC)[None, :, :], axis=1)
    else:
        # out_dtype: triton 3.6 defaults it to fp32 and rejects an fp64 accumulator
        out = tl.dot(a, b, acc, input_precision=INPUT_PRECISION, out_dtype=ACC)
    return out
