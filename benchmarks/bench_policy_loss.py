"""policy_loss (with KL and entropy terms), value_loss and agg_loss (verl's entropy / KL aggregation):
elementwise work with per-row reductions, so the floor is the bytes they must move. The eager provider is
the reference (verl's formulation); the "rlkernels[cpu] recompute" provider is the other backward design
(recompute the tokens instead of scaling the per-token gradients saved by the forward pass), measured side
by side to choose between them."""

from __future__ import annotations

import functools

import torch
from harness import Case, Floor, Provider, TrafficCase
from providers import device_backends, standard

import rlkernels as rk
from rlkernels.ops import policy_loss as policy_module
from rlkernels.reference.aggregation import agg_loss as agg_reference
from rlkernels.reference.policy_loss import policy_loss as policy_reference
from rlkernels.reference.value_loss import value_loss as value_reference

# (B, T): sequences x tokens. 64 x 4096 (262k tokens) is the CPU target shape.
SHAPES = {"small": [(16, 1024), (64, 4096)], "llm": [(64, 4096), (512, 8192)]}
# A GRPO-style setup with every per-token term on: asymmetric clip (DAPO), dual clip, k3 KL, entropy bonus.
POLICY_KW = dict(clip_low=0.2, clip_high=0.28, dual_clip=3.0, kl_coef=0.05, kl_kind="k3", entropy_coef=0.01)


# verl's layout of the loss's inputs: logp, entropy and ref_logp sliced out of the padded sequence's
# ([:, -T - 1:-1] of [B, T + VERL_PAD]), the mask an int64 attention mask's [:, -T:]; the kernels read such
# rows in place.
VERL_PAD = 64  # a prompt's worth of columns before the response: the rows' stride is T + 64


def _verl_views(x: dict, device: torch.device) -> dict:
    """x's log-probs and entropy as row-strided views of padded tensors (VERL_PAD), its mask as an int64
    attention mask's; views of tensors that need no gradient, so logp and entropy become leaves (the slices'
    own backward is the model's, not the loss's)."""
    out = dict(x)
    for key in ("logp", "ref_logp", "entropy"):
        B, T = x[key].shape
        wide = torch.zeros(B, T + VERL_PAD, dtype=x[key].dtype, device=device)
        wide[:, VERL_PAD - 1 : -1] = x[key]
        out[key] = wide[:, VERL_PAD - 1 : -1]
    attention = torch.zeros(B, T + VERL_PAD, dtype=torch.int64, device=device)
    attention[:, VERL_PAD:] = x["mask"]
    out["mask"] = attention[:, VERL_PAD:]
    return out


def _policy_inputs(B: int, T: int, dtype: torch.dtype, device: torch.device, views: bool = False):
    def make():
        gen = torch.Generator(device="cpu").manual_seed(B * T)
        logp = -torch.rand(B, T, generator=gen) * 4
        lengths = torch.randint(T // 4, T + 1, (B,), generator=gen)
        x = dict(
            logp=logp,
            old_logp=logp + 0.3 * torch.randn(B, T, generator=gen),
            advantages=torch.randn(B, generator=gen),
            mask=torch.arange(T)[None, :] < lengths[:, None],
            ref_logp=logp + 0.3 * torch.randn(B, T, generator=gen),
            entropy=torch.rand(B, T, generator=gen) * 3,
        )
        x = {k: (t.to(device, dtype) if t.is_floating_point() else t.to(device)) for k, t in x.items()}
        if views:
            x = _verl_views(x, device)
        x["logp"].requires_grad_()
        x["entropy"].requires_grad_()
        return x

    return make


def _policy_reference(**x):
    return policy_reference(**x, **POLICY_KW)


def _policy_kernel(backend, **x):
    return rk.policy_loss(**x, **POLICY_KW, backend=backend)


def _policy_recompute(**x):
    saved = policy_module.SAVE_GRAD_IN_FORWARD
    policy_module.SAVE_GRAD_IN_FORWARD = False
    try:
        return rk.policy_loss(**x, **POLICY_KW, backend="cpu")
    finally:
        policy_module.SAVE_GRAD_IN_FORWARD = saved


def _value_inputs(B: int, T: int, dtype: torch.dtype, device: torch.device):
    def make():
        gen = torch.Generator(device="cpu").manual_seed(B * T + 1)
        old = torch.randn(B, T, generator=gen)
        x = dict(
            values=old + 0.3 * torch.randn(B, T, generator=gen),
            old_values=old,
            returns=old + torch.randn(B, T, generator=gen),
            mask=torch.rand(B, T, generator=gen) > 0.1,
        )
        x = {k: (t.to(device, dtype) if t.is_floating_point() else t.to(device)) for k, t in x.items()}
        x["values"].requires_grad_()
        return x

    return make


def _value_kernel(backend, **x):
    return rk.value_loss(**x, backend=backend)


# verl's actor aggregates its entropy bonus with the policy loss's mode; seq-mean-token-mean is GRPO's.
AGG_MODE = "seq-mean-token-mean"


def _agg_inputs(B: int, T: int, dtype: torch.dtype, device: torch.device):
    """An entropy [B, T] (the term verl's actor aggregates) and a response mask of random lengths."""

    def make():
        gen = torch.Generator(device="cpu").manual_seed(B * T + 2)
        lengths = torch.randint(T // 4, T + 1, (B,), generator=gen)
        loss_mat = (torch.rand(B, T, generator=gen) * 3).to(device, dtype).requires_grad_()
        return dict(loss_mat=loss_mat, mask=(torch.arange(T)[None, :] < lengths[:, None]).to(device))

    return make


def _agg_kernel(backend, **x):
    return rk.agg_loss(**x, agg=AGG_MODE, backend=backend)


def cases(shapes: str, device: torch.device) -> list[Case]:
    out = []
    dtype = torch.float32
    for B, T in SHAPES[shapes]:
        n = B * T
        f, m = 4 * n, n  # bytes of one fp32 [B, T] tensor, of the bool mask
        providers = standard(_policy_reference, _policy_kernel, device)
        if "cpu" in device_backends(device):
            providers.append(Provider("rlkernels[cpu] recompute", _policy_recompute))
        out.append(
            Case(
                op="policy_loss",
                shape=f"B={B} T={T} kl+entropy",
                dtype=dtype,
                make_inputs=_policy_inputs(B, T, dtype, device),
                providers=providers,
                modes=("no_grad", "forward", "backward", "full"),
                # The forward pass must read logp, old_logp, ref_logp, entropy and the mask (advantages are
                # [B]); the backward pass must write d logp and d entropy (reading at least the mask).
                floors=[
                    Floor("no_grad", "bytes", min_bytes=4 * f + m),
                    Floor("forward", "bytes", min_bytes=4 * f + m),
                    Floor("backward", "bytes", min_bytes=2 * f + m),
                    Floor("full", "bytes", min_bytes=6 * f + m),
                ],
            )
        )
        if (B, T) == SHAPES[shapes][-1]:
            out.append(
                Case(
                    op="policy_loss",
                    shape=f"B={B} T={T} kl+entropy, verl's views",
                    dtype=dtype,
                    make_inputs=_policy_inputs(B, T, dtype, device, views=True),
                    # the kernels against themselves on contiguous inputs (the case above); torch.compile
                    # would compile again for the views' strides, time a GPU lease spends on the other ops
                    providers=[p for p in providers if p.name != "torch.compile"],
                    modes=("full",),
                    # as above, with an int64 mask, read twice (the forward's terms, the backward's d entropy)
                    floors=[Floor("full", "bytes", min_bytes=6 * f + 16 * n)],
                )
            )
        out.append(
            Case(
                op="value_loss",
                shape=f"B={B} T={T}",
                dtype=dtype,
                make_inputs=_value_inputs(B, T, dtype, device),
                providers=standard(functools.partial(value_reference, clip=0.2), _value_kernel, device),
                modes=("forward", "backward", "full"),
                # Forward: read values, old_values, returns, mask; backward: the same again, write d values.
                floors=[
                    Floor("forward", "bytes", min_bytes=3 * f + m),
                    Floor("backward", "bytes", min_bytes=4 * f + m),
                    Floor("full", "bytes", min_bytes=4 * f + m),
                ],
            )
        )
        out.append(
            Case(
                op="agg_loss",
                shape=f"B={B} T={T} {AGG_MODE}",
                dtype=dtype,
                make_inputs=_agg_inputs(B, T, dtype, device),
                providers=standard(functools.partial(agg_reference, agg=AGG_MODE), _agg_kernel, device),
                modes=("forward", "backward", "full"),
                # Forward: read the loss and the mask; backward: read the mask, write d loss_mat.
                floors=[
                    Floor("forward", "bytes", min_bytes=f + m),
                    Floor("backward", "bytes", min_bytes=f + m),
                    Floor("full", "bytes", min_bytes=2 * f + m),
                ],
            )
        )
    return out


def traffic_cases() -> list[TrafficCase]:
    """The Triton kernels' bytes against the minimum (under the interpreter, on CPU tensors)."""
    from rlkernels.ops._aggregation import AggConfig
    from rlkernels.policy_config import ROW_STATS, PolicyConfig
    from rlkernels.triton.agg_loss import agg_loss_backward, agg_loss_forward
    from rlkernels.triton.policy_loss import policy_loss_backward, policy_loss_forward
    from rlkernels.triton.value_loss import value_loss_backward, value_loss_forward

    B, T = 7, 3001  # T not a multiple of the block: the masked tail must not add traffic
    gen = torch.Generator().manual_seed(0)
    logp = -torch.rand(B, T, generator=gen)
    x = dict(
        logp=logp,
        old_logp=logp + 0.3 * torch.randn(B, T, generator=gen),
        advantages=torch.randn(B, generator=gen),
        mask=torch.rand(B, T, generator=gen) > 0.1,
        ref_logp=logp + torch.randn(B, T, generator=gen),
        entropy=torch.rand(B, T, generator=gen),
        is_weights=None,
    )
    f, m = 4 * B * T, B * T

    def config(seq):
        return PolicyConfig(
            objective="clip", seq_level=seq, clip_low=0.2, clip_high=0.28, dual_clip=3.0, ratio_cap=None,
            tau_pos=1.0, tau_neg=1.05, dro_beta=1.0,
        vespo_k_pos=2.0, vespo_lambda_pos=3.0, vespo_k_neg=3.0, vespo_lambda_neg=2.0,
        kl_coef=0.05, kl_kind="k3", kl_clamp=10.0,
            entropy_coef=0.01,
        )  # fmt: skip

    agg = AggConfig("token-mean", 1, float(T), None, None, None, None)
    saved = torch.randn(B, T, generator=gen)
    row_stats = torch.zeros(B, len(ROW_STATS))
    grad_loss, row_weights = torch.ones(()), torch.rand(B, generator=gen)
    values = torch.randn(B, T, generator=gen)
    v = (values, values + 0.1, values - 0.5, x["mask"])
    data = list(x.values())

    def forward(seq, save):
        return lambda: policy_loss_forward(*data, config(seq), agg, save)

    def backward(saved_grad):
        args = (grad_loss, row_weights, row_stats, saved_grad, *data, config(False))
        return lambda: policy_loss_backward(*args, True, True)

    twice = "logp, old_logp and mask read twice: the row's mean log-ratio precedes every token's loss"
    return [
        TrafficCase("policy_loss", "forward (kl+entropy)", forward(False, False), 4 * f + m, max_ratio=1.05),
        TrafficCase("policy_loss", "forward, saving d logp", forward(False, True), 5 * f + m, max_ratio=1.05),
        TrafficCase("policy_loss", "backward from saved d logp", backward(saved), 3 * f + m, max_ratio=1.05),
        TrafficCase("policy_loss", "backward, recomputing", backward(saved[:0]), 6 * f + m, max_ratio=1.05),
        TrafficCase("policy_loss", "forward level=sequence", forward(True, False), 4 * f + m, note=twice),
        TrafficCase(
            "value_loss", "forward", lambda: value_loss_forward(*v, 0.2, agg), 3 * f + m, max_ratio=1.05
        ),
        TrafficCase(
            "value_loss",
            "backward",
            lambda: value_loss_backward(grad_loss, row_weights, *v, 0.2),
            4 * f + m,
            max_ratio=1.05,
        ),
        TrafficCase(
            "agg_loss", "forward", lambda: agg_loss_forward(values, x["mask"], agg), f + m, max_ratio=1.05
        ),
        TrafficCase(
            "agg_loss",
            "backward",
            lambda: agg_loss_backward(grad_loss, row_weights, values, x["mask"]),
            f + m,
            max_ratio=1.05,
        ),
    ]


# The options of each objective in interleaved_vs_compile: the other options of POLICY_KW stay (KL, entropy).
OBJECTIVE_KW = {
    "clip": {},
    "cispo": dict(objective="cispo", dual_clip=None),
    "sapo": dict(objective="sapo", dual_clip=None),
    "gpg": dict(objective="gpg", dual_clip=None),
    "dro": dict(objective="dro", dual_clip=None, dro_beta=0.1),
    "dppo_tv": dict(objective="dppo_tv", dual_clip=None, ratio_cap=3.0),
    "dppo_kl": dict(objective="dppo_kl", dual_clip=None, ratio_cap=3.0, clip_low=0.05, clip_high=0.05),
    "geo_mean": dict(objective="geo_mean", dual_clip=None),
    "vespo": dict(objective="vespo", dual_clip=None),
}


def interleaved_vs_compile(B: int, T: int, rounds: int, calls: int, objective: str = "clip") -> list[str]:
    """Forward+backward of policy_loss (POLICY_KW with `objective`'s options, fp32, CPU) against the eager
    reference and torch.compile of it, interleaved: each round times `calls` calls of each provider back to
    back, so that the drift of a shared machine hits all alike. Returns lines with min / median
    milliseconds and the ratios to rlkernels."""
    import statistics
    import time

    x = _policy_inputs(B, T, torch.float32, torch.device("cpu"))()
    kw = {**POLICY_KW, **OBJECTIVE_KW[objective]}

    def eager(**x):
        return policy_reference(**x, **kw)

    def kernel(**x):
        return rk.policy_loss(**x, **kw, backend="cpu")

    providers = {"eager": eager, "torch.compile": torch.compile(eager), "rlkernels[cpu]": kernel}

    def step(fn):
        x["logp"].grad = x["entropy"].grad = None
        fn(**x)[0].backward()

    for fn in providers.values():  # warm-up: compilation, thread pool, allocator
        for _ in range(calls):
            step(fn)
    ms = {name: [] for name in providers}
    for _ in range(rounds):
        for name, fn in providers.items():
            t0 = time.perf_counter()
            for _ in range(calls):
                step(fn)
            ms[name].append((time.perf_counter() - t0) / calls * 1e3)
    threads = torch.get_num_threads()
    head = f"policy_loss objective={objective} B={B} T={T} forward+backward"
    lines = [f"{head}, {threads} threads, {rounds} rounds"]
    for name, t in ms.items():
        lines.append(
            f"  {name:15s} min {min(t):.3f} ms  median {statistics.median(t):.3f} ms"
            f"  (quartiles {statistics.quantiles(t, n=4)[0]:.3f}-{statistics.quantiles(t, n=4)[2]:.3f})"
        )
    b = ms["rlkernels[cpu]"]
    for name in ("eager", "torch.compile"):
        a = ms[name]
        ratio_min, ratio_median = min(a) / min(b), statistics.median(a) / statistics.median(b)
        lines.append(f"  {name} / rlkernels: min {ratio_min:.2f}x  median {ratio_median:.2f}x")
    return lines


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=interleaved_vs_compile.__doc__.split(",")[0])
    parser.add_argument("--shape", nargs=2, type=int, default=(64, 4096), metavar=("B", "T"))
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--objective", nargs="+", default=["clip"], choices=list(OBJECTIVE_KW))
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    for objective in args.objective:
        print("\n".join(interleaved_vs_compile(*args.shape, args.rounds, args.calls, objective)), flush=True)
