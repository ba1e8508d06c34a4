"""policy_loss's native flavor in plain eager mode runs rlkernels::policy_loss_autograd, whose autograd node
is C++ (csrc/autograd/policy_loss.cpp). It must be the Python formula of rlkernels/ops/policy_loss.py exactly:
the same kernels in the same order, so the same bits, for every gradient request (both inputs, one, an
upstream scale, retain_graph, where the saved buffer must not be consumed), dtype and option. Under a
dispatch mode the public function takes the registered op instead."""

import pytest
import torch
from eager_autograd import (
    NATIVE,
    assert_a_dispatch_mode_sees_the_registered_op,
    assert_no_grad_and_inference_mode_record_nothing,
    cases,
    needs_eager_op,
)
from policy_inputs import make_inputs

import rlkernels as rk
import rlkernels.ops.policy_loss as ops

pytestmark = needs_eager_op(ops, "policy_loss_autograd")

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


MAIN = next(iter(OPTIONS))
# The emulated CUDA kernels: the main options in fp32 and bf16 (whose fp32 saved buffer is not consumed),
# and a call without entropy.
CASES = cases(OPTIONS, {(MAIN, torch.float32), (MAIN, torch.bfloat16), ("cispo, no entropy", torch.float32)})


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

    def call(detach):
        inputs = {k: v.detach() for k, v in x.items()} if detach else x
        return rk.policy_loss(**inputs, backend=backend)[0]

    assert_no_grad_and_inference_mode_record_nothing(call)


def test_a_dispatch_mode_sees_the_registered_op():
    x = _inputs(torch.float32, {})
    assert_a_dispatch_mode_sees_the_registered_op(
        "policy_loss", lambda: rk.policy_loss(**x, backend="cpu")[0]
    )
