"""benchmarks/gpu_model.py's plans count what the paths they price do (the times are the model's, checked
against GPU runs in its report, not here)."""

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))
import gpu_model  # noqa: E402

N, V, D = 8192, 128256, 4096


@pytest.mark.parametrize("rows", [1024, 3000, 8192])
def test_loss_in_forward_plan_is_three_gemms_and_the_d_weight_round_trips(rows):
    plan, mib = gpu_model.plan_loss_in_forward(N, V, D, rows)
    blocks = -(-N // rows)
    assert sum(2 * m * n * k for m, n, k, *_ in plan.gemms) == 3 * 2 * N * V * D
    fp32_sum = sum(g[4] for g in plan.gemms if len(g) == 5)
    assert fp32_sum == V * D * 4 + (blocks - 1) * 2 * V * D * 4  # written once, then read and written a block
    gradients, accumulator, block = N * D * 2 + V * D * 2, V * D * 4, rows * V * 4
    assert mib == (gradients + accumulator + block) / 2**20
    assert mib > gpu_model.LIGER_LINEAR_WORKING_MIB  # the fp32 sum alone is over Liger's working memory


@pytest.mark.parametrize("plan", [gpu_model.plan_cuda_slices, gpu_model.plan_cuda_blocked])
@pytest.mark.parametrize("mode,gemms", [("no_grad", 1), ("full", 4)])
def test_cuda_linear_plans_price_the_gemms_and_the_row_kernels(plan, mode, gemms):
    """The CUDA C++ flavor's paths, before and since its blocks: the GEMMs' FLOPs are those of `gemms`
    products of the logits' size, and the row kernels read every logit once a pass (the forward's
    statistics; the backward's gradient, which also writes d z in bf16)."""
    p = plan(N, V, D, mode)
    assert sum(2 * m * n * k for m, n, k, *_ in p.gemms) == gemms * 2 * N * V * D
    assert {kind for *_, kind in p.epilogues} <= set(gpu_model.CUDA_ROW_RATES)
    per_logit = 4 if mode == "no_grad" else 4 + (4 + 2)
    assert sum(b for b, *_ in p.epilogues) == N * V * per_logit
