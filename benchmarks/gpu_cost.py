"""What one call of an op costs a GPU, counted on a machine without one (no timing): the kernels it
launches and the bytes each moves, its GEMM FLOPs, its host syncs, its custom-op calls and autograd nodes.
gpu_model.py turns these counts into H100/H200 time.

    python benchmarks/gpu_cost.py [--ops policy_loss kl_penalty ...] [--shapes small llm]

How each flavor is counted, on fake CUDA tensors (rlkernels/fake_cuda: every GPU branch of the Python code
is taken, nothing is computed):
- ATen ops: each op that launches a kernel on a GPU (not a view, an allocation or a metadata query), with
  the bytes of its tensor inputs and outputs; a matrix product also with its FLOPs (2·M·N·K).
- Triton (the `rlkernels::*_triton` custom ops): their Python launchers run on the fake tensors, and each
  `kernel[grid](...)` is recorded instead of launched, with the bytes of its distinct tensor arguments
  (each read or written once: the elementwise and reduction kernels' contract, checked by
  `python -m rlkernels traffic`) and the FLOPs of its tl.dots where the launcher declares them.
- CUDA C++ (the native `rlkernels::*` ops): one op call, with the bytes of its tensor inputs and outputs;
  the kernels it launches inside are counted by running the same call through the cuda-on-cpu harness
  (tests/cuda_on_cpu, `native_kernels`), at a small shape.
- the backward: the autograd graph walked from Python (fake_cuda.walk_backward), its nodes counted.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import os
import pkgutil
import sys
import weakref
from collections import Counter
from collections.abc import Callable

import torch

from rlkernels.fake_cuda import walk_backward
from rlkernels.fake_cuda.check import leaves_of
from rlkernels.fake_cuda.host_syncs import copy_sync

# ATen ops that launch no kernel: views, allocations and metadata (a GPU runs nothing for them).
NO_KERNEL = {
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "view", "_unsafe_view",
    "reshape", "t", "transpose", "permute", "expand", "select", "slice", "unsqueeze", "squeeze", "as_strided",
    "alias", "detach", "unbind", "split", "split_with_sizes", "chunk", "narrow", "diagonal", "lift_fresh",
    "_reshape_alias", "view_as", "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "is_same_size",
    "_assert_tensor_metadata", "set_", "promote_types", "result_type", "to", "contiguous", "size", "stride",
    "dim", "numel", "is_contiguous", "_has_compatible_shallow_copy_type", "clone_if_needed",
}  # fmt: skip
# (aten "to" and "contiguous" launch their copy as _to_copy / clone when one is needed, counted there.)
# Host syncs (HostSyncs of rlkernels/fake_cuda): the host waits for the GPU. Copies the host waits for are
# told apart by their direction and blocking flag (fake_cuda.host_syncs.copy_sync).
SYNCS = {"nonzero", "argwhere", "_local_scalar_dense", "item", "is_nonzero", "_unique2", "unique_dim"}
GEMMS = {"mm", "addmm", "bmm", "baddbmm", "matmul", "_scaled_mm"}


@dataclasses.dataclass
class Launch:
    kind: str  # "aten", "triton" or "native" (a CUDA C++ op: its inner kernels are `kernels`)
    name: str
    bytes: int
    flops: int = 0
    kernels: int = 1
    args: int = 0  # a Triton launch's arguments (Triton binds each in Python)
    alignment: int = 0  # a GEMM's: the bytes that divide its operands' and output's rows and starts
    grid: tuple = ()  # a Triton launch's grid (empty where it is a function of the config)


@dataclasses.dataclass
class Cost:
    """Everything one call launched and waited for, forward and backward."""

    launches: list[Launch] = dataclasses.field(default_factory=list)
    syncs: list[str] = dataclasses.field(default_factory=list)
    custom_ops: int = 0  # calls of torch.library custom ops (a Python dispatch each)
    autograd_nodes: int = 0
    live_bytes: int = 0  # bytes of the fake tensors the ops allocated that are still alive
    peak_bytes: int = 0  # the most live_bytes was during the call (its inputs excluded: see `count`)
    _live: set = dataclasses.field(default_factory=set)  # the storages counted in live_bytes

    def allocated(self, t: torch.Tensor) -> None:
        """An op's output `t`: if its storage is new (not a view, not an in-place or out= result, not an inner
        op's output passed on by a custom op), counted live until the tensor (its views keep it) is freed."""
        key = t.untyped_storage()._cdata
        if key in self._live:
            return
        nbytes = t.untyped_storage().nbytes()
        self._live.add(key)
        self.live_bytes += nbytes
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        weakref.finalize(t, self._freed, key, nbytes)

    def _freed(self, key: int, nbytes: int) -> None:
        self._live.discard(key)
        self.live_bytes -= nbytes

    def model_counts(self):
        """The time model's counts (benchmarks/gpu_model.py Counts) of this call."""
        from gpu_model import Counts

        triton = [x for x in self.launches if x.kind == "triton"]
        native = [x for x in self.launches if x.kind == "native"]
        return Counts(
            aten=sum(1 for x in self.launches if x.kind == "aten" and not x.flops),
            triton_kernels=len(triton),
            triton_args=sum(x.args for x in triton),
            native_kernels=sum(x.kernels for x in native),
            nodes=self.autograd_nodes,
            bytes=float(self.bytes),
            gemm_flops=float(self.flops),
        )

    def kernels(self, kind: str | None = None) -> int:
        return sum(launch.kernels for launch in self.launches if kind is None or launch.kind == kind)

    @property
    def bytes(self) -> int:
        return sum(launch.bytes for launch in self.launches if launch.flops == 0)

    @property
    def flops(self) -> int:
        return sum(launch.flops for launch in self.launches)

    def bytes_of(self, name: str) -> int:
        """The bytes of the launches of one kernel or op, by name."""
        return sum(launch.bytes for launch in self.launches if launch.name == name)

    def summary(self) -> str:
        kinds = Counter()
        for launch in self.launches:
            kinds[launch.kind] += launch.kernels
        parts = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
        return (
            f"{self.kernels()} kernels ({parts}), {self.syncs and len(self.syncs) or 0} syncs, "
            f"{self.bytes / 1e6:.1f} MB, {self.flops / 1e9:.1f} GFLOP, {self.custom_ops} custom ops, "
            f"{self.autograd_nodes} autograd nodes"
        )


def _storage_bytes(tensors) -> int:
    """Bytes of the distinct storages among `tensors` (a dummy pointer passed twice counts once)."""
    seen, total = set(), 0
    for t in tensors:
        if not isinstance(t, torch.Tensor) or t.numel() == 0:
            continue
        key = (id(t.untyped_storage()) if not _is_fake(t) else id(t), t.data_ptr() if not _is_fake(t) else 0)
        if key in seen:
            continue
        seen.add(key)
        total += t.numel() * t.element_size()
    return total


def _is_fake(t: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(t, FakeTensor)


def _gemm_flops(name: str, args, out) -> int:
    if name in ("mm", "matmul", "_scaled_mm"):
        a, b = args[0], args[1]
        return 2 * a.shape[0] * a.shape[1] * b.shape[-1]
    if name in ("addmm", "addmm_"):
        a, b = args[1], args[2]
        return 2 * a.shape[0] * a.shape[1] * b.shape[-1]
    if name in ("bmm", "baddbmm"):
        a, b = (args[0], args[1]) if name == "bmm" else (args[1], args[2])
        return 2 * a.shape[0] * a.shape[1] * a.shape[2] * b.shape[-1]
    return 0


def gemm_alignment(tensors) -> int:
    """The largest power of two (at most 256) of bytes that divides the leading dimension and the start of
    every 2-D GEMM operand in `tensors` (cuBLAS's fast tensor-core kernels want 16)."""
    out = 256
    for t in tensors:
        if not isinstance(t, torch.Tensor) or t.dim() != 2:
            continue
        ld = t.stride(0) if t.stride(1) == 1 else t.stride(1)
        for n in (ld, t.storage_offset()):
            b = n * t.element_size()
            out = min(out, b & -b if b else out)
    return out


def _counting_fake_mode(cost: Cost, native_kernels: Callable[[str], int]):
    """A FakeTensorMode that records every op it sees (nested ones too: the ops inside the Triton launchers
    reach it through the fake tensors) into `cost`: ATen ops that launch a kernel, the native rlkernels ops,
    calls of the custom ops, host syncs (let through as fake_cuda.HostSyncs does: every element selected,
    every number 0)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    aten = torch.ops.aten

    class Counting(FakeTensorMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            name = func.overloadpacket.__name__ if hasattr(func, "overloadpacket") else str(func)
            namespace = getattr(func, "namespace", "")
            if func in (aten.nonzero.default, aten.argwhere.default):
                cost.syncs.append(name)
                x = args[0]
                with self:
                    return torch.empty((x.numel(), x.dim()), dtype=torch.long, device=x.device)
            if func in (aten._local_scalar_dense.default, aten.item.default, aten.is_nonzero.default):
                cost.syncs.append(name)
                return False if func is aten.is_nonzero.default else 0
            if func is aten.addmm.dtype_out:
                # One cuBLAS GEMM on a GPU (beta = 1 reads `out` in its epilogue); fake tensors would run
                # its decomposition (mm, then add), a launch and an [M, N] temporary more than a GPU has.
                out = kwargs["out"]
                launch = Launch("aten", name, 0, flops=_gemm_flops(name, args, out))
                launch.alignment = gemm_alignment([*args, out])
                cost.launches.append(launch)
                return out
            out = super().__torch_dispatch__(func, types, args, kwargs)
            leaves = torch.utils._pytree.tree_leaves
            flat_in = [a for a in leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
            flat_out = [o for o in leaves(out) if isinstance(o, torch.Tensor)]
            moved = _storage_bytes(flat_in + flat_out)
            inputs = {t.untyped_storage()._cdata for t in flat_in}
            for o in flat_out:  # fresh storages: allocations (not views, not in-place or out= results)
                if o.untyped_storage()._cdata not in inputs:
                    cost.allocated(o)
            if namespace == "rlkernels":
                cost.custom_ops += 1
                if "_triton" not in name:
                    cost.launches.append(Launch("native", name, moved, kernels=native_kernels(name)))
            elif namespace == "aten" and name not in NO_KERNEL:
                copy = copy_sync(func, args, kwargs)
                if copy is not None:
                    cost.syncs.append(copy)
                launch = Launch("aten", name, moved, flops=_gemm_flops(name, args, out))
                if launch.flops:
                    launch.alignment = gemm_alignment(flat_in + flat_out)
                cost.launches.append(launch)
            return out

    return Counting(allow_non_fake_inputs=False)


@contextlib.contextmanager
def _triton_recorded(cost: Cost):
    """Triton launches recorded, not run; the launchers take their GPU branches (TRITON_INTERPRET off)."""
    from triton.runtime import autotuner
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    def record(self, *args, grid, warmup, **kwargs):
        fn = getattr(self, "fn", self)
        name = getattr(fn, "__name__", str(fn))
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        shape = tuple(grid) if isinstance(grid, (tuple, list)) else ()
        cost.launches.append(
            Launch("triton", name, _storage_bytes(tensors), args=len(args) + len(kwargs), grid=shape)
        )

    def autotuned(self, *args, **kwargs):  # the first config, recorded once
        config = self.configs[0]
        return self.fn.run(*args, **{**kwargs, **config.all_kwargs()})

    # The kernel modules are imported first: @triton.jit reads TRITON_INTERPRET when it decorates, so a module
    # first imported below (the launchers import theirs lazily) would keep GPU kernels for the rest of the
    # process, which an interpreter session's later calls cannot run.
    for module in pkgutil.iter_modules(importlib.import_module("rlkernels.triton").__path__):
        importlib.import_module(f"rlkernels.triton.{module.name}")
    saved = (JITFunction.run, InterpretedFunction.run, autotuner.Autotuner.run)
    previous = os.environ.get("TRITON_INTERPRET")
    JITFunction.run = InterpretedFunction.run = record
    autotuner.Autotuner.run = autotuned
    os.environ["TRITON_INTERPRET"] = "0"
    try:
        yield
    finally:
        JITFunction.run, InterpretedFunction.run, autotuner.Autotuner.run = saved
        if previous is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = previous


@contextlib.contextmanager
def _triton_ops_run_for_real():
    """On fake tensors, the Triton custom ops run their launchers (with the kernels recorded) instead of
    their fake kernels."""
    import rlkernels.ops  # noqa: F401  (registers every op)

    defs = [d for d in _custom_op_defs() if d._namespace == "rlkernels" and "_triton" in d._name]
    saved = [(d, d._abstract_fn) for d in defs]

    for d in defs:
        d._abstract_fn = d._init_fn
    try:
        yield
    finally:
        for d, fn in saved:
            d._abstract_fn = fn


def _custom_op_defs():
    # torch's registry of the custom ops, not a walk of gc.get_objects() (isinstance on a dead weak proxy
    # there raises ReferenceError, as it did after a few hundred tests in one process)
    from torch._library.custom_ops import OPDEFS

    return list(OPDEFS.values())


def count(
    call: Callable, make_inputs: Callable, *, native_kernels: Callable[[str], int] = lambda _: 1
) -> Cost:
    """The cost of `call(**inputs)` forward and backward (through every differentiable output, with
    upstream gradients of ones) on fake CUDA tensors; `make_inputs(mode)` builds them (fake_cuda.Maker);
    the inputs that require grad are the leaves."""
    from rlkernels.fake_cuda.autograd_walk import python_autograd

    cost = Cost()
    mode = _counting_fake_mode(cost, native_kernels)
    with _triton_recorded(cost), _triton_ops_run_for_real(), python_autograd():
        with mode:
            inputs = make_inputs(mode)
        del cost.launches[:]  # building the inputs is no part of the call
        cost.syncs.clear()
        cost.peak_bytes = cost.live_bytes = 0  # the peak above the inputs (the returned gradients included)
        with mode:
            leaves = [t for t in inputs.values() if isinstance(t, torch.Tensor) and t.requires_grad]
            out = call(**inputs)
            parts = [t for t in leaves_of(out) if t is not None and t.requires_grad]
            if parts and leaves:  # the upstream gradients are the caller's: made outside the count
                forward = len(cost.launches)
                grads = [torch.ones_like(p) for p in parts]
                del cost.launches[forward:]
                cost.autograd_nodes = _nodes(parts)
                walk_backward(parts, leaves, grads)
    return cost


TESTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests")


@dataclasses.dataclass
class Native:
    """What the calls of a native (CUDA C++) op launch inside: its own kernels and the ATen ops its binding
    calls (each a kernel too), counted through the cuda-on-cpu harness."""

    kernels: int
    aten: list[str]

    @property
    def total(self) -> int:
        return self.kernels + len(self.aten)


def native_costs(call: Callable, make_inputs: Callable) -> dict[str, Native]:
    """{native op: Native} of `call(**inputs)` forward and backward on small CPU tensors
    (`make_inputs(None)`) run through the cuda-on-cpu harness: the CUDA bindings and kernels compiled for
    the host, whose launches the harness counts (rlkernels_sim_stats::launches); the ATen ops each binding
    calls come from the profiler's event tree. An op called several times counts every call's."""
    from torch.utils._python_dispatch import TorchDispatchMode

    if TESTS not in sys.path:
        sys.path.insert(0, TESTS)
    from cuda_on_cpu.flavor import cuda_on_cpu

    launches = {}

    class PerOp(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if getattr(func, "namespace", "") != "rlkernels":
                return func(*args, **(kwargs or {}))
            before = torch.ops.rlkernels_sim_stats.launches()
            out = func(*args, **(kwargs or {}))
            name = func.overloadpacket.__name__
            launches[name] = launches.get(name, 0) + torch.ops.rlkernels_sim_stats.launches() - before
            return out

    with cuda_on_cpu():
        inputs = make_inputs(None)
        leaves = [t for t in inputs.values() if isinstance(t, torch.Tensor) and t.requires_grad]
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof, PerOp():
            out = call(**inputs)
            parts = [t for t in leaves_of(out) if t is not None and t.requires_grad]
            if parts and leaves:
                torch.autograd.grad(sum(p.float().sum() for p in parts), leaves, allow_unused=True)
    inner: dict[str, list[str]] = {}
    for event in prof.events():  # the ATen ops a binding calls itself (their own parts are not kernels)
        parent = event.cpu_parent
        if parent is None or not parent.name.startswith("rlkernels_sim::"):
            continue
        if not event.name.startswith("aten::"):
            continue
        name = event.name.removeprefix("aten::")
        if name in ("to", "contiguous") and any(c.name == "aten::_to_copy" or c.name == "aten::clone"
                                                 for c in event.cpu_children):  # fmt: skip
            name = "_to_copy"
        if name not in NO_KERNEL:
            inner.setdefault(parent.name.removeprefix("rlkernels_sim::"), []).append(name)
    return {op: Native(n, inner.get(op, [])) for op, n in launches.items()}


def _nodes(roots: list[torch.Tensor]) -> int:
    seen, stack = set(), [r.grad_fn for r in roots]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        stack.extend(n for n, _ in node.next_functions)
    return len(seen)


if __name__ == "__main__":
    sys.exit(0)
