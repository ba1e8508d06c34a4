"""linear_policy_loss: the policy loss straight from hidden states, composed of the fused
`linear_logprobs` (no [B, T, V] logits, forward or backward) and the fused `policy_loss`.

The composition does 4 GEMM-equivalents per training step (logits; in the backward the recomputed logits,
d hidden and d weight), like `linear_logprobs` followed by any loss. A single kernel that computes the
gradients during the forward (3 GEMM-equivalents, the way Liger's fused linear cross-entropy does) needs
d loss / d logp before the vocabulary pass is over, and is not built yet.
"""

from __future__ import annotations

import torch

from rlkernels import _validate as v
from rlkernels.ops.logprobs import linear_logprobs as _linear_logprobs
from rlkernels.ops.policy_loss import policy_loss as _policy_loss

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
    temperature: float = 1.0,
    softcap: float | None = None,
    ignore_index: int = -100,
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
        temperature, softcap: as `linear_logprobs`.
        entropy_coef: weight of the entropy bonus; the entropy is computed (and `stats["entropy"]` reported)
            only when it is non-zero.
        chunk_size: vocabulary columns per chunk, as `linear_logprobs`.
        backend: "auto" | "triton" | "cuda" | "cpu" | "reference", used for both fused ops (the reference
            backend composes the reference ops, with the same validation).
        process_group: None, or the torch.distributed group the vocabulary is split over, as
            `linear_logprobs`: weight is then this rank's [V_local, D] shard (bias its [V_local] slice),
            labels global ids; every rank passes the same hidden and per-token tensors and gets the same
            loss (d hidden is summed over the group inside; do not all-reduce it again).
        **policy_kwargs: every other `policy_loss` option (clip_low, clip_high, dual_clip, ratio_cap,
            objective, level, agg, num_tokens, num_seqs, dp_size, norm_len, ref_logp, kl_coef, kl_kind,
            kl_clamp, is_weights, sapo_tau_pos, sapo_tau_neg).

    Returns:
        (loss, stats) as `policy_loss`: a 0-dim fp32 loss differentiable in hidden, weight and bias.
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
    out = _linear_logprobs(
        hidden, weight, labels, bias=bias, temperature=temperature, softcap=softcap,
        ignore_index=ignore_index, return_entropy=want_entropy, chunk_size=chunk_size, backend=backend,
        process_group=process_group,
    )  # fmt: skip
    logp, entropy = out if want_entropy else (out, None)
    valid = labels != ignore_index
    mask = mask & valid if mask.dtype == torch.bool else mask * valid.to(mask.dtype)
    return _policy_loss(
        logp, old_logp, advantages, mask, entropy=entropy, entropy_coef=entropy_coef, backend=backend,
        **policy_kwargs,
    )  # fmt: skip
