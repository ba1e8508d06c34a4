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
# Inches above the panels for the title, the legend and LEGEND_NOTE.
HEADER_IN = 0.7
LEGEND_NOTE = (
    "eager = 1x (gray line); bar: median of the per-round ratios; black line: their range over the rounds; "
    "hatched: noisy row; gray text: a provider that did not run, and why"
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


def draw(results: Sequence[Result], title: str):
    """The figure (matplotlib), with a time panel and, when memory was measured, a memory panel."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    groups = _groups(results)
    providers = list(dict.fromkeys(p for g in groups.values() for p in g))
    with_memory = any(r.mem_vs_eager is not None for g in groups.values() for r in g.values())
    panels = [("speed", "speed-up over eager (x, log scale; right of 1 is faster)")]
    if with_memory:
        panels.append(("mem", "peak memory / eager (x, log scale; left of 1 is smaller)"))
    n_slots = max(1, len(groups) * (len(providers) + 1))
    fig, axes = plt.subplots(
        1,
        len(panels),
        figsize=(7 * len(panels), HEADER_IN + 0.7 + SLOT_IN * n_slots),
        squeeze=False,
        sharey=True,
    )
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    ticks, labels, labelled = [], [], set()
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
                ax.barh(
                    y, value - 1.0, left=1.0, height=0.8, color=colors[pi % len(colors)],
                    hatch="////" if noisy else None, edgecolor="black" if noisy else None, linewidth=0.3,
                    label=None if (ax, p) in labelled else p,
                )  # fmt: skip
                labelled.add((ax, p))
                if metric == "speed" and r.speedup_lo is not None:
                    ax.plot([r.speedup_lo, r.speedup_hi], [y, y], color="black", lw=0.8)
                text = f"{value:.3g}x" + (" noisy" if noisy else "")
                ax.text(
                    value, y, f" {text} ", va="center", ha="left" if value >= 1 else "right", fontsize=6.5
                )
    times_x = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}x")
    for ax, (_, label) in zip(axes[0], panels, strict=True):
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(matplotlib.ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_major_formatter(times_x)
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.axvline(1.0, color="gray", lw=0.8)
        ax.set_xlabel(label, fontsize=8)
        ax.tick_params(axis="x", labelsize=7)
        ax.grid(axis="x", which="major", lw=0.3, alpha=0.5)
        lo, hi = ax.get_xlim()
        ax.set_xlim(min(lo, 0.5), max(hi, 2.0) * 3)  # room for the value labels right of the longest bar
    axes[0][0].set_yticks(ticks)
    axes[0][0].set_yticklabels(labels, fontsize=7)
    axes[0][0].invert_yaxis()
    handles = {}
    for ax in axes[0]:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(lab, h)
    height = fig.get_figheight()
    fig.suptitle(title, fontsize=10, y=1 - 0.1 / height, va="top")
    if handles:
        fig.legend(
            handles.values(), handles.keys(), fontsize=7, ncol=len(handles), frameon=False,
            loc="upper center", bbox_to_anchor=(0.5, 1 - 0.35 / height),
        )  # fmt: skip
    fig.text(
        0.5, 1 - 0.62 / height, LEGEND_NOTE, ha="center", va="top", fontsize=6.5, color="dimgray"
    )  # fmt: skip
    fig.tight_layout(rect=(0, 0, 1, 1 - HEADER_IN / height))
    return fig


def plot(results: Sequence[Result], path: str, title: str) -> None:
    import matplotlib.pyplot as plt

    fig = draw(results, title)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
