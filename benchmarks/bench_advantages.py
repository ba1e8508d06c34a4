"""group_advantages against the verl-style dictionary loop (eager: what verl runs today, Python per
rollout with a numpy array of group ids) and vectorized torch (torch.unique + index_add for arbitrary
ids, the [B/G, G] view for contiguous groups, and its torch.compile). The floor is the bytes the op must
move: rewards (and ids) read once, advantages written once."""

from __future__ import annotations

import torch
from harness import Case, Floor, Provider, TrafficCase
from providers import compiled, eager, rlkernels

import rlkernels as rk
from rlkernels.reference import advantages as reference

# Rollouts per step: 65536 (4096 prompts x 16 samples) is the target.
SIZES = {"small": [4096, 65536], "llm": [65536, 1 << 20]}
GROUP = 16  # samples per prompt


def _inputs(b: int, dtype: torch.dtype, device: torch.device):
    def make():
        gen = torch.Generator(device="cpu").manual_seed(b)
        rewards = (torch.rand(b, generator=gen) > 0.5).to(dtype) + 0.1 * torch.randn(b, generator=gen)
        # Arbitrary ids: the prompts' uids in a shuffled rollout order (as after dynamic batching).
        ids = (torch.arange(b) // GROUP * 7919 + 12345)[torch.randperm(b, generator=gen)]
        return {"rewards": rewards.to(device, dtype), "group_ids": ids.to(device), "ids_np": ids.numpy()}

    return make


def _trl_view(rewards: torch.Tensor, group_size: int, eps: float = 1e-6) -> torch.Tensor:
    """TRL-style vectorized GRPO for contiguous groups: per-group mean and std from a [B/G, G] view."""
    grouped = rewards.view(-1, group_size)
    mean = grouped.mean(dim=1, keepdim=True)
    std = grouped.std(dim=1, keepdim=True)
    return ((grouped - mean) / (std + eps)).view(-1)


def cases(shapes: str, device: torch.device) -> list[Case]:
    out = []
    dtype = torch.float32
    for b in SIZES[shapes]:

        def loop(rewards, group_ids, ids_np):
            return reference.group_advantages_loop(rewards, ids_np, "grpo")

        def vectorized(rewards, group_ids, ids_np):
            return reference.group_advantages(rewards, None, group_ids, "grpo")

        def kernel(rewards, group_ids, ids_np, backend):
            return rk.group_advantages(rewards, group_ids=group_ids, mode="grpo", backend=backend)

        out.append(
            Case(
                op="group_advantages",
                shape=f"B={b} ids",
                dtype=dtype,
                make_inputs=_inputs(b, dtype, device),
                providers=[
                    eager(loop),
                    Provider("torch (vectorized)", vectorized),
                    compiled(vectorized),
                    *rlkernels(kernel, device),
                ],
                modes=("forward",),
                floors=[Floor("forward", "bytes", min_bytes=b * (4 + 8 + 4))],  # rewards, int64 ids, out
            )
        )

        def loop_contiguous(rewards, group_ids, ids_np):
            return reference.group_advantages_loop(rewards, [i // GROUP for i in range(len(ids_np))], "grpo")

        def view(rewards, group_ids, ids_np):
            return _trl_view(rewards, GROUP)

        def kernel_contiguous(rewards, group_ids, ids_np, backend):
            return rk.group_advantages(rewards, group_size=GROUP, mode="grpo", backend=backend)

        out.append(
            Case(
                op="group_advantages",
                shape=f"B={b} G={GROUP}",
                dtype=dtype,
                make_inputs=_inputs(b, dtype, device),
                providers=[
                    eager(loop_contiguous),
                    Provider("torch (view)", view),
                    compiled(view),
                    *rlkernels(kernel_contiguous, device),
                ],
                modes=("forward",),
                floors=[Floor("forward", "bytes", min_bytes=b * (4 + 4))],
            )
        )
    return out


def traffic_cases() -> list[TrafficCase]:
    """The Triton kernels' bytes against the minimum (under the interpreter, on CPU tensors)."""
    from rlkernels.triton.advantages import group_advantages_forward

    b = 100_000  # not a multiple of the tile
    x = _inputs(b, torch.float32, torch.device("cpu"))()
    r, ids = x["rewards"], x["group_ids"]
    return [
        TrafficCase(
            "group_advantages",
            "contiguous G=16",
            lambda: group_advantages_forward(r[: b - b % GROUP], None, GROUP, "grpo", 1e-6),
            (b - b % GROUP) * 8,
            max_ratio=1.05,
        ),
        TrafficCase(
            "group_advantages",
            "contiguous G=5 (padded tile)",
            lambda: group_advantages_forward(r, None, 5, "grpo", 1e-6),
            b * 8,
            max_ratio=1.05,
        ),
        TrafficCase(
            "group_advantages",
            "ids (the sorted walk)",
            lambda: group_advantages_forward(r, ids, 0, "grpo", 1e-6),
            b * (4 + 8 + 4),
            note="two walks, each reading the sorted ids, their permutation and the rewards",
        ),
    ]
