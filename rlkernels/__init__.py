"""rlkernels: fused kernels for reinforcement-learning post-training of large language models.

Every function takes a keyword-only `backend="auto" | "triton" | "cuda" | "cpu" | "reference"`.
Importing rlkernels loads the C++ extension if it is built and never touches a GPU.
"""

from rlkernels._backend import BACKENDS
from rlkernels._errors import BackendUnavailableError
from rlkernels._ext import build_info, ext_available
from rlkernels.ops.advantage_estimators import (
    ADVANTAGE_ESTIMATORS,
    advantages,
    gdpo_advantages,
    gpg_advantages,
    grpo_passk_advantages,
    opo_advantages,
    optimal_token_baseline_advantages,
    reinforce_plus_plus_advantages,
    reinforce_plus_plus_baseline_advantages,
    remax_advantages,
    trl_grpo_advantages,
)
from rlkernels.ops.advantages import group_advantages
from rlkernels.ops.agg_loss import agg_loss
from rlkernels.ops.dapo import dynamic_sampling, overlong_penalty
from rlkernels.ops.dpo import dpo_loss
from rlkernels.ops.gae import discounted_returns, gae
from rlkernels.ops.kl import kl_penalty
from rlkernels.ops.linear_policy_loss import linear_policy_loss
from rlkernels.ops.linear_preference_loss import linear_preference_loss
from rlkernels.ops.logprobs import linear_logprobs, logprobs_from_logits
from rlkernels.ops.policy_loss import policy_loss
from rlkernels.ops.rollout_correction import RolloutCorrectionConfig, rollout_correction
from rlkernels.ops.value_loss import value_loss
from rlkernels.reference.cov_selection import CovOptions

__version__ = "0.1.0"

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "BACKENDS",
    "BackendUnavailableError",
    "CovOptions",
    "advantages",
    "agg_loss",
    "build_info",
    "discounted_returns",
    "dpo_loss",
    "dynamic_sampling",
    "ext_available",
    "gae",
    "gdpo_advantages",
    "gpg_advantages",
    "group_advantages",
    "grpo_passk_advantages",
    "kl_penalty",
    "linear_logprobs",
    "linear_policy_loss",
    "linear_preference_loss",
    "logprobs_from_logits",
    "opo_advantages",
    "optimal_token_baseline_advantages",
    "overlong_penalty",
    "policy_loss",
    "reinforce_plus_plus_advantages",
    "reinforce_plus_plus_baseline_advantages",
    "remax_advantages",
    "rollout_correction",
    "RolloutCorrectionConfig",
    "trl_grpo_advantages",
    "value_loss",
]
