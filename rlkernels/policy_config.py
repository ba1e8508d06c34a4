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
OBJECTIVES = ("clip", "cispo", "sapo", "gpg", "dro", "dppo_tv", "dppo_kl")
# Other names of the same per-token math, resolved by the public functions: verl's "reinforce" (its bypass
# mode's REINFORCE with IS weights) is -A·logp·w, which is gpg's term times is_weights.
OBJECTIVE_ALIASES = {"reinforce": "gpg"}

# The stats of policy_loss, in the order the ops return their means.
STAT_KEYS = ("clipfrac", "clipfrac_low", "clipfrac_high", "clipfrac_dual", "approx_kl", "kl", "entropy")

# Columns of the per-row sums [B, len(ROW_STATS)] the forward ops return for their backward: the row's
# token count Σ m, the row's mean log-ratio before its clamp (level="sequence", else 0), then the masked
# sums whose batch means are the STAT_KEYS stats (approx_kl's: Σ m·(-clamped log-ratio)). C++ RowStat.
ROW_STATS = ("count", "seq_log_ratio", *STAT_KEYS)


class PolicyConfig(NamedTuple):
    """The options of the policy_loss ops, as their schemas pass them (public names: rk.policy_loss).

    The public function validates them and resolves defaults; a disabled option is None (dual_clip,
    ratio_cap, kl_clamp). kl_kind is a canonical name (reference.kl.KL_KINDS) and is unused without
    ref_logp. A new option is a new field here, in the order the schemas take it."""

    objective: Annotated[str, Parsed("PGObjective", "checked_pg_objective")]
    seq_level: bool  # level="sequence" (GSPO)
    clip_low: float
    clip_high: float
    dual_clip: float | None
    ratio_cap: float | None
    tau_pos: float  # sapo_tau_pos
    tau_neg: float  # sapo_tau_neg
    dro_beta: float  # the quadratic log-ratio penalty of objective="dro"
    kl_coef: float
    kl_kind: Annotated[str, Parsed("KLKind", "checked_kl_kind")]
    kl_clamp: float | None
    entropy_coef: float
