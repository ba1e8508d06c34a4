"""integrations/trl.py: rk.policy_loss with the mapped options reproduces TRL's GRPO loss for every mapped
loss_type, values and gradients. The oracle below transcribes GRPOTrainer._compute_loss (TRL f2cd577); for
vespo it calls TRL's own gamma weights, so the vespo cases skip where TRL is not installed."""

import pytest
import torch
from oracle import cpu_kernel_backends

from rlkernels.integrations.trl import LOSS_TYPES, trl_grpo_loss, trl_policy_loss_kwargs


def trl_loss(logps, old, adv, mask, loss_type, *, epsilon, epsilon_high, delta=None, beta=0.0, ref=None,
             is_ratio=None, level="token", max_completion_length=None, num_items_in_batch=None,
             num_processes=1, tau_pos=1.0, tau_neg=1.05):  # fmt: skip
    mask = mask.to(logps.dtype)
    adv = adv.unsqueeze(1) if adv.dim() == 1 else adv
    log_ratio = logps - old
    if level == "token":
        liw = log_ratio
    else:
        liw = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    coef_1 = torch.exp(liw)
    if loss_type == "cispo":
        per_token = -torch.clamp(coef_1, max=epsilon_high).detach() * adv * logps
    elif loss_type == "vespo":  # TRL's own gamma weights (it folds the IS ratio into them)
        trl = pytest.importorskip("trl", reason="TRL is installed by the [integrations] extra (README)")
        phi = trl.GRPOTrainer.get_gamma_weights(adv, log_ratio, mask, is_ratio)
        per_token = -phi * adv * logps
        is_ratio = None
    elif loss_type == "sapo":
        temps = torch.where(adv > 0, adv.new_tensor(tau_pos), adv.new_tensor(tau_neg))  # float64 here
        per_token = -(torch.sigmoid(temps * (coef_1 - 1)) * 4 / temps) * adv
    else:
        coef_2 = torch.clamp(coef_1, 1 - epsilon, 1 + epsilon_high)
        if delta is not None:
            coef_1 = torch.clamp(coef_1, max=delta)
        per_token = -torch.min(coef_1 * adv, coef_2 * adv)
    if is_ratio is not None:
        per_token = per_token * (is_ratio.unsqueeze(-1) if is_ratio.dim() == 1 else is_ratio)
    if beta != 0.0:
        d = ref - logps
        per_token = per_token + beta * (torch.exp(d) - d - 1)
    if loss_type in ("grpo", "sapo"):
        return ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    if loss_type == "bnpo":
        return (per_token * mask).sum() / mask.sum().clamp(min=1.0)
    if loss_type == "dr_grpo":
        return (per_token * mask).sum() / (per_token.size(0) * max_completion_length)
    if loss_type == "luspo":
        return (per_token * mask).sum(-1).mean()
    return (per_token * mask).sum() / (num_items_in_batch.clamp(min=1.0) / num_processes)


CASES = [(t, "token") for t in LOSS_TYPES] + [("grpo", "sequence"), ("dapo", "sequence")]
CASES.remove(("vespo", "token"))
CASES.append(("vespo", "token-vespo"))  # vespo: per-token advantages, a row past the weight's bounds


@pytest.mark.parametrize("loss_type,level", CASES)
@pytest.mark.parametrize("backend", cpu_kernel_backends() + ["reference"])
def test_matches_trl(backend, loss_type, level, seed):
    B, T = 5, 23
    logps = -torch.rand(B, T, dtype=torch.float64) * 3
    old = logps - torch.randn(B, T, dtype=torch.float64) * 0.4
    ref = logps + torch.randn(B, T, dtype=torch.float64) * 0.5
    adv = torch.randn(B, dtype=torch.float64)
    mask = torch.rand(B, T) > 0.25
    mask[2] = False  # TRL's grpo mean counts this empty sequence
    # At the sequence level, TRL differentiates through the row mean while rk (verl's GSPO) is
    # straight-through per token: the gradients agree when the per-token factors are per row, as TRL's
    # sequence-level vLLM IS ratios are ([B, 1]).
    is_ratio = torch.rand((B, T) if level != "sequence" else (B,), dtype=torch.float64) + 0.5
    if loss_type == "vespo":
        # TRL's vLLM IS ratio is 1 on padding (it exponentiates a masked difference); per-token advantages
        # of both signs pick both (k, λ) pairs; row 0 sums its log-ratios past 20, row 3 below ln 1e-8.
        level = "token"
        is_ratio = torch.where(mask, is_ratio, 1.0)
        adv = torch.randn(B, T, dtype=torch.float64)
        old[0], old[3] = logps[0] - 2.0, logps[3] + 2.0
    eps_high = 4.0 if loss_type == "cispo" else 0.28
    trl_kw = dict(epsilon=0.2, epsilon_high=eps_high, beta=0.04, max_completion_length=32,
                  num_items_in_batch=4.0 * mask.sum(), num_processes=4)  # fmt: skip
    if loss_type in ("grpo", "bnpo", "dr_grpo", "dapo", "luspo"):
        trl_kw["delta"] = 2.5
    lp = logps.clone().requires_grad_()
    got, _ = trl_grpo_loss(lp, old, adv, mask, loss_type=loss_type, ref_per_token_logps=ref,
                           importance_sampling_ratio=is_ratio, importance_sampling_level=level,
                           backend=backend, **trl_kw)  # fmt: skip
    (g_got,) = torch.autograd.grad(got, lp)
    lp = logps.clone().requires_grad_()
    want = trl_loss(lp, old, adv, mask, loss_type, ref=ref, is_ratio=is_ratio, level=level, **trl_kw)
    (g_want,) = torch.autograd.grad(want, lp)
    # Triton takes hyper-parameters as fp32 scalars: each per-token term is off by ~1e-7 of its own size,
    # so the aggregate is off by that much of the terms' scale (|A|·IS·4/tau for sapo), not of a loss
    # that may cancel to near 0 (seen: -1.7e-3 off by 3.8e-8).
    tol = 1e-6 if backend == "triton" else 1e-12
    atol = tol * max(1.0, 4 * float(adv.abs().max() * is_ratio.max())) if backend == "triton" else 1e-12
    torch.testing.assert_close(got, want, rtol=tol, atol=atol)
    torch.testing.assert_close(g_got, g_want, rtol=tol, atol=atol)


def test_kwargs_and_errors():
    kw = trl_policy_loss_kwargs("dr_grpo", batch_size=8, max_completion_length=256)
    assert (kw["agg"], kw["num_seqs"], kw["norm_len"]) == ("seq-mean-token-sum-norm", 8, 256)
    assert trl_policy_loss_kwargs("cispo", epsilon_high=5.0, num_items_in_batch=10)["clip_high"] == 4.0
    with pytest.raises(ValueError, match="loss_type must be one of"):
        trl_policy_loss_kwargs("gspo")
    with pytest.raises(ValueError, match="needs max_completion_length"):
        trl_policy_loss_kwargs("dr_grpo", batch_size=8)
    with pytest.raises(ValueError, match="must be > 1"):
        trl_policy_loss_kwargs("cispo", epsilon_high=0.28, num_items_in_batch=10)
