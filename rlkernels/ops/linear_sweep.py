"""The row sweep: a loss's gradients from hidden states with the logits computed once (docs/row_sweep.md).

`linear_logprobs` streams the vocabulary and keeps no logits, so its backward must recompute them: 4
GEMM-equivalents for forward + backward. When the caller can say, per token, d loss / d logp and
d loss / d entropy as soon as that token's log-prob is known (a token-level policy loss can: its aggregation
weights depend on mask counts only), the gradients can be produced in the forward instead. The sweep takes
blocks of rows; per block it computes the [R, V] logits of the whole vocabulary (GEMM 1), the row statistics
and the softmax gradient with the fused `logprobs_from_logits` kernels of the chosen backend, then
d hidden = dz @ W (GEMM 2) and d W += dzᵀ @ hidden (GEMM 3). The [R, V] block is the only vocabulary-sized
buffer; nothing of size [N, V] exists.

Each block's GEMMs read and write the whole head, so rows per block trade GEMM efficiency (and traffic on
W and d W) against the [R, V] buffer: BLOCK_BYTES sets it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from rlkernels._dtypes import acc_dtype
from rlkernels._gemm import gemm_fp32
from rlkernels.ops import logp_jacobian
from rlkernels.ops import sampling as sampling_ops
from rlkernels.ops._library import has_native, op

# Bytes of one [R, V] fp32 logits block. CPU: the softmax gradient overwrites it (INTO_LOGITS), and the
# block stays under 5% of eager's peak at issue 12's shape with rows enough (130 at V=128k) that re-reading
# W and d W per block stays well under the GEMM time (half the rows measured 1.2x the floor, not 1.07x).
# GPU: the gradient is a second block; 512 rows at V=128k, enough for the block's GEMMs to hide the
# launches of its dozen small kernels (unmeasured on a GPU yet).
BLOCK_BYTES = {"cpu": 64 << 20, "cuda": 256 << 20}
# Fewest rows per block: fewer make every GEMM bound by the read of W.
MIN_ROWS = 16
# CPU 16-bit heads are converted to fp32 per vocabulary slice of at most this many bytes (the GEMMs run in
# fp32, as the fused CPU kernel's do), never as a whole [V, D] fp32 copy.
SLICE_BYTES = 32 << 20


class LogitOptions(NamedTuple):
    """How logits become log-probs (as `linear_logprobs`)."""

    temperature: float
    softcap: float | None
    ignore_index: int


class SweepResult(NamedTuple):
    logp: torch.Tensor  # [M] acc dtype
    entropy: torch.Tensor | None  # [M] acc dtype, when asked
    sum_pi_squared: torch.Tensor | None  # [M] acc dtype, when asked
    grad_hidden: torch.Tensor | None  # [M, D] acc dtype
    grad_weight: torch.Tensor | None  # [V, D] acc dtype
    grad_bias: torch.Tensor | None  # [V] acc dtype
    threshold: torch.Tensor | None = None  # [M] acc dtype: the kept set's z_v >= tau (with truncation)


# (block rows r0, r1, logp [R], entropy [R] or None) -> (d loss / d logp [R], d loss / d entropy [R] or None)
TokenGrads = Callable[[int, int, torch.Tensor, "torch.Tensor | None"], tuple]


# GPU blocks take a multiple of this many rows: the row granularity of cuBLAS's sm_90 tiles (128 and 256 in
# the H200 traces). 523-row blocks (V=128256) ran the logits GEMM at 0.90 of the GEMM rate, as 192-row tiles
# padding them to 576 would (kernel-times-linear.log, frozen head).
GPU_ROW_MULTIPLE = 128


def rows_per_block(rows: int, vocab: int, device: torch.device) -> int:
    budget = BLOCK_BYTES["cuda" if device.type == "cuda" else "cpu"]
    step = max(MIN_ROWS, budget // (4 * vocab))
    if device.type == "cuda" and step > GPU_ROW_MULTIPLE:
        step -= step % GPU_ROW_MULTIPLE
    return max(1, min(rows, step))


# A GPU's bf16 GEMM FLOPs per byte of memory traffic: 765 TFLOP/s over 4.3 TB/s on the H200
# (../shared/gpu/README.md; an H100: 3.35 TB/s, ~800 TFLOP/s dense).
GPU_FLOPS_PER_BYTE = 180.0


def sweeps(device: torch.device, rows: int, vocab: int, dim: int, trainable_head: bool) -> bool:
    """Whether linear_policy_loss takes the row sweep: always off a GPU. On one, where the sweep (3 GEMMs;
    with a trainable head d W accumulates in an fp32 [V, D] buffer read and written by every row block:
    8·V·D bytes) beats the composition (4 GEMMs: the logits recomputed, 2·R·V·D FLOPs per block of R rows,
    and d W complete per vocabulary slice): when R > 4 · FLOPs per byte. A frozen head has no d W: the
    sweep always wins."""
    if device.type != "cuda" or not trainable_head:
        return True
    r = rows_per_block(rows, vocab, torch.device("cuda"))
    return 2.0 * r * vocab * dim / GPU_FLOPS_PER_BYTE > 8.0 * vocab * dim


class _Head:
    """The LM head [V, D] (and bias [V]) as the sweep's GEMMs read it, in vocabulary slices.

    fp32 / fp64 heads: one slice, used as is. 16-bit heads on CUDA: one slice, 16-bit GEMMs with fp32 output
    (`torch.mm(..., out_dtype=)`), the softmax gradient rounded to 16 bits for d hidden and d W (what
    Liger-Kernel and cut-cross-entropy do). 16-bit heads elsewhere: fp32 copies of slices of SLICE_BYTES,
    made once per block and GEMM pass, with every operand in fp32."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        self.weight, self.bias = weight, bias
        self.acc = acc_dtype(weight.dtype)
        self.out_dtype_mm = weight.dtype != self.acc and weight.device.type == "cuda"
        self.cast = weight.dtype != self.acc and not self.out_dtype_mm
        vocab, dim = weight.shape
        width = max(1, SLICE_BYTES // (4 * dim)) if self.cast else vocab
        self.slices = [(v0, min(vocab, v0 + width)) for v0 in range(0, vocab, width)]

    def operand(self, x: torch.Tensor) -> torch.Tensor:
        """A row-side operand (hidden rows or the softmax gradient) in the dtype the GEMMs take."""
        return x.to(self.weight.dtype if self.out_dtype_mm else self.acc)

    def weight_slice(self, v0: int, v1: int) -> torch.Tensor:
        w = self.weight[v0:v1]
        return w.to(self.acc) if self.cast else w

    def mm(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.mm(a, b, out_dtype=self.acc) if self.out_dtype_mm else torch.mm(a, b)

    def logits(self, h: torch.Tensor, buffer: torch.Tensor | None) -> torch.Tensor:
        """[R, V] acc-dtype logits of the rows h [R, D] (an operand), written into buffer [>= R, V] where the
        GEMM can write in place (one block's buffer reused by every block: no fresh pages per block)."""
        if self.out_dtype_mm:  # CUDA's caching allocator reuses the block's memory anyway
            z = self.mm(h, self.weight.t())
        else:
            z = buffer[: h.shape[0]]
            for v0, v1 in self.slices:
                if len(self.slices) == 1:
                    torch.mm(h, self.weight_slice(v0, v1).t(), out=z)
                else:
                    z[:, v0:v1] = torch.mm(h, self.weight_slice(v0, v1).t())
        if self.bias is not None:
            z += self.bias.to(self.acc)
        return z

    def backward(self, dz, h, grad_weight, grad_bias, need_hidden: bool):
        """d hidden rows [R, D] (acc) = dz @ W when need_hidden; d W += dzᵀ @ h, d b += Σ_rows dz in place."""
        if grad_bias is not None:
            grad_bias += dz.sum(0, dtype=self.acc)
        dz = self.operand(dz)
        grad_hidden = None
        for v0, v1 in self.slices:
            w = self.weight_slice(v0, v1) if need_hidden else None
            part = dz[:, v0:v1]
            if need_hidden:
                step = self.mm(part, w)
                grad_hidden = step if grad_hidden is None else grad_hidden.add_(step)
            if grad_weight is not None:  # accumulated in place (cuBLAS reads and writes it once)
                gemm_fp32(part.t(), h, grad_weight[v0:v1], accumulate=True)
        return grad_hidden


# CPU tensors with the native flavor: the softmax gradient overwrites the block (one [R, V] buffer, not two).
# tests/cuda_on_cpu switches it off: a GPU runs the out-of-place backward.
INTO_LOGITS = "logprobs_from_logits_backward_into_logits"
_into_logits = op(INTO_LOGITS).default if has_native(INTO_LOGITS) else None


def _native_cpu(flavor: str, device: torch.device) -> bool:
    """CPU tensors with the C++ CPU flavor: the block's gradient overwrites it, and a frozen head streams
    (ops/logp_jacobian.py). tests/cuda_on_cpu switches both off (a GPU's path)."""
    return _into_logits is not None and device.type == "cpu" and flavor == "logprobs_from_logits"


def drops_ignored_rows(flavor: str, device: torch.device) -> bool:
    """Whether a frozen head's sweep takes the labelled rows only: the C++ CPU flavor's vocabulary stream
    (ops/logp_jacobian.py; a CPU tensor's nonzero() waits for nothing). The other paths' kernels give an
    ignored row 0 and no gradient, with no host sync."""
    return _native_cpu(flavor, device)


def frozen_grad_dtype(flavor: str, device: torch.device, dtype: torch.dtype) -> torch.dtype | None:
    """The dtype a frozen head's d hidden is kept in until the backward returns it (sweep's grad_dtype):
    hidden's `dtype`, computed in fp32 and rounded once (ops/frozen_head.py says why: Liger-Kernel's working
    memory), except on the C++ CPU flavor's stream, which keeps fp32 (None: the accumulation dtype)."""
    return None if _native_cpu(flavor, device) else dtype


# The Triton flavor of the logits ops: its backward can write the gradient in another dtype than the logits'.
TRITON_LOGITS = "logprobs_from_logits_triton"


def logits_into_view(logits: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """[N, V] out_dtype view of the gradient logprobs_from_logits_triton_backward_into wrote over `logits`
    (row stride: a logits row's bytes)."""
    return logits.view(out_dtype)[:, : logits.shape[1]]


def _logits_ops(flavor: str, device: torch.device, into_logits: bool = True, operand_dtype=None):
    """(forward, backward) of the flavor; with into_logits the backward may write the gradient over z: a CPU
    tensor and the native flavor (in fp32), or the Triton flavor given operand_dtype (the GEMMs' 16-bit
    operand: each row's gradient rounded in the kernel into the first bytes of its fp32 row, where a copy of
    the [R, V] block would round it and a second block would hold it)."""
    forward, backward = op(flavor), op(flavor + "_backward")
    if into_logits and _native_cpu(flavor, device):

        def into_logits(g_logp, g_ent, z, *rest):
            _into_logits(g_logp, g_ent, z, *rest)
            return z

        return forward, into_logits
    if into_logits and operand_dtype is not None and flavor == TRITON_LOGITS:
        backward_into = op(flavor + "_backward_into")

        def over_logits(g_logp, g_ent, z, *rest):
            backward_into(g_logp, g_ent, z, *rest, operand_dtype)
            return logits_into_view(z, operand_dtype)

        return forward, over_logits
    return forward, backward


def sweep(
    hidden: torch.Tensor,  # [M, D] the rows to compute
    weight: torch.Tensor,  # [V, D]
    bias: torch.Tensor | None,  # [V]
    labels: torch.Tensor,  # [M] int64 (ignore_index: 0 and no gradient; none with a frozen head that streams)
    options: LogitOptions,
    logits_flavor: str,
    token_grads: TokenGrads | None,
    *,
    want_entropy: bool,
    need: tuple[bool, bool, bool],
    want_sum_pi_squared: bool = False,
    sampling: sampling_ops.Sampling | None = None,
    threshold: torch.Tensor | None = None,
    grad_dtype: torch.dtype | None = None,
) -> SweepResult:
    """Log-probs (and entropy, Σπ²) of the rows with the gradients of a loss whose per-token derivatives
    `token_grads` gives, in one pass of 3 GEMMs per block (2 when the head needs no gradient). `need`: which
    of d hidden, d weight, d bias to produce. Runs under no_grad; the caller attaches the gradients. With
    token_grads logp_jacobian.JACOBIAN, d hidden is the Jacobian d logp_i / d hidden_i (ops/frozen_head.py),
    in grad_dtype where given (else, as every other result, the accumulation dtype). token_grads None: the
    forward only (1 GEMM per block).

    A frozen head without entropy or sampling options streams vocabulary chunks instead of row blocks
    (ops/logp_jacobian.py): the C++ CPU flavor's (the labelled rows only) in ATen ops, a GPU flavor's with
    its own kernels.

    sampling: the rollout's per-row temperature / top_k / top_p / min_p (ops/sampling.py; options'
    temperature is then unused), with threshold [M] the kept sets an earlier sweep over the same rows found
    (else searched and returned in the result)."""
    frozen = need == (True, False, False) and token_grads is not None and not want_entropy
    if frozen and sampling is None and _native_cpu(logits_flavor, hidden.device):
        # vocabulary chunks instead of row blocks (ops/logp_jacobian.py), the labelled rows only
        logp, sum_sq, grad_hidden = logp_jacobian.logp_jacobian(
            hidden,
            weight,
            bias,
            labels,
            options.temperature,
            options.softcap,
            want_sum_pi_squared,
            token_grads,
        )
        return SweepResult(logp, None, sum_sq, grad_hidden, None, None)
    if frozen and sampling is None and logp_jacobian.GPU_STREAM:  # a GPU flavor's kernels
        kernels = "triton" if logits_flavor == TRITON_LOGITS else "cuda"
        logp, sum_sq, grad_hidden = logp_jacobian.logp_jacobian_kernels(
            kernels, hidden, weight, bias, labels, *options, want_sum_pi_squared, token_grads, grad_dtype
        )
        return SweepResult(logp, None, sum_sq, grad_hidden, None, None)
    in_place = sampling is None or options.softcap is None  # chain_ reads the softcapped block after
    head = _Head(weight, bias)
    acc = head.acc
    rows, vocab = hidden.shape[0], weight.shape[0]
    need_h, need_w, need_b = need
    # d z in the GEMMs' 16-bit operand dtype over the block's fp32 logits, where nothing reads it in fp32 (d
    # bias sums it first).
    operand = weight.dtype if head.out_dtype_mm and sampling is None and not need_b else None
    forward_op, backward_op = _logits_ops(logits_flavor, hidden.device, in_place, operand)
    logp = hidden.new_empty(rows, dtype=acc)
    entropy = hidden.new_empty(rows, dtype=acc) if want_entropy else None
    sum_sq = hidden.new_empty(rows, dtype=acc) if want_sum_pi_squared else None
    grad_hidden = hidden.new_empty(hidden.shape, dtype=grad_dtype or acc) if need_h else None
    grad_weight = weight.new_zeros(weight.shape, dtype=acc) if need_w else None
    grad_bias = weight.new_zeros(vocab, dtype=acc) if need_b else None
    step = rows_per_block(rows, vocab, hidden.device)
    buffer = None if head.out_dtype_mm else hidden.new_empty(step, vocab, dtype=acc)
    temperature, softcap, ignore_index = options
    truncates = sampling is not None and sampling.truncates
    found = hidden.new_empty(rows, dtype=acc) if truncates and threshold is None else None
    with torch.no_grad():
        for r0 in range(0, rows, step):
            r1 = min(rows, r0 + step)
            z = dz = kept = gh = None  # the last block's tensors freed before this block's GEMMs allocate
            h = head.operand(hidden[r0:r1])
            z = head.logits(h, buffer)
            lab = labels[r0:r1]
            if sampling is None:
                lp, ent, lse, sq = forward_op(
                    z, lab, temperature, softcap, ignore_index, want_entropy, want_sum_pi_squared
                )
            else:
                s = sampling.rows(slice(r0, r1))
                lp, ent, lse, sq, tau, kept = sampling_ops.forward_block(
                    z, lab, s, softcap, forward_op, ignore_index, want_entropy, want_sum_pi_squared,
                    None if threshold is None else threshold[r0:r1],
                )  # fmt: skip
                if found is not None:
                    found[r0:r1] = tau
            logp[r0:r1] = lp
            if want_entropy:
                entropy[r0:r1] = ent
            if want_sum_pi_squared:
                sum_sq[r0:r1] = sq
            if token_grads is None:
                continue
            g_logp, g_ent = token_grads(r0, r1, lp, ent if want_entropy else None)
            if sampling is None:
                dz = backward_op(g_logp, g_ent, z, lab, lse, ent, temperature, softcap, ignore_index)
            else:
                dz = sampling_ops.backward_block(
                    g_logp, g_ent, z, lab, lse, ent, kept, s, softcap, backward_op, ignore_index
                )
            gh = head.backward(dz, h, grad_weight, grad_bias, need_h)
            if need_h:
                grad_hidden[r0:r1] = gh
    return SweepResult(
        logp, entropy, sum_sq, grad_hidden, grad_weight, grad_bias, threshold if found is None else found
    )
