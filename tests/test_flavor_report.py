"""pytest's header names the kernel flavors that run and why the others are left out (tests/flavor_report.py),
and agrees with the flavors the tests are parametrized with (oracle.kernel_flavors())."""

import flavor_report
import oracle
import pytest


def _runs() -> list[str]:
    status = flavor_report.flavor_status()
    return [name for name in flavor_report.ALL_FLAVORS if status[name] is None]


def test_the_header_lists_the_flavors_the_tests_run():
    assert _runs() == [f.name for f in oracle.kernel_flavors()]
    lines = flavor_report.header_lines()
    assert lines[0].startswith(f"rlkernels kernel flavors: {', '.join(_runs())} ")
    left_out = [name for name in flavor_report.ALL_FLAVORS if name not in _runs()]
    assert [line.split(":")[1].strip() for line in lines[1:]] == left_out


def test_an_old_triton_is_named_in_the_header(monkeypatch):
    """With triton < 3.9 the interpreter flavor drops out: the header says so and why."""
    triton = pytest.importorskip("triton")
    if oracle.gpu_present():
        pytest.skip("with a GPU, Triton runs compiled: the interpreter flavor is not used")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(triton, "__version__", "3.6.0")
    assert "triton-interpret" not in [f.name for f in oracle.kernel_flavors()]
    assert "triton-interpret" not in _runs()
    assert "  left out: triton-interpret: triton 3.6.0 is older than 3.9, whose interpreter" in "\n".join(
        flavor_report.header_lines()
    )


def test_flavors_restricted_by_the_environment_are_named(monkeypatch):
    monkeypatch.delenv("RLK_TEST_FLAVORS", raising=False)
    would_run = _runs()
    monkeypatch.setenv("RLK_TEST_FLAVORS", "cpu")
    assert _runs() == [f.name for f in oracle.kernel_flavors()] == [n for n in would_run if n == "cpu"]
    status = flavor_report.flavor_status()
    assert all(status[n] == "not in RLK_TEST_FLAVORS=cpu" for n in would_run if n != "cpu")


def test_pytest_prints_the_header(request):
    lines = [line for group in request.config.hook.pytest_report_header(
        config=request.config, start_path=request.config.rootpath
    ) for line in (group if isinstance(group, list) else [group])]  # fmt: skip
    assert flavor_report.header_lines()[0] in lines
