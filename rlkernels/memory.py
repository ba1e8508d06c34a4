"""Peak memory allocated during a call, on CPU (from the profiler's allocation events) and on CUDA (from
the caching allocator's peak counter). Used by the benchmarks and the structural memory tests;
handy for measuring a training step too."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable

import torch


@contextlib.contextmanager
def _quiet_native_stderr():
    """Kineto prints start/stop banners to file descriptor 2; hide them (only around start and stop)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _allocation_events(prof) -> list[tuple[int, int]]:
    """(time_ns, signed bytes) of every CPU allocation and free the profiler saw, in time order."""
    events = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        stack.extend(node.children)
        kind, payload = node.typed
        if kind.name == "Allocation" and payload.device.type == "cpu":
            events.append((node.start_time_ns, int(payload.alloc_size)))
    events.sort()
    return events


def cpu_peak_bytes(fn: Callable[[], object]) -> int:
    """Peak bytes allocated on the CPU during fn() above what was allocated before it (outputs kept
    alive until fn returns count; memory freed inside fn is subtracted as it is freed)."""
    from torch.profiler import ProfilerActivity, profile

    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    with _quiet_native_stderr():
        prof.start()
    try:
        out = fn()
    finally:
        with _quiet_native_stderr():
            prof.stop()
    del out
    current = peak = 0
    for _, delta in _allocation_events(prof):
        current += delta
        peak = max(peak, current)
    return peak


def cuda_peak_bytes(fn: Callable[[], object]) -> int:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    out = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    del out
    return peak


def peak_bytes(fn: Callable[[], object], device: torch.device | str) -> int:
    """Peak extra bytes allocated on `device` ("cpu" or "cuda": the device fn's tensors live on, which
    the measurement cannot guess) while fn() runs."""
    if not callable(fn):
        raise TypeError(f"peak_bytes: fn must be a callable taking no arguments, got {type(fn).__name__}")
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"peak_bytes: device must be 'cpu' or 'cuda', got {device!r}") from e
    if device.type not in ("cpu", "cuda"):
        raise ValueError(
            f"peak_bytes: device must be 'cpu' or 'cuda' (the allocators it can read), got {device}"
        )
    return cuda_peak_bytes(fn) if device.type == "cuda" else cpu_peak_bytes(fn)
