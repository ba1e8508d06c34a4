"""Where a bench step's time goes, kernel by kernel: the GPU truth the time model (gpu_model.py) predicts.

For each case, provider and mode of the bench (the same inputs and steps as `python -m rlkernels bench`), it
times `--calls` back-to-back calls three ways and splits the wall time:
- wall: CUDA events around the calls, per call (what the bench reports);
- host: the Python thread's time to issue them, per call (no sync inside);
- busy: the union of the GPU's kernel, memset and memcpy intervals per call (torch.profiler, CUDA activity);
  wall - busy is time the GPU sat idle: host-bound issue, launch latency, a sync;
- each kernel's launches per call and device time per call, largest first;
- the host's side: the ops with the most self time per call (under the profiler, which
  slows each op: their shares, not their sums, are the finding).

    python benchmarks/kernel_times.py --ops policy_loss kl_penalty --modes full --providers 'rlkernels*'
    python benchmarks/kernel_times.py --ops linear_logprobs --modes no_grad full --json times.json
    python benchmarks/kernel_times.py --device cpu --shapes small --ops kl_penalty  # no GPU: the steps

On the CPU there are no device intervals: busy and the kernel table are empty.
"""

from __future__ import annotations

import argparse
import collections
import fnmatch
import json
import pathlib
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

ROOT = pathlib.Path(__file__).resolve().parents[1]
TOP = 8  # kernels (and host ops) listed per row: the rest are summed into one line
NAME_WIDTH = 90  # kernel names are long C++ signatures: their start says which kernel


def _cases(ops, shapes, device, providers):
    from rlkernels.cli import _bench_modules, _in_order

    cases = [c for m in _bench_modules() for c in m.cases(shapes, device)]
    cases = _in_order(cases, ops)
    for c in cases:
        c.providers = [p for p in c.providers if any(fnmatch.fnmatchcase(p.name, x) for x in providers)]
    return cases


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def _wall_and_host(step, device, calls: int) -> tuple[float, float]:
    """Seconds per call: CUDA events (perf_counter on a CPU) around `calls` calls; the host's issue time."""
    _sync(device)
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
    t0 = time.perf_counter()
    for _ in range(calls):
        step()
    host = time.perf_counter() - t0
    if device.type == "cuda":
        end.record()
        end.synchronize()
        wall = start.elapsed_time(end) / 1e3
    else:
        wall = host
    return wall / calls, host / calls


def _union(intervals: list[tuple[float, float]]) -> float:
    total, cur_start, cur_end = 0.0, None, None
    for a, b in sorted(intervals):
        if cur_end is None or a > cur_end:
            total += 0.0 if cur_end is None else cur_end - cur_start
            cur_start, cur_end = a, b
        else:
            cur_end = max(cur_end, b)
    return total + (0.0 if cur_end is None else cur_end - cur_start)


def _device_events(prof) -> list:
    return [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


def profile_step(step, device, calls: int, warmup: int = 3) -> dict:
    """One row: wall, host and busy seconds per call, {kernel: [launches, seconds]} and {host op: [calls,
    self seconds]} per call."""
    for _ in range(warmup):  # Triton compiles, cuBLAS picks its kernels, the allocator fills, clocks rise
        step()
    wall, host = _wall_and_host(step, device, calls)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    _sync(device)
    with profile(activities=activities) as prof:
        for _ in range(calls):
            step()
        _sync(device)
    events = _device_events(prof)
    kernels = collections.defaultdict(lambda: [0.0, 0.0])
    for e in events:
        kernels[e.name][0] += 1 / calls
        kernels[e.name][1] += (e.time_range.end - e.time_range.start) / 1e6 / calls
    busy = _union([(e.time_range.start, e.time_range.end) for e in events]) / 1e6 / calls
    host_ops = {
        a.key: [a.count / calls, a.self_cpu_time_total / 1e6 / calls]
        for a in prof.key_averages()
        if a.self_cpu_time_total > 0
    }
    return {
        "wall_s": wall, "host_s": host, "busy_s": busy, "kernels": _largest_first(kernels),
        "host_ops": _largest_first(host_ops),
    }  # fmt: skip


def _largest_first(table: dict) -> dict:
    return dict(sorted(table.items(), key=lambda kv: -kv[1][1]))


def _top(table: dict, us: float) -> list[str]:
    items = list(table.items())
    lines = [
        f"    {seconds * us:10.1f} us  x{n:5.1f}  {name[:NAME_WIDTH]}" for name, (n, seconds) in items[:TOP]
    ]
    if len(items) > TOP:
        rest = items[TOP:]
        n, seconds = sum(x[0] for _, x in rest), sum(x[1] for _, x in rest)
        lines.append(f"    {seconds * us:10.1f} us  x{n:5.1f}  ({len(rest)} others)")
    return lines


def format_row(title: str, row: dict) -> str:
    us = 1e6
    wall, host, busy = row["wall_s"] * us, row["host_s"] * us, row["busy_s"] * us
    launches = sum(n for n, _ in row["kernels"].values())
    lines = [
        f"{title}",
        f"  wall {wall:.1f} us/call, host issue {host:.1f}, GPU busy {busy:.1f} ({busy / wall:.0%}), "
        f"idle {wall - busy:.1f}; {launches:.1f} device activities/call",
    ]
    lines += _top(row["kernels"], us)
    host_ops = row["host_ops"]
    total = sum(x[1] for x in host_ops.values())
    lines.append(
        f"  host, profiled: {total * us:.1f} us/call of self time in {len(host_ops)} ops (no Python)"
    )
    lines += _top(host_ops, us)
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", nargs="+", required=True, help="bench ops (python -m rlkernels bench)")
    parser.add_argument("--modes", nargs="+", default=["full"], help="forward, full, no_grad, ...")
    parser.add_argument("--providers", nargs="+", default=["rlkernels*"], help="shell patterns of providers")
    parser.add_argument("--shapes", default="llm", help="the bench's shape set: small or llm")
    parser.add_argument("--device", default="auto", help="auto (cuda if available), cpu or cuda")
    parser.add_argument("--calls", type=int, default=20, help="calls timed and profiled per row")
    parser.add_argument("--warmup", type=int, default=3, help="calls before the timed ones")
    parser.add_argument("--json", help="write every row here")
    args = parser.parse_args(argv)
    if args.device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(args.device)
    sys.path.insert(0, str(ROOT))
    gpu = torch.cuda.get_device_name() if device.type == "cuda" else "none (CPU)"
    print(f"kernel_times: {gpu}, torch {torch.__version__}, {args.calls} calls per row", flush=True)
    import harness

    rows = []
    for case in _cases(args.ops, args.shapes, device, args.providers):
        inputs = case.make_inputs()
        for mode in [m for m in args.modes if m in case.modes]:
            for provider in case.providers:
                title = f"{case.op} | {case.shape} | {str(case.dtype).removeprefix('torch.')} | {mode} | "
                title += provider.name
                if provider.unavailable:
                    print(f"{title}: skipped ({provider.unavailable})", flush=True)
                    continue
                try:
                    row = profile_step(
                        harness.make_step(provider, inputs, mode), device, args.calls, args.warmup
                    )
                except Exception as e:  # one provider's failure does not end the run
                    print(f"{title}: FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
                    continue
                print(format_row(title, row), flush=True)
                rows.append({"case": title, **row})
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
