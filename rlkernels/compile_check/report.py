"""The compile check's report: a CSV row per Triton specialization and per CUDA C++ kernel instantiation, and
the summary tables printed to the console."""

from __future__ import annotations

import collections
import csv
import pathlib

from rlkernels.compile_check.budgets import (
    CUDA_FP64_SPILL_BYTES,
    CUDA_SPILL_BYTES,
    TRITON_FP64_SPILL_BYTES,
    TRITON_SPILL_BYTES,
)
from rlkernels.compile_check.targets import TARGETS


def write_triton_csv(specs: dict, path: pathlib.Path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["target", "kernel", "arg_types", "constexprs", "warps", "stages", "shared_bytes",
                    "registers", "spill_bytes", "f64_ops", "async_copies", "wgmma", "tma_loads", "asserts",
                    "compile_s", "pruned"])  # fmt: skip
        for arch, by_key in sorted(specs.items()):
            for c in sorted(by_key.values(), key=lambda c: (c.kernel, str(c.key()))):
                consts = ";".join(f"{k}={_value(v)}" for k, v in c.constexprs.items())
                w.writerow([f"sm_{arch}", c.kernel, c.signature, consts, c.num_warps, c.num_stages, c.shared,
                            c.registers, c.stack, c.f64_ops, c.async_copies, c.wgmma, c.tma_loads, c.asserts,
                            f"{c.seconds:.2f}", c.pruned or ""])  # fmt: skip


def write_cuda_csv(kernels, path: pathlib.Path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["target", "source", "kernel", "registers", "stack_bytes", "spill_stores", "spill_loads",
                    "static_shared_bytes", "wide_loads", "wide_stores"])  # fmt: skip
        for k in sorted(kernels, key=lambda k: (k.arch, k.source, k.name)):
            w.writerow([f"sm_{k.arch}", k.source, k.name, k.registers, k.stack, k.spill_stores, k.spill_loads,
                        k.shared, k.wide_loads, k.wide_stores])  # fmt: skip


def _value(v) -> str:
    return str(v).removeprefix("triton.language.")


def triton_summary(specs: dict, cases: int) -> str:
    lines = [
        f"Triton: {cases} launcher calls per target (rlkernels/triton/*.py compile_cases), compiled for "
        + ", ".join(TARGETS[a].name for a in sorted(specs)),
        f"  spill budget {TRITON_SPILL_BYTES} B/thread (fp64 kernels {TRITON_FP64_SPILL_BYTES} B), "
        "shared memory: the target's per-block maximum",
        f"  {'target':7s} {'kernels':>7s} {'compiled':>9s} {'pruned':>7s} {'max shared B':>13s} "
        f"{'max regs':>9s} {'max spill B':>12s} {'compile s':>10s}",
    ]
    for arch, by_key in sorted(specs.items()):
        built = [c for c in by_key.values() if not c.pruned]
        pruned = [c for c in by_key.values() if c.pruned]
        lines.append(
            f"  sm_{arch:<4d} {len({c.kernel for c in built}):7d} {len(built):9d} {len(pruned):7d} "
            f"{max(c.shared for c in built):13d} {max(c.registers for c in built):9d} "
            f"{max(c.stack for c in built):12d} {sum(c.seconds for c in built):10.0f}"
        )
    lines.append(
        f"  {'kernel':28s} {'target':6s} {'compiled':>8s} {'configs':>7s} {'pruned':>6s} {'max shared':>10s} "
        f"{'max regs':>8s} {'max spill':>9s}"
    )
    for arch, by_key in sorted(specs.items()):
        per = collections.defaultdict(list)
        for c in by_key.values():
            per[c.kernel].append(c)
        for kernel, cs in sorted(per.items()):
            built = [c for c in cs if not c.pruned]
            configs = {(c.num_warps, c.num_stages, _tile(c)) for c in built}
            shared, regs, spill = (
                max((getattr(c, f) for c in built), default=0) for f in ("shared", "registers", "stack")
            )
            lines.append(
                f"  {kernel:28s} sm_{arch:<3d} {len(built):8d} {len(configs):7d} {len(cs) - len(built):6d} "
                f"{shared:10d} {regs:8d} {spill:9d}"
            )
    return "\n".join(lines)


def _tile(c) -> tuple:
    return tuple(v for k, v in sorted(c.constexprs.items()) if k.startswith("BLOCK"))


def pruned_summary(specs: dict) -> str:
    """What autotune prunes, per target: kernel, tile and why."""
    lines = ["Autotune prunes (per target: kernel, tile (M, N, K, warps, stages), why):"]
    for arch, by_key in sorted(specs.items()):
        pruned = sorted(
            {(c.kernel, _tile(c), c.num_warps, c.num_stages, c.pruned) for c in by_key.values() if c.pruned}
        )
        if not pruned:
            lines.append(f"  sm_{arch}: nothing")
        for kernel, tile, warps, stages, why in pruned:
            lines.append(f"  sm_{arch}: {kernel} {tile + (warps, stages)}: {why}")
    return "\n".join(lines)


def cuda_summary(kernels) -> str:
    lines = [
        f"CUDA C++: {len({k.source for k in kernels})} sources, {len(kernels)} kernel instantiations "
        f"(spill budget {CUDA_SPILL_BYTES} B, fp64 {CUDA_FP64_SPILL_BYTES} B)",
        f"  {'target':7s} {'kernels':>7s} {'max regs':>9s} {'max spill B':>12s} {'max static shared B':>20s}",
    ]
    for arch in sorted({k.arch for k in kernels}):
        ks = [k for k in kernels if k.arch == arch]
        lines.append(
            f"  sm_{arch:<4d} {len(ks):7d} {max(k.registers for k in ks):9d} "
            f"{max(max(k.spill_stores, k.spill_loads) for k in ks):12d} {max(k.shared for k in ks):20d}"
        )
    return "\n".join(lines)
