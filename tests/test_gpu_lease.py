"""benchmarks/gpu_lease.py, the one call a lent GPU gets (15 minutes, machine start included): every test file
it names exists, and every op its bench steps name is a case of `python -m rlkernels bench --shapes llm`, so
that a typo cannot cost a step of that call (the bench exits on an unknown op)."""

import pathlib
import sys

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import gpu_lease  # noqa: E402

from rlkernels import cli  # noqa: E402


def _bench_ops(step_command: list[str]) -> list[str]:
    """The ops after --ops in a bench step's command line."""
    if "--ops" not in step_command:
        return []
    ops = []
    for arg in step_command[step_command.index("--ops") + 1 :]:
        if arg.startswith("--"):
            break
        ops.append(arg)
    return ops


def test_the_tests_it_runs_exist():
    for path in gpu_lease.FIRST_TESTS:
        assert (ROOT / path).exists(), path


def test_every_bench_op_it_names_is_a_case_at_llm_shapes(tmp_path):
    before, after = gpu_lease.plan(tmp_path)
    steps = [step for step, _ in before + after + gpu_lease.after_tests(tmp_path)]
    named = [op for step in steps if "bench" in step.command for op in _bench_ops(step.command)]
    assert set(gpu_lease.TOKEN_OPS) <= set(named) and set(gpu_lease.ESTIMATOR_OPS) <= set(named)
    known = {c.op for m in cli._bench_modules() for c in m.cases("llm", torch.device("cuda"))}
    assert set(named) <= known, sorted(set(named) - known)


def test_skip_leaves_out_the_steps_it_names_and_rejects_a_typo(capsys):
    assert gpu_lease.main(["--dry-run", "--skip", "sweep", "tests", "host-time"]) == 0
    listed = [line.split()[2].rstrip(":") for line in capsys.readouterr().out.splitlines()]
    assert listed == [s for s in gpu_lease.slugs(ROOT) if s not in ("sweep", "tests", "host-time")]
    try:
        gpu_lease.main(["--dry-run", "--skip", "swep"])
    except SystemExit as exit:
        assert exit.code == 2
    else:
        raise AssertionError("--skip swep was accepted")
    assert "no step ['swep']" in capsys.readouterr().err
