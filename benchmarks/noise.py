"""When a benchmark row is noisy: the machine's load changed under it, so its median (and its ratio) may be
off by more than the digits printed. A row is flagged, with the reasons, when

- a provider's round medians differ by more than NOISY_ROUND_SPREAD (the load changed between rounds),
- a provider's median (of its round medians, as the rows show it) is more than NOISY_MEDIAN_OVER_MIN
  times its min (most samples were slowed down: e.g. OpenMP workers waiting out a busy neighbor's
  scheduler tick, see the README), or
- the ratio to eager flips between rounds (faster in one round, slower in another, beyond a RATIO_TIE tie),
- on CPU, other processes used more than NOISY_NEIGHBOR_CPUS of the CPUs the benchmark's threads need
  during the rounds (neighbors.py): then even a steady min may be a slowed-down one.

The row's own provider and the eager provider it is compared with both count.
"""

from __future__ import annotations

from collections.abc import Sequence

from timing import Timings

# Round medians of one provider on a quiet machine stay within a few percent of each other; 25% apart means
# the load changed under the run.
NOISY_ROUND_SPREAD = 0.25
# A quiet machine's median sits within tens of percent of the min (allocation, page faults); 1.5x means most
# samples were slowed down by something else.
NOISY_MEDIAN_OVER_MIN = 1.5
# Ratios within 5% of 1 are a tie: rounds that disagree only inside it are not a flip.
RATIO_TIE = 0.05
# CPUs other processes may use, beyond those the benchmark leaves free, before the rows are flagged: a quiet
# machine's daemons and kernel threads use a few hundredths, a compiler or another benchmark a whole one.
NOISY_NEIGHBOR_CPUS = 0.25


def round_spread(t: Timings) -> float:
    """How far apart the round medians are: (max - min) / min."""
    meds = t.round_medians
    return (max(meds) - min(meds)) / min(meds)


def timing_noise(t: Timings) -> list[str]:
    """Why one provider's timings are noisy (empty when they are not)."""
    reasons = []
    spread = round_spread(t)
    if spread > NOISY_ROUND_SPREAD:
        reasons.append(f"round medians {spread:.0%} apart")
    if t.rounds_median_ms > NOISY_MEDIAN_OVER_MIN * t.min_ms:
        reasons.append(f"median {t.rounds_median_ms / t.min_ms:.1f}x min")
    return reasons


def ratio_flips(ratios: Sequence[float]) -> bool:
    """True when some round says faster and another slower, each beyond the tie."""
    return min(ratios) < 1 - RATIO_TIE and max(ratios) > 1 + RATIO_TIE


def neighbor_noise(neighbor_cpus: float | None, cpus: int, threads: int) -> list[str]:
    """Why a comparison is noisy because of other processes (empty when they left our threads' CPUs alone):
    `neighbor_cpus` used by others, of `cpus`, while the benchmark ran `threads` threads."""
    if neighbor_cpus is None or neighbor_cpus <= max(0, cpus - threads) + NOISY_NEIGHBOR_CPUS:
        return []
    return [f"other processes used {neighbor_cpus:.1f} of {cpus} CPUs"]


def row_noise(own: Timings, eager: Timings | None, ratios: Sequence[float]) -> list[str]:
    """Why a row (a provider compared with eager round by round through `ratios`) is noisy, by its timings."""
    reasons = timing_noise(own)
    if eager is not None and eager is not own:
        reasons += [f"eager: {r}" for r in timing_noise(eager)]
    if ratios and ratio_flips(ratios):
        reasons.append(f"x eager flips between rounds ({min(ratios):.2f}..{max(ratios):.2f})")
    return reasons
