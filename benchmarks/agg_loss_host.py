"""Host time of agg_loss's forward + backward on small CPU tensors, where the kernels' arithmetic is
negligible against the Python, the dispatcher and the autograd engine a call goes through (what a GPU call's
host side costs, docs/gpu_token_ops.md "Host time"): the C++ flavor with its C++ autograd node
(csrc/autograd/agg_loss.cpp), the same flavor through the Python autograd formula, and the eager reference
(verl's composition). One process, interleaved rounds; the median, min and max of the rounds' per-call
means.

    python benchmarks/agg_loss_host.py [--rounds 7] [--calls 2000]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import rlkernels as rk
import rlkernels.ops.agg_loss as ops
from rlkernels.reference.aggregation import agg_loss as eager

MODE = "seq-mean-token-mean"  # GRPO's, verl's actor aggregates its entropy bonus with it


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args(argv)
    x, mask = torch.rand(4, 64).requires_grad_(), torch.rand(4, 64) > 0.2
    native = ops._native_eager
    if native is None:
        print("the extension has no agg_loss_autograd: build it (README)")
        return 1

    def through(node):
        def call():
            ops._native_eager = node
            return rk.agg_loss(x, mask, MODE, backend="cpu")

        return call

    calls = {
        "cpu, C++ autograd node": through(native),
        "cpu, Python autograd": through(None),
        "eager reference": lambda: eager(x, mask, MODE),
    }
    times = {name: [] for name in calls}
    try:
        for _ in range(args.rounds):
            for name, call in calls.items():
                for _ in range(args.calls // 10):  # warm-up
                    torch.autograd.grad(call(), [x])
                start = time.perf_counter()
                for _ in range(args.calls):
                    torch.autograd.grad(call(), [x])
                times[name].append((time.perf_counter() - start) / args.calls * 1e6)
    finally:
        ops._native_eager = native
    for name, t in times.items():
        print(f"{name:24s} median {statistics.median(t):6.1f} us  min {min(t):6.1f}  max {max(t):6.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
