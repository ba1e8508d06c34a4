"""Random policy-loss inputs for the tests: log-ratios that straddle the clip bounds but stay clear of every
kink (clip bounds, ratio cap, dual-clip constant, the ±20 clamp), so that a kernel computing in fp32 and the
float64 oracle take the same branches; plus the oracle comparison of one call."""

from __future__ import annotations

import math
from unittest import mock

import torch
from oracle import assert_oracle

import rlkernels.reference.policy_loss as policy_reference_module
from rlkernels.reference.aggregation import agg_loss
from rlkernels.reference.policy_loss import LOG_RATIO_BOUND
from rlkernels.reference.policy_loss import policy_loss as policy_reference

# Distance in log-ratio kept from every kink.
MARGIN = 2e-3


def kinks(kw: dict) -> list[float]:
    """Log-ratios where the loss or its gradient has a kink for these options."""
    clip_low = kw.get("clip_low", 0.2)
    clip_high = kw.get("clip_high") or clip_low
    out = [math.log(1 + clip_high), -LOG_RATIO_BOUND, LOG_RATIO_BOUND]
    if clip_low < 1:
        out.append(math.log(1 - clip_low))
    for key in ("ratio_cap", "dual_clip"):
        if kw.get(key) is not None:
            out.append(math.log(kw[key]))
    if kw.get("objective") == "geo_mean":  # it clips the log-ratio itself to [-clip_low, clip_high]
        out += [-clip_low, clip_high]
    return out


def _near(x: torch.Tensor, points: list[float]) -> torch.Tensor:
    near = torch.zeros_like(x, dtype=torch.bool)
    for p in points:
        near |= (x - p).abs() < MARGIN
    return near


def make_inputs(B, T, dtype, kw=None, *, per_token_adv=False, float_mask=False, isw=None, empty_row=True):
    """Dict of logp, old_logp, advantages, mask, ref_logp, entropy (and is_weights: "row" or "token"),
    rounded to `dtype`, whose (per-token or per-row) log-ratios keep MARGIN away from the kinks."""
    kw = kw or {}
    points = kinks(kw)
    sequence = kw.get("level") == "sequence"
    logp = -torch.rand(B, T, dtype=torch.float64) * 4 - 0.05
    if float_mask:
        mask = torch.rand(B, T, dtype=torch.float64) * 2
        mask[mask < 0.4] = 0
    else:
        mask = torch.rand(B, T) > 0.2
    if empty_row and B > 2:
        mask[1] = 0  # a fully masked sequence
    m = mask.to(torch.float64)

    def draw(shape):
        lr = torch.randn(shape, dtype=torch.float64) * 0.35
        big = torch.rand(shape) < 0.1  # past the clip range either way, up to the caps
        lr = torch.where(big, torch.randn(shape, dtype=torch.float64) * 1.5, lr)
        extreme = torch.rand(shape) < 0.03  # past the ±20 clamp
        return torch.where(extreme, torch.sign(lr) * 23.0, lr)

    old = logp - draw((B, T))
    for _ in range(200):
        logp_r, old_r = logp.to(dtype).double(), old.to(dtype).double()
        lr = logp_r - old_r
        if sequence:
            n = m.sum(-1)
            seq = (lr * m).sum(-1) / torch.where(n > 0, n, 1)
            bad_rows = _near(seq, points)
            if not bad_rows.any():
                break
            old[bad_rows] = logp[bad_rows] - draw((int(bad_rows.sum()), T))
        else:
            bad = _near(lr, points)
            if not bad.any():
                break
            old[bad] = logp[bad] - draw((int(bad.sum()),))
    else:
        raise AssertionError("could not draw log-ratios away from the kinks")
    if kw.get("objective") == "vespo":
        # vespo's weight φ(w) of the row's summed log-ratio vanishes unless the sum is O(1): small
        # log-ratios (its ±20 clamps are tested by hand), nothing else to keep clear of.
        old = logp - torch.randn(B, T, dtype=torch.float64) / math.sqrt(max(T, 1))
    adv = torch.randn((B, T) if per_token_adv else (B,), dtype=torch.float64)
    # A few exact zeros (no gradient, no clipping): three per-token ones, or the first row's advantage.
    adv.view(-1)[:: max(1, adv.numel() // 3 if per_token_adv else adv.numel())] = 0.0
    ref = logp + torch.randn(B, T, dtype=torch.float64) * 0.7
    ref.view(-1)[::7] += 25.0  # past k3's inner clamp
    out = dict(
        logp=logp.to(dtype),
        old_logp=old.to(dtype),
        advantages=adv.to(dtype),
        mask=mask,
        ref_logp=ref.to(dtype),
        entropy=(torch.rand(B, T, dtype=torch.float64) * 3).to(dtype),
    )
    if isw is not None:
        out["is_weights"] = (torch.rand((B, T) if isw == "token" else (B,), dtype=torch.float64) + 0.5).to(
            dtype
        )
    return out


def run(fn, inputs: dict, kw: dict, upstream: float):
    """(loss, stats, [d logp, d entropy]) of fn for an upstream gradient `upstream` of the loss."""
    x = {k: t.detach().clone() for k, t in inputs.items()}
    wrt = [x["logp"].requires_grad_()]
    if "entropy" in x:
        wrt.append(x["entropy"].requires_grad_())
    loss, stats = fn(**x, **kw)
    grads = torch.autograd.grad(loss * upstream, wrt, allow_unused=True)
    return loss, stats, [torch.zeros_like(w) if g is None else g for g, w in zip(grads, wrt, strict=True)]


def loss_magnitude(inputs64: dict, kw: dict) -> float:
    """Σ|term| as the loss aggregates it (float64): the size a rounding error of the loss scales with. The
    loss itself may be near 0 where positive and negative per-token terms cancel (seen: a policy part of
    -6.6 and a KL part of +7.3 summing to -0.004)."""

    def aggregate_sizes(loss_mat, mask, agg, **options):
        return agg_loss(loss_mat.abs(), mask, agg, **options)

    with torch.no_grad(), mock.patch.object(policy_reference_module, "agg_loss", aggregate_sizes):
        return abs(float(reference_fn(**inputs64, **kw)[0]))


def reference_fn(logp, old_logp, advantages, mask, **kw):
    return policy_reference(logp, old_logp, advantages, mask, **kw)


def check_against_oracle(name, kernel_fn, inputs: dict, kw: dict, upstream: float = 1.7):
    """Kernel vs float64 oracle (and the reference at the inputs' dtype) for loss, stats and gradients."""
    out = run(kernel_fn, inputs, kw, upstream)
    same = run(reference_fn, inputs, kw, upstream)
    inputs64 = {k: (t.double() if t.is_floating_point() else t) for k, t in inputs.items()}
    oracle = run(reference_fn, inputs64, kw, upstream)
    loss, stats, grads = out
    assert loss.dim() == 0 and torch.isfinite(loss)
    assert set(stats) == set(oracle[1]), (sorted(stats), sorted(oracle[1]))
    assert_oracle(f"{name}/loss", loss, same[0], oracle[0], magnitude=loss_magnitude(inputs64, kw))
    for key in stats:
        assert stats[key].dim() == 0
        assert_oracle(f"{name}/stats[{key}]", stats[key], same[1][key], oracle[1][key])
    for label, g, s, r in zip(("d logp", "d entropy"), grads, same[2], oracle[2], strict=False):
        assert g.dtype == inputs["logp"].dtype
        assert_oracle(f"{name}/{label}", g, s, r)
