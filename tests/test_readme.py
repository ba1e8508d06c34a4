"""The README stays true: its Python examples run, and its main-job command works (on one op, quickly)."""

import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_python_examples_run():
    blocks = re.findall(r"```python\n(.*?)```", README, flags=re.S)
    assert blocks, "the README has no Python example"
    for block in blocks:
        exec(compile(block, "README.md", "exec"), {})


def test_quickstart_has_the_two_commands():
    quickstart = README.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    commands = [line for line in quickstart.splitlines() if line.startswith("python3 -m venv")]
    assert len(commands) == 2
    assert commands[0].endswith("python -m rlkernels bench")
    assert commands[1].endswith("python -m pytest")


@pytest.mark.slow
def test_bench_command_runs(tmp_path):
    cmd = [
        sys.executable,
        "-m",
        "rlkernels",
        "bench",
        "--ops",
        "kl_penalty",
        "--modes",
        "no_grad",
        "--no-progress",
        "--out",
        str(tmp_path),
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "rlkernels[cpu]" in out.stdout and "eager" in out.stdout
    assert (tmp_path / "kl_penalty-cpu-small.csv").exists()
    assert (tmp_path / "kl_penalty-cpu-small.png").exists()
