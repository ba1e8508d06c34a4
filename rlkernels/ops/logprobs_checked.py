"""logprobs_from_logits' own op pair for the public function: the forward also checks the labels it reads and
returns a validity flag (docs/gpu_token_ops.md): on a GPU the call is one forward launch, which asserts on a
bad label itself (both flavors), and one backward launch, where the eager range check cost eight launches.
The ops the row sweep and the sampled paths call (`rlkernels::logprobs_from_logits`,
rlkernels/ops/logprobs.py) keep their four outputs.

The logits are [N, V], or [B, T, V] read in place: a slice such as logits[:, :-1] is not contiguous as [N, V]
and would otherwise be copied whole (the public function passes it when its rows do not collapse).

The backward takes a None d logp (a loss of the entropy alone) and upstream gradients expanded from one
element (the gradient of `.sum()`) as they are: no zeros or contiguous copies before its launch."""

from __future__ import annotations

import math

import torch

from rlkernels._dtypes import acc_dtype
from rlkernels.ops._library import register_backends

CHECKED = "logprobs_from_logits_checked"
Tensor = torch.Tensor


@torch.library.custom_op("rlkernels::logprobs_from_logits_checked_triton", mutates_args=())
def _checked_triton(
    logits: Tensor,
    labels: Tensor,
    temperature: float,
    softcap: float | None,
    ignore_index: int,
    return_entropy: bool,
    return_sum_pi_squared: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    from rlkernels.triton.logprobs_from_logits import logprobs_from_logits_forward

    return logprobs_from_logits_forward(
        logits, labels, temperature, softcap, ignore_index, return_entropy, return_sum_pi_squared, True
    )


@torch.library.custom_op("rlkernels::logprobs_from_logits_checked_triton_backward", mutates_args=())
def _checked_triton_backward(
    grad_logp: Tensor | None,
    grad_entropy: Tensor | None,
    logits: Tensor,
    labels: Tensor,
    lse: Tensor,
    entropy: Tensor,
    temperature: float,
    softcap: float | None,
    ignore_index: int,
) -> Tensor:
    from rlkernels.triton.logprobs_from_logits import logprobs_from_logits_backward

    return logprobs_from_logits_backward(
        grad_logp, grad_entropy, logits, labels, lse, entropy, temperature, softcap, ignore_index
    )


def _fake(logits, labels, temperature, softcap, ignore_index, return_entropy, return_sum_pi_squared):
    n = math.prod(logits.shape[:-1])  # [N, V] or [B, T, V]
    acc = acc_dtype(logits.dtype)
    return (
        logits.new_empty(n, dtype=acc),
        logits.new_empty(n if return_entropy else 0, dtype=acc),
        logits.new_empty(n, dtype=torch.float64),
        logits.new_empty(n if return_sum_pi_squared else 0, dtype=acc),
        logits.new_empty((), dtype=torch.bool),
    )


def _fake_backward(grad_logp, grad_entropy, logits, labels, lse, entropy, temperature, softcap, ignore_index):
    return logits.new_empty(logits.shape)


def _setup_context(ctx, inputs, output):
    logits, labels, temperature, softcap, ignore_index, return_entropy, _ = inputs
    _, entropy, lse, sum_sq, ok = output
    ctx.save_for_backward(logits, labels, lse, entropy)
    ctx.args = (temperature, softcap, ignore_index, return_entropy)
    ctx.mark_non_differentiable(lse, sum_sq, ok)
    ctx.set_materialize_grads(False)  # no zeros for the outputs that reach no loss


def _make_backward(backward_op):
    def backward(ctx, grad_logp, grad_entropy, _grad_lse, _grad_sum_sq, _grad_ok):
        logits, labels, lse, entropy = ctx.saved_tensors
        temperature, softcap, ignore_index, return_entropy = ctx.args
        grad_entropy = grad_entropy if return_entropy else None
        if grad_logp is None and grad_entropy is None:
            return (None,) * 7
        grad = backward_op(
            grad_logp, grad_entropy, logits, labels, lse, entropy, temperature, softcap, ignore_index
        )
        return (grad, None, None, None, None, None, None)

    return backward


# backend -> op name, and backend -> launcher (rlkernels/ops/_library.py)
FLAVORS, LAUNCH = register_backends(
    CHECKED,
    fake=_fake,
    fake_backward=_fake_backward,
    setup_context=_setup_context,
    make_backward=_make_backward,
)
