"""The GPU paths on fake CUDA tensors (rlkernels/fake_cuda.py): every public op's CUDA branch, for
backend="auto", "triton" and "cuda", runs its validation, backend selection, glue and fake kernels, with the
reference's output and gradient shapes and no host sync beyond its stated budget; and traces as one graph
under dynamo in a fresh process, where the first call of each backend is the one inside the graph."""

import inspect
import subprocess
import sys

import pytest
import torch

import rlkernels as rk
from rlkernels import _backend, fake_cuda

CALLS = list(fake_cuda.CALLS)


def _public_ops_with_a_backend():
    return [
        name
        for name in rk.__all__
        if callable(getattr(rk, name))
        and not isinstance(getattr(rk, name), type)
        and "backend" in inspect.signature(getattr(rk, name)).parameters
    ]


def test_every_public_op_with_a_backend_has_a_call():
    """The catalogue covers every public function that takes `backend=` (`advantages` dispatches by name
    to the estimators, each of which has a call)."""
    missing = [
        name
        for name in _public_ops_with_a_backend()
        if name != "advantages" and not any(c == name or c.startswith(name + "[") for c in CALLS)
    ]
    assert not missing, f"public ops without a fake-CUDA call: {missing}"


@pytest.mark.parametrize("backend", fake_cuda.GPU_BACKENDS)
@pytest.mark.parametrize("name", CALLS)
def test_gpu_branch_on_fake_cuda_tensors(name, backend):
    outcome = fake_cuda.check_call(name, backend)
    if outcome.status == "n/a":  # only an op with no GPU kernel may say so
        op = name.split("[")[0]
        assert not _backend.GPU_ORDER.get(op, ()), outcome.detail
        return
    assert outcome.status == "ok", outcome.detail


@pytest.mark.slow
@pytest.mark.parametrize("backend", fake_cuda.GPU_BACKENDS)
def test_dynamo_fullgraph_in_a_fresh_process(backend):
    """Each backend in its own process, so the first call through every probe (the extension's build
    information, Triton's presence) happens inside a graph. Fails on a pybind call reached on the way (the
    H200 run's `backend="cuda"` bug)."""
    done = subprocess.run(
        [sys.executable, "-m", "rlkernels", "fake-cuda", "--dynamo", "--backends", backend],
        capture_output=True,
        text=True,
        timeout=600,
    )
    failed = [line for line in done.stdout.splitlines() if line.startswith("FAILED")]
    assert done.returncode == 0 and not failed, "\n".join(failed) or done.stdout[-2000:] + done.stderr[-2000:]
    assert f"0 failed of {len(CALLS)}" in done.stdout


def test_walk_backward_matches_the_autograd_engine(seed):
    """The graph walk that stands in for the C++ engine on fake CUDA tensors gives the engine's gradients on
    real CPU tensors: Python autograd.Functions with non-tensor arguments, views, a tensor used twice, an
    input that gets no gradient. The walk adds a tensor's gradients in another order than the engine, so
    float64 sums may differ in the last bit."""
    logp = (-torch.rand(3, 9, dtype=torch.float64)).requires_grad_()
    old = logp.detach() + 0.1 * torch.randn(3, 9, dtype=torch.float64)
    adv = torch.randn(3, dtype=torch.float64, requires_grad=True)
    unused = torch.randn(2, dtype=torch.float64, requires_grad=True)
    loss, stats = rk.policy_loss(logp, old, adv, torch.rand(3, 9) > 0.2, ref_logp=old, kl_coef=0.1)
    total = loss + stats["kl"] + rk.kl_penalty(logp, old, "k3").sum() * 0.5 + (logp.view(-1)[:4] ** 2).sum()
    want = torch.autograd.grad(total, [logp, adv, unused], allow_unused=True, retain_graph=True)
    got = fake_cuda.walk_backward(total, [logp, adv, unused])
    assert got[2] is None and want[2] is None
    for g, w in zip(got[:2], want[:2], strict=True):
        if w is None:
            assert g is None or not bool(g.any())
        else:
            torch.testing.assert_close(g, w, rtol=1e-14, atol=1e-14)


def test_host_syncs_are_counted():
    """A read of a tensor as a number, a data-dependent shape, a copy to the host and a blocking copy from it
    (torch.tensor(data, device="cuda"): torch synchronizes the stream after a pageable copy) each count as a
    sync on fake CUDA tensors, and the call goes on; a non-blocking copy from the host does not, nor do the
    copies that place a test's inputs."""

    def f(x):
        rows = (x > 0).nonzero()
        if bool(x.sum() > 0):  # the number is 0 on a fake tensor: the branch is not taken
            x = x * 2
        scale = torch.tensor([2.0, 3.0, 4.0], device="cuda")
        shift = torch.ones(3).to("cuda", non_blocking=True)
        return (x * scale + shift).cpu(), rows

    with fake_cuda.fake_cuda_mode() as mode, fake_cuda.HostSyncs() as seen:
        with fake_cuda.placing_inputs():
            x = mode.from_tensor(torch.randn(5, 3)).to("cuda")
        host, rows = f(x)
    assert rows.shape == (15, 2) and host.device.type == "cpu"
    assert seen.syncs == ["nonzero", "_local_scalar_dense", "copy from host", "copy to host"]


def test_device_values_put_numbers_on_the_device_without_a_host_sync():
    """ops/_device_values.device_values: the numbers exactly, in the dtype asked for (as torch.tensor gives
    them), by fills: no copy from the host on fake CUDA tensors, one fill per entry that differs from the
    first; integers in an arithmetic progression (equal vocabulary shards' ends) by one arange."""
    from rlkernels.ops._device_values import device_values

    cases = (
        ([1.0, 0.5, 1.0, 0.1], torch.float64),
        ([0.3], torch.float32),
        ([7, 7, 9], torch.int64),
        ([16032, 32064, 48096, 64128], torch.int64),
        ([5, 2, -1], torch.int32),
        ([3, 5], torch.int64),
        ([1, 2, 4], torch.int64),
    )
    for values, dtype in cases:
        got = device_values(values, dtype, torch.device("cpu"))
        assert got.dtype == dtype and torch.equal(got, torch.tensor(values, dtype=dtype))
    with fake_cuda.fake_cuda_mode(), fake_cuda.HostSyncs() as seen:
        got = device_values([1.0, 0.5, 1.0, 0.1], torch.float32, torch.device("cuda"))
    assert got.device.type == "cuda" and got.shape == (4,)
    assert not seen.syncs and seen.ops["full"] == 1 and seen.ops["fill_"] == 2, (seen.syncs, seen.ops)
    with fake_cuda.fake_cuda_mode(), fake_cuda.HostSyncs() as seen:
        got = device_values([16032 * (r + 1) for r in range(8)], torch.int64, torch.device("cuda"))
    assert got.shape == (8,) and not seen.syncs and dict(seen.ops) == {"arange": 1}, seen.ops


def test_a_sync_over_budget_fails_the_check(monkeypatch):
    """policy_loss makes no host sync; with one added on its way (a `.item()` in validation), the check
    fails and names it."""
    import rlkernels._validate as v

    real = v.check_same_device

    def syncing(op, **tensors):
        device = real(op, **tensors)
        next(iter(tensors.values())).sum().item()
        return device

    monkeypatch.setattr(v, "check_same_device", syncing)
    outcome = fake_cuda.check_call("value_loss", "cuda")
    assert outcome.status == "FAILED" and "host syncs (_local_scalar_dense)" in outcome.detail


def test_an_assert_message_cuda_refuses_fails_the_check(monkeypatch):
    """CUDA refuses a torch._assert_async message of 255 bytes or more, at every call (the H200 run of
    6978e92: every policy_loss call failed so); fake tensors take any length, so the check refuses it for
    them, and reports a message that assert_async had to cut."""
    from rlkernels import _validate as v

    with fake_cuda.fake_cuda_mode(), fake_cuda.HostSyncs():
        ok = torch.ones((), dtype=torch.bool, device="cuda")
        torch._assert_async(ok, "x" * 254)
        with pytest.raises(RuntimeError, match="Message length must be smaller than 255"):
            torch._assert_async(ok, "x" * 255)
    # (policy_loss's flag, which this first took, is now asserted in its kernels: _device_assert)
    name = "linear_logprobs[no grad]"
    assert name in CALLS and fake_cuda.check_call(name, "triton").status == "ok"
    monkeypatch.setattr(v, "ASYNC_MESSAGE_BYTES", 32)  # its labels' range check's message no longer fits
    outcome = fake_cuda.check_call(name, "triton")
    assert outcome.status == "FAILED" and "cut to fit" in outcome.detail, outcome.detail
