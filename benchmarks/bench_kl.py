"""kl_penalty: per-token KL estimators (elementwise: the floor is the bytes they must move)."""

from __future__ import annotations

import torch
from harness import Case, Floor, TrafficCase
from providers import standard

import rlkernels as rk
from rlkernels.reference.kl import kl_penalty as kl_reference

SIZES = {"small": [1 << 16, 1 << 22], "llm": [1 << 22, 1 << 24]}  # tokens; 2^22 = 512 sequences x 8k tokens


def _inputs(n: int, dtype: torch.dtype, device: torch.device):
    def make():
        gen = torch.Generator(device="cpu").manual_seed(n)
        logp = -torch.rand(n, generator=gen) * 5
        ref = logp + 0.5 * torch.randn(n, generator=gen)
        return {"logp": logp.to(device, dtype).requires_grad_(), "ref_logp": ref.to(device, dtype)}

    return make


def cases(shapes: str, device: torch.device) -> list[Case]:
    out = []
    for n in SIZES[shapes]:
        for kind in ("k3", "k1+"):
            dtype = torch.float32
            b = torch.tensor([], dtype=dtype).element_size() * n

            def reference(logp, ref_logp, kind=kind):
                return kl_reference(logp, ref_logp, kind, 10.0)

            def kernel(logp, ref_logp, backend, kind=kind):
                return rk.kl_penalty(logp, ref_logp, kind, clamp=10.0, backend=backend)

            out.append(
                Case(
                    op="kl_penalty",
                    shape=f"N={n} {kind}",
                    dtype=dtype,
                    make_inputs=_inputs(n, dtype, device),
                    providers=standard(reference, kernel, device),
                    modes=("no_grad", "forward", "backward", "full"),
                    # forward reads logp, ref and writes kl; backward reads grad, logp, ref, writes d logp.
                    floors=[
                        Floor("no_grad", "bytes", min_bytes=3 * b),
                        Floor("forward", "bytes", min_bytes=3 * b),
                        Floor("backward", "bytes", min_bytes=4 * b),
                        Floor("full", "bytes", min_bytes=7 * b),
                    ],
                )
            )
    return out


def traffic_cases() -> list[TrafficCase]:
    """The Triton kernels' bytes against the minimum (under the interpreter, on CPU tensors)."""
    from rlkernels.triton.kl import kl_penalty_backward, kl_penalty_forward

    n = 100_003  # not a multiple of the block: the masked tail must not add traffic
    logp = -torch.rand(n)
    ref = logp + torch.randn(n)
    grad = torch.randn(n)
    b = 4 * n
    return [
        TrafficCase(
            "kl_penalty",
            "forward k3",
            lambda: kl_penalty_forward(logp, ref, "k3", 10.0),
            3 * b,
            max_ratio=1.05,
        ),
        TrafficCase(
            "kl_penalty",
            "backward k3",
            lambda: kl_penalty_backward(grad, logp, ref, "k3", 10.0),
            4 * b,
            max_ratio=1.05,
        ),
    ]
