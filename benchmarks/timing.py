"""Interleaved timing rounds, as pyperf and pytest-benchmark advise for shared machines: every provider of one
comparison is timed in each round (in an order rotated round by round), so that the load of a neighbor that
comes and goes hits all of them alike, and ratios can be taken round by round.

CPU samples are wall-clock time.perf_counter; CUDA samples come from triton.testing.do_bench (CUDA events,
L2 flushed between calls), one do_bench call per provider per round.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Callable, Sequence

import torch
from neighbors import NeighborMeter

# Default rounds: 5 give a min, a median and a spread per provider, and show a ratio that flips between
# rounds, while a provider costs 5 x CPU_ROUND_S (or 5 calls when one call is longer than that).
ROUNDS = 5
# Seconds of samples per provider per round on CPU: with ROUNDS, half a second per provider (the old
# one-at-a-time harness spent a second), hundreds of samples of a sub-millisecond op; the slow eager loops,
# one call per round whatever this is, set most of the run time.
CPU_ROUND_S = 0.1
# Shortest CPU sample: calls faster than this are timed in batches so that perf_counter's own cost (well
# under a microsecond) stays below 1% of a sample; longer calls are timed one by one, so that a scheduler
# stall spoils only the sample it lands in.
MIN_SAMPLE_S = 50e-6
# do_bench per round on CUDA: ROUNDS x 40 ms is the 200 ms of repetitions one do_bench call used before.
CUDA_ROUND_MS = 40
CUDA_WARMUP_MS = 25


@dataclasses.dataclass
class Timings:
    """Milliseconds per call of one provider: the samples of each round, plus its warm-up call."""

    rounds: list[list[float]]
    warmup_s: float = 0.0

    @property
    def samples(self) -> list[float]:
        return [t for r in self.rounds for t in r]

    @property
    def min_ms(self) -> float:
        return min(self.samples)

    @property
    def median_ms(self) -> float:
        """The median of all samples (a round of fast calls holds more samples than a slow one)."""
        return statistics.median(self.samples)

    @property
    def rounds_median_ms(self) -> float:
        """The median of the round medians: every round counts once, however many samples it took. The
        benchmark rows show this, and their ratios are ratios of it (harness.py)."""
        return statistics.median(self.round_medians)

    @property
    def round_medians(self) -> list[float]:
        return [statistics.median(r) for r in self.rounds]


def round_order(names: Sequence[str], r: int) -> list[str]:
    """The providers in round r, rotated by r: none always runs first, or always right after the same one."""
    k = r % len(names) if names else 0
    return list(names[k:]) + list(names[:k])


def cpu_samples(step: Callable[[], object], seconds: float | None = None) -> list[float]:
    """Milliseconds per call of step(), sampled for `seconds` (default CPU_ROUND_S; at least one sample).
    The first call sizes the batch: calls shorter than MIN_SAMPLE_S are timed in batches, longer ones one by
    one."""
    seconds = CPU_ROUND_S if seconds is None else seconds
    t0 = time.perf_counter()
    step()
    first = time.perf_counter() - t0
    calls = max(1, math.ceil(MIN_SAMPLE_S / max(first, 1e-9)))
    samples = [first * 1e3] if calls == 1 else []
    deadline = t0 + seconds
    while not samples or time.perf_counter() < deadline:
        t0 = time.perf_counter()
        for _ in range(calls):
            step()
        samples.append((time.perf_counter() - t0) / calls * 1e3)
    return samples


def cuda_samples(step: Callable[[], object]) -> list[float]:
    """Milliseconds of each call do_bench times in one round (CUDA events)."""
    import triton.testing

    return list(triton.testing.do_bench(step, warmup=CUDA_WARMUP_MS, rep=CUDA_ROUND_MS, return_mode="all"))


def sampler_for(device: torch.device) -> Callable[[Callable[[], object]], list[float]]:
    return cuda_samples if device.type == "cuda" else cpu_samples


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


@dataclasses.dataclass
class GroupTimings:
    """The interleaved timings of one comparison."""

    timings: dict[str, Timings]  # the steps that ran
    errors: dict[str, str]  # the steps that raised, and the error to report
    neighbor_cpus: float | None = None  # CPUs other processes used during the rounds (neighbors.py)


def time_interleaved(
    steps: dict[str, Callable[[], object]],
    device: torch.device,
    rounds: int = ROUNDS,
    sample: Callable[[Callable[[], object]], list[float]] | None = None,
) -> GroupTimings:
    """Each step warmed up once (compilation, lazy initialization), then timed in `rounds` interleaved
    rounds, while the CPU time other processes take is metered."""
    sample = sample or sampler_for(device)
    warmup_s, errors = {}, {}
    for name, step in steps.items():
        t0 = time.perf_counter()
        try:
            step()
            _sync(device)
        except Exception as e:  # a provider failing (e.g. a peer rejecting a shape) is reported, not fatal
            errors[name] = f"{type(e).__name__}: {e}"[:200]
            continue
        warmup_s[name] = time.perf_counter() - t0
    live = [n for n in steps if n not in errors]
    samples: dict[str, list[list[float]]] = {n: [] for n in live}
    with NeighborMeter() as neighbors:
        for r in range(rounds):
            for name in round_order([n for n in live if n not in errors], r):
                try:
                    samples[name].append(sample(steps[name]))
                except Exception as e:
                    errors[name] = f"{type(e).__name__}: {e}"[:200]
    timings = {n: Timings(samples[n], warmup_s[n]) for n in live if n not in errors}
    return GroupTimings(timings, errors, neighbors.cpus)
