"""A selftest step: one command under a time limit, in its own process group, its output into a log; and
the selftest's own SIGTERM turned into an exception, so that the running step is stopped and reported."""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import os
import pathlib
import shlex
import signal
import subprocess
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
STOP_GRACE = 5  # seconds from SIGTERM to SIGKILL of a step's processes, to let them exit on their own
_LIBC = ctypes.CDLL(None)  # loaded here: between fork and exec the child only calls into it


class Interrupted(BaseException):
    """The selftest itself got SIGTERM: stop the running step, write the report, exit."""


@contextlib.contextmanager
def sigterm_interrupts():
    def handler(signum, frame):
        raise Interrupted(f"signal {signal.Signals(signum).name}")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@dataclasses.dataclass
class Step:
    name: str
    slug: str  # its files: <slug>.log, and for a test step <slug>.jsonl and <slug>-failures.md
    command: list[str]
    env: dict | None = None
    note: str = ""
    tests: bool = False  # a pytest step that appends its outcomes as they happen
    state: str = "pending"  # running, passed, failed, timed out, interrupted, skipped
    returncode: int | None = None
    limit: float = 0.0
    seconds: float = 0.0
    started: str = ""

    @property
    def status(self) -> str:
        if self.state == "running":
            return f"RUNNING since {self.started}: if this stays, the run was killed in this step"
        if self.state == "failed":
            return f"FAILED (exit {self.returncode})"
        if self.state in ("timed out", "interrupted"):
            return f"{self.state.upper()} after {self.seconds:.0f} s"
        return self.state


def _die_with_parent() -> None:
    """In the child, before exec (Linux): SIGTERM when the selftest dies, even of SIGKILL."""
    with contextlib.suppress(AttributeError):
        _LIBC.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the step's process group (pytest-xdist's workers included), then SIGKILL to what is left."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=STOP_GRACE)


def run_step(step: Step, out: pathlib.Path) -> Step:
    """Run `step.command` from the repository root, its output into <out>/<slug>.log, for at most
    `step.limit` seconds; on the limit or the selftest's own interruption, stop its whole process group."""
    print(f"selftest: {step.name} (limit {step.limit:.0f} s): {shlex.join(step.command)}", flush=True)
    start = time.monotonic()
    with open(out / f"{step.slug}.log", "w") as log:
        proc = subprocess.Popen(
            step.command,
            cwd=REPO,
            env=step.env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        try:
            step.returncode = proc.wait(timeout=step.limit)
            step.state = "passed" if step.returncode == 0 else "failed"
        except subprocess.TimeoutExpired:
            step.state = "timed out"
            _stop(proc)
        except BaseException:  # SIGTERM or Ctrl-C of the selftest: stop the step, then let it propagate
            step.state = "interrupted"
            _stop(proc)
            raise
        finally:
            step.seconds = time.monotonic() - start
            print(f"selftest: {step.name}: {step.status} in {step.seconds:.0f} s", flush=True)
    return step
