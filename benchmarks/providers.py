"""The providers every benchmark compares: eager PyTorch (the reference implementation, i.e. what a
trainer runs today), torch.compile of it, and each rlkernels backend that runs on the device."""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Callable

import torch
from harness import EAGER, Provider

from rlkernels._backend import unavailable_reason


def device_backends(device: torch.device) -> list[str]:
    """The kernel backends worth timing on `device` (Triton's CPU interpreter is not)."""
    return ["triton", "cuda"] if device.type == "cuda" else ["cpu"]


def eager(fn: Callable) -> Provider:
    return Provider(EAGER, fn)


def compiled(fn: Callable) -> Provider:
    """torch.compile of the eager function (compile time is spent in the harness' warm-up run)."""
    return Provider("torch.compile", torch.compile(fn, dynamic=False))


def rlkernels(fn: Callable, device: torch.device, backends: list[str] | None = None) -> list[Provider]:
    """fn(**inputs, backend=b) for each backend, marked unavailable with the reason when it cannot run."""
    return [
        Provider(f"rlkernels[{b}]", functools.partial(fn, backend=b), unavailable_reason(b, device))
        for b in (backends or device_backends(device))
    ]


def optional_package(name: str) -> str | None:
    """None when `name` is importable, else the reason to print."""
    return None if importlib.util.find_spec(name) is not None else f"{name} is not installed"


def standard(reference_fn: Callable, rk_fn: Callable, device: torch.device) -> list[Provider]:
    """eager, torch.compile and rlkernels' backends for an op whose reference takes the same arguments."""
    return [eager(reference_fn), compiled(reference_fn), *rlkernels(rk_fn, device)]
