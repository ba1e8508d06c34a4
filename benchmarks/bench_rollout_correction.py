"""rollout_correction: importance weights, rejection mask and metrics of a rollout batch, against the eager
reference (a couple of dozen passes over the [B, T] tensors) and its torch.compile. The floor is the bytes the
op must move: the two log-prob tensors and the mask read once, the weights (and a rejected mask) written once.
benchmarks/rollout_correction.py compares with the peers (verl, TRL)."""

from __future__ import annotations

import torch
from harness import Case, Floor
from providers import standard

import rlkernels as rk
from rlkernels.reference import rollout_correction as reference

# (B, T): 64 x 4096 a small step, 512 x 8192 an LLM batch.
SIZES = {"small": [(64, 4096)], "llm": [(512, 8192)]}
# verl's token TIS with token_k3 rejection; sequence MIS with seq_mean_k1 rejection and batch normalization.
OPTIONS = {
    "token": dict(level="token", clip_max=2.0, rejection="token_k3", rejection_max=0.5),
    "sequence": dict(
        level="sequence", mode="mask", clip_max=2.0, clip_min=0.5, rejection="seq_mean_k1", rejection_max=2.0,
        batch_normalize=True,
    ),
}  # fmt: skip


def _inputs(b: int, t: int, dtype: torch.dtype, device: torch.device):
    def make():
        gen = torch.Generator(device="cpu").manual_seed(b * t)
        rollout = -3 * torch.rand(b, t, generator=gen)
        old = rollout + 0.05 * torch.randn(b, t, generator=gen)
        mask = torch.arange(t)[None, :] < torch.randint(t // 2, t + 1, (b, 1), generator=gen)
        return {
            "logp_old": old.to(device, dtype),
            "logp_rollout": rollout.to(device, dtype),
            "mask": mask.to(device),
        }

    return make


def cases(shapes: str, device: torch.device) -> list[Case]:
    out = []
    dtype = torch.float32
    for b, t in SIZES[shapes]:
        for name, options in OPTIONS.items():
            config = reference.RolloutCorrectionConfig(**options)

            def eager_fn(logp_old, logp_rollout, mask, config=config):
                return reference.rollout_correction(logp_old, logp_rollout, mask, config)

            def kernel(logp_old, logp_rollout, mask, backend, options=options):
                return rk.rollout_correction(logp_old, logp_rollout, mask, **options, backend=backend)

            weights = 4 if name == "token" else 0
            out.append(
                Case(
                    op="rollout_correction",
                    shape=f"B={b} T={t} {name}",
                    dtype=dtype,
                    make_inputs=_inputs(b, t, dtype, device),
                    providers=standard(eager_fn, kernel, device),
                    modes=("forward",),
                    # read: two fp32 log-probs and the bool mask; write: fp32 weights (token) and the mask
                    floors=[Floor("forward", "bytes", min_bytes=b * t * (4 + 4 + 1 + weights + 1))],
                )
            )
    return out
