"""Backend selection: auto picks the C++ kernel on CPU tensors (reference without the extension); an
explicitly requested backend that cannot run raises a clear error, never a silent fallback."""

import pytest
import torch

import rlkernels as rk
from rlkernels import _backend, _ext
from rlkernels._backend import select_backend

CPU = torch.device("cpu")


def test_auto_on_cpu_prefers_the_cpp_kernel():
    want = "cpu" if _ext.ext_available() else "reference"
    assert select_backend("kl_penalty", "auto", CPU, implemented=("cpu", "triton")) == want
    assert select_backend("kl_penalty", "auto", CPU, implemented=("triton",)) == "reference"


def test_auto_on_other_devices_is_reference():
    assert (
        select_backend("kl_penalty", "auto", torch.device("meta"), implemented=("cpu", "triton", "cuda"))
        == "reference"
    )


def test_unknown_backend_is_a_value_error():
    with pytest.raises(ValueError, match="backend must be one of"):
        select_backend("kl_penalty", "fast", CPU, implemented=("cpu",))


def test_unimplemented_backend_is_named():
    with pytest.raises(rk.BackendUnavailableError, match="not implemented for this op"):
        select_backend("kl_penalty", "cuda", CPU, implemented=("cpu",))


def test_cuda_backend_on_cpu_tensors_raises():
    with pytest.raises(rk.BackendUnavailableError, match="CUDA tensors"):
        rk.kl_penalty(torch.zeros(3), torch.zeros(3), backend="cuda")


def test_triton_on_cpu_needs_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(rk.BackendUnavailableError, match="TRITON_INTERPRET=1"):
        rk.kl_penalty(torch.zeros(3), torch.zeros(3), backend="triton")


def test_cpu_backend_without_extension_names_the_fix(monkeypatch):
    monkeypatch.setattr(_ext, "_load", lambda: (None, ImportError("not built"), {}))
    with pytest.raises(rk.BackendUnavailableError, match="pip install --no-build-isolation"):
        rk.kl_penalty(torch.zeros(3), torch.zeros(3), backend="cpu")
    assert select_backend("kl_penalty", "auto", CPU, implemented=("cpu",)) == "reference"


def test_backends_tuple():
    assert rk.BACKENDS == ("auto", "triton", "cuda", "cpu", "reference")
    assert _backend.unavailable_reason("reference", torch.device("meta")) is None


def test_gpu_order_names_every_op_and_follows_the_gpu_run():
    """backend="auto" on CUDA tensors follows _backend.GPU_ORDER: an entry for every op that selects a
    backend, Triton first until a GPU run shows a CUDA C++ kernel correct and faster (docs/backends.md). The
    first H200 run showed it for kl_penalty and policy_loss; the second for value_loss, group_advantages, gae
    (hence discounted_returns, the same scans) and rollout_correction, and the Triton flavor ahead for
    linear_logprobs without a gradient too (GPU_ORDER_BY_MODE); the fourth (2026-11-30) for
    logprobs_from_logits, grpo_passk, opo and optimal_token_baseline; the fifth (2026-11-30) for agg_loss."""
    measured_cuda_first = {
        "kl_penalty", "policy_loss", "value_loss", "group_advantages", "gae", "discounted_returns",
        "rollout_correction", "logprobs_from_logits", "grpo_passk", "opo", "optimal_token_baseline",
        "agg_loss",
    }  # fmt: skip
    for op, order in _backend.GPU_ORDER.items():
        if not order:  # reference-only ops
            continue
        first = "cuda" if op in measured_cuda_first else "triton"
        assert set(order) <= {"triton", "cuda"} and order[0] == first, (op, order)
        if _backend.triton_installed():
            got = _backend.select_backend(op, "auto", torch.device("cuda"), implemented=("triton", "cuda"))
            assert got == first
    assert _backend.GPU_ORDER_BY_MODE == {
        "linear_logprobs:no_grad": ("triton", "cuda"),
        "linear_logprobs:grad": ("triton", "cuda"),
    }
    cuda = torch.device("cuda")
    pick = lambda mode: _backend.select_backend(  # noqa: E731
        "linear_logprobs", "auto", cuda, implemented=("triton", "cuda"), mode=mode
    )
    if _backend.triton_installed():
        assert (pick("no_grad"), pick("grad"), pick(None)) == ("triton", "triton", "triton")
    assert set(_backend.GPU_ORDER) == {
        "kl_penalty", "policy_loss", "value_loss", "group_advantages", "gae", "discounted_returns",
        "linear_logprobs", "logprobs_from_logits", "dpo_loss", "rollout_correction", "dynamic_sampling",
        "overlong_penalty", "grpo_passk", "opo", "optimal_token_baseline", "agg_loss",
    }  # fmt: skip
