"""Which kernel flavors this test session runs and why any are left out, for pytest's header (conftest.py):
the number of tests depends on the machine (a flavor multiplies the oracle tests), so the run says what it
covered. The decisions are oracle.kernel_flavors()'s; tests/test_flavor_report.py holds the two together."""

from __future__ import annotations

import os

import oracle

from rlkernels import _backend, _ext

# Every flavor tests/oracle.py knows, in the order kernel_flavors() lists them.
ALL_FLAVORS = ("cpu", "cuda", "triton", "triton-interpret", "cuda-on-cpu")


def _interpreter_reason() -> str | None:
    if not _backend.triton_installed():
        return "triton is not installed"
    if not _backend.triton_interpreting():
        return "TRITON_INTERPRET is not 1"
    if not oracle.interpreter_usable():
        import triton

        need = ".".join(map(str, oracle.MIN_INTERPRETER_TRITON))
        return (
            f"triton {triton.__version__} is older than {need}, whose interpreter these kernels need "
            "(python -m rlkernels compile-check still builds them)"
        )
    return None


def flavor_status() -> dict[str, str | None]:
    """Every flavor: None where it runs in this session, else why it is left out."""
    status: dict[str, str | None] = {
        "cpu": None if _ext.ext_available() else f"the C++ extension is not loaded ({_ext.ext_error()})"
    }
    if oracle.gpu_present():
        status["cuda"] = _ext.unavailable_reason(cuda=True)
        status["triton"] = None if _backend.triton_installed() else "triton is not installed"
        status["triton-interpret"] = "a GPU is present: Triton runs compiled there (the triton flavor)"
        status["cuda-on-cpu"] = "a GPU is present: the CUDA C++ kernels run on it (the cuda flavor)"
    else:
        status["cuda"] = "no GPU visible to torch"
        status["triton"] = "no GPU visible to torch (the triton-interpret flavor runs the kernels on the CPU)"
        status["triton-interpret"] = _interpreter_reason()
        registered = "cuda-on-cpu" in oracle._FLAVOR_CONTEXTS
        status["cuda-on-cpu"] = None if registered else "the CPU harness of the CUDA sources needs Linux"
    wanted = os.environ.get("RLK_TEST_FLAVORS")
    if wanted:
        names = {w.strip() for w in wanted.split(",") if w.strip()}
        for name in ALL_FLAVORS:
            if status[name] is None and name not in names:
                status[name] = f"not in RLK_TEST_FLAVORS={wanted}"
    return status


def header_lines() -> list[str]:
    status = flavor_status()
    runs = [name for name in ALL_FLAVORS if status[name] is None]
    lines = [f"rlkernels kernel flavors: {', '.join(runs) or 'none'} (each oracle test runs once per flavor)"]
    lines += [f"  left out: {name}: {status[name]}" for name in ALL_FLAVORS if status[name] is not None]
    return lines
