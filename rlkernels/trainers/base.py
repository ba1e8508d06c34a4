"""What every trainer shares: the model and optimizer, the training loop with its log, the micro-batch loop
with global normalizers, the supervised warm start, the checkpoint and the curves (docs/trainers.md).

A trainer subclass defines `make_batch(step) -> (batch, record)` (this rank's data or rollouts of a training
step, and their stats) and `loss_fn(batch) -> fn(micro) -> (loss, stats, weight)` (see `update`), and may
define `before_training()`. `learn(batch)` takes the optimizer steps; tests feed it fixed batches.
"""

from __future__ import annotations

import pathlib
import random

import torch

from rlkernels.trainers import sequences as seq
from rlkernels.trainers.config import TrainConfig
from rlkernels.trainers.distributed import setup
from rlkernels.trainers.metrics import RunLog, StepMeter, announce, progress_bar
from rlkernels.trainers.plot import plot_runs
from rlkernels.trainers.tasks import TASKS, CharTokenizer, task_reward, tiny_causal_lm


class Trainer:
    name = "trainer"
    scalar_head = False  # PPO's value head, the reward model's score head

    config_class = TrainConfig

    def __init__(self, config: TrainConfig, reward_fn=None):
        """config: this trainer's config dataclass. reward_fn(prompts: list[str], completions: list[str]) ->
        a reward per completion (list or [B] tensor); default: the task's own reward (trainers/tasks.py)."""
        if not isinstance(config, self.config_class):
            raise TypeError(f"config must be a {self.config_class.__name__}, got {type(config).__name__}")
        if reward_fn is not None and not callable(reward_fn):
            raise TypeError("reward_fn must be callable(prompts, completions) -> rewards")
        self.reward_fn = reward_fn
        config.validate()
        self.config = config
        self.dist = setup(config.device, config.fsdp)
        if config.batch_size % self.dist.world:
            raise ValueError(
                f"batch_size ({config.batch_size}) must divide evenly over the {self.dist.world} ranks"
            )
        self.local_batch = config.batch_size // self.dist.world
        self.device = self.dist.device
        self.show = config.progress and self.dist.main  # bars and progress lines, on the main rank
        self.task = TASKS[config.task]
        self.tokenizer = CharTokenizer()
        prompt_len = len(self.task.prompt(random.Random(0)))
        if prompt_len + self.task.answer_len + 1 > config.context_length:
            raise ValueError(
                f"context_length ({config.context_length}) is shorter than a prompt of task {config.task!r} "
                f"({prompt_len} tokens) and its completion ({self.task.answer_len + 1} tokens with EOS)"
            )
        announce(
            f"{self.name}: building the model (a tiny Qwen2 with a {config.vocab_size}-token vocabulary, "
            f"width {config.hidden_size}, {config.num_layers} layers) on {self.device}",
            self.show,
        )
        self.model = self.new_model()
        self.ddp = self.dist.wrap(self.model)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=config.lr)
        self.rng = random.Random(1_000_003 * config.seed + self.dist.rank)  # prompts differ per rank
        torch.manual_seed(1_000_003 * config.seed + self.dist.rank)  # so do the sampled completions
        self.out_dir = None if config.out_dir is None else pathlib.Path(config.out_dir)

    def new_model(self) -> seq.Backbone:
        """The tiny model of the config (with this trainer's scalar head), initialized from config.seed: the
        same on every rank."""
        c = self.config
        with torch.random.fork_rng(devices=[]):  # leaves the sampling RNG where it was
            lm = tiny_causal_lm(c.vocab_size, c.hidden_size, c.num_layers, c.seed, c.context_length)
            torch.manual_seed(c.seed)  # the scalar head
            return seq.Backbone(lm, scalar_head=self.scalar_head).to(self.device)

    # -- the loop ---------------------------------------------------------------------------------------
    def train(self) -> list[dict]:
        """Run config.steps optimizer steps; return the per-step records (also the JSONL log's lines)."""
        c = self.config
        self.before_training()
        files = self.out_dir is not None and self.dist.main
        jsonl = self.out_dir / f"{self.run_name}.jsonl" if files else None
        log = RunLog(self.run_name, c.steps, jsonl, show=self.show)
        self.model.train()
        for step in range(1, c.steps + 1):
            with StepMeter(self.device) as meter:
                record = self.step(step)
            tokens = float(self.dist.sum(record.pop("tokens")))
            record.update(seconds=meter.seconds, tokens_per_s=tokens / meter.seconds, peak_mib=meter.peak_mib)
            log.add(step, record)
        log.close()
        state = self.dist.full_state_dict(self.model) if c.save and self.out_dir is not None else None
        if files:
            if c.save:
                checkpoint = self.out_dir / f"{self.run_name}-model"
                lm = {k[len("lm.") :]: v for k, v in state.items() if k.startswith("lm.")}
                self.model.lm.save_pretrained(checkpoint, state_dict=lm)
                if self.model.scalar is not None:
                    head = {k[len("scalar.") :]: v for k, v in state.items() if k.startswith("scalar.")}
                    torch.save(head, checkpoint / "scalar_head.pt")
            plot_runs({c.logprobs: log.history}, self.out_dir / f"{self.run_name}.png", self.run_name)
        return log.history

    @property
    def run_name(self) -> str:
        return f"{self.name}-{self.config.task}-{self.config.logprobs}"

    def before_training(self) -> None:
        pass

    def step(self, step: int) -> dict:
        batch, record = self.make_batch(step)
        record.update(self.learn(batch))
        record["tokens"] = self.tokens(batch)
        return record

    def tokens(self, batch: dict) -> float:
        """The completion tokens of this rank's batch (the log's tokens/s)."""
        return float(batch["mask"].sum())

    def make_batch(self, step: int) -> tuple[dict, dict]:
        raise NotImplementedError

    def loss_fn(self, batch: dict):
        raise NotImplementedError

    def learn(self, batch: dict) -> dict:
        """`epochs` optimizer steps (RL; else one) on this rank's batch; the last one's record."""
        fn = self.loss_fn(batch)
        for _ in range(getattr(self.config, "epochs", 1)):  # RL: old_logp stays the rollout policy's
            record = self.update(batch, fn)
        return record

    # -- one optimizer step over micro-batches -----------------------------------------------------------
    def update(self, batch: dict, loss_fn) -> dict:
        """Forward and backward each micro-batch of this rank's `batch` (DDP syncs on the last), then clip and
        step. loss_fn(micro) -> (loss, stats, weight): the loss already divided by the global normalizer
        (so the micro-batch losses add up to this rank's share, whatever the split), its stats, and the
        weight of those stats in the step's mean (e.g. the micro-batch's token count).
        Returns the step's loss (mean over ranks of their shares) and weighted-mean stats over all ranks."""
        micros = seq.micro_batches(batch, self.config.micro_batch_size)
        total_loss = 0.0
        sums: dict[str, float] = {}
        total_weight = 0.0
        for i, micro in enumerate(micros):
            with self.dist.no_sync(self.ddp, last=i == len(micros) - 1):
                loss, stats, weight = loss_fn(micro)
                loss.backward()
            total_loss += float(loss.detach())
            total_weight += float(weight)
            for k, v in stats.items():
                sums[k] = sums.get(k, 0.0) + float(v) * float(weight)
        if self.config.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        weight = float(self.dist.sum(total_weight))
        out = {k: float(self.dist.sum(v)) / max(weight, 1e-12) for k, v in sums.items()}
        out["loss"] = float(self.dist.sum(total_loss)) / self.dist.world
        return out

    # -- shared pieces -----------------------------------------------------------------------------------
    def hidden(self, micro: dict) -> torch.Tensor:
        """The completion rows' last hidden states [b, C, D] of a micro-batch, through the DDP wrapper."""
        hidden = self.ddp(micro["input_ids"], micro["attention_mask"])
        return seq.completion_hidden(hidden, micro["labels"].shape[1])

    def prompts(self, n: int) -> list[str]:
        return [self.task.prompt(self.rng) for _ in range(n)]

    def warm_start(self, steps: int, lr: float) -> None:
        """`steps` supervised steps on the task's answers (token mean over the global batch) at learning rate
        `lr`, before RL. The optimizer's state is reset afterwards."""
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        mode = self.config.logprobs
        if steps:
            announce(
                f"{self.run_name}: {steps} supervised warm-start steps on the task's answers before RL "
                "(--warmup-steps)",
                self.show,
            )
        bar = progress_bar(steps, f"{self.run_name} warm start", self.show and steps > 0)
        for _ in range(steps):
            prompts = self.prompts(self.local_batch)
            answers = [self.task.answer(p) for p in prompts]
            batch = seq.answer_batch(self.tokenizer, prompts, answers, self.device)
            num_tokens = self.dist.sum(batch["mask"].sum())

            def nll(micro, num_tokens=num_tokens):
                logp = seq.token_logprobs(self.model, self.hidden(micro), micro["labels"], mode=mode)
                return -(logp * micro["mask"]).sum() * self.dist.world / num_tokens, {}, 0

            record = self.update(batch, nll)
            bar.set_postfix(nll=f"{record['loss']:.3g}", refresh=False)
            bar.update(1)
        bar.close()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=self.config.lr)

    @torch.no_grad()
    def score(self, batch: dict, temperature: float, *, model=None, entropy: bool = False):
        """Per-token log-probs [B, C] of the batch's completions under `model` (default: the policy) with the
        fused op (or the eager logits, as the run), no graph; (logp, entropy) if asked."""
        model = self.model if model is None else model
        hidden = model(batch["input_ids"], batch["attention_mask"])
        hidden = seq.completion_hidden(hidden, batch["labels"].shape[1])
        return seq.token_logprobs(
            model, hidden, batch["labels"], mode=self.config.logprobs, temperature=temperature,
            return_entropy=entropy,
        )  # fmt: skip

    def rollout(self, prompts: list[str], repeat: int = 1) -> tuple[dict, torch.Tensor]:
        """Sample `repeat` completions per prompt (rows grouped by prompt): the batch and its rewards [B]
        fp32 from the reward function."""
        rows = [p for p in prompts for _ in range(repeat)]
        prompt_ids = seq.encode_prompts(self.tokenizer, rows, self.device)
        self.model.eval()
        with self.dist.gathered(self.model):
            batch = seq.sample(self.model.lm, prompt_ids, self.task.answer_len + 1, self.config.temperature)
        self.model.train()
        completions = [self.tokenizer.decode(c) for c in batch["labels"].clamp(min=0)]
        return batch, self.rewards(rows, completions)

    def rewards(self, prompts: list[str], completions: list[str]) -> torch.Tensor:
        """reward_fn(prompts, completions) (default: exact match with the task's answer) as a [B] fp32 tensor,
        checked: one finite number per completion."""
        fn = self.reward_fn or (lambda p, c: task_reward(self.task, p, c))
        out = torch.as_tensor(fn(prompts, completions), dtype=torch.float32)
        if out.shape != (len(completions),):
            raise ValueError(
                f"reward_fn must return one reward per completion: {len(completions)} expected, got shape "
                f"{tuple(out.shape)}"
            )
        if not bool(out.isfinite().all()):
            raise ValueError("reward_fn returned a non-finite reward")
        return out.to(self.device)

    def reference(self) -> seq.Backbone:
        """A frozen copy of the current policy (after the warm start): the KL's reference model (sharded too
        under FSDP)."""
        ref = self.new_model()
        ref.load_state_dict(self.dist.full_state_dict(self.model))
        ref.requires_grad_(False)
        if self.dist.fsdp:
            from rlkernels.trainers.distributed import shard

            shard(ref)
        return ref.eval()
