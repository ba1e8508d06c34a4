"""gae and discounted_returns: custom ops (native C++/CUDA and Triton), their fake registrations, input
validation and the public functions. Advantages and returns are constants for the losses: no autograd
formula."""

from __future__ import annotations

import torch

from rlkernels import _validate as v
from rlkernels._backend import select_backend
from rlkernels.ops._flags import check_flag
from rlkernels.ops._library import register_constant_backends
from rlkernels.ops._token_masks import kernel_mask
from rlkernels.reference import gae as reference


@torch.library.custom_op("rlkernels::gae_triton", mutates_args=())
def _gae_triton(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    cu_seqlens: torch.Tensor | None,
    gamma: float,
    lam: float,
    whiten: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    from rlkernels.triton.gae import scan_forward

    return scan_forward("gae", rewards, values, mask, cu_seqlens, gamma, lam, whiten)


@torch.library.custom_op("rlkernels::discounted_returns_triton", mutates_args=())
def _discounted_returns_triton(
    rewards: torch.Tensor,
    mask: torch.Tensor,
    cu_seqlens: torch.Tensor | None,
    gamma: float,
    baseline: torch.Tensor | None = None,
    whiten: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    from rlkernels.triton.gae import scan_forward

    return scan_forward("returns", rewards, None, mask, cu_seqlens, gamma, 0.0, whiten, baseline)


def _fake_gae(rewards, values, mask, cu_seqlens, gamma, lam, whiten):
    return (
        rewards.new_empty(rewards.shape),
        rewards.new_empty(rewards.shape),
        rewards.new_empty((), dtype=torch.bool),
    )


def _fake_returns(rewards, mask, cu_seqlens, gamma, baseline=None, whiten=False):
    second = rewards.shape if whiten or baseline is not None else (0,)
    return (
        rewards.new_empty(rewards.shape),
        rewards.new_empty(second),
        rewards.new_empty((), dtype=torch.bool),
    )


# backend -> launcher of its flavor
_GAE = register_constant_backends("gae", fake=_fake_gae)
_RETURNS = register_constant_backends("discounted_returns", fake=_fake_returns)


def check_cu_seqlens(opname: str, cu_seqlens, total: int) -> torch.Tensor:
    """cu_seqlens [S + 1] int32/int64: starts at 0, non-decreasing (empty sequences allowed), ends at the
    number of packed tokens `total`. The values are checked eagerly on CPU (ValueError) and with
    torch._assert_async on GPU and under torch.compile (no host sync)."""
    v.check_index(opname, cu_seqlens, "cu_seqlens")
    v.check_ndim(opname, cu_seqlens, "cu_seqlens", (1,))
    if cu_seqlens.numel() < 1:
        raise ValueError(f"{opname}: cu_seqlens must have at least one entry (0), got shape (0,)")
    first, last = cu_seqlens[0], cu_seqlens[-1]
    steps = cu_seqlens[1:] - cu_seqlens[:-1]
    if cu_seqlens.device.type == "cpu" and not torch.compiler.is_compiling():
        if int(first) != 0:
            raise ValueError(f"{opname}: cu_seqlens must start at 0, got {int(first)}")
        if steps.numel() and bool((steps < 0).any()):
            i = int(torch.nonzero(steps < 0)[0, 0]) + 1
            raise ValueError(
                f"{opname}: cu_seqlens must be non-decreasing, got {int(cu_seqlens[i - 1])} then "
                f"{int(cu_seqlens[i])} at index {i}"
            )
        if int(last) != total:
            raise ValueError(
                f"{opname}: cu_seqlens must end at the number of packed tokens {total}, got {int(last)}"
            )
    else:
        ok = (first == 0) & (last == total)
        if steps.numel():
            ok &= (steps >= 0).all()
        v.assert_async(ok, f"{opname}: cu_seqlens must start at 0, be non-decreasing and end at {total}")
    return cu_seqlens


# What a failed torch._assert_async of the scans' value flag means (the device cannot say which value; on a
# GPU the kernels assert themselves, with their own message).
def _bad_values(opname: str) -> str:
    # At most ASYNC_MESSAGE_BYTES (rlkernels/_validate.py), which a CUDA tensor's assert takes.
    return (
        f"{opname}: an input value is invalid: NaN/inf rewards, values or reward_baselines, mask weights "
        "negative or not finite, an integer mask not 0/1, or cu_seqlens not 0, ..., N non-decreasing (CPU "
        "tensors: a ValueError names it)"
    )


def _check_inputs(opname, rewards, values, mask, cu_seqlens):
    """Shapes, dtypes and devices, and cu_seqlens' values on CPU tensors; returns (device, compute dtype).
    The other values (rewards and values finite everywhere, masked positions included: the reference scan,
    verl's formula, multiplies by the mask, so a NaN there still reaches the sequence's advantages; the
    mask's values) are checked by the kernels that read them (`_value_checks` on the reference backend)."""
    v.check_float(opname, rewards, "rewards")
    dtype = rewards.dtype
    if values is not None:
        v.check_float(opname, values, "values")
        v.check_shape(opname, values, "values", rewards.shape, "rewards")
        dtype = torch.promote_types(dtype, values.dtype)
    v.check_mask(opname, mask, "mask", rewards.shape, "rewards")
    device = v.check_same_device(opname, rewards=rewards, values=values, mask=mask, cu_seqlens=cu_seqlens)
    if cu_seqlens is None:
        v.check_ndim(opname, rewards, "rewards", (2,))
    else:
        v.check_ndim(opname, rewards, "rewards (packed, with cu_seqlens)", (1,))
        v.check_index(opname, cu_seqlens, "cu_seqlens")
        v.check_ndim(opname, cu_seqlens, "cu_seqlens", (1,))
        if cu_seqlens.numel() < 1:
            raise ValueError(f"{opname}: cu_seqlens must have at least one entry (0), got shape (0,)")
        if v.checks_eagerly(cu_seqlens):  # the kernels index with it: checked before them on CPU
            check_cu_seqlens(opname, cu_seqlens, rewards.shape[0])
    return device, dtype


def _value_checks(opname, rewards, values, mask, cu_seqlens, **per_row):
    """The eager value checks (ValueError on CPU tensors, torch._assert_async elsewhere) of what the
    kernels check; returns the mask as the reference reads it (bool or float)."""
    v.check_finite(opname, rewards, "rewards")
    v.check_finite(opname, values, "values")
    for name, t in per_row.items():
        v.check_finite(opname, t, name)
    if cu_seqlens is not None and not v.checks_eagerly(cu_seqlens):
        check_cu_seqlens(opname, cu_seqlens, rewards.shape[0])
    return v.mask_values(opname, mask)


def _constant(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x in `dtype`, outside autograd (the outputs are constants); no copy or view when already so."""
    x = x.detach() if x.requires_grad else x
    return x if x.dtype == dtype else x.to(dtype)


@v.keyword_options
def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    *,
    gamma: float = 1.0,
    lam: float = 1.0,
    whiten: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimation (verl `compute_gae_advantage_return`) by a reverse scan.

    Right to left per sequence: delta_t = r_t + gamma * nextV - V_t, A_t = delta_t + gamma * lam * A_{t+1};
    positions with mask 0 carry nextV and A through unchanged (verl), so holes inside a sequence
    (e.g. tool-output tokens) are skipped; returns = A + V (before whitening).

    Args:
        rewards: [B, T] token-level rewards, float32/float64/float16/bfloat16; or packed [N] (sequences
            back to back, no padding) with `cu_seqlens`.
        values: critic values, same shape. rewards and values must be finite at every position (NaN or
            inf raises: ValueError for CPU tensors, a device-side assert for GPU tensors).
        mask: response mask, same shape: bool, integer 0/1 (a Hugging Face attention_mask), or float
            weights >= 0 (a float mask blends as in verl's formula).
        gamma, lam: discount and GAE lambda, in [0, 1].
        whiten: apply verl masked_whiten to the advantages (batch-wide masked mean, unbiased masked
            variance, (A - mean) * rsqrt(var + 1e-8) at every position; with <= 1 valid token var = 0).
        cu_seqlens: [S + 1] int32/int64 offsets of the packed sequences (0, ..., N), non-decreasing.
        backend: "auto" | "triton" | "cuda" | "cpu" | "reference".

    Returns:
        (advantages, returns), each of the input shape, in the promoted dtype of rewards and values,
        computed in fp32 (fp64 for fp64). Not differentiable (constants for the losses).
    """
    opname = "gae"
    device, dtype = _check_inputs(opname, rewards, values, mask, cu_seqlens)
    gamma = float(v.check_number(opname, gamma, "gamma", ge=0, le=1))
    lam = float(v.check_number(opname, lam, "lam", ge=0, le=1))
    if not isinstance(whiten, bool):
        raise TypeError(f"{opname}: whiten must be a bool, got {type(whiten).__name__}")
    backend = select_backend(opname, backend, device, implemented=tuple(_GAE))
    r, val = _constant(rewards, dtype), _constant(values, dtype)
    if backend == "reference":
        mask = _value_checks(opname, rewards, values, mask, cu_seqlens)
        return reference.gae(r, val, mask, gamma, lam, whiten, cu_seqlens)
    m = kernel_mask(opname, mask, dtype, backend)
    adv, ret, ok = _GAE[backend](r, val, m, cu_seqlens, gamma, lam, whiten)
    check_flag(
        opname, ok, _bad_values(opname),
        lambda: _value_checks(opname, rewards, values, mask, cu_seqlens), backend=backend,
    )  # fmt: skip
    return adv, ret


@v.keyword_options
def discounted_returns(
    rewards: torch.Tensor,
    mask: torch.Tensor,
    *,
    gamma: float = 1.0,
    cu_seqlens: torch.Tensor | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """Discounted returns of REINFORCE / REINFORCE++ (verl 0.9.1
    `compute_reinforce_plus_plus_outcome_advantage`) by a reverse scan: right to left from C = 0,
    G = r_t + gamma * C, returns_t = G * mask_t, then C = G * mask_t + (1 - mask_t) * C (a masked position,
    e.g. an observation token, returns 0 and carries the running return through unchanged).

    Args:
        rewards: [B, T] token-level rewards, float32/float64/float16/bfloat16, finite; or packed [N] with
            cu_seqlens.
        mask: same shape: bool, integer 0/1, or float weights >= 0.
        gamma: discount in [0, 1].
        cu_seqlens: [S + 1] int32/int64 offsets of the packed sequences (0, ..., N), non-decreasing.
        backend: "auto" | "triton" | "cuda" | "cpu" | "reference".

    Returns:
        returns of the input shape in rewards' dtype, computed in fp32 (fp64 for fp64). Not differentiable.
    """
    opname = "discounted_returns"
    return _returns(opname, rewards, mask, gamma, cu_seqlens, backend)[0]


def _returns(
    opname, rewards, mask, gamma, cu_seqlens, backend, *, baseline=None, whiten=False, checked=False
):
    """(returns, advantages) of the returns scan: advantages = masked_whiten(returns, mask) * mask with
    `whiten` (REINFORCE++), returns - baseline[:, None] * mask with `baseline` [B] (ReMax), else None. One
    kernel launch (+1 to whiten), which asserts on a bad value on a GPU. `checked`:
    the caller validated the shapes (rlkernels/ops/advantage_estimators.py, whose op name `opname` is then in
    the messages; the backend is discounted_returns')."""
    if not checked:
        device, dtype = _check_inputs(opname, rewards, None, mask, cu_seqlens)
        gamma = float(v.check_number(opname, gamma, "gamma", ge=0, le=1))
    else:
        device, dtype = rewards.device, rewards.dtype
    backend = select_backend("discounted_returns", backend, device, implemented=tuple(_RETURNS))
    r = _constant(rewards, dtype)
    b = None if baseline is None else _constant(baseline, dtype)
    per_row = {} if baseline is None else {"reward_baselines": baseline}
    if backend == "reference":
        m = _value_checks(opname, rewards, None, mask, cu_seqlens, **per_row)
        returns = reference.discounted_returns(r, m, gamma, cu_seqlens)
        adv = None
        if whiten:
            mf = m.to(returns.dtype)
            adv = reference.masked_whiten(returns, mf) * mf
        elif b is not None:
            adv = returns - b.unsqueeze(-1) * m.to(returns.dtype)
        return returns, adv
    m = kernel_mask(opname, mask, dtype, backend)
    returns, adv, ok = _RETURNS[backend](r, m, cu_seqlens, gamma, b, whiten)
    check_flag(
        opname, ok, _bad_values(opname),
        lambda: _value_checks(opname, rewards, None, mask, cu_seqlens, **per_row), backend=backend,
    )  # fmt: skip
    return returns, (adv if whiten or b is not None else None)
