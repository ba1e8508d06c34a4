"""logprobs_from_logits: log-probs (and entropy) of labels from logits a caller already holds, against eager
log_softmax + gather (the reference: a full-size fp32 copy of the logits) and its torch.compile. The floor is
the bytes the op must move: the logits read once forward (and once more plus the gradient written once
backward), the labels and the per-row outputs."""

from __future__ import annotations

import torch
from harness import Case, Floor
from providers import standard

import rlkernels as rk
from rlkernels.reference.logprobs import logprobs_from_logits as reference

# (rows, vocabulary): 8192 x 151936 is an LLM step's logits block (bf16: 2.5 GB).
SIZES = {"small": [(256, 32000)], "llm": [(4096, 128256), (8192, 151936)]}


def _inputs(n: int, vocab: int, dtype: torch.dtype, device: torch.device):
    def make():
        # Drawn where they are used: on a GPU, [N, V] logits drawn on the CPU take seconds per case.
        gen = torch.Generator(device=device).manual_seed(n + vocab)
        logits = torch.randn(n, vocab, generator=gen, device=device) * 2
        labels = torch.randint(0, vocab, (n,), generator=gen, device=device)
        labels[::7] = -100  # prompt tokens
        return {"logits": logits.to(dtype).requires_grad_(), "labels": labels}

    return make


def cases(shapes: str, device: torch.device) -> list[Case]:
    out = []
    dtype = torch.bfloat16 if shapes == "llm" else torch.float32
    for n, vocab in SIZES[shapes]:

        def eager_fn(logits, labels):
            return reference(logits, labels, return_entropy=True)

        def kernel(logits, labels, backend):
            return rk.logprobs_from_logits(logits, labels, return_entropy=True, backend=backend)

        logit_bytes = n * vocab * torch.tensor([], dtype=dtype).element_size()
        rows = n * (8 + 4 + 4)  # labels int64, logp and entropy fp32
        out.append(
            Case(
                op="logprobs_from_logits",
                shape=f"N={n} V={vocab} entropy",
                dtype=dtype,
                make_inputs=_inputs(n, vocab, dtype, device),
                providers=standard(eager_fn, kernel, device),
                modes=("no_grad", "forward", "backward", "full"),
                floors=[
                    Floor("no_grad", "bytes", min_bytes=logit_bytes + rows),
                    Floor("forward", "bytes", min_bytes=logit_bytes + rows),
                    Floor("backward", "bytes", min_bytes=2 * logit_bytes + rows),
                    Floor("full", "bytes", min_bytes=3 * logit_bytes + rows),
                ],
            )
        )
    return out
