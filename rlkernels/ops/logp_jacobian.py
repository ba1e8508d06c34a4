"""d logp / d hidden with a frozen head in 2 GEMMs streamed over vocabulary chunks (docs/row_sweep.md).

    d logp_i / d hidden_i = (c'_iy W_y − Σ_v p_iv c'_iv W_v) / T     (c': the softcap's derivative, or 1)

The sum is an expectation under the row's softmax, so it accumulates over vocabulary chunks with the same
online rescaling as the log-sum-exp: per chunk of C columns, the [R, C] logits (GEMM 1), e = exp(y − m) with
the running row max m, and A += (e·c') @ W_chunk (GEMM 2), with A and Σe rescaled by exp(m_old − m_new)
when the max grows. No [R, V] block exists, so a block can hold many rows: the row sweep's 130-row blocks
(sized by its [R, V] buffer) re-read the head per block and run its GEMMs measurably below the rate of the
floor's whole-batch GEMMs; here blocks of ROWS rows run at that rate. The chunk stays in the cache
between its two GEMMs.

The C++ CPU backend's path (ops/linear_sweep.py picks it): on CUDA the row sweep's blocks are 512 rows
already and run the backend's fused kernels; this path has not been measured on a GPU. No entropy: its
gradient needs a second accumulator (E_p[(y − E y)·c'·W]), a third GEMM, and the row sweep does that in
two.
"""

from __future__ import annotations

import torch

from rlkernels.reference.logprobs import compute_dtype

# Rows per block: the per-row cost of both GEMMs is flat from about 1024 rows on CPU (the floor's own rate).
ROWS = 2048
# Bytes of the [R, C] chunk: small enough to stay in a server's last-level cache between GEMM 1 and 2.
CHUNK_BYTES = 16 << 20
# Narrowest chunk: narrower GEMMs fall below the rate of ROWS-row GEMMs.
MIN_COLUMNS = 256


def logp_jacobian(
    hidden: torch.Tensor,  # [M, D] the rows (ignored rows already dropped)
    weight: torch.Tensor,  # [V, D]
    bias: torch.Tensor | None,  # [V]
    labels: torch.Tensor,  # [M] int64 in [0, V)
    temperature: float,
    softcap: float | None,
    want_sum_pi_squared: bool,
    token_grads,  # (r0, r1, logp [R], None) -> (d loss / d logp [R], None); ones: the Jacobian itself
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """(logp [M], Σπ² [M] or None, d hidden [M, D]) in the accumulation dtype (fp32, fp64 for fp64), with
    d hidden = d loss / d logp (from token_grads, per block of rows) times d logp / d hidden."""
    acc = compute_dtype(weight.dtype)
    rows, vocab = hidden.shape[0], weight.shape[0]
    logp = hidden.new_empty(rows, dtype=acc)
    sum_sq = hidden.new_empty(rows, dtype=acc) if want_sum_pi_squared else None
    grad = hidden.new_empty(hidden.shape, dtype=acc)
    step = max(1, min(rows, ROWS))
    width = max(MIN_COLUMNS, min(vocab, CHUNK_BYTES // (acc.itemsize * step)))
    buffer = hidden.new_empty(step * width, dtype=acc)
    derivative = hidden.new_empty(step * width, dtype=acc) if softcap is not None else None
    with torch.no_grad():
        for r0 in range(0, rows, step):
            r1 = min(rows, r0 + step)
            h = hidden[r0:r1].to(acc)
            lab = labels[r0:r1]
            stats = _rows(h, weight, bias, lab, temperature, softcap, want_sum_pi_squared, width, buffer,
                          derivative, grad[r0:r1])  # fmt: skip
            logp[r0:r1] = stats[0]
            if want_sum_pi_squared:
                sum_sq[r0:r1] = stats[1]
            g_logp, _ = token_grads(r0, r1, stats[0], None)
            grad[r0:r1] *= g_logp[:, None]
    return logp, sum_sq, grad


def _rows(h, weight, bias, lab, temperature, softcap, want_sum_pi_squared, width, buffer, derivative, out):
    """One block of R rows over the whole vocabulary: (logp [R], Σπ² [R] or None), d logp / d h into out."""
    acc = h.dtype
    R, vocab = h.shape[0], weight.shape[0]
    run_max = h.new_full((R, 1), -torch.inf)
    sum_exp = h.new_zeros(R, 1)
    sum_sq = h.new_zeros(R, 1) if want_sum_pi_squared else None
    label_logit = h.new_zeros(R)
    label_slope = h.new_ones(R) if softcap is not None else None
    out.zero_()
    for v0 in range(0, vocab, width):
        v1 = min(vocab, v0 + width)
        w = weight[v0:v1].to(acc)  # [C, D]
        y = torch.mm(h, w.t(), out=buffer[: R * (v1 - v0)].view(R, v1 - v0))  # [R, C]
        if bias is not None:
            y += bias[v0:v1].to(acc)
        if softcap is not None:
            y.div_(softcap).tanh_()
            slope = torch.mul(y, y, out=derivative[: y.numel()].view_as(y)).neg_().add_(1)  # 1 − tanh²
            y.mul_(softcap)
        if temperature != 1.0:
            y.div_(temperature)
        inside = (lab >= v0) & (lab < v1)
        column = (lab - v0).clamp_(0, v1 - v0 - 1)[:, None]
        label_logit = torch.where(inside, y.gather(1, column).squeeze(1), label_logit)
        if softcap is not None:
            label_slope = torch.where(inside, slope.gather(1, column).squeeze(1), label_slope)
        new_max = torch.maximum(run_max, y.amax(1, keepdim=True))
        rescale = torch.exp(run_max - new_max)  # [R, 1]; 0 on the first chunk
        run_max = new_max
        e = y.sub_(new_max).exp_()
        sum_exp.mul_(rescale).add_(e.sum(1, keepdim=True))
        if sum_sq is not None:
            sum_sq.mul_(rescale.square()).add_(torch.linalg.vecdot(e, e)[:, None])
        if softcap is not None:
            e.mul_(slope)
        out.mul_(rescale).addmm_(e, w)
    # d logp / d h = (c'_y W_y − A / Σe) / T
    w_label = weight[lab].to(acc)
    if label_slope is not None:
        w_label *= label_slope[:, None]
    out.div_(sum_exp).neg_().add_(w_label)
    if temperature != 1.0:
        out.div_(temperature)
    logp = label_logit - (run_max + sum_exp.log()).squeeze(1)
    return logp, None if sum_sq is None else (sum_sq / sum_exp.square()).squeeze(1)
