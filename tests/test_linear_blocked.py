"""The Triton flavor's GPU path of linear_logprobs (rlkernels/triton/linear_blocked.py: cuBLAS GEMMs into an
L2-sized logits block, Triton epilogues), checked on CPU tensors: the same epilogue kernels under Triton's
interpreter, the GEMMs as torch.mm (fp32 accumulation of the upcast operands, what cuBLAS computes), against
the float64 reference by the error rule, with small blocks so that every loop runs several times."""

import collections
import pathlib
import sys

import pytest
import torch
from oracle import DTYPES, kernel_flavors
from test_linear_logprobs import MASKED_BIAS_OPTIONS, masked_bias_matches_reference, matches_reference

import rlkernels as rk
from rlkernels.ops import linear_sweep, logp_jacobian
from rlkernels.ops._library import has_native
from rlkernels.triton import linear_blocked

NEEDS_JACOBIAN_OPS = pytest.mark.skipif(
    not has_native("logp_jacobian_chunk"), reason="the C++ extension is not built"
)
TRITON = [f for f in kernel_flavors() if f.kind == "triton" and f.device.type == "cpu"]


@pytest.fixture
def blocked(monkeypatch):
    """The blocked path on CPU tensors, with forward blocks of 16 rows x 96 columns and a backward working
    budget of a few KiB: several row groups, slices and logits blocks at these sizes (a ragged last one of
    each), so d weight adds the later groups' products to the first's."""
    monkeypatch.setitem(linear_blocked.USE_ON, "cpu", True)
    monkeypatch.setattr(linear_blocked, "FORWARD_ROWS", 16)
    monkeypatch.setattr(linear_blocked, "MIN_COLS", 1)
    monkeypatch.setattr(linear_blocked, "BLOCK_BYTES", 16 * 96 * 4)
    monkeypatch.setattr(linear_blocked, "WORK_MIN_BYTES", 0)
    monkeypatch.setattr(linear_blocked, "WORK_CAP_BYTES", 3 * 16 * 24 * 4)
    calls = {"forward": 0, "backward": 0}
    for name, key in (("forward_blocks", "forward"), ("backward_blocks", "backward")):
        real = getattr(linear_blocked, name)

        def counted(*args, real=real, key=key, **kwargs):
            calls[key] += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(linear_blocked, name, counted)
    return calls


OPTIONS = {
    "plain": dict(),
    "bias+softcap+temperature+entropy": dict(bias=True, softcap=7.0, temperature=0.8, return_entropy=True),
    "ignored rows+sum_pi_squared": dict(ignore=True, return_sum_pi_squared=True),
}


@pytest.mark.parametrize("option", list(OPTIONS))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend", TRITON)
def test_blocked_path_matches_float64_reference(backend, dtype, option, blocked, seed):
    matches_reference(backend, dtype, OPTIONS[option], option)
    assert blocked == {"forward": 1, "backward": 1}  # the blocked path ran, not the fused kernels


@pytest.mark.parametrize("option", list(MASKED_BIAS_OPTIONS))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend", TRITON)
def test_blocked_path_masked_bias(backend, dtype, option, blocked, seed):
    """A -inf head bias on the blocked path's epilogues (the fused kernels' test: test_linear_logprobs.py)."""
    masked_bias_matches_reference(backend, dtype, option)
    assert blocked == {"forward": 1, "backward": 1}


@pytest.mark.parametrize("epi_rows", [4, 8, 16, 64])
@pytest.mark.parametrize("backend", TRITON)
def test_epilogue_tile_rows_keep_the_answer(backend, epi_rows, blocked, monkeypatch, seed):
    """The epilogues' rows per program (EPI_ROWS, which benchmarks/linear_blocked_sweep.py varies on a GPU)
    change the programs, not the result: every output against the float64 reference, every option on."""
    monkeypatch.setattr(linear_blocked, "EPI_ROWS", epi_rows)
    _every_output_matches(backend, f"EPI_ROWS={epi_rows}", blocked)


def _every_output_matches(backend, label, blocked):
    """The blocked path with every option on (bias, softcap, temperature, ignored rows, entropy, Σπ²) against
    the float64 reference: every output and gradient."""
    kw = dict(
        bias=True, ignore=True, softcap=7.0, temperature=0.8, return_entropy=True, return_sum_pi_squared=True
    )
    matches_reference(backend, torch.float32, kw, label)
    assert blocked == {"forward": 1, "backward": 1}


@pytest.mark.parametrize("cols,tiles", [(4, 3), (16, 4)])
@pytest.mark.parametrize("backend", TRITON)
def test_epilogue_column_loops_keep_the_answer(backend, cols, tiles, blocked, monkeypatch, seed):
    """The epilogues' column loops over several tiles: the statistics loop over a slice's tiles of EPI_COLS,
    the d logits programs over DLOGITS_TILES of them each. The backward's slices here are 16 columns (13 the
    last): 4 x 3 gives each row tile two programs, of three tiles and of one (ragged in the last slice);
    16 x 4 one program whose tiles run past the slice."""
    monkeypatch.setattr(linear_blocked, "EPI_COLS", cols)
    monkeypatch.setattr(linear_blocked, "DLOGITS_TILES", tiles)
    _every_output_matches(backend, f"EPI_COLS={cols}/DLOGITS_TILES={tiles}", blocked)


@pytest.mark.parametrize("backend", TRITON)
def test_epilogue_launch_options_reach_both_epilogues(backend, blocked, monkeypatch, seed):
    """EPI_LAUNCH (the sweep's "epi unfused": every product rounded, as logprobs_from_logits' kernels) goes to
    the statistics and the d logits launches alike, and keeps the answer."""
    from rlkernels.triton._softmax import UNFUSED

    launched = []
    for name in ("_block_stats_kernel", "_block_dlogits_kernel"):
        kernel = getattr(linear_blocked, name)
        monkeypatch.setattr(linear_blocked, name, _Recording(kernel, name, launched))
    monkeypatch.setattr(linear_blocked, "EPI_LAUNCH", UNFUSED)
    _every_output_matches(backend, "EPI_LAUNCH=UNFUSED", blocked)
    assert {name for name, _ in launched} == {"_block_stats_kernel", "_block_dlogits_kernel"}
    assert all(options.get("enable_fp_fusion") is False for _, options in launched)


class _Recording:
    """A Triton kernel whose launches record their keyword options."""

    def __init__(self, kernel, name, launched):
        self.kernel, self.name, self.launched = kernel, name, launched

    def __getitem__(self, grid):
        def launch(*args, **options):
            self.launched.append((self.name, options))
            return self.kernel[grid](*args, **options)

        return launch


@pytest.mark.parametrize("n,vocab,d", [(8192, 128256, 4096), (32768, 151936, 4096), (1024, 128256, 8192)])
def test_block_shapes_fit_the_budgets(n, vocab, d):
    """The forward's logits block stays inside BLOCK_BYTES; the backward's three buffers (a row group's fp32
    d hidden, its bf16 d z slice, the fp32 logits block) inside WORK_PER_HIDDEN x d hidden's bytes (from
    N·D = 32M up; WORK_MIN_BYTES below) and WORK_CAP_BYTES, with GEMMs tall and wide enough for cuBLAS."""
    rows, cols = linear_blocked.forward_shape(n, vocab, None)
    assert rows * cols * 4 <= linear_blocked.BLOCK_BYTES and rows >= 1024 and cols >= 1024
    group, cols, rows = linear_blocked.backward_shape(n, vocab, d, 2, None)
    work = group * d * 4 + group * cols * 2 + rows * cols * 4
    assert work <= min(linear_blocked.WORK_CAP_BYTES, max(linear_blocked.WORK_MIN_BYTES, 1.5 * n * d * 2))
    if n * d >= 32 << 20:
        assert work <= linear_blocked.WORK_PER_HIDDEN * n * d * 2
    assert rows * cols * 4 <= linear_blocked.BLOCK_BYTES
    assert group >= min(n, 2048) and cols >= 4096 and rows * cols >= 8 << 20  # 256 tiles of 128 x 256


# The H200 run's Liger-Kernel fused linear CE at N=8192, V=128256, D=4096, bf16, fwd+bwd: peak working memory
# (max_memory_allocated above the inputs, the returned gradients included), MiB (../shared/gpu/README.md).
LIGER_PEAK_MIB = {(8192, 128256, 4096): 1191}


def _gpu_cost(n, vocab, d, head_grad=True, backend="triton"):
    """benchmarks/gpu_cost.py's count of a GPU flavor's path (the Triton flavor's unless told), forward +
    backward, on fake CUDA tensors (bf16)."""
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))
    import gpu_cost

    def make(mode):
        cuda = torch.device("cuda")
        return dict(
            hidden=torch.empty(n, d, dtype=torch.bfloat16, device=cuda).requires_grad_(),
            weight=torch.empty(vocab, d, dtype=torch.bfloat16, device=cuda).requires_grad_(head_grad),
            labels=torch.empty(n, dtype=torch.int64, device=cuda),
        )

    def call(hidden, weight, labels):
        return rk.linear_logprobs(hidden, weight, labels, backend=backend)

    return gpu_cost.count(call, make)


# (N, D, V) of the models users train: Qwen2.5-1.5B, 7B and 14B, Llama-3-8B and 70B, Gemma-2-2B.
LLM_SHAPES = [(8192, 1536, 151936), (8192, 3584, 152064), (8192, 5120, 152064), (8192, 4096, 128256),
              (4096, 8192, 128256), (8192, 2304, 256000)]  # fmt: skip


@pytest.mark.parametrize("head_grad", [True, False], ids=["trainable", "frozen"])
@pytest.mark.parametrize("n,d,vocab", LLM_SHAPES)
def test_gpu_gemms_are_aligned(n, d, vocab, head_grad):
    """Every cuBLAS GEMM of the GPU path, at the shapes users train, has operands and output whose rows and
    starts are 16-byte aligned, as cuBLAS's fast kernels want: at D=3584, V=152064 the backward's logits
    block was 7170 columns wide (rows 8 bytes off), and the H200 measured that fwd+bwd at 4x its D=4096
    time (benchmarks/results/h200/2026-11-26/)."""
    cost = _gpu_cost(n, vocab, d, head_grad)
    gemms = [x for x in cost.launches if x.flops]
    assert len(gemms) >= (4 if head_grad else 3)
    assert all(x.alignment >= 16 for x in gemms), sorted({x.alignment for x in gemms})


@pytest.mark.parametrize("n,d,vocab", [*LLM_SHAPES, (1024, 4096, 128256)])
def test_gpu_frozen_head_streams_the_vocabulary(n, d, vocab):
    """The frozen head on a GPU (Triton flavor, bf16, fake CUDA tensors: benchmarks/gpu_cost.py records each
    launch), ops/logp_jacobian.py: per block of rows and vocabulary chunk, 2 GEMMs (the logits, then A += e @
    W_chunk) around one chunk kernel, one finish a block; every row's 2·2·V·D FLOPs once; no copy of a chunk
    (e leaves the kernel in bf16, GEMM 2's operand); no [N, V] nor [R, V] buffer. Working memory at most
    twice d hidden's bytes (the bf16 Jacobian, then its product with d logp in the backward): Liger-Kernel's
    (its bf16 grad_input and a logits chunk of about as many bytes; 189 MiB measured at N=8192, D=4096,
    V=128256, benchmarks/results/h200/2026-11-27/), where the row sweep's was 387 MiB; where d hidden is
    smaller than GPU_MIN_BUDGET (N=1024, and N=8192 at D=1536), the chunk's buffers take that instead, so
    that its GEMMs outlast the host's issue of its launches."""
    cost = _gpu_cost(n, vocab, d, head_grad=False)
    rows, columns = logp_jacobian.gpu_blocks(n, vocab, d, 2, 2)
    blocks, chunks = -(-n // rows), -(-vocab // columns)
    count = collections.Counter(x.name for x in cost.launches)
    assert count["_chunk_kernel"] == count["mm"] == count["addmm"] == blocks * chunks, count
    assert count["_finish_kernel"] == blocks, count
    assert cost.flops == 2 * 2 * n * vocab * d
    assert not [x.name for x in cost.launches if x.name.startswith("_logits")]
    copies = [x for x in cost.launches if x.name == "_to_copy" and x.bytes >= rows * columns * 2]
    assert not copies, [(x.name, x.bytes) for x in copies]
    budget = max(n * d * 2, logp_jacobian.GPU_MIN_BUDGET)
    assert rows * columns * 6 + rows * d * 4 <= budget, (rows, columns)  # the chunk in d hidden's bytes
    # Whole chunks at every one of these shapes: as few launches as the largest batches take a logit (with
    # chunks sized to d hidden alone, N=1024 took 192 chunks of 256 x 2688 where it now takes 16).
    assert (rows, columns) == (min(n, logp_jacobian.GPU_ROWS), min(vocab, logp_jacobian.GPU_COLUMNS))
    assert cost.peak_bytes <= n * d * 2 + budget + 64 * n, (cost.peak_bytes / 2**20, budget / 2**20)


@NEEDS_JACOBIAN_OPS
def test_gpu_frozen_head_streams_the_vocabulary_cuda_flavor():
    """The CUDA C++ flavor's frozen head (fake CUDA tensors, bf16, N=8192 D=4096 V=128256): the same stream
    as the Triton flavor's, its chunk and finish the native ops (csrc/cuda/logp_jacobian.cu); no host sync,
    and the working memory of twice d hidden's bytes."""
    n, d, vocab = 8192, 4096, 128256
    cost = _gpu_cost(n, vocab, d, head_grad=False, backend="cuda")
    rows, columns = logp_jacobian.gpu_blocks(n, vocab, d, 2, 2)
    blocks, chunks = -(-n // rows), -(-vocab // columns)
    count = collections.Counter(x.name for x in cost.launches)
    assert count["logp_jacobian_chunk"] == count["mm"] == count["addmm"] == blocks * chunks, count
    assert count["logp_jacobian_finish"] == blocks, count
    assert not [x.name for x in cost.launches if x.kind == "triton"]
    assert cost.flops == 2 * 2 * n * vocab * d and not cost.syncs
    assert cost.peak_bytes <= 2 * n * d * 2 + 64 * n, cost.peak_bytes / 2**20


@pytest.mark.parametrize("n,d,vocab", LLM_SHAPES)
def test_gpu_row_sweep_blocks_fill_whole_gemm_tiles(n, d, vocab):
    """The row sweep's GPU blocks (frozen head, linear_policy_loss) hold a multiple of 128 rows, whole row
    tiles of cuBLAS's sm_90 kernels, inside the block's byte budget."""
    rows = linear_sweep.rows_per_block(n, vocab, torch.device("cuda"))
    assert rows % linear_sweep.GPU_ROW_MULTIPLE == 0 and rows >= 256, rows
    assert rows * vocab * 4 <= linear_sweep.BLOCK_BYTES["cuda"]


def test_gpu_frozen_head_makes_no_host_sync():
    """The frozen head's row sweep on a GPU (fake CUDA tensors) computes every row, an ignored one giving 0
    and no gradient in the logits kernels, as the fused path does: no nonzero() host sync selecting the
    labelled rows (the H200 trace of the path that did had the GPU idle 3.0 ms a call), and no [N, D] copies
    gathering and scattering them; its 2 GEMMs a block, and one block's buffers alive at a time."""
    n, d, vocab = 8192, 4096, 128256
    cost = _gpu_cost(n, vocab, d, head_grad=False)
    assert not cost.syncs, cost.syncs
    assert cost.flops == 2 * 2 * n * vocab * d
    assert not [x for x in cost.launches if x.name in ("index", "index_put_", "index_put")], [
        x.name for x in cost.launches
    ]
    # Working memory: the bf16 Jacobian [N, D] and the larger of one block's chunk buffers (fp32 logits and
    # bf16 e [R, C], A [R, D]) and the backward's d hidden (the product written in its dtype).
    rows, columns = logp_jacobian.gpu_blocks(n, vocab, d, 2, 2)
    budget = n * d * 2 + max(rows * columns * 6 + rows * d * 4, n * d * 2) + 64 * n
    assert cost.peak_bytes <= budget, (cost.peak_bytes / 2**20, budget / 2**20)


@pytest.mark.parametrize(
    "backend", ["triton", *(pytest.param(b, marks=NEEDS_JACOBIAN_OPS) for b in ("cuda", "auto"))]
)
def test_gpu_frozen_head_linear_policy_loss_packed(backend):
    """linear_policy_loss with a frozen head on a GPU (fake CUDA tensors, bf16, 16 x 512 tokens, D=4096,
    V=128256), every token kept (packed sequences; a fake nonzero() selects every row): the vocabulary
    stream's 2 GEMMs (ops/logp_jacobian.py); one host sync, the nonzero() that leaves masked tokens out of the
    GEMMs (a batch of responses is padded, and the GEMMs it saves outweigh the sync); no [M, D] gather or
    scatter when it selects every row; one policy_loss launch a block. Working memory at most twice d hidden's
    bytes, as the frozen head's linear_logprobs (Liger-Kernel's 189 MiB at this shape): d hidden held in
    hidden's dtype, and one block's buffers."""
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))
    import gpu_model

    n, d, vocab = 16 * 512, 4096, 128256
    cost = gpu_model.frozen_loss_cost(n, vocab, d, backend)
    assert cost.syncs == ["nonzero"], cost.syncs
    assert cost.flops == 2 * 2 * n * vocab * d
    gathers = [x.name for x in cost.launches if x.name in ("index", "index_put_", "index_put")]
    assert not gathers, gathers
    rows, columns = logp_jacobian.gpu_blocks(n, vocab, d, 2, 2)
    chunk = "logp_jacobian_chunk" if backend == "cuda" else "_chunk_kernel"
    count = collections.Counter(x.name for x in cost.launches)
    assert count[chunk] == -(-n // rows) * -(-vocab // columns), count
    # The policy loss: one forward launch a block, whose saved gradient is d loss / d logp (no autograd round
    # trip, no backward launch), and the two whole-batch calls (the values checked before the GEMMs, the loss
    # and stats after). "auto": each op's own, Triton's stream and the CUDA C++ loss (host-bound calls).
    native_loss = backend in ("cuda", "auto")
    forward, backward = ("policy_loss", "policy_loss_backward") if native_loss else (
        "_policy_forward_kernel", "_policy_backward_saved_kernel"
    )  # fmt: skip
    assert count[forward] == -(-n // rows) + 2 and not count[backward], count
    if backend == "auto":
        assert not count["_policy_forward_kernel"], count
    assert cost.peak_bytes <= 2 * n * d * 2 + 64 * n, cost.peak_bytes / 2**20


@pytest.mark.parametrize("n,vocab,d", [(8192, 128256, 4096), (32768, 151936, 4096), (1024, 128256, 4096)])
def test_gpu_working_memory(n, vocab, d):
    """The Triton flavor's GPU path, forward + backward on fake CUDA tensors at LLM sizes (every allocation
    counted while alive, benchmarks/gpu_cost.py; kernels recorded, not run): the peak above the inputs is the
    two gradients plus the backward's working budget (linear_blocked.backward_shape), nothing of [N, V], no
    fp32 [N, D] or [V, D]; at most Liger's measured peak where the H200 measured it."""
    cost = _gpu_cost(n, vocab, d)
    gradients = (n + vocab) * d * 2
    work = min(max(1.5 * n * d * 2, linear_blocked.WORK_MIN_BYTES), linear_blocked.WORK_CAP_BYTES)
    assert cost.peak_bytes <= gradients + work + 64 * n, (cost.peak_bytes, gradients, work)  # + [N] vectors
    if (n, vocab, d) in LIGER_PEAK_MIB:
        assert cost.peak_bytes <= LIGER_PEAK_MIB[n, vocab, d] * 2**20
    assert cost.flops == 4 * 2 * n * vocab * d  # the forward GEMM, and the backward's recompute, d W, d h
    assert not cost.syncs
