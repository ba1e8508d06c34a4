"""linear_policy_loss and linear_preference_loss on the harness: the losses fused from hidden states against
their eager references (backend="reference": the full logits, then the loss). The floor is the bare GEMMs
each must do (benchmarks/bench_linear_logprobs.py has the log-probs alone and the peers;
linear_policy_loss_vs_peers.py and linear_preference_loss.py compare with Liger and cut-cross-entropy).
linear_policy_loss also runs with a frozen head (LoRA: no gradient for the weight), over its 2 GEMMs."""

from __future__ import annotations

import torch
from harness import Case, Floor
from providers import eager, rlkernels

import rlkernels as rk

# (rows, hidden, vocabulary): small shapes a 2-core CPU finishes in minutes; an LLM step on a GPU.
SIZES = {"small": [(512, 256, 4096)], "llm": [(8192, 4096, 128256)]}


def _inputs(n: int, d: int, vocab: int, dtype: torch.dtype, device: torch.device, frozen_head: bool = False):
    def make():
        # Drawn where they are used: on a GPU, a [V, D] weight drawn on the CPU takes seconds per case.
        gen = torch.Generator(device=device).manual_seed(n + d + vocab)
        b, on = 8, {"generator": gen, "device": device}
        hidden = torch.randn(b, n // b, d, **on)
        weight = torch.randn(vocab, d, **on) / d**0.5
        labels = torch.randint(0, vocab, (b, n // b), **on)
        x = {
            "hidden": hidden.to(dtype).requires_grad_(),
            "weight": weight.to(dtype).requires_grad_(not frozen_head),
            "labels": labels, "old_logp": -3 * torch.rand(b, n // b, **on),
            "advantages": torch.randn(b, **on),
            "mask": torch.rand(b, n // b, **on) > 0.1,
        }  # fmt: skip
        return x

    return make


def _gemms(x: dict) -> tuple[torch.Tensor, ...]:
    """The GEMMs of a fused loss: the logits and d hidden, and d weight where the head is trainable."""
    h = x["hidden"].detach().reshape(-1, x["hidden"].shape[-1])
    w = x["weight"]
    z = h @ w.detach().t()
    return (z, z @ w.detach(), z.t() @ h) if w.requires_grad else (z, z @ w)


def cases(shapes: str, device: torch.device) -> list[Case]:
    out = []
    dtype = torch.bfloat16 if shapes == "llm" else torch.float32
    for n, d, vocab in SIZES[shapes]:

        def policy(backend, **x):
            loss, _ = rk.linear_policy_loss(
                x["hidden"],
                x["weight"],
                x["labels"],
                x["old_logp"],
                x["advantages"],
                x["mask"],
                backend=backend,
            )
            return loss

        def preference(backend, **x):
            return rk.linear_preference_loss(x["hidden"], x["weight"], x["labels"], beta=0.1, backend=backend)

        variants = (
            ("linear_policy_loss", policy, False), ("linear_policy_loss", policy, True),
            ("linear_preference_loss", preference, False),
        )  # fmt: skip
        for op, fn, frozen in variants:
            out.append(
                Case(
                    op=op,
                    shape=f"N={n} D={d} V={vocab}" + (" frozen head" if frozen else ""),
                    dtype=dtype,
                    make_inputs=_inputs(n, d, vocab, dtype, device, frozen),
                    providers=[eager(lambda fn=fn, **x: fn("reference", **x)), *rlkernels(fn, device)],
                    modes=("full",),
                    floors=[Floor("full", "2 GEMMs" if frozen else "3 GEMMs", fn=lambda **x: _gemms(x))],
                )
            )
    return out
