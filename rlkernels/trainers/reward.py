"""A reward model: a scalar head on the causal LM's last hidden state at the completion's last token (its
EOS), trained on preference pairs with the Bradley–Terry loss −log σ(r_chosen − r_rejected) (rk.dpo_loss with
beta=1 and no reference is exactly that). Reports the pairwise accuracy on the step's pairs and on pairs
whose prompts were held out of training."""

from __future__ import annotations

import torch

import rlkernels as rk
from rlkernels.trainers import pairs
from rlkernels.trainers import sequences as seq
from rlkernels.trainers.config import RewardConfig


class RewardTrainer(pairs.PairTrainer):
    """`RewardTrainer(RewardConfig(...)).train()` -> per-step records; `scores(seqs)` rates sequences."""

    name = "rm"
    config_class = RewardConfig
    scalar_head = True

    def scores(self, seqs: dict, grad: bool = True) -> torch.Tensor:
        """[B] fp32 scores of a sequence dict: the scalar head at each row's last attended token."""
        hidden = (self.ddp if grad else self.model)(seqs["input_ids"], seqs["attention_mask"])  # [B, T, D]
        last = seqs["attention_mask"].sum(1) - 1  # no left padding: the last attended position
        rows = torch.arange(hidden.shape[0], device=hidden.device)
        return seq.at_least_fp32(self.model.scalar(hidden[rows, last]).squeeze(-1))

    def as_reward_fn(self):
        """This model as the reward of the RL trainers: reward_fn(prompts, completions) -> [B] fp32 scores,
        e.g. `PPOTrainer(PPOConfig(), reward_fn=rm.as_reward_fn())` (PPO adds it at the last token)."""

        def score(prompts: list[str], completions: list[str]) -> torch.Tensor:
            seqs = seq.answer_batch(self.tokenizer, prompts, completions, self.device)
            was_training = self.model.training
            self.model.eval()
            with torch.no_grad():
                out = self.scores(seqs, grad=False)
            self.model.train(was_training)
            return out

        return score

    def pair_values(self, batch: dict, grad: bool):
        return pairs.split(self.scores(pairs.joined(batch), grad))

    def pair_loss(self, chosen, rejected, batch):
        return rk.dpo_loss(chosen, rejected, beta=1.0, kind="sigmoid")  # Bradley–Terry
