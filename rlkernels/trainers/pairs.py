"""Preference pairs for the DPO and reward-model trainers, and the loop they share. Each row of a pair batch
holds a chosen and a rejected
completion of one prompt, stored side by side (`chosen_*` and `rejected_*` keys, the sequence dict of
trainers.sequences under each prefix), so that micro-batches are row slices like every other batch."""

from __future__ import annotations

import torch

from rlkernels.trainers import sequences as seq
from rlkernels.trainers.base import Trainer
from rlkernels.trainers.tasks import preference_pairs

SIDES = ("chosen", "rejected")


def pair_batch(tokenizer, triples: list[tuple[str, str, str]], device) -> dict:
    """[n] (prompt, chosen, rejected) -> the pair batch dict (both sides padded to one width)."""
    prompts = [p for p, _, _ in triples] * 2
    answers = [c for _, c, _ in triples] + [r for _, _, r in triples]
    both = seq.answer_batch(tokenizer, prompts, answers, device)
    n = len(triples)
    return {f"{side}_{k}": v[i * n : (i + 1) * n] for i, side in enumerate(SIDES) for k, v in both.items()}


def joined(batch: dict) -> dict:
    """The [2n] sequence dict of a pair batch: its chosen rows, then its rejected rows."""
    keys = ("input_ids", "attention_mask", "labels", "mask")
    return {k: torch.cat([batch[f"{side}_{k}"] for side in SIDES]) for k in keys}


def split(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[2n] values of joined(batch) -> (chosen [n], rejected [n])."""
    n = values.shape[0] // 2
    return values[:n], values[n:]


class PairData:
    """A fixed training set of `num_pairs` pairs, cycled in order, and a set of pairs whose prompts are held
    out of training (this rank's share of them in `eval`).
    `step_batch(step)` is this rank's share of the global batch of that step."""

    def __init__(self, task, tokenizer, num_pairs: int, eval_pairs: int, seed: int, dist, batch_size: int):
        self.dist, self.batch_size = dist, batch_size
        self.train = pair_batch(tokenizer, preference_pairs(task, num_pairs, seed), dist.device)
        held_out = preference_pairs(task, eval_pairs, seed, held_out=True)  # prompts never trained on
        self.eval = pair_batch(tokenizer, held_out[dist.rank :: dist.world], dist.device)
        self.num_pairs = num_pairs

    def step_batch(self, step: int) -> dict:
        local = self.batch_size // self.dist.world
        start = (step - 1) * self.batch_size + self.dist.rank * local
        index = torch.arange(start, start + local, device=self.dist.device) % self.num_pairs
        return {k: v[index] for k, v in self.train.items()}


class PairTrainer(Trainer):
    """What the DPO and reward-model trainers share: the pair data, the step (a loss that is a mean over
    pairs, weighed by each micro-batch's share of the global batch) and the held-out accuracy. A subclass
    defines `pair_values(batch, grad) -> (chosen [n], rejected [n])` (the policy's sequence log-probs, the
    reward model's scores) and `pair_loss(chosen, rejected, batch) -> (loss, rk stats)`; a pair is won when
    `margin(...)` > 0."""

    def before_training(self) -> None:
        c = self.config
        self.data = PairData(
            self.task, self.tokenizer, c.num_pairs, c.eval_pairs, c.seed, self.dist, c.batch_size
        )

    def margin(self, chosen, rejected, batch) -> torch.Tensor:
        return chosen - rejected

    def held_out_accuracy(self) -> float:
        self.model.eval()
        with torch.no_grad():
            chosen, rejected = self.pair_values(self.data.eval, grad=False)
        self.model.train()
        wins = (self.margin(chosen, rejected, self.data.eval) > 0).sum()
        return float(self.dist.sum(wins) / self.dist.sum(chosen.numel()))

    def make_batch(self, step: int) -> tuple[dict, dict]:
        return self.data.step_batch(step), {}

    def tokens(self, batch: dict) -> float:
        return float(batch["chosen_mask"].sum() + batch["rejected_mask"].sum())

    def loss_fn(self, batch: dict):
        c = self.config

        def loss_fn(micro):
            chosen, rejected = self.pair_values(micro, grad=True)
            loss, stats = self.pair_loss(chosen, rejected, micro)
            n = chosen.shape[0]  # the loss is a mean over the micro-batch's pairs: weigh it by its share
            keep = dict(accuracy=stats["reward_accuracy"], margin=stats["reward_margin"])
            return loss * n * self.dist.world / c.batch_size, keep, n

        return loss_fn

    def step(self, step: int) -> dict:
        """The step's record, with the held-out accuracy: at step 1 the untrained model's (the curve's first
        point), then after every eval_every-th step and the last."""
        initial = self.held_out_accuracy() if step == 1 else None
        record = super().step(step)
        if initial is not None:
            record["eval_accuracy"] = initial
        elif step % self.config.eval_every == 0 or step == self.config.steps:
            record["eval_accuracy"] = self.held_out_accuracy()
        return record
