"""`python -m rlkernels selftest`: on this GPU-less machine it refuses plainly; its dry run (the same steps on
the CPU) writes the report a GPU run would; the test step keeps only the tests with a kernel flavor; and a
step or the selftest itself stopped mid-run (its limit, SIGKILL, SIGTERM) still names every failure so far
with its message."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch

from rlkernels import selftest, selftest_ext, selftest_report

# A test file for the interruption tests: a deliberate failure, then a test that never ends by itself.
# STOP says how it does not end: "sleep" (a step's limit or a SIGTERM ends it) or "kill" (SIGKILL of its
# pytest, as a lease that ends would). It writes its pid, to check no process of the step outlives it.
INTERRUPTED_TESTS = """
import os, pathlib, signal, time

def test_a_deliberate_failure():
    assert 0.5 <= 1e-6, "deliberate: kernel error 0.5 above the bound 1e-6"

def test_b_never_ends():
    pathlib.Path(os.environ["PID_FILE"]).write_text(str(os.getpid()))
    if os.environ["STOP"] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(600)
"""
MESSAGE = "deliberate: kernel error 0.5 above the bound 1e-6"


def _interrupted_tests(tmp_path, monkeypatch, stop: str):
    test_file = tmp_path / "test_interrupted.py"
    test_file.write_text(INTERRUPTED_TESTS)
    monkeypatch.setenv("STOP", stop)
    monkeypatch.setenv("PID_FILE", str(tmp_path / "pid"))
    out = tmp_path / "selftest"
    out.mkdir()
    return selftest.Run(out, out / "report.md", dry_run=True), [str(test_file)]


def _assert_gone(pid_file):
    """The never-ending test's process was stopped with its step."""
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    pytest.fail(f"process {pid} of the stopped step is still running")


def _assert_failure_reported(run):
    failures = (run.out / "tests-failures.md").read_text()
    assert "test_a_deliberate_failure" in failures and MESSAGE in failures
    report = run.path.read_text()
    # the node id's directory depends on where the checkout lies against the temporary directory (a clone
    # under /tmp names it relative to /tmp): the file, the test and the message are what must be there
    assert f"test_interrupted.py::test_a_deliberate_failure`: AssertionError: {MESSAGE}" in report
    return report


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the GPU-less refusal")
def test_without_a_gpu_it_says_what_can_run_instead():
    done = subprocess.run([sys.executable, "-m", "rlkernels", "selftest"], capture_output=True, text=True)
    assert done.returncode == 2
    assert "no CUDA device" in done.stderr and "compile-check" in done.stderr


@pytest.mark.slow
def test_dry_run_writes_the_report(tmp_path):
    report = tmp_path / "report.md"
    done = subprocess.run(
        [sys.executable, "-m", "rlkernels", "selftest", "--dry-run", "--report", str(report)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    text = report.read_text()
    assert "| extension check | passed |" in text and "| tests with a kernel flavor | passed |" in text
    assert "| test_kl | cpu | float32 |" in text  # the table: test file x flavor x dtype
    assert "| memcheck (dry run: no sanitizer) | passed |" in text
    assert "| benchmark kl_penalty | passed |" in text
    assert json.loads((tmp_path / "extension.json").read_text())["problem"] is None


def test_flavored_only_keeps_exactly_the_tests_with_a_kernel_flavor():
    def collect(*options):
        return subprocess.Popen(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--collect-only"]
            + ["-p", "rlkernels.selftest_plugin", *options, "tests/test_kl.py"],
            cwd=selftest.REPO,
            env=dict(os.environ, RLK_TEST_FLAVORS="cpu"),
            stdout=subprocess.PIPE,
            text=True,
        )

    runs = collect(), collect("--rlk-flavored-only")
    every, kept = ({line for line in p.communicate()[0].splitlines() if "::" in line} for p in runs)
    assert kept and kept < every
    assert all(selftest_report.key_of(t)[1] == "cpu" for t in kept)
    assert all(selftest_report.key_of(t)[1] == "-" for t in every - kept)


def test_the_live_log_appends_each_outcome_and_failure(tmp_path):
    (tmp_path / "test_outcomes.py").write_text(
        textwrap.dedent(
            """
            import pytest

            def test_fails():
                assert 1 == 2, "kernel error 3e-2 above the bound 1e-3"

            def test_skips():
                pytest.skip("needs a GPU")

            @pytest.fixture
            def broken():
                raise RuntimeError("no CUDA context")

            def test_errors(broken):
                pass

            def test_passes():
                pass
            """
        )
    )
    live = tmp_path / "live"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "rlkernels.selftest_plugin"]
        + [f"--rlk-live={live}", str(tmp_path / "test_outcomes.py")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    entries = [json.loads(line) for line in (tmp_path / "live.jsonl").read_text().splitlines()]
    assert entries[0] == {"collected": 4}
    outcomes = {e["id"].split("::")[1]: (e["outcome"], e.get("message")) for e in entries[1:]}
    assert outcomes == {
        "test_fails": ("failed", "AssertionError: kernel error 3e-2 above the bound 1e-3\nassert 1 == 2"),
        "test_skips": ("skipped", "Skipped: needs a GPU"),
        "test_errors": ("error", "RuntimeError: no CUDA context"),
        "test_passes": ("passed", None),
    }
    failures = (tmp_path / "live-failures.md").read_text()
    assert "### test_outcomes.py::test_fails (failed in call)" in failures
    assert "### test_outcomes.py::test_errors (error in setup)" in failures
    assert 'raise RuntimeError("no CUDA context")' in failures  # the traceback's last lines


def test_a_step_cut_by_its_limit_still_names_its_failure(tmp_path, monkeypatch):
    run, targets = _interrupted_tests(tmp_path, monkeypatch, "sleep")
    step = selftest.tests_step(run, targets, "cpu", flavored_only=False, limit=15)
    assert step.state == "timed out"
    report = _assert_failure_reported(run)
    assert "| tests with a kernel flavor | TIMED OUT after" in report
    assert "1 of 2 tests reported; passed 0, failed 1" in report
    _assert_gone(tmp_path / "pid")


@pytest.mark.slow
def test_under_xdist_a_step_cut_by_its_limit_still_names_its_failure(tmp_path, monkeypatch):
    pytest.importorskip("xdist")
    run, targets = _interrupted_tests(tmp_path, monkeypatch, "sleep")
    step = selftest.tests_step(run, targets + ["-n", "2"], "cpu", flavored_only=False, limit=40)
    assert step.state == "timed out"
    _assert_failure_reported(run)
    _assert_gone(tmp_path / "pid")  # an xdist worker, in the step's process group


def test_a_step_killed_mid_run_still_names_its_failure(tmp_path, monkeypatch):
    run, targets = _interrupted_tests(tmp_path, monkeypatch, "kill")
    step = selftest.tests_step(run, targets, "cpu", flavored_only=False)
    assert step.state == "failed" and step.returncode == -signal.SIGKILL
    _assert_failure_reported(run)


def test_sigterm_of_the_selftest_stops_the_step_and_keeps_its_failures(tmp_path, monkeypatch):
    run, targets = _interrupted_tests(tmp_path, monkeypatch, "sleep")
    pid_file = tmp_path / "pid"

    def terminate_once_the_test_hangs():  # only then: a SIGTERM outside run_steps would end this pytest
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if pid_file.exists():
                os.kill(os.getpid(), signal.SIGTERM)  # as a lease's end would, to the selftest's process
                return
            time.sleep(0.05)

    later = []
    steps = [
        lambda run: selftest.tests_step(run, targets, "cpu", flavored_only=False, limit=120),
        lambda run: later.append(run),
    ]
    threading.Thread(target=terminate_once_the_test_hangs, daemon=True).start()
    status = selftest.run_steps(run, steps)
    assert status == 143 and not later  # the next step did not start
    report = _assert_failure_reported(run)
    assert "| tests with a kernel flavor | INTERRUPTED after" in report
    assert "STOPPED by signal SIGTERM" in report
    _assert_gone(pid_file)


def test_the_report_is_written_before_a_step_ends(tmp_path):
    """If the selftest is killed outright, the report names the step that was running."""
    run = selftest.Run(tmp_path, tmp_path / "report.md", dry_run=True)
    script = "import pathlib, sys; sys.stdout.write(pathlib.Path(sys.argv[1]).read_text())"
    step = selftest.Step("look at the report", "look", [sys.executable, "-c", script, str(run.path)])
    run.run(step, limit=30)
    seen = (tmp_path / "look.log").read_text()
    assert "| look at the report | RUNNING since" in seen
    assert "| look at the report | passed |" in run.path.read_text()


def test_a_step_past_the_run_deadline_is_skipped_not_started(tmp_path):
    run = selftest.Run(tmp_path, tmp_path / "report.md", dry_run=True, total=selftest.MIN_STEP / 2)
    step = run.run(selftest.Step("late", "late", [sys.executable, "-c", "raise SystemExit(1)"]), limit=60)
    assert step.state == "skipped" and "no time left" in step.note
    assert not (tmp_path / "late.log").exists()


def test_read_live_tabulates_file_flavor_and_dtype(tmp_path):
    jsonl = tmp_path / "tests.jsonl"
    lines = [
        {"collected": 5},
        {
            "id": "tests/test_kl.py::test_ref[cuda-bfloat16-k3-10.0-shape0]",
            "when": "call",
            "outcome": "passed",
        },
        {
            "id": "tests/test_kl.py::test_ref[triton-float16-k1-None-shape1]",
            "when": "call",
            "outcome": "failed",
            "message": "AssertionError: kernel error 1e-2 > 2.0e-3",
        },
        {"id": "tests/test_gae.py::test_empty[cuda]", "when": "setup", "outcome": "skipped", "message": "x"},
        {"id": "tests/test_gae.py::test_empty[cuda]", "when": "teardown", "outcome": "error", "message": "y"},
    ]
    jsonl.write_text("".join(json.dumps(e) + "\n" for e in lines) + '{"id": "tests/test_kl.py::cut sh')
    live = selftest_report.read_live(jsonl)
    assert live["table"][("test_kl", "cuda", "bfloat16")]["passed"] == 1
    assert live["table"][("test_kl", "triton", "float16")]["failed"] == 1
    assert live["table"][("test_gae", "cuda", "-")] == {"skipped": 1, "failed": 1}
    assert live["collected"] == 5 and live["reported"] == 3  # the teardown error is not a fourth test
    assert live["failures"][0] == (
        "tests/test_kl.py::test_ref[triton-float16-k1-None-shape1]",
        "AssertionError: kernel error 1e-2 > 2.0e-3",
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="the check must fail: it runs without a GPU here")
def test_a_broken_extension_is_built_here_for_this_gpus_arch(tmp_path, monkeypatch):
    """The wiring of step 1 on a GPU machine, with the build replaced by a command that shows its
    environment (the check fails here: no GPU)."""
    show_env = "import os; print('built with', os.environ['TORCH_CUDA_ARCH_LIST'], os.environ['MAX_JOBS'])"
    monkeypatch.setattr(selftest_ext, "device_arch", lambda: "9.0")
    monkeypatch.setattr(selftest_ext, "remove_built_library", lambda: [])  # keeps this checkout's library
    real_build_command = selftest_ext.build_command
    monkeypatch.setattr(
        selftest_ext,
        "build_command",
        lambda arch, cpus: ([sys.executable, "-c", show_env], real_build_command(arch, cpus)[1]),
    )
    run = selftest.Run(tmp_path, tmp_path / "report.md", dry_run=False)
    selftest.extension_steps(run)
    assert [s.name for s in run.steps] == [
        "extension check",
        "build the extension here",
        "extension check after the build",
    ]
    assert run.steps[0].state == "failed" and run.machine["problem"].startswith("the check itself failed")
    cpus = os.cpu_count()
    assert f"built with 9.0 {cpus}" in (tmp_path / "extension-build.log").read_text()
    assert "| build the extension here | passed |" in run.path.read_text()


def test_the_build_command_is_the_readme_install_without_an_index():
    cmd, env = selftest_ext.build_command("9.0", 16)
    assert cmd[1:] == ["-m", "pip", "install", "--no-build-isolation", "--no-deps", "--no-index", "-e", "."]
    assert env == {"RLKERNELS_CUDA": "1", "TORCH_CUDA_ARCH_LIST": "9.0", "MAX_JOBS": "16"}


CARRY = [sys.executable, str(selftest.REPO / ".ci" / "gpu-carry")]


def test_gpu_carry_prints_its_commands_for_the_lent_machine():
    done = subprocess.run(
        CARRY + ["--dry-run", "--arch", "8.0", "--torch", "2.12.0"], capture_output=True, text=True
    )
    if "no Python 3.12" in done.stderr:
        pytest.skip("no Python 3.12 here to build for the lent machines")
    assert done.returncode == 0, done.stderr
    assert "pip install -q torch==2.12.0 ninja setuptools" in done.stdout
    assert "RLKERNELS_CUDA=1 TORCH_CUDA_ARCH_LIST=8.0 " in done.stdout
    assert "strip --strip-debug rlkernels/_C.cpython-312" in done.stdout


def test_gpu_carry_refuses_a_python_the_lent_machines_do_not_run():
    done = subprocess.run(CARRY + ["--dry-run", "--python", "/bin/false"], capture_output=True, text=True)
    assert done.returncode == 2
    assert "/bin/false is Python (does not run); the lent machines run 3.12" in done.stderr
