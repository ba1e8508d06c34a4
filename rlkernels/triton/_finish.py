"""One launch, whole answer: a reduction whose last program finishes it (docs/gpu_token_ops.md).

The token-level kernels reduce over the whole batch (a loss, its stats, the rows' weights). Instead of a
second launch, or a dozen torch ops on [B]-sized partials, every program publishes its partial sums and
takes a ticket from a counter; the program that draws the last ticket has seen every other program
publish, reads all the partials and writes the final values, in the same launch:

    publish(part_ptrs, values)            # this program's partials (atomic exchanges: visible GPU-wide)
    if last_program(counter_ptr, total):  # the last of `total` programs to get here, exactly one
        ... read every partial with tl.load(..., volatile=True), write the results ...

The counter (`launch_counter`) is one int32 per device and stream, zero between launches: the last
program resets it, so no launch needs a memset, and launches on one stream run in order.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def publish(ptrs, values, mask):
    """Store this program's float partials where the launch's last program will see them: atomic exchanges
    (performed at the GPU's L2, ordered before this program's ticket by last_program's barrier and the
    ticket's release), of the values' bits as integers of their width (Triton's interpreter exchanges
    integers only)."""
    if values.dtype == tl.float64:
        bits = tl.int64
    else:
        bits = tl.int32
    tl.atomic_xchg(ptrs.to(tl.pointer_type(bits)), values.to(bits, bitcast=True), mask=mask, sem="release")


@triton.jit
def last_program(counter_ptr, total):
    """True in exactly one program: the last of the launch's `total` programs to get here, which then sees
    every program's published partials (the ticket is taken with acquire-release semantics after a barrier
    of this program's threads). That program also resets the counter for the next launch."""
    tl.debug_barrier()
    ticket = tl.atomic_add(counter_ptr, 1, sem="acq_rel")
    last = ticket == total - 1
    if last:
        tl.atomic_xchg(counter_ptr, 0, sem="relaxed")
    return last


_COUNTERS: dict = {}

try:  # the current stream's handle, without a Stream object (Triton's driver reads it so too)
    from torch._C import _cuda_getCurrentRawStream as _current_stream
except ImportError:  # a torch built without CUDA

    def _current_stream(index: int) -> int:
        return torch.cuda.current_stream(index).cuda_stream


def launch_counter(device: torch.device) -> torch.Tensor:
    """The zeroed int32 counter of `last_program` for launches on `device` and its current stream: made
    once (one memset, at the first call), then kept; every launch leaves it at zero. Fake tensors (the
    fake-CUDA check, torch.compile's tracing) get a fresh one each time."""
    # A fake mode is a dispatch mode: with none on the stack (plain eager) its lookup, several microseconds
    # of host time per launch, is skipped.
    if torch._C._len_torch_dispatch_stack():
        from torch._guards import detect_fake_mode

        if detect_fake_mode() is not None:  # no data: an allocation stands for the kept counter
            return torch.empty(1, dtype=torch.int32, device=device)
    if device.type == "cuda":
        index = torch.cuda.current_device() if device.index is None else device.index
        key = (index, _current_stream(index))
    else:  # the interpreter: programs run one after another
        key = (str(device), None)
    counter = _COUNTERS.get(key)
    if counter is None:
        counter = _COUNTERS[key] = torch.zeros(1, dtype=torch.int32, device=device)
    return counter


@triton.jit
def publish_relaxed(ptrs, values, mask):
    """publish without the release: for a program that publishes several tiles (a persistent loop), whose
    one ticket after the last of them orders them all, instead of a wait for its earlier stores at each.
    (A twin at the file's end rather than an argument of publish: Triton's cache keys hold the source and
    the line of every function a kernel calls, so that an edit above them recompiles every token kernel.)"""
    if values.dtype == tl.float64:
        bits = tl.int64
    else:
        bits = tl.int32
    tl.atomic_xchg(ptrs.to(tl.pointer_type(bits)), values.to(bits, bitcast=True), mask=mask, sem="relaxed")
