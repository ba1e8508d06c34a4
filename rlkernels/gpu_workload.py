"""One short forward + backward call of every op on small, odd-sized CUDA tensors: the program that
`python -m rlkernels selftest` runs under compute-sanitizer (memcheck, racecheck).

    python -m rlkernels.gpu_workload [--backends cuda triton]
    python -m rlkernels.gpu_workload --device cpu        # a dry run on the C++ CPU kernels
    python -m rlkernels.gpu_workload --dtypes float32    # one dtype

Sizes are odd (not multiples of a block or a warp) so that the kernels' tails, partial warps and
early-returning threads run; every float dtype runs. Prints one line per call; exits non-zero if a call
raises.
"""

from __future__ import annotations

import argparse
import sys

import torch

import rlkernels as rk

DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def _calls(backend: str, dtype: torch.dtype, device: torch.device):
    """(name, thunk) pairs; each thunk runs a forward and a backward."""
    g = torch.Generator(device="cpu").manual_seed(0)

    def rand(*shape, grad=False, scale=1.0):
        t = (torch.randn(*shape, generator=g) * scale).to(device=device, dtype=dtype)
        return t.requires_grad_() if grad else t

    B, T, N, D, V = 5, 133, 77, 40, 1031
    logp = rand(B, T, scale=0.5, grad=True)
    old = logp.detach() + rand(B, T, scale=0.1)
    ref = logp.detach() + rand(B, T, scale=0.1)
    mask = torch.rand(B, T, generator=g).to(device) > 0.2
    adv = rand(B)

    def backward(out):
        loss = out[0] if isinstance(out, tuple) else out
        loss.float().sum().backward()

    yield "kl_penalty", lambda: backward(rk.kl_penalty(logp, ref, "k3", backend=backend))
    yield (
        "policy_loss",
        lambda: backward(
            rk.policy_loss(logp, old, adv, mask, ref_logp=ref, kl_coef=0.1, dual_clip=3.0, backend=backend)
        ),
    )
    yield (
        "policy_loss[sequence]",
        lambda: backward(
            rk.policy_loss(logp, old, adv, mask, level="sequence", agg="seq-mean-token-mean", backend=backend)
        ),
    )
    values = rand(B, T, grad=True)
    yield (
        "value_loss",
        lambda: backward(rk.value_loss(values, values.detach(), rand(B, T), mask, backend=backend)),
    )
    entropy = rand(B, T, grad=True)
    yield (
        "agg_loss",
        lambda: backward(rk.agg_loss(entropy, mask, "seq-mean-token-mean", backend=backend)),
    )
    # verl's views, read where they lie: log-probs and values sliced out of padded rows ([:, 8:-1] of
    # [B, T + 9]: rows off a 16-byte boundary), the mask an int64 attention mask's [:, -T:]
    wide = rand(B, T + 9, scale=0.5, grad=True)
    view_mask = torch.cat([torch.ones(B, 9, dtype=torch.int64, device=device), mask.long()], 1)[:, 9:]
    yield (
        "policy_loss[views]",
        lambda: backward(
            rk.policy_loss(wide[:, 8:-1], old, adv, view_mask, ref_logp=ref, kl_coef=0.1, backend=backend)
        ),
    )
    yield "kl_penalty[views]", lambda: backward(rk.kl_penalty(wide[:, 8:-1], ref, "k3", backend=backend))
    yield "agg_loss[views]", lambda: backward(rk.agg_loss(wide[:, 8:-1], view_mask, backend=backend))
    yield (
        "value_loss[views]",
        lambda: backward(rk.value_loss(wide[:, 8:-1], old, rand(B, T), view_mask, backend=backend)),
    )
    rewards = rand(3 * 7)
    yield "group_advantages", lambda: rk.group_advantages(rewards, group_size=7, backend=backend)
    ids = torch.randint(0, 4, (21,), generator=g).to(device)
    yield "group_advantages[ids]", lambda: rk.group_advantages(rewards, group_ids=ids, backend=backend)
    # The outcome estimators whose group walks run in the last of a block (program) per mask row: opo's
    # lengths, the whitening's moments (gdpo, reinforce_plus_plus_baseline), every mask kind.
    row_mask = torch.rand(21, 37, generator=g).to(device) > 0.3
    for kind, m in (("bool", row_mask), ("int64", row_mask.long()), ("float", row_mask.to(dtype) * 0.5)):
        yield f"opo[{kind} mask]", lambda m=m: rk.opo_advantages(rewards, m, group_ids=ids, backend=backend)
        yield (
            f"gdpo[{kind} mask]",
            lambda m=m: rk.gdpo_advantages(
                torch.stack([rewards, -rewards], 1), m, group_ids=ids, backend=backend
            ),
        )
    yield (
        "reinforce_plus_plus_baseline",
        lambda: rk.reinforce_plus_plus_baseline_advantages(rewards, row_mask, group_ids=ids, backend=backend),
    )
    r, v = rand(B, T), rand(B, T)
    yield "gae", lambda: rk.gae(r, v, mask, gamma=0.99, lam=0.95, whiten=True, backend=backend)
    cu = torch.tensor([0, 3, 3, 60, B * T], dtype=torch.int32, device=device)
    yield (
        "gae[packed]",
        lambda: rk.gae(r.flatten(), v.flatten(), mask.flatten(), cu_seqlens=cu, backend=backend),
    )
    yield "discounted_returns", lambda: rk.discounted_returns(r, mask, gamma=0.99, backend=backend)
    hidden, weight, bias = rand(N, D, grad=True), rand(V, D, grad=True, scale=0.2), rand(V, grad=True)
    labels = torch.randint(0, V, (N,), generator=g).to(device)
    labels[::7] = -100
    yield (
        "linear_logprobs",
        lambda: backward(
            rk.linear_logprobs(
                hidden, weight, labels, bias=bias, softcap=30.0, return_entropy=True, backend=backend
            )
        ),
    )
    yield (
        "linear_logprobs[chunked]",
        lambda: backward(rk.linear_logprobs(hidden, weight, labels, chunk_size=100, backend=backend)),
    )
    logits = rand(N, V, grad=True)
    yield (
        "logprobs_from_logits",
        lambda: backward(
            rk.logprobs_from_logits(logits, labels, temperature=0.7, return_entropy=True, backend=backend)
        ),
    )
    batched = rand(3, N // 3 + 1, V, grad=True)  # read in place as [B, T, V] (its last position dropped)
    rows = labels[: 3 * (N // 3)].view(3, -1)
    yield (
        "logprobs_from_logits[logits[:, :-1]]",
        lambda: backward(
            rk.logprobs_from_logits(batched[:, :-1], rows, return_entropy=True, backend=backend)
        ),
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rlkernels.gpu_workload", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--backends", nargs="+", choices=["cuda", "triton", "cpu"], help="default: cuda triton"
    )
    parser.add_argument(
        "--device", default="cuda", choices=["cuda", "cpu"], help="cpu: a dry run of this script"
    )
    parser.add_argument(
        "--dtypes", nargs="+", choices=[str(d).removeprefix("torch.") for d in DTYPES], help="default: all"
    )
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_workload: no CUDA device", file=sys.stderr)
        return 2
    device = torch.device(args.device)
    backends = args.backends or (["cuda", "triton"] if device.type == "cuda" else ["cpu"])
    failed = 0
    for backend in backends:
        for dtype in [getattr(torch, d) for d in args.dtypes] if args.dtypes else DTYPES:
            for name, call in _calls(backend, dtype, device):
                try:
                    call()
                    if device.type == "cuda":
                        torch.cuda.synchronize()
                    status = "ok"
                except Exception as e:  # report every failing call, then fail
                    failed += 1
                    status = f"FAILED {type(e).__name__}: {str(e).splitlines()[0][:200]}"
                print(f"{backend:7s} {str(dtype).removeprefix('torch.'):9s} {name:28s} {status}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
