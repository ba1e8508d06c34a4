"""The host work a vocabulary chunk costs the Triton flavor's frozen head (ops/logp_jacobian.py
`logp_jacobian_kernels`: a GEMM, the chunk op, a GEMM a chunk), in the control units of
benchmarks/gpu_host_time.py, for the time model: does the host stay ahead of the GPU's chunk?

A frozen-head linear_logprobs call, forward + backward, with 40 chunks and with 8 (16 rows, 64-column chunks,
tiny CPU tensors, the Triton launches no-ops under the interpreter): their difference over 32 is one chunk's
host work. Both ways of calling the chunk and finish ops are timed, interleaved: as their Python functions
(`ops/_library.direct_or_op`, what the stream does in plain eager mode) and through the dispatcher (the
registered custom ops, what it did before 2026-11-30). Triton's own launch path is not in it (the
interpreter's launch is stubbed): gpu_host_time.py times that apart.

    python benchmarks/frozen_chunk_host.py [--rounds 5] [--json]
"""

from __future__ import annotations

import os
import sys
from unittest import mock

if __name__ == "__main__":
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

# 64-column chunks of 16 rows: the GEMMs' arithmetic is negligible against their dispatch.
ROWS, DIM, COLUMNS = 16, 64, 64
FEW, MANY = 8, 40  # chunks per call of the two calls whose difference is timed


def _step(chunks: int, kernels):
    import rlkernels as rk
    from rlkernels.ops import logp_jacobian

    vocab = COLUMNS * chunks
    hidden = torch.randn(ROWS, DIM).requires_grad_()
    weight, labels = torch.randn(vocab, DIM), torch.randint(0, vocab, (ROWS,))

    def step():
        logp_jacobian.KERNELS["triton"] = kernels
        logp = rk.linear_logprobs(hidden, weight, labels, backend="triton")
        torch.autograd.grad(logp, [hidden], torch.ones_like(logp))

    return step


def dispatched_ops():
    """The Triton flavor's chunk and finish ops through the dispatcher (the registered custom ops), as the
    stream called them before 2026-11-30: a logp_jacobian.KERNELS["triton"] to time against today's."""
    ops = torch.ops.rlkernels
    return ops.logp_jacobian_chunk_triton, ops.logp_jacobian_finish_triton


def measure(rounds: int) -> dict[str, float]:
    """{"control": µs, "direct": units a chunk, "dispatcher": units a chunk, "fixed": units of the direct
    call besides its chunks (its one block included)}; each call keeps its least disturbed round median."""
    import gpu_host_time

    from rlkernels.ops import logp_jacobian

    gpu_host_time._stub_triton()
    torch.set_num_threads(1)
    ways = {"direct": logp_jacobian.KERNELS["triton"], "dispatcher": dispatched_ops}
    calls = {"control": (gpu_host_time._control(), 200)}
    for way, kernels in ways.items():
        calls[way, FEW] = (_step(FEW, kernels), 100)
        calls[way, MANY] = (_step(MANY, kernels), 40)
    sizes = dict(GPU_ROWS=ROWS, GPU_COLUMNS=COLUMNS, GPU_MIN_COLUMNS=COLUMNS)
    with mock.patch.multiple(logp_jacobian, **sizes), mock.patch.dict(logp_jacobian.KERNELS):
        best = gpu_host_time.interleaved_medians(calls, rounds, warmup=10)
    control = best["control"]
    out = {"control": control}
    for way in ways:
        out[way] = (best[way, MANY] - best[way, FEW]) / (MANY - FEW) / control
    out["fixed"] = best["direct", FEW] / control - FEW * out["direct"]
    return out


def report(result: dict) -> list[str]:
    lines = [f"control {result['control']:.1f} us (the unit)"]
    for way in ("direct", "dispatcher"):
        units = result[way]
        lines.append(f"{way:10s} {units:.2f} units a chunk ({units * result['control']:.1f} us here)")
    lines.append(f"the direct call's fixed part (its block included) {result['fixed']:.2f} units")
    return lines


def main(argv=None) -> int:
    import gpu_host_time

    return gpu_host_time.units_main(__doc__, measure, report, argv)


if __name__ == "__main__":
    sys.exit(main())
