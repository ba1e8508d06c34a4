"""`python -m rlkernels selftest`: everything that needs a GPU, in one command, into one report.

On a machine with a CUDA GPU, from a source checkout (docs/selftest.md), in this order:
  1. the extension: it loads and runs a CUDA C++ kernel here, or it is built here for this GPU's arch;
  2. the tests that have a kernel flavor, with the GPU flavors (`cuda`: the CUDA C++ kernels, `triton`: the
     Triton kernels compiled for the GPU) on CUDA tensors, against the float64 reference;
  3. compute-sanitizer memcheck over `python -m rlkernels.gpu_workload` (both GPU flavors), then
  4. racecheck over the CUDA C++ kernels;
  5. `python -m rlkernels bench --device cuda` on the elementwise headline ops, one step per op.
Each step has its own time limit and the whole run a deadline, inside 8 minutes on a lent H100 or H200.
The report (build/selftest/report.md) is rewritten when each step starts and ends, and the test step
appends each outcome to its own files as it happens (rlkernels/selftest_plugin.py), so that a run killed at
any point still names every failure so far with its message.

Without a GPU it exits with status 2, unless `--dry-run`: the same steps on the CPU with tiny selections,
to check this command itself (tests/test_selftest.py).
"""

from __future__ import annotations

import datetime
import functools
import importlib.util
import json
import os
import pathlib
import shutil
import sys
import time

from rlkernels import selftest_ext
from rlkernels import selftest_report as report
from rlkernels.selftest_process import REPO, Interrupted, Step, run_step, sigterm_interrupts

# The whole run: 8 minutes on a lent machine, less the interpreter's start, the report and a margin.
TOTAL_LIMIT = 450
# Each step's own limit (seconds). A step also stops at the run's deadline, so one that takes long (a build)
# takes its time from the steps after it, which are the less informative ones.
CHECK_LIMIT = 60  # imports torch and runs one op, creating the first CUDA context
BUILD_LIMIT = 200  # the CUDA sources for this GPU's arch only, one compile per CPU
TESTS_LIMIT = 240  # the flavored two thirds of the suite on every CPU; Triton compiles on first use
MEMCHECK_LIMIT = 60  # every op x dtype through both GPU flavors, each launch slowed by the sanitizer
RACECHECK_LIMIT = 45  # the CUDA C++ calls only: they share memory in a block (Triton's compiler owns its own)
BENCH_LIMIT = 60  # per op: torch.compile of the eager baseline at each shape, then 3 rounds of each provider
TEST_TIMEOUT = 90  # per test (pytest-timeout): a hung test frees its worker; a compile test competes for CPUs
MIN_STEP = 10  # a step with less time left is skipped: starting its interpreter would use most of it
# cuda vs triton on the elementwise ops, one step each (the bench prints its table only at its end), the
# cheaper first; linear_logprobs at LLM sizes does not fit (torch.compile and autotuning at each shape).
BENCH_OPS = ("kl_penalty", "policy_loss")
DRY_TESTS = ["tests/test_kl.py", "-k", "matches_float64_reference and float32 and k3"]  # a quick selection


class Run:
    """One selftest run: its directory, its deadline and its steps; the report is rewritten whole when a step
    starts and when it ends."""

    def __init__(self, out: pathlib.Path, path: pathlib.Path, dry_run: bool, total: float = TOTAL_LIMIT):
        self.out, self.path, self.dry_run = out, path, dry_run
        self.deadline = time.monotonic() + total
        self.steps: list[Step] = []
        self.machine: dict = {}  # rlkernels.selftest_ext's answer
        self.stopped = ""

    def run(self, step: Step, limit: float) -> Step:
        self.steps.append(step)
        step.limit = min(limit, self.deadline - time.monotonic())
        if step.limit < MIN_STEP:
            step.state = "skipped"
            step.note += ("; " if step.note else "") + "no time left before the run's deadline"
            self.write()
            return step
        for stale in (f"{step.slug}.jsonl", f"{step.slug}-failures.md"):
            (self.out / stale).unlink(missing_ok=True)
        step.state, step.started = "running", datetime.datetime.now().strftime("%H:%M:%S")
        self.write()
        try:
            run_step(step, self.out)
        finally:
            self.write()
        return step

    def environment(self) -> list[str]:
        m = self.machine
        lines = [f"date: {datetime.datetime.now().isoformat(timespec='seconds')}, {os.cpu_count()} CPUs"]
        if "torch" in m:
            lines.append(
                f"python {m['python']}, torch {m['torch']} (CUDA {m['torch_cuda']}), triton {m['triton']}"
            )
        if m.get("gpu"):
            lines.append(f"GPU: {m['gpu']}")
        if "ext_cuda" in m:
            lines.append(f"extension: CUDA kernels {m['ext_cuda']} (archs {m['ext_archs'] or '-'})")
        if m.get("problem"):
            lines.append(f"extension problem: {m['problem']}")
        if self.stopped:
            lines.append(f"STOPPED by {self.stopped}: the steps after the interrupted one did not run")
        return lines

    def write(self) -> None:
        lines = ["# rlkernels selftest" + (" (dry run on CPU)" if self.dry_run else ""), ""]
        lines += [f"- {e}" for e in self.environment()]
        lines += ["", "| step | status | seconds | limit | note |", "|---|---|---|---|---|"]
        lines += [
            f"| {s.name} | {s.status} | {s.seconds:.0f} | {s.limit:.0f} | {s.note} |" for s in self.steps
        ]
        for s in self.steps:
            if s.tests and s.state != "skipped":
                live = report.read_live(self.out / f"{s.slug}.jsonl")
                lines += report.tests_section(s.name, live, f"{s.slug}-failures.md")
        for s in self.steps:
            lines += report.output_section(s.name, s.command, self.out / f"{s.slug}.log")
        report.write_atomic(self.path, "\n".join(lines) + "\n")


def extension_steps(run: Run) -> None:
    """The carried extension loads and runs a CUDA C++ kernel here; if not, build it here and check again."""
    device = "cpu" if run.dry_run else "cuda"
    answer = run.out / "extension.json"

    def check(name: str, slug: str) -> Step:
        answer.unlink(missing_ok=True)
        cmd = [sys.executable, "-m", "rlkernels.selftest_ext", "--device", device, "--out", str(answer)]
        step = Step(name, slug, cmd)
        run.run(step, CHECK_LIMIT)
        run.machine = json.loads(answer.read_text()) if answer.exists() else {}
        step.note = run.machine.get("problem") or ("usable" if step.state == "passed" else "")
        run.write()
        return step

    if check("extension check", "extension-check").state in ("passed", "skipped"):
        return
    if run.dry_run:
        run.steps[-1].note += "; a GPU run would build it here"
        run.write()
        return
    arch = run.machine.get("device_arch") or selftest_ext.device_arch()
    cpus = os.cpu_count() or 1
    cmd, env = selftest_ext.build_command(arch, cpus)
    removed = selftest_ext.remove_built_library()
    note = f"TORCH_CUDA_ARCH_LIST={arch} MAX_JOBS={cpus}" + (
        f"; removed {removed[0].name}" if removed else ""
    )
    run.run(
        Step("build the extension here", "extension-build", cmd, {**os.environ, **env}, note), BUILD_LIMIT
    )
    check("extension check after the build", "extension-recheck")


def tests_step(run: Run, targets: list[str], flavors: str, *, flavored_only=True, limit=TESTS_LIMIT) -> Step:
    """pytest over `targets` with the test flavors `flavors`; each outcome is appended to tests.jsonl and
    each failure to tests-failures.md as it happens."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--tb=short"]
    cmd += ["-p", "rlkernels.selftest_plugin", f"--rlk-live={run.out / 'tests'}"]
    cmd += ["--rlk-flavored-only"] if flavored_only else []
    if not run.dry_run:
        if importlib.util.find_spec("xdist") is not None:  # the first use of each Triton kernel compiles it
            cmd += ["-n", str(os.cpu_count() or 1)]
        if importlib.util.find_spec("pytest_timeout") is not None:
            cmd += [f"--timeout={TEST_TIMEOUT}"]
    env = dict(os.environ, RLK_TEST_FLAVORS=flavors)
    env.pop("TRITON_INTERPRET", None)
    note = f"flavors: {flavors}" + ("; only the tests with a flavor" if flavored_only else "")
    step = run.run(Step("tests with a kernel flavor", "tests", cmd + targets, env, note, tests=True), limit)
    if step.returncode == 5:  # pytest: no test selected
        step.state, step.note = "passed", step.note + "; no test selected"
        run.write()
    return step


def sanitizer_steps(run: Run) -> None:
    workload = [sys.executable, "-m", "rlkernels.gpu_workload"]
    checks = (("memcheck", ["cuda", "triton"], MEMCHECK_LIMIT), ("racecheck", ["cuda"], RACECHECK_LIMIT))
    if run.dry_run:  # the workload on the CPU kernels, one dtype, without the sanitizer
        for check, _, limit in checks:
            cmd = workload + ["--device", "cpu", "--dtypes", "float32"]
            run.run(Step(f"{check} (dry run: no sanitizer)", check, cmd), limit)
        return
    tool = shutil.which("compute-sanitizer") or next(
        (p for p in ("/usr/local/cuda/bin/compute-sanitizer",) if os.path.exists(p)), None
    )
    for check, backends, limit in checks:
        if tool is None:
            note = "compute-sanitizer not found (the CUDA toolkit's bin)"
            run.steps.append(Step(f"compute-sanitizer {check}", check, [], note=note, state="skipped"))
            run.write()
            continue
        cmd = [tool, "--tool", check, "--error-exitcode", "3", "--print-limit", "20", *workload]
        run.run(Step(f"compute-sanitizer {check}", check, cmd + ["--backends", *backends]), limit)


def bench_steps(run: Run) -> None:
    for op in BENCH_OPS[:1] if run.dry_run else BENCH_OPS:
        cmd = [sys.executable, "-m", "rlkernels", "bench", "--no-plot", "--no-progress", "--no-memory"]
        cmd += ["--out", str(run.out / "bench"), "--ops", op]
        if run.dry_run:
            cmd += ["--device", "cpu", "--modes", "no_grad", "--rounds=2"]
        else:
            cmd += ["--device", "cuda", "--shapes", "llm", "--modes", "full", "--rounds=3"]
        run.run(Step(f"benchmark {op}", f"bench-{op}", cmd), BENCH_LIMIT)


def run_steps(run: Run, steps) -> int:
    """Each step function in order. SIGTERM or Ctrl-C of the selftest stops the running step; the report
    then says so. Returns the exit status."""
    try:
        with sigterm_interrupts():
            for step in steps:
                step(run)
    except (Interrupted, KeyboardInterrupt) as e:
        run.stopped = str(e) or type(e).__name__
        run.write()
        return 143 if isinstance(e, Interrupted) else 130
    run.write()
    return 0 if all(s.state in ("passed", "skipped") for s in run.steps) else 1


def main(report_path: str | None = None, *, dry_run: bool = False, flavors: str = "cuda,triton") -> int:
    import torch

    if not (REPO / "tests").is_dir():
        print(f"selftest: run it from a source checkout ({REPO / 'tests'} not found)", file=sys.stderr)
        return 2
    if not torch.cuda.is_available() and not dry_run:
        print(
            "selftest: no CUDA device here. Without a GPU, CI's checks are what can run: "
            "`python -m rlkernels compile-check` and `python -m pytest` (CPU, interpreter and cuda-on-cpu "
            "flavors). `--dry-run` runs this command's steps on the CPU.",
            file=sys.stderr,
        )
        return 2
    path = pathlib.Path(report_path) if report_path else REPO / "build" / "selftest" / "report.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    print(f"selftest: report: {path} (rewritten as each step starts and ends)", flush=True)
    run = Run(path.parent, path, dry_run)
    start = time.monotonic()
    status = run_steps(
        run,
        [
            extension_steps,
            functools.partial(
                tests_step,
                targets=DRY_TESTS if dry_run else ["tests"],
                flavors="cpu" if dry_run else flavors,
            ),
            sanitizer_steps,
            bench_steps,
        ],
    )
    verdict = {0: "passed", 1: "FAILED"}.get(status, f"STOPPED ({run.stopped})")
    print(f"selftest: {verdict} in {time.monotonic() - start:.0f} s; report: {path}", flush=True)
    return status
