"""rk.linear_policy_loss (forward + backward) against its GEMM floors, eager PyTorch, torch.compile,
cut-cross-entropy + the loss, and Liger-Kernel's LigerFusedLinearGRPOLoss, at the same loss settings: time
(interleaved rounds, min / median / max) and peak working memory (peak minus the returned gradients).

Issue 12's CPU setting: fp32, D=1024, V=128256, N=2048 tokens (4 sequences of 512), clip objective, agg
token-mean (Liger's loss_type="dapo"), no KL, no entropy. Trainable head: the floor is 3 GEMMs (logits,
d hidden, d weight); frozen head (weight.requires_grad=False, LoRA): 2 GEMMs. From the checkout:

    PYTHONPATH=. python benchmarks/linear_policy_loss_vs_peers.py [--reps 3] [--shape B T D V]

The peers are optional (`pip install liger-kernel cut-cross-entropy`); a missing one is reported and skipped.
Every provider's loss is checked against eager's before timing.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import statistics
import time

import torch

import rlkernels as rk
from rlkernels.memory import cpu_peak_bytes
from rlkernels.reference.policy_loss import linear_policy_loss as eager_loss
from rlkernels.reference.policy_loss import policy_loss as eager_policy_loss

CLIP = 0.2


def make_inputs(b: int, t: int, d: int, v: int, dtype=torch.float32):
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(b, t, d, generator=gen).to(dtype)
    weight = (torch.randn(v, d, generator=gen) * (3.0 / d**0.5)).to(dtype)
    labels = torch.randint(0, v, (b, t), generator=gen)
    mask = torch.ones(b, t, dtype=torch.bool)
    mask[:, : t // 8] = False  # some prompt-like masked tokens
    with torch.no_grad():  # old log-probs near the current ones, so some ratios clip
        logp = rk.linear_logprobs(hidden, weight, labels)
    old = logp + 0.3 * torch.randn(b, t, generator=gen)
    adv = torch.randn(b, generator=gen)
    return hidden, weight, labels, old, adv, mask


def providers(frozen: bool) -> dict:
    """name -> fn(hidden, weight, labels, old, adv, mask) -> loss, or the reason it cannot run."""

    def rlk(h, w, y, old, adv, m):
        return rk.linear_policy_loss(h, w, y, old, adv, m, clip_low=CLIP, backend="cpu")[0]

    def eager(h, w, y, old, adv, m):
        return eager_loss(h, w, y, old, adv, m, clip_low=CLIP)[0]

    out = {"rlkernels[cpu]": rlk, "eager": eager, "torch.compile": torch.compile(eager, dynamic=False)}
    if importlib.util.find_spec("cut_cross_entropy") is None:
        out["cut-cross-entropy[torch_compile] + loss"] = "cut_cross_entropy is not installed"
    else:
        from cut_cross_entropy import linear_cross_entropy

        def cce(h, w, y, old, adv, m):
            logp = -linear_cross_entropy(h, w, y, reduction="none", impl="torch_compile")
            return eager_policy_loss(logp, old, adv, m, clip_low=CLIP)[0]

        out["cut-cross-entropy[torch_compile] + loss"] = cce
    if importlib.util.find_spec("liger_kernel") is None:
        out["liger-kernel LigerFusedLinearGRPOLoss"] = "liger_kernel is not installed"
    else:
        from liger_kernel.chunked_loss import LigerFusedLinearGRPOLoss

        liger = LigerFusedLinearGRPOLoss(
            beta=0.0, use_ref_model=False, loss_type="dapo", epsilon_low=CLIP, epsilon_high=CLIP
        )

        def liger_fn(h, w, y, old, adv, m):
            return liger(h, w, y, m.long(), adv, old_per_token_logps=old)[0]

        out["liger-kernel LigerFusedLinearGRPOLoss"] = liger_fn
    return out


def floor(frozen: bool):
    """The bare GEMMs: logits [N, V], then d hidden = G @ W and (trainable head) d weight = Gᵀ @ h."""

    def fn(h, w, *_):
        with torch.no_grad():
            h2 = h.reshape(-1, h.shape[-1])
            g = h2 @ w.T
            g @ w
            if not frozen:
                g.T @ h2

    return fn


def run(shape, reps: int) -> list[str]:
    b, t, d, v = shape
    hidden, weight, labels, old, adv, mask = make_inputs(b, t, d, v)
    threads = torch.get_num_threads()
    lines = [f"B={b} T={t} (N={b * t}) D={d} V={v} fp32, {reps} interleaved rounds, {threads} threads"]
    for frozen in (False, True):
        leaves = [hidden] if frozen else [hidden, weight]
        grad_bytes = sum(x.numel() * x.element_size() for x in leaves)
        fns = providers(frozen)
        steps, notes = {}, []
        want = float(eager_loss(hidden, weight, labels, old, adv, mask, clip_low=CLIP)[0])
        for name, fn in fns.items():
            if isinstance(fn, str):
                notes.append(f"  {name}: skipped ({fn})")
                continue

            def step(fn=fn, frozen=frozen):
                h = hidden.detach().requires_grad_()
                w = weight.detach().requires_grad_(not frozen)
                loss = fn(h, w, labels, old, adv, mask)
                loss.backward()
                return float(loss.detach())

            got = step()  # also the warm-up (torch.compile compiles here)
            assert abs(got - want) <= 1e-4 * max(1.0, abs(want)), f"{name}: loss {got} != eager {want}"
            steps[name] = step
        floor_name = f"floor ({2 if frozen else 3} GEMMs)"
        steps[floor_name] = functools.partial(floor(frozen), hidden, weight)
        times = {k: [] for k in steps}
        for _ in range(reps):
            for k, step in steps.items():
                t0 = time.perf_counter()
                step()
                times[k].append(time.perf_counter() - t0)
        memory = {k: cpu_peak_bytes(s) - grad_bytes for k, s in steps.items() if k != floor_name}
        eager_mem = memory["eager"]
        lo_floor, med_floor = min(times[floor_name]), statistics.median(times[floor_name])
        flops = 2 * b * t * d * v * (2 if frozen else 3)
        lines.append(f"{'frozen head' if frozen else 'trainable head'}:")
        for k in steps:
            lo, med, hi = min(times[k]), statistics.median(times[k]), max(times[k])
            mem = ""
            if k in memory:
                share = 100 * memory[k] / eager_mem
                mem = f"  peak working memory {memory[k] / 2**20:8.1f} MiB ({share:5.1f}% of eager)"
            lines.append(
                f"  {k:42s} min {lo:7.3f} s  median {med:7.3f} s  max {hi:7.3f} s  "
                f"vs floor: min {lo / lo_floor:.3f} median {med / med_floor:.3f}  "
                f"{flops / lo / 1e9:6.1f} GFLOP/s (floor's FLOPs){mem}"
            )
        lines += notes
    return lines


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--shape", nargs=4, type=int, default=(4, 512, 1024, 128256), metavar=("B", "T", "D", "V")
    )
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    print("\n".join(run(args.shape, args.reps)))
