"""Where a bench run's files go, and the record of how they were made. By default every run gets a fresh
directory `bench-runs/<date>-<time>/` (gitignored) next to `benchmarks/`, so that rerunning the bench never
overwrites the committed reference results in `benchmarks/results/`; each run directory gets a `run.md`
with the command, the date, the machine, the software and how loaded and noisy the machine was."""

from __future__ import annotations

import datetime
import os
import pathlib
import platform
import subprocess
import time
from collections.abc import Sequence

import torch
from neighbors import NeighborMeter
from noise import NOISY_NEIGHBOR_CPUS

ROOT = pathlib.Path(__file__).resolve().parents[1]
RUNS_DIR = ROOT / "bench-runs"
REFERENCE_DIR = ROOT / "benchmarks" / "results"
# Seconds of metering before a run: /proc/stat counts in 10 ms ticks, so half a second resolves a tenth of
# a CPU on a small machine.
BUSY_CHECK_S = 0.5


def new_run_dir(runs_dir: pathlib.Path | None = None, now: datetime.datetime | None = None) -> pathlib.Path:
    """A directory that did not exist: runs_dir (default RUNS_DIR)/<YYYYmmdd-HHMMSS>[-k]."""
    runs_dir = RUNS_DIR if runs_dir is None else runs_dir
    stamp = (now or datetime.datetime.now()).strftime("%Y%m%d-%H%M%S")
    for k in range(1, 1000):
        path = runs_dir / (stamp if k == 1 else f"{stamp}-{k}")
        try:
            path.mkdir(parents=True)
            return path
        except FileExistsError:
            continue
    raise RuntimeError(f"no free run directory under {runs_dir} for {stamp}")


def cpu_model() -> str:
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load_average() -> str:
    try:
        return " / ".join(f"{x:.2f}" for x in os.getloadavg()) + " (1 / 5 / 15 min)"
    except OSError:
        return "unknown"


def busy_warning() -> str | None:
    """A line to print before timing when other processes are using CPUs right now (metered for BUSY_CHECK_S;
    the load average lags by minutes and counts waiting tasks too)."""
    with NeighborMeter() as meter:
        time.sleep(BUSY_CHECK_S)
    if meter.cpus is None or meter.cpus <= NOISY_NEIGHBOR_CPUS:
        return None
    return (
        f"note: other processes are using {meter.cpus:.1f} of {os.cpu_count()} CPUs: expect NOISY rows "
        "(the table flags them and prints the command to rerun them)"
    )


def _git_commit(out_dir: pathlib.Path) -> str:
    """The checkout's commit, and whether tracked files other than this run's outputs were modified."""
    out_dir = out_dir.resolve()
    outputs = [f":(exclude){out_dir}"] if out_dir.is_relative_to(ROOT) else []
    try:
        head = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        dirty = subprocess.run(
            [
                "git",
                "-C",
                str(ROOT),
                "status",
                "--porcelain",
                "--untracked-files=no",
                "--",
                str(ROOT),
                *outputs,
            ],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    if head.returncode != 0 or dirty.returncode != 0:
        return "unknown"
    return head.stdout.strip() + (" (with uncommitted changes)" if dirty.stdout.strip() else "")


def machine_lines(device: torch.device, out_dir: pathlib.Path) -> list[str]:
    import rlkernels

    lines = [
        f"- machine: {cpu_model()}, {os.cpu_count()} logical CPUs, {platform.system()} {platform.release()}",
    ]
    if device.type == "cuda":
        lines.append(f"- GPU: {torch.cuda.get_device_name(device)}")
    omp_wait = os.environ.get("OMP_WAIT_POLICY", "(unset)")
    lines.append(
        f"- software: rlkernels {rlkernels.__version__} (git {_git_commit(out_dir)}), "
        f"torch {torch.__version__}, Python {platform.python_version()}, "
        f"{torch.get_num_threads()} torch threads, OMP_WAIT_POLICY={omp_wait}"
    )
    return lines


def write_run_record(
    path: pathlib.Path,
    *,
    command: str,
    device: torch.device,
    started: datetime.datetime,
    seconds: float,
    load_before: str,
    rounds: int,
    summary: str,
    files: Sequence[str],
) -> None:
    text = [
        "# rlkernels bench run",
        "",
        f"- command: `{command}`",
        f"- date: {started.strftime('%Y-%m-%d %H:%M:%S')} (local time), {seconds:.0f} s",
        *machine_lines(device, path.parent),
        f"- timing: {rounds} interleaved rounds per comparison",
        f"- load average before: {load_before}; after: {load_average()}",
        f"- files: {', '.join(files)}",
        "",
        summary,
        "",
    ]
    path.write_text("\n".join(text))
