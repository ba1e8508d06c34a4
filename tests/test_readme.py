"""The README stays true: its Python examples run (each on its own, skipped where it needs a peer that is not
installed), and its main-job command works (on one op, quickly)."""

import pathlib
import re
import subprocess
import sys

import pytest
from peers import missing_peer

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
# The README's test command (Quickstart, command 2), which CI (.ci/run) runs.
TEST_COMMAND = "python -m pytest -n auto"
BLOCKS = re.findall(r"```python\n(.*?)```", README, flags=re.S)


def test_readme_has_python_examples():
    assert BLOCKS, "the README has no Python example"


@pytest.mark.parametrize("block", BLOCKS, ids=[f"example{i}" for i in range(len(BLOCKS))])
def test_python_examples_run(block, monkeypatch):
    """Each Python block of the README runs as it is, in a fresh namespace; a block that imports a peer
    (verl, TRL, ...: tests/peers.py) is skipped where that peer is not installed, the others still run."""
    peer = missing_peer(block)
    if peer is not None:
        pytest.skip(f"the README example imports {peer}, which is not installed (the [integrations] extra)")
    if "rk_verl.install()" in block:  # it changes verl's globals for the process: restored after the test
        from test_verl import _restored_after_install

        _restored_after_install(monkeypatch)
    exec(compile(block, "README.md", "exec"), {})


def test_quickstart_has_the_two_commands():
    quickstart = README.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    commands = [line for line in quickstart.splitlines() if line.startswith("python3 -m venv")]
    assert len(commands) == 2
    assert commands[0].endswith("python -m rlkernels bench")
    assert commands[1].endswith(TEST_COMMAND)


def test_ci_runs_the_readme_test_command():
    assert f"\n{TEST_COMMAND}\n" in (ROOT / ".ci" / "run").read_text()


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
