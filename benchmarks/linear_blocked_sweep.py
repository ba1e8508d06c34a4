"""On a GPU: the Triton flavor's blocked linear_logprobs path (rlkernels/triton/linear_blocked.py) at one LLM
shape, its block constants swept, against its GEMM floors, plus the forward's accuracy against float64, and
the frozen head's vocabulary stream by its blocks and chunks, and the row sweep it replaced; and the frozen
head at a small batch (SMALL_ROWS tokens), its chunks whole or sized to d hidden alone.

The constants docs/gpu_linear.md leaves to a measurement: FORWARD_ROWS and BLOCK_BYTES (the forward's logits
block), EPI_ROWS and EPI_WARPS (the epilogues' programs: the 2026-11-26 H200 sweep found the statistics
epilogue bound by its number of programs), WORK_CAP_BYTES (the backward's buffers, hence its row groups);
and the GEMM kernels with the softmax in their epilogues: the forward (linear_gemm_stats.py, "gemm_stats")
and the backward's recompute (linear_gemm_dlogits.py, "gemm_dlogits"). Beside them the CUDA C++ flavor's
blocked path (csrc/cuda/logprobs_binding.cpp), with and without gradients, and its forward in Triton's block
shape (RLK_CUDA_LINEAR_FORWARD_COLS).
Each variant is timed with CUDA events (triton.testing.do_bench, median), all variants of one mode in
interleaved rounds (timing.py).

    python benchmarks/linear_blocked_sweep.py --json sweep.json       # N=8192 D=4096 V=128256, bf16
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import functools
import json
import os
import statistics
import sys
import time
from unittest import mock

import frozen_chunk_host
import torch
from timing import time_interleaved

import rlkernels as rk
from rlkernels._gemm import gemm_fp32
from rlkernels.memory import peak_bytes
from rlkernels.ops import linear_sweep as ls
from rlkernels.ops import logp_jacobian as lj
from rlkernels.reference.logprobs import linear_logprobs as reference
from rlkernels.triton import linear_blocked as lb
from rlkernels.triton import linear_gemm_dlogits as gd
from rlkernels.triton import linear_gemm_stats as gs
from rlkernels.triton._softmax import UNFUSED

MIB = 1 << 20
# The variants: (name, {constant: value}); the first of each mode is today's default.
# The forward: smaller blocks, which the GEMM leaves in L2 for the statistics epilogue (8192 x 512 and x 256
# columns; the 2026-11-27 trace had the epilogue reading its 32 MiB blocks at 2.1 TB/s), and one epilogue
# program shape (the 2026-11-27 sweep: 4-64 rows, 2-8 warps, all within 5 %). The block shapes the two
# earlier sweeps measured beside the default (4096 rows: slower; 64 MiB blocks: the same), and the
# backward's larger buffers (1536 MiB, 64 MiB blocks: within 1 % of 768 MiB), are left out for time.
FORWARD = [
    ("default", {"FORWARD_ROWS": lb.FORWARD_ROWS, "BLOCK_BYTES": lb.BLOCK_BYTES}),
    ("rows=8192 block=16MiB", {"FORWARD_ROWS": 8192, "BLOCK_BYTES": 16 * MIB, "MIN_COLS": 512}),
    ("rows=8192 block=8MiB", {"FORWARD_ROWS": 8192, "BLOCK_BYTES": 8 * MIB, "MIN_COLS": 256}),
    ("epi rows=8 warps=4", {"EPI_ROWS": 8, "EPI_WARPS": 4}),
    ("epi stages=1", {"EPI_STAGES": 1}),  # the statistics loop before 2026-11-28: loads as it reduces
    ("epi unfused", {"EPI_LAUNCH": UNFUSED}),  # every product rounded, as logprobs_from_logits' kernels
    # The forward as one persistent GEMM with the statistics in its epilogue (linear_gemm_stats.py), the
    # model's route to 1.05x; "gs." names that module's constants.
    ("gemm_stats", {"gs.FORWARD": "gemm_stats"}),
    ("gemm_stats stages=3", {"gs.FORWARD": "gemm_stats", "gs.STAGES": 3}),
    ("gemm_stats group=8", {"gs.FORWARD": "gemm_stats", "gs.GROUP_N": 8}),
    # Its main loop alone (wrong log-probs: timed, never used), against the floor: the GEMM rate the time
    # model assumes (gpu_model.GEMM_STATS_RATE); the default's time less this one is its epilogue's.
    ("gemm_stats main loop only", {"gs.FORWARD": "gemm_stats", "gs.MAIN_LOOP_ONLY": True}),
]
BACKWARD = [
    ("default", {"WORK_CAP_BYTES": lb.WORK_CAP_BYTES, "BLOCK_BYTES": lb.BLOCK_BYTES}),
    ("cap=768MiB", {"WORK_CAP_BYTES": 768 * MIB, "WORK_PER_HIDDEN": 3.0}),
    ("block=16MiB", {"BLOCK_BYTES": 16 * MIB, "MIN_COLS": 512}),
    ("epi rows=8 warps=4", {"EPI_ROWS": 8, "EPI_WARPS": 4}),
    ("dlogits tiles=1", {"DLOGITS_TILES": 1}),  # the d logits epilogue before 2026-11-28: a program per tile
    ("dlogits tiles=4", {"DLOGITS_TILES": 4}),
    ("epi unfused", {"EPI_LAUNCH": UNFUSED}),
    ("forward gemm_stats", {"gs.FORWARD": "gemm_stats"}),
    ("backward gemm_dlogits", {"gd.BACKWARD": "gemm_dlogits"}),
    ("both gemm kernels", {"gs.FORWARD": "gemm_stats", "gd.BACKWARD": "gemm_dlogits"}),
]

# The frozen head (weight without a gradient, ops/frozen_head.py): its vocabulary stream ("lj."
# logp_jacobian's constants: 512-row blocks and 16384-column chunks at this shape, today), with chunks of 8192
# columns (twice the launches and A's traffic, less memory) and blocks of 1024 rows (within d hidden's bytes:
# 8192-column chunks); and the row sweep it replaced, by its GPU block of fp32 logits ("ls." linear_sweep's
# constants: 512 rows at V=128256, and 256).
FROZEN = [
    ("default", {"lj.GPU_ROWS": lj.GPU_ROWS, "lj.GPU_COLUMNS": lj.GPU_COLUMNS}),
    ("stream columns=8192", {"lj.GPU_COLUMNS": 8192}),
    ("stream rows=1024", {"lj.GPU_ROWS": 1024}),
    ("row sweep", {"lj.GPU_STREAM": False}),
    (
        "row sweep block=128MiB",
        {"lj.GPU_STREAM": False, "ls.BLOCK_BYTES": {**ls.BLOCK_BYTES, "cuda": 128 * MIB}},
    ),
]


# The frozen head at SMALL_ROWS tokens: today's whole chunks, and the chunks sized to d hidden alone (no
# GPU_MIN_BUDGET), with the ops called directly or through the dispatcher (as on 2026-11-29).
SMALL_ROWS = 1024
FROZEN_SMALL = [
    ("default", {"lj.GPU_MIN_BUDGET": lj.GPU_MIN_BUDGET}),
    ("chunks sized to d hidden", {"lj.GPU_MIN_BUDGET": 0}),
    (
        "chunks sized to d hidden, dispatched ops",
        {"lj.GPU_MIN_BUDGET": 0, "lj.KERNELS": {**lj.KERNELS, "triton": frozen_chunk_host.dispatched_ops}},
    ),
]


# The modules whose constants a variant sets, by the prefix of their names (none: linear_blocked).
MODULES = {"": lb, "gs.": gs, "gd.": gd, "ls.": ls, "lj.": lj}


def _patched(values: dict):
    """The variant's constants set: linear_blocked's by name, the GEMM kernels' as "gs.NAME", "gd.NAME"."""
    stack = contextlib.ExitStack()
    for prefix, module in MODULES.items():
        names = {
            k.removeprefix(prefix): v
            for k, v in values.items()
            if k.startswith(prefix) and "." not in k[len(prefix) :]
        }
        if names:
            stack.enter_context(mock.patch.multiple(module, **names))
    return stack


# The variants benchmarks/gpu_model.py prices: their (forward, backward) paths in its plan_blocked.
MODELED = {
    "default": ("blocked", "blocked"),
    "gemm_stats": ("gemm_stats", "blocked"),
    "forward gemm_stats": ("gemm_stats", "blocked"),
    "backward gemm_dlogits": ("blocked", "gemm_dlogits"),
    "both gemm kernels": ("gemm_stats", "gemm_dlogits"),
}


@functools.cache
def _fitted_model():
    import gpu_model

    return gpu_model.fit(gpu_model.calibration_rows())


def model_ms(mode: str, name: str, n: int, d: int, v: int) -> float | None:
    """The time model's H200 prediction for a variant (or a floor) of this sweep, ms; None where it has
    none. Printed beside the measurement, so that a GPU run says where the model is wrong."""
    import gpu_model

    model = _fitted_model()
    if mode == "frozen_small":  # the stream at SMALL_ROWS tokens: the GPU's time or the host's, the larger
        n = min(n, SMALL_ROWS)
        if name.startswith("floor"):
            return gpu_model.floor_time(n, v, d, 2, model) * 1e3
        if name not in dict(FROZEN_SMALL):
            return None
        way = "dispatcher" if name.endswith("dispatched ops") else "direct"
        with mock.patch.object(lj, "GPU_MIN_BUDGET", dict(FROZEN_SMALL)[name]["lj.GPU_MIN_BUDGET"]):
            return gpu_model.frozen_small_time(model, n, v, d, way=way) * 1e3
    if mode == "frozen":  # from the third run's trace (its GEMMs as traced), at its shape only
        if (n, d, v) != (8192, 4096, 128256) or name not in ("default", "row sweep"):
            return None
        if name == "row sweep":
            return gpu_model.frozen_head_paths(n, v, d)[1][-1][1] * 1e3
        return gpu_model.frozen_stream_time(model, n, v, d)[1] * 1e3
    if name.startswith("floor"):
        return gpu_model.floor_time(n, v, d, 1 if mode == "no_grad" else 4, model) * 1e3
    if name == "cuda flavor" and mode in ("no_grad", "full"):
        return gpu_model.linear_time(gpu_model.plan_cuda_blocked(n, v, d, mode), model) * 1e3
    if name not in MODELED:
        return None
    forward, backward = MODELED[name]
    plan = gpu_model.plan_blocked(n, v, d, mode, forward=forward, backward=backward)
    return gpu_model.linear_time(plan, model) * 1e3


def _chosen(variants: list, patterns: list[str] | None) -> list:
    """The default and the variants whose names match one of `patterns` (all without patterns)."""
    return [
        (name, values) for name, values in variants
        if name == "default" or not patterns or any(fnmatch.fnmatchcase(name, p) for p in patterns)
    ]  # fmt: skip


def timed_rounds(steps: dict, device: torch.device, rounds: int, rep_ms: int) -> dict[str, list[float]]:
    """Each step's median ms per round (timing.time_interleaved: warmed up once, then interleaved rounds in
    a rotated order; on a GPU one do_bench median of `rep_ms` per round), and the steps that raised."""
    sample = None  # the CPU's wall-clock samples (--dry-run)
    if device.type == "cuda":
        import triton.testing

        def sample(step):
            return [triton.testing.do_bench(step, warmup=10, rep=rep_ms, return_mode="median")]

    group = time_interleaved(steps, device, rounds, sample)
    return {name: t.round_medians for name, t in group.timings.items()} | {
        name: f"failed: {err}" for name, err in group.errors.items()
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", type=int, nargs=3, default=(8192, 4096, 128256), metavar=("N", "D", "V"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rep-ms", type=int, default=150, help="do_bench's time per variant and round")
    parser.add_argument("--json", help="write every sample here")
    parser.add_argument("--dry-run", action="store_true", help="no GPU: this script's steps, tiny, on CPU")
    parser.add_argument("--only", nargs="+", help="shell patterns of the variants to time (and the floors)")
    args = parser.parse_args(argv)
    if args.dry_run:
        n, d, v = 64, 32, 3000
        dev = torch.device("cpu")
    elif torch.cuda.is_available():
        n, d, v = args.shape
        dev = torch.device("cuda")
    else:
        print("linear_blocked_sweep: needs a CUDA GPU (or --dry-run)", file=sys.stderr)
        return 2
    gen = torch.Generator(device=dev).manual_seed(0)
    hidden = torch.randn(n, d, generator=gen, device=dev).to(torch.bfloat16)
    weight = (torch.randn(v, d, generator=gen, device=dev) * (3.0 / d**0.5)).to(torch.bfloat16)
    labels = torch.randint(0, v, (n,), generator=gen, device=dev)
    upstream = torch.randn(n, generator=gen, device=dev)
    gpu = torch.cuda.get_device_name() if dev.type == "cuda" else "none (dry run)"
    record = {"shape": [n, d, v], "gpu": gpu, "torch": torch.__version__}
    t0 = time.perf_counter()

    # Accuracy of the forward on the first 256 rows against float64, and bf16 logits' for scale.
    rows = slice(0, 256)
    ref = reference(hidden[rows].double(), weight.double(), labels[rows])
    err = {}
    with torch.no_grad():
        for backend in ("triton", "cuda" if dev.type == "cuda" else "cpu"):
            err[backend] = rk.linear_logprobs(hidden[rows], weight, labels[rows], backend=backend)
        if gs.supported(hidden, weight):
            with _patched({"gs.FORWARD": "gemm_stats"}):
                fused = rk.linear_logprobs(hidden[rows], weight, labels[rows], backend="triton")
            err["triton gemm_stats"] = fused
        err["bf16 logits"] = torch.log_softmax((hidden[rows] @ weight.T).float(), -1).gather(
            -1, labels[rows, None]
        )[:, 0]
    err = {k: ((got.double() - ref).abs().max() / ref.abs().max()).item() for k, got in err.items()}
    record["max_rel_error_vs_float64"] = err

    def no_grad(values):
        def step():
            with _patched(values), torch.no_grad():
                return rk.linear_logprobs(hidden, weight, labels, backend="triton")

        return step

    def full(values, h, w):
        def step():
            with _patched(values):
                logp = rk.linear_logprobs(h, w, labels, backend="triton")
                return torch.autograd.grad(logp, (h, w), upstream)

        return step

    h = hidden.clone().requires_grad_()
    w = weight.clone().requires_grad_()
    g = torch.empty(n, v, dtype=torch.bfloat16, device=dev)
    rows, cols = lb.forward_shape(n, v, None)
    block = torch.empty(rows * cols, dtype=torch.float32, device=dev)

    def gemm1():
        torch.mm(hidden, weight.t(), out=g)

    def gemm_blocks(cols=cols):  # a forward's fp32-out GEMMs, block by block, with no epilogue between
        def step():
            for r0 in range(0, n, rows):
                for v0 in range(0, v, cols):
                    h, w = hidden[r0 : r0 + rows], weight[v0 : v0 + cols]
                    gemm_fp32(h, w.t(), block[: h.shape[0] * w.shape[0]].view(h.shape[0], w.shape[0]))

        return step

    def gemm4():
        torch.mm(hidden, weight.t(), out=g)
        torch.mm(hidden, weight.t(), out=g)
        g @ weight
        g.t() @ hidden

    forward_steps = {"floor: 1 GEMM": gemm1, "default's GEMMs alone (fp32 blocks)": gemm_blocks()}
    forward_steps["GEMMs alone, 512-column blocks"] = gemm_blocks(512)
    other = "cuda" if dev.type == "cuda" else "cpu"

    def flavor(env: dict, grad: bool):  # the other flavor; env: the CUDA C++ flavor's RLK_CUDA_LINEAR_* sizes
        def step():
            with mock.patch.dict(os.environ, env):
                if not grad:
                    return rk.linear_logprobs(hidden, weight, labels, backend=other)
                logp = rk.linear_logprobs(h, w, labels, backend=other)
                return torch.autograd.grad(logp, (h, w), upstream)

        return step

    forward_steps[f"{other} flavor"] = flavor({}, grad=False)
    # The CUDA C++ forward's blocks in Triton's shape (8192 x 1024) against its default 8192-column blocks
    # (1024 x 8192): a thread block a row, so its rows' length is the question (docs/gpu_linear.md).
    narrow = {"RLK_CUDA_LINEAR_FORWARD_COLS": "1024"}
    forward_steps[f"{other} flavor, 1024-column blocks"] = flavor(narrow, grad=False)
    forward_steps.update({name: no_grad(values) for name, values in _chosen(FORWARD, args.only)})
    with torch.no_grad():
        record["no_grad"] = timed_rounds(forward_steps, dev, args.rounds, args.rep_ms)

    def frozen(values, backend="triton", rows=n):  # the frozen head (d hidden only) of the first rows
        leaf = h if rows == n else h[:rows].detach().requires_grad_()

        def step():
            with _patched(values):
                logp = rk.linear_logprobs(leaf, weight, labels[:rows], backend=backend)
                return torch.autograd.grad(logp, (leaf,), upstream[:rows])

        return step

    def gemm2(rows=n):  # its floor: the first rows' 2 GEMMs
        def step():
            torch.mm(hidden[:rows], weight.t(), out=g[:rows])
            torch.mm(hidden[:rows], weight.t(), out=g[:rows])

        return step

    frozen_variants = _chosen(FROZEN, args.only)
    frozen_steps = {"floor: 2 GEMMs": gemm2()} | {name: frozen(values) for name, values in frozen_variants}
    frozen_steps[f"{other} flavor"] = frozen({}, backend=other)  # its own chunk and finish kernels
    record["frozen"] = timed_rounds(frozen_steps, dev, args.rounds, args.rep_ms)
    for name, values in frozen_variants if dev.type == "cuda" else ():
        record.setdefault("frozen_peak_mib", {})[name] = peak_bytes(frozen(values), dev) / MIB
    if dev.type == "cuda":
        peak = peak_bytes(frozen({}, backend=other), dev) / MIB
        record.setdefault("frozen_peak_mib", {})[f"{other} flavor"] = peak
    # A small batch's frozen head (the first SMALL_ROWS rows), where the host's issue of a chunk's launches
    # can outlast its GEMMs (docs/gpu_linear.md, "The host must keep ahead of the chunks").
    small = min(n, SMALL_ROWS)
    small_steps = {"floor: 2 GEMMs": gemm2(small)}
    small_steps |= {name: frozen(values, rows=small) for name, values in _chosen(FROZEN_SMALL, args.only)}
    record["frozen_small"] = timed_rounds(small_steps, dev, args.rounds, args.rep_ms)
    backward = _chosen(BACKWARD, args.only)
    backward_steps = {"floor: 4 GEMMs": gemm4}
    backward_steps.update({name: full(values, h, w) for name, values in backward})
    backward_steps[f"{other} flavor"] = flavor({}, grad=True)
    record["full"] = timed_rounds(backward_steps, dev, args.rounds, args.rep_ms)
    if gs.supported(hidden, weight):  # the GEMM kernels' gradients against the blocked path's, on this GPU
        fused = full({"gs.FORWARD": "gemm_stats", "gd.BACKWARD": "gemm_dlogits"}, h, w)()
        blocked = full({}, h, w)()
        record["gemm_kernels_vs_blocked"] = {
            name: ((a.double() - b.double()).abs().max() / b.double().abs().max()).item()
            for name, a, b in zip(("d hidden", "d weight"), fused, blocked, strict=True)
        }
    for name, values in backward if dev.type == "cuda" else ():
        record.setdefault("full_peak_mib", {})[name] = peak_bytes(full(values, h, w), dev) / MIB
    record["seconds"] = time.perf_counter() - t0

    print(f"linear_blocked_sweep: N={n} D={d} V={v} bf16 on {record['gpu']}")
    print("max |err| / max |ref| vs float64 (256 rows): " + ", ".join(f"{k} {e:.1e}" for k, e in err.items()))
    if "gemm_kernels_vs_blocked" in record:
        diffs = record["gemm_kernels_vs_blocked"].items()
        print(
            "GEMM kernels' gradients, max |diff| / max |blocked|: "
            + ", ".join(f"{k} {e:.1e}" for k, e in diffs)
        )
    floors = (
        ("no_grad", "floor: 1 GEMM"), ("frozen", "floor: 2 GEMMs"), ("frozen_small", "floor: 2 GEMMs"),
        ("full", "floor: 4 GEMMs"),
    )  # fmt: skip
    for mode, floor in floors:
        base = record[mode][floor]
        base = statistics.median(base) if isinstance(base, list) else float("nan")
        print(f"\n{mode}: median of round medians, ms (x the {floor[7:]})")
        for name, samples in record[mode].items():
            if isinstance(samples, str):
                print(f"  {name:32s} {samples}")
                continue
            med = statistics.median(samples)
            spread = (max(samples) - min(samples)) / min(samples)
            peak = record.get(f"{mode}_peak_mib", {}).get(name)
            extra = f"  peak {peak:.0f} MiB" if peak is not None else ""
            predicted = model_ms(mode, name, n, d, v)
            extra += f"  model {predicted:.2f}" if predicted is not None else ""
            print(f"  {name:32s} {med:8.2f}  x{med / base:5.2f}  spread {spread:4.0%}{extra}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
