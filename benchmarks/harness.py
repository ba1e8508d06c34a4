"""The shared benchmark harness: every provider of an op on the same inputs in one process, timed in
interleaved rounds (timing.py) in the modes forward / backward / forward+backward / no-grad forward, with
peak memory, reported as ratios to eager PyTorch (round by round), against a floor (bare GEMMs or the bytes
the op must move), each row flagged when it is noisy (noise.py). report.py prints and writes the rows,
plots.py draws them, run_record.py says where they go and how they were made.

A benchmark module `benchmarks/bench_<op>.py` defines
`cases(shapes: str, device: torch.device) -> list[Case]`.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import os
from collections.abc import Callable, Sequence

import torch
from noise import neighbor_noise, round_spread, row_noise, timing_noise
from timing import ROUNDS, Timings, time_interleaved

from rlkernels.memory import peak_bytes

MODES = ("forward", "backward", "full", "no_grad")
EAGER = "eager"
FLOOR_PREFIX = "floor: "


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
    timed in the same rounds, or the minimum bytes the op must move (reported as GB/s)."""

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


def select_providers(providers: list[Provider], patterns: Sequence[str]) -> list[Provider]:
    """The providers whose names match one of the shell `patterns`, and eager whatever they say (the rows'
    ratios are taken against it)."""
    return [p for p in providers if p.name == EAGER or any(fnmatch.fnmatchcase(p.name, x) for x in patterns)]


@dataclasses.dataclass
class Result:
    op: str
    shape: str
    dtype: str
    device: str
    mode: str
    provider: str
    min_ms: float | None = None
    # The median of the round medians (every round counts once, however many samples it took).
    median_ms: float | None = None
    # How far apart this provider's round medians are: (max - min) / min.
    spread: float | None = None
    rounds: int = 0
    samples: int = 0
    # Eager's median_ms over this provider's: the ratio of the two medians the row shows. The range of the
    # per-round ratios (eager's round median over this provider's, round by round) always holds it.
    speedup_vs_eager: float | None = None
    speedup_lo: float | None = None
    speedup_hi: float | None = None
    # Eager's min over this provider's min: the least disturbed estimate when the row is noisy.
    speedup_of_mins: float | None = None
    peak_mb: float | None = None
    mem_vs_eager: float | None = None
    # Peak minus the bytes of the call's own outputs (e.g. the gradients of a backward, which every provider
    # must return): the working memory the implementation adds.
    extra_mb: float | None = None
    extra_vs_eager: float | None = None
    vs_floor: float | None = None
    gbps: float | None = None
    noisy: bool = False
    noise: str = ""  # why the row is noisy
    note: str = ""  # why the provider did not run (unavailable, failed)
    warmup_s: float | None = None  # the warm-up call (torch.compile's compilation included)
    # CPUs other processes used while the group's rounds ran (neighbors.py); None where it cannot be read.
    neighbor_cpus: float | None = None


def result_line(r: Result) -> str:
    """One row as a line of text (the table comes at the end of a run)."""
    cells = [f"{r.op} | {r.shape} | {r.dtype} | {r.mode} | {r.provider}"]
    if r.median_ms is None:
        return " | ".join(cells + [f"skipped: {r.note}"])
    cells.append(f"{r.median_ms:.4g} ms (min {r.min_ms:.4g}, spread {r.spread or 0:.0%})")
    extras = {
        "vs eager": r.speedup_vs_eager, "vs floor": r.vs_floor, "GB/s": r.gbps, "peak MB": r.peak_mb,
        "extra MB": r.extra_mb, "warm-up s": r.warmup_s,
    }  # fmt: skip
    cells += [f"{k} {v:.3g}" for k, v in extras.items() if v is not None]
    return " | ".join(cells + (["NOISY: " + r.noise] if r.noisy else []))


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


def _floor_step(floor: Floor, inputs: dict) -> Callable[[], object]:
    def step():
        with torch.no_grad():
            return floor.fn(**inputs)

    return step


def _peak_mb(step: Callable[[], object], device: torch.device) -> tuple[float, float]:
    """Peak MB during one step() and the MB of its outputs."""
    out_bytes = []

    def counted():
        out = step()
        out_bytes.append(sum(t.numel() * t.element_size() for t in _tensors(out)))
        return out

    return peak_bytes(counted, device) / 2**20, out_bytes[-1] / 2**20


def _copies(make_inputs: Callable[[], dict]) -> Callable[[], dict]:
    """make_inputs, called once: each call returns a fresh copy of its tensors (same values, same
    requires_grad), so that every provider of a group gets the same data, and an LLM-sized group generates
    its random [V, D] weights once instead of once per provider."""
    made: list[dict] = []

    def copy(v):
        if not isinstance(v, torch.Tensor):
            return v
        return v.detach().clone().requires_grad_(v.requires_grad)

    def fresh() -> dict:
        if not made:
            made.append(make_inputs())
            return made[0]
        return {k: copy(v) for k, v in made[0].items()}

    return fresh


def measure_group(
    case: Case, mode: str, device: torch.device, rounds: int = ROUNDS, measure_memory: bool = True
) -> list[Result]:
    """Every provider of `case` (and its floors for `mode`) in one set of interleaved rounds, then each
    provider's peak memory; ratios and noise flags are filled in round by round."""
    dtype = str(case.dtype).replace("torch.", "")
    rows = {
        p.name: Result(
            op=case.op, shape=case.shape, dtype=dtype, device=device.type, mode=mode, provider=p.name
        )
        for p in case.providers
    }
    steps = {}
    make_inputs = _copies(case.make_inputs)
    for p in case.providers:
        if p.unavailable:
            rows[p.name].note = p.unavailable
            continue
        try:
            steps[p.name] = make_step(p, make_inputs(), mode)
        except Exception as e:
            rows[p.name].note = f"{type(e).__name__}: {e}"[:200]
    floor = next((f for f in case.floors if f.mode == mode), None)
    floor_name = None
    if floor is not None and floor.fn is not None:
        floor_name = FLOOR_PREFIX + floor.name
        rows[floor_name] = Result(
            op=case.op, shape=case.shape, dtype=dtype, device=device.type, mode=mode, provider=floor_name
        )
        steps[floor_name] = _floor_step(floor, make_inputs())
    group = time_interleaved(steps, device, rounds)
    for name, err in group.errors.items():
        rows[name].note = err
    if measure_memory:
        for name in group.timings:
            if name == floor_name:
                continue
            try:
                rows[name].peak_mb, out_mb = _peak_mb(steps[name], device)
                rows[name].extra_mb = max(0.0, rows[name].peak_mb - out_mb)
            except Exception as e:
                rows[name].note = f"memory: {type(e).__name__}: {e}"[:200]
    busy = []
    if device.type == "cpu":  # on CUDA the host mostly waits on the GPU: spread and flips judge those rows
        busy = neighbor_noise(group.neighbor_cpus, os.cpu_count() or 1, torch.get_num_threads())
    _fill(rows, group.timings, floor_name, floor.min_bytes if floor is not None else None, busy)
    for name in group.timings:
        rows[name].neighbor_cpus = group.neighbor_cpus
    return list(rows.values())


def _fill(
    rows: dict[str, Result], timings: dict[str, Timings], floor_name: str | None, min_bytes, busy: list[str]
) -> None:
    """Times, round-by-round ratios to eager and to the floor, memory ratios and noise flags of one group
    (`busy`: the reasons other processes make every row of it noisy)."""
    eager, eager_row = timings.get(EAGER), rows.get(EAGER)
    floor = timings.get(floor_name) if floor_name else None
    for name, t in timings.items():
        r = rows[name]
        r.min_ms, r.median_ms, r.spread = t.min_ms, t.rounds_median_ms, round_spread(t)
        r.rounds, r.samples, r.warmup_s = len(t.rounds), len(t.samples), t.warmup_s
        if name == floor_name:
            reasons = timing_noise(t)
        else:
            ratios = []
            if eager is not None:
                # The ratio of the medians the rows show, never one that contradicts them (the median of
                # the per-round ratios next to medians of all samples once showed a far slower provider
                # as faster). lo·P_r <= E_r <= hi·P_r in every round r, so lo <= median(E) / median(P)
                # <= hi: the rounds' range always holds it.
                ratios = [e / p for e, p in zip(eager.round_medians, t.round_medians, strict=True)]
                r.speedup_vs_eager = eager.rounds_median_ms / t.rounds_median_ms
                r.speedup_lo, r.speedup_hi = min(ratios), max(ratios)
                r.speedup_of_mins = eager.min_ms / t.min_ms
                if eager_row.peak_mb and r.peak_mb is not None:
                    r.mem_vs_eager = r.peak_mb / eager_row.peak_mb
                if eager_row.extra_mb and r.extra_mb is not None:
                    r.extra_vs_eager = r.extra_mb / eager_row.extra_mb
            if floor is not None:
                r.vs_floor = t.rounds_median_ms / floor.rounds_median_ms
            if min_bytes:
                r.gbps = min_bytes / (t.rounds_median_ms * 1e-3) / 1e9
            reasons = row_noise(t, eager, ratios)
        reasons += busy
        r.noisy, r.noise = bool(reasons), "; ".join(reasons)


def case_modes(case: Case, modes: Sequence[str] | None) -> list[str]:
    """The modes a run times for `case`: those asked for that the case has (all of them with modes None).
    A constant op (advantages, returns: a forward-only case, no gradient) runs its forward for a request of
    "full" or "no_grad" too: its forward is its whole call (`--modes full` ran nothing for gae and
    group_advantages)."""
    if modes is None:
        return list(case.modes)
    picked = [m for m in case.modes if m in modes]
    if not picked and tuple(case.modes) == ("forward",) and {"full", "no_grad"} & set(modes):
        picked = ["forward"]
    return picked


def run_cases(
    cases: Sequence[Case],
    device: torch.device,
    *,
    modes: Sequence[str] | None = None,
    rounds: int = ROUNDS,
    measure_memory: bool = True,
    progress: bool = True,
) -> list[Result]:
    """Every (case, mode) group, one after the other; within a group, the providers interleaved."""
    groups = [(c, m) for c in cases for m in case_modes(c, modes)]
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(groups), unit="group", dynamic_ncols=True)
    results = []
    for case, mode in groups:
        if bar is not None:
            bar.set_description(f"{case.op} {case.shape} {mode}"[:70])
        group = measure_group(case, mode, device, rounds, measure_memory)
        results += group
        if bar is not None:
            bar.update(1)
        else:  # each group's rows as it ends: a run stopped early (a time limit) keeps what it measured
            print("\n".join(result_line(r) for r in group), flush=True)
    if bar is not None:
        bar.close()
    return results


@dataclasses.dataclass
class TrafficCase:
    """A Triton launch (run under TRITON_INTERPRET=1 on CPU tensors) and the fewest bytes it could move:
    each input read once, each output written once."""

    op: str
    name: str
    fn: Callable[[], object]
    min_bytes: int
    note: str = ""
    # The bound tests/test_traffic.py holds the kernel to (1.05 for elementwise, reduction and scan kernels);
    # None for tiled matrix kernels, whose weight re-reads are reported instead.
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
