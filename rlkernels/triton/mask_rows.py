"""A mask row's sum, computed by one program inside another kernel's launch.

An estimator that needs every response's length Σ_t m_t (opo's length-weighted baseline) takes it from the
kernel that needs it: that launch gets a program per row more, each summing its row into an fp64 scratch
(`_finish.publish`), and its last program (`_finish.last_program`), or the next launch, reads them all. No
`mask.sum(-1)` launch before it (docs/gpu_token_ops.md, "The advantage estimators").
"""

import triton
import triton.language as tl

from rlkernels._backend import triton_interpreting
from rlkernels.triton._common import next_pow2
from rlkernels.triton._finish import publish
from rlkernels.triton.advantages import _token_mask


@triton.jit
def publish_row_sum(m_ptr, len_ptr, row, T, MASK_KIND: tl.constexpr, BLOCK: tl.constexpr):
    """len[row] = Σ_t m[row, t] in fp64 (an integer mask: nonzero counts 1; a float one: its weights), for
    m [B, T] of kind MASK_KIND (advantages.MASK_KINDS), BLOCK positions at a time; published for a reader
    in another program of the launch."""
    lanes = tl.arange(0, BLOCK)
    total = tl.zeros([BLOCK], tl.float64)
    for t0 in range(0, T, BLOCK):
        inside = t0 + lanes < T
        m, _ = _token_mask(m_ptr, row.to(tl.int64) * T + t0 + lanes, inside, MASK_KIND, tl.float64)
        total += m
    one = tl.arange(0, 1)
    publish(len_ptr + row + one, tl.sum(total, axis=0, keep_dims=True), one < 1)


def row_block(t: int) -> int:
    """Mask positions a row program reads at a time: up to 2048 (8 fp64 registers a thread over the walks'
    8 warps); the interpreter runs one numpy op per block, so up to 1 << 14 there."""
    return min(next_pow2(t), (1 << 14) if triton_interpreting() else 2048)
