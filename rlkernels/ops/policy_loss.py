"""policy_loss: custom ops (native C++/CUDA and Triton), their fake and autograd registrations, and the
public function.

The ops compute, in one pass over the tokens, the per-row masked loss sums and the per-row sums behind the
stats, and finish the loss of the chosen `agg` and the stat means from them inside the op: on a GPU in the
forward launch itself, whose last program (block) reduces every program's partials
(docs/gpu_token_ops.md; csrc/include/rlkernels/aggregation.h for the C++ kernels, triton/_aggregation.py for
Triton); one op call and one autograd node, where finishing in Python cost a dozen [B]-sized torch ops. The
kernels also check the input values they read and return a flag (`ok`), so that no Python-level value
check runs on the hot path. The backward pass writes d logp (and d entropy) in one pass.

Backward design (measured in benchmarks/bench_policy_loss.py, CPU, B=64 T=4096, fp32, 1 thread): when logp
requires grad, the forward pass also writes d(row sum)/d logp per token (its inputs are in registers
anyway), and the backward pass only scales it per row: backward 0.36 ms instead of 1.33 ms for
recomputing the tokens, forward+backward 1.89 ms instead of 2.36 ms. In an eager backward that frees the
graph, the saved buffer is scaled in place and becomes d logp, so the peak extra memory stays 2 x B x T
values (d logp and d entropy); one native pass (one launch on a GPU; the Triton flavor's backward kernel
likewise) does that and writes d entropy (on CPU ~6 % of the forward+backward step against mul_ plus the
backward op, interleaved A/B at 2 threads). Under
retain_graph, torch.compile, a direct call of the registered op or a dtype change the buffer is read, not
consumed. `SAVE_GRAD_IN_FORWARD = False` selects the recomputing backward.
"""

from __future__ import annotations

import functools
import inspect
import math
from typing import NamedTuple

import torch

from rlkernels import _validate as v
from rlkernels._backend import select_backend
from rlkernels._dtypes import acc_dtype
from rlkernels._op_schema import Signature
from rlkernels.ops._aggregation import AggConfig, agg_op_args, check_agg_args
from rlkernels.ops._flags import check_flag
from rlkernels.ops._library import has_native, op, op_name, register_backends, takes_native_eager
from rlkernels.ops._token_masks import native_mask
from rlkernels.policy_config import (
    OBJECTIVE_ALIASES,
    OBJECTIVES,
    ROW_STATS,
    SEQUENCE_OBJECTIVES,
    STAT_KEYS,
    PolicyConfig,
)
from rlkernels.reference import policy_loss as reference
from rlkernels.reference.aggregation import masked_mean
from rlkernels.reference.cov_selection import COV_OBJECTIVES, CovOptions, cov_selection
from rlkernels.reference.kl import KL_KINDS
from rlkernels.reference.policy_loss import LEVELS, LOG_RATIO_BOUND

OP = "policy_loss"
# The backward design (module docstring): save d logp in the forward pass when logp requires grad.
SAVE_GRAD_IN_FORWARD = True

Tensor = torch.Tensor


class PolicyInputs(NamedTuple):
    """The tensors of the policy_loss ops (csrc/rlkernels.cpp documents their shapes)."""

    logp: Tensor
    old_logp: Tensor
    advantages: Tensor
    mask: Tensor
    ref_logp: Tensor | None
    entropy: Tensor | None
    is_weights: Tensor | None


# The ops' arguments, for both flavors: the native schemas in csrc/rlkernels.cpp take the option and
# aggregation fragments from the headers generated from these tables (tests/test_op_schemas.py).
FORWARD = Signature(
    "policy_loss",
    [PolicyInputs, PolicyConfig, AggConfig, ("save_grad", bool)],
    returns="(Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)",
)
BACKWARD = Signature(
    "policy_loss_backward",
    [
        ("grad_loss", Tensor), ("row_weights", Tensor), ("row_stats", Tensor), ("saved_grad", Tensor),
        PolicyInputs, PolicyConfig, ("logp_grad", bool), ("entropy_grad", bool),
    ],
    returns="(Tensor, Tensor)",
)  # fmt: skip
# The differentiable inputs' positions in the forward op's arguments, and the slices of its tensors and
# options (what the autograd formula keeps).
LOGP_ARG, ENTROPY_ARG = FORWARD.index("logp"), FORWARD.index("entropy")
INPUTS_ARGS, CONFIG_ARGS = FORWARD.part(PolicyInputs), FORWARD.part(PolicyConfig)


@torch.library.custom_op("rlkernels::policy_loss_triton", mutates_args=(), schema=FORWARD.schema())
def _policy_loss_triton(*args) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    from rlkernels.triton.policy_loss import policy_loss_forward

    inputs, config, agg, save_grad = FORWARD.unpack(args)
    return policy_loss_forward(*inputs, config, agg, save_grad)


@torch.library.custom_op("rlkernels::policy_loss_triton_backward", mutates_args=(), schema=BACKWARD.schema())
def _policy_loss_triton_backward(*args) -> tuple[Tensor, Tensor]:
    from rlkernels.triton.policy_loss import policy_loss_backward

    args = BACKWARD.unpack(args)
    grad_loss, row_weights, row_stats, saved_grad, inputs, config, logp_grad, entropy_grad = args
    return policy_loss_backward(
        grad_loss, row_weights, row_stats, saved_grad, *inputs, config, logp_grad, entropy_grad
    )


def _fake(*args):
    inputs, _config, _agg, save_grad = FORWARD.unpack(args)
    logp = inputs.logp
    B, T = logp.shape
    acc = acc_dtype(logp.dtype)
    return (
        logp.new_empty((), dtype=acc),
        logp.new_empty(len(STAT_KEYS), dtype=acc),
        logp.new_empty(B, dtype=acc),
        logp.new_empty(B, len(ROW_STATS), dtype=acc),
        logp.new_empty((B, T) if save_grad else (0, 0), dtype=acc),
        logp.new_empty((), dtype=torch.bool),
    )


def _fake_backward(*args):
    *_, inputs, _config, logp_grad, entropy_grad = BACKWARD.unpack(args)
    logp = inputs.logp
    return (
        logp.new_empty(logp.shape if logp_grad else (0, 0)),
        logp.new_empty(logp.shape if entropy_grad else (0, 0)),
    )


def _setup_context(ctx, inputs, output):
    _loss, stats, row_weights, row_stats, saved, ok = output
    ctx.save_for_backward(row_weights, row_stats, saved, *inputs[INPUTS_ARGS])
    ctx.config = PolicyConfig._make(inputs[CONFIG_ARGS])
    ctx.num_inputs = len(inputs)
    ctx.mark_non_differentiable(stats, row_weights, row_stats, saved, ok)
    ctx.set_materialize_grads(False)  # no [B, T] zero gradient for the saved buffer


def _may_consume_saved(ctx, saved: Tensor) -> bool:
    """True inside an eager backward pass of the public function (ops/_library.py fast path: no caller holds
    the saved buffer) over plain tensors that frees the graph afterwards (no retain_graph / create_graph):
    the forward pass's saved d logp buffer is then read for the last time and can become the gradient.
    Never for a direct call of the registered op or while tracing (torch.compile, opcheck: fake or
    functional tensor subclasses), where the op stays functional."""
    return (
        getattr(ctx, "fast_path", False)
        and type(saved) is torch.Tensor
        and not torch.compiler.is_compiling()
        and torch._C._current_graph_task_id() != -1
        and not torch._C._autograd._get_current_graph_task_keep_graph()
    )


def _fake_into_saved(saved_grad, grad_loss, row_weights, mask, entropy_coef, entropy_grad):
    return saved_grad.new_empty(saved_grad.shape if entropy_grad else (0, 0))


# One native pass (one launch on a GPU) turns the saved buffer into d logp in place and writes d entropy.
# _into_saved: the CPU kernel's fast path (the buffer's contract is the same for every flavor, so the Triton
# forward's buffer on CPU tensors qualifies too); the cuda-on-cpu test flavor switches it off, so that CPU
# tensors take the GPU's path, _native_into_saved (which the flavor runs on the CUDA binding).
INTO_SAVED = "policy_loss_backward_into_saved"
if has_native(INTO_SAVED):
    torch.library.register_fake(f"rlkernels::{INTO_SAVED}")(_fake_into_saved)
    _into_saved = _native_into_saved = op(INTO_SAVED).default
else:
    _into_saved = _native_into_saved = None


def _consume_saved(
    backward_op, grad_loss, row_weights, row_stats, saved, inputs: PolicyInputs, config: PolicyConfig,
    need_entropy,
):  # fmt: skip
    """(d logp, d entropy or None) from the saved per-token gradients, read for the last time: scaled in
    place into d logp, so that the backward pass allocates d entropy only (peak extra memory 2 x B x T
    values instead of 3)."""
    if op_name(backward_op) == TRITON_BACKWARD:  # one launch writes d logp over the buffer and d entropy
        from rlkernels.triton.policy_loss import policy_loss_backward

        grad_logp, grad_entropy = policy_loss_backward(
            grad_loss, row_weights, row_stats, saved, *inputs, config, True, need_entropy, into_saved=True
        )
        return grad_logp, (grad_entropy if need_entropy else None)
    into_saved = _into_saved if saved.device.type == "cpu" and _into_saved is not None else _native_into_saved
    grad_entropy = into_saved(saved, grad_loss, row_weights, inputs.mask, config.entropy_coef, need_entropy)
    return saved, (grad_entropy if need_entropy else None)


def _make_backward(backward_op):
    def backward(ctx, grad_loss, _grad_stats, _grad_weights, _grad_row_stats, _grad_saved, _grad_ok):
        row_weights, row_stats, saved, *tensors = ctx.saved_tensors
        inputs = PolicyInputs._make(tensors)
        need_logp, need_entropy = ctx.needs_input_grad[LOGP_ARG], ctx.needs_input_grad[ENTROPY_ARG]
        grad_logp = grad_entropy = None
        consumable = saved.numel() and saved.dtype == inputs.logp.dtype
        if grad_loss is None or not (need_logp or need_entropy):
            pass
        elif need_logp and consumable and _may_consume_saved(ctx, saved):
            grad_logp, grad_entropy = _consume_saved(
                backward_op, grad_loss, row_weights, row_stats, saved, inputs, ctx.config, need_entropy
            )
        else:
            grad_logp, grad_entropy = backward_op(
                grad_loss, row_weights, row_stats, saved, *inputs, *ctx.config, need_logp, need_entropy
            )
        grads = [None] * ctx.num_inputs
        grads[LOGP_ARG] = grad_logp if need_logp else None
        grads[ENTROPY_ARG] = grad_entropy if need_entropy else None
        return tuple(grads)

    return backward


# The native flavor in plain eager mode: one op whose autograd node is C++ (csrc/autograd/policy_loss.cpp, the
# formula above), so that neither the forward's autograd.Function nor the backward runs Python: on a GPU that
# Python cost more host time than the kernels (docs/gpu_token_ops.md). -> (loss, stats, ok). Absent from an
# extension built before it: the launcher below serves then.
NATIVE_EAGER = "policy_loss_autograd"
_native_eager = op(NATIVE_EAGER).default if has_native(NATIVE_EAGER) else None


# The Triton flavor's backward op, which _consume_saved recognizes.
TRITON_BACKWARD = "rlkernels::policy_loss_triton_backward"
# backend -> op name and launcher of its flavor (rlkernels/ops/_library.py: eager fast path; the op under
# compile)
_FLAVORS, _LAUNCH = register_backends(
    "policy_loss",
    fake=_fake,
    fake_backward=_fake_backward,
    setup_context=_setup_context,
    make_backward=_make_backward,
)


# The objectives that clip or filter tokens (their clip stats), and those whose ratio_cap truncates the ratio.
CLIPPING_OBJECTIVES = ("clip", "cispo", "dppo_tv", "dppo_kl", "geo_mean", "clip_cov")
RATIO_CAP_OBJECTIVES = ("clip", "dppo_tv", "dppo_kl")


def _stat_keys(objective: str, dual_clip, ratio_cap, has_ref: bool, has_entropy: bool) -> tuple[str, ...]:
    keys = []
    if objective in CLIPPING_OBJECTIVES:
        keys += ["clipfrac", "clipfrac_low", "clipfrac_high"]
    if (objective == "clip" and dual_clip is not None) or (
        objective.startswith("dppo") and ratio_cap is not None
    ):
        keys.append("clipfrac_dual")
    keys.append("approx_kl")
    if has_ref:
        keys.append("kl")
    if has_entropy:
        keys.append("entropy")
    if objective in COV_OBJECTIVES:
        keys.append("cov_selected")
    return tuple(keys)


# The backends whose kernels check the input values they read and return a flag (`ok`): the Python-level
# value checks (several torch ops each) are skipped for them.
KERNEL_CHECKS = ("triton", "cpu", "cuda")
# What a failed torch._assert_async of the ops' value flag means (the device cannot say which value; on a GPU
# the kernels assert themselves with their own message, csrc/cuda/policy_loss.cu, triton/policy_loss.py).
# At most ASYNC_MESSAGE_BYTES (rlkernels/_validate.py), which a CUDA tensor's assert takes.
BAD_VALUES = (
    f"{OP}: an input value is invalid: NaN/inf advantages, is_weights or mask weights negative or not "
    "finite, an integer mask value other than 0 and 1, or NaN logp/old_logp/ref_logp at a kept token (CPU "
    "tensors: a ValueError names it)"
)


def check_values(advantages, is_weights, mask, **log_probs) -> None:
    """The value checks of policy_loss's inputs (ValueError for CPU tensors, torch._assert_async for GPU
    tensors): advantages finite, is_weights finite and >= 0, and no NaN log-prob where the mask keeps the
    token. The mask's own values: v.mask_values."""
    v.check_finite(OP, advantages, "advantages")
    v.check_nonnegative(OP, is_weights, "is_weights")
    for name, x in log_probs.items():
        v.check_no_nan_where(OP, x, name, mask)


def _check_row_or_token(op_name: str, x, name: str, shape) -> Tensor:
    """A per-row [B] (or [B, 1], as TRL's sequence-level tensors: squeezed) or per-token [B, T] tensor."""
    v.check_float(op_name, x, name)
    if tuple(x.shape) == (shape[0], 1) and shape[1] != 1:
        return x.squeeze(-1)
    if tuple(x.shape) not in (tuple(shape), tuple(shape[:1])):
        raise ValueError(
            f"{op_name}: {name} must be [B], [B, 1] or [B, T] = {tuple(shape)}, got shape {tuple(x.shape)}"
        )
    return x


class _Options(NamedTuple):
    """policy_loss's validated options: the objective (canonical; clip_cov / kl_cov as named), the level,
    the clip range as given, the covariance objective or None, the kernels' PolicyConfig (clip_cov and
    kl_cov run the kernels of clip and of -A·r), the stat keys, and those the kernels compute with their
    index among the kernels' stats (STAT_KEYS)."""

    objective: str
    level: str
    clip: tuple[float, float]
    cov: str | None
    config: PolicyConfig
    keys: tuple[str, ...]
    kernel_stats: tuple[tuple[str, int], ...]


# The scalar options checked once per distinct combination (a training run passes the same ones every
# step): their ~20 checks cost more host time than the rest of the call. typed: 1, 1.0 and True differ.
@functools.lru_cache(maxsize=256, typed=True)
def _options(
    objective, level, clip_low, clip_high, dual_clip, ratio_cap, kl_kind, kl_clamp, kl_coef, entropy_coef,
    sapo_tau_pos, sapo_tau_neg, dro_beta, vespo_k_pos, vespo_lambda_pos, vespo_k_neg, vespo_lambda_neg,
    has_ref: bool, has_entropy: bool,
) -> _Options:  # fmt: skip
    names = OBJECTIVES + tuple(OBJECTIVE_ALIASES) + COV_OBJECTIVES
    objective = v.check_choice(OP, objective, "objective", names)
    objective = OBJECTIVE_ALIASES.get(objective, objective)
    level = v.check_choice(OP, level, "level", LEVELS)
    clip_low = float(v.check_number(OP, clip_low, "clip_low", gt=0))
    clip_high = clip_low if clip_high is None else float(v.check_number(OP, clip_high, "clip_high", gt=0))
    dual_clip = v.check_number(OP, dual_clip, "dual_clip", gt=1, optional=True)
    ratio_cap = v.check_number(OP, ratio_cap, "ratio_cap", gt=1, optional=True)
    if objective != "clip" and dual_clip is not None:
        raise ValueError(f"{OP}: dual_clip applies to objective='clip' only, got {objective!r}")
    if objective not in RATIO_CAP_OBJECTIVES and ratio_cap is not None:
        raise ValueError(
            f"{OP}: ratio_cap applies to objective in {RATIO_CAP_OBJECTIVES} only, got {objective!r}"
        )
    if level == "sequence" and objective != "clip":
        raise ValueError(
            f"{OP}: level='sequence' (GSPO) supports objective='clip' only, got {objective!r} (geo_mean and "
            "vespo build their own per-row ratio at level='token')"
        )
    kl_kind = KL_KINDS[v.check_choice(OP, kl_kind, "kl_kind", KL_KINDS)]
    kl_clamp = v.check_number(OP, kl_clamp, "kl_clamp", gt=0, optional=True)
    kl_coef = float(v.check_number(OP, kl_coef, "kl_coef"))
    entropy_coef = float(v.check_number(OP, entropy_coef, "entropy_coef"))
    if kl_coef != 0 and not has_ref:
        raise ValueError(f"{OP}: kl_coef={kl_coef} needs ref_logp")
    if entropy_coef != 0 and not has_entropy:
        raise ValueError(f"{OP}: entropy_coef={entropy_coef} needs entropy")
    tau_pos = float(v.check_number(OP, sapo_tau_pos, "sapo_tau_pos", gt=0))
    tau_neg = float(v.check_number(OP, sapo_tau_neg, "sapo_tau_neg", gt=0))
    dro_beta = v.check_number(OP, dro_beta, "dro_beta", gt=0, optional=True)
    if objective == "dro" and dro_beta is None:
        raise ValueError(f"{OP}: objective='dro' needs dro_beta > 0 (verl's policy_loss.dro_beta)")
    dro_beta = 1.0 if dro_beta is None else float(dro_beta)  # unused by the other objectives
    vespo = {
        name: float(v.check_number(OP, value, name, ge=0))
        for name, value in (
            ("vespo_k_pos", vespo_k_pos), ("vespo_lambda_pos", vespo_lambda_pos),
            ("vespo_k_neg", vespo_k_neg), ("vespo_lambda_neg", vespo_lambda_neg),
        )
    }  # fmt: skip
    keys = _stat_keys(objective, dual_clip, ratio_cap, has_ref, has_entropy)
    # clip_cov / kl_cov run the kernels of clip (its term dropped on the selected tokens) / of -A·r
    cov = objective if objective in COV_OBJECTIVES else None
    kernel_clip = (1.0, math.inf) if cov == "kl_cov" else (clip_low, clip_high)
    config = PolicyConfig(
        objective="clip" if cov else objective,
        seq_level=level == "sequence" or objective in SEQUENCE_OBJECTIVES,
        clip_low=kernel_clip[0], clip_high=kernel_clip[1],
        dual_clip=None if dual_clip is None else float(dual_clip),
        ratio_cap=None if ratio_cap is None else float(ratio_cap),
        tau_pos=tau_pos, tau_neg=tau_neg, dro_beta=dro_beta, **vespo, kl_coef=kl_coef, kl_kind=kl_kind,
        kl_clamp=None if kl_clamp is None else float(kl_clamp), entropy_coef=entropy_coef,
    )  # fmt: skip
    kernel_stats = tuple((k, STAT_KEYS.index(k)) for k in keys if k in STAT_KEYS)
    return _Options(objective, level, (clip_low, clip_high), cov, config, keys, kernel_stats)


def _checked_options(*options) -> _Options:
    """_options, cached; an unhashable option is checked uncached, which raises the error naming it."""
    try:
        return _options(*options)
    except TypeError:
        return _options.__wrapped__(*options)


@v.keyword_options
def policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float | None = None,
    dual_clip: float | None = None,
    ratio_cap: float | None = None,
    objective: str = "clip",
    level: str = "token",
    agg: str = "token-mean",
    num_tokens=None,
    num_seqs=None,
    dp_size: int = 1,
    norm_len: float | None = None,
    ref_logp: Tensor | None = None,
    kl_coef: float = 0.0,
    kl_kind: str = "k3",
    kl_clamp: float | None = 10.0,
    entropy: Tensor | None = None,
    entropy_coef: float = 0.0,
    is_weights: Tensor | None = None,
    sapo_tau_pos: float = 1.0,
    sapo_tau_neg: float = 1.05,
    dro_beta: float | None = None,
    vespo_k_pos: float = 2.0,
    vespo_lambda_pos: float = 3.0,
    vespo_k_neg: float = 3.0,
    vespo_lambda_neg: float = 2.0,
    cov_options: CovOptions | None = None,
    generator: torch.Generator | None = None,
    backend: str = "auto",
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO / GRPO policy loss with masks, its variants and aggregation modes (docs/semantics.md).

    Per token, with r = exp(clamp(logp - old_logp, -20, 20)):
      objective="clip":  max(-A·min(r, ratio_cap), -A·clip(r, 1-clip_low, 1+clip_high)); with dual_clip=c,
                         min(that, -A·c) where A < 0 (verl compute_policy_loss_vanilla, TRL delta);
      objective="cispo": -sg(clip(r, 1-clip_low, 1+clip_high))·A·logp (verl; TRL's absolute cap ε_high is
                         clip_low=1, clip_high=ε_high-1);
      objective="sapo":  -A·σ(τ(r-1))·4/τ, τ = sapo_tau_pos if A > 0 else sapo_tau_neg (TRL/Liger/verl).
      objective="gpg":   -A·logp (verl 0.9.1 gpg; "reinforce", verl's bypass-mode REINFORCE, is the same
                         term: pass its IS weights as is_weights).
      objective="dro":   -(A·logp - ½·dro_beta·(logp - old_logp)²) (verl 0.9.1 dro; log-ratio unclamped).
      objective="dppo_tv" / "dppo_kl": -A·sg(min(r, ratio_cap))·logp on the tokens that DPPO-Binary's TV /
                         binary-KL test keeps (verl 0.9.1): clip_low / clip_high are its divergence
                         thresholds, ratio_cap verl's clip_ratio_c (rlkernels/reference/policy_loss.py).
      objective="geo_mean": -A·R, R = exp of the row's masked mean of sign-clipped log-ratios (verl 0.9.1
                         GMPO; straight-through per token; use agg="seq-mean-token-mean").
      objective="vespo": -sg(φ(w))·A·logp, φ(w) = e^λ·w^k·e^(-λw) of the row's summed log-ratio (TRL 1.16;
                         per-token is_weights are folded into w, as TRL folds its vLLM IS ratio).
      objective="clip_cov" / "kl_cov": verl 0.9.1's covariance-selected tokens (rlkernels/reference/
                         cov_selection.py) drop their clip term / add kl_coef·|logp - old_logp| to -A·r.
    level="sequence" (GSPO, clip only): r is exp of the row's masked mean log-ratio, straight-through per
    token. The policy term is multiplied by is_weights, then kl_coef·kl_penalty(logp, ref_logp, kl_kind,
    clamp=kl_clamp) - entropy_coef·entropy is added, and the [B, T] result is aggregated by `agg`:
    "token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"
    (see rlkernels/reference/aggregation.py). For data parallelism pass the global `num_tokens` /
    `num_seqs` and `dp_size`: the mean of the shard losses is then the whole-batch loss.

    Values are checked as shapes are: NaN/inf advantages, negative or non-finite is_weights or mask
    weights, and integer masks other than 0/1 raise ValueError for CPU tensors and fail a device-side
    assert for GPU tensors (the forward kernel's own, either flavor; no host sync). The
    log-probs may hold -inf (the clamped log-ratio gives a finite loss).

    Args:
        logp: [B, T] float32/float64/float16/bfloat16, log-probs of the sampled tokens (differentiable).
        old_logp: [B, T], log-probs under the policy that sampled them.
        advantages: [B] or [B, 1] (one per sequence, GRPO) or [B, T] (per token, PPO); finite.
        mask: [B, T] bool, integer 0/1 (a Hugging Face attention_mask), or float weights (finite, >= 0).
        clip_low, clip_high: ratio clip range (> 0); clip_high defaults to clip_low.
        dual_clip: dual-clip constant c > 1 (objective="clip"), or None.
        ratio_cap: cap δ > 1 of the unclipped ratio (TRL `delta`, objective="clip"; the truncation c of
            "dppo_tv" / "dppo_kl"), or None.
        agg, num_tokens, num_seqs, dp_size, norm_len: aggregation; num_tokens / num_seqs are numbers or
            one-element tensors (no host sync); norm_len defaults to T.
        ref_logp: [B, T] reference-policy log-probs for the KL term and stat (required if kl_coef != 0).
        kl_kind, kl_clamp: as rk.kl_penalty.
        entropy: [B, T] per-token entropy (differentiable; required if entropy_coef != 0).
        is_weights: [B], [B, 1] or [B, T] rollout importance-sampling weights (finite, >= 0).
        sapo_tau_pos, sapo_tau_neg: SAPO temperatures (> 0).
        dro_beta: DRO's penalty β > 0 (required by objective="dro", unused otherwise).
        vespo_k_pos, vespo_lambda_pos, vespo_k_neg, vespo_lambda_neg: VESPO's gamma shape k >= 0 and rate
            λ >= 0 (at least 1e-4 is used, as TRL) for A >= 0 / A < 0 (TRL's defaults).
        cov_options: rk.CovOptions(ratio, lower, upper, kl_coef) of clip_cov / kl_cov (verl's clip_cov_ratio /
            kl_cov_ratio, clip_cov_lb, clip_cov_ub, ppo_kl_coef); None: verl's defaults.
        generator: the torch.Generator of clip_cov's random choice among its candidate tokens.
        backend: "auto" | "triton" | "cuda" | "cpu" | "reference".

    Returns:
        (loss, stats): loss a 0-dim tensor (float32; float64 for float64 inputs), differentiable in logp and
        entropy (old_logp, advantages, mask, ref_logp and is_weights are treated as data); stats a dict of
        0-dim tensors computed in the same pass, masked means over this batch's tokens: "clipfrac" (the
        clipped branch is taken; dppo: the token is dropped), "clipfrac_low" / "clipfrac_high" (r below /
        above the range, with A < 0 / A > 0 for "clip"; dppo: dropped with A <= 0 / A > 0), "clipfrac_dual"
        (with dual_clip; dppo with ratio_cap: a kept token's ratio is truncated), "approx_kl" (mean
        old_logp - logp), "kl" (with ref_logp), "entropy" (with entropy), "cov_selected" (clip_cov /
        kl_cov: the selected tokens). No host sync.
    """
    v.check_float(OP, logp, "logp")
    v.check_ndim(OP, logp, "logp", (2,))
    shape = tuple(logp.shape)
    v.check_float(OP, old_logp, "old_logp")
    v.check_shape(OP, old_logp, "old_logp", shape, "logp")
    advantages = _check_row_or_token(OP, advantages, "advantages", shape)
    v.check_mask(OP, mask, "mask", shape, "logp")
    for name, t in (("ref_logp", ref_logp), ("entropy", entropy)):
        if t is not None:
            v.check_float(OP, t, name)
            v.check_shape(OP, t, name, shape, "logp")
    if is_weights is not None:
        is_weights = _check_row_or_token(OP, is_weights, "is_weights", shape)
    device = v.check_same_device(
        OP, logp=logp, old_logp=old_logp, advantages=advantages, mask=mask, ref_logp=ref_logp,
        entropy=entropy, is_weights=is_weights,
    )  # fmt: skip
    backend = select_backend(OP, backend, device, implemented=tuple(_FLAVORS))
    # Values: NaN/inf advantages, bad IS or mask weights, integer masks other than 0/1 and NaN log-probs at
    # kept tokens (-inf is a log-prob: the log-ratio clamp turns it into a finite loss). The kernels check
    # what they read and the op returns a flag (ops/_flags.py: on a GPU the kernel's own assert, no host
    # sync); the reference before the op (ValueError for CPU tensors,
    # torch._assert_async for GPU tensors).
    kernel_checks = backend in KERNEL_CHECKS
    if not kernel_checks:
        check_values(advantages, is_weights, mask, logp=logp, old_logp=old_logp, ref_logp=ref_logp)
        mask = v.mask_values(OP, mask)
    agg_args = check_agg_args(OP, agg, num_tokens, num_seqs, dp_size, norm_len, device)
    options = (
        objective, level, clip_low, clip_high, dual_clip, ratio_cap, kl_kind, kl_clamp, kl_coef, entropy_coef,
        sapo_tau_pos, sapo_tau_neg, dro_beta, vespo_k_pos, vespo_lambda_pos, vespo_k_neg, vespo_lambda_neg,
        ref_logp is not None, entropy is not None,
    )  # fmt: skip
    opts = _checked_options(*options)
    objective, cov, config = opts.objective, opts.cov, opts.config
    if objective == "vespo" and is_weights is not None and is_weights.dim() != 2:
        raise ValueError(
            f"{OP}: objective='vespo' folds per-token is_weights [B, T] into its sequence weight (as TRL its "
            f"vLLM IS ratio); got shape {tuple(is_weights.shape)}"
        )
    if cov_options is not None or cov is not None:  # not on the hot path of the other objectives
        if cov_options is None:
            cov_options = CovOptions()
        elif not isinstance(cov_options, CovOptions):
            raise TypeError(f"{OP}: cov_options must be an rk.CovOptions, got {type(cov_options).__name__}")
        v.check_number(OP, cov_options.ratio, "cov_options.ratio", gt=0, le=1)
        v.check_number(OP, cov_options.kl_coef, "cov_options.kl_coef")
        if not cov_options.lower < cov_options.upper:
            raise ValueError(f"{OP}: cov_options.lower must be < cov_options.upper, got {cov_options[1:3]}")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"{OP}: generator must be a torch.Generator, got {type(generator).__name__}")

    floats = [t for t in (logp, old_logp, advantages, ref_logp, entropy, is_weights) if t is not None]
    dtype = logp.dtype
    mixed = any(t.dtype != dtype for t in floats)  # else nothing to promote or cast (the usual call)
    if mixed:
        dtype = functools.reduce(torch.promote_types, [t.dtype for t in floats])
    acc = acc_dtype(dtype)
    keys = opts.keys

    if backend == "reference":
        c = config
        loss, stats = reference.policy_loss(
            logp, old_logp, advantages, mask, clip_low=opts.clip[0], clip_high=opts.clip[1],
            dual_clip=c.dual_clip, ratio_cap=c.ratio_cap, objective=objective, level=opts.level, agg=agg,
            ref_logp=ref_logp, kl_coef=c.kl_coef, kl_kind=c.kl_kind, kl_clamp=c.kl_clamp, entropy=entropy,
            entropy_coef=c.entropy_coef, is_weights=is_weights, sapo_tau_pos=c.tau_pos,
            sapo_tau_neg=c.tau_neg, dro_beta=c.dro_beta, vespo_k_pos=c.vespo_k_pos,
            vespo_lambda_pos=c.vespo_lambda_pos, vespo_k_neg=c.vespo_k_neg,
            vespo_lambda_neg=c.vespo_lambda_neg, cov_options=cov_options, generator=generator, **agg_args,
        )  # fmt: skip
        return loss.to(acc), {k: stats[k].to(acc) for k in keys}

    # clip_cov / kl_cov: the tokens selected across the batch (torch ops, no host sync), then the kernels of
    # clip (its term dropped on them through is_weights) / of -A·r, plus kl_cov's term on them.
    if cov is not None:
        adv = reference._per_row(advantages)
        clipped = None
        if cov == "clip_cov":
            clip_low, clip_high = opts.clip
            ratio = torch.exp(torch.clamp(logp.detach() - old_logp, -LOG_RATIO_BOUND, LOG_RATIO_BOUND))
            clipped = -adv * torch.clamp(ratio, 1 - clip_low, 1 + clip_high) > -adv * ratio
        selected = cov_selection(cov, logp, adv, mask, cov_options, clipped=clipped, generator=generator)
        row_w = reference._per_row(is_weights)
        if cov == "clip_cov":  # the selected tokens' term weighted 0
            keep = (~selected).to(dtype)
            is_weights = keep if row_w is None else row_w * keep

    def cast(t):  # the dtype check first: Tensor.to costs ~2.5 us even when it returns t
        return t if t is None or t.dtype == dtype else t.to(dtype)

    if backend != "triton":  # the Triton kernels read any mask dtype
        mask = native_mask(mask, acc)
    save_grad = SAVE_GRAD_IN_FORWARD and torch.is_grad_enabled() and logp.requires_grad
    if mixed:
        inputs = PolicyInputs(
            cast(logp), cast(old_logp), cast(advantages), mask, cast(ref_logp), cast(entropy),
            cast(is_weights),
        )  # fmt: skip
    else:  # one dtype (the usual call): nothing to cast
        inputs = PolicyInputs(logp, old_logp, advantages, mask, ref_logp, entropy, is_weights)
    agg_config = agg_op_args(agg, agg_args, shape[1])
    if takes_native_eager(_native_eager, backend, logp):
        loss, stats, ok = _native_eager(*inputs, *config, *agg_config, save_grad)
    else:
        loss, stats, *_, ok = _LAUNCH[backend](*inputs, *config, *agg_config, save_grad)

    def eager_checks():  # which value: the eager checks say, with the offending element
        check_values(advantages, is_weights, mask, logp=logp, old_logp=old_logp, ref_logp=ref_logp)
        v.mask_values(OP, mask)

    check_flag(OP, ok, BAD_VALUES, eager_checks, backend=backend)
    means = stats.unbind(0)
    out = {k: means[i] for k, i in opts.kernel_stats}
    if cov is not None:
        if cov == "kl_cov":  # its penalty on the selected tokens, aggregated as the kernel's terms
            # in the accumulation dtype, as the kernels' terms: a 16-bit logp - old_logp rounds the difference
            diff = (logp.to(acc) - old_logp.to(acc)).abs()
            penalty = torch.where(selected, cov_options.kl_coef * diff, 0.0)
            if row_w is not None:
                penalty = penalty * row_w
            from rlkernels.ops.agg_loss import agg_loss as agg_op  # imports this module

            loss = loss + agg_op(penalty, mask, agg, **agg_args, backend=backend)
        out["cov_selected"] = masked_mean(selected.to(acc), mask)
    return loss, out


# policy_loss's keyword options with their defaults, and those _options takes (in its order).
_DEFAULTS = {
    p.name: p.default for p in inspect.signature(policy_loss).parameters.values() if p.kind is p.KEYWORD_ONLY
}
_SCALAR_OPTIONS = tuple(inspect.signature(_options.__wrapped__).parameters)[:-2]  # less has_ref, has_entropy


def check_options(options: dict, has_ref: bool, has_entropy: bool, device: torch.device) -> PolicyConfig:
    """Raise what policy_loss would raise for its scalar options `options` (its keyword arguments by name;
    unknown names a TypeError), without its tensors: linear_policy_loss checks them before its GEMMs.
    Returns the kernels' PolicyConfig of those options."""
    unknown = sorted(set(options) - set(_DEFAULTS))
    if unknown:
        raise TypeError(f"{OP}: unexpected keyword argument(s) {', '.join(map(repr, unknown))}")
    o = {**_DEFAULTS, **options}
    check_agg_args(OP, o["agg"], o["num_tokens"], o["num_seqs"], o["dp_size"], o["norm_len"], device)
    return _checked_options(*(o[name] for name in _SCALAR_OPTIONS), has_ref, has_entropy).config


def token_sum_grad(inputs: PolicyInputs, config: PolicyConfig, backend: str) -> Tensor:
    """d loss / d logp [1, T] (the accumulation dtype) of loss = Σ_t m_t·ℓ_t over one row of tokens, that
    is agg="token-sum", whose row weight is 1: the forward op's saved m · d ℓ / d logp, in one launch and
    without an autograd node (linear_policy_loss's per-block gradient, ops/linear_policy_loss.py).

    `inputs`: one row each ([1, T]; advantages and is_weights per token), of one float dtype, the mask as
    the flavor reads it (native_mask for the native flavor), entropy None: with entropy_coef c, d loss /
    d entropy is -c·m and needs no kernel (config's entropy_coef is then 0). `backend`: a resolved kernel
    backend. The values are not checked here (the op's flag is not read): the caller checks them with
    whole-batch policy_loss calls, which raise what this call would."""
    T = inputs.logp.shape[1]
    agg = AggConfig("token-sum", 1, float(T), None, None, None, None)
    *_, saved, _ok = _LAUNCH[backend](*inputs, *config, *agg, True)
    return saved
