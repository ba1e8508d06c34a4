"""Input validation at the public API boundary: each check raises TypeError/ValueError naming the op,
the argument and what it saw. Value checks that would need a host sync on GPU tensors (label ranges)
go through `torch._assert_async` instead of `.item()`."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

FLOAT_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
INDEX_DTYPES = (torch.int32, torch.int64)


def _shape(t: torch.Tensor) -> tuple:
    return tuple(t.shape)


def check_tensor(op: str, x, name: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(x).__name__}")
    return x


def check_float(op: str, x, name: str) -> torch.Tensor:
    """A floating-point tensor of a dtype the kernels support."""
    check_tensor(op, x, name)
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{op}: {name} must be float32, float64, float16 or bfloat16, got {x.dtype}")
    return x


def check_index(op: str, x, name: str) -> torch.Tensor:
    """An int32/int64 tensor (labels, group ids, offsets)."""
    check_tensor(op, x, name)
    if x.dtype not in INDEX_DTYPES:
        raise TypeError(f"{op}: {name} must be an int32 or int64 tensor, got {x.dtype}")
    return x


def check_mask(op: str, x, name: str, shape: Sequence[int], shape_of: str) -> torch.Tensor:
    """A bool or floating mask of exactly `shape` (the shape of argument `shape_of`)."""
    check_tensor(op, x, name)
    if x.dtype != torch.bool and x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{op}: {name} must be a bool or floating-point tensor, got {x.dtype}")
    check_shape(op, x, name, shape, shape_of)
    return x


def check_ndim(op: str, x: torch.Tensor, name: str, ndims: Iterable[int]) -> torch.Tensor:
    ndims = tuple(ndims)
    if x.dim() not in ndims:
        want = " or ".join(f"{n}-D" for n in ndims)
        raise ValueError(f"{op}: {name} must be {want}, got shape {_shape(x)}")
    return x


def check_shape(op: str, x: torch.Tensor, name: str, shape: Sequence[int], shape_of: str) -> torch.Tensor:
    if tuple(x.shape) != tuple(shape):
        raise ValueError(f"{op}: {name} has shape {_shape(x)} but {shape_of} has shape {tuple(shape)}")
    return x


def check_same_device(op: str, **tensors: torch.Tensor | None) -> torch.device:
    """All given tensors (None skipped) on one device; returns it."""
    named = [(n, t) for n, t in tensors.items() if t is not None]
    device = named[0][1].device
    for _, t in named[1:]:
        if t.device != device:
            seen = ", ".join(f"{m} on {u.device}" for m, u in named)
            raise ValueError(f"{op}: all tensors must be on one device, got {seen}")
    return device


def check_choice(op: str, value, name: str, choices: Iterable[str]) -> str:
    choices = tuple(choices)
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{op}: {name} must be one of {choices}, got {value!r}")
    return value


def check_number(
    op: str,
    value,
    name: str,
    *,
    gt: float | None = None,
    ge: float | None = None,
    le: float | None = None,
    optional: bool = False,
):
    """A real Python number (not a tensor) within the given bounds."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{op}: {name} must be a number, got {type(value).__name__}")
    if value != value:
        raise ValueError(f"{op}: {name} must not be NaN")
    if gt is not None and not value > gt:
        raise ValueError(f"{op}: {name} must be > {gt}, got {value}")
    if ge is not None and not value >= ge:
        raise ValueError(f"{op}: {name} must be >= {ge}, got {value}")
    if le is not None and not value <= le:
        raise ValueError(f"{op}: {name} must be <= {le}, got {value}")
    return value


def assert_in_range(op: str, x: torch.Tensor, name: str, low: int, high: int, *, ignore: int | None = None):
    """Every element of `x` in [low, high) (elements equal to `ignore` excepted), without a host sync
    on GPU tensors: CPU tensors are checked eagerly and raise ValueError; GPU tensors enqueue an async
    assert that fails the stream."""
    if x.numel() == 0:
        return
    bad = (x < low) | (x >= high)
    if ignore is not None:
        bad &= x != ignore
    if x.device.type == "cpu" and not torch.compiler.is_compiling():
        if bool(bad.any()):
            first = x[bad][0].item()
            raise ValueError(
                f"{op}: {name} must lie in [{low}, {high})"
                + (f" or equal {ignore}" if ignore is not None else "")
                + f", found {first}"
            )
    else:
        torch._assert_async(~bad.any(), f"{op}: {name} out of range [{low}, {high})")
