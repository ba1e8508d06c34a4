"""benchmarks/gpu_host_time.py, the host-time half of the GPU time model: its measurement of Triton's launch
path goes through Triton's own JITFunction.run (binder, specialization, cache key) and reaches the cached
kernel on every timed call, without compiling; and the model reads its units as the tool prints them. A
timing is never asserted (docs/testing.md): counts only."""

import pathlib
import sys

import pytest
import torch

import rlkernels as rk
from rlkernels.fake_cuda import Maker

BENCHMARKS = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
import gpu_cost  # noqa: E402
import gpu_host_time  # noqa: E402


def _triton_launches(case: str) -> int:
    """The Triton flavor's launches of one forward + backward call, counted on fake CUDA tensors."""
    if case == "policy_loss":

        def make(mode):
            return gpu_host_time._policy_inputs(64, 4096, Maker(torch.device("cuda"), mode))

        call = gpu_host_time._policy_call("triton")
    else:

        def make(mode):
            m = Maker(torch.device("cuda"), mode)
            return dict(logp=m.logp(4096, grad=True), ref_logp=m.logp(4096))

        call = lambda logp, ref_logp: rk.kl_penalty(logp, ref_logp, "k3", backend="triton")  # noqa: E731
    return gpu_cost.count(call, make).kernels("triton")


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="a machine with a GPU times the launches themselves (the bench)"
)
@pytest.mark.parametrize("case", ["kl_penalty", "policy_loss"])
def test_triton_run_reaches_the_cached_kernel_on_every_call(case):
    result = gpu_host_time.triton_run_child(case, rounds=1)
    launches = _triton_launches(case)
    assert launches >= 2  # a forward and a backward kernel
    assert result["launches"] == launches
    # each launch: 20 warm-up calls and one round of 200, every one through the binder to the cached kernel
    assert result["runs"] == launches * (20 + 200)
    assert result["us"] > 0


def test_control_computes_k3_and_its_gradient():
    """The unit is a real computation (k3's gradient, -grad · (e^(ref - logp) - 1)), not an empty call."""
    control = gpu_host_time._control()
    logp, ref, grad = control.inputs
    (d_logp,) = control()
    expected = -grad.double() * torch.expm1(ref.double() - logp.detach().double())
    torch.testing.assert_close(d_logp.double(), expected, rtol=1e-5, atol=1e-6)


def test_native_parts_time_the_op_the_public_call_runs():
    """--native-parts times `policy_loss_autograd` with the arguments the public function gave it: the same
    loss, bit for bit, and a gradient through the same C++ node."""
    forward, op, args, leaves = gpu_host_time.native_policy_calls()
    loss = forward()
    direct = op(*args)[0]
    assert torch.equal(direct, loss)
    assert direct.grad_fn is not None and type(direct.grad_fn).__name__ == type(loss.grad_fn).__name__
    assert all(g is not None for g in torch.autograd.grad(direct, leaves, allow_unused=True))


def test_linear_policy_loss_host_sees_the_sync_and_the_gradients():
    """benchmarks/linear_policy_loss_host.py times what the call does: its one nonzero() comes before its
    first GEMM (the interval it times), and both ways of forming a block's loss gradient give the same
    d logp and d entropy (the measured way and the way it replaced)."""
    import linear_policy_loss_host

    assert linear_policy_loss_host.sync_to_gemm(calls=1, warmup=0) > 0
    for backend in ("triton", "cpu"):
        now = linear_policy_loss_host.block_loss(backend)()
        before = linear_policy_loss_host.block_loss(backend, "autograd")()
        for new, old in zip(now, before, strict=True):
            torch.testing.assert_close(new, old.reshape(new.shape), rtol=1e-6, atol=1e-7)
