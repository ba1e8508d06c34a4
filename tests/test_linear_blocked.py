"""The Triton flavor's GPU path of linear_logprobs (rlkernels/triton/linear_blocked.py: cuBLAS GEMMs into an
L2-sized logits block, Triton epilogues), checked on CPU tensors: the same epilogue kernels under Triton's
interpreter, the GEMMs as torch.mm (fp32 accumulation of the upcast operands, what cuBLAS computes), against
the float64 reference by the error rule, with small blocks so that every loop runs several times."""

import pytest
import torch
from oracle import DTYPES, assert_oracle, kernel_flavors
from test_linear_logprobs import make_case, run

from rlkernels.triton import linear_blocked

TRITON = [f for f in kernel_flavors() if f.kind == "triton" and f.device.type == "cpu"]


@pytest.fixture
def blocked(monkeypatch):
    """The blocked path on CPU tensors, with blocks of 16 rows x 96 columns (several row blocks and slices at
    these sizes, a ragged last one of each) and backward slices of 80 columns."""
    monkeypatch.setitem(linear_blocked.USE_ON, "cpu", True)
    monkeypatch.setattr(linear_blocked, "FORWARD_ROWS", 16)
    monkeypatch.setattr(linear_blocked, "MIN_COLS", 1)
    monkeypatch.setattr(linear_blocked, "BLOCK_BYTES", 16 * 96 * 4)
    monkeypatch.setattr(linear_blocked, "DZ_BUDGET_BYTES", 41 * 80 * 2)
    calls = {"forward": 0, "backward": 0}
    for name, key in (("forward_blocks", "forward"), ("backward_blocks", "backward")):
        real = getattr(linear_blocked, name)

        def counted(*args, real=real, key=key, **kwargs):
            calls[key] += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(linear_blocked, name, counted)
    return calls


OPTIONS = {
    "plain": dict(),
    "bias+softcap+temperature+entropy": dict(bias=True, softcap=7.0, temperature=0.8, return_entropy=True),
    "ignored rows+sum_pi_squared": dict(ignore=True, return_sum_pi_squared=True),
}


@pytest.mark.parametrize("option", list(OPTIONS))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend", TRITON)
def test_blocked_path_matches_float64_reference(backend, dtype, option, blocked, seed):
    kw = dict(OPTIONS[option])
    case_kw = {k: kw.pop(k) for k in ("bias", "ignore") if k in kw}
    hidden, weight, bias, labels = make_case((41,), 24, 301, dtype, **case_kw)
    g_logp = torch.randn(41, dtype=torch.float64)
    g_ent = torch.randn(41, dtype=torch.float64) if kw.get("return_entropy") else None
    cast = lambda t: None if t is None else t.to(dtype)  # noqa: E731
    got = run(hidden, weight, bias, labels, cast(g_logp), cast(g_ent), backend=backend, **kw)
    same = run(hidden, weight, bias, labels, cast(g_logp), cast(g_ent), backend="reference", **kw)
    up = lambda t: None if t is None else t.double()  # noqa: E731
    want = run(up(hidden), up(weight), up(bias), labels, g_logp, g_ent, backend="reference", **kw)
    names = ("logp", "entropy", "d hidden", "d weight", "d bias", "sum_pi_squared")
    assert blocked == {"forward": 1, "backward": 1}  # the blocked path ran, not the fused kernels
    for name, g, s, w in zip(names, got, same, want, strict=False):
        if w is None:
            assert g is None
            continue
        assert_oracle(f"{backend}/{option}/{name}", g, s, w)


def test_block_shapes_fit_the_budgets():
    """The forward's logits block and the backward's (rows, columns) stay inside BLOCK_BYTES / the d z
    budget at LLM sizes, with blocks tall and wide enough for cuBLAS."""
    rows, cols = linear_blocked.forward_shape(8192, 128256, None)
    assert rows * cols * 4 <= linear_blocked.BLOCK_BYTES and rows >= 1024 and cols >= 1024
    rows, cols = linear_blocked.backward_shape(8192, 128256, 2, None)
    assert 8192 * cols * 2 <= linear_blocked.DZ_BUDGET_BYTES and rows * cols * 4 <= linear_blocked.BLOCK_BYTES
