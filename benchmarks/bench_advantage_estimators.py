"""The advantage estimators (verl 0.9.1's and TRL 1.16's, rk.advantages) on the
harness: each public function on its kernel backends against its eager reference (backend="reference":
the vectorized torch ops of rlkernels/reference/advantage_estimators.py). The floor is the bytes the
estimator must move: its [B] or [B, T] inputs read once, its [B, T] outputs written once.
benchmarks/advantage_estimators.py compares with verl's own functions and torch.compile.

Outcome estimators: B responses (groups of 16 on shuffled ids) with T response tokens; token-level ones
(reinforce_plus_plus, remax, optimal_token_baseline) on [B, T] rewards."""

from __future__ import annotations

import torch
from harness import Case, Floor
from providers import eager, rlkernels

import rlkernels as rk

GROUP = 16
# (B, T). llm: issue 28's small shape first (0.26 M tokens, 128 responses: the one-program walks, whose
# launches carry the mask rows' sums and moments), then 16.8 M tokens (8192 responses: the chunk paths).
SIZES = {"small": [(4096, 64)], "llm": [(128, 2048), (8192, 2048)]}


def _inputs(b: int, t: int, device: torch.device):
    def make():
        gen = torch.Generator(device="cpu").manual_seed(b * t)
        ids = (torch.arange(b) // GROUP * 7919 + 12345)[torch.randperm(b, generator=gen)]
        lengths = torch.randint(t // 4, t + 1, (b,), generator=gen)
        mask = torch.arange(t)[None, :] < lengths[:, None]
        scores = (torch.rand(b, generator=gen) > 0.5).float() + 0.1 * torch.randn(b, generator=gen)
        rewards = torch.zeros(b, t)
        rewards[torch.arange(b), lengths - 1] = scores
        x = {
            "scores": scores, "scores2": torch.stack([scores, torch.randn(b, generator=gen)], 1),
            "mask": mask, "group_ids": ids, "rewards": rewards, "baselines": 0.5 * scores,
            "old_logp": -torch.rand(b, t, generator=gen),
            "sum_pi_squared": 0.5 * torch.rand(b, t, generator=gen),
        }  # fmt: skip
        return {k: v.to(device) for k, v in x.items()}

    return make


def _calls(t: int):
    """name -> (call(inputs, backend), bytes read and written per response, beyond the [B, T] output)."""
    mask_bytes = t  # a bool mask row
    return {
        # verl's grpo estimator: group_advantages on shuffled ids, broadcast over the mask (at B=8192 the
        # sorted path in chunks, past 1024 rewards)
        "group_advantages[ids, mask]": (
            lambda x, be: rk.group_advantages(
                x["scores"], group_ids=x["group_ids"], mask=x["mask"], backend=be
            ),
            4 + 8 + mask_bytes,
        ),
        "grpo_passk_advantages": (
            lambda x, be: rk.grpo_passk_advantages(
                x["scores"], x["mask"], group_ids=x["group_ids"], backend=be
            ),
            4 + 8 + mask_bytes,
        ),
        "opo_advantages": (
            lambda x, be: rk.opo_advantages(x["scores"], x["mask"], group_ids=x["group_ids"], backend=be),
            4 + 8 + mask_bytes,
        ),
        "gpg_advantages": (
            lambda x, be: rk.gpg_advantages(x["scores"], x["mask"], group_ids=x["group_ids"], backend=be),
            4 + 8 + mask_bytes,
        ),
        "reinforce_plus_plus_baseline_advantages": (
            lambda x, be: rk.reinforce_plus_plus_baseline_advantages(
                x["scores"], x["mask"], group_ids=x["group_ids"], backend=be
            ),
            4 + 8 + mask_bytes,
        ),
        "gdpo_advantages": (
            lambda x, be: rk.gdpo_advantages(
                x["scores2"], x["mask"], group_ids=x["group_ids"], backend=be
            ),
            8 + 8 + mask_bytes,
        ),
        "trl_grpo_advantages": (
            lambda x, be: rk.trl_grpo_advantages(x["scores"], group_size=GROUP, mask=x["mask"], backend=be),
            4 + mask_bytes,
        ),
        "trl_grpo_advantages[normalize_then_sum]": (
            lambda x, be: rk.trl_grpo_advantages(
                x["scores2"], group_ids=x["group_ids"], mask=x["mask"],
                multi_objective_aggregation="normalize_then_sum", backend=be,
            ),
            8 + 8 + mask_bytes,
        ),
        "reinforce_plus_plus_advantages": (
            lambda x, be: rk.reinforce_plus_plus_advantages(x["rewards"], x["mask"], gamma=0.99, backend=be),
            (4 + 4) * t + mask_bytes,  # rewards in, returns out (the advantages: the [B, T] output)
        ),
        "remax_advantages": (
            lambda x, be: rk.remax_advantages(
                x["rewards"], x["mask"], reward_baselines=x["baselines"], backend=be
            ),
            (4 + 4) * t + 4 + mask_bytes,
        ),
        "optimal_token_baseline_advantages": (
            lambda x, be: rk.optimal_token_baseline_advantages(
                x["rewards"], x["mask"], group_ids=x["group_ids"], old_logp=x["old_logp"],
                sum_pi_squared=x["sum_pi_squared"], backend=be,
            ),
            (4 + 4 + 4 + 4) * t + 8 + mask_bytes,
        ),
    }  # fmt: skip


def cases(shapes: str, device: torch.device) -> list[Case]:
    out = []
    for b, t in SIZES[shapes]:
        for name, (call, per_row) in _calls(t).items():

            def reference(call=call, **x):
                return call(x, "reference")

            def kernel(backend, call=call, **x):
                return call(x, backend)

            out.append(
                Case(
                    op=name,
                    shape=f"B={b} T={t}",
                    dtype=torch.float32,
                    make_inputs=_inputs(b, t, device),
                    providers=[eager(reference), *rlkernels(kernel, device)],
                    modes=("forward",),
                    floors=[Floor("forward", "bytes", min_bytes=b * (per_row + 4 * t))],  # + the fp32 output
                )
            )
    return out
