"""policy_loss's native flavor in plain eager mode runs rlkernels::policy_loss_autograd, whose autograd node
is C++ (csrc/autograd/policy_loss.cpp). It must be the Python formula of rlkernels/ops/policy_loss.py exactly:
the same kernels in the same order, so the same bits, for every gradient request (both inputs, one, an
upstream scale, retain_graph, where the saved buffer must not be consumed), dtype and option. Under a
dispatch mode the public function takes the registered op instead."""

import pytest
import torch
from oracle import cpu_kernel_backends
from policy_inputs import make_inputs
from torch.utils._python_dispatch import TorchDispatchMode

import rlkernels as rk
import rlkernels.ops.policy_loss as ops

NATIVE = [f for f in cpu_kernel_backends() if f.kind.startswith("native")]

pytestmark = pytest.mark.skipif(
    ops._native_eager is None, reason="the extension has no policy_loss_autograd (built without it)"
)

# label -> (options, is_weights: None / "row" / "token", with entropy)
FULL = dict(clip_low=0.2, clip_high=0.28, dual_clip=3.0, kl_coef=0.1, entropy_coef=0.01)
OPTIONS = {
    "clip dual kl entropy": (FULL, None, True),
    "seq-mean-token-mean, per-token IS": (dict(agg="seq-mean-token-mean", kl_coef=0.1), "token", True),
    "gspo, per-row IS": (dict(level="sequence", agg="seq-mean-token-mean", entropy_coef=0.01), "row", True),
    "cispo, no entropy": (dict(objective="cispo", kl_coef=0.05), None, False),
    "geo_mean": (dict(objective="geo_mean", agg="seq-mean-token-mean", entropy_coef=0.02), None, True),
}


def _requests(x):
    """(name, what a call differentiates): every way a trainer asks for the gradients."""
    both = [x["logp"]] + ([x["entropy"]] if "entropy" in x else [])
    return [
        ("both", lambda loss: torch.autograd.grad(loss, both)),
        ("upstream x3", lambda loss: torch.autograd.grad(loss * 3, both)),
        ("logp only", lambda loss: torch.autograd.grad(loss, [x["logp"]])),
        ("entropy only", lambda loss: torch.autograd.grad(loss, both[1:]) if len(both) > 1 else ()),
        (
            "retain_graph, then both",  # the first pass must leave the saved buffer for the second
            lambda loss: torch.autograd.grad(loss, both, retain_graph=True) + torch.autograd.grad(loss, both),
        ),
    ]


def _inputs(dtype, options, isw=None, entropy=True):
    x = make_inputs(4, 53, dtype, options, isw=isw)
    if not entropy:
        x.pop("entropy")
    for name in ("logp", "entropy"):
        if name in x:
            x[name].requires_grad_(True)
    return x


DTYPES = (torch.float32, torch.float64, torch.bfloat16)
# The C++ CPU kernels take every case; the emulated CUDA kernels (seconds a call) the main options in fp32 and
# bf16 (whose fp32 saved buffer is not consumed) and a call without entropy.
CASES = [
    (backend, label, dtype)
    for backend in NATIVE
    for label in OPTIONS
    for dtype in DTYPES
    if backend.kind == "native-cpu"
    or (label, dtype) in {(next(iter(OPTIONS)), torch.float32), (next(iter(OPTIONS)), torch.bfloat16)}
    or (label == "cispo, no entropy" and dtype == torch.float32)
]


@pytest.mark.parametrize("backend,label,dtype", CASES)
def test_cpp_node_is_the_python_formula(backend, label, dtype, monkeypatch, seed):
    options, isw, entropy = OPTIONS[label]
    x = _inputs(dtype, options, isw, entropy)
    results = {}
    for path in ("cpp", "python"):
        if path == "python":
            monkeypatch.setattr(ops, "_native_eager", None)
        for name, request in _requests(x):
            loss, stats = rk.policy_loss(**x, **options, backend=backend)
            grads = request(loss)
            results[path, name] = (type(loss.grad_fn).__name__, loss, stats, grads)
    for name, _ in _requests(x):
        node, loss, stats, grads = results["cpp", name]
        py_node, py_loss, py_stats, py_grads = results["python", name]
        assert node == "CppFunction" and py_node != "CppFunction"
        assert torch.equal(loss, py_loss), name
        assert stats.keys() == py_stats.keys() and all(torch.equal(stats[k], py_stats[k]) for k in stats), (
            name
        )
        assert len(grads) == len(py_grads) and all(
            torch.equal(g, p) for g, p in zip(grads, py_grads, strict=True)
        ), name


@pytest.mark.parametrize("backend", NATIVE)
def test_no_grad_and_inference_mode_record_nothing(backend):
    x = _inputs(torch.float32, {})
    loss, _ = rk.policy_loss(**x, backend=backend)
    with torch.no_grad():
        no_grad, _ = rk.policy_loss(**x, backend=backend)
    with torch.inference_mode():
        inference, _ = rk.policy_loss(**{k: v.detach() for k, v in x.items()}, backend=backend)
    assert loss.requires_grad and not no_grad.requires_grad and not inference.requires_grad
    assert torch.equal(no_grad, loss.detach()) and torch.equal(inference, loss.detach())


class _Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


def test_a_dispatch_mode_sees_the_registered_op():
    """Under a dispatch mode (fake tensors, the GPU cost counter) the public function calls the registered
    op, with its fake kernel and Python autograd formula, never the eager one."""
    x = _inputs(torch.float32, {})
    with _Ops() as mode:
        loss, _ = rk.policy_loss(**x, backend="cpu")
    assert "rlkernels.policy_loss.default" in mode.names, mode.names
    assert not any("policy_loss_autograd" in name for name in mode.names)
    assert type(loss.grad_fn).__name__ != "CppFunction"
