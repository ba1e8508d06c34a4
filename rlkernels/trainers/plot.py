"""The curves of one run, or of several compared runs on one figure (a panel per metric)."""

from __future__ import annotations

import pathlib

# The panels, in order; a metric no run logged gets no panel.
PANELS = (
    ("reward", "mean reward"),
    ("accuracy", "preference accuracy (batch)"),
    ("eval_accuracy", "preference accuracy (held out)"),
    ("kl", "KL to the reference"),
    ("entropy", "entropy"),
    ("loss", "loss"),
    ("peak_mib", "peak memory per step (MiB)"),
)


def plot_runs(runs: dict[str, list[dict]], path: pathlib.Path, title: str) -> pathlib.Path:
    """Write a PNG with one panel per metric and one line per run (label -> history of step dicts)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(k, name) for k, name in PANELS if any(r.get(k) is not None for h in runs.values() for r in h)]
    cols = min(3, len(panels))
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.0 * rows), squeeze=False)
    for ax, (key, name) in zip(axes.flat, panels, strict=False):
        for label, history in runs.items():
            points = [(r["step"], r[key]) for r in history if r.get(key) is not None]
            if points:
                steps, values = zip(*points, strict=True)
                ax.plot(steps, values, label=label, marker="." if len(points) < 30 else None)
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=8)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
