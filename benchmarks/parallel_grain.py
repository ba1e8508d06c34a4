"""Where going parallel pays for rlkernels' C++ CPU kernels: each kernel's time with 1 and with 2 threads at
sizes where both run its parallel loop, and the grain below which a kernel should stay serial.

A kernel's `at::parallel_for(0, n, grain, ...)` runs serially when n <= grain, else opens an OpenMP region.
Per call, with 1 thread t1(n) = a + c·n; with 2 threads t2(n) = a + o + c·n/2, where o is the cost of the
region (waking the worker, the barrier). Two threads win where c·n/2 > o. On a quiet machine o is
microseconds; next to a busy process it is a scheduler tick (4 ms at CONFIG_HZ=250) whenever the worker's
CPU is taken: the calling thread spins at the barrier until the tick preempts the neighbor (the README's
"Busy machines", benchmarks/scheduler_stalls.py).

Measured here: c and a, the slope and intercept of the 1-thread mins over the sizes; o, the least
disturbed overhead (the smallest t2 - t1/2 - a/2 over the sizes, from each size's min); and the typical
overhead under the current load (the same from the medians). The grain this suggests is where going
parallel still pays when STALL_SHARE of the regions wait out one tick: n = 2·(o + STALL_SHARE·tick) / c,
rounded up to a power of two. csrc/cpu's grain constants are set from it
(benchmarks/results/parallel_grain.md).

From the checkout: `PYTHONPATH=. python benchmarks/parallel_grain.py` (add --only kl_penalty for one op).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import statistics
import sys
from collections.abc import Callable

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from neighbors import NeighborMeter  # noqa: E402
from scheduler_stalls import kernel_tick_hz  # noqa: E402
from timing import cpu_samples  # noqa: E402

import rlkernels as rk  # noqa: E402

T = 256  # tokens per row of the [B, T] ops: rows short enough that a grain spans several of them
# The share of parallel regions that may wait out a scheduler tick with going parallel still paying: a
# machine where a neighbor takes a CPU now and then, not one that is busy all the time.
STALL_SHARE = 0.01


@dataclasses.dataclass
class Kernel:
    name: str  # the op and the grain constant it exercises (csrc/cpu)
    make: Callable[[int], Callable[[], object]]  # n elements -> one call
    grain: int  # its grain in csrc/cpu, in the same elements: n <= grain runs serially


def _gen():
    return torch.Generator().manual_seed(0)


def _kl(backward: bool):
    def make(n):
        g = _gen()
        logp, ref = -torch.rand(n, generator=g), -torch.rand(n, generator=g)
        if backward:
            grad = torch.randn(n, generator=g)
            return lambda: torch.ops.rlkernels.kl_penalty_backward(grad, logp, ref, "k3", 10.0)
        return lambda: torch.ops.rlkernels.kl_penalty(logp, ref, "k3", 10.0)

    return make


def _rows(n: int) -> tuple[torch.Tensor, ...]:
    g, b = _gen(), max(1, n // T)
    return -torch.rand(b, T, generator=g), torch.randn(b, generator=g), torch.ones(b, T, dtype=torch.bool)


def _policy_loss(n):
    logp, adv, mask = _rows(n)
    old = logp + 0.01
    return lambda: rk.policy_loss(logp, old, adv, mask, backend="cpu")


def _value_loss(n):
    values, _, mask = _rows(n)
    return lambda: rk.value_loss(values, values + 0.1, values - 0.1, mask, backend="cpu")


def _gae(n):
    values, _, mask = _rows(n)
    return lambda: rk.gae(values, values, mask, gamma=0.99, lam=0.95, backend="cpu")


def _group_advantages(n):
    rewards = torch.randn(n, generator=_gen())
    return lambda: rk.group_advantages(rewards, group_size=16, backend="cpu")


def _rollout_correction(n):
    logp, _, mask = _rows(n)
    rollout = logp + 0.05
    return lambda: rk.rollout_correction(logp, rollout, mask, backend="cpu")


def kernels() -> list[Kernel]:
    return [
        Kernel("kl_penalty k3 forward (kl.cpp kGrain)", _kl(False), 131072),
        Kernel("kl_penalty k3 backward (kl.cpp kGrain)", _kl(True), 131072),
        Kernel("policy_loss (row_loops.h kMinTaskTokens)", _policy_loss, 131072),
        Kernel("value_loss (row_loops.h kMinTaskTokens)", _value_loss, 131072),
        Kernel("gae (gae.cpp kPositionsPerTask)", _gae, 131072),
        # The group-ids path's parallel loop (the same kGrain) follows a serial hash-map pass that
        # dominates its time: the contiguous path measures the grain.
        Kernel("group_advantages G=16 (advantages.cpp kGrain)", _group_advantages, 65536),
        Kernel("rollout_correction (rollout_correction.cpp kTaskTokens)", _rollout_correction, 65536),
    ]


def measure(step: Callable[[], object], rounds: int, seconds: float) -> dict[int, list[float]]:
    """Milliseconds per call of step() with 1 and 2 threads, in interleaved rounds: {threads: samples}."""
    out: dict[int, list[float]] = {1: [], 2: []}
    for r in range(rounds):
        for threads in (1, 2) if r % 2 == 0 else (2, 1):
            torch.set_num_threads(threads)
            step()
            out[threads] += cpu_samples(step, seconds)
    return out


def slope(xs: list[float], ys: list[float]) -> float:
    """The least-squares slope of ys over xs."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)


def tick_us() -> float:
    """The scheduler tick in microseconds (CONFIG_HZ of the running kernel; 250 Hz when it cannot tell)."""
    line = kernel_tick_hz()
    hz = int(line.split("=")[1]) if line.startswith("CONFIG_HZ=") else 250
    return 1e6 / hz


def suggested_grain(c_us: float, overhead_us: float, tick: float) -> int:
    """The power of two at or above 2·(o + STALL_SHARE·tick) / c."""
    n = 2 * (overhead_us + STALL_SHARE * tick) / c_us
    return 1 << max(0, math.ceil(math.log2(n)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10, help="interleaved rounds of 1 and 2 threads")
    parser.add_argument("--seconds", type=float, default=0.05, help="samples per round and thread count")
    parser.add_argument("--only", help="kernels whose name contains this")
    args = parser.parse_args()
    if os.cpu_count() < 2:
        raise SystemExit("parallel_grain: needs at least 2 CPUs")
    wait, tick = os.environ.get("OMP_WAIT_POLICY", "(unset)"), tick_us()
    print(f"{os.cpu_count()} CPUs, torch {torch.__version__}, OMP_WAIT_POLICY={wait}, tick {tick:.0f} µs; "
          "µs per call, min / median")  # fmt: skip
    summary = []
    for k in kernels():
        if args.only and args.only not in k.name:
            continue
        sizes = [2 * k.grain, 3 * k.grain, 4 * k.grain, 6 * k.grain, 8 * k.grain]
        print(f"\n{k.name}, grain {k.grain}")
        print(f"{'n':>8}  {'1 thread':>17}  {'2 threads':>17}  {'t2 - t1/2':>17}")
        mins, medians = {1: [], 2: []}, {1: [], 2: []}
        with NeighborMeter() as neighbors:
            for n in sizes:
                times = measure(k.make(n), args.rounds, args.seconds)
                for t in (1, 2):
                    mins[t].append(min(times[t]) * 1e3)
                    medians[t].append(statistics.median(times[t]) * 1e3)
                t1, t2, m1, m2 = mins[1][-1], mins[2][-1], medians[1][-1], medians[2][-1]
                print(f"{n:>8}  {t1:>8.1f} / {m1:>6.1f}  {t2:>8.1f} / {m2:>6.1f}  {t2 - t1 / 2:>8.1f} / "
                      f"{m2 - m1 / 2:>6.1f}")  # fmt: skip
        c = slope(sizes, mins[1])
        a = statistics.fmean(mins[1]) - c * statistics.fmean(sizes)  # per call, threads or not
        quiet = min(t2 - t1 / 2 - a / 2 for t1, t2 in zip(mins[1], mins[2], strict=True))
        loaded = statistics.median(t2 - t1 / 2 - a / 2 for t1, t2 in zip(medians[1], medians[2], strict=True))
        grain = suggested_grain(c, max(quiet, 0.0), tick)
        busy = "" if neighbors.cpus is None else f"; other processes used {neighbors.cpus:.2f} CPUs meanwhile"
        crossover = 2 * max(quiet, 0.0) / c
        print(
            f"c = {c * 1e3:.3f} ns/element, a = {a:.1f} µs; overhead o = {quiet:.1f} µs least disturbed, "
            f"{loaded:.1f} µs typical{busy}; quiet crossover 2o/c = {crossover:.0f}; suggested {grain}"
        )
        summary.append((k.name, k.grain, c * 1e3, quiet, loaded, grain))
    print(
        "\n| kernel | grain | ns/element, 1 thread | overhead o, least disturbed / typical (µs) | suggested |"
    )
    print("|---|---|---|---|---|")
    for name, grain, ns, quiet, loaded, suggested in summary:
        print(f"| {name} | {grain} | {ns:.3f} | {quiet:.1f} / {loaded:.1f} | {suggested} |")


if __name__ == "__main__":
    main()
