"""One process or many under `torchrun`: the rank, the world size, sums over ranks, and the DDP wrapper.

Under torchrun (WORLD_SIZE > 1 in the environment) the process group is gloo for CPU and NCCL for CUDA;
each rank takes its share of the global batch, and the losses get the global token / sequence counts and
`dp_size` so that DDP's gradient average equals the one-process gradient of the whole batch.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Dist:
    rank: int = 0
    world: int = 1
    device: torch.device = torch.device("cpu")

    @property
    def main(self) -> bool:
        return self.rank == 0

    def sum(self, value) -> torch.Tensor:
        """The sum over ranks of a number or tensor (a float64 tensor on this rank's device)."""
        t = torch.as_tensor(value, dtype=torch.float64, device=self.device).clone()
        if self.world > 1:
            dist.all_reduce(t)
        return t

    def wrap(self, module: torch.nn.Module) -> torch.nn.Module:
        if self.world == 1:
            return module
        ids = [self.device.index] if self.device.type == "cuda" else None
        return torch.nn.parallel.DistributedDataParallel(module, device_ids=ids)

    def no_sync(self, module, last: bool):
        """DDP's no_sync() for every micro-batch but the last of an optimizer step."""
        if self.world > 1 and not last:
            return module.no_sync()
        return contextlib.nullcontext()


def setup(device: str) -> Dist:
    """The process group from torchrun's environment (none for a single process) and this rank's device."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return Dist(device=torch.device(device))
    rank = int(os.environ["RANK"])
    if device.startswith("cuda"):
        local = int(os.environ.get("LOCAL_RANK", rank))
        torch.cuda.set_device(local)
        dev = torch.device("cuda", local)
    else:
        dev = torch.device(device)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if dev.type == "cuda" else "gloo")
    return Dist(rank=rank, world=world, device=dev)
