"""The options of the policy_loss ops and the layout of their per-row sums, defined once.

Every flavor reads them from here (docs/design.md, "Options of an op"): the schemas of the native and
Triton ops (through rlkernels/_op_schema.py), the Triton launchers (by field name), and the C++ kernels
through the generated header csrc/include/rlkernels/policy_config.h (`python -m rlkernels.cxx_headers`
writes it; tests/test_op_schemas.py fails when it is stale).
"""

from __future__ import annotations

from typing import Annotated, NamedTuple

from rlkernels._op_schema import Parsed

# The policy objectives (docs/semantics.md). Their codes are their positions: C++ PGObjective, the Triton
# kernels' OBJECTIVE.
OBJECTIVES = ("clip", "cispo", "sapo", "gpg", "dro", "dppo_tv", "dppo_kl", "geo_mean", "vespo")
# The objectives built on a per-row ratio (the kernels' sequence pass, as level="sequence" for clip).
SEQUENCE_OBJECTIVES = ("geo_mean", "vespo")
# Other names of the same per-token math, resolved by the public functions: verl's "reinforce" (its bypass
# mode's REINFORCE with IS weights) is -A·logp·w, which is gpg's term times is_weights.
OBJECTIVE_ALIASES = {"reinforce": "gpg"}

# The stats of policy_loss, in the order the ops return their means.
STAT_KEYS = ("clipfrac", "clipfrac_low", "clipfrac_high", "clipfrac_dual", "approx_kl", "kl", "entropy")

# Columns of the per-row sums [B, len(ROW_STATS)] the forward ops return for their backward: the row's
# token count Σ m, the row's log-ratio statistic before its clamp (seq_level: GSPO's and geo_mean's mean,
# vespo's sum; else 0: rlkernels/reference/policy_loss.py sequence_log_ratio), then the masked
# sums whose batch means are the STAT_KEYS stats (approx_kl's: Σ m·(-clamped log-ratio)). C++ RowStat.
ROW_STATS = ("count", "seq_log_ratio", *STAT_KEYS)


class PolicyConfig(NamedTuple):
    """The options of the policy_loss ops, as their schemas pass them (public names: rk.policy_loss).

    The public function validates them and resolves defaults; a disabled option is None (dual_clip,
    ratio_cap, kl_clamp). kl_kind is a canonical name (reference.kl.KL_KINDS) and is unused without
    ref_logp. A new option is a new field here, in the order the schemas take it."""

    objective: Annotated[str, Parsed("PGObjective", "checked_pg_objective")]
    seq_level: bool  # a per-row ratio: level="sequence" (GSPO) or a SEQUENCE_OBJECTIVES objective
    clip_low: float
    clip_high: float
    dual_clip: float | None
    ratio_cap: float | None
    tau_pos: float  # sapo_tau_pos
    tau_neg: float  # sapo_tau_neg
    dro_beta: float  # the quadratic log-ratio penalty of objective="dro"
    vespo_k_pos: float  # VESPO's gamma weights: shape k and rate λ for A >= 0 and A < 0
    vespo_lambda_pos: float
    vespo_k_neg: float
    vespo_lambda_neg: float
    kl_coef: float
    kl_kind: Annotated[str, Parsed("KLKind", "checked_kl_kind")]
    kl_clamp: float | None
    entropy_coef: float
