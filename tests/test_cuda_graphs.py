"""The token ops inside a CUDA graph (a GPU machine only): forward and backward captured once and replayed
give the eager call's outputs and gradients bit for bit. Capture fails on any host sync, so this holds the
ops to what `benchmarks/graph_replay.py` found on the H200 (2026-11-27): every call capturable, the device
time alone on replay. Without a GPU there is no flavor to run (the fake-CUDA sync budgets,
tests/test_gpu_budgets.py, are the proxy)."""

import pathlib
import sys

import pytest
import torch
from oracle import kernel_flavors

import rlkernels as rk

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))
import graph_replay  # noqa: E402

GPU = [f for f in kernel_flavors() if f.device.type == "cuda"]


def _policy_loss(backend):
    cpu = dict(generator=torch.Generator(device="cpu").manual_seed(0), device="cpu")
    B, T = 8, 300
    logp = (-torch.rand(B, T, **cpu) * 4).cuda().requires_grad_()
    entropy = (torch.rand(B, T, **cpu) * 3).cuda().requires_grad_()
    old = (logp.detach().cpu() + 0.3 * torch.randn(B, T, **cpu)).cuda()
    ref = (logp.detach().cpu() + 0.3 * torch.randn(B, T, **cpu)).cuda()
    adv, mask = torch.randn(B, **cpu).cuda(), (torch.rand(B, T, **cpu) < 0.8).cuda()
    upstream = torch.tensor(0.7, device="cuda")

    def step():
        loss, stats = rk.policy_loss(
            logp, old, adv, mask, ref_logp=ref, kl_coef=0.05, entropy=entropy, entropy_coef=0.01,
            dual_clip=3.0, clip_high=0.28, backend=backend,
        )  # fmt: skip
        return (loss, *stats.values(), *torch.autograd.grad(loss, (logp, entropy), upstream))

    return step


def _kl_penalty(backend):
    cpu = dict(generator=torch.Generator(device="cpu").manual_seed(1), device="cpu")
    logp = (-torch.rand(5000, **cpu) * 4).cuda().requires_grad_()
    ref = (logp.detach().cpu() + 0.3 * torch.randn(5000, **cpu)).cuda()
    upstream = torch.randn(5000, **cpu).cuda()

    def step():
        kl = rk.kl_penalty(logp, ref, "k3", backend=backend)
        return (kl, *torch.autograd.grad(kl, logp, upstream))

    return step


def _value_loss(backend):
    cpu = dict(generator=torch.Generator(device="cpu").manual_seed(2), device="cpu")
    B, T = 8, 300
    values = torch.randn(B, T, **cpu).cuda().requires_grad_()
    old, returns = torch.randn(B, T, **cpu).cuda(), torch.randn(B, T, **cpu).cuda()
    mask = (torch.rand(B, T, **cpu) < 0.8).cuda()

    def step():
        loss, stats = rk.value_loss(values, old, returns, mask, clip=0.2, backend=backend)
        return (loss, *stats.values(), *torch.autograd.grad(loss, values))

    return step


def _agg_loss(backend):
    cpu = dict(generator=torch.Generator(device="cpu").manual_seed(3), device="cpu")
    B, T = 8, 300
    loss_mat = torch.randn(B, T, **cpu).cuda().requires_grad_()
    mask = (torch.rand(B, T, **cpu) < 0.8).cuda()

    def step():
        loss = rk.agg_loss(loss_mat, mask, "seq-mean-token-mean", backend=backend)
        return (loss, *torch.autograd.grad(loss, loss_mat))

    return step


# The draws are on the CPU (device="cpu" inside a test flavor, whose default device is CUDA: the 2026-11-30
# lease) and moved, so that each flavor sees the same inputs.
OPS = [_policy_loss, _kl_penalty, _value_loss, _agg_loss]


@pytest.mark.parametrize("make", OPS, ids=lambda f: f.__name__[1:])
@pytest.mark.parametrize("backend", GPU)
def test_replay_equals_the_eager_call(backend, make):
    step = make(backend)
    # Detached: an eager graph kept alive keeps its leaves' AccumulateGrad nodes, made on the default stream,
    # which the capture's backward would then have to wait for (capture fails: the 2026-11-30 lease).
    want = [w.detach() for w in step()]
    graph, got = graph_replay.captured(step)
    for _ in range(2):  # the launch counters the kernels reset: a second replay as right as the first
        graph.replay()
        torch.cuda.synchronize()
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            assert torch.equal(g, w)
