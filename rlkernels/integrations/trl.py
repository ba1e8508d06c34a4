"""TRL's GRPO `loss_type` names mapped onto rk.policy_loss options (docs/semantics.md).

Follows GRPOTrainer._compute_loss of TRL 1.16.0 (tests/test_trl_grpo.py runs the installed TRL's trainer
against rlkernels.integrations.trl_grpo, which uses this mapping). Per micro-batch, with m the completion
mask:
    grpo, sapo  mean over the B sequences of Σ_t m·L / Σ_t m     -> agg="seq-mean-token-mean", num_seqs=B
    bnpo        Σ m·L / Σ m                                      -> agg="token-mean"
    dr_grpo     Σ m·L / (B · max_completion_length)              -> agg="seq-mean-token-sum-norm",
                                                                    num_seqs=B, norm_len=max_completion_length
    luspo       mean over the B sequences of Σ_t m·L             -> agg="seq-mean-token-sum", num_seqs=B
    dapo, cispo,
    vespo       Σ m·L / (num_items_in_batch / num_processes)    -> agg="token-mean",
                                                                    num_tokens=num_items_in_batch,
                                                                    dp_size=num_processes
`epsilon` / `epsilon_high` are the clip range (TRL's CISPO caps the ratio at the absolute `epsilon_high`
with no lower bound: clip_low=1, clip_high=epsilon_high-1), `delta` is ratio_cap, `beta` the k3 KL
coefficient (TRL does not clamp k3: kl_clamp=None; like verl we still clamp its log-ratio to ±20),
`importance_sampling_level` the level, and TRL's vLLM importance-sampling ratio goes in `is_weights`.
TRL divides the first four by the gradient-accumulation steps outside the loss; that stays the trainer's job.
For dapo / cispo TRL 1.16 rescales num_items_in_batch (the generation batch's token count) to one
accumulation window: pass num_items_in_batch · gradient_accumulation_steps / steps_per_generation.

At importance_sampling_level="sequence", TRL differentiates through the row's mean log-ratio while
rk.policy_loss is verl's straight-through GSPO: the losses are equal, and so are the gradients whenever
the per-token factors are constant along a row (advantages [B], sequence-level IS ratios [B]); with
per-token IS ratios or advantages the two gradients differ (by design: docs/semantics.md follows verl).

vespo is objective="vespo" with TRL's vespo_k_pos / _lambda_pos / _k_neg / _lambda_neg; TRL folds its
token-level vLLM IS ratio into the sequence weight instead of multiplying the loss, and so does
rk.policy_loss for vespo's is_weights (TRL sums the log-ratios over every position, rk over the masked ones:
the same, as TRL's ratio is 1 on padding while 1 lies inside its clip range). TRL multiplies vespo's loss by
its off-policy and top-entropy masks after the weight is formed: pass those as factors of the advantages,
not as is_weights (trl_grpo.GRPOTrainer does).

The entropy bonus: rk.policy_loss aggregates -entropy_coef·H with the loss's own `agg`, while TRL 1.16 takes
a token mean for every loss type, so pass entropy_coef=0 and add TRL's bonus yourself (trl_grpo.GRPOTrainer
does).
"""

from __future__ import annotations

import torch

import rlkernels as rk

LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo")


def trl_policy_loss_kwargs(
    loss_type: str,
    *,
    batch_size: int | None = None,
    max_completion_length: int | None = None,
    num_items_in_batch=None,
    num_processes: int = 1,
    epsilon: float = 0.2,
    epsilon_high: float | None = None,
    delta: float | None = None,
    importance_sampling_level: str = "token",
    beta: float = 0.0,
    sapo_temperature_pos: float = 1.0,
    sapo_temperature_neg: float = 1.05,
    vespo_k_pos: float = 2.0,
    vespo_lambda_pos: float = 3.0,
    vespo_k_neg: float = 3.0,
    vespo_lambda_neg: float = 2.0,
) -> dict:
    """rk.policy_loss keyword arguments reproducing TRL's loss for `loss_type` (see the module docstring).

    batch_size: the micro-batch's number of sequences B (grpo, sapo, dr_grpo); max_completion_length:
    dr_grpo's constant; num_items_in_batch (number or tensor) and num_processes: dapo, cispo and vespo."""
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"trl loss_type must be one of {LOSS_TYPES}, got {loss_type!r}")
    epsilon_high = epsilon if epsilon_high is None else epsilon_high
    kw: dict = dict(
        clip_low=epsilon,
        clip_high=epsilon_high,
        level=importance_sampling_level,
        kl_coef=beta,
        kl_kind="k3",
        kl_clamp=None,
    )
    if delta is not None:
        kw["ratio_cap"] = delta
    if loss_type == "cispo":
        if not epsilon_high > 1:
            raise ValueError(
                f"trl cispo caps the ratio at epsilon_high, which must be > 1, got {epsilon_high}"
            )
        kw.update(objective="cispo", clip_low=1.0, clip_high=epsilon_high - 1)
    if loss_type == "sapo":
        kw.update(objective="sapo", sapo_tau_pos=sapo_temperature_pos, sapo_tau_neg=sapo_temperature_neg)
    if loss_type == "vespo":  # its own sequence weight: TRL ignores importance_sampling_level (and warns)
        kw.update(
            objective="vespo", level="token", vespo_k_pos=vespo_k_pos, vespo_lambda_pos=vespo_lambda_pos,
            vespo_k_neg=vespo_k_neg, vespo_lambda_neg=vespo_lambda_neg,
        )  # fmt: skip
        kw.pop("ratio_cap", None)

    def need(name, value):
        if value is None:
            raise ValueError(f"trl loss_type={loss_type!r} needs {name}")
        return value

    if loss_type in ("grpo", "sapo"):
        kw.update(agg="seq-mean-token-mean", num_seqs=need("batch_size", batch_size))
    elif loss_type == "luspo":  # the clip objective, summed per sequence, averaged over all B rows
        kw.update(agg="seq-mean-token-sum", num_seqs=need("batch_size", batch_size))
    elif loss_type == "bnpo":
        kw.update(agg="token-mean")
    elif loss_type == "dr_grpo":
        kw.update(  # verl 0.9.1's form: the mean over all B rows (empty ones too, as TRL), then / the length
            agg="seq-mean-token-sum-norm",
            num_seqs=need("batch_size", batch_size),
            norm_len=need("max_completion_length", max_completion_length),
        )
    else:  # dapo, cispo, vespo
        kw.update(
            agg="token-mean", num_tokens=need("num_items_in_batch", num_items_in_batch), dp_size=num_processes
        )
    return kw


def trl_grpo_loss(
    per_token_logps: torch.Tensor,
    old_per_token_logps: torch.Tensor,
    advantages: torch.Tensor,
    completion_mask: torch.Tensor,
    *,
    loss_type: str = "dapo",
    ref_per_token_logps: torch.Tensor | None = None,
    importance_sampling_ratio: torch.Tensor | None = None,
    backend: str = "auto",
    **trl_args,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """TRL's GRPO loss of one micro-batch through rk.policy_loss, with TRL's argument names.
    per_token_logps etc. [B, T]; advantages [B] or [B, T]; trl_args as trl_policy_loss_kwargs (batch_size
    defaults to B)."""
    trl_args.setdefault("batch_size", per_token_logps.shape[0])
    kw = trl_policy_loss_kwargs(loss_type, **trl_args)
    if kw["kl_coef"] == 0:
        kw.pop("kl_coef")
    return rk.policy_loss(
        per_token_logps,
        old_per_token_logps,
        advantages,
        completion_mask,
        ref_logp=ref_per_token_logps,
        is_weights=importance_sampling_ratio,
        backend=backend,
        **kw,
    )
