"""The blocked backward with its logits recompute and d logits epilogue as one persistent GEMM
(rlkernels/triton/linear_gemm_dlogits.py): every gradient under Triton's interpreter against the float64
reference, with a working budget of a few KiB so that there are several row groups and vocabulary slices
(ragged ones) and every slice several tiles; and on fake CUDA tensors, what it launches and holds."""

import pathlib
import sys

import pytest
import torch
from oracle import kernel_flavors
from test_linear_gemm_stats import GPU_SHAPE, TRITON_GPU, counted_calls, offline_h100, skip_before_sm90
from test_linear_logprobs import matches_reference

import rlkernels as rk
from rlkernels.triton import linear_blocked, linear_gemm_dlogits, linear_gemm_stats

TRITON = [f for f in kernel_flavors() if f.kind == "triton" and f.device.type == "cpu"]


def both_gemm_kernels(monkeypatch, work_bytes: int) -> list:
    """linear_logprobs through the GEMM kernels both ways, the blocked backward's loops over a working budget
    of `work_bytes` (its three buffers); the backward kernel's calls counted."""
    monkeypatch.setattr(linear_blocked, "MIN_COLS", 1)
    monkeypatch.setattr(linear_blocked, "WORK_MIN_BYTES", 0)
    monkeypatch.setattr(linear_blocked, "WORK_CAP_BYTES", work_bytes)
    monkeypatch.setattr(linear_gemm_stats, "FORWARD", "gemm_stats")
    monkeypatch.setattr(linear_gemm_dlogits, "BACKWARD", "gemm_dlogits")
    return counted_calls(monkeypatch, linear_gemm_dlogits, "dlogits_slice")


@pytest.fixture
def fused(monkeypatch):
    """both_gemm_kernels on CPU tensors, with a working budget that makes row groups of 10 rows and
    vocabulary slices of 48 columns at D=24 in bf16."""
    monkeypatch.setitem(linear_blocked.USE_ON, "cpu", True)
    return both_gemm_kernels(monkeypatch, 3 * 16 * 24 * 4)


OPTIONS = {
    "plain": dict(),
    "softcap+temperature+entropy": dict(softcap=7.0, temperature=0.8, return_entropy=True),
    "ignored rows+entropy": dict(ignore=True, return_entropy=True),
}


@pytest.mark.parametrize("option", list(OPTIONS))
@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16))
@pytest.mark.parametrize("backend", TRITON)
def test_gemm_dlogits_backward_matches_float64_reference(backend, dtype, option, fused, seed):
    matches_reference(backend, dtype, OPTIONS[option], option)
    assert linear_blocked.backward_shape(41, 301, 24, 2, None)[:2] == (10, 48)
    assert len(fused) == 5 * 7  # a call per row group and slice: the kernel ran, not the blocked loop


@pytest.mark.parametrize("subtiles", [1, 2])
@pytest.mark.parametrize("backend", TRITON)
def test_epilogue_subtiles_keep_the_gradients(backend, subtiles, fused, monkeypatch, seed):
    monkeypatch.setattr(linear_gemm_dlogits, "SUBTILES", subtiles)
    kw = dict(softcap=7.0, temperature=0.8, ignore=True, return_entropy=True)
    matches_reference(backend, torch.bfloat16, kw, f"SUBTILES={subtiles}")
    assert len(fused) == 5 * 7


@pytest.fixture
def gpu_fused(monkeypatch):
    """both_gemm_kernels on CUDA tensors at GPU_SHAPE, with a working budget of row groups of 256 rows and
    vocabulary slices of 400 columns (5 x 6, the last of each ragged; a slice is three whole 128-column
    tiles and a ragged one)."""
    return both_gemm_kernels(monkeypatch, 3 * 256 * 200 * 4)


@pytest.mark.parametrize("option", list(OPTIONS))
@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16))
@pytest.mark.parametrize("backend", TRITON_GPU)
def test_gpu_gemm_dlogits_backward_matches_float64_reference(backend, dtype, option, gpu_fused, seed):
    """The compiled kernels (TMA, wgmma) on a GPU, forward and backward: every gradient against float64.
    The next GPU lease runs it; BACKWARD stays "blocked" until it passes."""
    skip_before_sm90()
    matches_reference(backend, dtype, OPTIONS[option], option, shape=GPU_SHAPE)
    n, d, vocab = GPU_SHAPE
    assert linear_blocked.backward_shape(n, vocab, d, 2, None)[:2] == (256, 400)
    assert len(gpu_fused) == 5 * 6  # a call per row group and slice


def test_gpu_backward_writes_no_logits(monkeypatch):
    """On fake CUDA tensors at N=8192 D=4096 V=128256 (bf16, forward + backward, both GEMM kernels on):
    one d logits kernel per row group and slice, no `_block_dlogits_kernel`, cuBLAS only for d weight and
    d hidden, no host sync; and the peak is the blocked path's less its fp32 logits block."""
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))
    import gpu_cost

    n, d, vocab = 8192, 4096, 128256

    def make(mode):
        cuda = torch.device("cuda")
        return dict(
            hidden=torch.empty(n, d, dtype=torch.bfloat16, device=cuda).requires_grad_(),
            weight=torch.empty(vocab, d, dtype=torch.bfloat16, device=cuda).requires_grad_(),
            labels=torch.empty(n, dtype=torch.int64, device=cuda),
        )

    def call(hidden, weight, labels):
        return rk.linear_logprobs(hidden, weight, labels, backend="triton")

    with offline_h100():
        blocked = gpu_cost.count(call, make)
        monkeypatch.setattr(linear_gemm_stats, "FORWARD", "gemm_stats")
        monkeypatch.setattr(linear_gemm_dlogits, "BACKWARD", "gemm_dlogits")
        cost = gpu_cost.count(call, make)
    group, cols, rows = linear_blocked.backward_shape(n, vocab, d, 2, None)
    names = [x.name for x in cost.launches if x.kind == "triton"]
    assert names.count("_gemm_dlogits_kernel") == -(-n // group) * -(-vocab // cols)
    assert "_block_dlogits_kernel" not in names and "_block_stats_kernel" not in names
    assert cost.flops == 2 * 2 * n * vocab * d  # d weight and d hidden: the logits are no cuBLAS GEMM's
    assert not cost.syncs
    block = rows * cols * 4
    assert cost.peak_bytes <= blocked.peak_bytes - block + 16 * n, (cost.peak_bytes, blocked.peak_bytes)
