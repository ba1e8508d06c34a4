"""The benchmark rows as a table that fits a terminal (min, median, the ratio to eager with its range over
the rounds, working memory, the floor, noise flags with their reasons), as CSV (every field), and the
summary of the noisy rows with the command that reruns them."""

from __future__ import annotations

import csv
import dataclasses
import math
import os
import textwrap
from collections.abc import Sequence

from harness import EAGER, Result
from noise import NOISY_MEDIAN_OVER_MIN, NOISY_ROUND_SPREAD

# The printed table fits a terminal of this many columns; the CSV has every field (harness.Result).
TABLE_WIDTH = 120
HEADER = ["provider", "min ms", "median ms", "x eager", "rounds", "extra MB", "extra/eager", "floor"]
LEGEND = (
    "median ms: the median of the round medians; x eager: eager's median ms over the row's (above 1: "
    "faster); rounds: the range of the per-round ratios; extra MB: peak memory minus the outputs; floor: "
    "time over the floor's, or GB/s of the bytes the op must move. The CSV has every column, the spread "
    "and peak MB too."
)


def _sig(x: float, digits: int) -> str:
    """x with `digits` significant digits in fixed point (no exponent), at least the integer part."""
    if x == 0 or not math.isfinite(x):
        return format(x, "g")
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(x))))
    return f"{x:.{decimals}f}"


def _fmt(x, digits: int) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else _sig(x, digits)


def _floor(r: Result) -> str:
    if r.vs_floor is not None:
        return f"{_sig(r.vs_floor, 3)}x"
    return "-" if r.gbps is None else f"{_sig(r.gbps, 3)} GB/s"


def _cells(r: Result) -> list[str]:
    rounds = "-" if r.speedup_lo is None else f"{_sig(r.speedup_lo, 3)}..{_sig(r.speedup_hi, 3)}"
    return [
        r.provider,
        _fmt(r.min_ms, 4),
        _fmt(r.median_ms, 4),
        _fmt(r.speedup_vs_eager, 3),
        rounds,
        _fmt(r.extra_mb, 3),
        _fmt(r.extra_vs_eager, 3),
        _floor(r),
    ]


def _remark(r: Result) -> str:
    """What a row's line cannot hold: why it was skipped, or why it is noisy."""
    if r.note:
        return f"skipped: {r.note}" if r.median_ms is None else r.note
    if r.noisy:
        mins = ""
        if r.speedup_of_mins is not None and r.provider != EAGER:
            mins = f"; min vs min {_sig(r.speedup_of_mins, 3)}x eager"
        return f"NOISY: {r.noise}{mins}"
    return ""


def format_table(results: Sequence[Result], width: int = TABLE_WIDTH) -> str:
    """A heading per (op, shape, dtype, mode) group, then a line per provider; below a skipped or noisy
    row, "skipped: why" or "NOISY: why", wrapped to `width` columns. Ends with a legend."""
    rows = [_cells(r) for r in results]
    widths = [max(len(x[i]) for x in [HEADER] + rows) for i in range(len(HEADER))]

    def line(cells):
        return "  ".join(x.ljust(w) for x, w in zip(cells, widths, strict=True)).rstrip()

    lines = [line(HEADER), "  ".join("-" * w for w in widths).rstrip()]
    prev = None
    for r, row in zip(results, rows, strict=True):
        group = (r.op, r.shape, r.dtype, r.mode)
        if group != prev:
            if prev is not None:
                lines.append("")
            lines += textwrap.wrap("  ".join(group), width)
            prev = group
        lines.append(line(row))
        remark = _remark(r)
        if remark:
            lines += textwrap.wrap(remark, width, initial_indent="    ", subsequent_indent="      ")
    return "\n".join([*lines, "", *textwrap.wrap(LEGEND, width)])


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
        return "\n".join(_wrapped([f"noise: none of the {len(timed)} timed rows is noisy.", *tail]))
    text = (
        f"noise: {len(noisy)} of {len(timed)} timed rows are NOISY (a provider's round medians more "
        f"than {NOISY_ROUND_SPREAD:.0%} apart, its median over {NOISY_MEDIAN_OVER_MIN}x its min, or "
        "the ratio to eager flipping between rounds, or other processes using the CPUs): the machine's "
        "load changed under them, so their medians and ratios may be off by more than the digits shown. "
        "Their min columns are the least disturbed estimate, unless other processes held the CPUs the "
        "whole time (then even the min is slowed down). Rerun them with more rounds, on a quieter "
        "machine if you can:"
    )
    # The command stays on one line, to be copied whole.
    return "\n".join([*_wrapped([text]), f"  {rerun}", *_wrapped(tail)])


def _wrapped(paragraphs: Sequence[str]) -> list[str]:
    return [line for p in paragraphs for line in textwrap.wrap(p, TABLE_WIDTH)]
