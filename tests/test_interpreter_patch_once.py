"""The tests' shortcut through Triton's interpreter (tests/interpreter_patch_once.py): installed under the
interpreter of the Triton the tests pin, the language patched once per launch however many helpers the kernel
calls, and the kernels' answers bit for bit those of the interpreter's own path."""

import os

import interpreter_patch_once
import pytest
import torch

import rlkernels as rk

pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="the shortcut is for Triton's interpreter"
)


def test_installed_with_the_tests_triton():
    """Fails when a Triton update renames the interpreter's internals: the suite would run ~1.5x slower."""
    assert interpreter_patch_once.installed()


def _policy_loss(logp, old, adv, mask, ref):
    logp = logp.clone().requires_grad_()
    loss, stats = rk.policy_loss(logp, old, adv, mask, ref_logp=ref, kl_coef=0.1, backend="triton")
    loss.backward()
    return loss.detach(), logp.grad, {k: v for k, v in stats.items() if isinstance(v, torch.Tensor)}


def test_patches_once_per_launch_and_computes_the_same(monkeypatch):
    torch.manual_seed(0)
    b, t = 3, 37
    args = (torch.randn(b, t), torch.randn(b, t), torch.randn(b), torch.rand(b, t) > 0.3, torch.randn(b, t))
    patches = []
    original = interpreter_patch_once._original
    monkeypatch.setattr(interpreter_patch_once, "_original", lambda fn: patches.append(fn) or original(fn))
    got = _policy_loss(*args)
    launches = len(patches)
    assert launches >= 2  # forward and backward, each patched once
    try:
        interpreter_patch_once.uninstall()  # the interpreter's own _patch_lang: still counted
        want = _policy_loss(*args)
    finally:
        interpreter_patch_once.install()
    assert len(patches) - launches > 10 * launches  # its own path patches again at every helper's call
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert got[2].keys() == want[2].keys()
    for k in got[2]:
        assert torch.equal(got[2][k], want[2][k]), k
