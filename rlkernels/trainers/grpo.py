"""GRPO: a group of sampled completions per prompt, rewards normalized within the group, the clipped policy
loss from the hidden states (rk.linear_policy_loss) with a k3 KL to the frozen reference model.

The loss settings are TRL's `loss_type` names (grpo, dr_grpo, dapo) mapped by rlkernels.integrations.trl,
with the counts of the whole optimizer batch over all ranks, so that neither the micro-batch split nor the
number of ranks changes the update.
"""

from __future__ import annotations

import rlkernels as rk
from rlkernels.integrations.trl import trl_policy_loss_kwargs
from rlkernels.trainers import sequences as seq
from rlkernels.trainers.base import Trainer
from rlkernels.trainers.config import GRPOConfig


class GRPOTrainer(Trainer):
    """`GRPOTrainer(GRPOConfig(...), reward_fn=None).train()` -> per-step records (see docs/trainers.md)."""

    name = "grpo"
    config_class = GRPOConfig

    def __init__(self, config: GRPOConfig, reward_fn=None):
        super().__init__(config, reward_fn)
        if self.local_batch % config.group_size:
            raise ValueError(
                f"group_size ({config.group_size}) must divide the per-rank batch ({self.local_batch} = "
                f"batch_size / {self.dist.world} ranks): a group is sampled on one rank"
            )
        self.ref = None

    def before_training(self) -> None:
        self.warm_start(self.config.warmup_steps, self.config.warmup_lr)
        self.ref = self.reference() if self.config.beta else None

    def make_batch(self, step: int) -> tuple[dict, dict]:
        """Rollouts of this rank's prompts, scored: the batch (with old_logp, ref_logp, advantages [B]) and
        the rollout's stats summed over ranks (reward, entropy)."""
        c = self.config
        batch, rewards = self.rollout(self.prompts(self.local_batch // c.group_size), repeat=c.group_size)
        batch["advantages"] = rk.group_advantages(rewards, group_size=c.group_size, mode="grpo")
        batch["old_logp"], entropy = self.score(batch, c.temperature, entropy=True)
        if self.ref is not None:
            batch["ref_logp"] = self.score(batch, c.temperature, model=self.ref)
        tokens = self.dist.sum(batch["mask"].sum())
        stats = dict(
            reward=float(self.dist.sum(rewards.sum())) / c.batch_size,
            entropy=float(self.dist.sum((entropy * batch["mask"]).sum()) / tokens),
        )
        return batch, stats

    def loss_options(self, batch: dict) -> dict:
        """rk.policy_loss options of the configured loss_type, normalized by the global batch."""
        c = self.config
        options = trl_policy_loss_kwargs(
            c.loss_type, batch_size=c.batch_size, max_completion_length=batch["labels"].shape[1],
            num_items_in_batch=self.dist.sum(batch["mask"].sum()), num_processes=self.dist.world,
            epsilon=c.epsilon, epsilon_high=c.epsilon_high, beta=c.beta,
        )  # fmt: skip
        options["dp_size"] = self.dist.world  # every loss_type: DDP averages the ranks' shares
        return options

    def loss_fn(self, batch: dict):
        c = self.config
        options = self.loss_options(batch)

        def loss_fn(micro):
            per_step = {"ref_logp": micro["ref_logp"]} if "ref_logp" in micro else {}
            loss, stats = seq.policy_loss(
                self.model, self.hidden(micro), micro, mode=c.logprobs, temperature=c.temperature,
                **options, **per_step,
            )  # fmt: skip
            keep = {k: stats[k] for k in ("clipfrac", "kl") if k in stats}
            return loss, keep, micro["mask"].sum()

        return loss_fn
