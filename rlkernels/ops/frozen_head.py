"""linear_logprobs with a frozen head in 2 GEMM-equivalents (docs/row_sweep.md).

With weight (and bias) needing no gradient, d logp_i / d hidden_i is a row that the forward can finish: the
logits (GEMM 1), then the softmax gradient of logp times W (GEMM 2), kept as an [N, D] Jacobian. Every
flavor streams both GEMMs over vocabulary chunks (ops/logp_jacobian.py). The backward is
grad_logp[:, None] * jacobian, no GEMM; the fused path's backward recomputes the logits and multiplies by W
(3 GEMM-equivalents in all).

The Jacobian is kept in hidden's dtype (the C++ CPU flavor's: fp32), the dtype of what the backward
returns: the forward holds about one d hidden's size, the backward two (the Jacobian and its product with
d logp, computed in fp32 and rounded once as it is written), which is Liger-Kernel's working memory (its
16-bit grad_input and a logits chunk of about as many bytes). The price is a second rounding of the
16-bit gradient: the Jacobian's, then the product's. With return_entropy the entropy's Jacobian would be a
second [N, D] state and a third GEMM, as many as the fused path does: the fused path is used then.

Ignored rows (labels == ignore_index): the GPU flavors' kernels compute them with the others and give them
0 and a zero gradient, as the fused path does, so a GPU call makes no host sync (selecting the rows with
nonzero() would wait for the GPU each call) and copies no [N, D] rows. The C++ CPU flavor's vocabulary
stream takes the labelled rows only (a CPU tensor's nonzero() waits for nothing).
"""

from __future__ import annotations

import torch

from rlkernels.ops import linear_sweep, logp_jacobian


def applies(hidden, weight, bias, return_entropy: bool) -> bool:
    """A gradient is wanted for hidden only, no entropy, and not under torch.compile (whose graphs take the
    fused op: this path's row selection and autograd node would break them)."""
    return (
        not torch.compiler.is_compiling()
        and torch.is_grad_enabled()
        and hidden.requires_grad
        and not weight.requires_grad
        and not (bias is not None and bias.requires_grad)
        and not return_entropy
    )


def frozen_head_logprobs(
    hidden: torch.Tensor,  # [N, D]
    weight: torch.Tensor,  # [V, D]
    bias: torch.Tensor | None,  # [V], hidden's dtype
    labels: torch.Tensor,  # [N]
    options: linear_sweep.LogitOptions,
    logits_flavor: str,
    want_sum_pi_squared: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(logp [N] differentiable in hidden, Σπ² [N] or None); ignored rows get 0 and no gradient."""
    rows, h, lab = None, hidden.detach(), labels.long()
    if linear_sweep.drops_ignored_rows(logits_flavor, hidden.device):
        rows = (labels != options.ignore_index).nonzero().squeeze(1)
        h, lab = h[rows], lab[rows]
    jacobian_dtype = linear_sweep.frozen_grad_dtype(logits_flavor, hidden.device, hidden.dtype)
    swept = linear_sweep.sweep(
        h, weight.detach(), None if bias is None else bias.detach(), lab, options, logits_flavor,
        logp_jacobian.JACOBIAN, want_entropy=False, need=(True, False, False),
        want_sum_pi_squared=want_sum_pi_squared, grad_dtype=jacobian_dtype,
    )  # fmt: skip
    logp, jacobian, sum_sq = swept.logp, swept.grad_hidden, swept.sum_pi_squared
    if rows is not None:
        n = hidden.shape[0]
        logp = logp.new_zeros(n).index_put_((rows,), logp)
        sum_sq = None if sum_sq is None else logp.new_zeros(n).index_put_((rows,), sum_sq)
    return _FrozenHeadLogp.apply(logp, hidden, rows, jacobian), sum_sq


class _FrozenHeadLogp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logp, hidden, rows, jacobian):
        ctx.save_for_backward(rows, jacobian)
        ctx.hidden_meta = (hidden.shape, hidden.dtype)
        return logp.clone()

    @staticmethod
    def backward(ctx, grad_logp):
        rows, jacobian = ctx.saved_tensors
        shape, dtype = ctx.hidden_meta
        if rows is None:  # every row's Jacobian (an ignored row's is 0); the product rounded as it is written
            grad = jacobian.new_empty(shape, dtype=dtype)
            g = grad_logp[:, None].to(torch.promote_types(jacobian.dtype, torch.float32))
            return None, torch.mul(jacobian, g, out=grad), None, None
        grad = jacobian.new_zeros(shape)
        grad.index_put_((rows,), grad_logp[rows, None].to(jacobian.dtype) * jacobian)
        return None, grad.to(dtype), None, None
