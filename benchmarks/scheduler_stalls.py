"""Why a fast multi-threaded CPU op can time at whole multiples of the scheduler tick on a busy machine.

Times one parallel op (by default discounted_returns at 262144 positions, B=2048 T=128: rlkernels' CPU
kernel runs one OpenMP region of two tasks there) call by call, alone and next to `--neighbors` busy
processes. `--op kl_penalty --elements 65536` times an op at or below its grain, which stays on one thread
and does not stall (benchmarks/parallel_grain.py). When a neighbor holds the core an
OpenMP worker needs, the calling thread spins at the region's barrier (libgomp spins before it sleeps, so
its own core never goes idle and never pulls the worker over) until the kernel's next tick preempts the
neighbor: the call then takes a multiple of the tick (4 ms at CONFIG_HZ=250) instead of microseconds. A
median over such calls is a multiple of the tick. `--threads 1`, or OMP_WAIT_POLICY=passive (the waiting
thread sleeps, its core goes idle and takes the worker), removes the stalls.

From the checkout: `PYTHONPATH=. python benchmarks/scheduler_stalls.py --neighbors 2`; compare with
`--threads 1` and with `OMP_WAIT_POLICY=passive` in the environment.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import os
import subprocess
import sys
import time

import torch

import rlkernels as rk


def kernel_tick_hz() -> str:
    """CONFIG_HZ of the running kernel, when /proc/config.gz or /boot/config-* says it."""
    for path in ("/proc/config.gz", f"/boot/config-{os.uname().release}"):
        try:
            opener = gzip.open if path.endswith(".gz") else open
            with opener(path, "rt") as f:
                for line in f:
                    if line.startswith("CONFIG_HZ="):
                        return line.strip()
        except OSError:
            continue
    return "CONFIG_HZ unknown"


def make_op(op: str, elements: int):
    """One call of `op` on `elements` tokens (discounted_returns: rows of 128)."""
    gen = torch.Generator().manual_seed(0)
    if op == "kl_penalty":
        logp, ref = -torch.rand(elements, generator=gen), -torch.rand(elements, generator=gen)
        return lambda: rk.kl_penalty(logp, ref, "k3", backend="cpu")
    rewards = torch.randn(max(1, elements // 128), 128, generator=gen)
    mask = torch.ones(rewards.shape, dtype=torch.bool)
    return lambda: rk.discounted_returns(rewards, mask, gamma=0.99, backend="cpu")


def time_calls(call, calls: int) -> list[float]:
    for _ in range(20):  # warm-up: thread pool, allocator
        call()
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        call()
        times.append((time.perf_counter() - t0) * 1e3)
    return sorted(times)


def describe(times: list[float]) -> list[str]:
    def q(p):
        return times[int(p * (len(times) - 1))]

    buckets = collections.Counter(int(t) for t in times)
    return [
        f"  min {times[0]:.3f}  median {q(0.5):.3f}  p75 {q(0.75):.3f}  p90 {q(0.9):.3f}  "
        f"max {times[-1]:.3f} ms",
        "  calls per 1 ms bucket: "
        + ", ".join(f"[{k}, {k + 1}) ms: {n}" for k, n in sorted(buckets.items())),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--neighbors", type=int, default=2, help="busy processes running next to the op")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's)")
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--op", choices=("discounted_returns", "kl_penalty"), default="discounted_returns")
    parser.add_argument(
        "--elements", type=int, default=262144, help="tokens per call (default: above the grain)"
    )
    args = parser.parse_args()
    call = make_op(args.op, args.elements)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(
        f"{kernel_tick_hz()}, {os.cpu_count()} CPUs, {torch.get_num_threads()} torch threads, "
        f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '(unset)')}; {args.op} on {args.elements} tokens"
    )
    print("alone:")
    print("\n".join(describe(time_calls(call, args.calls))))
    neighbors = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.neighbors)]
    try:
        time.sleep(0.5)  # let the neighbors get scheduled
        print(f"next to {args.neighbors} busy processes:")
        print("\n".join(describe(time_calls(call, args.calls))))
    finally:
        for p in neighbors:
            p.kill()
            p.wait()


if __name__ == "__main__":
    main()
