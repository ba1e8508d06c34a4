"""TRL 1.16's fused LM head (`trl.trainer.utils._ChunkedLogProbFunction`, what GRPOTrainer scores every model
with) against its stand-in in rlkernels.integrations.trl_grpo (rk.linear_logprobs): forward + backward of
the log-probs (and the entropy GRPOTrainer also asks for), time in interleaved rounds (min / median / max)
and peak working memory (peak minus the returned gradients). Both run in fp32 on the same inputs, with the
head trainable. From the checkout, with the [integrations] extra installed:

    PYTHONPATH=. python benchmarks/trl_fused_head.py [--reps 3] [--shape N D V]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from trl.trainer import utils as trl_utils

from rlkernels.integrations.trl_grpo import LinearLogProbs
from rlkernels.memory import cpu_peak_bytes

TRL_CHUNK = 32768  # GRPOTrainer's vocabulary tile (trl.trainer.utils._CHUNKED_LOGPROB_CHUNK_SIZE)


def run(shape, reps: int) -> list[str]:
    n, d, v = shape
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(n, d, generator=gen)
    weight = torch.randn(v, d, generator=gen) * (3.0 / d**0.5)
    targets = torch.randint(0, v, (n,), generator=gen)
    outputs = ("log_probs", "entropy")
    fns = {"trl 1.16 _ChunkedLogProbFunction": trl_utils._ChunkedLogProbFunction, "rlkernels": LinearLogProbs}

    def step(fn):
        def go():
            h, w = hidden.detach().requires_grad_(), weight.detach().requires_grad_()
            logp, *_ = fn.apply(h, w, None, targets, 1.0, TRL_CHUNK, None, 1.0, outputs)
            logp.sum().backward()
            return logp.detach()

        return go

    steps = {name: step(fn) for name, fn in fns.items()}
    values = {name: s() for name, s in steps.items()}  # also the warm-up
    ref = values["trl 1.16 _ChunkedLogProbFunction"]
    assert torch.allclose(values["rlkernels"], ref, rtol=1e-4, atol=1e-4), "the two heads disagree"
    times = {k: [] for k in steps}
    for _ in range(reps):
        for k, s in steps.items():
            t0 = time.perf_counter()
            s()
            times[k].append(time.perf_counter() - t0)
    grad_bytes = (hidden.numel() + weight.numel()) * 4
    threads = torch.get_num_threads()
    lines = [f"N={n} D={d} V={v} fp32, forward + backward, {reps} interleaved rounds, {threads} threads"]
    for k, s in steps.items():
        peak = cpu_peak_bytes(s) - grad_bytes
        t = times[k]
        lines.append(
            f"  {k:34s} min {min(t):7.3f} s  median {statistics.median(t):7.3f} s  max {max(t):7.3f} s  "
            f"peak working memory {peak / 2**20:8.1f} MiB"
        )
    return lines


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", nargs=3, type=int, default=(2048, 1024, 128256), metavar=("N", "D", "V"))
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    print("\n".join(run(args.shape, args.reps)))
