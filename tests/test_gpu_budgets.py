"""The per-call launch and sync budgets of the token-level ops on a GPU (docs/gpu_token_ops.md), counted on
fake CUDA tensors by benchmarks/gpu_cost.py: every kernel a forward + backward call launches (Triton
launches, ATen ops, the CUDA C++ ops' own kernels and ATen calls, counted through the cuda-on-cpu
harness), and every host sync. Counts, not timings: a machine does not change them."""

import pathlib
import sys

import pytest
import torch

import rlkernels as rk
from rlkernels.fake_cuda import Maker

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))
import gpu_cost  # noqa: E402

B, T = 4, 37


def _policy_inputs(mask_dtype=torch.bool, ref=True, entropy=True):
    def make(mode):
        m = Maker(torch.device("cuda" if mode is not None else "cpu"), mode)
        mask = m.mask(B, T)
        x = dict(logp=m.logp(B, T, grad=True), old_logp=m.logp(B, T), advantages=m.randn(B), mask=mask)
        if mask_dtype != torch.bool:
            x["mask"] = mask.to(mask_dtype)
        if ref:
            x["ref_logp"] = m.logp(B, T)
        if entropy:
            x["entropy"] = m.randn(B, T, grad=True)
        return x

    return make


# (label, public call, inputs, launches allowed per forward + backward)
POLICY = [
    ("clip kl entropy", dict(clip_high=0.28, dual_clip=3.0, kl_coef=0.05, entropy_coef=0.01), {}, 3),
    ("seq-mean-token-mean int mask", dict(agg="seq-mean-token-mean"), dict(mask_dtype=torch.int64), 3),
    ("token-sum float mask", dict(agg="token-sum"), dict(mask_dtype=torch.float32), 3),
    ("gspo (a sequence pass)", dict(level="sequence", agg="seq-mean-token-mean"), {}, 4),
    ("geo_mean", dict(objective="geo_mean", agg="seq-mean-token-mean"), {}, 4),
    ("cispo, no ref, no entropy", dict(objective="cispo"), dict(ref=False, entropy=False), 3),
]


@pytest.mark.parametrize("label,options,inputs,budget", POLICY, ids=[p[0] for p in POLICY])
def test_policy_loss_triton_launches(label, options, inputs, budget):
    cost = gpu_cost.count(
        lambda **x: rk.policy_loss(**x, **options, backend="triton"), _policy_inputs(**inputs)
    )
    assert not cost.syncs, cost.syncs
    assert cost.kernels() <= budget, f"{label}: {cost.summary()}: {[(k.kind, k.name) for k in cost.launches]}"
    assert cost.custom_ops <= 2  # the forward op and the backward op
