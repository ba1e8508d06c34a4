"""One PNG per op: speed-up over eager (and peak memory relative to eager) as horizontal bars on a log axis
that starts at 1x, so that a 100x speed-up and a 0.8x slow-down are both readable; each bar carries its value,
its range over the interleaved rounds (error bar), a hatch when the row is noisy, and a provider that did not
run shows the reason in its slot instead of leaving a silent gap."""

from __future__ import annotations

import os
from collections.abc import Sequence

from harness import EAGER, Result

# Height of one bar slot in inches: room for a 7-point label.
SLOT_IN = 0.24
# Inches above the panels for the title, for each row of the legend, and for LEGEND_NOTE.
TITLE_IN, LEGEND_ROW_IN, NOTE_IN = 0.35, 0.18, 0.3
LEGEND_NOTE = (
    "eager = 1x (gray line); bar: median of the per-round ratios; black line: their range over the rounds; "
    "hatched: noisy row; gray text: a provider that did not run there, and why"
)


def _groups(results: Sequence[Result]) -> dict[tuple[str, str], dict[str, Result]]:
    """(shape, mode) -> provider -> row, in the order the rows came (floors and eager left out: eager is the
    1x line the bars start from)."""
    groups: dict[tuple[str, str], dict[str, Result]] = {}
    for r in results:
        if r.provider != EAGER and not r.provider.startswith("floor:"):
            groups.setdefault((r.shape, r.mode), {})[r.provider] = r
    return groups


def _skip_reason(r: Result | None) -> str:
    if r is None:
        return "not run for this shape"
    return r.note or "no eager baseline"


def _never_ran(groups: dict[tuple[str, str], dict[str, Result]]) -> dict[str, str]:
    """Providers without a single bar, and why (they get a legend entry instead of a slot per group)."""
    providers = dict.fromkeys(p for g in groups.values() for p in g)
    out = {}
    for p in providers:
        rows = [g.get(p) for g in groups.values()]
        if all(r is None or r.speedup_vs_eager is None for r in rows):
            out[p] = "; ".join(dict.fromkeys(_skip_reason(r) for r in rows))
    return out


def draw(results: Sequence[Result], title: str):
    """The figure (matplotlib), with a time panel and, when memory was measured, a memory panel."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.patches
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    groups = _groups(results)
    never_ran = _never_ran(groups)
    providers = [p for p in dict.fromkeys(p for g in groups.values() for p in g) if p not in never_ran]
    with_memory = any(r.mem_vs_eager is not None for g in groups.values() for r in g.values())
    panels = [("speed", "speed-up over eager (x, log scale; right of 1 is faster)")]
    if with_memory:
        panels.append(("mem", "peak memory / eager (x, log scale; left of 1 is smaller)"))
    n_legend = len(providers) + len(never_ran)
    ncol = max(1, min(n_legend, 3))
    header_in = TITLE_IN + LEGEND_ROW_IN * -(-n_legend // ncol) + NOTE_IN
    n_slots = max(1, len(groups) * (len(providers) + 1))
    fig, axes = plt.subplots(
        1,
        len(panels),
        figsize=(7 * len(panels), header_in + 0.7 + SLOT_IN * n_slots),
        squeeze=False,
        sharey=True,
    )
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    ticks, labels, handles = [], [], {}
    for gi, ((shape, mode), rows) in enumerate(groups.items()):
        base = gi * (len(providers) + 1)
        ticks.append(base + (len(providers) - 1) / 2)
        labels.append(f"{shape}  ·  {mode}")
        for pi, p in enumerate(providers):
            y, r = base + pi, rows.get(p)
            for ax, (metric, _) in zip(axes[0], panels, strict=True):
                value = None if r is None else r.speedup_vs_eager if metric == "speed" else r.mem_vs_eager
                if value is None:
                    if metric == "speed":
                        ax.text(1.0, y, f"  {p}: {_skip_reason(r)}", va="center", fontsize=6.5, color="gray")
                    continue
                noisy = metric == "speed" and r.noisy
                bar = ax.barh(
                    y, value - 1.0, left=1.0, height=0.8, color=colors[pi % len(colors)],
                    hatch="////" if noisy else None, edgecolor="black" if noisy else None, linewidth=0.3,
                )  # fmt: skip
                handles.setdefault(p, bar)
                end = value
                if metric == "speed" and r.speedup_lo is not None:
                    ax.plot([r.speedup_lo, r.speedup_hi], [y, y], color="black", lw=0.8)
                    end = max(value, r.speedup_hi) if value >= 1 else min(value, r.speedup_lo)
                text = f"{value:.3g}x" + (" noisy" if noisy else "")
                ax.text(end, y, f" {text} ", va="center", ha="left" if value >= 1 else "right", fontsize=6.5)
    for p, reason in never_ran.items():
        handles[f"{p}: not run ({reason})"] = matplotlib.patches.Patch(color="lightgray")
    times_x = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}x")
    for ax, (_, label) in zip(axes[0], panels, strict=True):
        ax.set_xscale("log")
        lo, hi = ax.get_xlim()
        lo, hi = min(lo, 0.5) / 4, max(hi, 2.0) * 4  # room for the value labels beyond the bars
        ax.set_xlim(lo, hi)
        subs = (1.0, 2.0, 5.0) if hi / lo <= 1e4 else (1.0,)  # 1-2-5 ticks while they fit, else decades
        ax.xaxis.set_major_locator(matplotlib.ticker.LogLocator(base=10, subs=subs))
        ax.xaxis.set_major_formatter(times_x)
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.axvline(1.0, color="gray", lw=0.8)
        ax.set_xlabel(label, fontsize=8)
        ax.tick_params(axis="x", labelsize=7)
        ax.grid(axis="x", which="major", lw=0.3, alpha=0.5)
    axes[0][0].set_yticks(ticks)
    axes[0][0].set_yticklabels(labels, fontsize=7)
    axes[0][0].invert_yaxis()
    height = fig.get_figheight()
    fig.suptitle(title, fontsize=10, y=1 - 0.1 / height, va="top")
    if handles:
        fig.legend(
            handles.values(), handles.keys(), fontsize=7, ncol=ncol, frameon=False,
            loc="upper center", bbox_to_anchor=(0.5, 1 - TITLE_IN / height),
        )  # fmt: skip
    fig.text(
        0.5, (NOTE_IN - 0.05) / height, LEGEND_NOTE, ha="center", va="top", fontsize=6.5, color="dimgray"
    )
    fig.tight_layout(rect=(0, NOTE_IN / height, 1, 1 - (header_in - NOTE_IN) / height))
    return fig


def plot(results: Sequence[Result], path: str, title: str) -> None:
    import matplotlib.pyplot as plt

    fig = draw(results, title)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
