"""gae and discounted_returns: the reverse scans against the verl-style loop over positions (the eager
reference, what verl runs today). The floor is the bytes the op must move: rewards, values, mask read
once, advantages and returns written once. torch.compile of the loop unrolls one graph node per position
(~1 minute of compile at T=128 on this CPU), so it is timed only at T <= 128."""

from __future__ import annotations

import torch
from harness import Case, Floor, Provider, TrafficCase
from providers import compiled, eager, rlkernels

import rlkernels as rk
from rlkernels.reference import gae as reference

# (B, T): 256 x 8192 is the target (a batch of long responses).
SIZES = {"small": [(256, 128), (64, 1024), (256, 8192)], "llm": [(256, 8192), (1024, 8192)]}
# Longest T at which torch.compile of the loop is timed (compile time grows with the unrolled loop).
MAX_COMPILE_T = 128


def _inputs(b: int, t: int, dtype: torch.dtype, device: torch.device, packed: bool = False):
    def make():
        gen = torch.Generator(device="cpu").manual_seed(b * t)
        lengths = torch.randint(t // 2, t + 1, (b,), generator=gen)
        mask = torch.arange(t)[None, :] < lengths[:, None]
        mask &= torch.rand(b, t, generator=gen) > 0.05  # holes inside the responses (tool outputs)
        rewards = torch.randn(b, t, generator=gen) * 0.01
        values = torch.randn(b, t, generator=gen)
        out = {"rewards": rewards, "values": values, "mask": mask}
        if packed:  # the same tokens back to back, without the right padding
            keep = torch.arange(t)[None, :] < lengths[:, None]
            out = {k: x[keep] for k, x in out.items()}
            cu = torch.zeros(b + 1, dtype=torch.int32)
            cu[1:] = torch.cumsum(lengths, 0)
            out["cu_seqlens"] = cu
        return {k: x.to(device, dtype) if x.is_floating_point() else x.to(device) for k, x in out.items()}

    return make


def _gae_case(b, t, device, *, whiten=False, packed=False):
    dtype = torch.float32
    n = b * t

    def loop(rewards, values, mask, cu_seqlens=None):
        return reference.gae(rewards, values, mask, 0.99, 0.95, whiten, cu_seqlens)

    def kernel(rewards, values, mask, backend, cu_seqlens=None):
        return rk.gae(
            rewards, values, mask, gamma=0.99, lam=0.95, whiten=whiten, cu_seqlens=cu_seqlens, backend=backend
        )

    providers = [eager(loop)]
    if t <= MAX_COMPILE_T and not packed:
        providers.append(compiled(loop))
    else:
        providers.append(Provider("torch.compile", loop, f"compile would unroll the {t}-step loop"))
    providers += rlkernels(kernel, device)
    shape = f"B={b} T={t}" + (" whiten" if whiten else "") + (" packed" if packed else "")
    # ~n tokens (packed: fewer, the padding dropped) x (r, V, A, returns fp32 + mask bool).
    tokens = n if not packed else int(_inputs(b, t, dtype, torch.device("cpu"), True)()["rewards"].numel())
    return Case(
        op="gae",
        shape=shape,
        dtype=dtype,
        make_inputs=_inputs(b, t, dtype, device, packed),
        providers=providers,
        modes=("forward",),
        floors=[Floor("forward", "bytes", min_bytes=tokens * (4 * 4 + 1))],
    )


def _returns_case(b, t, device):
    dtype = torch.float32

    def loop(rewards, values, mask):
        return reference.discounted_returns(rewards, mask, 0.99)

    def kernel(rewards, values, mask, backend):
        return rk.discounted_returns(rewards, mask, gamma=0.99, backend=backend)

    providers = [eager(loop)]
    if t <= MAX_COMPILE_T:
        providers.append(compiled(loop))
    else:
        providers.append(Provider("torch.compile", loop, f"compile would unroll the {t}-step loop"))
    providers += rlkernels(kernel, device)
    return Case(
        op="discounted_returns",
        shape=f"B={b} T={t}",
        dtype=dtype,
        make_inputs=_inputs(b, t, dtype, device),
        providers=providers,
        modes=("forward",),
        floors=[Floor("forward", "bytes", min_bytes=b * t * (2 * 4 + 1))],
    )


def cases(shapes: str, device: torch.device) -> list[Case]:
    out = []
    for b, t in SIZES[shapes]:
        out.append(_gae_case(b, t, device))
        if t >= 1024:
            out.append(_gae_case(b, t, device, whiten=True))
            out.append(_gae_case(b, t, device, packed=True))
        out.append(_returns_case(b, t, device))
    return out


def traffic_cases() -> list[TrafficCase]:
    """The Triton scans' bytes against the minimum (under the interpreter, on CPU tensors). Two chunks
    per row (T > 1024), and a ragged packed layout."""
    from rlkernels.triton.gae import scan_forward

    b, t = 3, 1100
    x = _inputs(b, t, torch.float32, torch.device("cpu"))()
    r, v, m = x["rewards"], x["values"], x["mask"]
    p = _inputs(b, t, torch.float32, torch.device("cpu"), packed=True)()
    n = b * t
    np_ = p["rewards"].numel()
    gae_bytes, ret_bytes = n * (4 * 4 + 1), n * (2 * 4 + 1)
    return [
        TrafficCase(
            "gae",
            "scan",
            lambda: scan_forward("gae", r, v, m, None, 0.99, 0.95, False),
            gae_bytes,
            max_ratio=1.05,
        ),
        TrafficCase(
            "gae",
            "scan packed",
            lambda: scan_forward(
                "gae", p["rewards"], p["values"], p["mask"], p["cu_seqlens"], 0.99, 0.95, False
            ),
            np_ * (4 * 4 + 1),
            max_ratio=1.05,
        ),
        TrafficCase(
            "gae",
            "scan + whiten",
            lambda: scan_forward("gae", r, v, m, None, 0.99, 0.95, True),
            gae_bytes,
            note="whitening needs global moments: one more read + write of the advantages",
        ),
        TrafficCase(
            "discounted_returns",
            "scan",
            lambda: scan_forward("returns", r, None, m, None, 0.99, 0.0, False),
            ret_bytes,
            max_ratio=1.05,
        ),
    ]
