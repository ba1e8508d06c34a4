"""The shared benchmark harness: every provider of an op on the same inputs in one process, median time of
forward / backward / forward+backward / no-grad forward, and peak memory, reported as ratios to eager
PyTorch, against a floor (bare GEMMs or the bytes the op must move), as a table, a CSV and a PNG.

A benchmark module `benchmarks/bench_<op>.py` defines
`cases(shapes: str, device: torch.device) -> list[Case]`.
GPU timing uses triton.testing.do_bench (CUDA events); CPU timing uses time.perf_counter medians.
"""

from __future__ import annotations

import csv
import dataclasses
import math
import os
import statistics
import time
from collections.abc import Callable, Sequence

import torch

from rlkernels.memory import peak_bytes

MODES = ("forward", "backward", "full", "no_grad")
EAGER = "eager"
# CPU timing: repeat until this many seconds are spent (at least MIN_REPS runs): medians of ~1 s of runs
# are stable to a few percent on a quiet machine.
CPU_TIME_BUDGET_S = 1.0
MIN_REPS = 3
MAX_REPS = 200


@dataclasses.dataclass
class Provider:
    """One implementation of the op: fn(**inputs) -> Tensor or tuple of Tensors."""

    name: str
    fn: Callable[..., object]
    # Why it cannot run here (missing package, backend unavailable); None when it can.
    unavailable: str | None = None


@dataclasses.dataclass
class Floor:
    """A lower bound for a mode: a callable doing only the unavoidable work (e.g. the bare GEMMs),
    timed in the same run, or the minimum bytes the op must move (reported as GB/s)."""

    mode: str
    name: str
    fn: Callable[..., object] | None = None
    min_bytes: int | None = None


@dataclasses.dataclass
class Case:
    op: str
    shape: str  # human-readable, e.g. "N=4194304"
    dtype: torch.dtype
    make_inputs: Callable[[], dict]  # fresh inputs; tensors that need gradients have requires_grad set
    providers: list[Provider]
    modes: Sequence[str] = ("forward", "backward", "full")
    floors: list[Floor] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Result:
    op: str
    shape: str
    dtype: str
    device: str
    mode: str
    provider: str
    ms: float | None
    peak_mb: float | None
    speedup_vs_eager: float | None = None
    mem_vs_eager: float | None = None
    # Peak minus the bytes of the call's own outputs (e.g. the gradients of a backward, which every provider
    # must return): the working memory the implementation adds.
    extra_mb: float | None = None
    extra_vs_eager: float | None = None
    vs_floor: float | None = None
    gbps: float | None = None
    note: str = ""


def _tensors(out) -> list[torch.Tensor]:
    items = out if isinstance(out, (tuple, list)) else (out,)
    return [t for t in items if isinstance(t, torch.Tensor)]


def _differentiable(out) -> list[torch.Tensor]:
    return [t for t in _tensors(out) if t.requires_grad]


def _grad_inputs(inputs: dict) -> list[torch.Tensor]:
    return [t for t in inputs.values() if isinstance(t, torch.Tensor) and t.requires_grad]


def make_step(provider: Provider, inputs: dict, mode: str) -> Callable[[], object]:
    """The callable one timed run executes for `mode`."""
    leaves = _grad_inputs(inputs)
    if mode == "no_grad":

        def step():
            with torch.no_grad():
                return provider.fn(**inputs)

        return step
    if mode == "forward":
        return lambda: provider.fn(**inputs)
    # Fixed random upstream gradients, as in training (not the all-ones gradient of .sum()).
    gen = torch.Generator(device="cpu").manual_seed(0)
    outs = _differentiable(provider.fn(**inputs))
    grads = [torch.randn(o.shape, generator=gen, dtype=torch.float32).to(o.device, o.dtype) for o in outs]
    if mode == "full":
        return lambda: torch.autograd.grad(_differentiable(provider.fn(**inputs)), leaves, grads)
    if mode == "backward":
        return lambda: torch.autograd.grad(outs, leaves, grads, retain_graph=True)
    raise ValueError(f"unknown mode {mode!r}")


def time_ms(step: Callable[[], object], device: torch.device) -> float:
    """Median milliseconds of step()."""
    if device.type == "cuda":
        import triton.testing

        return float(triton.testing.do_bench(step, warmup=25, rep=200, return_mode="median"))
    step()  # warm-up (lazy init, page faults of first-touch buffers)
    times = []
    start = time.perf_counter()
    while len(times) < MIN_REPS or (
        time.perf_counter() - start < CPU_TIME_BUDGET_S and len(times) < MAX_REPS
    ):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def _measure(case: Case, provider: Provider, mode: str, device: torch.device, measure_memory: bool) -> Result:
    base = dict(
        op=case.op,
        shape=case.shape,
        dtype=str(case.dtype).replace("torch.", ""),
        device=device.type,
        mode=mode,
        provider=provider.name,
    )
    if provider.unavailable:
        return Result(**base, ms=None, peak_mb=None, note=provider.unavailable)
    try:
        inputs = case.make_inputs()
        step = make_step(provider, inputs, mode)
        ms = time_ms(step, device)
        out_mb = None
        if measure_memory:
            out_bytes = []

            def counted():
                out = step()
                out_bytes.append(sum(t.numel() * t.element_size() for t in _tensors(out)))
                return out

            mb = peak_bytes(counted, device) / 2**20
            out_mb = out_bytes[-1] / 2**20
        else:
            mb = None
    except Exception as e:  # a provider failing (e.g. a peer rejecting a shape) is reported, not fatal
        return Result(**base, ms=None, peak_mb=None, note=f"{type(e).__name__}: {e}"[:200])
    finally:
        inputs = step = None
    return Result(**base, ms=ms, peak_mb=mb, extra_mb=None if mb is None else max(0.0, mb - out_mb))


def _measure_floor(case: Case, floor: Floor, device: torch.device) -> Result:
    base = dict(
        op=case.op,
        shape=case.shape,
        dtype=str(case.dtype).replace("torch.", ""),
        device=device.type,
        mode=floor.mode,
        provider=f"floor: {floor.name}",
    )
    inputs = case.make_inputs()

    def step():
        with torch.no_grad():
            return floor.fn(**inputs)

    return Result(**base, ms=time_ms(step, device), peak_mb=None)


def run_cases(
    cases: Sequence[Case],
    device: torch.device,
    *,
    modes: Sequence[str] | None = None,
    measure_memory: bool = True,
    progress: bool = True,
) -> list[Result]:
    """Measure every (case, mode, provider) and every floor; ratios are filled in per (case, mode)."""
    units = []
    for case in cases:
        for mode in case.modes:
            if modes is None or mode in modes:
                units += [(case, mode, p) for p in case.providers]
        units += [
            (case, f.mode, f) for f in case.floors if f.fn is not None and (modes is None or f.mode in modes)
        ]
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(units), unit="run", dynamic_ncols=True)
    results = []
    for case, mode, item in units:
        if bar is not None:
            bar.set_description(f"{case.op} {case.shape} {mode} {getattr(item, 'name', '')}"[:70])
        if isinstance(item, Floor):
            results.append(_measure_floor(case, item, device))
        else:
            results.append(_measure(case, item, mode, device, measure_memory))
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    _fill_ratios(cases, results)
    return results


def _fill_ratios(cases: Sequence[Case], results: list[Result]) -> None:
    floors = {(c.op, c.shape, c.dtype, f.mode): f for c in cases for f in c.floors}
    groups: dict[tuple, list[Result]] = {}
    for r in results:
        groups.setdefault((r.op, r.shape, r.dtype, r.mode), []).append(r)
    for (op, shape, dtype, mode), rows in groups.items():
        eager = next((r for r in rows if r.provider == EAGER and r.ms), None)
        floor_row = next((r for r in rows if r.provider.startswith("floor:") and r.ms), None)
        floor = next(
            (
                f
                for (o, s, d, m), f in floors.items()
                if (o, s, str(d).replace("torch.", ""), m) == (op, shape, dtype, mode)
            ),
            None,
        )
        for r in rows:
            if r.ms is None or r.provider.startswith("floor:"):
                continue
            if eager is not None:
                r.speedup_vs_eager = eager.ms / r.ms
                if eager.peak_mb and r.peak_mb is not None:
                    r.mem_vs_eager = r.peak_mb / eager.peak_mb
                if eager.extra_mb and r.extra_mb is not None:
                    r.extra_vs_eager = r.extra_mb / eager.extra_mb
            if floor_row is not None:
                r.vs_floor = r.ms / floor_row.ms
            if floor is not None and floor.min_bytes:
                r.gbps = floor.min_bytes / (r.ms * 1e-3) / 1e9


def _fmt(x, spec):
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def format_table(results: Sequence[Result]) -> str:
    header = [
        "op",
        "shape",
        "dtype",
        "mode",
        "provider",
        "ms",
        "x eager",
        "peak MB",
        "mem/eager",
        "extra MB",
        "extra/eager",
        "/floor",
        "GB/s",
    ]
    rows = [
        [
            r.op,
            r.shape,
            r.dtype,
            r.mode,
            r.provider,
            _fmt(r.ms, ".3f"),
            _fmt(r.speedup_vs_eager, ".2f"),
            _fmt(r.peak_mb, ".1f"),
            _fmt(r.mem_vs_eager, ".3f"),
            _fmt(r.extra_mb, ".1f"),
            _fmt(r.extra_vs_eager, ".3f"),
            _fmt(r.vs_floor, ".3f"),
            _fmt(r.gbps, ".1f"),
        ]
        for r in results
    ]
    widths = [max(len(x[i]) for x in [header] + rows) for i in range(len(header))]
    lines = [
        "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)),
        "  ".join("-" * w for w in widths),
    ]
    prev = None
    for r, row in zip(results, rows, strict=True):
        if prev is not None and row[:4] != prev:
            lines.append("")
        prev = row[:4]
        lines.append(
            "  ".join(x.ljust(w) for x, w in zip(row, widths, strict=True))
            + (f"  ({r.note})" if r.note else "")
        )
    return "\n".join(lines)


def write_csv(results: Sequence[Result], path: str) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fields = [f.name for f in dataclasses.fields(Result)]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for r in results:
            w.writerow(dataclasses.asdict(r))


def plot(results: Sequence[Result], path: str, title: str) -> None:
    """Bars of time relative to eager (lower is better) and peak memory relative to eager, per mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups: dict[tuple, list[Result]] = {}
    for r in results:
        if r.ms is not None and not r.provider.startswith("floor:"):
            groups.setdefault((r.shape, r.mode), []).append(r)
    if not groups:
        return
    providers = sorted({r.provider for rows in groups.values() for r in rows}, key=lambda p: (p != EAGER, p))
    keys = list(groups)
    fig, axes = plt.subplots(1, 2, figsize=(max(8, 1.2 * len(keys) + 4), 4.5), squeeze=False)
    width = 0.8 / max(1, len(providers))
    for ax, metric, label in (
        (axes[0][0], "time", "time / eager (lower is better)"),
        (axes[0][1], "mem", "peak memory / eager (lower is better)"),
    ):
        for i, p in enumerate(providers):
            vals = []
            for k in keys:
                r = next((x for x in groups[k] if x.provider == p), None)
                if r is None:
                    vals.append(float("nan"))
                elif metric == "time":
                    vals.append(1.0 / r.speedup_vs_eager if r.speedup_vs_eager else float("nan"))
                else:
                    vals.append(r.mem_vs_eager if r.mem_vs_eager is not None else float("nan"))
            ax.bar([j + i * width for j in range(len(keys))], vals, width, label=p)
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(keys))])
        ax.set_xticklabels([f"{s}\n{m}" for s, m in keys], fontsize=7)
        ax.set_ylabel(label)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


@dataclasses.dataclass
class TrafficCase:
    """A Triton launch (run under TRITON_INTERPRET=1 on CPU tensors) and the fewest bytes it could move:
    each input read once, each output written once."""

    op: str
    name: str
    fn: Callable[[], object]
    min_bytes: int
    note: str = ""
    # The bound tests/test_traffic.py holds the kernel to (DESIGN §6: 1.05 for elementwise, reduction and
    # scan kernels); None for tiled matrix kernels, whose weight re-reads are reported instead.
    max_ratio: float | None = None


def measure_traffic(cases: Sequence[TrafficCase]) -> list[dict]:
    """Bytes loaded and stored by each case's Triton kernels (triton_traffic.py), against its minimum."""
    from triton_traffic import traffic

    rows = []
    for case in cases:
        with traffic() as t:
            case.fn()
        moved = t.loaded + t.stored
        rows.append(
            dict(
                op=case.op,
                kernel=case.name,
                loaded_mb=t.loaded / 1e6,
                stored_mb=t.stored / 1e6,
                distinct_loaded_mb=t.unique_loaded / 1e6,
                min_mb=case.min_bytes / 1e6,
                ratio=moved / case.min_bytes,
                dot_gflop=t.dot_flops / 1e9,
                note=case.note,
            )
        )
    return rows


def format_traffic(rows: Sequence[dict]) -> str:
    header = ["op", "kernel", "loaded MB", "stored MB", "min MB", "(ld+st)/min", "dot GFLOP", "note"]
    body = [
        [
            r["op"],
            r["kernel"],
            f"{r['loaded_mb']:.3f}",
            f"{r['stored_mb']:.3f}",
            f"{r['min_mb']:.3f}",
            f"{r['ratio']:.3f}",
            f"{r['dot_gflop']:.3f}",
            r["note"],
        ]
        for r in rows
    ]
    widths = [max(len(x[i]) for x in [header] + body) for i in range(len(header))]
    return "\n".join(
        "  ".join(x.ljust(w) for x, w in zip(row, widths, strict=True)) for row in [header] + body
    )
