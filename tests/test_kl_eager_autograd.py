"""kl_penalty's native flavor in plain eager mode runs rlkernels::kl_penalty_autograd, whose autograd node is
C++ (csrc/autograd/kl_penalty.cpp). It must be the Python formula of rlkernels/ops/kl.py exactly: the same
kernels, so the same bits, for every gradient request (both inputs, one, an upstream gradient expanded from
one element, retain_graph), kind, clamp and dtype. Under a dispatch mode the public function takes the
registered op instead; without a gradient the node records nothing."""

import pytest
import torch
from oracle import cpu_kernel_backends
from torch.utils._python_dispatch import TorchDispatchMode

import rlkernels as rk
import rlkernels.ops.kl as ops

NATIVE = [f for f in cpu_kernel_backends() if f.kind.startswith("native")]

pytestmark = pytest.mark.skipif(
    ops._native_eager is None, reason="the extension has no kl_penalty_autograd (built without it)"
)

KINDS = ("k1", "abs", "k2", "k3", "k1+", "k3+")
DTYPES = (torch.float32, torch.float64, torch.bfloat16)
# The C++ CPU kernels take every case; the emulated CUDA kernels k3 and k1+ in fp32.
CASES = [
    (backend, kind, dtype)
    for backend in NATIVE
    for kind in KINDS
    for dtype in DTYPES
    if backend.kind == "native-cpu" or (kind in ("k3", "k1+") and dtype == torch.float32)
]


def _requests(logp, ref, upstream):
    return [
        ("sum, both", lambda out: torch.autograd.grad(out.sum(), [logp, ref])),
        ("upstream, logp only", lambda out: torch.autograd.grad(out, [logp], upstream)),
        ("upstream, ref only", lambda out: torch.autograd.grad(out, [ref], upstream)),
        (
            "retain_graph, then both",
            lambda out: (
                torch.autograd.grad(out.sum(), [logp], retain_graph=True)
                + torch.autograd.grad(out, [logp, ref], upstream)
            ),
        ),
    ]


@pytest.mark.parametrize("clamp", [10.0, None])
@pytest.mark.parametrize("backend,kind,dtype", CASES)
def test_cpp_node_is_the_python_formula(backend, kind, dtype, clamp, monkeypatch, seed):
    logp = (-torch.rand(6, 41, dtype=torch.float64) * 3).to(dtype).requires_grad_()
    ref = (-torch.rand(6, 41, dtype=torch.float64) * 3).to(dtype).requires_grad_()
    upstream = torch.randn(6, 41, dtype=torch.float64).to(dtype)
    results = {}
    for path in ("cpp", "python"):
        if path == "python":
            monkeypatch.setattr(ops, "_native_eager", None)
        for name, request in _requests(logp, ref, upstream):
            out = rk.kl_penalty(logp, ref, kind, clamp=clamp, backend=backend)
            results[path, name] = (type(out.grad_fn).__name__, out, request(out))
    for name, _ in _requests(logp, ref, upstream):
        node, out, grads = results["cpp", name]
        py_node, py_out, py_grads = results["python", name]
        assert node == "CppFunction" and py_node != "CppFunction"
        assert torch.equal(out, py_out), name
        assert len(grads) == len(py_grads), name
        assert all(torch.equal(g, p) for g, p in zip(grads, py_grads, strict=True)), name


@pytest.mark.parametrize("backend", NATIVE)
def test_no_grad_and_inference_mode_record_nothing(backend):
    logp, ref = -torch.rand(5, 9), -torch.rand(5, 9)
    out = rk.kl_penalty(logp.requires_grad_(), ref, backend=backend)
    with torch.no_grad():
        no_grad = rk.kl_penalty(logp, ref, backend=backend)
    with torch.inference_mode():
        inference = rk.kl_penalty(logp.detach(), ref, backend=backend)
    assert out.requires_grad and not no_grad.requires_grad and not inference.requires_grad
    assert torch.equal(no_grad, out.detach()) and torch.equal(inference, out.detach())


class _Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


def test_a_dispatch_mode_sees_the_registered_op():
    logp, ref = (-torch.rand(5, 9)).requires_grad_(), -torch.rand(5, 9)
    with _Ops() as mode:
        out = rk.kl_penalty(logp, ref, backend="cpu")
    assert "rlkernels.kl_penalty.default" in mode.names, mode.names
    assert not any("kl_penalty_autograd" in name for name in mode.names)
    assert type(out.grad_fn).__name__ != "CppFunction"
