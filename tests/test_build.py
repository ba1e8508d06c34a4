"""The extension: built (unless RLKERNELS_NO_EXT=1), with CUDA kernels registered for every native op when
built with CUDA (CI builds with RLKERNELS_CUDA=1), and importing rlkernels never initializes CUDA."""

import os
import subprocess
import sys

import pytest
import torch

import rlkernels as rk
from rlkernels import _ext

NO_EXT = os.environ.get("RLKERNELS_NO_EXT", "") == "1"


def native_ops():
    """Every op the extension defines (the schemas in csrc/rlkernels.cpp)."""
    return sorted(
        name
        for name in torch._C._dispatch_get_all_op_names()
        if name.startswith("rlkernels::") and torch._C._dispatch_has_kernel_for_dispatch_key(name, "CPU")
    )


@pytest.mark.skipif(NO_EXT, reason="RLKERNELS_NO_EXT=1: pure-Python install")
def test_extension_is_built():
    assert rk.ext_available(), f"the C++ extension failed to load: {_ext.ext_error()}"
    info = rk.build_info()
    assert info["version"] == rk.__version__
    assert info["num_threads"] >= 1


# Native ops that exist for the CPU only: policy_loss's eager backward fuses two passes there, where each pass
# and each dispatch costs; on a GPU the functional ops serve (rlkernels/ops/policy_loss.py _consume_saved).
# The row sweep's in-place softmax gradient saves a block of memory and its page faults on the CPU; a GPU's
# caching allocator reuses the block (rlkernels/ops/linear_sweep.py).
CPU_ONLY_OPS = {
    "rlkernels::policy_loss_backward_into_saved",
    "rlkernels::logprobs_from_logits_backward_into_logits",
}


@pytest.mark.skipif(NO_EXT, reason="RLKERNELS_NO_EXT=1: pure-Python install")
def test_every_native_op_has_cpu_and_cuda_kernels():
    ops = native_ops()
    assert "rlkernels::kl_penalty" in ops and "rlkernels::kl_penalty_backward" in ops
    if os.environ.get("RLKERNELS_CUDA") == "1":
        assert rk.build_info()["cuda"], "RLKERNELS_CUDA=1 but the extension has no CUDA kernels"
    if not rk.build_info()["cuda"]:
        pytest.skip("built without CUDA")
    missing = [
        op for op in ops
        if op not in CPU_ONLY_OPS and not torch._C._dispatch_has_kernel_for_dispatch_key(op, "CUDA")
    ]  # fmt: skip
    assert not missing, f"native ops without a CUDA kernel: {missing}"
    for op in CPU_ONLY_OPS:
        assert torch._C._dispatch_has_kernel_for_dispatch_key(op, "CPU"), op
    assert "9.0" in rk.build_info()["cuda_archs"] or os.environ.get("TORCH_CUDA_ARCH_LIST")


def test_import_does_not_touch_the_gpu():
    code = "import torch, rlkernels; assert not torch.cuda.is_initialized(); print('ok')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "ok"


def test_python_m_rlkernels_info():
    out = subprocess.run(
        [sys.executable, "-m", "rlkernels", "info"], capture_output=True, text=True, check=True
    )
    assert "rlkernels" in out.stdout and "reference" in out.stdout
