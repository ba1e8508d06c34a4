"""The benchmark harness covers every public op with a kernel (benchmarks/bench_*.py), and a run asked for the
whole call (`--modes full`) times the constant ops (advantages, returns) in their forward mode: on the H200
run `bench --ops gae group_advantages --modes full` timed nothing."""

import importlib
import pathlib
import sys

import torch
from kernel_calls import KernelCalls

import rlkernels as rk
from rlkernels._errors import BackendUnavailableError
from rlkernels.fake_cuda.calls import CALLS, Maker

BENCH = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))
import harness  # noqa: E402


def _bench_ops() -> set[str]:
    ops = set()
    for path in sorted(BENCH.glob("bench_*.py")):
        ops |= {case.op for case in importlib.import_module(path.stem).cases("small", torch.device("cpu"))}
    return ops


def _ops_with_a_kernel() -> dict[str, list[str]]:
    """Public op -> the rlkernels ops one call of it runs on CPU tensors with backend="auto" (the C++ CPU
    kernels when the extension is built), for each call of the fake-CUDA catalogue that reaches one."""
    found = {}
    for label, call in CALLS.items():
        name = label.split("[")[0]
        mode = KernelCalls()
        try:
            with mode:
                call(Maker(torch.device("cpu")), "auto")
        except BackendUnavailableError:
            continue
        if mode.ops:
            found.setdefault(name, []).extend(mode.ops)
    return found


def test_every_public_op_with_a_kernel_has_a_bench_case():
    with_kernel = _ops_with_a_kernel()
    assert set(with_kernel) <= set(rk.__all__)
    if rk.ext_available():  # the native CPU kernels ran: the catalogue reached the token-level ops
        assert {"kl_penalty", "gae", "group_advantages", "rollout_correction", "logprobs_from_logits"} <= set(
            with_kernel
        ), sorted(with_kernel)
    missing = sorted(set(with_kernel) - _bench_ops())
    assert not missing, f"public ops with a kernel but no bench case (benchmarks/bench_*.py): {missing}"


def test_a_full_run_times_the_constant_ops_forward():
    def case(modes):
        return harness.Case("op", "shape", torch.float32, dict, [], modes=modes)

    constant, loss = case(("forward",)), case(("forward", "backward", "full"))
    assert harness.case_modes(constant, ["full"]) == ["forward"]
    assert harness.case_modes(constant, ["no_grad"]) == ["forward"]
    assert harness.case_modes(constant, ["backward"]) == []
    assert harness.case_modes(loss, ["full"]) == ["full"]
    assert harness.case_modes(loss, None) == ["forward", "backward", "full"]
    cases = [c for path in sorted(BENCH.glob("bench_*.py")) for c in importlib.import_module(path.stem).cases(
        "llm", torch.device("cpu")) if c.op in ("gae", "group_advantages")]  # fmt: skip
    assert cases and all(harness.case_modes(c, ["full"]) == ["forward"] for c in cases)
