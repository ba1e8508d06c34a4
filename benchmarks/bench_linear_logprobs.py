"""linear_logprobs: fused hidden @ W.T -> per-token log-prob (+ entropy) against eager log_softmax of the full
logits, torch.compile of it, cut-cross-entropy and Liger-Kernel. The floor is the bare GEMMs the op must do,
timed in the same run: 1 for the forward, 4 for forward + backward with recompute, 2 with a frozen head (the
logits and d hidden, both formed in the forward: docs/row_sweep.md)."""

from __future__ import annotations

import contextlib

import torch
from harness import Case, Floor, Provider, TrafficCase
from providers import compiled, eager, optional_package, rlkernels

import rlkernels as rk
from rlkernels.reference.logprobs import linear_logprobs as reference

# (N tokens, D hidden, V vocabulary). CPU "llm": the D=1024, V=128256 (Llama-3) at N=2048; GPU "llm":
# Llama-3-8B's head at 8k tokens and Qwen2.5-7B's 152k vocabulary.
SHAPES = {
    ("small", "cpu"): [(512, 256, 8192), (1024, 512, 32000)],
    ("llm", "cpu"): [(2048, 1024, 128256)],
    ("small", "cuda"): [(2048, 1024, 32000), (4096, 2048, 128256)],
    ("llm", "cuda"): [(8192, 4096, 128256), (8192, 3584, 152064)],
}


def _inputs(n: int, d: int, v: int, dtype: torch.dtype, device: torch.device, frozen_head: bool):
    def make():
        # Drawn where they are used: on a GPU, a [V, D] weight drawn on the CPU takes seconds per case.
        gen = torch.Generator(device=device).manual_seed(n + d + v)
        hidden = torch.randn(n, d, generator=gen, device=device).to(dtype).requires_grad_()
        weight = (torch.randn(v, d, generator=gen, device=device) * (3.0 / d**0.5)).to(dtype)
        labels = torch.randint(0, v, (n,), generator=gen, device=device)
        return {"hidden": hidden, "weight": weight.requires_grad_(not frozen_head), "labels": labels}

    return make


def _eager(hidden, weight, labels):
    """What trainers do today: full logits, fp32 log_softmax, gather."""
    return reference(hidden, weight, labels)


def _rlkernels(hidden, weight, labels, backend):
    return rk.linear_logprobs(hidden, weight, labels, backend=backend)


def _cce_provider(device: torch.device) -> Provider:
    reason = optional_package("cut_cross_entropy")
    impl = "torch_compile" if device.type == "cpu" else "cce"

    def fn(hidden, weight, labels):
        from cut_cross_entropy import linear_cross_entropy

        return -linear_cross_entropy(hidden, weight, labels, reduction="none", impl=impl)

    return Provider(f"cut-cross-entropy[{impl}]", fn, reason)


def _liger_provider(device: torch.device) -> Provider:
    reason = optional_package("liger_kernel")
    if reason is None and device.type != "cuda":
        reason = "Liger-Kernel's Triton kernels need a CUDA device"

    def fn(hidden, weight, labels):
        from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

        return -liger_fused_linear_cross_entropy(hidden, weight, labels, reduction="none")

    return Provider("liger-kernel", fn, reason)


def _torch_linear_ce_provider() -> Provider:
    """torch.nn.functional.linear_cross_entropy where this torch has it, with its options (the chunked path,
    no [N, V] logits; without options it is the reference composition)."""
    try:
        from torch.nn.modules.linear_cross_entropy_options import LinearCrossEntropyOptions
    except ImportError:
        LinearCrossEntropyOptions = None  # noqa: N806
    reason = None if LinearCrossEntropyOptions is not None else "not in this torch"

    def fn(hidden, weight, labels):
        ce = torch.nn.functional.linear_cross_entropy
        return -ce(hidden, weight, labels, reduction="none", options=LinearCrossEntropyOptions())

    return Provider("torch linear_cross_entropy", fn, reason)


def _gemm_floor(n_gemms: int):
    """The bare matrix products of the op, in the inputs' dtype: logits (x2 with the recompute), then
    d hidden = G @ W and d weight = G.T @ h, for any [N, V] G."""

    def fn(hidden, weight, labels):
        g = hidden @ weight.T
        if n_gemms >= 2:
            torch.mm(hidden, weight.T, out=g)
        if n_gemms >= 3:
            g @ weight
        if n_gemms >= 4:
            g.T @ hidden
        return g

    return fn


def cases(shapes: str, device: torch.device) -> list[Case]:
    dev = "cuda" if device.type == "cuda" else "cpu"
    dtype = torch.bfloat16 if dev == "cuda" else torch.float32
    out = []
    for n, d, v in SHAPES[(shapes, dev)]:
        for frozen in (False, True):
            providers = [eager(_eager), compiled(_eager), _cce_provider(device), _liger_provider(device)]
            providers.append(_torch_linear_ce_provider())
            providers += rlkernels(_rlkernels, device, ["triton", "cuda"] if dev == "cuda" else ["cpu"])
            # A frozen head only changes the backward: the no-grad and forward rows are measured once. At LLM
            # sizes on a GPU, the rows the targets name (a few minutes in all, autotuning included).
            if dev == "cuda" and shapes == "llm":
                modes = ("full",) if frozen else ("no_grad", "full")
            else:
                modes = ("backward", "full") if frozen else ("no_grad", "forward", "backward", "full")
            floors = [
                Floor(
                    "backward", "3 GEMMs" if not frozen else "2 GEMMs", fn=_gemm_floor(3 if not frozen else 2)
                ),
                Floor("full", "4 GEMMs" if not frozen else "2 GEMMs", fn=_gemm_floor(4 if not frozen else 2)),
            ]
            if not frozen:
                floors += [
                    Floor("no_grad", "1 GEMM", fn=_gemm_floor(1)),
                    Floor("forward", "1 GEMM", fn=_gemm_floor(1)),
                ]
            out.append(
                Case(
                    op="linear_logprobs",
                    shape=f"N={n} D={d} V={v}" + (" frozen head" if frozen else ""),
                    dtype=dtype,
                    make_inputs=_inputs(n, d, v, dtype, device, frozen),
                    providers=providers,
                    modes=modes,
                    floors=floors,
                )
            )
    return out


@contextlib.contextmanager
def _gpu_tiles():
    """Run the interpreter with the A100/H100 default tile (128 x 128 x 64) so that the counted re-reads are
    the GPU's, not those of the tiny test tiles."""
    from rlkernels.triton import linear_logprobs as fwd

    saved = dict(fwd.INTERPRETER_TILE)
    fwd.INTERPRETER_TILE.update(BLOCK_N=128, BLOCK_V=128, BLOCK_D=64)
    try:
        yield
    finally:
        fwd.INTERPRETER_TILE.update(saved)


def traffic_cases() -> list[TrafficCase]:
    """Bytes moved by the Triton kernels (under the interpreter) against each input read once and each output
    written once. The row kernels of logprobs_from_logits are held to 1.05x; the GEMM kernels report their
    re-reads (hidden once per 128-column vocabulary tile, weight once per 128-row block, absorbed by L2 thanks
    to the grouped tile order)."""
    from rlkernels.triton.linear_logprobs import linear_logprobs_forward
    from rlkernels.triton.linear_logprobs_backward import linear_logprobs_backward
    from rlkernels.triton.logprobs_from_logits import (
        logprobs_from_logits_backward,
        logprobs_from_logits_forward,
    )

    gen = torch.Generator().manual_seed(0)
    rows, vocab = 19, 20_011
    logits = torch.randn(rows, vocab, generator=gen)
    labels = torch.randint(0, vocab, (rows,), generator=gen)
    # The row statistics the backward kernels read, from torch (not counted).
    lse = torch.logsumexp(logits, -1)
    ent = lse - (torch.softmax(logits, -1) * logits).sum(-1)
    g = torch.randn(rows, generator=gen)
    lv = rows * vocab * 4
    row_bytes = rows * (8 + 4)  # labels + one fp32 per row

    n, d, v = 512, 256, 2048
    hidden = torch.randn(n, d, generator=gen)
    weight = torch.randn(v, d, generator=gen) / d**0.5
    y = torch.randint(0, v, (n,), generator=gen)
    z = hidden @ weight.T
    ls = torch.logsumexp(z, -1)
    en = ls - (torch.softmax(z, -1) * z).sum(-1)
    inputs = (n * d + v * d) * 4 + n * 8

    def fwd():
        with _gpu_tiles():
            linear_logprobs_forward(hidden, weight, y, None, 1.0, None, -100, True, False, None)

    def bwd():
        with _gpu_tiles():
            linear_logprobs_backward(
                torch.ones(n),
                torch.ones(n),
                hidden,
                weight,
                y,
                None,
                ls,
                en,
                1.0,
                None,
                -100,
                (True, True, False),
                None,
            )

    return [
        TrafficCase(
            "logprobs_from_logits",
            "forward (entropy)",
            lambda: logprobs_from_logits_forward(logits, labels, 1.0, None, -100, True, False),
            lv + row_bytes + 2 * rows * 4,
            max_ratio=1.05,
        ),
        TrafficCase(
            "logprobs_from_logits",
            "backward (entropy)",
            lambda: logprobs_from_logits_backward(g, g, logits, labels, lse, ent, 1.0, None, -100),
            2 * lv + row_bytes + 3 * rows * 4,
            max_ratio=1.05,
        ),
        TrafficCase(
            "linear_logprobs",
            f"forward N={n} D={d} V={v}",
            fwd,
            inputs + 3 * n * 4,
            note="hidden re-read per 128-column tile, weight per 128-row block (L2)",
        ),
        TrafficCase(
            "linear_logprobs",
            f"backward N={n} D={d} V={v}",
            bwd,
            inputs + 4 * n * 4 + (n * d + v * d) * 4,
            note="dlogits kernel + d hidden GEMM (d weight by cuBLAS not counted)",
        ),
    ]


def floor_ratios(n: int, d: int, v: int, reps: int, dtype: torch.dtype = torch.float32) -> list[str]:
    """rlkernels' CPU kernel against its bare-GEMM floors (and eager) with every timed step interleaved: on a
    shared machine whose load drifts over minutes, the harness' one-provider-at-a-time medians can compare
    a quiet minute with a busy one; here each round times every step once, and min / median ratios are
    taken over the rounds. From the checkout: `PYTHONPATH=. python benchmarks/bench_linear_logprobs.py`."""
    import statistics
    import time

    make = _inputs(n, d, v, dtype, torch.device("cpu"), frozen_head=False)
    x = make()
    hidden, weight, labels = x["hidden"], x["weight"], x["labels"]
    upstream = torch.randn(n, generator=torch.Generator().manual_seed(1)).to(dtype)
    floor = {m: _gemm_floor(k) for m, k in (("1", 1), ("2", 2), ("4", 4))}

    def no_grad(fn):
        def step():
            with torch.no_grad():
                fn()

        return step

    def full(fn, frozen=False):
        w = weight.detach() if frozen else weight
        leaves = [hidden] if frozen else [hidden, weight]
        return lambda: torch.autograd.grad((fn(hidden, w, labels) * upstream).sum(), leaves)

    rk_cpu = lambda h, w, y: rk.linear_logprobs(h, w, y, backend="cpu")  # noqa: E731
    steps = {
        "no_grad rlkernels": no_grad(lambda: rk_cpu(hidden, weight, labels)),
        "no_grad eager": no_grad(lambda: _eager(hidden, weight, labels)),
        "no_grad floor (1 GEMM)": no_grad(lambda: floor["1"](hidden, weight, labels)),
        "full rlkernels": full(rk_cpu),
        "full eager": full(_eager),
        "full floor (4 GEMMs)": no_grad(lambda: floor["4"](hidden, weight, labels)),
        "frozen-head full rlkernels": full(rk_cpu, frozen=True),
        "frozen-head full eager": full(_eager, frozen=True),
        "frozen-head full floor (2 GEMMs)": no_grad(lambda: floor["2"](hidden, weight, labels)),
    }
    times = {k: [] for k in steps}
    for step in steps.values():
        step()
    for _ in range(reps):
        for k, step in steps.items():
            t0 = time.perf_counter()
            step()
            times[k].append(time.perf_counter() - t0)
    lines = [f"N={n} D={d} V={v} {dtype}, {reps} interleaved rounds, {torch.get_num_threads()} threads"]
    groups = {
        "no_grad": ("no_grad rlkernels", "no_grad eager", "no_grad floor (1 GEMM)"),
        "full": ("full rlkernels", "full eager", "full floor (4 GEMMs)"),
        "frozen": (
            "frozen-head full rlkernels",
            "frozen-head full eager",
            "frozen-head full floor (2 GEMMs)",
        ),
    }
    for names in groups.values():
        lo_floor, med_floor = min(times[names[-1]]), statistics.median(times[names[-1]])
        for k in names:
            lo, med = min(times[k]), statistics.median(times[k])
            lines.append(
                f"  {k:34s} min {lo:8.3f} s  median {med:8.3f} s  "
                f"vs floor: min {lo / lo_floor:.3f}  median {med / med_floor:.3f}"
            )
    return lines


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=floor_ratios.__doc__.split(":")[0])
    parser.add_argument("--shape", nargs=3, type=int, default=(2048, 1024, 128256), metavar=("N", "D", "V"))
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    print("\n".join(floor_ratios(*args.shape, args.reps)))
