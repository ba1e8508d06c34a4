"""PPO with a value head on the policy's backbone: per-token rewards with the KL penalty folded in (k1 of the
rollout policy to the frozen reference, and the task's score at the completion's last token), GAE, advantages
whitened over the whole batch (all ranks), then the clipped policy loss from the hidden states
(rk.linear_policy_loss) plus the clipped value loss (rk.value_loss), both token means over the global
batch."""

from __future__ import annotations

import torch

import rlkernels as rk
from rlkernels.reference.gae import WHITEN_EPS
from rlkernels.trainers import sequences as seq
from rlkernels.trainers.base import Trainer
from rlkernels.trainers.config import PPOConfig


class PPOTrainer(Trainer):
    """`PPOTrainer(PPOConfig(...), reward_fn=None).train()` -> per-step records (see docs/trainers.md)."""

    name = "ppo"
    config_class = PPOConfig
    scalar_head = True

    def before_training(self) -> None:
        self.warm_start(self.config.warmup_steps, self.config.warmup_lr)
        self.ref = self.reference()

    def whiten(self, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """verl's masked_whiten (a mean and unbiased variance over every masked token) over all ranks."""
        m = mask.to(values.dtype)
        count = self.dist.sum(m.sum())
        mean = (self.dist.sum((values * m).sum()) / count.clamp(min=1)).to(values.dtype)
        var = self.dist.sum(((values - mean).square() * m).sum()) / (count - 1).clamp(min=1)
        return (values - mean) * torch.rsqrt(var.to(values.dtype) + WHITEN_EPS)

    def make_batch(self, step: int) -> tuple[dict, dict]:
        c = self.config
        batch, scores = self.rollout(self.prompts(self.local_batch))
        mask = batch["mask"]
        with torch.no_grad():
            hidden = self.model(batch["input_ids"], batch["attention_mask"])
            hidden = seq.completion_hidden(hidden, mask.shape[1])
            old_logp, entropy = seq.token_logprobs(
                self.model, hidden, batch["labels"], mode=c.logprobs, temperature=c.temperature,
                return_entropy=True,
            )  # fmt: skip
            values = seq.at_least_fp32(self.model.scalar(hidden).squeeze(-1)) * mask
        ref_logp = self.score(batch, c.temperature, model=self.ref)
        kl = rk.kl_penalty(old_logp, ref_logp, "k1") * mask  # [B, C]
        rewards = -c.kl_coef * kl
        last = mask.sum(1) - 1  # the completion's last token (its EOS, or the length limit)
        rewards[torch.arange(mask.shape[0]), last] += scores
        advantages, returns = rk.gae(rewards, values, mask, gamma=c.gamma, lam=c.lam)
        batch.update(
            old_logp=old_logp, old_values=values, returns=returns, advantages=self.whiten(advantages, mask)
        )
        tokens = self.dist.sum(mask.sum())
        stats = dict(
            reward=float(self.dist.sum(scores.sum())) / c.batch_size,
            kl=float(self.dist.sum(kl.sum()) / tokens),
            entropy=float(self.dist.sum((entropy * mask).sum()) / tokens),
        )
        return batch, stats

    def loss_fn(self, batch: dict):
        c = self.config
        norm = dict(agg="token-mean", num_tokens=self.dist.sum(batch["mask"].sum()), dp_size=self.dist.world)

        def loss_fn(micro):
            hidden = self.hidden(micro)
            pg, pg_stats = seq.policy_loss(
                self.model, hidden, micro, mode=c.logprobs, temperature=c.temperature, clip_low=c.clip,
                clip_high=c.clip, **norm,
            )  # fmt: skip
            values = seq.at_least_fp32(self.model.scalar(hidden).squeeze(-1))
            vf, vf_stats = rk.value_loss(
                values, micro["old_values"], micro["returns"], micro["mask"], clip=c.value_clip, **norm
            )
            stats = dict(clipfrac=pg_stats["clipfrac"], vf_clipfrac=vf_stats["clipfrac"])
            return pg + c.vf_coef * vf, stats, micro["mask"].sum()

        return loss_fn
