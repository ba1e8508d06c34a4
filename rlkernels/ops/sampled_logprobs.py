"""linear_logprobs and logprobs_from_logits under the rollout's sampling distribution (a per-token
temperature, top_k, top_p, min_p): whole rows at a time (docs/sampling.md).

The truncation needs a row's whole distribution before any of its log-probs, so these paths take blocks of
whole rows, as the row sweep does, and run the backend's fused `logprobs_from_logits` kernels on each block
(ops/sampling.py): from hidden states the sweep's GEMM makes the block, from logits the rows are copied into
it. The forward saves the per-row thresholds, so the backward redoes no search. Cost from hidden states: 1
GEMM-equivalent forward, 3 backward (the plain path's 4 in all); from logits: one extra read and write of
each row. Rows whose label is ignore_index cost nothing.
"""

from __future__ import annotations

import torch

from rlkernels._dtypes import acc_dtype
from rlkernels.ops import linear_sweep, sampling


def _scatter(values: torch.Tensor | None, rows: torch.Tensor, n: int) -> torch.Tensor:
    """[M] values of the computed rows -> [n], 0 at the ignored rows ([0] when not asked for)."""
    if values is None:
        return rows.new_empty(0, dtype=torch.float32)
    return values.new_zeros(n).index_put_((rows,), values)


class LinearSampled(torch.autograd.Function):
    """(hidden [N, D], weight [V, D], bias [V] | None, labels [N] int64) -> (logp, entropy, sum_pi_squared),
    each [N] acc dtype ([0] when not asked for; sum_pi_squared without gradient)."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, s, options, flavor, want_entropy, want_sum_sq):
        rows = (labels != options.ignore_index).nonzero().squeeze(1)
        s = s.rows(rows)
        result = linear_sweep.sweep(
            hidden[rows], weight, bias, labels[rows], options, flavor, None, want_entropy=want_entropy,
            need=(False, False, False), want_sum_pi_squared=want_sum_sq, sampling=s,
        )  # fmt: skip
        ctx.save_for_backward(hidden, weight, bias, labels)
        ctx.state = (rows, s, result.threshold, options, flavor, want_entropy)
        n = labels.shape[0]
        outputs = tuple(_scatter(t, rows, n) for t in (result.logp, result.entropy, result.sum_pi_squared))
        ctx.mark_non_differentiable(outputs[2])
        return outputs

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy, _grad_sum_sq):
        hidden, weight, bias, labels = ctx.saved_tensors
        rows, s, tau, options, flavor, want_entropy = ctx.state
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        need = (need_h, need_w, bias is not None and need_b)
        acc = acc_dtype(hidden.dtype)
        g_logp = grad_logp[rows].to(acc)
        g_ent = grad_entropy[rows].to(acc) if want_entropy else None

        def token_grads(r0, r1, _logp, _entropy):
            return g_logp[r0:r1], None if g_ent is None else g_ent[r0:r1]

        result = linear_sweep.sweep(
            hidden[rows], weight, bias, labels[rows], options, flavor, token_grads,
            want_entropy=want_entropy, need=need, sampling=s, threshold=tau,
        )  # fmt: skip
        grad_hidden = None
        if need[0]:
            grad_hidden = hidden.new_zeros(hidden.shape, dtype=acc).index_put_((rows,), result.grad_hidden)
            grad_hidden = grad_hidden.to(hidden.dtype)
        grad_weight = None if result.grad_weight is None else result.grad_weight.to(weight.dtype)
        grad_bias = None if result.grad_bias is None else result.grad_bias.to(bias.dtype)
        return grad_hidden, grad_weight, grad_bias, None, None, None, None, None, None


class LogitsSampled(torch.autograd.Function):
    """(logits [N, V], labels [N] int64) -> (logp, entropy, sum_pi_squared), as LinearSampled."""

    @staticmethod
    def forward(ctx, logits, labels, s, options, flavor, want_entropy, want_sum_sq):
        rows = (labels != options.ignore_index).nonzero().squeeze(1)
        s = s.rows(rows)
        forward_op, _ = linear_sweep._logits_ops(flavor, logits.device)
        acc = acc_dtype(logits.dtype)
        m = rows.numel()
        logp = logits.new_empty(m, dtype=acc)
        entropy = logits.new_empty(m, dtype=acc) if want_entropy else None
        sum_sq = logits.new_empty(m, dtype=acc) if want_sum_sq else None
        lse = logits.new_empty(m, dtype=torch.float64)  # the kernels' LSE is float64 (docs/semantics.md)
        tau = logits.new_empty(m, dtype=acc) if s.truncates else None
        labels_m = labels[rows]
        for r0, r1, z in _blocks(logits, rows, acc):
            lp, ent, block_lse, sq, block_tau, _ = sampling.forward_block(
                z, labels_m[r0:r1], s.rows(slice(r0, r1)), options.softcap, forward_op, options.ignore_index,
                want_entropy, want_sum_sq,
            )  # fmt: skip
            logp[r0:r1], lse[r0:r1] = lp, block_lse
            for out, value in ((entropy, ent), (sum_sq, sq), (tau, block_tau)):
                if out is not None:
                    out[r0:r1] = value
        ctx.save_for_backward(logits, labels)
        ctx.state = (rows, s, tau, lse, entropy, options, flavor, want_entropy)
        n = labels.shape[0]
        outputs = tuple(_scatter(t, rows, n) for t in (logp, entropy, sum_sq))
        ctx.mark_non_differentiable(outputs[2])
        return outputs

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy, _grad_sum_sq):
        logits, labels = ctx.saved_tensors
        rows, s, tau, lse, entropy, options, flavor, want_entropy = ctx.state
        in_place = options.softcap is None  # chain_ reads the softcapped block after the kernel
        forward_op, backward_op = linear_sweep._logits_ops(flavor, logits.device, into_logits=in_place)
        acc = acc_dtype(logits.dtype)
        g_logp = grad_logp[rows].to(acc)
        g_ent = grad_entropy[rows].to(acc) if want_entropy else None
        labels_m = labels[rows]
        grad = torch.zeros_like(logits)
        for r0, r1, z in _blocks(logits, rows, acc):
            lab, block = labels_m[r0:r1], s.rows(slice(r0, r1))
            _, kept = sampling.prepare_block(
                z, lab, block, options.softcap, forward_op, options.ignore_index,
                None if tau is None else tau[r0:r1],
            )  # fmt: skip
            dz = sampling.backward_block(
                g_logp[r0:r1], None if g_ent is None else g_ent[r0:r1], z, lab, lse[r0:r1],
                entropy[r0:r1] if want_entropy else g_logp.new_empty(0), kept, block, options.softcap,
                backward_op, options.ignore_index,
            )  # fmt: skip
            grad.index_copy_(0, rows[r0:r1], dz.to(logits.dtype))
        return grad, None, None, None, None, None, None


def _blocks(logits: torch.Tensor, rows: torch.Tensor, acc: torch.dtype):
    """(r0, r1, z): the rows rows[r0:r1] of logits [N, V] copied into one reused [R, V] acc-dtype block."""
    m, vocab = rows.numel(), logits.shape[1]
    step = linear_sweep.rows_per_block(m, vocab, logits.device)
    buffer = logits.new_empty(min(step, m), vocab, dtype=acc)
    for r0 in range(0, m, step):
        r1 = min(m, r0 + step)
        z = buffer[: r1 - r0]
        if logits.dtype == acc:
            torch.index_select(logits, 0, rows[r0:r1], out=z)
        else:
            z.copy_(logits.index_select(0, rows[r0:r1]))
        yield r0, r1, z
