"""`python -m rlkernels selftest`: everything that needs a GPU, in one command, into one report.

On a machine with a CUDA GPU, from a source checkout (docs/selftest.md):
  1. the test suite's oracle on CUDA tensors: every op x flavor (`cuda`: the CUDA C++ kernels, `triton`:
     the Triton kernels compiled for the GPU, no interpreter) x dtype, against the float64 reference;
  2. compute-sanitizer (memcheck, then racecheck) over `python -m rlkernels.gpu_workload`: one forward and
     backward of every op, on odd sizes, through both GPU flavors;
  3. `python -m rlkernels bench --device cuda` on the headline shapes.
Each step has a time limit so that the whole run ends inside 8 minutes on an H100; the report
(build/selftest/report.md) says what passed, what failed, and how long each step took.

Without a GPU it exits with status 2, unless `--dry-run`: the same steps on the CPU flavors with tiny
selections, to check this command itself (tests/test_selftest.py).
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import importlib.util
import os
import pathlib
import platform
import re
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

REPO = pathlib.Path(__file__).resolve().parents[1]
# Time limits (seconds) of the steps: together under 8 minutes on an H100 (each step's report survives
# another step's timeout).
ORACLE_LIMIT = 220  # Triton compiles each specialization on first use; xdist spreads them over the CPUs
SLOW_LIMIT = 80  # torch.compile (Inductor) and the Hugging Face model tests
MEMCHECK_LIMIT = 60
RACECHECK_LIMIT = 40
BENCH_LIMIT = 60  # the headline ops at LLM shapes, autotuning included
TEST_TIMEOUT = 60  # per test (pytest-timeout, where installed): one hung test cannot eat a step
# The headline benchmark: the fused log-probs at LLM sizes and the policy loss.
BENCH_OPS = ("linear_logprobs", "policy_loss")
# Test flavor ids (tests/oracle.py), longest first so that "cuda-on-cpu" is not read as "cuda".
FLAVORS = ("cuda-on-cpu", "triton-interpret", "cuda", "triton", "cpu")


@dataclasses.dataclass
class Step:
    name: str
    command: list[str]
    returncode: int | None = None  # None: skipped
    seconds: float = 0.0
    output: str = ""
    note: str = ""

    @property
    def status(self) -> str:
        if self.returncode is None:
            return "skipped"
        if self.returncode == 124:
            return f"TIMED OUT after {self.seconds:.0f} s"
        return "passed" if self.returncode == 0 else f"FAILED (exit {self.returncode})"


def run_step(step: Step, limit: float, env: dict | None = None) -> Step:
    """Run `step.command` from the repository root with a time limit; keep its output."""
    print(f"selftest: {step.name}: {' '.join(step.command)}", flush=True)
    start = time.perf_counter()
    try:
        done = subprocess.run(
            step.command, cwd=REPO, env=env, capture_output=True, text=True, timeout=limit, check=False
        )
        step.returncode, step.output = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as e:
        step.returncode = 124
        step.output = _text(e.stdout) + _text(e.stderr)
    step.seconds = time.perf_counter() - start
    print(f"selftest: {step.name}: {step.status} in {step.seconds:.0f} s", flush=True)
    return step


def _text(b) -> str:
    return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")


def test_step(name: str, marker: str, limit: float, out: pathlib.Path, flavors: str, dry_run: bool):
    """pytest over tests/ with the GPU flavors (`marker`: "not slow" for the oracle tests, "slow" for
    torch.compile and the model integrations); returns (step, parsed junit)."""
    junit = out / f"junit-{marker.replace(' ', '-')}.xml"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}"]
    cmd += ["-m", marker]
    if dry_run:  # one quick selection, and none for the slow step
        selection = "matches_float64_reference and float32" if marker == "not slow" else "nothing"
        cmd += ["tests/test_kl.py", "-k", selection]
    else:
        cmd.append("tests")
        if importlib.util.find_spec("xdist") is not None:
            cmd += ["-n", str(min(8, os.cpu_count() or 1))]
        if importlib.util.find_spec("pytest_timeout") is not None:
            cmd += [f"--timeout={TEST_TIMEOUT}"]
    env = dict(os.environ, RLK_TEST_FLAVORS=flavors)
    env.pop("TRITON_INTERPRET", None)
    step = run_step(Step(name, cmd, note=f"flavors: {flavors}; -m {marker}"), limit, env)
    if step.returncode == 5:  # pytest: no tests collected (a dry run's empty selection)
        step.returncode = 0
    return step, parse_junit(junit) if junit.exists() else {}


def parse_junit(path: pathlib.Path) -> dict:
    """{(test file, flavor, dtype): Counter(passed/failed/skipped)} and the failures' first lines under
    key "failures"."""
    table = collections.defaultdict(collections.Counter)
    failures = []
    for case in ET.parse(path).getroot().iter("testcase"):
        name = case.get("name", "")
        module = case.get("classname", "").rsplit(".", 1)[-1]
        params = re.search(r"\[(.*)\]", name)
        ids = params.group(1) if params else ""
        flavor = next((f for f in FLAVORS if re.search(rf"(^|-){f}(-|$)", ids)), "-")
        dtype = next(
            (d for d in ("float32", "bfloat16", "float16", "float64") if re.search(rf"(^|-){d}(-|$)", ids)),
            "-",
        )
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                outcome = "failed"
                failures.append(f"{module}::{name}: {(child.get('message') or '').splitlines()[0][:200]}")
            elif child.tag == "skipped":
                outcome = "skipped"
        table[(module, flavor, dtype)][outcome] += 1
    return {"table": dict(table), "failures": failures}


def merge_junit(*parsed: dict) -> dict:
    """One oracle table and failure list from several parsed junit files."""
    table = collections.defaultdict(collections.Counter)
    failures = []
    for p in parsed:
        for key, counts in p.get("table", {}).items():
            table[key].update(counts)
        failures += p.get("failures", [])
    return {"table": dict(table), "failures": failures}


def sanitizer_steps(dry_run: bool) -> list[Step]:
    tool = shutil.which("compute-sanitizer") or next(
        (p for p in ("/usr/local/cuda/bin/compute-sanitizer",) if os.path.exists(p)), None
    )
    workload = [sys.executable, "-m", "rlkernels.gpu_workload"]
    if dry_run:
        dry = Step("gpu workload (no sanitizer: dry run)", workload + ["--device", "cpu"])
        return [run_step(dry, MEMCHECK_LIMIT)]
    if tool is None:
        return [Step("compute-sanitizer", [], note="compute-sanitizer not found (CUDA toolkit's bin)")]
    steps = []
    for check, backends, limit in (
        ("memcheck", ["cuda", "triton"], MEMCHECK_LIMIT),
        ("racecheck", ["cuda"], RACECHECK_LIMIT),  # races within a block: the CUDA C++ kernels' shared memory
    ):
        cmd = [tool, "--tool", check, "--error-exitcode", "3", "--print-limit", "20", *workload]
        steps.append(run_step(Step(f"compute-sanitizer {check}", cmd + ["--backends", *backends]), limit))
    return steps


def bench_step(out: pathlib.Path, dry_run: bool) -> Step:
    cmd = [sys.executable, "-m", "rlkernels", "bench", "--no-plot", "--no-progress"]
    cmd += ["--out", str(out / "bench")]
    if dry_run:
        cmd += ["--device", "cpu", "--ops", "kl_penalty", "--modes", "no_grad", "--no-memory", "--rounds=2"]
    else:  # forward + backward only, 3 rounds: inside BENCH_LIMIT with autotuning and torch.compile
        cmd += ["--device", "cuda", "--shapes", "llm", "--ops", *BENCH_OPS, "--modes", "full", "--rounds=3"]
    return run_step(Step("benchmark", cmd), BENCH_LIMIT)


def environment() -> list[str]:
    import torch

    lines = [
        f"date: {datetime.datetime.now().isoformat(timespec='seconds')}",
        f"python {platform.python_version()}, torch {torch.__version__} (CUDA {torch.version.cuda})",
    ]
    try:
        import triton

        lines.append(f"triton {triton.__version__}")
    except ImportError:
        lines.append("triton: not installed")
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        lines.append(
            f"GPU: {p.name}, sm_{p.major}{p.minor}, {p.multi_processor_count} SMs, {p.total_memory >> 30} GiB"
        )
    from rlkernels import _ext

    if _ext.ext_available():
        info = _ext.build_info()
        lines.append(f"extension: CUDA kernels {info['cuda']} (archs {info['cuda_archs'] or '-'})")
    else:
        lines.append(f"extension: not available ({_ext.ext_error()})")
    return lines


def write_report(path: pathlib.Path, env: list[str], steps: list[Step], oracle: dict, dry_run: bool) -> None:
    lines = ["# rlkernels selftest" + (" (dry run on CPU)" if dry_run else ""), ""]
    lines += [f"- {e}" for e in env] + ["", "| step | status | seconds | note |", "|---|---|---|---|"]
    lines += [f"| {s.name} | {s.status} | {s.seconds:.0f} | {s.note} |" for s in steps]
    if oracle.get("table"):
        lines += ["", "## Oracle tests: op x flavor x dtype (passed / failed / skipped)", ""]
        lines += ["| test file | flavor | dtype | passed | failed | skipped |", "|---|---|---|---|---|---|"]
        for (module, flavor, dtype), c in sorted(oracle["table"].items()):
            lines.append(
                f"| {module} | {flavor} | {dtype} | {c['passed']} | {c['failed']} | {c['skipped']} |"
            )
        if oracle["failures"]:
            lines += ["", "### Failures", ""] + [f"- {f}" for f in oracle["failures"][:200]]
    for s in steps:
        if s.output:
            tail = "\n".join(s.output.strip().splitlines()[-60:])
            lines += [
                "",
                f"## {s.name}: output (last lines)",
                "",
                "```",
                f"$ {' '.join(s.command)}",
                tail,
                "```",
            ]
    path.write_text("\n".join(lines) + "\n")


def main(report: str | None = None, *, dry_run: bool = False, flavors: str = "cuda,triton") -> int:
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
    out = pathlib.Path(report).parent if report else REPO / "build" / "selftest"
    out.mkdir(parents=True, exist_ok=True)
    path = pathlib.Path(report) if report else out / "report.md"
    start = time.perf_counter()
    flavors = "cpu" if dry_run else flavors
    oracle_run, oracle = test_step("oracle tests", "not slow", ORACLE_LIMIT, out, flavors, dry_run)
    slow_run, slow = test_step("compile and model tests", "slow", SLOW_LIMIT, out, flavors, dry_run)
    steps = [oracle_run, slow_run, *sanitizer_steps(dry_run), bench_step(out, dry_run)]
    write_report(path, environment(), steps, merge_junit(oracle, slow), dry_run)
    ok = all(s.returncode == 0 for s in steps if s.returncode is not None)
    print(f"selftest: {'passed' if ok else 'FAILED'} in {time.perf_counter() - start:.0f} s; report: {path}")
    return 0 if ok else 1
