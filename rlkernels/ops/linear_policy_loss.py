"""linear_policy_loss: the policy loss straight from hidden states, never materializing the [B, T, V] logits.

Two ways, picked per call (docs/row_sweep.md):
- the sweep (rlkernels/ops/linear_sweep.py), when a gradient is wanted and the loss is token-level: the
  gradients of hidden / weight / bias are produced in the forward, 3 GEMM-equivalents per step (2 with a
  frozen head). Each token's d loss / d logp comes from the fused `policy_loss` forward itself (the
  gradient it saves: policy_loss.token_sum_grad, one launch a block), run on the block's tokens with the
  aggregation weights of the whole batch (they depend on mask counts only) and agg="token-sum"; the loss
  and the stats are then those of one `policy_loss` call over the whole batch.
  The backward scales the stored gradients by the incoming gradient.
- the composition `policy_loss(linear_logprobs(...))` otherwise: under no_grad (1 GEMM), for
  level="sequence" (a token's gradient needs its whole sequence's log-probs first: 4 GEMM-equivalents, a
  log-prob pass then the recomputing backward), with process_group, under torch.compile (the composition
  is two opaque custom ops; the sweep's row selection and autograd node would break the graph), and for the
  reference backend.
"""

from __future__ import annotations

import functools

import torch

from rlkernels import _validate as v
from rlkernels._backend import select_backend
from rlkernels._dtypes import acc_dtype
from rlkernels.ops import linear_sweep, sampling
from rlkernels.ops._aggregation import check_agg_args
from rlkernels.ops._token_masks import native_mask
from rlkernels.ops.logprobs import (
    _LINEAR_LAUNCH,
    LINEAR,
    LOGITS_FLAVORS,
    _check_labels,
    _check_linear_args,
    _scalar,
)
from rlkernels.ops.logprobs import linear_logprobs as _linear_logprobs
from rlkernels.ops.policy_loss import _FLAVORS as _POLICY_FLAVORS
from rlkernels.ops.policy_loss import OP as POLICY_OP
from rlkernels.ops.policy_loss import PolicyInputs, token_sum_grad
from rlkernels.ops.policy_loss import check_options as check_policy_options
from rlkernels.ops.policy_loss import policy_loss as _policy_loss
from rlkernels.policy_config import SEQUENCE_OBJECTIVES
from rlkernels.reference.aggregation import AGG_KEYWORDS, row_loss_weights
from rlkernels.reference.cov_selection import COV_OBJECTIVES

OP = "linear_policy_loss"


@v.keyword_options
def linear_policy_loss(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    temperature: float | torch.Tensor = 1.0,
    softcap: float | None = None,
    ignore_index: int = -100,
    top_k: int | torch.Tensor | None = None,
    top_p: float | torch.Tensor | None = None,
    min_p: float | torch.Tensor | None = None,
    entropy_coef: float = 0.0,
    chunk_size: int | None = None,
    backend: str = "auto",
    process_group=None,
    **policy_kwargs,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The policy loss of `policy_loss` with logp (and the entropy bonus) computed from hidden states by
    `linear_logprobs`, never materializing the [B, T, V] logits.

    Args:
        hidden: [B, T, D] float32/bfloat16/float16 (or float64), the final hidden states.
        weight: [V, D] same dtype, the LM head (lm_head.weight, not its transpose). bias: [V] or None.
        labels: [B, T] int32/int64, the sampled tokens; those equal to `ignore_index` are left out of the
            loss.
        old_logp: [B, T] float, log-probs under the rollout policy.
        advantages: [B] or [B, T] float, finite. mask: [B, T] response tokens: bool, integer 0/1 (a
            Hugging Face attention_mask) or float weights (finite, >= 0); values checked as `policy_loss`.
        temperature, softcap: as `linear_logprobs` (temperature a float or a [B, T] tensor).
        top_k, top_p, min_p: the rollout's truncated sampling distribution, as `linear_logprobs` (numbers or
            [B, T] tensors): logp, and the entropy, are then those of the distribution renormalized over
            the kept tokens. A response token outside them has logp -inf (ratio 0; a KL to ref_logp is
            then infinite): mask it out or sample and train with the same settings.
        entropy_coef: weight of the entropy bonus; the entropy is computed (and `stats["entropy"]` reported)
            only when it is non-zero.
        chunk_size: vocabulary columns per chunk, as `linear_logprobs` (the composition path only; the sweep
            takes blocks of whole rows, sized by linear_sweep.BLOCK_BYTES).
        backend: "auto" | "triton" | "cuda" | "cpu" | "reference", used for both fused ops (the reference
            backend composes the reference ops, with the same validation); "auto" picks each op's own
            (on a GPU: Triton for the log-probs, CUDA C++ for the loss, whose eager calls are host-bound).
        process_group: None, or the torch.distributed group the vocabulary is split over, as
            `linear_logprobs`: weight is then this rank's [V_local, D] shard (bias its [V_local] slice),
            labels global ids; every rank passes the same hidden and per-token tensors and gets the same
            loss (d hidden is summed over the group inside; do not all-reduce it again).
        **policy_kwargs: every other `policy_loss` option (clip_low, clip_high, dual_clip, ratio_cap,
            objective, level, agg, num_tokens, num_seqs, dp_size, norm_len, ref_logp, kl_coef, kl_kind,
            kl_clamp, is_weights, sapo_tau_pos, sapo_tau_neg, dro_beta, vespo_*).

    Returns:
        (loss, stats) as `policy_loss`: a 0-dim fp32 loss differentiable in hidden, weight and bias.

    When a gradient is wanted (grad mode on, one of hidden / weight / bias requiring it) and the ratio is per
    token (level="token", not geo_mean / vespo) and the tokens independent (not clip_cov / kl_cov, which
    rank the whole batch), with no process_group and a kernel backend, and (on a GPU with a trainable head)
    the row blocks are tall enough that re-reading the fp32 d weight per block costs less than recomputing
    the logits (ops/linear_sweep.py sweeps; docs/gpu_linear.md), the gradients
    are computed during this call (3 GEMM-equivalents in all, 2 when weight and bias need no gradient) and
    held until backward, which scales them by the incoming gradient: the loss may be scaled or fed to
    further ops, but backward runs once (retain_graph is not supported) and there is no double backward.
    The held d weight is fp32 [V, D] (fp64 for fp64 inputs) whatever the weight's dtype. With a frozen head
    the held d hidden is in hidden's dtype (fp32 on the C++ CPU flavor), rounded once more by that scaling.
    """
    if "entropy" in policy_kwargs:
        raise TypeError(f"{OP}: entropy is computed from hidden; pass entropy_coef instead")
    v.check_ndim(OP, v.check_float(OP, hidden, "hidden"), "hidden", (3,))
    v.check_linear_weight(OP, hidden, weight)
    v.check_index(OP, labels, "labels")
    v.check_mask(OP, mask, "mask", hidden.shape[:2], "hidden.shape[:2]")
    v.check_float(OP, advantages, "advantages")
    v.check_same_device(OP, hidden=hidden, weight=weight, labels=labels, advantages=advantages, mask=mask)
    v.check_finite(OP, advantages, "advantages")  # before the GEMMs; policy_loss checks the rest
    mask = v.mask_values(OP, mask)
    entropy_coef = float(v.check_number(OP, entropy_coef, "entropy_coef"))
    want_entropy = entropy_coef != 0.0
    valid = labels != ignore_index
    mask = mask & valid if mask.dtype == torch.bool else mask * valid.to(mask.dtype)
    need = (
        hidden.requires_grad,
        weight.requires_grad,
        bias is not None and bias.requires_grad,
    )
    loss_backend = backend  # "auto" resolved by policy_loss itself
    if (
        torch.is_grad_enabled()
        and not torch.compiler.is_compiling()  # graphs take the composition of custom ops
        and any(need)
        and process_group is None
        and policy_kwargs.get("level", "token") == "token"
        and policy_kwargs.get("objective") not in SEQUENCE_OBJECTIVES + COV_OBJECTIVES
    ):
        device, scalar_temperature, softcap, ignore_index, _ = _check_linear_args(
            hidden, weight, labels, bias, _scalar(temperature), softcap, ignore_index, want_entropy, False,
            chunk_size,
        )  # fmt: skip
        backend = select_backend(LINEAR, backend, device, implemented=tuple(_LINEAR_LAUNCH))
        rows, vocab = int(hidden.shape[0] * hidden.shape[1]), weight.shape[0]
        if backend != "reference" and linear_sweep.sweeps(device, rows, vocab, hidden.shape[-1], need[1]):
            _check_labels(LINEAR, labels, hidden.shape[:2], "hidden.shape[:2]", weight.shape[0], ignore_index)
            acc = acc_dtype(hidden.dtype)
            sampled = sampling.check_sampling(OP, temperature, top_k, top_p, min_p, labels, acc)
            options = linear_sweep.LogitOptions(scalar_temperature, softcap, ignore_index)
            return _swept(
                hidden, weight, bias, labels, old_logp, advantages, mask, options, sampled, entropy_coef,
                need, backend, loss_backend, policy_kwargs,
            )  # fmt: skip
    # The composition: the policy options checked before its GEMMs, as the sweep checks them
    has_ref = policy_kwargs.get("ref_logp") is not None
    check_policy_options(
        {**policy_kwargs, "entropy_coef": entropy_coef}, has_ref, want_entropy, hidden.device
    )
    out = _linear_logprobs(
        hidden, weight, labels, bias=bias, temperature=temperature, softcap=softcap,
        ignore_index=ignore_index, return_entropy=want_entropy, top_k=top_k, top_p=top_p, min_p=min_p,
        chunk_size=chunk_size, backend=backend, process_group=process_group,
    )  # fmt: skip
    logp, entropy = out if want_entropy else (out, None)
    return _policy_loss(
        logp, old_logp, advantages, mask, entropy=entropy, entropy_coef=entropy_coef, backend=loss_backend,
        **policy_kwargs,
    )  # fmt: skip


# policy_loss options that the sweep's per-block calls replace (aggregation) or slice per token (data).
_TOKEN_DATA = ("ref_logp", "is_weights")


def _swept(hidden, weight, bias, labels, old_logp, advantages, mask, options, sampled, entropy_coef, need,
           backend, loss_backend, policy_kwargs):  # fmt: skip
    """linear_policy_loss by the sweep: the loss and stats of the composition, gradients in the forward."""
    B, T, D = hidden.shape
    acc = acc_dtype(hidden.dtype)
    want_entropy = entropy_coef != 0.0

    def whole_batch_loss(logp, entropy):  # also validates every policy option before any GEMM
        return _policy_loss(
            logp, old_logp, advantages, mask, entropy=entropy, entropy_coef=entropy_coef,
            backend=loss_backend, **policy_kwargs,
        )  # fmt: skip

    zeros = hidden.new_zeros(B, T, dtype=acc)
    with torch.no_grad():
        whole_batch_loss(zeros, zeros if want_entropy else None)

    # Per-token aggregation weights: loss = Σ_b c_b Σ_t m_bt ℓ_bt, c_b from the row counts only.
    agg = policy_kwargs.get("agg", "token-mean")
    agg_args = check_agg_args(
        OP, agg, *(policy_kwargs.get(k, d) for k, d in (("num_tokens", None), ("num_seqs", None))),
        policy_kwargs.get("dp_size", 1), policy_kwargs.get("norm_len"), hidden.device,
    )  # fmt: skip
    m = mask.to(acc)
    norm_len = agg_args.pop("norm_len")
    row_w = row_loss_weights(m.sum(-1), agg, norm_len=T if norm_len is None else norm_len, **agg_args)
    token_w = (row_w[:, None] * m).reshape(-1)

    rows = (mask != 0).reshape(-1).nonzero().squeeze(1)  # masked-out and ignored tokens cost nothing
    # Every token kept (packed sequences): the flat tensors as they are, no [M, D] gather or scatter.
    every = rows.numel() == B * T  # a host number since nonzero()
    take = slice(None) if every else rows
    per_token = {
        "old_logp": old_logp.reshape(-1)[take],
        "advantages": (advantages[:, None] if advantages.dim() == 1 else advantages).expand(B, T),
        "weights": token_w[take],
    }
    per_token["advantages"] = per_token["advantages"].reshape(-1)[take]
    data = {}
    for key in _TOKEN_DATA:
        t = policy_kwargs.get(key)
        if t is not None:
            t = t.reshape(B, -1).expand(B, T) if t.dim() == 1 or t.shape[-1] == 1 else t
            data[key] = t.reshape(-1)[take]
    token_grads = _token_grads(per_token, data, policy_kwargs, entropy_coef, loss_backend, hidden.device, acc)

    flat_bias = None if bias is None else bias.to(hidden.dtype)
    flavor = LOGITS_FLAVORS[backend]
    frozen = need == (True, False, False)  # d hidden only: held in hidden's dtype (_GradientsFromForward)
    result = linear_sweep.sweep(
        hidden.reshape(-1, D)[take], weight, flat_bias, labels.reshape(-1)[take].long(), options, flavor,
        token_grads, want_entropy=want_entropy, need=need,
        sampling=None if sampled is None else sampled.rows(take),
        grad_dtype=linear_sweep.frozen_grad_dtype(flavor, hidden.device, hidden.dtype) if frozen else None,
    )  # fmt: skip

    def scatter(values):  # rows -> [B, T], 0 elsewhere (the ignore_index convention)
        if values is None:
            return None
        return values.view(B, T) if every else zeros.reshape(-1).index_put((rows,), values).view(B, T)

    with torch.no_grad():
        loss, stats = whole_batch_loss(scatter(result.logp), scatter(result.entropy))
    grad_hidden = result.grad_hidden
    if grad_hidden is not None and not every:
        grad_hidden = grad_hidden.new_zeros(B * T, D).index_put_((rows,), grad_hidden)
    loss = _GradientsFromForward.apply(
        loss, (grad_hidden, result.grad_weight, result.grad_bias), hidden, weight, bias
    )
    return loss, stats


def _token_grads(per_token, data, policy_kwargs, entropy_coef, loss_backend, device, acc):
    """The sweep's token_grads: (r0, r1, logp [R], entropy [R] or None) -> d loss / d logp [R] and d loss /
    d entropy [R] or None, for the kept tokens r0:r1 weighted by their whole-batch aggregation weights. One
    launch of the fused policy_loss forward per block (policy_loss.token_sum_grad: its saved gradient),
    where an autograd round trip through the public function took four; d entropy is -entropy_coef times
    the weights, formed once. The whole-batch policy_loss calls around the sweep check the values."""
    backend = select_backend(POLICY_OP, loss_backend, device, implemented=tuple(_POLICY_FLAVORS))
    floats = [acc, *(t.dtype for t in (per_token["old_logp"], per_token["advantages"], *data.values()))]
    dtype = functools.reduce(torch.promote_types, floats)  # policy_loss's promotion of its inputs
    old_logp, advantages = (per_token[k].to(dtype)[None] for k in ("old_logp", "advantages"))
    weights = per_token["weights"]
    mask = (weights if backend == "triton" else native_mask(weights, acc_dtype(dtype)))[None]
    ref_logp, is_weights = (None if data.get(k) is None else data[k].to(dtype)[None] for k in _TOKEN_DATA)
    options = {k: x for k, x in policy_kwargs.items() if k not in AGG_KEYWORDS + _TOKEN_DATA}
    config = check_policy_options(options, ref_logp is not None, False, device)
    grad_entropy = None if entropy_coef == 0.0 else weights * -entropy_coef

    def token_grads(r0, r1, logp, entropy):
        block = PolicyInputs(
            logp.to(dtype)[None], old_logp[:, r0:r1], advantages[:, r0:r1], mask[:, r0:r1],
            None if ref_logp is None else ref_logp[:, r0:r1], None,
            None if is_weights is None else is_weights[:, r0:r1],
        )  # fmt: skip
        grad_logp = token_sum_grad(block, config, backend)[0].to(logp.dtype)
        return grad_logp, None if grad_entropy is None else grad_entropy[r0:r1]

    return token_grads


class _GradientsFromForward(torch.autograd.Function):
    """Attaches gradients computed in the forward: backward returns them times the incoming gradient, the
    product computed in fp32 at least and rounded once as it is written over the held gradient (a frozen
    head's d hidden is held in hidden's dtype: linear_sweep.frozen_grad_dtype)."""

    @staticmethod
    def forward(ctx, loss, grads, hidden, weight, bias):
        ctx.grads = grads
        ctx.like = [None if t is None else (t.shape, t.dtype) for t in (hidden, weight, bias)]
        return loss.clone()

    @staticmethod
    def backward(ctx, grad_loss):
        if ctx.grads is None:
            raise RuntimeError(
                f"{OP}: the backward of a loss whose gradients were computed in the forward runs once "
                "(retain_graph=True is not supported)"
            )
        grads, ctx.grads = ctx.grads, None
        out = []
        for g, like in zip(grads, ctx.like, strict=True):
            if g is not None:  # scaled in place: the buffers are not used again
                scale = grad_loss.to(torch.promote_types(g.dtype, torch.float32)).reshape((1,) * g.dim())
                g = torch.mul(g, scale, out=g)
                g = (g if g.shape == like[0] else g.view(like[0])).to(like[1])
            out.append(g)
        return (None, None, *out)
