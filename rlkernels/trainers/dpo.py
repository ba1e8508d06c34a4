"""DPO on offline preference pairs: the sequence log-probs of chosen and rejected through the fused op
(rk.linear_logprobs, summed over each completion), rk.dpo_loss of its kinds, the reference log-probs computed
once before training. The accuracy is that of the implicit reward β·(logp − ref_logp): on the step's pairs,
and on pairs whose prompts were held out of training."""

from __future__ import annotations

import torch

import rlkernels as rk
from rlkernels.trainers import pairs
from rlkernels.trainers import sequences as seq
from rlkernels.trainers.config import DPOConfig


class DPOTrainer(pairs.PairTrainer):
    """`DPOTrainer(DPOConfig(...)).train()` -> per-step records (see docs/trainers.md)."""

    name = "dpo"
    config_class = DPOConfig

    def before_training(self) -> None:
        super().before_training()
        self.model.eval()
        for split in (self.data.train, self.data.eval):  # the reference is the initial policy
            split["ref_chosen"], split["ref_rejected"] = self.pair_values(split, grad=False)
        self.model.train()

    def pair_values(self, batch: dict, grad: bool):
        """(chosen [n], rejected [n]) summed completion log-probs fp32; without grad, in micro-batches."""
        if grad:
            both = pairs.joined(batch)
            hidden = self.hidden(both)
            logp = seq.token_logprobs(self.model, hidden, both["labels"], mode=self.config.logprobs)
            return pairs.split(logp.sum(-1))
        out = []
        with torch.no_grad():
            for micro in seq.micro_batches(batch, self.config.micro_batch_size):
                out.append(self.score(pairs.joined(micro), 1.0).sum(-1).view(2, -1))
        chosen, rejected = torch.cat(out, 1)
        return chosen, rejected

    def pair_loss(self, chosen, rejected, batch):
        ref = (batch["ref_chosen"], batch["ref_rejected"])
        return rk.dpo_loss(chosen, rejected, *ref, beta=self.config.beta, kind=self.config.kind)

    def margin(self, chosen, rejected, batch):
        return (chosen - batch["ref_chosen"]) - (rejected - batch["ref_rejected"])
