"""Host syncs on fake tensors: the ops whose result the host must wait for on a GPU, counted and let
through."""

from __future__ import annotations

import collections

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from rlkernels import _validate as v


class HostSyncs(TorchDispatchMode):
    """Counts the torch ops a call dispatches, and among them the host syncs: the calls whose result the
    host must wait for on a GPU (a data-dependent shape, a tensor read as a Python number, a copy to the
    CPU). On fake tensors these have no data to give, so they are let through as if every element were
    selected (`nonzero`) and every number were 0 (a check that reads one passes).

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
        if func is aten._to_copy.default and _to_host(args[0], kwargs.get("device")):
            self.syncs.append("copy to host")
        if func is aten.copy_.default and _to_host(args[1], args[0].device):
            self.syncs.append("copy to host")
        return func(*args, **kwargs)


def _to_host(src, device) -> bool:
    return (
        isinstance(src, torch.Tensor)
        and src.device.type == "cuda"
        and torch.device(device or src.device).type == "cpu"
    )
