"""verl's views against contiguous inputs: what a forward + backward of policy_loss, value_loss and kl_penalty
launches and moves on a GPU (benchmarks/gpu_cost.py on fake CUDA tensors, the Triton flavor; nothing is
computed), docs/gpu_token_ops.md "Rows where they lie".

verl's layout: the log-probs, entropy and values sliced out of the padded sequence's ([:, -T - 1:-1] of
[B, T + PAD]), the response mask an int64 attention mask's [:, -T:], ref_logp a view at another offset. The
same values contiguous are the baseline. Run it from a checkout of an earlier commit for that commit's counts
(the CUDA C++ flavor's launches are counted by tests/test_gpu_budgets.py through the cuda-on-cpu harness).

    python benchmarks/views_cost.py [--B 512] [--T 8192]
"""

from __future__ import annotations

import argparse
import sys

import torch

import rlkernels as rk
from rlkernels.fake_cuda import Maker

PAD = 9  # columns of prompt before the response (an odd stride: the rows start off a 16-byte boundary)


def _inputs(op: str, B: int, T: int, views: bool):
    """make_inputs(mode) of gpu_cost.count: `op`'s tensors, as verl's views or contiguous; the
    differentiable ones leaves (the slices' own backward is the model's, not the op's)."""

    def make(mode):
        m = Maker(torch.device("cuda"), mode)

        def rows(wide, start=PAD - 1, grad=False):  # [B, T] out of [B, T + PAD]
            t = wide[:, start : start + T] if views else wide[:, start : start + T].contiguous()
            return t.detach().requires_grad_() if grad else t

        mask = rows(m.mask(B, T + PAD).to(torch.int64), start=PAD)
        if op == "policy_loss":
            return dict(
                logp=rows(m.logp(B, T + PAD), grad=True), old_logp=m.logp(B, T), advantages=m.randn(B),
                mask=mask, ref_logp=rows(m.logp(B, T + PAD), start=2),
                entropy=rows(m.randn(B, T + PAD), grad=True),
            )  # fmt: skip
        if op == "value_loss":
            return dict(values=rows(m.randn(B, T + PAD), grad=True), old_values=m.randn(B, T),
                        returns=m.randn(B, T), mask=mask)  # fmt: skip
        return dict(logp=rows(m.logp(B, T + PAD), grad=True), ref_logp=m.logp(B, T))

    return make


CALLS = {
    "policy_loss": lambda **x: rk.policy_loss(**x, kl_coef=0.05, entropy_coef=0.01, backend="triton"),
    "value_loss": lambda **x: rk.value_loss(**x, backend="triton"),
    "kl_penalty": lambda **x: rk.kl_penalty(x["logp"], x["ref_logp"], "k3", backend="triton"),
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--B", type=int, default=512)
    parser.add_argument("--T", type=int, default=8192)
    args = parser.parse_args(argv)
    import gpu_cost

    print(f"Triton flavor, fp32, B={args.B} T={args.T}, forward + backward on fake CUDA tensors\n")
    print("| op | inputs | launches | MB | kernels |")
    print("|---|---|---|---|---|")
    for op, call in CALLS.items():
        for views in (False, True):
            cost = gpu_cost.count(call, _inputs(op, args.B, args.T, views))
            names = ", ".join(k.name for k in cost.launches)
            layout = "verl's views" if views else "contiguous"
            print(f"| {op} | {layout} | {cost.kernels()} | {cost.bytes / 1e6:.1f} | {names} |")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    sys.exit(main())
