"""rlkernels/triton/_dot.py: the GEMM step rounds every output element the same way wherever its column sits
in the tile. The log-prob backward relies on this to recompute the forward's logits bit for bit in tiles of
another width; numpy's matmul (the interpreter's own tl.dot) does not have it. On a GPU the same test checks
that the compiled tl.dot has it too."""

import pytest
import torch
from oracle import kernel_flavors

TRITON = [f for f in kernel_flavors() if f.name in ("triton", "triton-interpret")]
pytestmark = pytest.mark.skipif(not TRITON, reason="no Triton flavor runs here")

if TRITON:
    import triton
    import triton.language as tl

    from rlkernels.triton._dot import dot_acc
    from rlkernels.triton.linear_logprobs import dot_args

    @triton.jit
    def _tile_kernel(
        a_ptr,  # [M, K]
        b_ptr,  # [K, N]
        c_ptr,  # [M, N]
        K,
        INTERPRETED: tl.constexpr,
        ACC: tl.constexpr,
        INPUT_PRECISION: tl.constexpr,
        M: tl.constexpr,
        N: tl.constexpr,
        BLOCK_K: tl.constexpr,
    ):
        rm = tl.arange(0, M)
        rn = tl.arange(0, N)
        acc = tl.zeros((M, N), ACC)
        for k0 in range(0, K, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            a = tl.load(a_ptr + rm[:, None] * K + ks[None, :], mask=ks[None, :] < K, other=0.0)
            b = tl.load(b_ptr + ks[:, None] * N + rn[None, :], mask=ks[:, None] < K, other=0.0)
            acc = dot_acc(a, b, acc, INTERPRETED, ACC, INPUT_PRECISION)
        tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc)


@pytest.mark.parametrize("backend", TRITON, ids=[f.name for f in TRITON])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=str)
def test_an_element_rounds_the_same_in_every_column(backend, dtype, seed):
    m, n, k = 16, 32, 19  # K over two BLOCK_K steps, the last one partial (as D = 19 in the log-prob tests)
    a = (torch.randn(m, k, dtype=torch.float64) * 3).to(dtype)
    col = (torch.randn(k, dtype=torch.float64) * 3).to(dtype)
    flags = dot_args(dtype)
    flags["INPUT_PRECISION"] = "ieee"  # TF32 would round the operands: still per element, but test fp32
    outs = []
    for j in range(n):
        b = (torch.randn(k, n, dtype=torch.float64) * 3).to(dtype)
        b[:, j] = col
        c = torch.empty(m, n, dtype=torch.float64 if dtype == torch.float64 else torch.float32)
        _tile_kernel[(1,)](a, b.contiguous(), c, k, **flags, M=m, N=n, BLOCK_K=16)
        outs.append(c[:, j])
    first = outs[0]
    for j, out in enumerate(outs):
        assert torch.equal(out, first), f"column {j}: {(out - first).abs().max().item():.3e} from column 0"
    exact = a.double() @ col.double()
    ulps = 4 * k * torch.finfo(first.dtype).eps * (a.double().abs() @ col.double().abs())
    assert ((first.double() - exact).abs() <= ulps).all()
