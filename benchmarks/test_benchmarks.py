"""Every benchmark case, mode and provider as a pytest-benchmark test (small shapes, on CPU)."""

import importlib
import pathlib

import pytest
import torch
from harness import make_step

DEVICE = torch.device("cpu")


def _all_cases():
    for path in sorted(pathlib.Path(__file__).parent.glob("bench_*.py")):
        module = importlib.import_module(path.stem)
        yield from module.cases("small", DEVICE)


PARAMS = [
    pytest.param(case, provider, mode, id=f"{case.op}[{case.shape}]-{mode}-{provider.name}")
    for case in _all_cases()
    for mode in case.modes
    for provider in case.providers
]


@pytest.mark.parametrize("case,provider,mode", PARAMS)
def test_benchmark(benchmark, case, provider, mode):
    if provider.unavailable:
        pytest.skip(provider.unavailable)
    step = make_step(provider, case.make_inputs(), mode)
    benchmark(step)
