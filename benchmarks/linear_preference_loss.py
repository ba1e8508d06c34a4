"""rk.linear_preference_loss against Liger-Kernel 0.8.5's chunked preference losses
(liger_kernel.chunked_loss) and eager PyTorch (materialized [N, V] logits, log_softmax, gather, then the
same sequence-level math), for DPO (sigmoid, with a reference model given as hidden states + head), SimPO
and ORPO: forward + backward with a trainable head, time in interleaved rounds (min / median / max) and peak
working memory (CPU allocations seen by the profiler during the first, warm-up call, minus the gradients of
hidden and weight that every provider returns). fp32, the same inputs for all. From the checkout:

    PYTHONPATH=. python benchmarks/linear_preference_loss.py [--reps 2] [--pairs 2] [--seq 256] [--out FILE]

Liger runs with compiled=False (torch.compile of its per-chunk grad_and_value on a 2-core CPU costs minutes
of compilation; on a GPU it runs compiled) and chunk_size=1 (one pair per chunk, its default).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import rlkernels as rk
from rlkernels.memory import cpu_peak_bytes
from rlkernels.reference.preference import PreferenceOptions, paired_loss, sequence_logps

KINDS = {"sigmoid": dict(beta=0.1), "simpo": dict(beta=2.0, gamma=0.5), "orpo": dict(beta=0.1)}


def eager(kind, opts, h, w, labels, ref):
    """Materialized logits: what a plain PyTorch trainer (TRL's CPO/ORPO trainers) computes."""
    o = PreferenceOptions(kind=kind, **opts).checked("eager")
    keep = labels != -100
    logits = h @ w.T
    lp = torch.log_softmax(logits.float(), -1).gather(-1, labels.clamp(min=0)[..., None])[..., 0]
    lp = torch.where(keep, lp, 0)
    seq = sequence_logps(lp.sum(-1), keep.sum(-1), kind)
    B = h.shape[0] // 2
    ref_c = ref_r = None
    if ref is not None:
        with torch.no_grad():
            rlp = torch.log_softmax((ref[0] @ ref[1].T).float(), -1)
            rlp = rlp.gather(-1, labels.clamp(min=0)[..., None])[..., 0]
            rs = torch.where(keep, rlp, 0).sum(-1)
        ref_c, ref_r = rs[:B], rs[B:]
    per, _ = paired_loss(seq[:B], seq[B:], ref_c, ref_r, o)
    loss = per.mean()
    if o.nll_coef:
        loss = loss - o.nll_coef * lp[:B].sum() / keep[:B].sum()
    return loss


def liger(kind, opts, h, w, labels, ref):
    from liger_kernel.chunked_loss import (
        LigerFusedLinearDPOLoss,
        LigerFusedLinearORPOLoss,
        LigerFusedLinearSimPOLoss,
    )

    if kind == "sigmoid":
        fn = LigerFusedLinearDPOLoss(beta=opts["beta"], compiled=False, use_ref_model=True)
        return fn(w, h, labels, None, ref_input=ref[0], ref_weight=ref[1])[0]
    if kind == "simpo":
        fn = LigerFusedLinearSimPOLoss(
            beta=opts["beta"], gamma=opts["gamma"], compute_nll_loss=False, compiled=False
        )
        return fn(w, h, labels)[0]
    fn = LigerFusedLinearORPOLoss(beta=opts["beta"], compiled=False)
    return fn(w, h, labels)[0]


def ours(kind, opts, h, w, labels, ref):
    ref_kw = {} if ref is None else dict(ref_hidden=ref[0], ref_weight=ref[1])
    return rk.linear_preference_loss(h, w, labels, kind=kind, **opts, **ref_kw)[0]


PROVIDERS = {"rlkernels": ours, "liger 0.8.5 chunked": liger, "eager (materialized)": eager}


def run(pairs: int, seq: int, d: int, v: int, reps: int, kinds) -> list[str]:
    gen = torch.Generator().manual_seed(0)
    R = 2 * pairs
    hidden = torch.randn(R, seq, d, generator=gen)
    weight = torch.randn(v, d, generator=gen) * (1.0 / d**0.5)
    labels = torch.randint(0, v, (R, seq), generator=gen)
    labels[:, : seq // 8] = -100  # the prompt
    ref_hidden = hidden + 0.1 * torch.randn(R, seq, d, generator=gen)
    ref = (ref_hidden, weight + 0.01 * torch.randn(v, d, generator=gen))
    grad_bytes = (hidden.numel() + weight.numel()) * 4
    threads = torch.get_num_threads()
    lines = [
        f"{pairs} pairs = {R} sequences x {seq} tokens ({seq // 8} prompt tokens ignored each), D={d}, "
        f"V={v}, fp32, trainable head, forward + backward, {reps} interleaved timed rounds after a profiled "
        f"warm-up, {threads} threads",
        "",
        "| kind | provider | min s | median s | max s | peak working memory MiB |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for kind in kinds:
        opts = KINDS[kind]
        kind_ref = ref if kind == "sigmoid" else None

        def step(fn, kind=kind, opts=opts, kind_ref=kind_ref):
            def go():
                h, w = hidden.detach().requires_grad_(), weight.detach().requires_grad_()
                loss = fn(kind, opts, h, w, labels, kind_ref)
                loss.backward()
                return loss.detach()

            return go

        steps = {name: step(fn) for name, fn in PROVIDERS.items()}
        peaks, values = {}, {}
        for name, s in steps.items():  # the warm-up, profiled
            box = {}
            peaks[name] = cpu_peak_bytes(lambda s=s, box=box: box.setdefault("v", s())) - grad_bytes
            values[name] = box["v"]
        want = values["eager (materialized)"]
        for name, got in values.items():
            assert torch.allclose(got, want, rtol=1e-4, atol=1e-5), f"{kind}: {name} {got} != eager {want}"
        times = {k: [] for k in steps}
        for _ in range(reps):
            for k, s in steps.items():
                t0 = time.perf_counter()
                s()
                times[k].append(time.perf_counter() - t0)
        for k in steps:
            t = times[k]
            lines.append(
                f"| {kind} | {k} | {min(t):.2f} | {statistics.median(t):.2f} | {max(t):.2f} | "
                f"{peaks[k] / 2**20:.1f} |"
            )
        print("\n".join(lines[-len(steps) :]), flush=True)
    return lines


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--dim", type=int, default=1024)
    parser.add_argument("--vocab", type=int, default=128256)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--kinds", nargs="+", default=list(KINDS), choices=list(KINDS))
    parser.add_argument("--out", default=None, help="also write the table to this markdown file")
    args = parser.parse_args()
    out = run(args.pairs, args.seq, args.dim, args.vocab, args.reps, args.kinds)
    print("\n".join(out))
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(out) + "\n")
