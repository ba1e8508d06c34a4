"""linear_logprobs' forward as one persistent GEMM with the softmax statistics in its epilogue
(rlkernels/triton/linear_gemm_stats.py): its numbers under Triton's interpreter against the float64
reference, with tiles small enough that every program walks several tiles, K runs ragged and the last
vocabulary tile is partial; which operands it takes; and, on fake CUDA tensors, that it runs one kernel and
no GEMM besides and keeps no logits in memory."""

import contextlib
import pathlib
import sys

import pytest
import torch
from oracle import assert_oracle, kernel_flavors
from test_linear_logprobs import make_case, matches_reference

import rlkernels as rk
from rlkernels.triton import linear_gemm_stats

TRITON = [f for f in kernel_flavors() if f.kind == "triton" and f.device.type == "cpu"]
# The compiled kernel on CUDA tensors (a GPU machine; none here), at its own tiles (128 x 128, K steps of
# 64): 9 row blocks (the last 76 rows) x 17 vocabulary tiles (the last 52 columns), 153 tiles for 132
# programs, so that some programs walk two; K in 3 whole steps and one of 8; rows of 400 B (TMA's 16-byte
# rule). It takes CUDA tensors of sm_90 and later (TMA and wgmma).
TRITON_GPU = [f for f in kernel_flavors() if f.kind == "triton" and f.device.type == "cuda"]
GPU_SHAPE = (1100, 200, 2100)
HALF = (torch.bfloat16, torch.float16)


def skip_before_sm90():
    """Skip on a GPU without TMA and wgmma (the kernel's operands then take the blocked path)."""
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("the GEMM kernels run on sm_90 and later (TMA, wgmma)")


def counted_calls(monkeypatch, module, name: str) -> list:
    """`module.name` wrapped to append to the list returned at each call."""
    calls = []
    real = getattr(module, name)

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls


@pytest.fixture
def gemm_stats(monkeypatch):
    """linear_logprobs' forward through linear_gemm_stats (FORWARD), its calls counted."""
    monkeypatch.setattr(linear_gemm_stats, "FORWARD", "gemm_stats")
    return counted_calls(monkeypatch, linear_gemm_stats, "forward_tiles")


OPTIONS = {
    "plain": dict(),
    "softcap+temperature+entropy": dict(softcap=7.0, temperature=0.8, return_entropy=True),
    "ignored rows+entropy+sum_pi_squared": dict(ignore=True, return_entropy=True, return_sum_pi_squared=True),
}


@pytest.mark.parametrize("option", list(OPTIONS))
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("backend", TRITON)
def test_gemm_stats_forward_matches_float64_reference(backend, dtype, option, gemm_stats, seed):
    matches_reference(backend, dtype, OPTIONS[option], option)
    assert gemm_stats == [1]  # the forward ran the GEMM kernel, once


@pytest.mark.parametrize("backend", TRITON)
def test_row_chunks_keep_the_answer(backend, gemm_stats, monkeypatch, seed):
    """A batch larger than a launch's statistics buffer (STATS_BYTES) runs in row chunks, each its kernel
    and its combine: here chunks of one 16-row block, three calls for 41 rows (the last ragged)."""
    monkeypatch.setattr(linear_gemm_stats, "STATS_BYTES", 1)
    kw = dict(softcap=7.0, temperature=0.8, ignore=True, return_entropy=True, return_sum_pi_squared=True)
    matches_reference(backend, torch.bfloat16, kw, "row chunks")
    assert gemm_stats == [1, 1, 1]


@pytest.mark.parametrize("subtiles", [1, 2])
@pytest.mark.parametrize("backend", TRITON)
def test_epilogue_subtiles_keep_the_answer(backend, subtiles, gemm_stats, monkeypatch, seed):
    """The epilogue's column subtiles (SUBTILES: the tile whole or by halves) change the
    registers, not the result: every option on, against float64."""
    monkeypatch.setattr(linear_gemm_stats, "SUBTILES", subtiles)
    kw = dict(softcap=7.0, temperature=0.8, ignore=True, return_entropy=True, return_sum_pi_squared=True)
    matches_reference(backend, torch.bfloat16, kw, f"SUBTILES={subtiles}")
    assert gemm_stats == [1]


@pytest.mark.parametrize("option", list(OPTIONS))
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("backend", TRITON_GPU)
def test_gpu_gemm_stats_forward_matches_float64_reference(backend, dtype, option, gemm_stats, seed):
    """The compiled kernel (TMA, wgmma, the epilogue's two paths) on a GPU: every output and gradient
    against float64 with each option set (the backward: the blocked path's cuBLAS GEMMs and epilogues over
    this forward's saved statistics). The next GPU lease runs it; FORWARD stays "blocked" until it passes."""
    skip_before_sm90()
    matches_reference(backend, dtype, OPTIONS[option], option, shape=GPU_SHAPE)
    assert gemm_stats == [1]


@pytest.mark.parametrize("backend", TRITON)
def test_a_bias_or_a_chunk_size_takes_the_other_forward(backend, gemm_stats):
    """A head with a bias, or a call with chunk_size, takes the forward the kernel does not replace (its
    answer still against float64)."""
    hidden, weight, bias, labels = make_case((41,), 24, 301, torch.bfloat16, bias=True)
    for b, chunk in ((bias, None), (None, 64)):
        got = rk.linear_logprobs(hidden, weight, labels, bias=b, chunk_size=chunk, backend=backend)
        same = rk.linear_logprobs(hidden, weight, labels, bias=b, chunk_size=chunk, backend="reference")
        up = None if b is None else b.double()
        want = rk.linear_logprobs(hidden.double(), weight.double(), labels, bias=up, backend="reference")
        assert_oracle(f"{backend}/bias={b is not None}/chunk={chunk}", got, same, want)
    assert gemm_stats == []


@pytest.mark.parametrize("backend", TRITON)  # CPU tensors: under the interpreter (none on a GPU machine)
def test_main_loop_only_is_the_gemm(backend, monkeypatch):
    """MAIN_LOOP_ONLY (a measurement of the main loop apart from the epilogue) still computes every logit:
    each row's sum of its logits lands in `target`, as float64's (bf16 operands, fp32 accumulation)."""
    monkeypatch.setattr(linear_gemm_stats, "MAIN_LOOP_ONLY", True)
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(41, 24, generator=gen, device="cpu").bfloat16()
    weight = torch.randn(301, 24, generator=gen, device="cpu").bfloat16()
    labels = torch.zeros(41, dtype=torch.int64)
    part = torch.zeros(3, linear_gemm_stats.num_splits(301), 41)
    target = torch.zeros(41)
    linear_gemm_stats.forward_tiles(hidden, weight, labels, part, target, 1.0, None, -100, False, False)
    same = (hidden.float() @ weight.float().T).sum(1)  # torch's fp32 GEMM of the same operands
    assert_oracle("main loop only", target, same, (hidden.double() @ weight.double().T).sum(1))
    assert not part.any()  # no statistics


@pytest.mark.parametrize("backend", TRITON)  # CPU tensors: under the interpreter (none on a GPU machine)
def test_operands_the_kernel_takes(backend):
    """16-bit operands with 16-byte aligned, contiguous rows and starts (TMA's rules); anything else takes
    the blocked path, as a bias or a chunk size does (linear_logprobs_forward)."""
    supported = linear_gemm_stats.supported
    bf16 = dict(dtype=torch.bfloat16)
    w = torch.zeros(64, 32, **bf16)
    assert supported(torch.zeros(8, 32, **bf16), w)  # CPU tensors: under the interpreter (the tests')
    assert supported(torch.zeros(8, 32, dtype=torch.float16), w.half())
    assert supported(torch.zeros(8, 48, **bf16)[:, 8:40], w)  # rows 96 B apart, starting 16 B in
    assert not supported(torch.zeros(8, 32), w.float())  # fp32: the blocked path
    assert not supported(torch.zeros(8, 32, **bf16), w.half())  # mixed dtypes
    assert not supported(torch.zeros(8, 20, **bf16), torch.zeros(64, 20, **bf16))  # 40-byte rows
    assert not supported(torch.zeros(32, 8, **bf16).t(), w)  # a transposed view
    assert not supported(torch.zeros(8, 40, **bf16)[:, 4:36], w)  # rows 80 B apart, starting 8 B in
    assert not supported(torch.zeros(8, 48, **bf16)[:, 4:36], w)  # rows 96 B apart, starting 8 B in
    shifted = torch.zeros(64 * 32 + 1, **bf16)[1:].view(64, 32)  # starts 2 B in
    assert not supported(torch.zeros(8, 32, **bf16), shifted)


@contextlib.contextmanager
def offline_h100():
    """Triton's active driver answers as an H100 (sm_90, 132 SMs), as in the compile check."""
    from triton.runtime import driver

    from rlkernels.compile_check.targets import TARGETS, OfflineDriver

    previous = driver._active
    driver.set_active(OfflineDriver(TARGETS[90]))
    try:
        yield
    finally:
        driver._active = previous


@pytest.mark.parametrize("n,vocab,d", [(8192, 128256, 4096), (32768, 151936, 4096)])
def test_gpu_forward_is_one_kernel_without_logits(n, vocab, d, monkeypatch):
    """On fake CUDA tensors (benchmarks/gpu_cost.py: launches recorded, every allocation counted), the no-grad
    forward through the GEMM kernel at LLM sizes: the kernel, then the combine, per row chunk; no cuBLAS
    GEMM, no host sync, and nothing near [N, V] allocated: the peak is one chunk's tiles' statistics and the
    [N] outputs."""
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))
    import gpu_cost

    monkeypatch.setattr(linear_gemm_stats, "FORWARD", "gemm_stats")

    def make(mode):
        cuda = torch.device("cuda")
        return dict(
            hidden=torch.empty(n, d, dtype=torch.bfloat16, device=cuda),
            weight=torch.empty(vocab, d, dtype=torch.bfloat16, device=cuda),
            labels=torch.empty(n, dtype=torch.int64, device=cuda),
        )

    def call(hidden, weight, labels):
        with torch.no_grad():
            return rk.linear_logprobs(hidden, weight, labels, backend="triton", return_entropy=True)

    with offline_h100():
        cost = gpu_cost.count(call, make)
    with monkeypatch.context() as m:
        m.setenv("TRITON_INTERPRET", "0")  # the GPU's tiles, as the launches above had
        chunks = -(-n // linear_gemm_stats.rows_per_launch(vocab, 3))
    triton = [x.name for x in cost.launches if x.kind == "triton"]
    assert triton == ["_gemm_stats_kernel", "_combine_kernel"] * chunks, triton
    assert not [x for x in cost.launches if x.flops], "a GEMM besides the kernel"
    assert not cost.syncs
    # The statistics of one row chunk (at most STATS_BYTES), not the logits: plus the [N] vectors.
    assert cost.peak_bytes <= linear_gemm_stats.STATS_BYTES + 64 * n, cost.peak_bytes
    assert linear_gemm_stats.STATS_BYTES < 8192 * vocab * 4 / 30


def test_the_sweep_prices_its_gemm_variants():
    """benchmarks/linear_blocked_sweep.py prints the time model's prediction beside the variants it prices
    (MODELED); each is a variant the sweep runs, so a renamed variant cannot lose its prediction unseen."""
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))
    import linear_blocked_sweep as sweep

    names = {name for name, _ in sweep.FORWARD + sweep.BACKWARD}
    assert set(sweep.MODELED) <= names, set(sweep.MODELED) - names
    assert {"gemm_stats", "both gemm kernels"} <= set(sweep.MODELED)
    assert sweep.model_ms("full", "epi rows=8 warps=4", 8192, 4096, 128256) is None
    frozen = {name for name, _ in sweep.FROZEN}
    assert {"default", "row sweep"} <= frozen  # the frozen head's two priced paths are swept
