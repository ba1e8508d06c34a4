"""value_loss: custom ops (native C++/CUDA and Triton), their fake and autograd registrations, and the
public function. As policy_loss (docs/gpu_token_ops.md), the ops reduce per-row masked sums in one pass,
finish the chosen `agg` inside the op (on a GPU in the forward launch itself) and check the input values they
read into an `ok` flag; the backward pass recomputes the (exp-free) tokens in one launch."""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from rlkernels import _validate as v
from rlkernels._backend import select_backend
from rlkernels._dtypes import acc_dtype
from rlkernels._op_schema import Signature
from rlkernels.ops._aggregation import AggConfig, agg_op_args, check_agg_args
from rlkernels.ops._flags import check_flag
from rlkernels.ops._library import has_native, op, register_backends, takes_native_eager
from rlkernels.ops._token_masks import native_mask
from rlkernels.ops.policy_loss import KERNEL_CHECKS
from rlkernels.reference import value_loss as reference

OP = "value_loss"
# What a failed torch._assert_async of the ops' value flag means (the device cannot say which value; on a GPU
# the kernels assert themselves, with their own message).
BAD_VALUES = (
    f"{OP}: an input value is invalid: NaN/inf values, old_values or returns, mask weights negative or not "
    "finite, or an integer mask value other than 0 and 1 (CPU tensors: a ValueError names it)"
)

Tensor = torch.Tensor


class ValueInputs(NamedTuple):
    """The tensors of the value_loss ops (csrc/rlkernels.cpp documents their shapes)."""

    values: Tensor
    old_values: Tensor
    returns: Tensor
    mask: Tensor


# The ops' arguments, for both flavors (the native schemas take the aggregation fragment from the header
# generated from AggConfig; tests/test_op_schemas.py compares them).
FORWARD = Signature(
    "value_loss", [ValueInputs, ("clip", float | None), AggConfig], returns="(Tensor, Tensor, Tensor, Tensor)"
)
BACKWARD = Signature(
    "value_loss_backward",
    [("grad_loss", Tensor), ("row_weights", Tensor), ValueInputs, ("clip", float | None)],
    returns="Tensor",
)
# The differentiable input's position in the forward op's arguments, and what the autograd formula keeps.
VALUES_ARG, CLIP_ARG, INPUTS_ARGS = FORWARD.index("values"), FORWARD.index("clip"), FORWARD.part(ValueInputs)


@torch.library.custom_op("rlkernels::value_loss_triton", mutates_args=(), schema=FORWARD.schema())
def _value_loss_triton(*args) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    from rlkernels.triton.value_loss import value_loss_forward

    inputs, clip, agg = FORWARD.unpack(args)
    return value_loss_forward(*inputs, clip, agg)


@torch.library.custom_op("rlkernels::value_loss_triton_backward", mutates_args=(), schema=BACKWARD.schema())
def _value_loss_triton_backward(*args) -> Tensor:
    from rlkernels.triton.value_loss import value_loss_backward

    grad_loss, row_weights, inputs, clip = BACKWARD.unpack(args)
    return value_loss_backward(grad_loss, row_weights, *inputs, clip)


def _fake(*args):
    inputs, _clip, _agg = FORWARD.unpack(args)
    values = inputs.values
    acc = acc_dtype(values.dtype)
    return (
        values.new_empty((), dtype=acc),
        values.new_empty(1, dtype=acc),
        values.new_empty(values.shape[0], dtype=acc),
        values.new_empty((), dtype=torch.bool),
    )


def _fake_backward(*args):
    _grad_loss, _row_weights, inputs, _clip = BACKWARD.unpack(args)
    return inputs.values.new_empty(inputs.values.shape)


def _setup_context(ctx, inputs, output):
    _loss, clipfrac, row_weights, ok = output
    ctx.save_for_backward(row_weights, *inputs[INPUTS_ARGS])
    ctx.clip = inputs[CLIP_ARG]
    ctx.num_inputs = len(inputs)
    ctx.mark_non_differentiable(clipfrac, row_weights, ok)
    ctx.set_materialize_grads(False)


def _make_backward(backward_op):
    def backward(ctx, grad_loss, _grad_clipfrac, _grad_weights, _grad_ok):
        row_weights, *tensors = ctx.saved_tensors
        grads = [None] * ctx.num_inputs
        if grad_loss is not None and ctx.needs_input_grad[VALUES_ARG]:
            grads[VALUES_ARG] = backward_op(grad_loss, row_weights, *tensors, ctx.clip)
        return tuple(grads)

    return backward


# backend -> op name and launcher of its flavor (rlkernels/ops/_library.py: eager fast path; the op under
# compile)
_FLAVORS, _LAUNCH = register_backends(
    "value_loss",
    fake=_fake,
    fake_backward=_fake_backward,
    setup_context=_setup_context,
    make_backward=_make_backward,
)

# The native flavor's eager call with its autograd node in C++ (csrc/autograd/value_loss.cpp): in plain eager
# mode the backward pass never enters Python.
NATIVE_EAGER = "value_loss_autograd"
_native_eager = op(NATIVE_EAGER).default if has_native(NATIVE_EAGER) else None


@v.keyword_options
def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    *,
    clip: float | None = 0.2,
    agg: str = "token-mean",
    num_tokens=None,
    num_seqs=None,
    dp_size: int = 1,
    norm_len: float | None = None,
    backend: str = "auto",
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped PPO critic loss (verl compute_value_loss):
    0.5 · agg(max((values - returns)^2, (clip(values, old_values ± clip) - returns)^2)).

    Args:
        values: [B, T] float32/float64/float16/bfloat16, value predictions (differentiable).
        old_values: [B, T], the values at rollout time; returns: [B, T], the targets. values, old_values
            and returns must be finite at every position (ValueError for CPU tensors, a device-side
            assert for GPU tensors: the kernels check the values they read, no host sync).
        mask: [B, T] bool, integer 0/1 (a Hugging Face attention_mask), or float weights (finite, >= 0).
        clip: the value clip range (> 0), or None for the unclipped loss.
        agg, num_tokens, num_seqs, dp_size, norm_len: as rk.policy_loss (reference/aggregation.py).
        backend: "auto" | "triton" | "cuda" | "cpu" | "reference".

    Returns:
        (loss, {"clipfrac"}): 0-dim tensors (float32; float64 for float64 inputs); loss is differentiable in
        values; clipfrac is the masked fraction of tokens where the clipped branch is larger.
    """
    v.check_float(OP, values, "values")
    v.check_ndim(OP, values, "values", (2,))
    shape = tuple(values.shape)
    for name, t in (("old_values", old_values), ("returns", returns)):
        v.check_float(OP, t, name)
        v.check_shape(OP, t, name, shape, "values")
    v.check_mask(OP, mask, "mask", shape, "values")
    device = v.check_same_device(OP, values=values, old_values=old_values, returns=returns, mask=mask)
    clip = v.check_number(OP, clip, "clip", gt=0, optional=True)
    clip = None if clip is None else float(clip)
    agg_args = check_agg_args(OP, agg, num_tokens, num_seqs, dp_size, norm_len, device)
    backend = select_backend(OP, backend, device, implemented=tuple(_FLAVORS))

    def eager_checks():  # the values, with the offending element (ValueError on CPU tensors)
        for name, t in (("values", values), ("old_values", old_values), ("returns", returns)):
            v.check_finite(OP, t, name)
        return v.mask_values(OP, mask)

    dtype = functools.reduce(torch.promote_types, [values.dtype, old_values.dtype, returns.dtype])
    acc = acc_dtype(dtype)
    if backend not in KERNEL_CHECKS:  # the reference: checked before it runs
        mask = eager_checks()
        loss, stats = reference.value_loss(values, old_values, returns, mask, clip=clip, agg=agg, **agg_args)
        return loss.to(acc), {k: s.to(acc) for k, s in stats.items()}
    if backend != "triton":  # the Triton kernels read any mask dtype
        mask = native_mask(mask, acc)
    cast = [t if t.dtype == dtype else t.to(dtype) for t in (values, old_values, returns)]
    inputs = ValueInputs(*cast, mask)
    agg_config = agg_op_args(agg, agg_args, shape[1])
    if takes_native_eager(_native_eager, backend, inputs.values):
        loss, clipfrac, ok = _native_eager(*inputs, clip, *agg_config)
    else:
        loss, clipfrac, _, ok = _LAUNCH[backend](*inputs, clip, *agg_config)
    check_flag(OP, ok, BAD_VALUES, eager_checks, backend=backend)
    return loss, {"clipfrac": clipfrac.reshape(())}
