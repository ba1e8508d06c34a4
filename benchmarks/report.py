"""The benchmark rows as a table (min, median, spread, ratios with their range over the rounds, noise flags),
as CSV, and the summary of the noisy rows with the command that reruns them."""

from __future__ import annotations

import csv
import dataclasses
import math
import os
from collections.abc import Sequence

from harness import EAGER, Result
from noise import NOISY_MEDIAN_OVER_MIN, NOISY_ROUND_SPREAD

HEADER = [
    "op",
    "shape",
    "dtype",
    "mode",
    "provider",
    "min ms",
    "median ms",
    "spread",
    "x eager",
    "x eager rounds",
    "peak MB",
    "mem/eager",
    "extra MB",
    "extra/eager",
    "/floor",
    "GB/s",
    "",
]


def _fmt(x, spec: str) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def _cells(r: Result) -> list[str]:
    rounds = "-" if r.speedup_lo is None else f"{r.speedup_lo:.2f}..{r.speedup_hi:.2f}"
    return [
        r.op,
        r.shape,
        r.dtype,
        r.mode,
        r.provider,
        _fmt(r.min_ms, ".3f"),
        _fmt(r.median_ms, ".3f"),
        _fmt(r.spread, ".0%"),
        _fmt(r.speedup_vs_eager, ".2f"),
        rounds,
        _fmt(r.peak_mb, ".1f"),
        _fmt(r.mem_vs_eager, ".3f"),
        _fmt(r.extra_mb, ".1f"),
        _fmt(r.extra_vs_eager, ".3f"),
        _fmt(r.vs_floor, ".3f"),
        _fmt(r.gbps, ".1f"),
        "NOISY" if r.noisy else "",
    ]


def _remark(r: Result) -> str:
    if r.note:
        return f"  (skipped: {r.note})" if r.median_ms is None else f"  ({r.note})"
    if r.noisy:
        mins = ""
        if r.speedup_of_mins is not None and r.provider != EAGER:
            mins = f"; min vs min {r.speedup_of_mins:.2f}x eager"
        return f"  ({r.noise}{mins})"
    return ""


def format_table(results: Sequence[Result]) -> str:
    """One line per row, a blank line between (op, shape, dtype, mode) groups; skipped providers and noisy
    rows say why at the end of their line."""
    rows = [_cells(r) for r in results]
    widths = [max(len(x[i]) for x in [HEADER] + rows) for i in range(len(HEADER))]
    lines = [
        "  ".join(h.ljust(w) for h, w in zip(HEADER, widths, strict=True)).rstrip(),
        "  ".join("-" * w for w in widths).rstrip(),
    ]
    prev = None
    for r, row in zip(results, rows, strict=True):
        if prev is not None and row[:4] != prev:
            lines.append("")
        prev = row[:4]
        lines.append("  ".join(x.ljust(w) for x, w in zip(row, widths, strict=True)).rstrip() + _remark(r))
    return "\n".join(lines)


def write_csv(results: Sequence[Result], path: str) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fields = [f.name for f in dataclasses.fields(Result)]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for r in results:
            w.writerow(dataclasses.asdict(r))


def rerun_command(results: Sequence[Result], base: Sequence[str], rounds: int) -> str | None:
    """The command that times the noisy rows again (their ops and modes, twice the rounds, no memory pass:
    peak memory does not depend on the load); None when no row is noisy. `base` holds the run's other
    options (shapes, device, threads)."""
    noisy = [r for r in results if r.noisy]
    if not noisy:
        return None
    ops = sorted({r.op for r in noisy})
    modes = sorted({r.mode for r in noisy})
    args = ["python -m rlkernels bench", "--ops", *ops, "--modes", *modes, *base]
    return " ".join([*args, "--rounds", str(2 * rounds), "--no-memory"])


def neighbors_line(results: Sequence[Result]) -> str | None:
    """How much CPU other processes used while the comparisons were timed (one value per comparison)."""
    per_group = {(r.op, r.shape, r.mode): r.neighbor_cpus for r in results if r.neighbor_cpus is not None}
    if not per_group:
        return None
    values = list(per_group.values())
    return (
        f"other processes: {sum(values) / len(values):.2f} CPUs on average while the {len(values)} "
        f"comparisons were timed, {max(values):.2f} at most (of {os.cpu_count()} CPUs)."
    )


def noise_summary(results: Sequence[Result], rerun: str | None) -> str:
    """How many rows are noisy, what that means, how to rerun them, and how busy the machine was."""
    timed = [r for r in results if r.median_ms is not None and not r.provider.startswith("floor:")]
    noisy = [r for r in timed if r.noisy]
    neighbors = neighbors_line(results)
    tail = [neighbors] if neighbors else []
    if not noisy:
        return "\n".join([f"noise: none of the {len(timed)} timed rows is noisy.", *tail])
    return "\n".join(
        [
            f"noise: {len(noisy)} of {len(timed)} timed rows are NOISY (a provider's round medians more "
            f"than {NOISY_ROUND_SPREAD:.0%} apart, its median over {NOISY_MEDIAN_OVER_MIN}x its min, or "
            "the ratio to eager flipping between rounds, or other processes using the CPUs): the machine's "
            "load changed under them, so their medians and ratios may be off by more than the digits shown. "
            "Their min columns are the least disturbed estimate, unless other processes held the CPUs the "
            "whole time (then even the min is slowed down). Rerun them with more rounds, on a quieter "
            "machine if you can:",
            f"  {rerun}",
            *tail,
        ]
    )
