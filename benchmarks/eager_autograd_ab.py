"""The C++ eager autograd nodes (csrc/autograd/) against the Python autograd formula they replace, on the CPU:
policy_loss, kl_penalty and value_loss forward + backward with backend="cpu", in one process, interleaved (6
rounds, the order alternating), at a small shape (where the host's work is all there is) and a large one
(where the kernels are). Printed: the least and the largest round median of each path, in microseconds.

    python benchmarks/eager_autograd_ab.py
"""

import statistics
import time

import torch

import rlkernels as rk
import rlkernels.ops.kl as K
import rlkernels.ops.policy_loss as P
import rlkernels.ops.value_loss as V

torch.manual_seed(0)


def policy(B, T):
    x = dict(
        logp=(-torch.rand(B, T)).requires_grad_(),
        old_logp=-torch.rand(B, T),
        advantages=torch.randn(B),
        mask=torch.rand(B, T) > 0.2,
        ref_logp=-torch.rand(B, T),
        entropy=torch.rand(B, T).requires_grad_(),
    )
    kw = dict(clip_low=0.2, clip_high=0.28, dual_clip=3.0, kl_coef=0.05, entropy_coef=0.01)
    return lambda: torch.autograd.grad(rk.policy_loss(**x, **kw, backend="cpu")[0], [x["logp"], x["entropy"]])


def kl(N):
    lp, rf, g = (-torch.rand(N)).requires_grad_(), -torch.rand(N), torch.randn(N)
    return lambda: torch.autograd.grad(rk.kl_penalty(lp, rf, "k3", backend="cpu"), [lp], g)


def value(B, T):
    values = torch.randn(B, T).requires_grad_()
    old, returns, mask = values.detach() + 0.3 * torch.randn(B, T), torch.randn(B, T), torch.rand(B, T) > 0.2
    return lambda: torch.autograd.grad(rk.value_loss(values, old, returns, mask, backend="cpu")[0], [values])


CASES = {  # name: (small, call)
    "policy_loss B=4 T=64": (True, policy(4, 64)),
    "policy_loss B=64 T=4096": (False, policy(64, 4096)),
    "kl_penalty N=256": (True, kl(256)),
    "kl_penalty N=4M": (False, kl(1 << 22)),
    "value_loss B=4 T=64": (True, value(4, 64)),
    "value_loss B=64 T=4096": (False, value(64, 4096)),
}
NATIVE = {"policy": P._native_eager, "kl": K._native_eager, "value": V._native_eager}
ROUNDS = 6
CALLS = {True: 200, False: 20}  # per round median: small shapes, large shapes


def set_path(cpp: bool) -> None:
    P._native_eager = NATIVE["policy"] if cpp else None
    K._native_eager = NATIVE["kl"] if cpp else None
    V._native_eager = NATIVE["value"] if cpp else None


def main() -> None:
    if None in NATIVE.values():
        raise SystemExit(
            "the extension lacks policy_loss_autograd / kl_penalty_autograd / value_loss_autograd"
        )
    torch.set_num_threads(1)
    for name, (small, call) in CASES.items():
        medians = {True: [], False: []}
        for r in range(ROUNDS):
            for cpp in (True, False) if r % 2 == 0 else (False, True):
                set_path(cpp)
                for _ in range(3):
                    call()
                times = []
                for _ in range(CALLS[small]):
                    t = time.perf_counter()
                    call()
                    times.append(time.perf_counter() - t)
                medians[cpp].append(statistics.median(times) * 1e6)
        a, b = medians[True], medians[False]
        print(
            f"{name:24s} C++ node {min(a):8.1f} us ({max(a):8.1f})   Python formula {min(b):8.1f} us "
            f"({max(b):8.1f})   ratio of the least {min(a) / min(b):.2f}",
            flush=True,
        )
    set_path(True)


if __name__ == "__main__":
    main()
