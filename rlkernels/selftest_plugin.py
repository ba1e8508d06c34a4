"""The pytest hooks of `python -m rlkernels selftest`, loaded with `-p rlkernels.selftest_plugin`:

  --rlk-flavored-only   keep only the tests parametrized with a kernel flavor (tests/oracle.Flavor); the
                        rest (input validation, pure-Python helpers) do not touch the flavors' kernels
  --rlk-live=PREFIX     as each test ends, append its outcome to PREFIX.jsonl (one JSON object a line) and
                        each failure's test id, message and last traceback lines to PREFIX-failures.md,
                        flushed at once: a run that is killed still names every failure so far

Under pytest-xdist the workers collect (and deselect) and the controller, which receives every report,
writes the files.
"""

from __future__ import annotations

import json
import pathlib

import pytest

# A failure's traceback tail kept in the files: the assertion, its values and the frame that raised.
TRACEBACK_LINES = 30


def pytest_addoption(parser):
    group = parser.getgroup("rlkernels selftest")
    group.addoption("--rlk-flavored-only", action="store_true", help="only tests with a kernel flavor")
    group.addoption("--rlk-live", metavar="PREFIX", help="append outcomes to PREFIX.jsonl as they happen")


def has_flavor(item) -> bool:
    """True when one of the test's parameters is a kernel flavor (tests/oracle.Flavor)."""
    try:
        from oracle import Flavor  # tests/ is on sys.path once tests/conftest.py is loaded
    except ImportError as e:
        raise pytest.UsageError("--rlk-flavored-only selects from the repository's tests/ (oracle.py)") from e
    callspec = getattr(item, "callspec", None)
    return any(isinstance(v, Flavor) for v in (callspec.params.values() if callspec else ()))


def pytest_collection_modifyitems(config, items):
    if not config.getoption("rlk_flavored_only"):
        return
    keep, drop = [], []
    for item in items:
        (keep if has_flavor(item) else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_configure(config):
    prefix = config.getoption("rlk_live")
    if prefix and not hasattr(config, "workerinput"):  # an xdist worker's reports reach the controller
        config.pluginmanager.register(LiveLog(pathlib.Path(prefix)), "rlk-live-log")


def outcome_of(report) -> str:
    if hasattr(report, "wasxfail"):
        return "xfailed" if report.skipped else "xpassed"
    if report.failed and report.when in ("setup", "teardown"):
        return "error"  # in a fixture's setup or teardown
    return report.outcome


def message_of(report) -> str:
    """The one-line reason: the exception's message, a skip's reason."""
    longrepr = report.longrepr
    if isinstance(longrepr, tuple):  # a skip: (path, line, reason)
        return str(longrepr[2])
    crash = getattr(longrepr, "reprcrash", None)
    if crash is not None and crash.message:
        return crash.message
    lines = [line for line in str(longrepr or "").splitlines() if line.strip()]
    errors = [line[1:].strip() for line in lines if line.startswith("E ")]
    if errors:
        return errors[0]
    return lines[-1] if lines else ""


class LiveLog:
    """Appends every outcome as it is reported; opened and flushed per line so that nothing waits in a
    buffer when the process is killed."""

    def __init__(self, prefix: pathlib.Path):
        self.jsonl = prefix.with_name(prefix.name + ".jsonl")
        self.failures = prefix.with_name(prefix.name + "-failures.md")
        self.jsonl.parent.mkdir(parents=True, exist_ok=True)
        self.collected_written = False

    def _append(self, path: pathlib.Path, text: str) -> None:
        with open(path, "a") as f:
            f.write(text)
            f.flush()

    def _record(self, nodeid: str, when: str, outcome: str, report) -> None:
        entry = {
            "id": nodeid,
            "when": when,
            "outcome": outcome,
            "seconds": round(getattr(report, "duration", 0) or 0, 3),
        }
        if outcome in ("failed", "error", "skipped", "xfailed"):
            entry["message"] = message_of(report)
        if outcome in ("failed", "error"):
            tail = report.longreprtext.strip().splitlines()[-TRACEBACK_LINES:]
            entry["traceback"] = "\n".join(tail)
            head = f"### {nodeid} ({outcome} in {when})\n\n{entry['message']}\n\n"
            self._append(self.failures, head + f"```\n{entry['traceback']}\n```\n\n")
        self._append(self.jsonl, json.dumps(entry) + "\n")

    def pytest_collection_finish(self, session):  # without xdist: this process collected the tests
        self._append(self.jsonl, json.dumps({"collected": len(session.items)}) + "\n")

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node, ids):  # with xdist: each worker, the same ids
        if not self.collected_written:
            self.collected_written = True
            self._append(self.jsonl, json.dumps({"collected": len(ids)}) + "\n")

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_logreport(self, report):
        # one line per test: its call, or the setup that failed or skipped it, plus a failing teardown
        if report.when == "call" or report.outcome != "passed":
            self._record(report.nodeid, report.when, outcome_of(report), report)

    def pytest_collectreport(self, report):
        if report.failed:
            self._record(report.nodeid, "collect", "error", report)
