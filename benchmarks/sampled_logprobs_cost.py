"""What the rollout's sampling distribution costs (docs/sampling.md): forward + backward of
`logprobs_from_logits` and `linear_logprobs` plain (one float temperature, the fused path), with a
per-token temperature tensor, and with top_k / top_p / min_p, against the eager spec that sorts whole rows
(rlkernels/reference, materializing [N, V]). Time in interleaved rounds (min / median / max) and peak
working memory (peak minus the returned gradients). From the checkout:

    PYTHONPATH=. python benchmarks/sampled_logprobs_cost.py [--reps 3] [--shape N D V] [--backend cpu]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import rlkernels as rk
from rlkernels.memory import cpu_peak_bytes

TRUNCATED = dict(top_k=50, top_p=0.95, min_p=0.02)  # vLLM-style rollout settings


def make_inputs(n: int, d: int, v: int):
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(n, d, generator=gen)
    weight = torch.randn(v, d, generator=gen) * (3.0 / d**0.5)
    with torch.no_grad():
        logits = hidden @ weight.t()
        # labels drawn from the truncated distribution, as a rollout would have sampled them
        top = logits.argmax(-1)  # always kept: its logp is finite; the rest of the row decides the others
        kept_logp = rk.logprobs_from_logits(logits, top, backend="reference", **TRUNCATED)
        del kept_logp
        sampled = torch.multinomial(torch.softmax(logits, -1), 1, generator=gen).squeeze(1)
        keep = torch.isfinite(rk.logprobs_from_logits(logits, sampled, backend="reference", **TRUNCATED))
        labels = torch.where(keep, sampled, top)
    temperature = torch.rand(n, generator=gen) * 0.5 + 0.75
    return hidden, weight, logits, labels, temperature


def steps(hidden, weight, logits, labels, temperature, backend):
    """name -> a forward + backward step returning its gradients."""

    def from_logits(fn_backend, **kw):
        def step():
            x = logits.detach().requires_grad_()
            logp = rk.logprobs_from_logits(x, labels, backend=fn_backend, **kw)
            torch.where(torch.isfinite(logp), logp, 0).sum().backward()
            return x.grad

        return step

    def from_hidden(fn_backend, **kw):
        def step():
            h, w = hidden.detach().requires_grad_(), weight.detach().requires_grad_()
            logp = rk.linear_logprobs(h, w, labels, backend=fn_backend, **kw)
            torch.where(torch.isfinite(logp), logp, 0).sum().backward()
            return h.grad, w.grad

        return step

    out = {}
    t = temperature
    for name, make in (("logits", from_logits), ("linear", from_hidden)):
        out[f"{name}: plain (temperature=0.9)"] = make(backend, temperature=0.9)
        out[f"{name}: temperature tensor"] = make(backend, temperature=t)
        out[f"{name}: temperature tensor + top_k/top_p/min_p"] = make(backend, temperature=t, **TRUNCATED)
        out[f"{name}: eager spec (sorts rows), same options"] = make("reference", temperature=t, **TRUNCATED)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--shape", type=int, nargs=3, default=(1024, 1024, 128256), metavar=("N", "D", "V"))
    parser.add_argument("--backend", default="cpu")
    args = parser.parse_args()
    n, d, v = args.shape
    inputs = make_inputs(n, d, v)
    fns = steps(*inputs, args.backend)
    times = {k: [] for k in fns}
    for _ in range(args.reps):  # interleaved: each round runs every step once
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    print(f"fp32, N={n}, D={d}, V={v}, backend={args.backend}, {args.reps} interleaved rounds, fwd + bwd")
    print(f"{'step':58s} {'min s':>7s} {'median':>7s} {'max':>7s} {'peak working MiB':>17s}")
    for k, fn in fns.items():
        grads = fn()
        grads = grads if isinstance(grads, tuple) else (grads,)
        grad_bytes = sum(g.numel() * g.element_size() for g in grads)
        del grads
        mem = (cpu_peak_bytes(fn) - grad_bytes) / 2**20
        lo, med, hi = min(times[k]), statistics.median(times[k]), max(times[k])
        print(f"{k:58s} {lo:7.3f} {med:7.3f} {hi:7.3f} {mem:17.0f}")


if __name__ == "__main__":
    main()
