"""linear_logprobs and logprobs_from_logits: custom ops (native C++ and Triton), their fake and autograd
registrations, and the public functions.

Each op returns (logp, entropy, lse, sum_pi_squared) per row; lse is the only statistic the backward needs,
so nothing of size [N, V] is ever saved. lse is float64 whatever the compute dtype (docs/semantics.md, "The
saved LSE"): the backward's log q = z − lse would otherwise share a rounding of ulp(|lse|) per row.
sum_pi_squared (Σ softmax², forward-only) gets no gradient. Under torch.no_grad() autograd saves nothing
and only the forward kernel runs; the backward skips d hidden / d weight / d bias work for inputs that need
no gradient. A frozen head (LoRA) without entropy takes ops/frozen_head.py instead: d logp / d hidden formed
in the forward, 2 GEMM-equivalents in all.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rlkernels import _validate as v
from rlkernels._backend import select_backend
from rlkernels._dtypes import acc_dtype
from rlkernels.ops import (
    frozen_head,
    linear_sweep,
    logprobs_checked,
    sampled_logprobs,
    sampling,
    vocab_parallel,
)
from rlkernels.ops._flags import check_flag
from rlkernels.ops._library import register_backends
from rlkernels.reference import logprobs as reference

LINEAR = "linear_logprobs"
LOGITS = "logprobs_from_logits"


# ---- Triton flavors ----


@torch.library.custom_op("rlkernels::linear_logprobs_triton", mutates_args=())
def _linear_triton(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    bias: torch.Tensor | None,
    temperature: float,
    softcap: float | None,
    ignore_index: int,
    return_entropy: bool,
    return_sum_pi_squared: bool,
    chunk_size: int | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    from rlkernels.triton.linear_logprobs import linear_logprobs_forward

    return linear_logprobs_forward(
        hidden,
        weight,
        labels,
        bias,
        temperature,
        softcap,
        ignore_index,
        return_entropy,
        return_sum_pi_squared,
        chunk_size,
    )


@torch.library.custom_op("rlkernels::linear_logprobs_triton_backward", mutates_args=())
def _linear_triton_backward(
    grad_logp: torch.Tensor,
    grad_entropy: torch.Tensor | None,
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    bias: torch.Tensor | None,
    lse: torch.Tensor,
    entropy: torch.Tensor,
    temperature: float,
    softcap: float | None,
    ignore_index: int,
    output_mask: Sequence[bool],
    chunk_size: int | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    from rlkernels.triton.linear_logprobs_backward import linear_logprobs_backward

    return linear_logprobs_backward(
        grad_logp,
        grad_entropy,
        hidden,
        weight,
        labels,
        bias,
        lse,
        entropy,
        temperature,
        softcap,
        ignore_index,
        output_mask,
        chunk_size,
    )


@torch.library.custom_op("rlkernels::logprobs_from_logits_triton", mutates_args=())
def _logits_triton(
    logits: torch.Tensor,
    labels: torch.Tensor,
    temperature: float,
    softcap: float | None,
    ignore_index: int,
    return_entropy: bool,
    return_sum_pi_squared: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    from rlkernels.triton.logprobs_from_logits import logprobs_from_logits_forward

    return logprobs_from_logits_forward(
        logits, labels, temperature, softcap, ignore_index, return_entropy, return_sum_pi_squared
    )


@torch.library.custom_op("rlkernels::logprobs_from_logits_triton_backward", mutates_args=())
def _logits_triton_backward(
    grad_logp: torch.Tensor,
    grad_entropy: torch.Tensor | None,
    logits: torch.Tensor,
    labels: torch.Tensor,
    lse: torch.Tensor,
    entropy: torch.Tensor,
    temperature: float,
    softcap: float | None,
    ignore_index: int,
) -> torch.Tensor:
    from rlkernels.triton.logprobs_from_logits import logprobs_from_logits_backward

    return logprobs_from_logits_backward(
        grad_logp, grad_entropy, logits, labels, lse, entropy, temperature, softcap, ignore_index
    )


@torch.library.custom_op("rlkernels::logprobs_from_logits_triton_backward_into", mutates_args=("logits",))
def _logits_triton_backward_into(
    grad_logp: torch.Tensor,
    grad_entropy: torch.Tensor | None,
    logits: torch.Tensor,
    labels: torch.Tensor,
    lse: torch.Tensor,
    entropy: torch.Tensor,
    temperature: float,
    softcap: float | None,
    ignore_index: int,
    out_dtype: torch.dtype,
) -> None:
    """logprobs_from_logits_triton_backward written over the contiguous logits [N, V] themselves, in
    out_dtype (no wider than the logits', rounded in the kernel as .to() would round it): row i's gradient
    fills the first bytes of row i's storage, read back as `linear_sweep.logits_into_view(logits,
    out_dtype)`. The row sweep's d z on a GPU (ops/linear_sweep.py) in its GEMMs' 16-bit operand dtype: no
    copy rounds an fp32 gradient block, and the sweep holds one [R, V] block instead of the logits and a
    second for d z. Triton only (no autograd formula: the sweep runs under no_grad)."""
    from rlkernels.triton.logprobs_from_logits import logprobs_from_logits_backward

    logprobs_from_logits_backward(
        grad_logp, grad_entropy, logits, labels, lse, entropy, temperature, softcap, ignore_index, out_dtype,
        into_logits=True,
    )  # fmt: skip


@_logits_triton_backward_into.register_fake
def _(grad_logp, grad_entropy, logits, labels, lse, entropy, temperature, softcap, ignore_index, out_dtype):
    return None


# ---- fake (meta) implementations ----


def _row_outputs(like: torch.Tensor, n: int, return_entropy: bool, return_sum_pi_squared: bool):
    acc = acc_dtype(like.dtype)
    return (
        like.new_empty(n, dtype=acc),
        like.new_empty(n if return_entropy else 0, dtype=acc),
        like.new_empty(n, dtype=torch.float64),
        like.new_empty(n if return_sum_pi_squared else 0, dtype=acc),
    )


def _linear_fake(
    hidden,
    weight,
    labels,
    bias,
    temperature,
    softcap,
    ignore_index,
    return_entropy,
    return_sum_pi_squared,
    chunk_size,
):
    return _row_outputs(hidden, hidden.shape[0], return_entropy, return_sum_pi_squared)


def _linear_fake_backward(
    grad_logp,
    grad_entropy,
    hidden,
    weight,
    labels,
    bias,
    lse,
    entropy,
    temperature,
    softcap,
    ignore_index,
    output_mask,
    chunk_size,
):
    need_h, need_w, need_b = output_mask
    return (
        hidden.new_empty(hidden.shape) if need_h else hidden.new_empty(0),
        weight.new_empty(weight.shape) if need_w else weight.new_empty(0),
        bias.new_empty(bias.shape) if need_b and bias is not None else weight.new_empty(0),
    )


def _logits_fake(logits, labels, temperature, softcap, ignore_index, return_entropy, return_sum_pi_squared):
    return _row_outputs(logits, logits.shape[0], return_entropy, return_sum_pi_squared)


def _logits_fake_backward(
    grad_logp, grad_entropy, logits, labels, lse, entropy, temperature, softcap, ignore_index
):
    return logits.new_empty(logits.shape)


# ---- autograd ----


def _linear_setup_context(ctx, inputs, output):
    hidden, weight, labels, bias, temperature, softcap, ignore_index, return_entropy, _, chunk_size = inputs
    _, entropy, lse, _ = output
    ctx.save_for_backward(hidden, weight, labels, bias, lse, entropy)
    ctx.args = (temperature, softcap, ignore_index, return_entropy, chunk_size)


def _make_linear_backward(backward_op):
    def backward(ctx, grad_logp, grad_entropy, _grad_lse, _grad_sum_sq):
        hidden, weight, labels, bias, lse, entropy = ctx.saved_tensors
        temperature, softcap, ignore_index, return_entropy, chunk_size = ctx.args
        need_h, need_w, _, need_b = ctx.needs_input_grad[:4]
        need_b = need_b and bias is not None
        g_h, g_w, g_b = backward_op(
            grad_logp,
            grad_entropy if return_entropy else None,
            hidden,
            weight,
            labels,
            bias,
            lse,
            entropy,
            temperature,
            softcap,
            ignore_index,
            [need_h, need_w, need_b],
            chunk_size,
        )
        return (g_h if need_h else None, g_w if need_w else None, None, g_b if need_b else None) + (None,) * 6

    return backward


def _logits_setup_context(ctx, inputs, output):
    logits, labels, temperature, softcap, ignore_index, return_entropy, _ = inputs
    _, entropy, lse, _ = output
    ctx.save_for_backward(logits, labels, lse, entropy)
    ctx.args = (temperature, softcap, ignore_index, return_entropy)


def _make_logits_backward(backward_op):
    def backward(ctx, grad_logp, grad_entropy, _grad_lse, _grad_sum_sq):
        logits, labels, lse, entropy = ctx.saved_tensors
        temperature, softcap, ignore_index, return_entropy = ctx.args
        grad = backward_op(
            grad_logp,
            grad_entropy if return_entropy else None,
            logits,
            labels,
            lse,
            entropy,
            temperature,
            softcap,
            ignore_index,
        )
        return (grad, None, None, None, None, None, None)

    return backward


# backend -> op name in torch.ops.rlkernels (for opcheck and introspection), and backend -> launcher
LINEAR_FLAVORS, _LINEAR_LAUNCH = register_backends(
    LINEAR,
    fake=_linear_fake,
    fake_backward=_linear_fake_backward,
    setup_context=_linear_setup_context,
    make_backward=_make_linear_backward,
)
LOGITS_FLAVORS, _LOGITS_LAUNCH = register_backends(
    LOGITS,
    fake=_logits_fake,
    fake_backward=_logits_fake_backward,
    setup_context=_logits_setup_context,
    make_backward=_make_logits_backward,
)


# ---- validation shared by both public functions ----


def _check_int(op_name: str, value, name: str, *, ge: int | None = None, optional: bool = False):
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{op_name}: {name} must be an int, got {type(value).__name__}")
    if ge is not None and value < ge:
        raise ValueError(f"{op_name}: {name} must be >= {ge}, got {value}")
    return value


def _check_options(op_name: str, temperature, softcap, ignore_index, return_entropy, return_sum_pi_squared):
    temperature = float(v.check_number(op_name, temperature, "temperature", gt=0))
    softcap = v.check_number(op_name, softcap, "softcap", gt=0, optional=True)
    softcap = None if softcap is None else float(softcap)
    ignore_index = _check_int(op_name, ignore_index, "ignore_index")
    for name, flag in (("return_entropy", return_entropy), ("return_sum_pi_squared", return_sum_pi_squared)):
        if not isinstance(flag, bool):
            raise TypeError(f"{op_name}: {name} must be a bool, got {type(flag).__name__}")
    return temperature, softcap, ignore_index


def _check_labels(op_name: str, labels, lead_shape, lead_of: str, vocab: int, ignore_index: int):
    v.check_index(op_name, labels, "labels")
    v.check_shape(op_name, labels, "labels", lead_shape, lead_of)
    v.assert_in_range(op_name, labels, "labels", 0, vocab, ignore=ignore_index)


def _check_linear_args(
    hidden, weight, labels, bias, temperature, softcap, ignore_index, return_entropy, return_sum_pi_squared,
    chunk_size,
):  # fmt: skip
    """The checks linear_logprobs makes alike with and without a process group (the weight's row count and
    the label range differ): dtypes, bias, devices, options, chunk_size. Returns (device, temperature,
    softcap, ignore_index, chunk_size)."""
    if hidden.dtype != weight.dtype:
        raise TypeError(
            f"{LINEAR}: hidden ({hidden.dtype}) and weight ({weight.dtype}) must have the same dtype"
        )
    if bias is not None:
        v.check_float(LINEAR, bias, "bias")
        v.check_shape(LINEAR, bias, "bias", weight.shape[:1], "weight.shape[:1]")
    device = v.check_same_device(LINEAR, hidden=hidden, weight=weight, labels=labels, bias=bias)
    temperature, softcap, ignore_index = _check_options(
        LINEAR, temperature, softcap, ignore_index, return_entropy, return_sum_pi_squared
    )
    chunk_size = _check_int(LINEAR, chunk_size, "chunk_size", ge=1, optional=True)
    return device, temperature, softcap, ignore_index, chunk_size


def _scalar(temperature):
    """The float temperature the fused path's checks see: 1.0 stands in for a per-token tensor (checked by
    sampling.check_sampling, applied per block)."""
    return 1.0 if isinstance(temperature, torch.Tensor) else temperature


def _reference_sampling(sampled: sampling.Sampling | None, temperature: float, lead_shape) -> dict:
    """The reference's temperature / top_k / top_p / min_p keywords, tensors in the labels' shape."""
    if sampled is None:
        return {"temperature": temperature}
    return {
        name: x.view(lead_shape) if isinstance(x, torch.Tensor) else x
        for name, x in sampled._asdict().items()
    }


def _no_sampling_with_group(temperature, top_k, top_p, min_p):
    if isinstance(temperature, torch.Tensor) or any(x is not None for x in (top_k, top_p, min_p)):
        raise ValueError(
            f"{LINEAR}: a tensor temperature, top_k, top_p and min_p are not supported with process_group "
            "(the kept set would need a search across the vocabulary shards)"
        )


def _outputs(logp, entropy, sum_sq, lead_shape, return_entropy, return_sum_pi_squared):
    """logp, then entropy, then sum_pi_squared (detached: forward-only), as asked; a tuple when more."""
    outputs = [logp.view(lead_shape)]
    if return_entropy:
        outputs.append(entropy.view(lead_shape))
    if return_sum_pi_squared:
        outputs.append(sum_sq.detach().view(lead_shape))
    return outputs[0] if len(outputs) == 1 else tuple(outputs)


# ---- public functions ----


@v.keyword_options
def linear_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    temperature: float | torch.Tensor = 1.0,
    softcap: float | None = None,
    ignore_index: int = -100,
    return_entropy: bool = False,
    return_sum_pi_squared: bool = False,
    top_k: int | torch.Tensor | None = None,
    top_p: float | torch.Tensor | None = None,
    min_p: float | torch.Tensor | None = None,
    chunk_size: int | None = None,
    backend: str = "auto",
    process_group=None,
):
    """Per-token log-prob of `labels` (and entropy, and sum of squared probabilities) under
    softmax(hidden @ weight.T + bias), fused: the [..., V] logits are never materialized, in the forward or
    the backward.

    z = (hidden @ weight.T + bias); with softcap c: z = c * tanh(z / c); then z / temperature.
    logp = z[label] - logsumexp(z) (always <= 0); entropy = logsumexp(z) - sum(softmax(z) * z);
    sum_pi_squared = sum(softmax(z) ** 2) = exp(logsumexp(2 z) - 2 logsumexp(z)), in (0, 1].

    Args:
        hidden: [..., D] float32/float64/float16/bfloat16, the final hidden states.
        weight: [V, D] same dtype (the LM head / output embedding; a [D, V] transpose is named as such in
            the error).
        labels: [...] int32/int64 in [0, V), or `ignore_index`.
        bias: [V] or None (cast to hidden's dtype).
        temperature: > 0, divides the (softcapped) logits: a float, or a [...] tensor (labels' shape) of one
            temperature per token (rollout engines sample each request at its own).
        softcap: None, or c > 0 for Gemma-2-style final-logit softcapping.
        top_k, top_p, min_p: the rollout's truncated sampling distribution (docs/sampling.md; vLLM
            0.33.0's rules and order: min_p, then top_k, then top_p renormalized over what is left). Each
            None (off), one number, or a [...] tensor per token (rows with top_k <= 0, top_p = 1 or
            min_p = 0 are not truncated by it). logp, entropy and sum_pi_squared are then those of the
            distribution renormalized over the kept tokens; a label outside them gets logp -inf and no
            gradient through it. top_k: int >= 1; top_p in (0, 1]; min_p in [0, 1].
        ignore_index: rows whose label equals it get logp 0, entropy 0 and sum_pi_squared 0, and exactly zero
            gradient.
        return_entropy: also return the per-token entropy (differentiable too).
        return_sum_pi_squared: also return sum_v p_v^2 per token (verl's sum_pi_squared, the Optimal Token
            Baseline's input), from the same fused pass. Forward-only: returned detached, no gradient.
        chunk_size: vocabulary columns per chunk (None: from a memory budget, at most 64 MiB). The CPU
            kernel materializes at most [min(N, 2048), chunk_size] fp32 logits at a time; the Triton forward
            splits the vocabulary into chunks of this size, the Triton backward keeps one [N, chunk_size]
            softmax-gradient buffer.
        backend: "auto" | "triton" | "cuda" | "cpu" | "reference".
        process_group: None (the whole head on this process), or a torch.distributed group over which the
            vocabulary is split (docs/vocab_parallel.md): weight is then this rank's contiguous shard
            [V_local, D] of the [V, D] head (ranks in group order, any split, V_local >= 1), bias its
            [V_local] slice, and labels hold global ids in [0, V). Every rank passes the same hidden and
            labels and gets the unsharded result; d hidden is summed over the group inside the backward,
            d weight / d bias are the shard's slices. Costs one all_gather of 3 ints and one of [3, N]
            floats per forward, one all_reduce of [N, D] per backward. Not with a tensor temperature,
            top_k, top_p or min_p.

    Frozen head: when hidden requires a gradient but weight and bias do not (LoRA without an lm_head
    adapter), return_entropy is False and no process_group is given, the forward also forms d logp /
    d hidden per row (rows of [R, V] logits at a time, chunk_size unused) and holds it as [N, D] fp32 until
    backward, which then needs no GEMM: 2 GEMM-equivalents instead of 3 (ops/frozen_head.py).

    Returns:
        logp [...] float32 (float64 for float64 inputs); with return_entropy and / or
        return_sum_pi_squared, the tuple (logp, entropy if asked, sum_pi_squared if asked), each [...] of
        logp's dtype. logp and entropy are differentiable in hidden, weight and bias; under torch.no_grad()
        only the forward runs and nothing is saved.
    """
    v.check_float(LINEAR, hidden, "hidden")
    v.check_linear_weight(LINEAR, hidden, weight)
    if process_group is not None:
        _no_sampling_with_group(temperature, top_k, top_p, min_p)
        return _vocab_parallel(
            hidden, weight, labels, bias, temperature, softcap, ignore_index, return_entropy,
            return_sum_pi_squared, chunk_size, backend, process_group,
        )  # fmt: skip
    if weight.shape[0] == 0:
        raise ValueError(
            f"{LINEAR}: weight must have at least one row (vocabulary entry), got {tuple(weight.shape)}"
        )
    device, scalar_temperature, softcap, ignore_index, chunk_size = _check_linear_args(
        hidden, weight, labels, bias, _scalar(temperature), softcap, ignore_index, return_entropy,
        return_sum_pi_squared, chunk_size,
    )  # fmt: skip
    lead_shape = hidden.shape[:-1]
    _check_labels(LINEAR, labels, lead_shape, "hidden.shape[:-1]", weight.shape[0], ignore_index)
    acc = acc_dtype(hidden.dtype)
    sampled = sampling.check_sampling(LINEAR, temperature, top_k, top_p, min_p, labels, acc)
    wants_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (hidden, weight, bias)
    )
    backend = select_backend(
        LINEAR, backend, device, implemented=tuple(_LINEAR_LAUNCH), mode="grad" if wants_grad else "no_grad"
    )
    if backend == "reference":
        return reference.linear_logprobs(
            hidden, weight, labels, bias, softcap=softcap, ignore_index=ignore_index,
            return_entropy=return_entropy, return_sum_pi_squared=return_sum_pi_squared,
            **_reference_sampling(sampled, scalar_temperature, lead_shape),
        )  # fmt: skip
    if bias is not None:
        bias = bias.to(hidden.dtype)
    if sampled is not None:
        logp, entropy, sum_sq = sampled_logprobs.LinearSampled.apply(
            hidden.reshape(-1, hidden.shape[-1]), weight, bias, labels.reshape(-1).long(), sampled,
            linear_sweep.LogitOptions(1.0, softcap, ignore_index), LOGITS_FLAVORS[backend], return_entropy,
            return_sum_pi_squared,
        )  # fmt: skip
        return _outputs(logp, entropy, sum_sq, lead_shape, return_entropy, return_sum_pi_squared)
    if frozen_head.applies(hidden, weight, bias, return_entropy):
        logp, sum_sq = frozen_head.frozen_head_logprobs(
            hidden.reshape(-1, hidden.shape[-1]), weight, bias, labels.reshape(-1),
            linear_sweep.LogitOptions(scalar_temperature, softcap, ignore_index), LOGITS_FLAVORS[backend],
            return_sum_pi_squared,
        )  # fmt: skip
        return _outputs(logp, None, sum_sq, lead_shape, False, return_sum_pi_squared)
    logp, entropy, _, sum_sq = _LINEAR_LAUNCH[backend](
        hidden.reshape(-1, hidden.shape[-1]),
        weight,
        labels.reshape(-1),
        bias,
        scalar_temperature,
        softcap,
        ignore_index,
        return_entropy,
        return_sum_pi_squared,
        chunk_size,
    )
    return _outputs(logp, entropy, sum_sq, lead_shape, return_entropy, return_sum_pi_squared)


def _vocab_parallel(
    hidden,
    weight,
    labels,
    bias,
    temperature,
    softcap,
    ignore_index,
    return_entropy,
    return_sum_pi_squared,
    chunk_size,
    backend,
    group,
):
    """linear_logprobs over a vocabulary split across `group` (rlkernels/ops/vocab_parallel.py): the same
    checks as the unsharded call, the label range against the global V from the shards' sizes."""
    device, temperature, softcap, ignore_index, chunk_size = _check_linear_args(
        hidden, weight, labels, bias, temperature, softcap, ignore_index, return_entropy,
        return_sum_pi_squared, chunk_size,
    )  # fmt: skip
    lead_shape = hidden.shape[:-1]
    v.check_index(LINEAR, labels, "labels")
    v.check_shape(LINEAR, labels, "labels", lead_shape, "hidden.shape[:-1]")
    backend = select_backend(LINEAR, backend, device, implemented=tuple(_LINEAR_LAUNCH))
    flat = hidden.reshape(-1, hidden.shape[-1])
    layout = vocab_parallel.shard_layout(LINEAR, group, flat, weight)
    v.assert_in_range(LINEAR, labels, "labels", 0, layout[1], ignore=ignore_index)
    if bias is not None:
        bias = bias.to(hidden.dtype)
    logp, entropy, sum_sq = vocab_parallel.vocab_parallel_linear_logprobs(
        flat, weight, labels.reshape(-1), bias, layout,
        (temperature, softcap, ignore_index, chunk_size, return_entropy, return_sum_pi_squared),
        backend, _LINEAR_LAUNCH.get(backend), LINEAR_FLAVORS.get(backend), group,
    )  # fmt: skip
    return _outputs(logp, entropy, sum_sq, lead_shape, return_entropy, return_sum_pi_squared)


def _collapses(sizes, strides) -> bool:
    """Whether dims of `sizes` at `strides` merge into one stride (a view, no copy)."""
    span = None
    for size, stride in zip(reversed(sizes), reversed(strides), strict=True):
        if size == 1:
            continue
        if span is not None and stride != span:
            return False
        span = stride * size
    return True


def _logit_rows(logits: torch.Tensor) -> torch.Tensor:
    """logits [..., V] as logprobs_checked's ops take them, without a copy where the kernels can read them:
    [N, V] where the lead dims merge into one stride, else [B, T, V] read at its two strides (a slice such
    as logits[:, :-1] of [B, T + 1, V]: reshaped to [N, V], it would be copied whole); any other layout is
    copied."""
    sizes, strides, vocab = logits.shape[:-1], logits.stride()[:-1], logits.shape[-1]
    if not _collapses(sizes, strides) and _collapses(sizes[:-1], strides[:-1]):
        return logits.reshape(-1, sizes[-1], vocab)  # a view: the batch dims merge
    return logits.reshape(-1, vocab)


@v.keyword_options
def logprobs_from_logits(
    logits: torch.Tensor,
    labels: torch.Tensor,
    *,
    temperature: float | torch.Tensor = 1.0,
    softcap: float | None = None,
    ignore_index: int = -100,
    return_entropy: bool = False,
    return_sum_pi_squared: bool = False,
    top_k: int | torch.Tensor | None = None,
    top_p: float | torch.Tensor | None = None,
    min_p: float | torch.Tensor | None = None,
    backend: str = "auto",
):
    """Per-token log-prob of `labels` (and entropy, and sum of squared probabilities) for callers that
    already hold the logits: rows are streamed once, no full-size log_softmax copy is made.

    z = logits (softcap c: c * tanh(logits / c)) / temperature; logp = z[label] - logsumexp(z) (<= 0);
    entropy = logsumexp(z) - sum(softmax(z) * z);
    sum_pi_squared = sum(softmax(z) ** 2) = exp(logsumexp(2 z) - 2 logsumexp(z)), in (0, 1].

    Args:
        logits: [..., V] float32/float64/float16/bfloat16. A view whose rows do not collapse into one stride,
            such as logits[:, :-1] of a model's [B, T, V] output, is read in place by the GPU kernels (the C++
            CPU kernel copies its rows together); the gradient is a fresh contiguous tensor of its shape.
        labels: [...] int32/int64 in [0, V), or `ignore_index`.
        temperature: > 0: a float, or a [...] tensor (labels' shape), one per token. softcap: None or > 0.
        top_k, top_p, min_p: the rollout's truncated sampling distribution, as `linear_logprobs` (vLLM
            0.33.0's rules; a label outside the kept tokens gets logp -inf and no gradient through it).
            With these or a tensor temperature, rows are copied in blocks of linear_sweep.BLOCK_BYTES fp32
            (one more read and write of the logits; eager only).
        ignore_index: rows whose label equals it get logp 0, entropy 0 and sum_pi_squared 0, and exactly zero
            gradient.
        return_entropy: also return the per-token entropy (differentiable too).
        return_sum_pi_squared: also return sum_v p_v^2 per token (verl's sum_pi_squared), from the same pass.
            Forward-only: returned detached, no gradient.
        backend: "auto" | "triton" | "cuda" | "cpu" | "reference".

    Returns:
        logp [...] float32 (float64 for float64 logits); with return_entropy and / or return_sum_pi_squared,
        the tuple (logp, entropy if asked, sum_pi_squared if asked), each [...] of logp's dtype. logp and
        entropy are differentiable in logits (the gradient has the logits' dtype).
    """
    v.check_float(LOGITS, logits, "logits")
    if logits.dim() < 1 or logits.shape[-1] == 0:
        raise ValueError(f"{LOGITS}: logits must be [..., V] with V >= 1, got shape {tuple(logits.shape)}")
    device = v.check_same_device(LOGITS, logits=logits, labels=labels)
    scalar_temperature, softcap, ignore_index = _check_options(
        LOGITS, _scalar(temperature), softcap, ignore_index, return_entropy, return_sum_pi_squared
    )
    lead_shape = logits.shape[:-1]
    v.check_index(LOGITS, labels, "labels")
    v.check_shape(LOGITS, labels, "labels", lead_shape, "logits.shape[:-1]")
    acc = acc_dtype(logits.dtype)
    sampled = sampling.check_sampling(LOGITS, temperature, top_k, top_p, min_p, labels, acc)
    backend = select_backend(LOGITS, backend, device, implemented=tuple(_LOGITS_LAUNCH))
    vocab = logits.shape[-1]
    if backend == "reference" or sampled is not None:  # the kernel of the plain path checks the labels itself
        v.assert_in_range(LOGITS, labels, "labels", 0, vocab, ignore=ignore_index)
    if backend == "reference":
        return reference.logprobs_from_logits(
            logits, labels, ignore_index=ignore_index, return_entropy=return_entropy, softcap=softcap,
            return_sum_pi_squared=return_sum_pi_squared,
            **_reference_sampling(sampled, scalar_temperature, lead_shape),
        )  # fmt: skip
    if sampled is not None:
        logp, entropy, sum_sq = sampled_logprobs.LogitsSampled.apply(
            logits.reshape(-1, logits.shape[-1]), labels.reshape(-1).long(), sampled,
            linear_sweep.LogitOptions(1.0, softcap, ignore_index), LOGITS_FLAVORS[backend], return_entropy,
            return_sum_pi_squared,
        )  # fmt: skip
        return _outputs(logp, entropy, sum_sq, lead_shape, return_entropy, return_sum_pi_squared)
    logp, entropy, _, sum_sq, ok = logprobs_checked.LAUNCH[backend](
        _logit_rows(logits),
        labels.reshape(-1),
        scalar_temperature,
        softcap,
        ignore_index,
        return_entropy,
        return_sum_pi_squared,
    )
    check_flag(
        LOGITS, ok, f"{LOGITS}: labels out of range [0, {vocab}) (other than ignore_index {ignore_index})",
        lambda: v.assert_in_range(LOGITS, labels, "labels", 0, vocab, ignore=ignore_index), backend=backend,
    )  # fmt: skip
    return _outputs(logp, entropy, sum_sq, lead_shape, return_entropy, return_sum_pi_squared)
