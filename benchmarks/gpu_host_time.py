"""The host time of a call with its kernels stubbed out: what the Python, the dispatcher and Triton's launch
path cost per call, measured on this machine's CPU (no GPU), for benchmarks/gpu_model.py.

Three parts, each the median over rounds of the per-call time (forward + backward), in microseconds:
- python: the call on small CPU tensors (its tensor ops' arithmetic is then negligible against their
  dispatch). The Triton kernels are not run (TRITON_INTERPRET=1 with each launch replaced by a no-op that
  marks an `ok` output valid), the native ops run their C++ CPU kernels (a binding's overhead stands for
  the CUDA binding's), the reference runs as is.
- triton_run: Triton's own launch path for the Triton flavor's launches (JITFunction.run: binding,
  specialization, cache key, launch metadata), each launch recorded on fake CUDA tensors
  (benchmarks/gpu_cost.py) and run with the driver stubbed and the compiled kernel a no-op. What remains
  of a launch (the compiled launcher, the driver) is the time model's per-launch cost. Measured in a
  child process: @triton.jit reads TRITON_INTERPRET when it decorates.
- control: a fixed computation of plain torch ops (`_control`), the unit of the time model: a call's host
  work is its (python + triton_run) / control, which does not depend on this machine's speed or load.
Printed beside them, the floor: what the least Python-level differentiable op costs (`_floor`).

    python benchmarks/gpu_host_time.py [--cases policy_loss kl_penalty kl_penalty_k1+]
        [--providers eager triton cpu compile] [--rounds 5] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
import types
from unittest import mock

if __name__ == "__main__" and "--triton-run" not in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

POLICY_KW = dict(clip_low=0.2, clip_high=0.28, dual_clip=3.0, kl_coef=0.05, kl_kind="k3", entropy_coef=0.01)
PROVIDERS = ("eager", "triton", "cpu")
# torch.compile of the eager reference (--providers ... compile): a check of the time model outside its fit
# (the H200 run measured it too); off by default, its first call compiles.
ALL_PROVIDERS = (*PROVIDERS, "compile")


def noop_launch(self, *args, grid, warmup, **kwargs):
    """An interpreted Triton launch that runs nothing: the op's validity flag among the arguments (a 0-dim
    bool tensor, the only kind the launchers pass) is set valid, so the op's Python goes on as on a GPU."""
    for a in args:
        if isinstance(a, torch.Tensor) and a.dtype == torch.bool and a.dim() == 0:
            a.fill_(True)


def _stub_triton():
    """Triton launches under the interpreter become no-ops (noop_launch)."""
    from triton.runtime.interpreter import InterpretedFunction

    InterpretedFunction.run = noop_launch


def host_calls(step, warmup: int = 3) -> int:
    """How many calls `step()` makes from Python: Python functions and C functions (torch ops, builtins),
    counted with sys.setprofile after `warmup` steps (caches warm); noop_launch, which stands in for a Triton
    launch (benchmarks/gpu_host_time.py times Triton's launch path apart), is not counted. A count, not a
    time: the host work a machine does not change."""
    for _ in range(warmup):
        step()
    calls = 0

    def profile(frame, event, arg):
        nonlocal calls
        calls += event in ("call", "c_call") and frame.f_code is not noop_launch.__code__

    sys.setprofile(profile)
    try:
        step()
    finally:
        sys.setprofile(None)
    return calls


def _policy_inputs(B: int, T: int, m=None) -> dict:
    """policy_loss's tensors: small CPU tensors, or fake CUDA ones from a fake_cuda.Maker `m`."""
    if m is None:
        logp = (-torch.rand(B, T)).requires_grad_()
        x = dict(logp=logp, old_logp=-torch.rand(B, T), advantages=torch.randn(B))
        x["mask"] = torch.rand(B, T) > 0.2
        return dict(x, ref_logp=-torch.rand(B, T), entropy=torch.rand(B, T).requires_grad_())
    x = dict(logp=m.logp(B, T, grad=True), old_logp=m.logp(B, T), advantages=m.randn(B), mask=m.mask(B, T))
    return dict(x, ref_logp=m.logp(B, T), entropy=m.randn(B, T, grad=True))


def _policy_call(provider: str):
    import rlkernels as rk
    from rlkernels.reference.policy_loss import policy_loss as reference

    def eager(**x):
        return reference(**x, **POLICY_KW)[0]

    if provider == "compile":
        return torch.compile(eager, dynamic=False)

    def call(**x):
        if provider == "eager":
            return eager(**x)
        return rk.policy_loss(**x, **POLICY_KW, backend=provider)[0]

    return call


def _kl_call(provider: str, kind: str):
    import rlkernels as rk
    from rlkernels.reference.kl import kl_penalty as reference

    if provider == "compile":
        return torch.compile(lambda logp, ref_logp: reference(logp, ref_logp, kind), dynamic=False)

    def call(logp, ref_logp):
        if provider == "eager":
            return reference(logp, ref_logp, kind)
        return rk.kl_penalty(logp, ref_logp, kind, backend=provider)

    return call


def _policy(provider: str):
    x = _policy_inputs(4, 64)
    call = _policy_call(provider)
    leaves = [x["logp"], x["entropy"]]
    return lambda: torch.autograd.grad(call(**x), leaves)


def _kl(provider: str, kind: str = "k3"):
    logp, ref, grad = (-torch.rand(256)).requires_grad_(), -torch.rand(256), torch.randn(256)
    call = _kl_call(provider, kind)
    return lambda: torch.autograd.grad(call(logp, ref), [logp], grad)


CASES = {
    "policy_loss": _policy,
    "kl_penalty": _kl,
    "kl_penalty_k1+": lambda provider: _kl(provider, "k1+"),
}


def _control():
    """The unit: k3's formula in plain torch ops on 256 elements, forward + backward (six ATen ops and their
    autograd nodes; no rlkernels code, so it does not change with the library)."""
    logp, ref, grad = (-torch.rand(256)).requires_grad_(), -torch.rand(256), torch.randn(256)

    def call():
        d = ref - logp
        return torch.autograd.grad(torch.exp(d) - d - 1, [logp], grad)

    call.inputs = (logp, ref, grad)
    return call


def _round_median_us(call, per_round: int = 200) -> float:
    times = []
    for _ in range(per_round):
        t = time.perf_counter()
        call()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


def _floor():
    """The least a Python-level differentiable op costs: a torch.autograd.Function of two [4, 64] inputs whose
    forward allocates its 0-dim output and whose backward returns two preallocated gradients, forward +
    backward through torch.autograd.grad, as the cases are called."""
    logp, ent = (-torch.rand(4, 64)).requires_grad_(), torch.rand(4, 64).requires_grad_()
    grads = (torch.empty_like(logp), torch.empty_like(ent))

    class Op(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a, b):
            return a.new_empty(())

        @staticmethod
        def backward(ctx, g):
            return grads

    return lambda: torch.autograd.grad(Op.apply(logp, ent), [logp, ent])


def interleaved_medians(calls: dict, rounds: int, warmup: int = 20) -> dict:
    """{key: µs}, each call's least disturbed round median: `calls` maps a key to a callable, or to (callable,
    calls a round; 200 for a bare callable). After `warmup` calls of each, every round times every call in
    turn, so that a disturbance of this shared machine slows one round of everything, not one call's every
    round."""
    timed = {key: call if isinstance(call, tuple) else (call, 200) for key, call in calls.items()}
    for call, _ in timed.values():
        for _ in range(warmup):
            call()
    best = dict.fromkeys(timed, float("inf"))
    for _ in range(rounds):
        for key, (call, per_round) in timed.items():
            best[key] = min(best[key], _round_median_us(call, per_round))
    return best


def median_us(call, rounds: int = 5) -> float:
    """The least disturbed (a shared machine) of `rounds` medians of 200 calls, after 20 warm-up calls."""
    for _ in range(20):
        call()
    return min(_round_median_us(call) for _ in range(rounds))


# ---- Triton's launch path (run in a child process: TRITON_INTERPRET off) -----------------------------------


# Triton launch paths timed apart (triton_run_us) beside CASES': the frozen head's vocabulary stream
# (benchmarks/frozen_chunk_host.py times its Python per chunk), bf16, 512 rows, 4096 columns in 4 chunks.
FROZEN_CHUNK = dict(n=512, d=256, vocab=4096, columns=1024)


def _frozen_chunk_case():
    """(call, make_inputs) of the frozen head's linear_logprobs, forward + backward, Triton flavor, its chunks
    FROZEN_CHUNK's columns wide."""
    import rlkernels as rk
    from rlkernels.fake_cuda import Maker
    from rlkernels.ops import logp_jacobian

    n, d, vocab, columns = (FROZEN_CHUNK[k] for k in ("n", "d", "vocab", "columns"))

    def make(mode):
        m = Maker(torch.device("cuda"), mode)
        hidden = m.randn(n, d, dtype=torch.bfloat16, grad=True)
        return dict(hidden=hidden, weight=m.randn(vocab, d, dtype=torch.bfloat16), labels=m.labels(vocab, n))

    def call(**x):
        with mock.patch.multiple(logp_jacobian, GPU_COLUMNS=columns, GPU_MIN_COLUMNS=columns):
            return rk.linear_logprobs(**x, backend="triton")

    return call, make


def _fake_case(case: str):
    """(call, make_inputs) of a case's Triton flavor on fake CUDA tensors at a GPU-sized shape."""
    from rlkernels.fake_cuda import Maker

    if case == "frozen_chunk":
        return _frozen_chunk_case()
    if case == "policy_loss":
        call = _policy_call("triton")
        return call, lambda mode: _policy_inputs(64, 4096, Maker(torch.device("cuda"), mode))
    kind = "k1+" if case.endswith("k1+") else "k3"
    call = _kl_call("triton", kind)

    def make(mode):
        m = Maker(torch.device("cuda"), mode)
        return dict(logp=m.logp(4096, grad=True), ref_logp=m.logp(4096))

    return call, make


def _recorded_launches(case: str) -> list:
    """The Triton flavor's launches of one call, forward + backward: (kernel, args, grid, kwargs)."""
    import gpu_cost
    from triton.runtime.jit import JITFunction

    launches = []
    recorded = gpu_cost._triton_recorded

    @contextlib.contextmanager
    def keeping(cost):
        with recorded(cost):
            record = JITFunction.run

            def keep(self, *args, grid, warmup, **kwargs):
                launches.append((self, args, grid, kwargs))
                return record(self, *args, grid=grid, warmup=warmup, **kwargs)

            JITFunction.run = keep
            try:
                yield
            finally:
                JITFunction.run = record

    gpu_cost._triton_recorded = keeping
    try:
        gpu_cost.count(*_fake_case(case))
    finally:
        gpu_cost._triton_recorded = recorded
    return launches


def triton_run_us(case: str, rounds: int) -> dict:
    """{"us": the sum over the case's Triton launches of JITFunction.run's time, "launches": how many,
    "runs": how many times the cached kernel was reached (every timed call of every launch, when the
    binder's key found it)}. The driver is stubbed (device 0, stream 0, an sm_90 target) and the cached
    compiled kernel is a no-op; fake tensors become small CPU tensors (the binder reads their dtype and the
    alignment of their data pointer)."""
    import triton.knobs as knobs
    import triton.runtime.jit as jit
    from triton.backends.compiler import GPUTarget

    launches = _recorded_launches(case)
    target = GPUTarget("cuda", 90, 32)
    jit.driver = types.SimpleNamespace(
        active=types.SimpleNamespace(
            get_current_device=lambda: 0,
            get_current_stream=lambda device: 0,
            get_current_target=lambda: target,
        )
    )

    class NoKernel:
        function, packed_metadata = 0, ()

        def launch_metadata(self, grid, stream, *args):
            return None

        runs = 0

        def run(self, *args):
            NoKernel.runs += 1

    def real(a):
        return torch.empty(min(a.numel(), 16), dtype=a.dtype) if isinstance(a, torch.Tensor) else a

    total = 0.0
    for kernel, args, grid, kwargs in launches:
        args, kwargs = tuple(map(real, args)), {k: real(v) for k, v in kwargs.items()}
        caches = kernel.create_binder()
        kernel.device_caches[0] = caches
        kernel_cache, key_cache, _target, _backend, binder = caches
        # as JITFunction.run: a launch's own debug (the asserting kernels', _device_assert) or the kernel's
        options = dict(kwargs, debug=kwargs.get("debug", kernel.debug) or knobs.runtime.debug)
        options["instrumentation_mode"] = knobs.compilation.instrumentation_mode
        if hasattr(
            knobs.compilation, "fpsan_homomorphic_casts"
        ):  # Triton 3.9's; 3.6 (the GPU machines') lacks it
            options["fpsan_homomorphic_casts"] = knobs.compilation.fpsan_homomorphic_casts
        _bound, specialization, opts = binder(*args, **options)
        kernel_cache[jit.compute_cache_key(key_cache, specialization, opts)] = NoKernel()
        launch = kernel[grid]
        total += median_us(lambda launch=launch, args=args, kwargs=kwargs: launch(*args, **kwargs), rounds)
    return {"us": total, "launches": len(launches), "runs": NoKernel.runs}


def triton_run_child(case: str, rounds: int) -> dict:
    """triton_run_us in a child process with TRITON_INTERPRET off."""
    env = dict(os.environ, TRITON_INTERPRET="0")
    here = os.path.dirname(os.path.abspath(__file__))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH")) if p)
    out = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--triton-run", case, "--rounds", str(rounds)],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return json.loads(out.stdout.splitlines()[-1])


def measure(cases, rounds: int, providers=PROVIDERS) -> dict:
    """{case: {provider: {"python": us, "triton_run": us, "calls": host_calls}}, "control": us, "floor":
    us}. The calls and the control are interleaved, one median of 200 calls each per round, and each keeps
    its least disturbed round: a disturbance of this shared machine then slows one round of everything, not
    one call's every round."""
    _stub_triton()
    torch.set_num_threads(1)
    calls = {("control", ""): _control(), ("floor", ""): _floor()}
    calls.update({(case, provider): CASES[case](provider) for case in cases for provider in providers})
    best = interleaved_medians(calls, rounds)
    out = {"control": best["control", ""], "floor": best["floor", ""]}
    for case in cases:
        run = 0.0
        if "triton" in providers:  # the least of two children: a child is one stretch of time
            run = min(triton_run_child(case, rounds)["us"] for _ in range(2))
        out[case] = {
            p: {
                "python": best[case, p],
                "triton_run": run if p == "triton" else 0.0,
                "calls": host_calls(calls[case, p]),
            }
            for p in providers
        }
    return out


def native_policy_calls():
    """(forward, op, args, leaves) of policy_loss's native (C++ CPU) flavor: the public forward call, and the
    C++ autograd op with the arguments that call gave it (the forward less `op(*args)` is the Python around
    the op)."""
    import rlkernels as rk
    from rlkernels.ops import policy_loss as ops

    x = _policy_inputs(4, 64)

    def forward():
        return rk.policy_loss(**x, **POLICY_KW, backend="cpu")[0]

    seen = {}
    op = ops._native_eager

    def spy(*args):
        seen["args"] = args
        return op(*args)

    ops._native_eager = spy
    try:
        forward()
    finally:
        ops._native_eager = op
    if "args" not in seen:
        raise RuntimeError("policy_loss did not reach its C++ autograd op (backend='cpu', plain eager)")
    return forward, op, seen["args"], [x["logp"], x["entropy"]]


def native_policy_parts(rounds: int = 5) -> dict[str, float]:
    """policy_loss's host time on the native (C++ CPU) flavor split in three, in µs: the forward call, the C++
    op alone, and the backward (`torch.autograd.grad` through the C++ node)."""
    forward, op, args, leaves = native_policy_calls()
    full = median_us(lambda: torch.autograd.grad(forward(), leaves), rounds)
    fwd = median_us(forward, rounds)
    return {"forward": fwd, "op": median_us(lambda: op(*args), rounds), "backward": full - fwd}


def units_main(doc: str, measure, report, argv=None) -> int:
    """The command line of a tool that measures host work in control units (frozen_chunk_host.py,
    linear_policy_loss_host.py): `--rounds`, and `--json` for the measurement `measure(rounds)` as one JSON
    object (what gpu_model.py reads), else `report(result)`'s lines."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="print the measurement as one JSON object")
    args = parser.parse_args(argv)
    result = measure(args.rounds)
    print(json.dumps(result) if args.json else "\n".join(report(result)))
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--providers", nargs="+", default=list(PROVIDERS), choices=ALL_PROVIDERS)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="print the measurements as one JSON object")
    parser.add_argument(
        "--triton-run", choices=[*CASES, "frozen_chunk"], help=argparse.SUPPRESS
    )  # the child process
    parser.add_argument(
        "--native-parts", action="store_true", help="policy_loss's C++ flavor: Python, C++ op, backward"
    )
    args = parser.parse_args(argv)
    if args.native_parts:
        torch.set_num_threads(1)
        parts = native_policy_parts(args.rounds)
        print(
            f"policy_loss cpu: forward {parts['forward']:.1f} us (the C++ op {parts['op']:.1f}, the Python "
            f"around it {parts['forward'] - parts['op']:.1f}), backward {parts['backward']:.1f} us"
        )
        return 0
    if args.triton_run:
        torch.set_num_threads(1)
        print(json.dumps(triton_run_us(args.triton_run, args.rounds)))
        return 0
    result = measure(args.cases, args.rounds, args.providers)
    if args.json:
        print(json.dumps(result))
        return 0
    control = result["control"]
    print(f"control {control:.1f} us (the unit)")
    print(f"floor   {result['floor']:.1f} us = {result['floor'] / control:.2f} units (a Python autograd op)")
    for case in args.cases:
        for provider, parts in result[case].items():
            total = parts["python"] + parts["triton_run"]
            print(
                f"{case:15s} {provider:8s} python {parts['python']:7.1f} us  "
                f"triton_run {parts['triton_run']:5.1f} us"
                f"  = {total / control:5.2f} units  ({parts['calls']} calls from Python)",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
