"""The host time of a call with its kernels stubbed out: what the Python and the dispatcher cost per call,
measured on this machine's CPU (no GPU), for benchmarks/gpu_model.py.

The call runs on small CPU tensors (its tensor ops' arithmetic is then negligible against their dispatch):
the Triton kernels are not run (TRITON_INTERPRET=1 with each launch replaced by a no-op that marks an `ok`
output valid), the native ops run their C++ CPU kernels (a binding's overhead stands for the CUDA
binding's), the reference runs as is. Printed: the median over rounds of the per-call time, forward +
backward, in microseconds.

    python benchmarks/gpu_host_time.py [--cases policy_loss kl_penalty] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

POLICY_KW = dict(clip_low=0.2, clip_high=0.28, dual_clip=3.0, kl_coef=0.05, kl_kind="k3", entropy_coef=0.01)


def _stub_triton():
    """Triton launches become no-ops (an `ok` flag among the arguments is set valid)."""
    from triton.runtime.interpreter import InterpretedFunction

    def launch(self, *args, grid, warmup, **kwargs):
        for a in args:
            if isinstance(a, torch.Tensor) and a.dtype == torch.bool and a.dim() == 0:
                a.fill_(True)

    InterpretedFunction.run = launch


def _policy(provider: str):
    import rlkernels as rk
    from rlkernels.reference.policy_loss import policy_loss as reference

    B, T = 4, 64
    logp = (-torch.rand(B, T)).requires_grad_()
    ent = torch.rand(B, T).requires_grad_()
    x = dict(logp=logp, old_logp=-torch.rand(B, T), advantages=torch.randn(B), mask=torch.rand(B, T) > 0.2,
             ref_logp=-torch.rand(B, T), entropy=ent)  # fmt: skip

    def call():
        if provider == "eager":
            loss, _ = reference(**x, **POLICY_KW)
        else:
            loss, _ = rk.policy_loss(**x, **POLICY_KW, backend=provider)
        torch.autograd.grad(loss, [logp, ent])

    return call


def _kl(provider: str, kind: str = "k3"):
    import rlkernels as rk
    from rlkernels.reference.kl import kl_penalty as reference

    logp, ref = (-torch.rand(256)).requires_grad_(), -torch.rand(256)
    grad = torch.randn(256)

    def call():
        if provider == "eager":
            out = reference(logp, ref, kind)
        else:
            out = rk.kl_penalty(logp, ref, kind, backend=provider)
        torch.autograd.grad(out, [logp], grad)

    return call


CASES = {"policy_loss": _policy, "kl_penalty": _kl}
PROVIDERS = ("eager", "triton", "cpu")


def median_us(call, rounds: int = 5, per_round: int = 200) -> float:
    for _ in range(20):
        call()
    medians = []
    for _ in range(rounds):
        times = []
        for _ in range(per_round):
            t = time.perf_counter()
            call()
            times.append(time.perf_counter() - t)
        medians.append(statistics.median(times))
    return min(medians) * 1e6  # the least disturbed round (a shared machine)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    _stub_triton()
    torch.set_num_threads(1)
    for case in args.cases:
        for provider in PROVIDERS:
            us = median_us(CASES[case](provider), args.rounds)
            print(f"{case:12s} {provider:8s} {us:8.1f} us", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
