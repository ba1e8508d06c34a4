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
from rlkernels.trainers.metrics import progress_bar


class DPOTrainer(pairs.PairTrainer):
    """`DPOTrainer(DPOConfig(...)).train()` -> per-step records (see docs/trainers.md)."""

    name = "dpo"
    config_class = DPOConfig

    def before_training(self) -> None:
        super().before_training()
        self.model.eval()
        for name, split in (("training", self.data.train), ("held-out", self.data.eval)):
            # the reference is the initial policy
            desc = f"{self.run_name} reference log-probs of the {name} pairs"
            split["ref_chosen"], split["ref_rejected"] = self.pair_values(split, grad=False, desc=desc)
        self.model.train()

    def pair_values(self, batch: dict, grad: bool, desc: str | None = None):
        """(chosen [n], rejected [n]) summed completion log-probs fp32; without grad, in micro-batches (a
        progress bar named `desc` over them, if given)."""
        if grad:
            both = pairs.joined(batch)
            hidden = self.hidden(both)
            logp = seq.token_logprobs(self.model, hidden, both["labels"], mode=self.config.logprobs)
            return pairs.split(logp.sum(-1))
        out = []
        micros = seq.micro_batches(batch, self.config.micro_batch_size)
        bar = progress_bar(len(micros), desc or "", self.show and desc is not None)
        with torch.no_grad():
            for micro in micros:
                out.append(self.score(pairs.joined(micro), 1.0).sum(-1).view(2, -1))
                bar.update(1)
        bar.close()
        chosen, rejected = torch.cat(out, 1)
        return chosen, rejected

    def pair_loss(self, chosen, rejected, batch):
        ref = (batch["ref_chosen"], batch["ref_rejected"])
        return rk.dpo_loss(chosen, rejected, *ref, beta=self.config.beta, kind=self.config.kind)

    def margin(self, chosen, rejected, batch):
        return (chosen - batch["ref_chosen"]) - (rejected - batch["ref_rejected"])
