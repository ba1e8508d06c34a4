"""Host syncs on fake tensors: the ops whose result the host must wait for on a GPU, counted and let
through."""

from __future__ import annotations

import collections
import contextlib
import contextvars

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from rlkernels import _validate as v

# True while a test's inputs are placed on the device (fake_cuda.Maker): their copies are not the call's.
_PLACING_INPUTS = contextvars.ContextVar("placing_inputs", default=False)


@contextlib.contextmanager
def placing_inputs():
    """The copies made inside are a test's inputs arriving on the device before the call: HostSyncs does not
    count them."""
    token = _PLACING_INPUTS.set(True)
    try:
        yield
    finally:
        _PLACING_INPUTS.reset(token)


class HostSyncs(TorchDispatchMode):
    """Counts the torch ops a call dispatches, and among them the host syncs: the calls whose result the
    host must wait for on a GPU (a data-dependent shape, a tensor read as a Python number, a copy to the
    CPU, a blocking copy from it). On fake tensors these have no data to give, so they are let through as
    if every element were selected (`nonzero`) and every number were 0 (a check that reads one passes).

    It also refuses what CUDA refuses and fake tensors would let through: an assert message longer than
    _validate.ASYNC_MESSAGE_BYTES raises CUDA's error; one that assert_async had to cut is kept in `cut`."""

    def __init__(self):
        super().__init__()
        self.syncs: list[str] = []
        self.ops: collections.Counter = collections.Counter()
        self.cut: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = str(func.overloadpacket).removeprefix("aten.")
        self.ops[name] += 1
        aten = torch.ops.aten
        if func is aten._assert_async.msg and args[0].device.type == "cuda":
            message = args[1]
            if len(message.encode()) > v.ASYNC_MESSAGE_BYTES:
                raise RuntimeError("Message length must be smaller than 255")  # CUDA's words
            if message.endswith(v.CUT):
                self.cut.append(message)
        if func in (aten.nonzero.default, aten.argwhere.default):
            self.syncs.append(name)
            x = args[0]
            return torch.empty((x.numel(), x.dim()), dtype=torch.long, device=x.device)
        if func in (aten._unique2.default, aten.unique_dim.default, aten.unique_consecutive.default):
            self.syncs.append(name)  # as if every element were distinct
            x, flat = args[0], args[0].reshape(-1)
            counts = torch.ones_like(flat, dtype=torch.long)
            return flat.clone(), torch.zeros(x.shape, dtype=torch.long, device=x.device), counts
        if func in (aten._local_scalar_dense.default, aten.item.default, aten.is_nonzero.default):
            self.syncs.append(name)
            return False if func is aten.is_nonzero.default else 0
        if _PLACING_INPUTS.get():
            return func(*args, **kwargs)
        copy = copy_sync(func, args, kwargs)
        if copy is not None:
            self.syncs.append(copy)
        return func(*args, **kwargs)


def copy_sync(func, args, kwargs) -> str | None:
    """The sync an ATen call `func` makes as a copy the host waits for on a GPU: "copy to host" (any copy to
    the CPU), "copy from host" (a blocking one from it), or None."""
    aten = torch.ops.aten
    if func is aten._to_copy.default:
        src, device, non_blocking = args[0], kwargs.get("device"), kwargs.get("non_blocking", False)
    elif func is aten.copy_.default:
        src, device = args[1], args[0].device
        non_blocking = args[2] if len(args) > 2 else kwargs.get("non_blocking", False)
    else:
        return None
    if _to_host(src, device):
        return "copy to host"
    if _from_host(src, device) and not non_blocking:
        return "copy from host"
    return None


def _to_host(src, device) -> bool:
    return (
        isinstance(src, torch.Tensor)
        and src.device.type == "cuda"
        and torch.device(device or src.device).type == "cpu"
    )


def _from_host(src, device) -> bool:
    """A blocking copy of a CPU tensor to the GPU (`torch.tensor(data, device="cuda")`, `.to("cuda")`): CUDA's
    copy from pageable memory, which torch follows with a stream synchronize (at::cuda::memcpy_and_sync)."""
    return (
        isinstance(src, torch.Tensor)
        and src.device.type == "cpu"
        and torch.device(device or src.device).type == "cuda"
    )
