"""Thin trainers on Hugging Face causal LMs built from rlkernels' ops: a reward model, PPO, GRPO and DPO,
one process or many under torchrun (docs/trainers.md). `python -m rlkernels train --algo ...` runs them on
the built-in tasks."""

from rlkernels.trainers.config import DPOConfig, GRPOConfig, PPOConfig, RewardConfig, TrainConfig
from rlkernels.trainers.dpo import DPOTrainer
from rlkernels.trainers.grpo import GRPOTrainer
from rlkernels.trainers.ppo import PPOTrainer
from rlkernels.trainers.reward import RewardTrainer

TRAINERS = {"grpo": GRPOTrainer, "ppo": PPOTrainer, "dpo": DPOTrainer, "rm": RewardTrainer}

__all__ = [
    "DPOConfig", "DPOTrainer", "GRPOConfig", "GRPOTrainer", "PPOConfig", "PPOTrainer", "RewardConfig",
    "RewardTrainer", "TRAINERS", "TrainConfig",
]  # fmt: skip
