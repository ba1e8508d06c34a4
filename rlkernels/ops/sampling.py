"""Log-probs under the rollout's sampling distribution, on blocks of whole logit rows (docs/sampling.md).

A per-row temperature, top_k, top_p or min_p (reference/sampling.py: vLLM 0.33.0's rules) is applied to a
block of R whole rows of fp32 logits [R, V] that the caller owns (the row sweep's block, or rows copied from
the caller's logits): the transform in place, then a threshold search per row that needs no sort of the
row and no more than [R, TOP_P_CANDIDATES·8^i] candidates, then the dropped tokens are set far below the
row's max. The backend's fused `logprobs_from_logits` kernels then run on the block with temperature 1 and
no softcap, and `chain_` turns their softmax gradient into the gradient of the raw logits. Nothing of size
[N, V] is made.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from rlkernels import _validate as v

# Dropped tokens are set this far below the smallest row max of the block: exp underflows to exactly 0 in
# fp32 and fp64, so the fused kernels give them p = 0 and p·z = 0 (-inf would make p·z NaN).
DROPPED_GAP = 1.0e4
# top_p's first candidates per row (torch.topk, not a sort of V): a sampling distribution's top_p mass
# usually lies in its few hundred most likely tokens; rows whose candidates hold less than top_p retry
# with 8x as many, up to the whole row.
TOP_P_CANDIDATES = 256


class Sampling(NamedTuple):
    """The rollout's sampling distribution, per row of the flattened batch [M] (rows of ignored labels
    already dropped). A row with top_k <= 0 or >= V, top_p = 1 or min_p = 0 is not truncated by it."""

    temperature: torch.Tensor | float  # [M] acc dtype, or one float for every row
    top_k: torch.Tensor | None  # [M] int64
    top_p: torch.Tensor | None  # [M] acc dtype
    min_p: torch.Tensor | None  # [M] acc dtype

    @property
    def truncates(self) -> bool:
        return self.top_k is not None or self.top_p is not None or self.min_p is not None

    def rows(self, index: slice | torch.Tensor) -> Sampling:
        """The same distribution for the rows `index` (a slice or an index tensor) of the batch."""
        return Sampling(*(t[index] if isinstance(t, torch.Tensor) else t for t in self))


def transform_(x: torch.Tensor, s: Sampling, softcap: float | None) -> torch.Tensor:
    """x [R, V] raw logits -> z = softcap(x) / temperature, in place."""
    if softcap is not None:
        x.div_(softcap).tanh_().mul_(softcap)
    t = s.temperature
    if isinstance(t, torch.Tensor):
        x.div_(t[:, None])
    elif t != 1.0:
        x.div_(t)
    return x


def chain_(dz: torch.Tensor, z: torch.Tensor, s: Sampling, softcap: float | None) -> torch.Tensor:
    """dz [R, V] d/dz -> d/dx in place, for z = softcap(x) / t: dz / t, times 1 - (z t / c)^2 with a
    softcap. z is the block as `transform_` left it (dropped tokens have dz = 0); it is overwritten."""
    t = s.temperature
    if isinstance(t, torch.Tensor):
        t = t[:, None]
    if softcap is not None:
        dz.mul_(z.mul_(t / softcap).square_().neg_().add_(1))
    return dz.div_(t) if isinstance(t, torch.Tensor) or t != 1.0 else dz


def threshold(z: torch.Tensor, s: Sampling, labels: torch.Tensor, lse_of) -> torch.Tensor:
    """[R] per-row tau such that the sampler keeps {v : z_v >= tau} (-inf: the whole row). z [R, V] is the
    transformed block, returned with the tokens below tau dropped (`drop_`). lse_of(z, labels) -> [R] is
    the fused kernel's log-sum-exp of the block (the top_p mass is renormalized over the kept tokens)."""
    rows, vocab = z.shape
    tau = z.new_full((rows,), -torch.inf)
    zmax = z.amax(1)
    if s.min_p is not None:  # p_v >= min_p · p_max  <=>  z_v >= z_max + log(min_p)
        tau = torch.maximum(tau, zmax + torch.log(s.min_p))
    if s.top_k is not None:
        active = (s.top_k > 0) & (s.top_k < vocab)
        if bool(active.any()):
            kmax = int(s.top_k[active].max())
            kth = z.topk(kmax, dim=1).values.gather(1, (s.top_k.clamp(1, kmax) - 1)[:, None]).squeeze(1)
            tau = torch.where(active, torch.maximum(tau, kth), tau)
    drop_(z, tau, zmax)
    if s.top_p is not None:
        active = s.top_p < 1
        if bool(active.any()):
            tau_p = _top_p_threshold(z, s.top_p, lse_of(z, labels))
            tau = torch.maximum(tau, torch.where(active, tau_p, tau))
            drop_(z, tau, zmax)
    return tau


def _top_p_threshold(z: torch.Tensor, top_p: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """[R] the smallest kept value: the last token, in descending order, whose mass before it is < top_p
    (ties after it share its value, so `z >= tau` keeps the whole tied group)."""
    vocab = z.shape[1]
    width = min(vocab, TOP_P_CANDIDATES)
    lse = lse.to(z.dtype)  # the kernels' LSE is float64; the threshold lives among the logits
    tau = torch.empty_like(lse)
    pending = torch.ones_like(top_p, dtype=torch.bool)
    while True:
        values = z.topk(width, dim=1).values  # [R, width] descending
        q = torch.exp(values - lse[:, None])
        before = q.cumsum(1) - q
        last = (before < top_p[:, None]).sum(1) - 1  # >= 0: nothing is before the first
        found = pending & ((before[:, -1] + q[:, -1] >= top_p) | (width == vocab))
        tau = torch.where(found, values.gather(1, last[:, None]).squeeze(1), tau)
        pending &= ~found
        if width == vocab or not bool(pending.any()):
            return tau
        width = min(vocab, width * 8)


def drop_(z: torch.Tensor, tau: torch.Tensor, zmax: torch.Tensor) -> None:
    """z [R, V] with the tokens below tau [R] set DROPPED_GAP below the block's smallest row max zmax [R]."""
    floor = zmax.min() - DROPPED_GAP
    z.masked_fill_(z < tau[:, None], floor)


def prepare_block(z, labels, s: Sampling, softcap, forward_op, ignore_index, tau=None):
    """A block z [R, V] of raw fp32/fp64 logits made the sampler's: transformed in place, the tokens outside
    the kept sets set low. labels [R] int64. tau [R]: the thresholds an earlier pass over the same rows
    found (a recomputing backward), else searched. Returns (tau, kept [R] bool: the label is kept), both
    None without truncation."""
    transform_(z, s, softcap)
    if not s.truncates:
        return None, None
    label_z = z.gather(1, labels[:, None]).squeeze(1)  # before the drop, which may lift dropped values
    if tau is None:

        def lse_of(block, lab):
            return forward_op(block, lab, 1.0, None, ignore_index, False, False)[2]

        tau = threshold(z, s, labels, lse_of)
    else:
        drop_(z, tau, z.amax(1))
    return tau, label_z >= tau


def forward_block(z, labels, s: Sampling, softcap, forward_op, ignore_index, want_entropy, want_sum_sq,
                  tau=None):  # fmt: skip
    """`prepare_block`, then the fused forward with temperature 1 and no softcap. Returns (logp, entropy,
    lse, sum_pi_squared, tau, kept); logp is -inf where the label is not kept."""
    tau, kept = prepare_block(z, labels, s, softcap, forward_op, ignore_index, tau)
    logp, entropy, lse, sum_sq = forward_op(z, labels, 1.0, None, ignore_index, want_entropy, want_sum_sq)
    if kept is not None:
        logp = torch.where(kept, logp, -torch.inf)
    return logp, entropy, lse, sum_sq, tau, kept


def backward_block(g_logp, g_entropy, z, labels, lse, entropy, kept, s: Sampling, softcap, backward_op,
                   ignore_index):  # fmt: skip
    """d loss / d raw logits [R, V] of a block that `forward_block` left in z. A label outside the kept set
    gets no gradient through logp (its logp is the constant -inf). backward_op may write over z only
    without a softcap (chain_ reads z then)."""
    if kept is not None:
        g_logp = torch.where(kept, g_logp, 0)
    dz = backward_op(g_logp, g_entropy, z, labels, lse, entropy, 1.0, None, ignore_index)
    return chain_(dz, z, s, softcap)


def check_sampling(op: str, temperature, top_k, top_p, min_p, labels, acc) -> Sampling | None:
    """The public options as a Sampling over the flattened rows (None when the temperature is one float and
    nothing truncates: the plain fused path). Tensors must have the labels' shape [...] and device; a float
    temperature stays a float."""
    lead_shape, device = labels.shape, labels.device

    def per_row(x, name, dtype, rule, ok):
        (v.check_index if dtype == torch.int64 else v.check_float)(op, x, name)
        v.check_shape(op, x, name, lead_shape, "labels.shape")
        v.check_same_device(op, labels=labels, **{name: x})
        x = x.reshape(-1).to(dtype)
        bad = ~ok(x)
        if v.checks_eagerly(x):
            if bool(bad.any()):
                raise ValueError(f"{op}: {name} must be {rule}, found {x[bad][0].item()}")
        else:
            v.assert_async(~bad.any(), f"{op}: {name} must be {rule}")
        return x

    def option(x, name, dtype, rule, ok, scalar_ok):
        if x is None or isinstance(x, torch.Tensor):
            return None if x is None else per_row(x, name, dtype, rule, ok)
        if dtype == torch.int64:
            if isinstance(x, bool) or not isinstance(x, int):
                raise TypeError(f"{op}: {name} must be an int or a tensor, got {type(x).__name__}")
        else:
            x = v.check_number(op, x, name)
        if not scalar_ok(x):
            raise ValueError(f"{op}: {name} must be {rule}, got {x}")
        return torch.full((int(torch.Size(lead_shape).numel()),), x, dtype=dtype, device=device)

    top_k = option(top_k, "top_k", torch.int64, ">= 1 (a tensor's rows: <= 0 for none)", lambda x: x == x,
                   lambda x: x >= 1)  # fmt: skip
    top_p = option(top_p, "top_p", acc, "in (0, 1]", lambda x: (x > 0) & (x <= 1), lambda x: 0 < x <= 1)
    min_p = option(min_p, "min_p", acc, "in [0, 1]", lambda x: (x >= 0) & (x <= 1), lambda x: 0 <= x <= 1)
    if isinstance(temperature, torch.Tensor):
        temperature = per_row(
            temperature, "temperature", acc, "finite and > 0", lambda x: (x > 0) & torch.isfinite(x)
        )
    else:
        temperature = float(v.check_number(op, temperature, "temperature", gt=0))
        if top_k is None and top_p is None and min_p is None:
            return None
    return Sampling(temperature, top_k, top_p, min_p)
