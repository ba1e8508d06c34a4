"""The options of the trainers, one dataclass each, defined once: the command line (`python -m rlkernels
train`) is generated from these fields and their comments are its help."""

from __future__ import annotations

from dataclasses import dataclass, field

from rlkernels.reference.dpo import DPO_KINDS
from rlkernels.trainers.tasks import TASKS

LOGPROBS = ("fused", "eager")


@dataclass
class TrainConfig:
    """What every trainer takes. Batch sizes count sequences (RL: completions; DPO and RM: pairs)."""

    task: str = field(default="sort", metadata={"help": f"built-in task: {', '.join(TASKS)}"})
    steps: int = field(
        default=60,
        metadata={"help": "training steps (RL: a rollout batch, then `epochs` optimizer steps on it)"},
    )
    batch_size: int = field(default=64, metadata={"help": "sequences per optimizer step, over all ranks"})
    micro_batch_size: int = field(default=16, metadata={"help": "sequences per forward/backward on a rank"})
    lr: float = field(default=1e-3, metadata={"help": "AdamW learning rate"})
    max_grad_norm: float = field(default=1.0, metadata={"help": "gradient clipping (0: off)"})
    logprobs: str = field(
        default="fused", metadata={"help": "fused: rlkernels from hidden states; eager: full logits"}
    )
    device: str = field(default="cpu", metadata={"help": "cpu or cuda (cuda:<rank> under torchrun)"})
    fsdp: bool = field(
        default=False, metadata={"help": "under torchrun: shard the model with FSDP2 instead of DDP"}
    )
    seed: int = field(default=0, metadata={"help": "model initialization and sampling"})
    vocab_size: int = field(default=128256, metadata={"help": "the tiny model's vocabulary (Llama 3's)"})
    hidden_size: int = field(default=64, metadata={"help": "the tiny model's width"})
    num_layers: int = field(default=2, metadata={"help": "the tiny model's depth"})
    context_length: int = field(default=64, metadata={"help": "the tiny model's context (positions)"})
    out_dir: str | None = field(
        default=None,
        metadata={"help": "where the JSONL log, PNG and checkpoint go (None: no files; the command line "
                  "then uses a fresh train-runs/<algo>-<date>-<time>/)"},
    )  # fmt: skip
    save: bool = field(
        default=True, metadata={"help": "save_pretrained the model into the output directory at the end"}
    )
    progress: bool = field(
        default=True,
        metadata={"help": "progress from the start: what runs, bars for the warm start (or DPO's reference "
                  "log-probs) and the steps, a log line per step"},
    )  # fmt: skip

    def validate(self) -> None:
        """ValueError naming the first bad option (the trainers call it before building anything)."""
        if self.task not in TASKS:
            raise ValueError(f"task must be one of {tuple(TASKS)}, got {self.task!r}")
        if self.logprobs not in LOGPROBS:
            raise ValueError(f"logprobs must be one of {LOGPROBS}, got {self.logprobs!r}")
        for name in ("steps", "batch_size", "micro_batch_size", "vocab_size", "hidden_size", "num_layers",
                     "context_length"):  # fmt: skip
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.lr <= 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")


@dataclass
class RLOptions:
    """What the RL trainers add. RL starts from a supervised model: `warmup_steps` of next-token training on
    the task's answers come first (a random 128k-vocabulary model almost never samples a character, so
    every reward would be 0)."""

    warmup_steps: int = field(default=30, metadata={"help": "supervised steps before RL (0: none)"})
    warmup_lr: float = field(default=1e-2, metadata={"help": "AdamW learning rate of the warm start"})
    temperature: float = field(default=1.0, metadata={"help": "sampling temperature (log-probs use it too)"})
    epochs: int = field(
        default=2, metadata={"help": "optimizer steps per rollout batch (the clip acts from the 2nd)"}
    )

    def validate(self) -> None:
        super().validate()  # TrainConfig's, next in the MRO of the configs that mix this in
        if self.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {self.warmup_steps}")
        if self.epochs < 1:
            raise ValueError(f"epochs must be >= 1, got {self.epochs}")
        for name in ("temperature", "warmup_lr"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")


@dataclass
class PairOptions:
    """What the preference trainers (DPO, the reward model) add: their pair data and its evaluation."""

    num_pairs: int = field(default=2048, metadata={"help": "training pairs (cycled)"})
    eval_pairs: int = field(default=256, metadata={"help": "held-out pairs for the accuracy"})
    eval_every: int = field(default=10, metadata={"help": "steps between held-out evaluations"})

    def validate(self) -> None:
        super().validate()  # TrainConfig's, next in the MRO of the configs that mix this in
        for name in ("num_pairs", "eval_pairs", "eval_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


@dataclass
class GRPOConfig(RLOptions, TrainConfig):
    lr: float = field(default=3e-3, metadata={"help": "AdamW learning rate"})
    group_size: int = field(default=8, metadata={"help": "completions per prompt (divides batch_size)"})
    loss_type: str = field(default="dapo", metadata={"help": "grpo, dr_grpo or dapo (TRL's names)"})
    epsilon: float = field(default=0.2, metadata={"help": "lower clip range"})
    epsilon_high: float = field(default=0.28, metadata={"help": "upper clip range"})
    beta: float = field(default=0.02, metadata={"help": "k3 KL to the reference model (0: none)"})

    def validate(self) -> None:
        super().validate()
        if self.loss_type not in ("grpo", "dr_grpo", "dapo"):
            raise ValueError(f"loss_type must be one of ('grpo', 'dr_grpo', 'dapo'), got {self.loss_type!r}")
        if self.group_size < 2 or self.batch_size % self.group_size:
            raise ValueError(
                f"group_size must be >= 2 and divide batch_size, got group_size={self.group_size}, "
                f"batch_size={self.batch_size}"
            )


@dataclass
class PPOConfig(RLOptions, TrainConfig):
    lr: float = field(default=3e-3, metadata={"help": "AdamW learning rate"})
    kl_coef: float = field(default=0.05, metadata={"help": "per-token k1 KL to the reference, in the reward"})
    gamma: float = field(default=1.0, metadata={"help": "GAE discount"})
    lam: float = field(default=0.95, metadata={"help": "GAE lambda"})
    clip: float = field(default=0.2, metadata={"help": "policy clip range"})
    value_clip: float = field(default=0.2, metadata={"help": "value clip range"})
    vf_coef: float = field(default=0.5, metadata={"help": "weight of the value loss"})


@dataclass
class DPOConfig(PairOptions, TrainConfig):
    beta: float = field(default=0.1, metadata={"help": "DPO beta"})
    kind: str = field(default="sigmoid", metadata={"help": "sigmoid, ipo, hinge or robust (rk.dpo_loss)"})

    def validate(self) -> None:
        super().validate()
        if self.kind not in DPO_KINDS:
            raise ValueError(f"kind must be one of {DPO_KINDS}, got {self.kind!r}")


@dataclass
class RewardConfig(PairOptions, TrainConfig):
    def validate(self) -> None:
        super().validate()
        if self.logprobs != "fused":
            raise ValueError("logprobs does not apply to the reward model (it has a scalar head, no LM head)")


CONFIGS = {"grpo": GRPOConfig, "ppo": PPOConfig, "dpo": DPOConfig, "rm": RewardConfig}
