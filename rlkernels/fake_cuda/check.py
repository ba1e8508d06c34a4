"""The fake-CUDA check itself: each call of the catalogue on fake CUDA tensors, eagerly (outputs and
gradients against the reference's, host syncs against the budget) or under dynamo (one graph)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
from collections.abc import Iterator

import torch

from rlkernels._errors import BackendUnavailableError
from rlkernels.fake_cuda.autograd_walk import python_autograd
from rlkernels.fake_cuda.calls import CALLS, EAGER_ONLY, GPU_BACKENDS, SIZES_FROM_DATA, SYNC_BUDGET, Maker
from rlkernels.fake_cuda.host_syncs import HostSyncs


def leaves_of(out) -> Iterator:
    """Every tensor (or None) of a public function's result: tensors, tuples, lists, dicts, NamedTuples,
    dataclasses; in a fixed order."""
    if isinstance(out, torch.Tensor) or out is None:
        yield out
    elif dataclasses.is_dataclass(out):
        for f in dataclasses.fields(out):
            yield from leaves_of(getattr(out, f.name))
    elif isinstance(out, dict):
        for k in sorted(out):
            yield from leaves_of(out[k])
    elif isinstance(out, (tuple, list)):
        for x in out:
            yield from leaves_of(x)


def signature(out) -> list[tuple]:
    """(shape, dtype) of every tensor of a result (None where the result has None)."""
    return [None if t is None else (tuple(t.shape), t.dtype) for t in leaves_of(out)]


def _backward(out, leaves: list[torch.Tensor]) -> list:
    """Gradients of the sum of the result's differentiable outputs with respect to `leaves`, or [] when
    nothing is differentiable."""
    parts = [t for t in leaves_of(out) if t is not None and t.requires_grad and t.dtype.is_floating_point]
    if not parts or not leaves:
        return []
    total = sum(p.float().sum() for p in parts)
    return list(torch.autograd.grad(total, leaves, allow_unused=True))


@dataclasses.dataclass
class Outcome:
    call: str
    backend: str
    status: str  # "ok", "n/a" (backend not implemented for the op) or "FAILED"
    detail: str = ""


@contextlib.contextmanager
def fake_cuda_mode():
    """A FakeTensorMode whose tensors may claim the CUDA device on a machine without one."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=False) as mode, python_autograd():
        yield mode


def reference_signature(name: str) -> tuple[list, list]:
    """The call on real CPU tensors with backend="reference": (output signature, gradient signature)."""
    m = Maker(torch.device("cpu"))
    out = CALLS[name](m, "reference")
    return signature(out), signature(_backward(out, m.leaves))


def run_fake(name: str, backend: str) -> tuple[list, list, list, HostSyncs]:
    """The call (forward and backward) on fake CUDA tensors: (output signature, gradient signature,
    devices of every result tensor, the ops and host syncs it dispatched)."""
    with fake_cuda_mode() as mode, HostSyncs() as seen:
        m = Maker(torch.device("cuda"), mode)
        out = CALLS[name](m, backend)
        grads = _backward(out, m.leaves)
        devices = sorted({t.device.type for t in [*leaves_of(out), *grads] if t is not None})
        return signature(out), signature(grads), devices, seen


def _dtypes(sig: list) -> list:
    return [None if x is None else x[1] for x in sig]


def check_call(name: str, backend: str) -> Outcome:
    """Run one call on fake CUDA tensors and compare its outputs' and gradients' shapes and dtypes with the
    reference's on CPU tensors."""
    try:
        out_sig, grad_sig, devices, seen = run_fake(name, backend)
    except BackendUnavailableError as e:
        if "is not implemented for this op" in str(e) and backend != "auto":
            return Outcome(name, backend, "n/a", str(e))
        return Outcome(name, backend, "FAILED", f"{type(e).__name__}: {e}")
    except Exception as e:  # every failure is reported, with its type
        return Outcome(name, backend, "FAILED", f"{type(e).__name__}: {str(e).splitlines()[0][:300]}")
    want_out, want_grad = reference_signature(name)
    if name in SIZES_FROM_DATA:  # fake syncs select everything: compare dtypes only
        out_sig, want_out = _dtypes(out_sig), _dtypes(want_out)
    problems = []
    if out_sig != want_out:
        problems.append(f"outputs {out_sig} != reference {want_out}")
    if grad_sig != want_grad:
        problems.append(f"gradients {grad_sig} != reference {want_grad}")
    if devices and devices != ["cuda"]:
        problems.append(f"results on {devices}, not only cuda")
    if seen.cut:
        problems.append(f"assert messages cut to fit CUDA's limit: {seen.cut}")
    allowed, why = SYNC_BUDGET.get(name, (0, ""))
    if len(seen.syncs) > allowed:
        problems.append(f"{len(seen.syncs)} host syncs ({', '.join(seen.syncs)}), budget {allowed}")
    return Outcome(name, backend, "FAILED" if problems else "ok", "; ".join(problems))


class _Replay(Maker):
    """A Maker that hands out tensors drawn earlier, in the same order (no generator: dynamo cannot trace
    one being created)."""

    def __init__(self, tensors):  # not super().__init__, which would make a generator
        self.tensors = iter(tensors)
        self.leaves = []

    def _place(self, t, grad):
        return next(self.tensors)

    def randn(self, *shape, grad=False, **kw):
        return next(self.tensors)

    logp = randn

    def mask(self, *shape, **kw):
        return next(self.tensors)

    def ints(self, high, *shape, **kw):
        return next(self.tensors)

    def tensor(self, values, **kw):
        return next(self.tensors)

    def labels(self, vocab, *shape):
        return next(self.tensors)


def check_dynamo(name: str, backend: str) -> Outcome:
    """`torch._dynamo.export` of the call's forward on fake CUDA tensors: one graph, no break. The inputs are
    drawn by a call with backend="reference" (its arguments are drawn before it runs; whether it runs on
    fake tensors does not matter), which probes no backend, so that in a fresh process the op's first call
    with `backend` is the one inside the graph."""
    import torch._dynamo

    if name in EAGER_ONLY:
        return Outcome(name, backend, "n/a", EAGER_ONLY[name])
    with fake_cuda_mode() as mode:
        drawn: list[torch.Tensor] = []
        m = Maker(torch.device("cuda"), mode)
        place = m._place
        m._place = lambda t, grad: drawn.append(place(t, grad)) or drawn[-1]
        with contextlib.suppress(Exception):
            CALLS[name](m, "reference")

    def fn(*inputs):
        return CALLS[name](_Replay(inputs), backend)

    try:
        torch._dynamo.reset()
        torch._dynamo.export(fn)(*drawn)
    except Exception as e:  # every failure is reported, with its type and first line
        if "is not implemented for this op" in str(e) and backend != "auto":
            return Outcome(name, backend, "n/a", f"backend={backend!r} is not implemented for this op")
        first = next((ln for ln in str(e).splitlines() if ln.strip()), "")
        return Outcome(name, backend, "FAILED", f"{type(e).__name__}: {first[:300]}")
    return Outcome(name, backend, "ok")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rlkernels fake-cuda", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--backends", nargs="+", choices=GPU_BACKENDS, default=list(GPU_BACKENDS))
    parser.add_argument("--dynamo", action="store_true", help="torch._dynamo.export each call (fullgraph)")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="calls whose name starts with NAME")
    args = parser.parse_args(argv)
    names = [n for n in CALLS if not args.only or any(n.startswith(o) for o in args.only)]
    check = check_dynamo if args.dynamo else check_call
    failed = 0
    for name in names:
        for backend in args.backends:
            o = check(name, backend)
            failed += o.status == "FAILED"
            print(f"{o.status:6s} {backend:6s} {name:50s} {o.detail}", flush=True)
    kind = "dynamo export" if args.dynamo else "eager"
    print(f"fake-cuda ({kind}): {failed} failed of {len(names) * len(args.backends)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
