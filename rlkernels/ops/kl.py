"""kl_penalty: custom ops (native C++/CUDA and Triton), their fake and autograd registrations, and the
public function."""

from __future__ import annotations

import torch

from rlkernels import _validate as v
from rlkernels._backend import select_backend
from rlkernels.ops._library import has_native, op, register_backends, takes_native_eager
from rlkernels.reference import kl as reference
from rlkernels.reference.kl import KL_KINDS

OP = "kl_penalty"


@torch.library.custom_op("rlkernels::kl_penalty_triton", mutates_args=())
def _kl_penalty_triton(
    logp: torch.Tensor, ref_logp: torch.Tensor, kind: str, clamp: float | None
) -> torch.Tensor:
    from rlkernels.triton.kl import kl_penalty_forward

    return kl_penalty_forward(logp, ref_logp, kind, clamp)


@torch.library.custom_op("rlkernels::kl_penalty_triton_backward", mutates_args=())
def _kl_penalty_triton_backward(
    grad: torch.Tensor,
    logp: torch.Tensor,
    ref_logp: torch.Tensor,
    kind: str,
    clamp: float | None,
    logp_grad: bool = True,
    ref_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    from rlkernels.triton.kl import kl_penalty_backward

    return kl_penalty_backward(grad, logp, ref_logp, kind, clamp, logp_grad, ref_grad)


def _fake(logp, ref_logp, kind, clamp):
    return logp.new_empty(logp.shape)


def _fake_backward(grad, logp, ref_logp, kind, clamp, logp_grad=True, ref_grad=False):
    return (
        logp.new_empty(logp.shape if logp_grad else (0,)),
        logp.new_empty(logp.shape if ref_grad else (0,)),
    )


def _setup_context(ctx, inputs, output):
    logp, ref_logp, kind, clamp = inputs
    ctx.save_for_backward(logp, ref_logp)
    ctx.kind, ctx.clamp = kind, clamp


def _make_backward(backward_op):
    def backward(ctx, grad):
        logp, ref_logp = ctx.saved_tensors
        need_logp, need_ref = ctx.needs_input_grad[:2]
        # One launch writes both gradients (d ref_logp = -d logp): no negation kernel after it.
        grad_logp, grad_ref = backward_op(grad, logp, ref_logp, ctx.kind, ctx.clamp, need_logp, need_ref)
        return grad_logp if need_logp else None, grad_ref if need_ref else None, None, None

    return backward


# backend -> launcher of its flavor (rlkernels/ops/_library.py: eager fast path, the op under compile)
_FLAVORS, _LAUNCH = register_backends(
    "kl_penalty",
    fake=_fake,
    fake_backward=_fake_backward,
    setup_context=_setup_context,
    make_backward=_make_backward,
)

# The native flavor in plain eager mode: one op whose autograd node is C++ (csrc/autograd/kl_penalty.cpp, the
# formula above), so the backward pass never enters Python. Absent from an extension built before it: the
# launcher serves then.
_native_eager = op("kl_penalty_autograd").default if has_native("kl_penalty_autograd") else None


@v.keyword_options
def kl_penalty(
    logp: torch.Tensor,
    ref_logp: torch.Tensor,
    kind: str = "k3",
    *,
    clamp: float | None = 10.0,
    backend: str = "auto",
) -> torch.Tensor:
    """Per-token KL penalty between the policy and a reference policy (verl `kl_penalty`).

    Args:
        logp: [...] float32/float64/float16/bfloat16, log-probs of the sampled tokens under the policy.
        ref_logp: [...] same shape, under the reference policy.
        kind: "k1"/"kl" (logp - ref), "abs", "k2"/"mse" ((logp - ref)^2 / 2), "k3"/"low_var_kl"
            (e^d - d - 1 with d = clamp(ref - logp, -20, 20)), each optionally followed by "+" as in
            verl 0.9.1 ("k1+", "abs+", "k3+", ...: the value of the base kind with the gradient of k2,
            straight-through; NaN where the log-ratio is infinite, as verl's; "k2+" is k2 elsewhere).
        clamp: k3's output is clamped to [-clamp, clamp] (verl: 10); None disables it (TRL).
        backend: "auto" | "triton" | "cuda" | "cpu" | "reference".

    Returns:
        [...] in the promoted dtype of the inputs (computed in fp32, or fp64 for fp64 inputs);
        differentiable in logp and ref_logp.
    """
    v.check_float(OP, logp, "logp")
    v.check_float(OP, ref_logp, "ref_logp")
    v.check_shape(OP, ref_logp, "ref_logp", logp.shape, "logp")
    device = v.check_same_device(OP, logp=logp, ref_logp=ref_logp)
    kind = KL_KINDS[v.check_choice(OP, kind, "kind", KL_KINDS)]
    clamp = v.check_number(OP, clamp, "clamp", gt=0, optional=True)
    clamp = None if clamp is None else float(clamp)
    backend = select_backend(OP, backend, device, implemented=tuple(_LAUNCH))
    if backend == "reference":
        return reference.kl_penalty(logp, ref_logp, kind, clamp)
    if logp.dtype != ref_logp.dtype:
        dtype = torch.promote_types(logp.dtype, ref_logp.dtype)
        logp, ref_logp = logp.to(dtype), ref_logp.to(dtype)
    if takes_native_eager(_native_eager, backend, logp):
        return _native_eager(logp, ref_logp, kind, clamp)
    return _LAUNCH[backend](logp, ref_logp, kind, clamp)
