"""Vocabulary parallelism for linear_logprobs: the LM head's rows split over the ranks of a process group,
each rank running the existing fused op on its shard, then a few [N]-sized collectives.

Rank r holds W_r [V_r, D] (rows offset_r .. offset_r + V_r of the global head, offsets by rank order in the
group) and the same hidden h [N, D] and global labels y [N] as every other rank. The local fused op gives
per row lse_r = LSE(z over r's columns) and H_r (entropy of the local softmax p^r); a row whose label is
not on rank r gets the valid dummy local label 0 (an ignored label would zero lse_r and H_r).

Forward (one all_gather of [3, N] per rank of (lse_r, H_r, local logp), [4, N] with Σπ²_r):
    lse = LSE_r(lse_r);  w_r = exp(lse_r − lse)  (rank r's share of the global probability mass)
    logp = logp_owner + (lse_owner − lse)        (logp_owner = z_y − lse_owner on the label's rank)
    H = Σ_r w_r (H_r − log w_r)                  (= lse − Σ_r w_r S_r with S_r = lse_r − H_r = E_{p^r}[z];
                                                  every term >= 0, so no cancellation)
    Σπ² = Σ_r w_r² Σπ²_r                         (p_v = w_r p^r_v; forward-only)
Backward, global d z_v for v on rank r (p_v = w_r p^r_v, S = Σ_r w_r S_r):
    d z_v = g_logp·1[v=y] − w_r p^r_v (g_logp + g_H (S_r − S)) − w_r g_H p^r_v (z_v − S_r)
The local backward op computes gl·(1[v=y'] − p^r_v) − ge·p^r_v (z_v − S_r) for its label y'; with
ge = w_r g_H and gl = w_r (g_logp + g_H (S_r − S)) only the one-hot column differs: a rank-1 correction
δ = [owner]·g_logp − gl at column y' (one column per row), taken through the softcap and temperature at
that column into d hidden (gather of W rows), d weight and d bias (index_add). d hidden is then summed
over the group (one all_reduce of [N, D]); d weight / d bias stay local to the shard.

Rows labelled ignore_index give logp 0, entropy 0 and exactly zero gradient, as unsharded. Every rank must
pass the same hidden, labels and options, and backpropagate the same upstream gradients (a loss computed
identically on every rank from the identical outputs).
"""

from __future__ import annotations

import itertools

import torch
import torch.distributed as dist

from rlkernels._dtypes import acc_dtype
from rlkernels.ops._device_values import device_values
from rlkernels.ops._library import op
from rlkernels.reference.logprobs import transform_logits


def shard_layout(op_name: str, process_group, hidden: torch.Tensor, weight: torch.Tensor):
    """(offset, global V, [V_local of each rank]) of this rank's shard, offsets by rank order in
    `process_group`: one all_gather of (V_local, D, N) from every rank, checked on every rank so that all
    of them raise the same error (none is left waiting in a later collective). hidden [N, D] (2-D),
    weight [V_local, D]."""
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError(f"{op_name}: process_group given but torch.distributed is not initialized")
    # The sizes are tiny: gathered as int64 (V and N may exceed int32).
    mine = torch.tensor([weight.shape[0], weight.shape[1], hidden.shape[0]], dtype=torch.int64)
    world = dist.get_world_size(process_group)
    # NCCL groups collect device tensors; gloo groups CPU ones.
    device = hidden.device if dist.get_backend(process_group) == "nccl" else torch.device("cpu")
    parts = [torch.empty(3, dtype=torch.int64, device=device) for _ in range(world)]
    dist.all_gather(parts, mine.to(device), group=process_group)
    table = torch.stack(parts).cpu().tolist()  # [world, (V_local, D, N)]
    sizes = [row[0] for row in table]
    if min(sizes) < 1:
        raise ValueError(
            f"{op_name}: every rank's weight shard must have at least one row, got V_local {sizes}"
        )
    if len({row[1] for row in table}) != 1:
        raise ValueError(
            f"{op_name}: weight shards must share D = weight.shape[1] across process_group, got "
            f"{[row[1] for row in table]}"
        )
    if len({row[2] for row in table}) != 1:
        raise ValueError(
            f"{op_name}: every rank must pass the same hidden rows, got N {[row[2] for row in table]}"
        )
    rank = dist.get_rank(process_group)
    return sum(sizes[:rank]), sum(sizes), sizes


# ---- the local (per-shard) statistics and gradients, per backend ----


def _reference_stats(hidden, weight, labels, bias, temperature, softcap, ignore_index):
    """Reference math on the shard: (logp, entropy, lse, Σπ²) [N] in the compute dtype (0 on ignored rows,
    like the kernels)."""
    z = transform_logits(
        torch.nn.functional.linear(hidden, weight, bias).to(acc_dtype(hidden.dtype)), temperature, softcap
    )
    lse = torch.logsumexp(z, dim=-1)
    log_q = z - lse.unsqueeze(-1)
    valid = labels != ignore_index
    safe = torch.where(valid, labels, torch.zeros_like(labels)).long()
    logp = log_q.gather(-1, safe.unsqueeze(-1)).squeeze(-1)
    entropy = -(log_q.exp() * log_q).sum(-1)
    sum_sq = (2 * log_q).exp().sum(-1)
    zero = torch.zeros((), dtype=logp.dtype, device=logp.device)
    return tuple(torch.where(valid, t, zero) for t in (logp, entropy, lse, sum_sq))


def _local_forward(backend, launch, hidden, weight, labels, bias, options):
    """(logp, entropy, lse, Σπ²) [N] of the shard (entropy / Σπ² empty or unspecified unless asked)."""
    temperature, softcap, ignore_index, chunk, return_entropy, return_sum_sq = options
    if backend == "reference":
        return _reference_stats(hidden, weight, labels, bias, temperature, softcap, ignore_index)
    return launch(
        hidden, weight, labels, bias, temperature, softcap, ignore_index, return_entropy, return_sum_sq, chunk
    )


def _local_backward(backend, flavor, gl, ge, saved, options, mask):
    """(d hidden, d weight, d bias) of Σ gl·logp_local + ge·entropy_local on the shard."""
    hidden, weight, labels, bias, lse, entropy = saved
    temperature, softcap, ignore_index, chunk, _, _ = options
    if backend == "reference":
        leaves = [t.detach().requires_grad_(need) if t is not None else None
                  for t, need in zip((hidden, weight, bias), mask, strict=True)]  # fmt: skip
        with torch.enable_grad():
            logp, ent, _, _ = _reference_stats(leaves[0], leaves[1], labels, leaves[2], temperature, softcap,
                                            ignore_index)  # fmt: skip
            wrt = [t for t in leaves if t is not None and t.requires_grad]
            loss = (gl * logp).sum() + ((ge * ent).sum() if ge is not None else 0.0)
            grads = iter(torch.autograd.grad(loss, wrt) if wrt else ())
        return tuple(next(grads) if t is not None and t.requires_grad else None for t in leaves)
    g_h, g_w, g_b = op(flavor + "_backward")(
        gl,
        ge,
        hidden,
        weight,
        labels,
        bias,
        lse,
        entropy,
        temperature,
        softcap,
        ignore_index,
        list(mask),
        chunk,
    )
    return tuple(g if need else None for g, need in zip((g_h, g_w, g_b), mask, strict=True))


# ---- the autograd function ----


class VocabParallelLinearLogprobs(torch.autograd.Function):
    """(logp, entropy, Σπ²) [N] in the compute dtype from hidden [N, D], the weight shard [V_local, D], its
    bias [V_local] or None and global labels [N]; see the module docstring for the math. Σπ² (zeros unless
    asked) gets no gradient."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, layout, options, backend, launch, flavor, group):
        offset, vocab, sizes = layout
        temperature, softcap, ignore_index, chunk, return_entropy, return_sum_sq = options
        v_local = weight.shape[0]
        valid = labels != ignore_index
        owner = valid & (labels >= offset) & (labels < offset + v_local)
        ignore = torch.full_like(labels, ignore_index)
        local_labels = torch.where(
            owner, labels - offset, torch.where(valid, torch.zeros_like(labels), ignore)
        )
        logp_r, ent_r, lse_r, sq_r = _local_forward(
            backend, launch, hidden, weight, local_labels, bias, options
        )
        acc = logp_r.dtype
        if not return_entropy:
            ent_r = torch.zeros_like(logp_r)
        # The merge runs in lse_r's dtype: float64 from the kernels (docs/semantics.md, "The saved LSE"), so
        # that w_r agrees with the lse_r the local backward reads; the outputs are cast back to acc.
        local = (lse_r, ent_r, logp_r, *((sq_r,) if return_sum_sq else ()))
        stats = torch.stack([t.to(lse_r.dtype) for t in local])
        parts = [torch.empty_like(stats) for _ in sizes]
        dist.all_gather(parts, stats.contiguous(), group=group)
        lse_all, ent_all, logp_all, *sq_all = torch.stack(parts).unbind(1)  # each [world, N]
        lse_max = lse_all.max(0).values
        lse = lse_max + (lse_all - lse_max).exp().sum(0).log()
        log_w = lse_all - lse  # [world, N]
        w = log_w.exp()
        entropy = (w * (ent_all - log_w)).sum(0)
        ends = device_values(list(itertools.accumulate(sizes)), torch.int64, labels.device)
        owner_rank = torch.searchsorted(ends, torch.where(valid, labels, 0).long(), right=True).clamp_max(
            len(sizes) - 1
        )
        pick = lambda t: t.gather(0, owner_rank.unsqueeze(0)).squeeze(0)
        logp = pick(logp_all) + pick(log_w)
        zero = torch.zeros((), dtype=logp.dtype, device=logp.device)
        logp = torch.where(valid, logp, zero)
        entropy = torch.where(valid, entropy, zero)
        sum_sq = (
            torch.where(valid, (w * w * sq_all[0]).sum(0), zero) if return_sum_sq else torch.zeros_like(lse)
        )
        rank = dist.get_rank(group)
        # S_r - S = (lse_r - H_r) - (lse - H) = log w_r - H_r + H
        shift = torch.where(valid, log_w[rank] - ent_r + entropy, zero).to(acc)
        logp, entropy, sum_sq = logp.to(acc), entropy.to(acc), sum_sq.to(acc)
        ctx.mark_non_differentiable(sum_sq)
        ctx.save_for_backward(
            hidden, weight, bias, local_labels, lse_r, ent_r, w[rank].to(acc), shift, owner, valid
        )
        ctx.args = (options, backend, flavor, group)
        return logp, entropy, sum_sq

    @staticmethod
    def backward(ctx, g_logp, g_ent, _g_sum_sq):
        hidden, weight, bias, local_labels, lse_r, ent_r, w, shift, owner, valid = ctx.saved_tensors
        options, backend, flavor, group = ctx.args
        temperature, softcap, ignore_index, _, return_entropy, _ = options
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        need_b = need_b and bias is not None
        acc = w.dtype
        zero = torch.zeros((), dtype=acc, device=w.device)
        g_logp = torch.where(valid, g_logp.to(acc), zero)
        g_ent = torch.where(valid, g_ent.to(acc), zero) if return_entropy else None
        if return_entropy:
            gl = (w * (g_logp + g_ent * shift)).contiguous()
            ge = (w * g_ent).contiguous()
        else:
            gl, ge = (w * g_logp).contiguous(), None
        saved = (hidden, weight, local_labels, bias, lse_r, ent_r)
        g_h, g_w, g_b = _local_backward(backend, flavor, gl, ge, saved, options, (need_h, need_w, need_b))
        # The one-hot column: the local op put gl there, the global gradient wants [owner]·g_logp.
        delta = torch.where(owner, g_logp, zero) - gl
        col = torch.where(valid, local_labels, torch.zeros_like(local_labels)).long()
        w_col = weight.index_select(0, col).to(acc)
        h = hidden.to(acc)
        a = (h * w_col).sum(-1)
        if bias is not None:
            a = a + bias.index_select(0, col).to(acc)
        d_a = delta / temperature
        if softcap is not None:
            d_a = d_a * (1 - torch.tanh(a / softcap) ** 2)
        if need_h:
            g_h = g_h.to(acc) + d_a.unsqueeze(-1) * w_col
            dist.all_reduce(g_h, group=group)
            g_h = g_h.to(hidden.dtype)
        if need_w:
            g_w = g_w.index_add(0, col, (d_a.unsqueeze(-1) * h).to(g_w.dtype))
        if need_b:
            g_b = g_b.index_add(0, col, d_a.to(g_b.dtype))
        return g_h, g_w, g_b, None, None, None, None, None, None, None


def vocab_parallel_linear_logprobs(
    hidden, weight, labels, bias, layout, options, backend, launch, flavor, group
):
    """hidden [N, D], weight [V_local, D], labels [N] global ids, bias [V_local] or None (hidden's dtype);
    layout from `shard_layout`, options (temperature, softcap, ignore_index, chunk_size, return_entropy,
    return_sum_pi_squared). Returns (logp, entropy, Σπ²) [N] fp32 (fp64 for fp64 inputs), the first two
    differentiable in hidden, weight and bias."""
    return VocabParallelLinearLogprobs.apply(
        hidden, weight, bias, labels, layout, options, backend, launch, flavor, group
    )
