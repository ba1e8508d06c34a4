"""Per-step measurement and logging: peak memory of a step, a tqdm bar, a log line, a JSONL file.

Peak memory per step: on CUDA the caching allocator's peak (`max_memory_allocated`, reset before the
step); on CPU the process's peak resident set (Linux VmHWM, reset through /proc/self/clear_refs), which
counts everything the process touched, tensors and the rest.
"""

from __future__ import annotations

import json
import pathlib
import re
import sys
import time

import torch

# The log line's columns, in order (a key a trainer does not report is left out).
LINE_KEYS = ("reward", "accuracy", "eval_accuracy", "kl", "clipfrac", "entropy", "loss", "tokens_per_s",
             "peak_mib")  # fmt: skip


def _cpu_hwm_mib() -> float | None:
    try:
        with open("/proc/self/status") as f:
            match = re.search(r"VmHWM:\s+(\d+) kB", f.read())
        return None if match is None else int(match.group(1)) / 1024
    except OSError:
        return None


def _reset_cpu_hwm() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


class StepMeter:
    """`with meter: ...` times a step and measures its peak memory (MiB): meter.seconds, meter.peak_mib
    (None where the platform cannot tell)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.seconds = 0.0
        self.peak_mib = None

    def __enter__(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            _reset_cpu_hwm()
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak_mib = torch.cuda.max_memory_allocated(self.device) / 2**20
        else:
            self.peak_mib = _cpu_hwm_mib()
        self.seconds = time.perf_counter() - self.start
        return False


def progress_bar(total: int, desc: str, show: bool):
    """A tqdm bar of `total` steps (on stderr, shown when `show`): the warm start's and the run's."""
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, disable=not show, dynamic_ncols=True)


def announce(text: str, show: bool) -> None:
    """One line, written at once (also into a pipe), before a phase that would print nothing else for a
    while (when `show`)."""
    if show:
        from tqdm.auto import tqdm

        tqdm.write(text)
        sys.stdout.flush()


class RunLog:
    """The history of a run: one dict per step, written as a JSONL line (main rank) and shown as a tqdm
    bar with a log line per step."""

    def __init__(self, name: str, steps: int, path: pathlib.Path | None, show: bool):
        self.name = name
        self.history: list[dict] = []
        self.path = path
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("")
        self.bar = progress_bar(steps, name, show)
        self.show = show

    def add(self, step: int, record: dict) -> None:
        record = {"step": step, **{k: _plain(v) for k, v in record.items()}}
        self.history.append(record)
        if self.path is not None:
            with self.path.open("a") as f:
                f.write(json.dumps(record) + "\n")
        self.bar.update(1)
        if self.show:
            cells = [f"{k} {record[k]:.4g}" for k in LINE_KEYS if record.get(k) is not None]
            self.bar.write(f"{self.name} step {step:4d}  " + "  ".join(cells))

    def close(self) -> None:
        self.bar.close()


def _plain(value):
    if isinstance(value, torch.Tensor):
        return float(value.detach().float().cpu())
    return value
