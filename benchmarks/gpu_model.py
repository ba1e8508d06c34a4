"""A GPU time model that runs without a GPU: predicts the H200 time of a call from the host work it does
(benchmarks/gpu_host_time.py measures it on this machine) and what it launches (benchmarks/gpu_cost.py counts
it on fake CUDA tensors), calibrated on the H200 runs' numbers (../shared/gpu/README.md at 632af97;
benchmarks/results/h200/2026-11-26/ at 0d4bbe5; benchmarks/results/h200/2026-11-27/ at aad47ba, whose CUDA
graph replays also give the device time alone: `replay_report`).

    time   = max(host, device) + one kernel's floor (the last launch's tail)
    host   = unit x the call's host work in control units  +  launch x the GPU kernels it launches
             + triton_launch x its Triton launches
    device = max(kernels x floor, bytes / (HBM rate x streaming efficiency))  +  GEMM FLOPs / GEMM rate

The host work is measured, not counted: gpu_host_time.py times the call's Python, dispatcher and Triton
launch path with the kernels stubbed out, in units of a fixed computation of plain torch ops timed beside it
(its `_control`), so the units do not depend on this machine's speed or load. `unit` (what a control unit of
work costs the H200's host), `launch` (what each GPU kernel adds on that host: the CUDA launch, the
allocator) and `triton_launch` (what a Triton launch adds beyond that: its C launcher and driver calls, which
gpu_host_time.py stubs out) are fitted by non-negative least squares to the host-bound rows of both runs;
each row's units are those of the code that ran it (HOST_UNITS_632: measured under torch 2.15 here;
HOST_UNITS_0D4: under the GPU machine's Python 3.12 / torch 2.11 / Triton 3.6), today's are measured when
the model runs. The GPU's rates are the first run's own measurements (a bf16 GEMM at 765 TFLOP/s, a device
copy at 4.3 TB/s); the streaming efficiency comes from the most bandwidth-bound row, the floor is a fixed
3 us. The blocked linear path's epilogues have their own rates (EPI_*), from the second run's sweep. The
GEMM kernels with the softmax in their epilogues (linear_gemm_stats.py, linear_gemm_dlogits.py) are priced
from their compiled SASS (`gemm_stats_instructions`) at an assumed main-loop rate (GEMM_STATS_RATE), which no
GPU has measured yet.

`python benchmarks/gpu_model.py` prints the calibration (model against measurement per row, and how well it
fits) and the predictions for today's code; `finish_report` prices the token losses' finishing tail (the last
program's dependent loads) beside their streaming, and `cuda_policy_report` the CUDA C++ policy_loss forward
with its loads issued first (by analogy with a measured Triton tile). What the model leaves out: occupancy and
tile effects inside a kernel (a streaming kernel is one rate: the third run's replays put policy_loss's
kernels at 0.4-1.2 TB/s of the model's bytes, kl_penalty's at 3.0-4.2, so the model's device term is 1.6-3.8x
short for policy_loss, of which finish_report explains part), the host's warm-up (a cold host took 2x the
time: the third run's first rows), L2 hits, the overlap of host and device work within a call (host-bound
calls hide the device, as `max` says), GPU clock changes and one machine's GEMMs running slower than another's
(the second run's were 14 % slower), misaligned GEMM operands, and any difference between this machine's torch
2.15 / triton 3.9 and the GPU's torch 2.11 / triton 3.6 beyond what the units capture. The measured rows are
the min over 3 rounds of do_bench.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from unittest import mock

import numpy as np

# The H200 run's own rates (../shared/gpu/README.md).
H200_GEMM_FLOPS = 765e12  # bf16 8192x4096 @ 4096x128256 in 11.25 ms
H200_HBM = 4.3e12  # bytes/s read + written by a device-to-device copy
KERNEL_FLOOR = 3e-6  # a launch's minimum on a GPU


@dataclasses.dataclass
class Counts:
    """What one call launches (forward + backward), in the model's terms (gpu_cost.Cost.model_counts)."""

    aten: int = 0  # ATen ops (each a kernel)
    triton_kernels: int = 0  # Triton launches
    triton_args: int = 0  # arguments of their launches (their host cost is in the measured host work)
    native_kernels: int = 0  # the kernels of the CUDA C++ ops and the ATen ops their bindings call
    nodes: int = 0  # autograd nodes the backward runs
    bytes: float = 0.0  # moved by the streaming kernels
    gemm_flops: float = 0.0

    @property
    def kernels(self) -> int:
        return self.aten + self.triton_kernels + self.native_kernels


@dataclasses.dataclass
class Model:
    """The host's cost of a control unit of work and of a kernel launch, the streaming efficiency and a
    kernel's floor (seconds)."""

    unit: float
    launch: float
    stream_efficiency: float
    # What a Triton launch costs the host beyond any kernel's `launch`: its C launcher and driver calls, which
    # gpu_host_time.py stubs out (fitted; 0 where the rows cannot tell it apart).
    triton_launch: float = 0.0
    kernel_floor: float = KERNEL_FLOOR
    gemm_flops: float = H200_GEMM_FLOPS
    hbm: float = H200_HBM

    def host_time(self, units: float, c: Counts) -> float:
        return self.unit * units + self.launch * c.kernels + self.triton_launch * c.triton_kernels

    def device_time(self, c: Counts) -> float:
        stream = c.bytes / (self.hbm * self.stream_efficiency)
        return max(stream, c.kernels * self.kernel_floor) + c.gemm_flops / self.gemm_flops

    def time(self, units: float, c: Counts) -> float:
        return max(self.host_time(units, c), self.device_time(c)) + self.kernel_floor


@dataclasses.dataclass
class Row:
    """A measured row of an H200 run with the counts and the host work of the code that ran it."""

    op: str
    shape: str
    provider: str
    measured_ms: float
    counts: Counts
    units: float
    run: str = "632af97"


# The host work of each row's call at 632af97, forward + backward, in control units: `PYTHONPATH=<a checkout
# of 632af97, its extension built> python benchmarks/gpu_host_time.py --json`, two runs (2026-11-26, load
# average below 1) within 1 % of each other, their mean. The CUDA C++ flavor's is the C++
# CPU flavor's (the same op and Python; a binding on CPU kernels for the CUDA one).
HOST_UNITS_632 = {
    ("policy_loss", "eager"): 12.37,
    ("policy_loss", "rlkernels[triton]"): 7.30,
    ("policy_loss", "rlkernels[cuda]"): 4.39,
    ("kl_penalty k3", "eager"): 1.92,
    ("kl_penalty k3", "rlkernels[triton]"): 2.29,
    ("kl_penalty k3", "rlkernels[cuda]"): 1.07,
    ("kl_penalty k1+", "eager"): 1.29,
    ("kl_penalty k1+", "rlkernels[triton]"): 2.23,
    ("kl_penalty k1+", "rlkernels[cuda]"): 1.07,
}

# The rows' counts, by gpu_cost.py on fake CUDA tensors at each row's shape (the bench's inputs:
# benchmarks/bench_policy_loss.py, bench_kl.py; `full` = forward + backward with upstream gradients). Bytes:
# every kernel's distinct tensor arguments (inputs read, outputs written once).
_P_SMALL, _P_LARGE = 64 * 4096, 512 * 8192
PROVIDERS = ("eager", "rlkernels[triton]", "rlkernels[cuda]")
_KL = {"k3": (20, 7, 138), "k1+": (10, 6, 100)}  # eager: (ATen kernels, autograd nodes, bytes per element)


# The policy_loss rows' shapes: B x T tokens.
_POLICY_N = {"B=64 T=4096": _P_SMALL, "B=512 T=8192": _P_LARGE}


def _flavors_632(n: int) -> tuple[Counts, Counts]:
    """(Triton, CUDA C++) counts of policy_loss at 632af97, n tokens."""
    # The Triton flavor: 6 validation ops, the forward kernel, 23 ATen ops finishing the [B] partials,
    # the backward's row scale and kernel; reads 4 fp32 [B, T] and the mask, writes and reads the saved
    # gradient, writes d logp and d entropy. 36 + 42 launch arguments (16 runtime scalars each).
    triton = Counts(aten=30, triton_kernels=2, triton_args=78, nodes=3, bytes=34.0 * n)
    # CUDA C++: 6 validation ops; the forward binding's 2 kernels and 15 ATen ops, the backward's 1 + 1.
    cuda = Counts(aten=6, native_kernels=19, nodes=3, bytes=34.0 * n)
    return triton, cuda


def _flavors_0d4(n: int) -> tuple[Counts, Counts]:
    """(Triton, CUDA C++) counts of policy_loss at 0d4bbe5 (gpu_cost.py on fake CUDA tensors): one kernel
    per pass and a row-scale kernel, no ATen op; bytes: each tensor argument once."""
    triton = Counts(triton_kernels=3, nodes=1, bytes=34.0 * n)
    cuda = Counts(native_kernels=3, nodes=1, bytes=34.0 * n)
    return triton, cuda


def _policy_rows(measured: dict, flavors, units: dict, run: str) -> list[Row]:
    """policy_loss rows of one run: `measured` {shape: (eager, triton, cuda) min ms}, `flavors(n)` the
    (Triton, CUDA C++) counts of the code that ran, `units` its host work."""
    rows = []
    for shape, ms in measured.items():
        n = _POLICY_N[shape]
        eager = Counts(aten=190, nodes=25, bytes=838.0 * n)  # the reference's ops, no public function
        for provider, counts, m in zip(PROVIDERS, (eager, *flavors(n)), ms, strict=True):
            rows.append(Row("policy_loss", shape, provider, m, counts, units["policy_loss", provider], run))
    return rows


def _kl_rows(measured: dict, units: dict, run: str) -> list[Row]:
    """kl_penalty rows of one run: `measured` {(kind, n): (eager, triton, cuda) min ms}; the kernels' counts
    are the same at both commits."""
    rows = []
    for (kind, n), ms in measured.items():
        aten, nodes, per = _KL[kind]
        eager = Counts(aten=aten, nodes=nodes, bytes=per * n)
        kernels = Counts(nodes=1, bytes=28.0 * n)  # forward: 2 reads, 1 write; backward: 3, 1
        triton = dataclasses.replace(kernels, triton_kernels=2, triton_args=15)
        cuda = dataclasses.replace(kernels, native_kernels=2)
        shape, key = f"N={n} {kind}", f"kl_penalty {kind}"
        for provider, counts, m in zip(PROVIDERS, (eager, triton, cuda), ms, strict=True):
            rows.append(Row("kl_penalty", shape, provider, m, counts, units[key, provider], run))
    return rows


# The first H200 run (../shared/gpu/README.md, main at 632af97) and the second (benchmarks/results/h200/
# 2026-11-26/, main at 0d4bbe5): min ms over 3 rounds, forward + backward, fp32, (eager, triton, cuda).
POLICY_632 = {"B=64 T=4096": (2.739, 1.344, 0.697), "B=512 T=8192": (2.901, 1.568, 1.018)}
KL_632 = {
    ("k3", 4194304): (0.280, 0.252, 0.105),
    ("k3", 16777216): (0.675, 0.204, 0.136),
    ("k1+", 4194304): (0.137, 0.204, 0.098),
    ("k1+", 16777216): (0.407, 0.198, 0.133),
}
POLICY_0D4 = {"B=64 T=4096": (3.010, 0.5381, 0.2109), "B=512 T=8192": (3.073, 0.645, 0.188)}
KL_0D4 = {
    ("k3", 4194304): (0.3059, 0.2344, 0.06992),
    ("k3", 16777216): (0.6702, 0.2161, 0.1364),
    ("k1+", 4194304): (0.2056, 0.2289, 0.09642),
    ("k1+", 16777216): (0.4034, 0.2742, 0.1226),
}
# Their host work at 0d4bbe5 in control units, measured under that machine's software (Python 3.12, torch
# 2.11, Triton 3.6: the CPU machine's pyenv 3.12 and PyPI's torch==2.11.0, the extension built for it):
# `python benchmarks/gpu_host_time.py --json --rounds 5 --providers eager triton cpu`, 2026-11-26. Under torch
# 2.15 / Triton 3.9 the Triton flavor's units are about a fifth lower (3.84 for policy_loss).
HOST_UNITS_0D4 = {
    ("policy_loss", "eager"): 15.56,
    ("policy_loss", "rlkernels[triton]"): 4.62,
    ("policy_loss", "rlkernels[cuda]"): 2.18,
    ("kl_penalty k3", "eager"): 1.92,
    ("kl_penalty k3", "rlkernels[triton]"): 1.93,
    ("kl_penalty k3", "rlkernels[cuda]"): 0.86,
    ("kl_penalty k1+", "eager"): 1.31,
    ("kl_penalty k1+", "rlkernels[triton]"): 1.93,
    ("kl_penalty k1+", "rlkernels[cuda]"): 0.86,
}


# The third run (benchmarks/results/h200/2026-11-27/, main at aad47ba), min ms over 3 rounds. Its B=64
# policy_loss rows ran first, the host still cold: 3 warm-up calls instead of 50 gave 1.5-2.5x the time
# there (kernel-times-tokens*.log).
POLICY_AAD = {"B=64 T=4096": (3.665, 0.777, 0.3442), "B=512 T=8192": (2.846, 0.4105, 0.1661)}
KL_AAD = {
    ("k3", 4194304): (0.3324, 0.2042, 0.06749),
    ("k3", 16777216): (0.6637, 0.2445, 0.1376),
    ("k1+", 4194304): (0.1796, 0.2118, 0.0719),
    ("k1+", 16777216): (0.4021, 0.2026, 0.1252),
}
# Their host work at aad47ba, measured on that H200's own host (host-time.log: gpu_host_time.py --rounds 2
# --cases policy_loss kl_penalty --providers triton cpu); k1+ as k3 (the same launch path, as at 0d4bbe5);
# the eager reference's as at 0d4bbe5 (its code did not change).
HOST_UNITS_AAD = {
    **HOST_UNITS_0D4,
    ("policy_loss", "rlkernels[triton]"): 4.23,
    ("policy_loss", "rlkernels[cuda]"): 1.87,
    ("kl_penalty k3", "rlkernels[triton]"): 1.86,
    ("kl_penalty k3", "rlkernels[cuda]"): 0.73,
    ("kl_penalty k1+", "rlkernels[triton]"): 1.86,
    ("kl_penalty k1+", "rlkernels[cuda]"): 0.73,
}


def _flavors_aad(n: int) -> tuple[Counts, Counts]:
    """(Triton, CUDA C++) counts of policy_loss at aad47ba (the third run's profile, kernel-times-tokens.log):
    the forward and backward kernels and one _assert_async of the value flag."""
    triton = Counts(triton_kernels=2, aten=1, nodes=1, bytes=34.0 * n)
    cuda = Counts(native_kernels=3, nodes=1, bytes=34.0 * n)
    return triton, cuda


# The fourth run (benchmarks/results/h200/2026-11-30/, main at 14676c3), min ms over 3 rounds of its second
# token bench (bench-tokens-call3.log; the first ran beside the cut test step's workers). Its host was slower
# than the earlier runs' (eager 1.1-1.2x the third run's) and its host-time step printed nothing, so the
# units are measured on the CPU machine under the GPU machine's software (the .ci/gpu-carry virtualenv:
# Python 3.12, torch 2.11, Triton 3.6; gpu_host_time.py --json --rounds 5 --providers triton cpu), which
# leaves that host's speed out of them.
POLICY_146 = {"B=64 T=4096": (3.13, 0.5823, 0.1982), "B=512 T=8192": (3.47, 0.6331, 0.1793)}
KL_146 = {
    ("k3", 4194304): (0.3998, 0.2963, 0.09261),
    ("k3", 16777216): (0.6677, 0.2542, 0.1172),
    ("k1+", 4194304): (0.2417, 0.4027, 0.1152),
    ("k1+", 16777216): (0.4022, 0.3369, 0.1251),
}
HOST_UNITS_146 = {
    **HOST_UNITS_0D4,
    ("policy_loss", "rlkernels[triton]"): 5.18,  # (449.9 + 52.2) / 97.0 us
    ("policy_loss", "rlkernels[cuda]"): 2.05,  # 198.5 / 97.0
    ("kl_penalty k3", "rlkernels[triton]"): 2.15,  # (176.5 + 32.5) / 97.0
    ("kl_penalty k3", "rlkernels[cuda]"): 0.77,  # 74.6 / 97.0
    ("kl_penalty k1+", "rlkernels[triton]"): 2.15,
    ("kl_penalty k1+", "rlkernels[cuda]"): 0.77,
}


def _flavors_146(n: int) -> tuple[Counts, Counts]:
    """(Triton, CUDA C++) counts of policy_loss at 14676c3 (kernel-times-tokens.log): the forward kernel,
    which asserts its value flag itself, and the backward's."""
    triton = Counts(triton_kernels=2, nodes=1, bytes=34.0 * n)
    cuda = Counts(native_kernels=2, nodes=1, bytes=34.0 * n)
    return triton, cuda


def calibration_rows() -> list[Row]:
    return [
        *_policy_rows(POLICY_632, _flavors_632, HOST_UNITS_632, "632af97"),
        *_kl_rows(KL_632, HOST_UNITS_632, "632af97"),
        *_policy_rows(POLICY_0D4, _flavors_0d4, HOST_UNITS_0D4, "0d4bbe5"),
        *_kl_rows(KL_0D4, HOST_UNITS_0D4, "0d4bbe5"),
        *_policy_rows(POLICY_AAD, _flavors_aad, HOST_UNITS_AAD, "aad47ba"),
        *_kl_rows(KL_AAD, HOST_UNITS_AAD, "aad47ba"),
        *_policy_rows(POLICY_146, _flavors_146, HOST_UNITS_146, "14676c3"),
        *_kl_rows(KL_146, HOST_UNITS_146, "14676c3"),
    ]


# The device time alone: the third run's CUDA graph replays (graph-replay.log, us a call, forward + backward
# captured once; the code of aad47ba), against the model's device term with the rows' counts.
REPLAY_US = {
    ("policy_loss", "B=64 T=4096"): (14.6, 21.6),  # (Triton, CUDA C++)
    ("policy_loss", "B=512 T=8192"): (114.7, 155.6),
    ("kl_penalty", "N=4194304 k3"): (32.1, 39.5),
    ("kl_penalty", "N=16777216 k3"): (111.4, 135.1),
    ("kl_penalty", "N=4194304 k1+"): (32.1, 33.9),
    ("kl_penalty", "N=16777216 k1+"): (111.4, 117.6),
}


# The fourth run's replays (benchmarks/results/h200/2026-11-30/graph-replay.log, the code of 14676c3).
REPLAY_US_146 = {
    ("policy_loss", "B=64 T=4096"): (11.8, 17.6),
    ("policy_loss", "B=512 T=8192"): (77.2, 124.0),
    ("kl_penalty", "N=4194304 k3"): (32.3, 32.4),
    ("kl_penalty", "N=16777216 k3"): (112.3, 114.3),
    ("kl_penalty", "N=4194304 k1+"): (32.5, 32.1),
    ("kl_penalty", "N=16777216 k1+"): (112.0, 113.8),
}
REPLAYS = {"aad47ba": REPLAY_US, "14676c3": REPLAY_US_146}


def replay_report(model: Model, rows: list[Row]) -> str:
    """The model's device term against the device time measured alone (CUDA graph replay)."""
    lines = [
        "",
        "device time alone: the model's device term against the third and fourth runs' CUDA graph replays",
        "",
        "| run | op | shape | flavor | bytes MB | replay us | model device us | model / replay "
        "| replay TB/s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        replays = REPLAYS.get(r.run, {})
        if (r.op, r.shape) not in replays or r.provider == "eager":
            continue
        us = replays[r.op, r.shape][r.provider == "rlkernels[cuda]"]
        dev = model.device_time(r.counts) * 1e6
        lines.append(
            f"| {r.run} | {r.op} | {r.shape} | {r.provider} | {r.counts.bytes / 1e6:.0f} | {us:.1f} | "
            f"{dev:.1f} | {dev / us:.2f} | {r.counts.bytes / us / 1e6:.2f} |"
        )
    return "\n".join(lines)


# The finishing program of policy_loss's and value_loss's Triton forward (rlkernels/triton/_aggregation.py):
# the launch's last program reads every program's partials with volatile loads of L2, each load waited for
# before the next, while the rest of the GPU has finished. A load's price, FINISH_LOAD_S, is fitted on the one
# replayed row whose streaming the model knows: value_loss (fwd+bwd, 71 MB) streaming at kl_penalty's replay
# rate, its 57.0 us less that stream, over its 128 loads. policy_loss's replays leave more than stream and
# tail explain (its per-program work: the partial sums' exchanges and the ticket), which the model does not
# price. policy_forward_sweep.py's last variants (the same tile with 20, 40 and 160 loads) measure it directly
# on the next GPU run.
KL_REPLAY_RATE = 470e6 / 111.4e-6  # bytes/s: kl_penalty k3 at N=16.8M, the third run's Triton replay
FINISH_LOAD_S = (57.0e-6 - 71e6 / KL_REPLAY_RATE) / 128


def finish_loads(rows: int, chunks: int, tile_rows: int, group: int, reread: bool) -> int:
    """Dependent L2 loads of the finishing program over `rows` rows of `chunks` partials, `tile_rows` rows
    and `group` chunks a load: the first pass's, then the second's (which re-read every chunk until
    2026-11-28, `reread`, and now reads each row's sums once, tile_rows x group rows a load)."""
    tiles = -(-rows // tile_rows)
    first = tiles * -(-chunks // group)
    return first + (first if reread else -(-rows // (tile_rows * group)))


# (op, shape, replay us, bytes moved, finish loads) of the third run's code, aad47ba: 1024-token tiles of 4
# warps, 64 rows and one chunk a load, the second pass re-reading every chunk.
FINISH_MEASURED = [
    ("value_loss", "B=512 T=8192", 57.0, 71e6, finish_loads(512, 8, 64, 1, True)),
    ("policy_loss", "B=512 T=8192", 114.7, 105e6, finish_loads(512, 8, 64, 1, True)),
    ("policy_loss", "B=64 T=4096", 14.6, 6.6e6, finish_loads(64, 4, 64, 1, True)),
]


def finish_loads_today(op: str, b: int, t: int) -> int:
    """The finishing program's loads of today's forward launcher of `op` (policy_loss or value_loss) on a GPU:
    the token tile its launcher picks there (not the interpreter's) and finish_tile."""
    from rlkernels.triton import _aggregation, policy_loss, value_loss

    with mock.patch.object(policy_loss, "triton_interpreting", lambda: False):
        if op == "policy_loss":
            (block, warps), parts = policy_loss._forward_tile(t), policy_loss.NUM_PARTS_PAD
        else:
            block, warps, parts = policy_loss._block(t), value_loss.FORWARD_WARPS, value_loss.NUM_PARTS_PAD
    rows, group = _aggregation.finish_tile(block, warps, parts.value)
    return finish_loads(b, -(-t // block), rows, group, False)


# The same replays at 14676c3, whose finishing tails are today's (graph-replay.log of the fourth run).
FINISH_REPLAY_146 = {
    ("value_loss", "B=512 T=8192"): 44.8,
    ("policy_loss", "B=512 T=8192"): 77.2,
    ("policy_loss", "B=64 T=4096"): 11.8,
}


def finish_report() -> str:
    """The token ops' replays as stream (at kl_penalty's replay rate) + the finishing program's loads, for the
    third run's code and today's (replayed by the fourth run)."""
    today = [
        (op, shape, FINISH_REPLAY_146[op, shape], nbytes,
         finish_loads_today(op, *(int(x[2:]) for x in shape.split())))
        for op, shape, _, nbytes, _ in FINISH_MEASURED
    ]  # fmt: skip
    lines = [
        "",
        f"the finishing program's tail: {FINISH_LOAD_S * 1e6:.2f} us a dependent L2 load (fitted on",
        f"value_loss's replay), streams at kl_penalty's replay rate ({KL_REPLAY_RATE / 1e12:.2f} TB/s)",
        "",
        "| op | shape | code | bytes MB | finish loads | stream us | tail us | model us | replay us |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    rows = [("aad47ba", *r) for r in FINISH_MEASURED] + [("today", *r) for r in today]
    for code, op, shape, replay, nbytes, loads in rows:
        stream, tail = nbytes / KL_REPLAY_RATE * 1e6, loads * FINISH_LOAD_S * 1e6
        lines.append(
            f"| {op} | {shape} | {code} | {nbytes / 1e6:.0f} | {loads} | {stream:.1f} | {tail:.1f} | "
            f"{stream + tail:.1f} | {'-' if replay is None else f'{replay:.1f}'} |"
        )
    lines += [
        "",
        "policy_loss's replays keep what stream and tail leave out (its per-program work), so its rows",
        "here are lower bounds. The fourth run measured them: cutting the tail's loads from 128 to 20 saved",
        "37 of the 114.7 us, where the tail priced 34, but the 31.2 us predicted left 46 us out: the",
        "forward's instructions, issued after its loads (issue_report).",
    ]
    return "\n".join(lines)


# The CUDA C++ flavor's policy_loss forward (csrc/cuda/policy_loss.cu), priced by analogy with a measured
# Triton tile. The third run's sweep measured it at 134.8 us (B=512 T=8192): 1024-token blocks of 8 warps,
# 48 registers (5 blocks an SM), each thread's token loop loading as it computed, so one load of each input
# was in flight a thread. Since 2026-11-28 a block takes 2048 tokens and a thread issues its 8 loads of each
# input before it computes on the first (TokenQueue); 108 registers, 2 blocks an SM. That is the shape of the
# Triton forward's 2048x8 tile in the same sweep: 8 warps, 8 tokens of each input a thread, 117 registers
# under Triton 3.6 (2 programs an SM), 67.5 us, of which its tail was 64 loads. The model takes that row with
# the tail replaced by the CUDA last block's: 2 passes x the rows a thread takes x its row's chunk loads, 4
# chunks a round trip (loss_finish.cuh `row_partials`, unrolled).
CUDA_POLICY_FORWARD_BEFORE_US = 134.8  # policy_forward_sweep.log, "cuda flavor"
TRITON_2048X8_FORWARD_US = 67.5  # policy_forward_sweep.log, "triton block=2048 warps=8"
TRITON_2048X8_TAIL_LOADS = finish_loads(512, 4, 64, 1, True)
CUDA_POLICY_REPLAY_BEFORE_US = 155.6  # graph-replay.log, fwd+bwd, B=512 T=8192 kl+entropy
# The fourth run (benchmarks/results/h200/2026-11-30/): policy-forward-sweep.log "cuda flavor",
# graph-replay.log.
CUDA_POLICY_FORWARD_146_US = 107.4
CUDA_POLICY_REPLAY_146_US = 124.0


def cuda_finish_loads(b: int, t: int, chunk: int = 2048, threads: int = 256, unroll: int = 4) -> int:
    """Dependent L2 round trips of the CUDA forward's last block (finish_loss): its two passes, each over
    the rows a thread takes, each row's chunks `unroll` a round trip."""
    chunks = -(-t // chunk)
    return 2 * -(-b // threads) * -(-chunks // unroll)


def cuda_policy_report() -> str:
    """The CUDA C++ policy_loss forward before and after its staged loads, B=512 T=8192 (see above)."""
    tail_before = TRITON_2048X8_TAIL_LOADS * FINISH_LOAD_S * 1e6
    loads = cuda_finish_loads(512, 8192)
    tail_now = loads * FINISH_LOAD_S * 1e6
    forward = TRITON_2048X8_FORWARD_US - tail_before + tail_now
    backward = CUDA_POLICY_REPLAY_BEFORE_US - CUDA_POLICY_FORWARD_BEFORE_US
    return "\n".join(
        [
            "",
            "CUDA C++ policy_loss, B=512 T=8192 kl+entropy (by analogy with the Triton 2048x8 tile):",
            f"  forward: measured {CUDA_POLICY_FORWARD_BEFORE_US:.1f} us before; predicted {forward:.1f} us "
            f"= {TRITON_2048X8_FORWARD_US:.1f} - {tail_before:.1f} (its {TRITON_2048X8_TAIL_LOADS} tail "
            f"loads) + {tail_now:.1f} ({loads} round trips)",
            f"  replay (fwd+bwd): measured {CUDA_POLICY_REPLAY_BEFORE_US:.1f} us before; predicted "
            f"{forward + backward:.1f} us with the backward as measured ({backward:.1f} us); target 55 us",
            f"  the fourth run measured the forward at {CUDA_POLICY_FORWARD_146_US:.1f} us and the replay at "
            f"{CUDA_POLICY_REPLAY_146_US:.1f}: the analogy was wrong by 2.2x (issue_report)",
        ]
    )


# policy_loss's Triton forward as a persistent kernel (policy_loss.FORWARD_PROGRAMS_PER_SM, opt-in): one
# program an SM (149 registers a thread at 8 warps under Triton 3.9), FORWARD_STAGES tiles of 2048 tokens on
# their way while it reduces and publishes the current one, where a program per tile holds no load in flight
# from its last load to its ticket. Priced as a stream at kl_penalty's replay rate, which has its loads in
# flight the same way (an assumption: the third run measured policy_loss's forward at a third of it), plus
# the finishing tail; the backward as the third run's replay left it (its Triton replay less the sweep's
# forward of the tile that ran then).
TRITON_POLICY_BACKWARD_US = 114.7 - 93.9  # graph-replay.log; policy-forward-sweep.log "block=1024 warps=4"


def policy_forward_bytes(b: int, t: int) -> int:
    """What policy_loss's forward moves at B x T fp32 with kl and entropy: logp, old, ref and entropy and the
    bool mask read, the saved gradient written."""
    return b * t * (4 * 4 + 1 + 4)


def persistent_policy_report(b: int = 512, t: int = 8192) -> str:
    """The persistent Triton forward's predicted time, B x T fp32 with kl and entropy (see above)."""
    from rlkernels.triton import policy_loss

    nbytes = policy_forward_bytes(b, t)
    stream = nbytes / KL_REPLAY_RATE * 1e6
    tail = finish_loads_today("policy_loss", b, t) * FINISH_LOAD_S * 1e6
    target = TOKEN_TARGETS["policy_loss", f"B={b} T={t}"] * 1e3
    return "\n".join(
        [
            "",
            f"Triton policy_loss, persistent forward ({policy_loss.FORWARD_STAGES.value - 1} tiles ahead in "
            f"flight a program), B={b} T={t} kl+entropy:",
            f"  forward: predicted {stream + tail:.1f} us = {nbytes / 1e6:.0f} MB at "
            f"{KL_REPLAY_RATE / 1e12:.2f} TB/s ({stream:.1f}) + the tail ({tail:.1f}); the program-per-tile "
            f"forward measured {TRITON_2048X8_FORWARD_US:.1f} us",
            f"  replay (fwd+bwd): predicted {stream + tail + TRITON_POLICY_BACKWARD_US:.1f} us with the "
            f"backward as measured ({TRITON_POLICY_BACKWARD_US:.1f} us); target {target:.0f} us",
            f"  the fourth run measured it at {PERSISTENT_FORWARD_146_US:.1f} us (1 program an SM; 2: 65.5), "
            f"the program-per-tile forward at {TRITON_FORWARD_146_US:.1f}: it stays off",
        ]
    )


# policy-forward-sweep.log of the fourth run (B=512 T=8192 kl+entropy, fp32): the persistent forward and the
# default tile (2048 tokens, 8 warps).
PERSISTENT_FORWARD_146_US = 62.6
TRITON_FORWARD_146_US = 58.8
# Forward kernel times of the fourth run at B=512 T=8192 fp32 (kernel-times-tokens.log; the sweep's for
# policy_loss's Triton forward), us: (Triton, CUDA C++).
FORWARD_146_US = {
    "policy_loss": (TRITON_FORWARD_146_US, CUDA_POLICY_FORWARD_146_US),
    "value_loss": (25.9, 46.4),
}
# One warp instruction a cycle per SM sub-partition (4 an SM) on the H200's 132 SMs at its boost clock.
ISSUE_RATE = 132 * 4 * 1.755e9


def program_instructions(sass: str) -> int:
    """The SASS instructions a thread issues before its program's ticket (the first atomic): every
    program's path, where the finishing one's follows. Static: the paths are straight-line code but for
    the device assert's and the masks' branches."""
    import re

    code = [line for line in sass.splitlines() if re.match(r"\s+/\*[0-9a-f]{4,}\*/\s+\S", line)]
    return next(i for i, line in enumerate(code) if re.search(r"\b(ATOMG|ATOM|RED)\b", line))


def programs_per_sm(registers: int, warps: int) -> int:
    """Programs of `warps` warps an sm_90 SM holds at `registers` a thread (65536 registers, allocated 8 a
    thread at a time; at most 64 warps)."""
    allocated = -(-registers // 8) * 8
    return min(65536 // (allocated * 32 * warps), 64 // warps)


def token_forwards(b: int = 512, t: int = 8192) -> dict:
    """The Triton forwards of policy_loss (kl + entropy, the bench's options) and value_loss, fp32 with a bool
    mask, at B=b T=t on sm_90: {op: (their tile (tokens, warps), the compiled kernel)} (on meta tensors, not
    run)."""
    import torch
    from gpu_host_time import POLICY_KW

    from rlkernels.ops._aggregation import AggConfig
    from rlkernels.ops.policy_loss import check_options
    from rlkernels.triton import policy_loss, value_loss
    from rlkernels.triton._specializations import meta

    x, mask, adv = meta(b, t), meta(b, t, dtype=torch.bool), meta(b)
    agg = AggConfig("token-mean", 1, float(t), None, None, None, None)
    # the bench's options (gpu_host_time.POLICY_KW), as policy_loss turns them into the kernels' config
    config = check_options(POLICY_KW, True, True, torch.device("meta"))
    with mock.patch.object(policy_loss, "triton_interpreting", lambda: False):
        tiles = {
            "policy_loss": policy_loss._forward_tile(t),
            "value_loss": (policy_loss._block(t), value_loss.FORWARD_WARPS),
        }
        launches = {
            "policy_loss": lambda: policy_loss.policy_loss_forward(
                x, x, adv, mask, x, x, None, config, agg, True
            ),
            "value_loss": lambda: value_loss.value_loss_forward(x, x, x, mask, 0.2, agg),
        }
        return {op: (tiles[op], _compiled(launch)) for op, launch in launches.items()}


def issue_report(b: int = 512, t: int = 8192) -> str:
    """The Triton forwards of policy_loss (kl + entropy) and value_loss, fp32 with a bool mask, priced as
    their stream, their instruction issue (their sm_90 SASS, a program's path) and their finishing tail in
    sequence, against the fourth run's kernel times."""
    from rlkernels.compile_check.launch import cubin_resources, cubin_sass

    forwards = token_forwards(b, t)
    tiles = {op: tile for op, (tile, _) in forwards.items()}
    sass = {op: cubin_sass(kernel.asm["cubin"]) for op, (_, kernel) in forwards.items()}
    nbytes = {"policy_loss": policy_forward_bytes(b, t), "value_loss": b * t * (4 * 3 + 1)}
    lines = [
        "",
        f"the Triton forwards at B={b} T={t} fp32 (bool mask; policy_loss with kl and entropy), priced as",
        "stream + issue + tail, none overlapping the others: the stream at kl_penalty's replay rate, a",
        f"program's SASS instructions (sm_90) at one a cycle per SM quarter ({ISSUE_RATE / 1e12:.2f} T warp",
        "instructions/s), the finishing program's loads; against the fourth run's kernel times",
        "",
        "| op | tile | registers (programs an SM) | instructions a thread | stream us | issue us | tail us | "
        "model us | measured us (Triton / CUDA C++) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for op, (block, warps) in tiles.items():
        n = program_instructions(sass[op])
        registers = cubin_resources(forwards[op][1].asm["cubin"])[0]
        issue = -(-t // block) * b * warps * n / ISSUE_RATE * 1e6
        stream = nbytes[op] / KL_REPLAY_RATE * 1e6
        tail = finish_loads_today(op, b, t) * FINISH_LOAD_S * 1e6
        triton_us, cuda_us = FORWARD_146_US[op]
        lines.append(
            f"| {op} | {block} x {warps} warps | {registers} ({programs_per_sm(registers, warps)}) | {n} | "
            f"{stream:.1f} | {issue:.1f} | {tail:.1f} | "
            f"{stream + issue + tail:.1f} | {triton_us} / {cuda_us} |"
        )
    lines += [
        "",
        "Under Triton 3.6, which the GPU ran, the counts were 1355 and 447 (models 51.1 and 26.5 us) and",
        "policy_loss's registers 90 (2 programs an SM); since a bool mask's kept token weighs 1 without a",
        "product (2026-12-01), 1234 and 431 (49.0 and 26.2 us) and 80 registers (3 programs an SM).",
        "Neither the bytes nor the instructions alone explain a forward; their sum with the tail does,",
        "as if a program's loads, arithmetic and finish never overlapped (at 2 programs an SM; a third",
        "program may overlap them, which the model does not price). policy_loss's forward meets the 55 us",
        "fwd+bwd target (its backward 13 us) at 42 us: a third fewer instructions a token than 2026-11-30's,",
        "or its loads overlapping its arithmetic. The CUDA",
        "C++ forwards take 1.8x the Triton ones with about as many instructions before their ticket",
        "(policy_loss.cu 1499, value_loss.cu 374 under nvcc 13): not priced here.",
    ]
    return "\n".join(lines)


def nnls(a: np.ndarray, b: np.ndarray, iters: int = 20000) -> np.ndarray:
    """min ||a x - b|| over x >= 0 (projected gradient; the problems here are tiny)."""
    x = np.maximum(np.linalg.lstsq(a, b, rcond=None)[0], 0.0)
    step = 1.0 / (np.linalg.norm(a, 2) ** 2)
    for _ in range(iters):
        x = np.maximum(x - step * a.T @ (a @ x - b), 0.0)
    return x


def fit(rows: list[Row]) -> Model:
    """`unit`, `launch` and `triton_launch` by NNLS on the host-bound rows (relative residuals: each row
    weighs alike), with the streaming efficiency from the most bandwidth-bound row; a row is host-bound when
    its device time is under 0.8 of its measured time, then (refitted twice) under 0.8 of the model's host
    time."""
    by_bytes = max((r for r in rows if r.provider == "rlkernels[cuda]"), key=lambda r: r.counts.bytes)
    efficiency = min(1.0, by_bytes.counts.bytes / (by_bytes.measured_ms * 1e-3 - KERNEL_FLOOR) / H200_HBM)
    model = Model(0.0, 0.0, efficiency)
    host_rows = [r for r in rows if model.device_time(r.counts) < 0.8 * (r.measured_ms * 1e-3 - KERNEL_FLOOR)]
    for _ in range(3):
        a = np.array([[r.units, r.counts.kernels, r.counts.triton_kernels] for r in host_rows], dtype=float)
        b = np.array([r.measured_ms * 1e-3 - KERNEL_FLOOR for r in host_rows])
        x = nnls(a / b[:, None], np.ones_like(b))
        model = Model(x[0], x[1], efficiency, triton_launch=x[2])
        host_rows = [
            r for r in rows if model.device_time(r.counts) < 0.8 * model.host_time(r.units, r.counts)
        ]
    return model


def report(model: Model, rows: list[Row]) -> str:
    lines = [
        f"host: {model.unit * 1e6:.1f} us per control unit of host work, {model.launch * 1e6:.1f} us per GPU "
        f"kernel, {model.triton_launch * 1e6:.1f} us more per Triton launch; streaming efficiency "
        f"{model.stream_efficiency:.2f} of {H200_HBM / 1e12:.1f} TB/s; kernel floor "
        f"{model.kernel_floor * 1e6:.0f} us",
        "",
        "| run | op | shape | provider | measured ms | host units | model ms | model / measured | host ms "
        "| device ms |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    errors, by_run = [], {}
    for r in rows:
        t = model.time(r.units, r.counts) * 1e3
        errors.append(abs(np.log(t / r.measured_ms)))
        by_run.setdefault(r.run, []).append(errors[-1])
        lines.append(
            f"| {r.run} | {r.op} | {r.shape} | {r.provider} | {r.measured_ms:.3f} | {r.units:.2f} | "
            f"{t:.3f} | {t / r.measured_ms:.2f} | {model.host_time(r.units, r.counts) * 1e3:.3f} | "
            f"{model.device_time(r.counts) * 1e3:.3f} |"
        )
    lines.append("")
    lines.append(
        f"fit: median |model/measured - 1| {np.expm1(np.median(errors)):.0%}, "
        f"worst {np.expm1(max(errors)):.0%} over {len(rows)} rows"
        + "".join(
            f"; {run}: median {np.expm1(np.median(e)):.0%}, worst {np.expm1(max(e)):.0%}"
            for run, e in by_run.items()
        )
    )
    return "\n".join(lines)


# ---- the linear ops: GEMMs and the traffic between them ----------------------------------------------------

SMS = 132  # H100 SXM / H200
# Output tiles of the cuBLAS bf16 kernels on sm_90 that the H200 traces show (kernel-times-linear.log:
# nvjet_sm90_tss_256x128, _128x256, _128x168, _256x136, _192x176, _128x224, _256x152, _168x128, _128x192):
# cuBLAS picks one per shape, so a shape loses to wave quantization only what its best tile loses.
CUBLAS_TILES = (
    (256, 128),
    (128, 256),
    (128, 168),
    (256, 136),
    (192, 176),
    (128, 224),
    (256, 152),
    (168, 128),
    (128, 192),
)


def _wave_fill(m: int, n: int, tile: tuple[int, int]) -> float:
    tiles = -(-m // tile[0]) * -(-n // tile[1])
    return tiles / (SMS * -(-tiles // SMS))


def cublas_efficiency(m: int, n: int) -> float:
    """Wave quantization of an [m, n] output in its best CUBLAS_TILES tile on SMS SMs, relative to the
    measured 765 TFLOP/s GEMM's 8192 x 128256 output (1.0 there)."""
    ref = max(_wave_fill(8192, 128256, t) for t in CUBLAS_TILES)
    return min(1.0, max(_wave_fill(m, n, t) for t in CUBLAS_TILES) / ref)


@dataclasses.dataclass
class LinearPlan:
    """What a linear log-prob path does at one shape: its GEMMs ((m, n, k, engine[, output bytes read and
    written by a GEMM that adds into its output]) each, engine "cublas" or a Triton kernel's name), the bytes
    it moves through memory around them, and the GEMM launches."""

    gemms: list
    stream_bytes: float = 0.0
    launches: int = 0
    epilogues: list = dataclasses.field(default_factory=list)  # (bytes, programs, kind) of each epilogue
    stats_stages: int = 1  # column tiles the statistics epilogue has in flight (linear_blocked.EPI_STAGES)
    dlogits_stages: int = 1  # and the d logits epilogue (1: a program per tile, before 2026-11-28)
    serial_s: float = 0.0  # seconds a GEMM kernel's tensor cores wait for its own epilogue


# The Triton GEMM kernels' rate as a fraction of cuBLAS's, fitted to the H200 run (fit_linear).
TRITON_GEMM = {"fused_forward": 0.42, "fused_backward": 0.67}
# The blocked path's epilogues (Triton kernels reading an L2-resident logits block) move bytes at most at
# EPI_CAP, and at most EPI_PER_PROGRAM per program in their grid. Both from the second H200 run's sweep
# (benchmarks/results/h200/2026-11-26/sweep.log, N=8192 D=4096 V=128256): the forward's statistics kernel
# read its 4.2 GB of fp32 logits in 5.7 ms with 64 programs (2048-row blocks; its time over its GEMMs alone)
# and in about 2.0 ms with 256 (8192-row blocks).
EPI_PER_PROGRAM = 11.4e9
EPI_CAP = 2.1e12
# The d logits epilogue, a program per 32 x 128 tile until 2026-11-28, read its block and wrote d z faster:
# 6.3 GB in 2135 us, 2.95 TB/s, at N=8192 D=4096 V=128256 (the third H200 run's kernel times,
# benchmarks/results/h200/2026-11-27/kernel-times-linear.log); the model had priced it at EPI_CAP.
EPI_CAPS = {"stats": EPI_CAP, "dlogits": 2.95e12}
# The statistics epilogue with its column loop pipelined (linear_blocked.EPI_STAGES > 1, 2026-11-28): a
# prediction, not a fit. Until then its programs held one column tile of the block in flight, and only while
# loading it: 8192 rows x 128 fp32 columns over 132 SMs is 32 KB an SM, whatever the programs' shape, which at
# about 1 us of latency, half the time, reads about 2.1 TB/s: EPI_CAP, and why the third run's sweep of
# program shapes stayed there. With two tiles in flight while one is reduced it is priced as a streaming
# kernel whose loads stay in flight: kl_penalty's replay rate. EPI_PER_PROGRAM (one tile in flight a program)
# scales by the same factor. The d logits epilogue (EPI_CAPS while its programs took one tile each) loops over
# DLOGITS_TILES column tiles the same way since 2026-11-28: the same price.
EPI_STAGED_CAP = KL_REPLAY_RATE


def linear_time(plan: LinearPlan, model: Model, triton_gemm: dict = TRITON_GEMM) -> float:
    t = 0.0
    for m, n, k, engine, *c_bytes in plan.gemms:
        if engine == "cublas":
            eff = cublas_efficiency(m, n)
        elif engine in (
            "gemm_stats",
            "gemm_dlogits",
        ):  # its own tile's wave fill, against cuBLAS's at the measured GEMM
            from rlkernels.triton import linear_gemm_stats as gs

            tile = (gs.BLOCK_N, gs.BLOCK_V)
            eff = GEMM_STATS_RATE * _wave_fill(m, n, tile) / _wave_fill(8192, 128256, (256, 128))
        else:
            eff = triton_gemm[engine]
        compute = 2.0 * m * n * k / (model.gemm_flops * eff)
        # A GEMM that adds into its output (beta = 1) reads and writes it in its epilogue, overlapped with
        # the main loop unless the output's traffic takes longer (a roofline per GEMM).
        memory = sum(c_bytes) / (model.hbm * model.stream_efficiency)
        t += max(compute, memory)
    for b, programs, kind in plan.epilogues:
        if kind in CUDA_ROW_RATES:  # a thread block a row: over a thousand of them at every block priced
            t += b / CUDA_ROW_RATES[kind]
            continue
        stages = plan.stats_stages if kind == "stats" else plan.dlogits_stages
        cap = EPI_STAGED_CAP if stages > 1 else EPI_CAPS[kind]
        t += b / min(cap, programs * EPI_PER_PROGRAM * cap / EPI_CAP)  # a program's rate scales alike
    t += plan.serial_s
    return t + plan.stream_bytes / (model.hbm * model.stream_efficiency) + plan.launches * model.kernel_floor


def _slices(total: int, width: int) -> list[int]:
    return [min(width, total - s) for s in range(0, total, width)]


def plan_fused_triton(n, v, d, mode: str, itemsize: int = 2) -> LinearPlan:
    """The Triton flavor at 632af97 (and today on CPU tensors): fused GEMM + softmax kernels; the backward
    per vocabulary slice of 256 MiB of d z: the logits recomputed by a Triton GEMM that writes d z, d W by
    cuBLAS, d hidden by a Triton GEMM into the fp32 accumulator."""
    gemms = [(n, v, d, "fused_forward")]
    if mode == "no_grad":
        return LinearPlan(gemms, launches=2)
    cols = min(v, max(4096, (256 << 20) // (n * itemsize)))
    traffic = 0.0
    for c in _slices(v, cols):
        gemms += [(n, c, d, "fused_backward"), (c, d, n, "cublas"), (n, d, c, "fused_backward")]
        traffic += 3 * n * c * itemsize + 2 * n * d * 4  # d z written, read twice; the fp32 d hidden
    return LinearPlan(gemms, traffic, launches=2 + 3 * len(_slices(v, cols)))


def plan_blocked(
    n, v, d, mode: str, itemsize: int = 2, forward: str = "blocked", backward: str = "blocked"
) -> LinearPlan:
    """The Triton flavor's GPU path now (rlkernels/triton/linear_blocked.py): cuBLAS GEMMs into an
    L2-resident logits block, Triton epilogues reading it there (no memory traffic for the logits); the
    backward row group by row group (`backward_shape`). With forward="gemm_stats" the forward is
    linear_gemm_stats.py's one kernel instead (`plan_gemm_stats`); with backward="gemm_dlogits" each row
    group's slice is one linear_gemm_dlogits.py kernel in place of its blocks' GEMMs and epilogues."""
    from rlkernels.triton import linear_blocked as lb

    if forward == "gemm_stats":
        first = plan_gemm_stats(n, v, d)
        gemms, launches, epilogues = list(first.gemms), first.launches, []
        stream, serial = first.stream_bytes, first.serial_s
    else:
        rows, cols = lb.forward_shape(n, v, None)
        gemms, launches, epilogues, stream, serial = [], 1, [], 0.0, 0.0
        for r in _slices(n, rows):
            for c in _slices(v, cols):
                gemms.append((r, c, d, "cublas"))
                epilogues.append((r * c * 4, -(-r // lb.EPI_ROWS), "stats"))  # a program per 32 rows
                launches += 2
    if mode == "no_grad":
        return LinearPlan(gemms, stream, launches, epilogues, stats_stages=lb.EPI_STAGES, serial_s=serial)
    group, cols, rows = lb.backward_shape(n, v, d, itemsize, None)
    traffic = stream
    for first, g in enumerate(_slices(n, group)):
        for c in _slices(v, cols):
            if backward == "gemm_dlogits":  # the recompute with d z written from its epilogue
                gemms.append((g, c, d, "gemm_stats"))
                serial += (
                    _gemm_tiles(g, c)
                    / SMS
                    * GEMM_DLOGITS_EPILOGUE_INSTRUCTIONS
                    * WARPS_PER_SCHEDULER
                    / SM_CLOCK
                )
                traffic += g * c * itemsize
                launches += 1
            for r in _slices(g, rows) if backward == "blocked" else ():
                gemms.append((r, c, d, "cublas"))
                # _block_dlogits_kernel: reads the block, writes d z; a program per 32 rows x DLOGITS_TILES
                # column tiles of 128
                programs = -(-r // lb.EPI_ROWS) * -(-c // (lb.EPI_COLS * lb.DLOGITS_TILES))
                epilogues.append((r * c * (4 + itemsize), programs, "dlogits"))
                launches += 2
            # d weight's slice (a later group adds to it) and the group's fp32 d hidden: GEMMs with beta = 1
            gemms += [
                (c, d, g, "cublas", 2 * c * d * itemsize if first else 0),
                (g, d, c, "cublas", 2 * g * d * 4),
            ]
            launches += 2
            traffic += 2 * g * c * itemsize  # d z read by the two GEMMs (its write is the epilogue's)
        launches += 2  # the group's accumulator zeroed, written out in hidden's dtype
        traffic += g * d * (4 + 4 + itemsize)
    dlogits_stages = lb.EPI_STAGES if lb.DLOGITS_TILES > 1 else 1
    return LinearPlan(
        gemms, traffic, launches, epilogues, lb.EPI_STAGES, dlogits_stages=dlogits_stages, serial_s=serial
    )


# The third run's CUDA C++ flavor (benchmarks/results/h200/2026-11-27/bench-linear.log; ms, and the GEMM floor
# measured beside it).
CUDA_LINEAR_MEASURED_AAD = [
    ((8192, 128256, 4096), "no_grad", 16.11, 12.87),
    ((8192, 128256, 4096), "full", 231.06, 51.42),
    ((8192, 152064, 3584), "no_grad", 17.71, 13.75),
    ((8192, 152064, 3584), "full", 243.54, 53.20),
]


def _old_row_rate() -> float:
    """The old row kernel's bytes/s: the first no-grad row's fp32 logits over its time beyond the GEMM."""
    (n, v, _), _, ms, floor_ms = CUDA_LINEAR_MEASURED_AAD[0]
    return n * v * 4 / ((ms - floor_ms) * 1e-3)


# The CUDA C++ flavor's row kernels (csrc/cuda/logprobs.cu) as linear_logprobs' epilogues, in bytes/s. "old":
# one logit a thread per step, reading [N, C] fp32 logits from memory, fitted to the third run's no-grad
# forward above. "packed": 4 packs of 16 bytes a thread in flight since 2026-11-29, priced at the CUDA
# kl_penalty's third-run replay rate (its 470 MB at N=16.8M), as docs/gpu_token_ops.md predicts
# logprobs_from_logits' CUDA kernels: a prediction.
CUDA_ROW_RATES = {
    "cuda_rows_old": _old_row_rate(),
    "cuda_rows": 470e6 / (REPLAY_US[("kl_penalty", "N=16777216 k3")][1] * 1e-6),
}


def plan_cuda_slices(n, v, d, mode: str, itemsize: int = 2) -> LinearPlan:
    """The CUDA C++ flavor before 2026-11-29: vocabulary slices of every row (256 MiB of buffers: an [N, C]
    fp32 logits slice, and in the backward d z [N, C] beside it), the row kernel reading the slice from
    memory; d hidden += an fp32 [N, D] product formed, then added. Priced as if cuBLAS ran at its rate on
    every GEMM, which it did not on the backward's misaligned d z rows."""
    cols = min(v, max(1024, (256 << 20) // (n * 4)))
    gemms = [(n, c, d, "cublas") for c in _slices(v, cols)]
    epilogues = [(n * c * 4, n, "cuda_rows_old") for c in _slices(v, cols)]
    if mode == "no_grad":
        return LinearPlan(gemms, launches=2 * len(epilogues), epilogues=epilogues)
    cols = min(v, max(1024, (256 << 20) // (n * (4 + itemsize))))
    traffic = 0.0
    for c in _slices(v, cols):
        gemms += [(n, c, d, "cublas"), (c, d, n, "cublas"), (n, d, c, "cublas")]
        epilogues.append((n * c * (4 + itemsize), n, "cuda_rows_old"))
        traffic += 2 * n * c * itemsize + 4 * n * d * 4  # d z read twice; the product written, read, added
    return LinearPlan(gemms, traffic, 2 * len(epilogues) + 4 * len(_slices(v, cols)), epilogues)


def plan_cuda_blocked(n, v, d, mode: str, itemsize: int = 2) -> LinearPlan:
    """The CUDA C++ flavor now: linear_blocked.py's row groups and sizes (csrc/cuda/logprobs_binding.cpp takes
    the same constants) but forward blocks of CUDA_FORWARD_COLS columns, with its packed row kernels as the
    epilogues (a thread block a row; the model does not price a block's fixed work)."""
    from rlkernels.triton import linear_blocked as lb

    cols = min(v, CUDA_FORWARD_COLS)
    shape = (max(1, min(n, lb.BLOCK_BYTES // (4 * cols))), cols)
    with mock.patch.object(lb, "forward_shape", lambda *_: shape):
        plan = plan_blocked(n, v, d, mode, itemsize)
    plan.epilogues = [(b, None, "cuda_rows") for b, *_ in plan.epilogues]
    return plan


CUDA_FORWARD_COLS = 8192  # logprobs_binding.cpp kForwardCols


def cuda_linear_report(model: Model) -> str:
    lines = [
        "",
        "linear_logprobs, CUDA C++ flavor (bf16): the third run, the model of the path that ran (as if its",
        "GEMMs had run at cuBLAS's rate), and of today's blocked path",
        "",
        "| N | V | D | mode | measured ms | model ms (slices of every row) | model ms (blocked, today) | "
        "floor ms | today / floor | target |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (n, v, d), mode, ms, _ in CUDA_LINEAR_MEASURED_AAD:
        old = linear_time(plan_cuda_slices(n, v, d, mode), model) * 1e3
        new = linear_time(plan_cuda_blocked(n, v, d, mode), model) * 1e3
        gemms, target = (1, 1.05) if mode == "no_grad" else (4, 1.10)
        floor = floor_time(n, v, d, gemms, model) * 1e3
        lines.append(
            f"| {n} | {v} | {d} | {mode} | {ms:.1f} | {old:.1f} | {new:.1f} | {floor:.1f} ({gemms} GEMM) | "
            f"{new / floor:.2f} | <= {target} |"
        )
    return "\n".join(lines)


# The forward as one persistent Triton GEMM with the statistics in its epilogue (linear_gemm_stats.py). Its
# main loop is priced at cuBLAS's rate per wave: Triton's persistent TMA matmul (its tutorial 09) measured
# 1.04-1.05x cuBLAS's rate on an H100 at M=N=8192, K=4096 in fp8 (triton-lang/triton PR #5461; fp16's ratio
# not given there). An assumption for this kernel, and the first number a GPU run checks.
GEMM_STATS_RATE = 1.0
# The epilogue runs on the warps that issue the wgmma, so the tensor cores wait for it: its SASS
# instructions (a thread's, per tile; `gemm_stats_instructions`) issued by 2 warps on each of the SM's 4
# schedulers at one a cycle, at an SM clock of 1.75 GHz (an assumption: the H200's boost is 1.98 GHz, lower
# under a GEMM's power draw). A tile takes the short path unless it holds a row's label (or the vocabulary's
# ragged end): with uniform labels, 1 - (1 - BLOCK_V / V) ** BLOCK_N of the tiles.
WARPS_PER_SCHEDULER = 2
SM_CLOCK = 1.75e9
# `gemm_dlogits_instructions()` likewise (Triton 3.9, logp only): its one path.
GEMM_DLOGITS_EPILOGUE_INSTRUCTIONS = 1307
# `gemm_stats_instructions()` at the commit that added it (Triton 3.9, logp only): (short path, long path),
# the model's default so that it runs without compiling; `linear_report` recounts them.
GEMM_STATS_EPILOGUE_INSTRUCTIONS = (741, 1172)


def _compiled(launch):
    """The Triton kernel `launch()` compiles for sm_90 (on meta tensors, not run)."""
    from rlkernels.compile_check.launch import compile_only
    from rlkernels.compile_check.targets import TARGETS

    with compile_only(TARGETS[90]) as recorder:
        launch()
    return recorder.kernels[0]


def _compiled_sass(launch) -> str:
    """The SASS of the Triton kernel `launch()` compiles for sm_90 (on meta tensors, not run)."""
    from rlkernels.compile_check.launch import cubin_sass

    return cubin_sass(_compiled(launch).asm["cubin"])


def _epilogue_regions(sass: str) -> tuple[list, list]:
    """The kernel's straight-line regions (split after each branch or exit) and their exponentials."""
    import re

    code = [line for line in sass.splitlines() if re.match(r"\s+/\*[0-9a-f]{4,}\*/\s+\S", line)]
    regions = [[]]
    for line in code:
        regions[-1].append(line)
        if re.search(r"\b(BRA|EXIT)\b", line):
            regions.append([])
    return regions, [sum("MUFU.EX2" in line for line in r) for r in regions]


def gemm_stats_instructions(entropy: bool = False) -> tuple[int, int]:
    """(short, long): the SASS instructions a thread issues in `_gemm_stats_kernel`'s epilogue per tile on
    each of its two paths, compiled for sm_90 (bf16, an LLM shape). Read off the code between its branches:
    the two straight-line regions with the most exponentials are the paths, and the region before the
    shorter (the rows' labels, the branch) is added to both."""
    import torch

    from rlkernels.triton import linear_gemm_stats as gs
    from rlkernels.triton._specializations import meta

    n, v, d = 8192, 128256, 4096
    sass = _compiled_sass(
        lambda: gs.forward_tiles(
            meta(n, d, dtype=torch.bfloat16),
            meta(v, d, dtype=torch.bfloat16),
            meta(n, dtype=torch.int64),
            meta(3, gs.num_splits(v), n),
            meta(n),
            1.0,
            None,
            -100,
            entropy,
            False,
        )  # fmt: skip
    )
    regions, exps = _epilogue_regions(sass)
    first, second = sorted(sorted(range(len(regions)), key=lambda i: exps[i])[-2:])
    short, long = sorted((first, second), key=lambda i: len(regions[i]))
    common = len(regions[short - 1])
    return common + len(regions[short]), common + len(regions[long])


def gemm_dlogits_instructions(entropy: bool = False) -> int:
    """The SASS instructions a thread issues in `_gemm_dlogits_kernel`'s epilogue per tile (sm_90, bf16, an
    LLM shape): the straight-line region with the most exponentials and the one before it."""
    import torch

    from rlkernels.triton import linear_gemm_dlogits as gd
    from rlkernels.triton._specializations import meta

    g, c, d = 2048, 8192, 4096  # a row group and slice of the backward at N=8192 D=4096
    grad = meta(g)
    sass = _compiled_sass(
        lambda: gd.dlogits_slice(
            meta(g, d, dtype=torch.bfloat16),
            meta(c, d, dtype=torch.bfloat16),
            0,
            meta(g, dtype=torch.int64),
            meta(g, dtype=torch.float64),
            grad if entropy else None,
            grad,
            grad if entropy else None,
            meta(g, c, dtype=torch.bfloat16),
            1.0,
            None,
            -100,
        )  # fmt: skip
    )
    regions, exps = _epilogue_regions(sass)
    path = max(range(len(regions)), key=lambda i: exps[i])
    return len(regions[path - 1]) + len(regions[path])


def _gemm_tiles(m: int, n: int) -> int:
    from rlkernels.triton import linear_gemm_stats as gs

    return -(-m // gs.BLOCK_N) * -(-n // gs.BLOCK_V)


def plan_gemm_stats(n, v, d, instructions: tuple[int, int] | None = None) -> LinearPlan:
    """The no-grad forward through linear_gemm_stats.py: per row chunk (`rows_per_launch`), one GEMM kernel
    whose epilogue the tensor cores wait for, tile by tile, and the combine kernel reading back the tiles'
    statistics."""
    from rlkernels.triton import linear_gemm_stats as gs

    short, long = instructions if instructions is not None else GEMM_STATS_EPILOGUE_INSTRUCTIONS
    labelled = 1.0 - (1.0 - gs.BLOCK_V / v) ** gs.BLOCK_N  # tiles holding a row's label: the long path
    per_tile = short + labelled * (long - short)
    gemms, serial = [], 0.0
    for r in _slices(n, gs.rows_per_launch(v, 3)):
        gemms.append((r, v, d, "gemm_stats"))
        serial += -(-_gemm_tiles(r, v) // SMS) * per_tile * WARPS_PER_SCHEDULER / SM_CLOCK
    stats = 2 * 3 * -(-v // gs.BLOCK_V) * n * 4  # written by the kernel, read by the combine
    return LinearPlan(gemms, stats, launches=2 * len(gemms), serial_s=serial)


def floor_time(n, v, d, gemm_count: int, model: Model) -> float:
    return gemm_count * 2.0 * n * v * d / model.gemm_flops


# The H200 run's linear_logprobs rows (bf16, trainable head; ms): the Triton flavor at 632af97.
LINEAR_MEASURED = [
    ((8192, 128256, 4096), "full", 73.57),
    ((8192, 128256, 4096), "no_grad", 26.77),
    ((32768, 151936, 4096), "full", 360.6),
    ((32768, 151936, 4096), "no_grad", 115.8),
]


def linear_report(model: Model) -> str:
    lines = [
        "",
        "linear_logprobs, Triton flavor (bf16): the 632af97 path against the H200 run, and today's GPU path",
        "",
        "| N | V | mode | measured ms (632af97) | model ms (632af97 path) | model ms (blocked, statistics "
        "and d logits loops as measured) | model ms (blocked, today) | floor ms | today / floor | "
        "gemm_stats forward ms | / floor | + gemm_dlogits backward ms | / floor | target |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    from rlkernels.triton import linear_blocked as lb

    instructions, dlogits = gemm_stats_instructions(), gemm_dlogits_instructions()
    for (n, v, d), mode, ms in LINEAR_MEASURED:
        old = linear_time(plan_fused_triton(n, v, d, mode), model) * 1e3
        with mock.patch.multiple(lb, EPI_STAGES=1, DLOGITS_TILES=1):  # the epilogues that ran
            measured_loop = linear_time(plan_blocked(n, v, d, mode), model) * 1e3
        new = linear_time(plan_blocked(n, v, d, mode), model) * 1e3
        counted = dict(
            GEMM_STATS_EPILOGUE_INSTRUCTIONS=instructions, GEMM_DLOGITS_EPILOGUE_INSTRUCTIONS=dlogits
        )
        with mock.patch.multiple(sys.modules[__name__], **counted):
            fused = linear_time(plan_blocked(n, v, d, mode, forward="gemm_stats"), model) * 1e3
            both = plan_blocked(n, v, d, mode, forward="gemm_stats", backward="gemm_dlogits")
            both = linear_time(both, model) * 1e3
        gemms, target = (1, 1.05) if mode == "no_grad" else (4, 1.10)
        floor = floor_time(n, v, d, gemms, model) * 1e3
        lines.append(
            f"| {n} | {v} | {mode} | {ms:.1f} | {old:.1f} | {measured_loop:.1f} | {new:.1f} | "
            f"{floor:.1f} ({gemms} GEMM) | {new / floor:.2f} | {fused:.1f} | {fused / floor:.2f} | "
            f"{both:.1f} | {both / floor:.2f} | <= {target} |"
        )
    plan = plan_gemm_stats(8192, 128256, 4096, instructions)
    lines += [
        "",
        "(gemm_stats: the forward as linear_gemm_stats.py's one kernel, its main loop at "
        f"{GEMM_STATS_RATE:.2f}x cuBLAS's rate (an assumption), its epilogue {instructions[0]} / "
        f"{instructions[1]} SASS instructions a thread a tile on its short / long path, "
        f"{plan.serial_s * 1e3:.2f} ms at N=8192 V=128256 that the tensor cores wait; the backward as today; "
        "gemm_dlogits: the backward's recompute as linear_gemm_dlogits.py's kernel, "
        f"{dlogits} instructions a tile, d z written from it)",
    ]
    lines += [
        "",
        f"(today: the statistics epilogue's column loop pipelined, EPI_STAGES={lb.EPI_STAGES}, and the d "
        f"logits epilogue's programs looping over DLOGITS_TILES={lb.DLOGITS_TILES} column tiles alike, "
        f"both priced at {EPI_STAGED_CAP / 1e12:.2f} TB/s, kl_penalty's replay rate: a prediction; the "
        f"measured runs read {EPI_CAPS['stats'] / 1e12:.1f} and {EPI_CAPS['dlogits'] / 1e12:.2f})",
    ]
    lines += [
        "",
        "the blocked path against the second H200 run (0d4bbe5, N=8192 D=4096 V=128256; times over the",
        "GEMM floor measured beside them, 14 % slower than the first run's; the model's is the first's)",
        "",
        "| mode | forward rows | measured ms | measured floor ms | measured / floor | model / floor |",
        "|---|---|---|---|---|---|",
    ]
    for mode, rows, ms, floor_ms in LINEAR_MEASURED_0D4:
        gemms = 1 if mode == "no_grad" else 4
        with mock.patch.multiple(lb, FORWARD_ROWS=rows, EPI_STAGES=1, DLOGITS_TILES=1):
            plan = plan_blocked(8192, 128256, 4096, mode)
        ratio = linear_time(plan, model) / floor_time(8192, 128256, 4096, gemms, model)
        lines.append(f"| {mode} | {rows} | {ms:.2f} | {floor_ms:.2f} | {ms / floor_ms:.2f} | {ratio:.2f} |")
    lines += [
        "",
        "the blocked path against the third H200 run (aad47ba, 8192-row forward blocks; the bench's medians",
        "and the GEMM floor measured beside them; the model's floor is the first run's)",
        "",
        "| N | V | D | mode | measured ms | measured floor ms | measured / floor | model / floor |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for (n, v, d), mode, ms, floor_ms in LINEAR_MEASURED_AAD:
        gemms = 1 if mode == "no_grad" else 4
        with mock.patch.multiple(lb, EPI_STAGES=1, DLOGITS_TILES=1):  # the code that ran
            ratio = linear_time(plan_blocked(n, v, d, mode), model) / floor_time(n, v, d, gemms, model)
        lines.append(
            f"| {n} | {v} | {d} | {mode} | {ms:.2f} | {floor_ms:.2f} | {ms / floor_ms:.2f} | {ratio:.2f} |"
        )
    return "\n".join(lines)


# The second H200 run's blocked-path rows (benchmarks/results/h200/2026-11-26/sweep.log): (mode, forward rows,
# median ms, the GEMM floor's median ms in the same rounds). The epilogue rates (EPI_*) come from the two
# no_grad rows; the full row is the check.
LINEAR_MEASURED_0D4 = [
    ("no_grad", 2048, 19.56, 13.11),
    ("no_grad", 8192, 15.83, 13.11),
    ("full", 2048, 62.48, 51.22),
]


# The third run's (benchmarks/results/h200/2026-11-27/bench-linear.log): ((N, V, D), mode, median ms, the
# floor's median ms in the same rounds).
LINEAR_MEASURED_AAD = [
    ((8192, 128256, 4096), "no_grad", 15.33, 12.87),
    ((8192, 128256, 4096), "full", 58.39, 51.42),
    ((8192, 152064, 3584), "no_grad", 16.44, 13.75),
    ((8192, 152064, 3584), "full", 62.33, 53.20),
]


# linear_policy_loss with a trainable head (issue 27's "<= 1.10x the 3-GEMM floor"). Three GEMMs mean the
# loss's gradient is taken in the forward: per block of R rows, the logits (cuBLAS into an fp32 block), an
# epilogue that finishes the rows' log-probs, loss terms and d z (bf16, in place), then d h = d z W and
# d W += d zᵀ h. The rows' log-sum-exp needs the whole vocabulary before any d z, so the blocks go by rows
# and d W sums over the N / R blocks. Liger's working memory at N=8192 D=4096 V=128256 (the third run):
LIGER_LINEAR_WORKING_MIB = 1191
# The composition that runs today (linear_logprobs' 4 GEMMs, then policy_loss): its working memory there,
# tests/test_linear_blocked.py::test_gpu_working_memory.
COMPOSITION_WORKING_MIB = 1162


def plan_loss_in_forward(n, v, d, rows: int, itemsize: int = 2) -> tuple[LinearPlan, float]:
    """(plan, working MiB) of the 3-GEMM row sweep above with R = `rows`, d W summed in an fp32 [V, D]
    buffer (summing in bf16, as Liger does, rounds d W once a block). Working memory as the GPU tests define
    it: the returned gradients (bf16 d h and d W), the fp32 accumulator, the block's fp32 logits."""
    from rlkernels.triton import linear_blocked as lb

    gemms, epilogues = [], []
    for i, r in enumerate(_slices(n, rows)):
        gemms += [
            (r, v, d, "cublas"),
            (r, d, v, "cublas"),
            (v, d, r, "cublas", 2 * v * d * 4 if i else v * d * 4),  # d W's fp32 sum read and written
        ]
        epilogues.append((r * v * (4 + itemsize), -(-r // lb.EPI_ROWS), "dlogits"))  # as the blocked path's
    working = n * d * itemsize + v * d * (itemsize + 4) + rows * v * 4
    launches = 4 * len(epilogues) + 1  # a block's 3 GEMMs and epilogue; d W's fp32 sum cast at the end
    plan = LinearPlan(
        gemms, v * d * (4 + itemsize), launches, epilogues, lb.EPI_STAGES, dlogits_stages=lb.EPI_STAGES
    )
    return plan, working / 2**20


def loss_in_forward_report(model: Model, n: int = 8192, v: int = 128256, d: int = 4096) -> str:
    """The 3-GEMM row sweep's time over the 3-GEMM floor and its working memory, by rows per block."""
    floor = floor_time(n, v, d, 3, model)
    lines = [
        "",
        f"linear_policy_loss, trainable head, with the loss's gradient in the forward (3 GEMMs), N={n} D={d} "
        f"V={v} bf16: the rows per block trade d W's fp32 round trips against the block's memory",
        "",
        "| rows per block | model / 3-GEMM floor | working MiB | / Liger's |",
        "|---|---|---|---|",
    ]
    for rows in (512, 1024, 2048, 4096, 8192):
        plan, mib = plan_loss_in_forward(n, v, d, rows)
        ratio = linear_time(plan, model) / floor
        lines.append(f"| {rows} | {ratio:.2f} | {mib:.0f} | {mib / LIGER_LINEAR_WORKING_MIB:.1f} |")
    today = linear_time(plan_blocked(n, v, d, "full"), model) / floor
    lines += [
        f"| composition (today: 4 GEMMs) | {today:.2f} | {COMPOSITION_WORKING_MIB} | "
        f"{COMPOSITION_WORKING_MIB / LIGER_LINEAR_WORKING_MIB:.1f} |",
        "",
        "(the fp32 sum of d W alone is 4·V·D bytes, 1.7x Liger's whole working memory here; without it d W",
        "sums in bf16, rounded once a block)",
    ]
    return "\n".join(lines)


# linear_logprobs with a frozen head (LoRA; ops/frozen_head.py): the row sweep, 2 GEMMs a block of R rows (the
# fp32 logits, then d z W split-K), the logits kernels between them. The third run's kernel trace of it
# (benchmarks/results/h200/2026-11-27/kernel-times-linear.log, N=8192 D=4096 V=128256 bf16, aad47ba; us a
# call, 3 calls): the GEMMs and split-K reduces, the logits forward and backward kernels (their row loops
# not yet pipelined; the backward wrote fp32 d z), the bf16 copies of each d z block, the index kernels of
# the nonzero() row selection, the rest, and the GPU's idle time; the bench's median beside it and its
# 2-GEMM floor (bench-linear.log).
FROZEN_TRACE_AAD = {
    "gemms": 12561.3 + 10930.7 + 502.0 + 177.1,
    "forward": 1756.7,
    "backward": 2432.2,
    "copies": 1513.5,
    "index": 188.4,
    "busy": 30389.2,
    "idle": 3015.0,
}
FROZEN_BENCH_AAD_MS, FROZEN_FLOOR_AAD_MS = 33.36, 26.51
# Liger-Kernel 0.8.5's frozen head there: peak MiB above the inputs, and less its outputs (bench-linear.log).
LIGER_FROZEN_MIB = (189, 125)
# The GPU's idle time a kernel where the call makes no host sync: the trainable head's trace beside it
# (1697.8 us idle over 718 kernels a call).
IDLE_PER_KERNEL = 1697.8e-6 / 718


def _frozen_cost(n: int, v: int, d: int, stream: bool):
    """gpu_cost.py's count of the Triton flavor's frozen head (bf16, fake CUDA tensors, forward + backward):
    the vocabulary stream (ops/logp_jacobian.py) or the row sweep it replaced (stream=False)."""
    import gpu_cost
    import torch

    import rlkernels as rk
    from rlkernels.ops import logp_jacobian

    def make(mode):
        cuda = torch.device("cuda")
        with mode:
            return dict(
                hidden=torch.empty(n, d, dtype=torch.bfloat16, device=cuda).requires_grad_(),
                weight=torch.empty(v, d, dtype=torch.bfloat16, device=cuda),
                labels=torch.empty(n, dtype=torch.int64, device=cuda),
            )

    saved, logp_jacobian.GPU_STREAM = logp_jacobian.GPU_STREAM, stream
    try:
        return gpu_cost.count(lambda **x: rk.linear_logprobs(**x, backend="triton"), make)
    finally:
        logp_jacobian.GPU_STREAM = saved


def frozen_head_paths(n: int = 8192, v: int = 128256, d: int = 4096):
    """(cost, [(path, seconds)]): the row sweep (the frozen head's path until 2026-11-29) from the third run's
    trace at its shape: the GEMMs as traced (the same cuBLAS calls), the logits kernels' bytes counted on fake
    CUDA tensors (gpu_cost.py) at their traced rates or pipelined (EPI_STAGED_CAP), the copies and index
    kernels gone, the idle either as traced or at the sync-free path's rate a kernel. The last path is its
    prediction."""
    cost = _frozen_cost(n, v, d, stream=False)
    fwd_b, bwd_b = cost.bytes_of("_logits_forward_kernel"), cost.bytes_of("_logits_backward_kernel")
    t = {k: x * 1e-6 for k, x in FROZEN_TRACE_AAD.items()}
    other = t["busy"] - sum(t[k] for k in ("gemms", "forward", "backward", "copies", "index"))
    traced_fwd_rate, traced_bwd_rate = 4 * n * v / t["forward"], 8 * n * v / t["backward"]

    def total(fwd_rate, bwd_rate, idle):
        return t["gemms"] + fwd_b / fwd_rate + bwd_b / bwd_rate + other + idle

    rows = [
        ("traced (aad47ba)", t["busy"] + t["idle"]),
        (
            "row sweep, kernels at their traced rates, idle as traced",
            total(traced_fwd_rate, traced_bwd_rate, t["idle"]),
        ),
        (
            "row sweep, kernels at their traced rates, no sync",
            total(traced_fwd_rate, traced_bwd_rate, len(cost.launches) * IDLE_PER_KERNEL),
        ),
        # the backward writes d z over its logits behind a barrier a tile, which keeps Triton's pipeliner
        # out of its loop: its traced (unpipelined) rate
        (
            f"row sweep, the forward kernel pipelined ({EPI_STAGED_CAP / 1e12:.2f} TB/s), no sync",
            total(EPI_STAGED_CAP, traced_bwd_rate, len(cost.launches) * IDLE_PER_KERNEL),
        ),
    ]
    return cost, rows


def frozen_stream_time(model: Model, n: int = 8192, v: int = 128256, d: int = 4096):
    """(cost, seconds, {part: seconds}): the frozen head's vocabulary stream (ops/logp_jacobian.py,
    rlkernels/triton/logp_jacobian.py) priced from its launches on fake CUDA tensors. Its bytes are counted
    here from the blocks, not from gpu_cost's storage sizes (a launch's whole buffers, and the whole head
    for the finish's R rows of it):

    - the GEMMs: the same FLOPs as the row sweep's, at the rate the third run traced for those (512-row
      blocks, the same output tiles for GEMM 2; GEMM 1 a chunk's columns instead of the vocabulary's);
    - the chunk kernel: the fp32 logits read and e written in bf16, 6 bytes a logit, at the pipelined
      streaming rate (EPI_STAGED_CAP); its second pass re-reads a row that the first read microseconds
      before, from L2 (not counted), and A's rescale (a row only when its max grows by e^8) is not counted;
    - A [R, D] fp32 read and written by each GEMM 2 (cuBLAS's beta = 1), not overlapped with its FLOPs (an
      upper bound), and zeroed once a block;
    - the finish (A, W's label rows and the bf16 Jacobian: 8 bytes an element of [N, D]) and the backward's
      product (the Jacobian read, d hidden written: 4), at the HBM rate;
    - the GPU idle IDLE_PER_KERNEL a launch (no host sync: the sync-free trainable path's trace)."""
    from rlkernels.ops import logp_jacobian

    cost = _frozen_cost(n, v, d, stream=True)
    rows, columns = logp_jacobian.gpu_blocks(n, v, d, 2, 2)
    chunks = -(-n // rows) * -(-v // columns)
    t = {k: x * 1e-6 for k, x in FROZEN_TRACE_AAD.items()}
    hbm = model.hbm * model.stream_efficiency
    parts = {
        "GEMMs": t["gemms"] * cost.flops / (4.0 * 8192 * 128256 * 4096),
        "chunk kernel": 6.0 * n * v / EPI_STAGED_CAP,
        "A in GEMM 2": (chunks * rows * d * 8.0 + n * d * 4.0) / hbm,
        "finish, backward": n * d * 12.0 / hbm,
        "idle": len(cost.launches) * IDLE_PER_KERNEL,
    }
    return cost, sum(parts.values()), parts


def measure_linear_policy_loss_host(rounds: int = 3) -> dict:
    """benchmarks/linear_policy_loss_host.py's units (a block's loss gradient per flavor; the host work from
    the nonzero() sync to the first GEMM), in a child process (the interpreter's environment)."""
    here = os.path.dirname(os.path.abspath(__file__))
    script = os.path.join(here, "linear_policy_loss_host.py")
    cmd = [sys.executable, script, "--json", "--rounds", str(rounds)]
    return json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.splitlines()[-1])


# linear_policy_loss's own host work in control units, measured on this machine on 2026-11-30
# (benchmarks/results/host_time.md): a block's loss gradient per flavor, and from its sync to its first GEMM.
LINEAR_POLICY_LOSS_UNITS = {"block_loss_triton": 1.37, "block_loss_cpu": 0.83, "sync_to_gemm": 3.85}


def frozen_loss_cost(n: int, v: int, d: int, backend: str = "triton"):
    """gpu_cost.py's count of linear_policy_loss with a frozen head (bf16, fake CUDA tensors, forward +
    backward, 16 rows of n / 16 tokens, every token kept: no row gather)."""
    import gpu_cost
    import torch

    import rlkernels as rk

    b, t = 16, n // 16

    def make(mode):
        cuda = torch.device("cuda")
        with mode:
            return dict(
                hidden=torch.empty(b, t, d, dtype=torch.bfloat16, device=cuda).requires_grad_(),
                weight=torch.empty(v, d, dtype=torch.bfloat16, device=cuda),
                labels=torch.empty(b, t, dtype=torch.int64, device=cuda),
                old_logp=torch.empty(b, t, device=cuda),
                advantages=torch.empty(b, device=cuda),
                mask=torch.ones(b, t, dtype=torch.bool, device=cuda),
            )

    return gpu_cost.count(lambda **x: rk.linear_policy_loss(**x, backend=backend)[0], make)


def frozen_loss_time(
    model: Model, n: int = 8192, v: int = 128256, d: int = 4096, loss_units: dict = LINEAR_POLICY_LOSS_UNITS
):
    """(cost, seconds, {part: seconds}): linear_policy_loss with a frozen head, the vocabulary stream of
    frozen_stream_time with the loss's gradient formed in the forward (ops/linear_policy_loss.py): per
    block, the Jacobian rows in fp32 (the finish writes 4 bytes an element where it wrote 2), their product
    with d loss / d logp (4 read, 2 written), and the backward's scaling in place (2 read, 2 written), where
    linear_logprobs' backward read the Jacobian and wrote d hidden (4): 8 bytes more an element of [N, D];
    and the per-block policy loss's launches, each priced at the idle between kernels (their kernels read a
    block's [R] vectors); and the GPU's idle after the nonzero() host sync that leaves masked tokens out of
    the GEMMs: the GPU drains its queue there, and waits while the host runs from the sync to the first GEMM
    (`loss_units["sync_to_gemm"]`, linear_policy_loss_host.py)."""
    stream_cost, stream_s, parts = frozen_stream_time(model, n, v, d)
    cost = frozen_loss_cost(n, v, d)
    hbm = model.hbm * model.stream_efficiency
    parts = dict(parts)
    parts["loss: d hidden bytes"] = n * d * 8.0 / hbm
    parts["loss: launches"] = (len(cost.launches) - len(stream_cost.launches)) * IDLE_PER_KERNEL
    parts["loss: idle after the sync"] = len(cost.syncs) * model.unit * loss_units["sync_to_gemm"]
    return cost, sum(parts.values()), parts


# The frozen head's token counts whose host work frozen_host_report weighs against the GPU's (D=4096,
# V=128256): a LoRA micro-batch's from 1k to 32k tokens.
FROZEN_HOST_TOKENS = (1024, 2048, 4096, 8192, 32768)


def measure_frozen_chunk_host(rounds: int = 3) -> dict:
    """benchmarks/frozen_chunk_host.py's units (a chunk's Python, directly and through the dispatcher; the
    call's fixed part), and Triton's launch path a launch of the frozen head's kernels (gpu_host_time.py
    `--triton-run frozen_chunk`) in units, each in a child process (the interpreter's environment)."""
    here = os.path.dirname(os.path.abspath(__file__))
    cmd = [sys.executable, os.path.join(here, "frozen_chunk_host.py"), "--json", "--rounds", str(rounds)]
    units = json.loads(
        subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.splitlines()[-1]
    )
    sys.path.insert(0, here)
    import gpu_host_time

    run = gpu_host_time.triton_run_child("frozen_chunk", rounds)
    units["triton_run"] = run["us"] / run["launches"] / units["control"]
    return units


# A frozen-head chunk's host work in control units, and its call's fixed part, measured on this machine on
# 2026-11-30 (benchmarks/results/host_time.md): what linear_blocked_sweep.py prints its model from on a GPU
# (frozen_host_report measures them anew).
FROZEN_CHUNK_UNITS = {"direct": 0.61, "dispatcher": 0.96, "fixed": 5.0, "triton_run": 0.32}


def frozen_host_time(model: Model, units: dict, n: int, v: int, d: int, way: str = "direct") -> float:
    """Seconds the host takes to issue the Triton flavor's frozen-head stream, forward + backward: each chunk
    its Python (`units[way]`: "direct" or "dispatcher"), Triton's launch path for the chunk kernel and three
    kernels' launches; each block about a chunk more (a clone, a zero, the finish); the call's fixed part."""
    from rlkernels.ops import logp_jacobian

    rows, columns = logp_jacobian.gpu_blocks(n, v, d, 2, 2)
    blocks, chunks = -(-n // rows), -(-v // columns)
    launch = model.unit * (units[way] + units["triton_run"]) + 3 * model.launch + model.triton_launch
    return model.unit * units["fixed"] + blocks * (chunks + 1) * launch


def frozen_small_time(model: Model, n: int, v: int, d: int, units: dict = FROZEN_CHUNK_UNITS, way="direct"):
    """The frozen head's stream as the call takes it: the larger of the GPU's time (frozen_stream_time) and
    the host's (frozen_host_time), since the host issues every launch before the GPU can run it."""
    return max(frozen_stream_time(model, n, v, d)[1], frozen_host_time(model, units, n, v, d, way))


def frozen_host_report(model: Model, units: dict, v: int = 128256, d: int = 4096) -> str:
    """The Triton flavor's frozen-head stream at several token counts: the GPU's time against the host's
    (frozen_host_time, from `units` measured now). Beside today's chunks, those of 2026-11-29, sized to d
    hidden's bytes alone (no GPU_MIN_BUDGET) and issued through the dispatcher."""
    from rlkernels.ops import logp_jacobian

    floor_per_token = FROZEN_FLOOR_AAD_MS * 1e-3 / 8192
    lines = [
        "",
        f"The frozen head's stream, Triton flavor, D={d} V={v} bf16, fwd+bwd: the host's issue time against",
        f"the GPU's (a chunk's Python {units['direct']:.2f} units, {units['dispatcher']:.2f} through the "
        f"dispatcher; Triton's launch path {units['triton_run']:.2f}; fixed {units['fixed']:.2f}); ms, and",
        "the model's over the 2-GEMM floor",
        "",
        "| N | chunk | chunks | GPU | host | model | / floor "
        "| 2026-11-29: chunk | GPU | host | model | / floor |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for n in FROZEN_HOST_TOKENS:
        cells = []
        for budget, way in ((logp_jacobian.GPU_MIN_BUDGET, "direct"), (0, "dispatcher")):
            with mock.patch.object(logp_jacobian, "GPU_MIN_BUDGET", budget):
                rows, columns = logp_jacobian.gpu_blocks(n, v, d, 2, 2)
                gpu = frozen_stream_time(model, n, v, d)[1]
                host = frozen_host_time(model, units, n, v, d, way)
            total = max(gpu, host)
            cells.append(f"{rows} x {columns}")
            if budget:
                cells.append(str(-(-n // rows) * -(-v // columns)))
            cells += [f"{x * 1e3:.2f}" for x in (gpu, host, total)]
            cells.append(f"{total / (floor_per_token * n):.2f}")
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def frozen_head_report(
    model: Model, n: int = 8192, v: int = 128256, d: int = 4096, units=None,
    loss_units: dict = LINEAR_POLICY_LOSS_UNITS,
) -> str:  # fmt: skip
    """The vocabulary stream and the row sweep over the floor measured beside the trace, with their memory;
    with `units` (measure_frozen_chunk_host's), linear_policy_loss's host time beside its GPU time, its own
    host work from `loss_units` (measure_linear_policy_loss_host's)."""
    from rlkernels.ops import logp_jacobian

    cost, rows = frozen_head_paths(n, v, d)
    fwd_b, bwd_b = cost.bytes_of("_logits_forward_kernel"), cost.bytes_of("_logits_backward_kernel")
    stream_cost, stream_s, parts = frozen_stream_time(model, n, v, d)
    r, c = logp_jacobian.gpu_blocks(n, v, d, 2, 2)
    floor = FROZEN_FLOOR_AAD_MS * 1e-3
    lines = [
        "",
        f"linear_logprobs with a frozen head, N={n} D={d} V={v} bf16, fwd+bwd, over the 2-GEMM floor",
        f"measured beside the third run's trace ({FROZEN_FLOOR_AAD_MS} ms).",
        f"The row sweep: {len(cost.launches)} launches, logits kernels "
        f"{fwd_b / 1e9:.1f} + {bwd_b / 1e9:.1f} GB,",
        f"no host sync: {not cost.syncs}. The vocabulary stream: {r}-row blocks, {c}-column chunks,",
        f"{len(stream_cost.launches)} launches, no host sync: {not stream_cost.syncs}.",
        "",
        "| path | model ms | / floor | working MiB | / Liger's |",
        "|---|---|---|---|---|",
        f"| measured (bench, aad47ba: the row sweep with a host sync) | {FROZEN_BENCH_AAD_MS:.2f} | "
        f"{FROZEN_BENCH_AAD_MS * 1e-3 / floor:.2f} | | |",
    ]
    mib = cost.peak_bytes / 2**20
    lines += [
        f"| {name} | {s * 1e3:.2f} | {s / floor:.2f} | {mib:.0f} | {mib / LIGER_FROZEN_MIB[0]:.1f} |"
        for name, s in rows[1:]
    ]
    mib = stream_cost.peak_bytes / 2**20
    lines += [
        f"| **vocabulary stream (today)** | {stream_s * 1e3:.2f} | {stream_s / floor:.2f} | {mib:.0f} | "
        f"{mib / LIGER_FROZEN_MIB[0]:.1f} |",
        "",
        "the stream's parts (ms): " + ", ".join(f"{k} {x * 1e3:.2f}" for k, x in parts.items()),
        "",
    ]
    loss_cost, loss_s, loss_parts = frozen_loss_time(model, n, v, d, loss_units)
    mib = loss_cost.peak_bytes / 2**20
    extra = {k: x for k, x in loss_parts.items() if k.startswith("loss")}
    lines += [
        f"linear_policy_loss with a frozen head (16 rows of {n // 16} tokens, every token kept), over",
        f"the same floor: {loss_s * 1e3:.2f} ms, {loss_s / floor:.2f}x; {len(loss_cost.launches)} launches, "
        f"host syncs {loss_cost.syncs}; working {mib:.0f} MiB ({mib / LIGER_FROZEN_MIB[0]:.1f} "
        "of Liger's linear cross-entropy); beyond the stream (ms): "
        + ", ".join(f"{k} {x * 1e3:.2f}" for k, x in extra.items()),
    ]
    if units is not None:  # the host: the stream's, and a block's d loss / d logp (one forward launch)
        blocks = -(-n // r)
        stream_host = frozen_host_time(model, units, n, v, d)
        loss_host = {
            flavor: blocks * (model.unit * loss_units[key] + model.launch + triton)
            for flavor, key, triton in (
                ("CUDA C++", "block_loss_cpu", 0.0),
                ("Triton", "block_loss_triton", model.unit * units["triton_run"] + model.triton_launch),
            )
        }  # fmt: skip
        totals = ", ".join(f"the {k} loss {(stream_host + x) * 1e3:.2f} ms" for k, x in loss_host.items())
        lines.append(
            f"its host: the stream's {stream_host * 1e3:.2f} ms, a loss gradient a block ({blocks} blocks): "
            f"with {totals} (backend='auto' takes the CUDA C++ loss), against the GPU's {loss_s * 1e3:.2f}"
        )
    lines += [
        "",
        "working memory: fake CUDA peak above the inputs, returned d hidden included; Liger's measured "
        f"{LIGER_FROZEN_MIB[0]} MiB ({LIGER_FROZEN_MIB[1]} less its outputs)",
    ]
    return "\n".join(lines)


# The token-level targets of issue 28 at the bench's LLM shapes (fp32, forward + backward): milliseconds.
TOKEN_TARGETS = {("policy_loss", "B=512 T=8192"): 0.055}


def measure_host_units(rounds: int = 5) -> tuple[float, dict]:
    """Today's host work in control units: (the floor of a Python-level autograd op, {(case, provider):
    units}), by gpu_host_time.py in a child process (it runs the Triton flavor under the interpreter with
    its launches stubbed)."""
    here = os.path.dirname(os.path.abspath(__file__))
    cmd = [sys.executable, os.path.join(here, "gpu_host_time.py"), "--json", "--rounds", str(rounds)]
    cmd += ["--cases", "policy_loss", "kl_penalty", "kl_penalty_k1+"]
    cmd += ["--providers", "eager", "triton", "cpu", "compile"]
    result = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
    control = result.pop("control")
    floor = result.pop("floor") / control
    return floor, {
        (case, provider): (parts["python"] + parts["triton_run"]) / control
        for case, providers in result.items()
        for provider, parts in providers.items()
    }


# torch.compile of the eager reference on the H200 (min ms; ../shared/gpu/ bench-elementwise.log), the rows
# the fit never saw: (op, case of gpu_host_time.py, shape, measured ms, bytes its kernels move at least).
COMPILE_MEASURED = [
    ("policy_loss", "policy_loss", "B=64 T=4096", 0.393, 34.0 * _P_SMALL),
    ("policy_loss", "policy_loss", "B=512 T=8192", 0.624, 34.0 * _P_LARGE),
    ("kl_penalty", "kl_penalty", "N=4194304 k3", 0.210, 28.0 * 4194304),
    ("kl_penalty", "kl_penalty_k1+", "N=4194304 k1+", 0.177, 28.0 * 4194304),
]


def compile_check(model: Model, units: dict) -> str:
    """The model on torch.compile's rows, outside its fit: their host work measured now (the compiled
    reference on CPU tensors: the same guards, AOTAutograd wrappers and dispatch), their kernels counted
    from 2 (a fused forward and backward) to 6, the bytes those kernels must move."""
    lines = [
        "",
        "torch.compile rows of the H200 run, which the fit never saw (host work measured now):",
        "",
        "| op | shape | measured ms | host units | model ms (2 - 6 kernels) |",
        "|---|---|---|---|---|",
    ]
    for op, case, shape, ms, nbytes in COMPILE_MEASURED:
        u = units[case, "compile"]
        low, high = (model.time(u, Counts(triton_kernels=k, bytes=nbytes)) * 1e3 for k in (2, 6))
        lines.append(f"| {op} | {shape} | {ms:.3f} | {u:.2f} | {low:.3f} - {high:.3f} |")
    return "\n".join(lines)


def token_predictions(model: Model, floor: float, units: dict) -> str:
    """Today's code through the model: its host work in control units (`units`, measure_host_units), its
    launches and bytes counted by gpu_cost.py on fake CUDA tensors at the bench's shapes."""
    import gpu_cost
    import torch

    import rlkernels as rk
    from rlkernels.fake_cuda import Maker

    kw = dict(clip_low=0.2, clip_high=0.28, dual_clip=3.0, kl_coef=0.05, kl_kind="k3", entropy_coef=0.01)

    def policy_inputs(b, t):
        def make(mode):
            m = Maker(torch.device("cuda"), mode)
            x = dict(logp=m.logp(b, t, grad=True), old_logp=m.logp(b, t), advantages=m.randn(b))
            return dict(x, mask=m.mask(b, t), ref_logp=m.logp(b, t), entropy=m.randn(b, t, grad=True))

        return make

    def kl_inputs(n):
        def make(mode):
            m = Maker(torch.device("cuda"), mode)
            return dict(logp=m.logp(n, grad=True), ref_logp=m.logp(n))

        return make

    cases = []
    for b, t in ((64, 4096), (512, 8192)):
        call = lambda backend: lambda **x: rk.policy_loss(**x, **kw, backend=backend)  # noqa: E731
        cases.append(("policy_loss", f"B={b} T={t}", call, policy_inputs(b, t)))
    for n in (4194304, 16777216):
        call = lambda backend: lambda **x: rk.kl_penalty(x["logp"], x["ref_logp"], "k3", backend=backend)  # noqa: E731
        cases.append(("kl_penalty", f"N={n} k3", call, kl_inputs(n)))
    lines = [
        "",
        "token-level ops today (fp32, forward + backward): host units measured now (gpu_host_time.py; the",
        "CUDA C++ flavor's from the C++ CPU flavor), launches and bytes counted on fake CUDA tensors",
        "(gpu_cost.py).",
        "",
        "| op | shape | flavor | kernels | bytes MB | host units | model host ms | model device ms "
        "| model ms | target ms |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for op, shape, call, make in cases:
        for flavor, measured_as in (("triton", "triton"), ("cuda", "cpu")):
            cost = gpu_cost.count(call(flavor), make)
            c = cost.model_counts()
            u = units[op, measured_as]
            target = TOKEN_TARGETS.get((op, shape))
            lines.append(
                f"| {op} | {shape} | {flavor} | {cost.kernels()} | {c.bytes / 1e6:.0f} | {u:.2f} | "
                f"{model.host_time(u, c) * 1e3:.3f} | {model.device_time(c) * 1e3:.3f} | "
                f"{model.time(u, c) * 1e3:.3f} | {target or '-'} |"
            )
    least = model.time(floor, Counts(triton_kernels=3))
    lines += [
        "",
        f"The floor of any Python-level op (gpu_host_time.py `_floor`: a torch.autograd.Function that does "
        f"nothing, {floor:.2f} units)",
        f"with 3 kernels, forward + backward: {least * 1e3:.3f} ms.",
    ]
    return "\n".join(lines)


# group_advantages with ids at B=65536 on the H200 (2026-11-26 run, first call of the run, 3 launches: the
# sort, the walk, the assert): CUDA C++ 0.64 ms, Triton 0.81. The walk is one program / block stepping through
# 1024-reward chunks twice (statistics, then advantages), each step a chain of dependent loads and a
# block-wide scan; nothing else in the call is more than a few launches' time.
SORTED_WALK_MEASURED = {"cuda": 0.64e-3, "triton": 0.81e-3}
SORTED_WALK_B = 65536
SORTED_CHUNK = 1024


def walk_step(model: Model, flavor: str) -> tuple[float, float, float]:
    """(a Python-level launch of the flavor's kernel, the measured row's host time: the sort, the walk and
    the assert, a walk's chunk step: the rest of the row over its 2 walks of B / 1024 chunks), seconds."""
    launch = model.launch + (model.triton_launch if flavor == "triton" else 0.0)
    host = 2 * model.launch + launch
    return launch, host, (SORTED_WALK_MEASURED[flavor] - host) / (2 * (SORTED_WALK_B // SORTED_CHUNK))


def sorted_path_report(model: Model) -> str:
    """The walk's time per chunk step from the measured rows, and the chunk-parallel path priced in those
    steps: a program per chunk (one step each, one wave while the chunks fit the SMs), the last program's
    scan of the chunk totals (a step per 1024 chunks) and the writing pass (a step), plus the launches' host
    cost (the sort's kernels and the assert as before, one launch more)."""
    chunks = SORTED_WALK_B // SORTED_CHUNK
    lines = [
        "",
        f"group_advantages, ids, B={SORTED_WALK_B} (first-call rows): the walk's step, the chunk path",
        "",
        "| flavor | walk measured ms | host ms | walk step us | chunk path device us | chunk path ms |",
        "|---|---|---|---|---|---|",
    ]
    for flavor, measured in SORTED_WALK_MEASURED.items():
        walk_launch, host, step = walk_step(model, flavor)
        waves = -(-chunks // SMS)
        device = step * (waves + -(-chunks // SORTED_CHUNK) + 1) + 2 * model.kernel_floor
        path = max(host + walk_launch, device) + model.kernel_floor
        lines.append(
            f"| {flavor} | {measured * 1e3:.2f} | {host * 1e3:.3f} | {step * 1e6:.2f} | {device * 1e6:.1f} | "
            f"{path * 1e3:.3f} |"
        )
    lines += [
        "",
        "The step is an upper bound (a first call's row), so the chunk path's prediction is too: a few",
        "launches' time where the walk took 0.6-0.8 ms; no GPU has run it.",
        "",
        "The sorted kernels of the estimators, walk against chunk path (the kernels only: the sort, the",
        "tokens and the assert are the same on both), each chunk launch priced as a walk step per wave of",
        "programs (+ a step for a last program's scan), host = its launches:",
        "",
        "| op | B | flavor | walk chunk steps | walk ms | chunk launches | chunk ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for flavor in SORTED_WALK_MEASURED:
        launch, _, step = walk_step(model, flavor)
        for b in (8192, SORTED_WALK_B):
            n_chunks = -(-b // SORTED_CHUNK)
            waves = -(-n_chunks // SMS)
            for op, walks, scans, passes in SORTED_OPS:
                walk = walks * n_chunks * step + model.kernel_floor
                walk = max(launch, walk)
                device = (scans * (waves + 1) + passes * waves) * step
                chunk = max((scans + passes) * launch, device) + model.kernel_floor
                lines.append(
                    f"| {op} | {b} | {flavor} | {walks * n_chunks} | {walk * 1e3:.3f} | {scans + passes} | "
                    f"{chunk * 1e3:.3f} |"
                )
    return "\n".join(lines)


# (op, walks over the chunks on the walk path, scan launches and plain pass launches on the chunk path):
# group_advantages (statistics, advantages); gdpo with two keys (two per key); TRL's normalize_then_sum with
# two functions (two per function, then the batch's moments and the normalized sums); grpo_passk (the heads,
# three passes); opo (the heads, two passes). A chunk path's scan launch has a last program's scan.
SORTED_OPS = (
    ("group_advantages", 2, 1, 1),
    ("gdpo, 2 keys", 4, 2, 2),
    ("normalize_then_sum, 2 functions", 6, 2, 3),
    ("grpo_passk", 4, 0, 4),
    ("opo", 3, 0, 3),
)


def main() -> int:
    rows = calibration_rows()
    model = fit(rows)
    print(report(model, rows))
    print(replay_report(model, rows))
    print(finish_report())
    print(cuda_policy_report())
    print(persistent_policy_report())
    print(issue_report())
    floor, units = measure_host_units()
    print(compile_check(model, units))
    print(token_predictions(model, floor, units))
    print(linear_report(model))
    print(cuda_linear_report(model))
    print(loss_in_forward_report(model))
    chunk_units = measure_frozen_chunk_host()
    print(frozen_head_report(model, units=chunk_units, loss_units=measure_linear_policy_loss_host()))
    print(frozen_host_report(model, chunk_units))
    print(sorted_path_report(model))
    return 0


if __name__ == "__main__":
    sys.exit(main())
