"""The Triton elementwise, reduction and scan kernels move at most 1.05x the bytes they must (README,
Benchmarks; counted under the interpreter by benchmarks/triton_traffic.py: a structural check, not a
timing)."""

import importlib
import pathlib
import sys

import pytest
from oracle import interpreter_usable

BENCH = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"


def _cases():
    if not interpreter_usable():
        return []
    sys.path.insert(0, str(BENCH))
    out = []
    for path in sorted(BENCH.glob("bench_*.py")):
        module = importlib.import_module(path.stem)
        if hasattr(module, "traffic_cases"):
            out += [c for c in module.traffic_cases() if c.max_ratio is not None]
    return out


@pytest.mark.skipif(
    not interpreter_usable(), reason="needs Triton's interpreter (TRITON_INTERPRET=1, triton>=3.9)"
)
@pytest.mark.parametrize("case", _cases(), ids=lambda c: f"{c.op}-{c.name}")
def test_triton_kernel_moves_minimum_bytes(case):
    import harness

    (row,) = harness.measure_traffic([case])
    assert row["ratio"] <= case.max_ratio, row
