"""linear_policy_loss's own host work beyond the frozen head's vocabulary stream (whose chunks
benchmarks/frozen_chunk_host.py times), in the control units of benchmarks/gpu_host_time.py, for the time
model:

- a row block's loss gradient (BLOCK_TOKENS tokens, entropy bonus and a KL to the reference): d loss / d logp
  and d entropy as the sweep forms them now, the policy_loss forward's saved gradient
  (ops/linear_policy_loss.py `_token_grads`), and as it did before 2026-11-30, through the public function
  and torch.autograd.grad; for the Triton flavor (launch stubbed) and the native one (on CPU tensors, so the
  C++ kernels' time on the block is in it too);
- the host work between the call's one host sync (the nonzero() that leaves masked tokens out of the GEMMs)
  and its first GEMM: the GPU has drained its queue at the sync and idles for that long (Triton flavor,
  frozen head, launches stubbed).

    python benchmarks/linear_policy_loss_host.py [--rounds 5] [--json]
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from unittest import mock

if __name__ == "__main__":
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

# linear_policy_loss's row block on a GPU (ops/logp_jacobian.py GPU_ROWS), whose loss gradient is timed.
BLOCK_TOKENS = 512
# The sync case: a frozen head over 4 x 64 tokens (about 30 % masked), D=64, one 1024-column chunk: the
# host work after the sync does not grow with the shapes, only the GPU's does.
SYNC_SHAPE = dict(B=4, T=64, D=64, V=1024)


def block_loss(backend: str, way: str = "direct"):
    """One row block's d loss / d logp (and d entropy) as linear_policy_loss's sweep computes it: "direct",
    the forward op's saved gradient (now); "autograd", through the public policy_loss and
    torch.autograd.grad (before 2026-11-30)."""
    from rlkernels.ops.linear_policy_loss import _token_grads
    from rlkernels.ops.policy_loss import policy_loss

    n, gen = BLOCK_TOKENS, torch.Generator().manual_seed(0)  # the same block both ways
    x = dict(old_logp=-torch.rand(n, generator=gen), advantages=torch.randn(n, generator=gen))
    x["weights"], ref_logp = torch.rand(n, generator=gen), -torch.rand(n, generator=gen)
    logp, entropy = -torch.rand(n, generator=gen), torch.rand(n, generator=gen)
    if way == "direct":
        grads = _token_grads(x, {"ref_logp": ref_logp}, dict(kl_coef=0.1), 0.01, backend, torch.device("cpu"),
                             torch.float32)  # fmt: skip
        return lambda: grads(0, n, logp, entropy)

    def autograd():
        lp, ent = logp.detach().requires_grad_(), entropy.detach().requires_grad_()
        loss, _ = policy_loss(
            lp[None], x["old_logp"][None], x["advantages"][None], x["weights"][None], agg="token-sum",
            entropy=ent[None], entropy_coef=0.01, ref_logp=ref_logp[None], kl_coef=0.1, backend=backend,
        )  # fmt: skip
        return torch.autograd.grad(loss, [lp, ent])

    return autograd


def sync_to_gemm(calls: int = 200, warmup: int = 10) -> float:
    """Median µs from the return of the call's nonzero() to its first GEMM (the Triton flavor's frozen head,
    launches stubbed), over `calls` calls after `warmup`."""
    import rlkernels as rk
    from rlkernels.ops import logp_jacobian

    B, T, D, V = (SYNC_SHAPE[k] for k in ("B", "T", "D", "V"))
    hidden = torch.randn(B, T, D).requires_grad_()
    weight, labels = torch.randn(V, D), torch.randint(0, V, (B, T))
    x = dict(old_logp=-torch.rand(B, T), advantages=torch.randn(B), mask=torch.rand(B, T) > 0.3)
    marks = {}
    nonzero, gemm = torch.Tensor.nonzero, logp_jacobian.gemm_fp32

    def marked_nonzero(self, *args, **kwargs):
        out = nonzero(self, *args, **kwargs)
        marks["sync"] = time.perf_counter()
        return out

    def marked_gemm(*args, **kwargs):
        marks.setdefault("gemm", time.perf_counter())
        return gemm(*args, **kwargs)

    gaps = []
    sizes = dict(GPU_ROWS=256, GPU_COLUMNS=V, GPU_MIN_COLUMNS=V, gemm_fp32=marked_gemm)
    marked = mock.patch.object(torch.Tensor, "nonzero", marked_nonzero)
    with marked, mock.patch.multiple(logp_jacobian, **sizes):
        for i in range(warmup + calls):
            marks.clear()
            rk.linear_policy_loss(hidden, weight, labels, **x, backend="triton")
            if i >= warmup:
                gaps.append(marks["gemm"] - marks["sync"])
    return statistics.median(gaps) * 1e6


def measure(rounds: int) -> dict[str, float]:
    """{"control": µs, "block_loss_triton" / "block_loss_cpu": units of a block's loss gradient (and
    "..._autograd": the way before 2026-11-30), "sync_to_gemm": units from the sync to the first GEMM}; each
    call keeps its least disturbed round median, the block-loss calls interleaved."""
    import gpu_host_time

    gpu_host_time._stub_triton()
    torch.set_num_threads(1)
    calls = {"control": gpu_host_time._control()}
    calls.update({(b, way): block_loss(b, way) for b in ("triton", "cpu") for way in ("direct", "autograd")})
    best = gpu_host_time.interleaved_medians(calls, rounds)
    control = best.pop("control")
    out = {"control": control}
    for (backend, way), us in best.items():
        out[f"block_loss_{backend}" + ("" if way == "direct" else "_autograd")] = us / control
    out["sync_to_gemm"] = min(sync_to_gemm() for _ in range(rounds)) / control
    return out


def report(result: dict) -> list[str]:
    lines = [f"control {result['control']:.1f} us (the unit)"]
    for backend in ("triton", "cpu"):
        now, before = result[f"block_loss_{backend}"], result[f"block_loss_{backend}_autograd"]
        lines.append(f"the loss gradient a block, {backend}: {now:.2f} units (through autograd, as before "
                     f"2026-11-30: {before:.2f})")  # fmt: skip
    lines.append(f"from the nonzero() sync to the first GEMM: {result['sync_to_gemm']:.2f} units")
    return lines


def main(argv=None) -> int:
    import gpu_host_time

    return gpu_host_time.units_main(__doc__, measure, report, argv)


if __name__ == "__main__":
    sys.exit(main())
