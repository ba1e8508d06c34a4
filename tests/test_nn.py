"""The nn.Module wrappers forward to the functions with their stored options."""

import torch

import rlkernels as rk
from rlkernels import nn as rknn


def test_kl_penalty_module():
    logp, ref = -torch.rand(3, 9), -torch.rand(3, 9)
    module = rknn.KLPenalty("k1+", clamp=None)
    assert "k1+" in repr(module)
    torch.testing.assert_close(module(logp, ref), rk.kl_penalty(logp, ref, "k1+", clamp=None), rtol=0, atol=0)


def test_policy_and_value_loss_modules():
    logp, old = -torch.rand(4, 11), -torch.rand(4, 11)
    adv, mask = torch.randn(4), torch.rand(4, 11) > 0.3
    module = rknn.PolicyLoss(clip_low=0.1, clip_high=0.3, agg="seq-mean-token-sum", kl_coef=0.1)
    ref = -torch.rand(4, 11)
    loss, stats = module(logp, old, adv, mask, ref_logp=ref)
    want, want_stats = rk.policy_loss(
        logp, old, adv, mask, clip_low=0.1, clip_high=0.3, agg="seq-mean-token-sum", kl_coef=0.1, ref_logp=ref
    )
    torch.testing.assert_close(loss, want, rtol=0, atol=0)
    assert stats.keys() == want_stats.keys()
    values, old_values, returns = torch.randn(4, 11), torch.randn(4, 11), torch.randn(4, 11)
    vloss, _ = rknn.ValueLoss(clip=0.5)(values, old_values, returns, mask)
    torch.testing.assert_close(
        vloss, rk.value_loss(values, old_values, returns, mask, clip=0.5)[0], rtol=0, atol=0
    )


def test_linear_logprobs_module():
    hidden, weight = torch.randn(2, 5, 8), torch.randn(37, 8)
    labels = torch.randint(0, 37, (2, 5))
    module = rknn.LinearLogprobs(temperature=0.8, return_entropy=True)
    logp, ent = module(hidden, weight, labels)
    want_logp, want_ent = rk.linear_logprobs(hidden, weight, labels, temperature=0.8, return_entropy=True)
    torch.testing.assert_close(logp, want_logp, rtol=0, atol=0)
    torch.testing.assert_close(ent, want_ent, rtol=0, atol=0)
    logp, sum_sq = rknn.LinearLogprobs(return_sum_pi_squared=True)(hidden, weight, labels)
    want_logp, want_sq = rk.linear_logprobs(hidden, weight, labels, return_sum_pi_squared=True)
    torch.testing.assert_close(sum_sq, want_sq, rtol=0, atol=0)
