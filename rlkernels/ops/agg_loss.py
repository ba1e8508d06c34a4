"""agg_loss: verl's `agg_loss` (verl 0.9.1 core_algos.agg_loss) over a given token loss as custom ops
(native C++/CUDA and Triton), their fake and autograd registrations, and the public function. The scheme of
value_loss (docs/gpu_token_ops.md): one forward pass reduces the per-row masked sums, finishes the chosen
`agg` inside the op (on a GPU in the forward launch itself) and checks the mask values it reads into an
`ok` flag; the backward pass writes grad · c_b · m in one launch. Where verl's actor aggregates its entropy
and KL terms (and TRL its corrected KL), the eager composition launches 25 to 31 kernels for a forward +
backward (tests/test_gpu_budgets.py); this takes two."""

from __future__ import annotations

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
from rlkernels.reference import aggregation as reference

OP = "agg_loss"
# The verl release whose agg_loss this follows (rlkernels/reference/aggregation.py: its modes, global
# normalizers and the differences on purpose); tests/test_verl.py compares it with the installed verl.
VERL_VERSION = "0.9.1"
# What a failed torch._assert_async of the ops' value flag means (on a GPU the kernels assert themselves).
BAD_VALUES = (
    f"{OP}: a mask value is invalid: a weight negative or not finite, or an integer mask value other than 0 "
    "and 1 (CPU tensors: a ValueError names it)"
)

Tensor = torch.Tensor


class AggInputs(NamedTuple):
    """The tensors of the agg_loss ops (csrc/rlkernels.cpp documents their shapes)."""

    loss_mat: Tensor
    mask: Tensor


# The ops' arguments, for both flavors (tests/test_op_schemas.py compares them with the native schemas).
FORWARD = Signature("agg_loss", [AggInputs, AggConfig], returns="(Tensor, Tensor, Tensor)")
BACKWARD = Signature(
    "agg_loss_backward", [("grad_loss", Tensor), ("row_weights", Tensor), AggInputs], returns="Tensor"
)
# The differentiable input's position in the forward op's arguments, and what the autograd formula keeps.
LOSS_ARG, INPUTS_ARGS = FORWARD.index("loss_mat"), FORWARD.part(AggInputs)


@torch.library.custom_op("rlkernels::agg_loss_triton", mutates_args=(), schema=FORWARD.schema())
def _agg_loss_triton(*args) -> tuple[Tensor, Tensor, Tensor]:
    from rlkernels.triton.agg_loss import agg_loss_forward

    inputs, agg = FORWARD.unpack(args)
    return agg_loss_forward(*inputs, agg)


@torch.library.custom_op("rlkernels::agg_loss_triton_backward", mutates_args=(), schema=BACKWARD.schema())
def _agg_loss_triton_backward(*args) -> Tensor:
    from rlkernels.triton.agg_loss import agg_loss_backward

    grad_loss, row_weights, inputs = BACKWARD.unpack(args)
    return agg_loss_backward(grad_loss, row_weights, *inputs)


def _fake(*args):
    inputs, _agg = FORWARD.unpack(args)
    loss_mat = inputs.loss_mat
    acc = acc_dtype(loss_mat.dtype)
    return (
        loss_mat.new_empty((), dtype=acc),
        loss_mat.new_empty(loss_mat.shape[0], dtype=acc),
        loss_mat.new_empty((), dtype=torch.bool),
    )


def _fake_backward(*args):
    _grad_loss, _row_weights, inputs = BACKWARD.unpack(args)
    return inputs.loss_mat.new_empty(inputs.loss_mat.shape)


def _setup_context(ctx, inputs, output):
    _loss, row_weights, ok = output
    ctx.save_for_backward(row_weights, *inputs[INPUTS_ARGS])
    ctx.num_inputs = len(inputs)
    ctx.mark_non_differentiable(row_weights, ok)
    ctx.set_materialize_grads(False)


def _make_backward(backward_op):
    def backward(ctx, grad_loss, _grad_weights, _grad_ok):
        row_weights, *tensors = ctx.saved_tensors
        grads = [None] * ctx.num_inputs
        if grad_loss is not None and ctx.needs_input_grad[LOSS_ARG]:
            grads[LOSS_ARG] = backward_op(grad_loss, row_weights, *tensors)
        return tuple(grads)

    return backward


# backend -> op name and launcher of its flavor (rlkernels/ops/_library.py: eager fast path; the op under
# compile)
_FLAVORS, _LAUNCH = register_backends(
    "agg_loss",
    fake=_fake,
    fake_backward=_fake_backward,
    setup_context=_setup_context,
    make_backward=_make_backward,
)

# The native flavor's eager call with its autograd node in C++ (csrc/autograd/agg_loss.cpp): in plain eager
# mode the backward pass never enters Python.
NATIVE_EAGER = "agg_loss_autograd"
_native_eager = op(NATIVE_EAGER).default if has_native(NATIVE_EAGER) else None


@v.keyword_options
def agg_loss(
    loss_mat: Tensor,
    mask: Tensor,
    agg: str = "token-mean",
    *,
    num_tokens=None,
    num_seqs=None,
    dp_size: int = 1,
    norm_len: float | None = None,
    backend: str = "auto",
) -> Tensor:
    """Aggregate a token loss over its mask, as verl 0.9.1's `agg_loss` (core_algos.py) with the global
    normalizers of rk.policy_loss (docs/semantics.md, "Aggregation"; rlkernels/reference/aggregation.py):

        token-mean               dp · Σ_b S_b / N            (N = num_tokens, else Σ m)
        token-sum                dp · Σ_b S_b
        seq-mean-token-sum       dp · Σ_b S_b / S            (S = num_seqs, else the rows with tokens)
        seq-mean-token-mean      dp · Σ_{b: n_b>0} (S_b / n_b) / S
        seq-mean-token-sum-norm  dp · Σ_b S_b / S / norm_len (verl's loss_scale_factor; default T)

    with S_b = Σ_t m_bt·L_bt and n_b = Σ_t m_bt. A masked-out token adds exactly 0, even a NaN there (verl's
    product with the mask carries it); a zero normalizer (a fully masked batch) gives 0, never NaN; a NaN or
    inf at a kept token is the loss's, as in verl.

    Args:
        loss_mat: [B, T] float32/float64/float16/bfloat16, the per-token loss (differentiable): an entropy, a
            KL penalty, any token term. On a GPU, rows at any stride (a slice of a padded batch) are read in
            place.
        mask: [B, T] bool, integer 0/1 (a Hugging Face attention_mask), or float weights (finite, >= 0;
            ValueError for CPU tensors, a device-side assert for GPU tensors: no host sync).
        agg: one of the five modes above.
        num_tokens, num_seqs: the global normalizers of a data-parallel shard (a number, or a one-element
            tensor used without a host sync); dp_size: the shards' count (int >= 1); norm_len: > 0.
        backend: "auto" | "triton" | "cuda" | "cpu" | "reference".

    Returns:
        The loss, a 0-dim tensor (float32; float64 for float64 inputs), differentiable in loss_mat:
        d loss / d L_bt = c_b · m_bt, where c_b is the row's weight in the mode above. (verl returns
        loss_mat's dtype; rlkernels.integrations.verl.agg_loss casts to it.)
    """
    v.check_float(OP, loss_mat, "loss_mat")
    v.check_ndim(OP, loss_mat, "loss_mat", (2,))
    shape = tuple(loss_mat.shape)
    v.check_mask(OP, mask, "mask", shape, "loss_mat")
    device = v.check_same_device(OP, loss_mat=loss_mat, mask=mask)
    agg_args = check_agg_args(OP, agg, num_tokens, num_seqs, dp_size, norm_len, device)
    backend = select_backend(OP, backend, device, implemented=tuple(_FLAVORS))
    acc = acc_dtype(loss_mat.dtype)
    if backend not in KERNEL_CHECKS:  # the reference: checked before it runs
        mask = v.mask_values(OP, mask)
        return reference.agg_loss(loss_mat.to(acc), mask, agg, **agg_args)
    if backend != "triton":  # the Triton kernels read any mask dtype
        mask = native_mask(mask, acc)
    inputs = AggInputs(loss_mat, mask)
    agg_config = agg_op_args(agg, agg_args, shape[1])
    if takes_native_eager(_native_eager, backend, loss_mat):
        loss, ok = _native_eager(*inputs, *agg_config)
    else:
        loss, _, ok = _LAUNCH[backend](*inputs, *agg_config)
    check_flag(OP, ok, BAD_VALUES, lambda: v.mask_values(OP, mask), backend=backend)
    return loss
