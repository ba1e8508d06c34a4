"""One process or many under `torchrun`: the rank, the world size, sums over ranks, and the data-parallel
wrapper, DDP or FSDP2 (docs/trainers.md).

Under torchrun (WORLD_SIZE > 1 in the environment) the process group is gloo for CPU and NCCL for CUDA;
each rank takes its share of the global batch, and the losses get the global token / sequence counts and
`dp_size` so that the ranks' averaged gradient equals the one-process gradient of the whole batch.

FSDP2 (`fsdp=True`): every decoder layer and then the whole model are `fully_shard`ed. The root keeps its
parameters gathered from its forward to its backward (reshard_after_forward=False, FSDP2's default for a
root, stated because the trainers rely on it): the loss applies the LM head (and PPO's value head) after
the forward, so those weights are whole tensors there, and their gradients are reduce-scattered with the
root's. The mesh is passed explicitly, over the process group setup() made and on the trainer's device
type: without one, fully_shard builds a mesh on the host's accelerator whenever there is one, and moves the
parameters there, away from a CPU trainer's batches and its gloo group.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
from dataclasses import dataclass
from typing import NoReturn

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Dist:
    rank: int = 0
    world: int = 1
    device: torch.device = torch.device("cpu")
    fsdp: bool = False

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
        """The module to call forward on: DDP around it, or (fsdp) the module itself, sharded in place."""
        if self.world == 1:
            return module
        if self.fsdp:
            return shard(module, self.device)
        ids = [self.device.index] if self.device.type == "cuda" else None
        return torch.nn.parallel.DistributedDataParallel(module, device_ids=ids)

    def no_sync(self, module, last: bool):
        """No gradient reduction for every micro-batch but the last of an optimizer step."""
        if self.world == 1:
            return contextlib.nullcontext()
        if self.fsdp:
            module.set_requires_gradient_sync(last)
            return contextlib.nullcontext()
        return contextlib.nullcontext() if last else module.no_sync()

    @contextlib.contextmanager
    def gathered(self, module: torch.nn.Module):
        """Under FSDP, the root's parameters whole while the body runs a forward that bypasses the root's
        own (`module.lm.generate`); nothing otherwise."""
        if not self.fsdp or self.world == 1:
            yield
            return
        module.unshard()
        try:
            yield
        finally:
            module.reshard()

    def full_state_dict(self, module: torch.nn.Module) -> dict:
        """The whole (unsharded) state dict on every rank: a collective under FSDP."""
        if not self.fsdp or self.world == 1:
            return module.state_dict()
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(module, options=StateDictOptions(full_state_dict=True))


def shard(module: torch.nn.Module, device: torch.device | str | None = None) -> torch.nn.Module:
    """FSDP2 over a trainers.sequences.Backbone: each decoder layer, then the root (kept gathered from forward
    to backward, see the module docstring), on a mesh over the default process group whose device type is
    `device`'s (default: the device of the module's parameters, where the trainer put them). The
    parameters stay on that device."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    device = torch.device(device) if device is not None else next(module.parameters()).device
    mesh = DeviceMesh.from_group(dist.group.WORLD, device.type)
    for layer in module.lm.get_decoder().layers:
        fully_shard(layer, mesh=mesh)
    return fully_shard(module, mesh=mesh, reshard_after_forward=False)


def teardown() -> None:
    """The end of a run under torchrun, on every rank (a single process returns at once): wait for the others
    (rank 0 writes the log, the curves and the checkpoint after the last step), destroy the process group,
    and leave the process without the interpreter's finalization.

    Why not a plain exit: destroy_process_group does not end a group that DDP or FSDP2 still holds (their
    wrappers keep references to it past their own deletion), so the gloo group's worker and transport
    threads are still running when the interpreter finalizes. A rank has aborted at the end of the two-rank
    trainer test in three CI runs ("terminate called without an active exception", SIGABRT), and once in
    the two-process gradient test, whose workers have skipped the finalization since and not aborted again
    (docs/trainers.md). `os._exit` ends the threads with the process. The exit handlers (logging's,
    multiprocessing's, torch's) still run first, and the standard streams are flushed."""
    if not dist.is_initialized():
        return
    dist.barrier()
    dist.destroy_process_group()
    exit_without_finalizing(0)


def exit_without_finalizing(code: int) -> NoReturn:
    """End this process after its atexit handlers and a flush of stdout and stderr, skipping the
    interpreter's finalization and C++ static destructors (see teardown)."""
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


def setup(device: str, fsdp: bool = False) -> Dist:
    """The process group from torchrun's environment (none for a single process) and this rank's device."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        if fsdp:
            raise ValueError("fsdp shards the model over torchrun's processes: run under torchrun with >= 2")
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
    return Dist(rank=rank, world=world, device=dev, fsdp=fsdp)
