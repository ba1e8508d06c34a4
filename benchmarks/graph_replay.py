"""On a GPU: a bench step's time with the host out of the way, by CUDA graph replay, next to its eager time.

A token op's call at the LLM shapes takes a few kernels of tens of microseconds, and hundreds of
microseconds of host work (benchmarks/kernel_times.py). Captured once in a CUDA graph (forward and backward
together, as `torch.cuda.graphs` or torch.compile(mode="reduce-overhead") would in a trainer), a replay
costs the device time alone. This prints both per call, checks that the replay's gradients equal the eager
call's, and says which providers cannot be captured (a host sync in the call would).

    python benchmarks/graph_replay.py --ops policy_loss kl_penalty value_loss
    python benchmarks/graph_replay.py --device cpu --shapes small --ops kl_penalty   # no GPU: eager only
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
WARMUP = 50  # eager calls before timing: host clocks and caches settle (kernel_times.py found 3 too few)


def captured(step):
    """(graph, its outputs) of one call of `step`, warmed up on a side stream as capture requires."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    return graph, out


def _max_rel_diff(got, want) -> float:
    got, want = [g for g in got if g is not None], [w for w in want if w is not None]
    return max(((g.double() - w.double()).abs().max() / w.double().abs().max().clamp_min(1e-30)).item()
               for g, w in zip(got, want, strict=True))  # fmt: skip


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", nargs="+", required=True, help="bench ops (python -m rlkernels bench)")
    parser.add_argument("--providers", nargs="+", default=["rlkernels*"], help="shell patterns of providers")
    parser.add_argument("--shapes", default="llm", help="the bench's shape set: small or llm")
    parser.add_argument("--device", default="auto", help="auto (cuda if available), cpu or cuda")
    parser.add_argument("--calls", type=int, default=200, help="calls (and replays) timed per row")
    args = parser.parse_args(argv)
    if args.device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(args.device)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import harness
    from kernel_times import _cases, _wall_and_host

    gpu = torch.cuda.get_device_name() if device.type == "cuda" else "none (CPU: eager only)"
    print(f"graph_replay: {gpu}, torch {torch.__version__}, {args.calls} calls per row, fwd+bwd", flush=True)
    print(f"{'case':58s} {'provider':24s} {'eager us':>9s} {'replay us':>9s}  replay = eager")
    for case in _cases(args.ops, args.shapes, device, args.providers):
        if "full" not in case.modes:
            continue
        inputs = case.make_inputs()
        for provider in case.providers:
            title = f"{case.op} | {case.shape}"
            if provider.unavailable:
                continue
            step = harness.make_step(provider, inputs, "full")
            for _ in range(WARMUP):
                want = step()
            eager = _wall_and_host(step, device, args.calls)[0] * 1e6
            replay, same = "-", ""
            if device.type == "cuda":
                try:
                    graph, got = captured(step)
                    graph.replay()
                    torch.cuda.synchronize()
                    replay = f"{_wall_and_host(graph.replay, device, args.calls)[0] * 1e6:9.1f}"
                    same = f"max rel diff {_max_rel_diff(got, want):.1e}"
                except Exception as e:  # a provider that cannot be captured says why, the rest go on
                    replay, same = "FAILED", f"{type(e).__name__}: {str(e)[:200]}"
            print(f"{title:58s} {provider.name:24s} {eager:9.1f} {replay:>9s}  {same}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
