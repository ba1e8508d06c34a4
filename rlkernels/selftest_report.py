"""The selftest's report: the test outcomes that rlkernels.selftest_plugin appended as they happened,
tabulated per test file x flavor x dtype, and the Markdown page rewritten whole after every step."""

from __future__ import annotations

import collections
import json
import os
import pathlib
import re
import shlex

# Test flavor ids (tests/oracle.py), longest first so that "cuda-on-cpu" is not read as "cuda".
FLAVORS = ("cuda-on-cpu", "triton-interpret", "cuda", "triton", "cpu")
DTYPES = ("float32", "bfloat16", "float16", "float64")
# Failures listed in the report itself (all of them, with tracebacks, are in the step's -failures.md).
MAX_LISTED = 300
# A failure's message in the report: its lines joined, cut to this many characters.
MESSAGE_CHARS = 300
# Lines of a step's output shown in the report (the whole output is in the step's log).
OUTPUT_TAIL = 40


def _param(ids: str, names) -> str:
    return next((n for n in names if re.search(rf"(^|-){re.escape(n)}(-|$)", ids)), "-")


def key_of(test_id: str) -> tuple[str, str, str]:
    """(test file, flavor, dtype) of a test id such as tests/test_kl.py::test_ref[cuda-bfloat16-k3]."""
    module = pathlib.PurePosixPath(test_id.split("::", 1)[0]).stem
    params = re.search(r"\[(.*)\]$", test_id)
    ids = params.group(1) if params else ""
    return module, _param(ids, FLAVORS), _param(ids, DTYPES)


def read_live(jsonl: pathlib.Path) -> dict:
    """{"table": {(file, flavor, dtype): Counter}, "failures": [(id, message)], "collected": int | None,
    "reported": int}; a line cut short by a kill is ignored."""
    table = collections.defaultdict(collections.Counter)
    failures, collected, reported = [], None, 0
    lines = jsonl.read_text().splitlines() if jsonl.exists() else []
    for line in lines:
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "collected" in entry:
            collected = max(collected or 0, entry["collected"])
            continue
        outcome = entry["outcome"]
        column = {"error": "failed", "xpassed": "passed", "xfailed": "skipped"}.get(outcome, outcome)
        table[key_of(entry["id"])][column] += 1
        reported += entry["when"] != "teardown"  # a failing teardown follows its test's own line
        if outcome in ("failed", "error"):
            failures.append((entry["id"], entry.get("message", "")))
    return {"table": dict(table), "failures": failures, "collected": collected, "reported": reported}


def tests_section(title: str, live: dict, failures_file: str) -> list[str]:
    counts = collections.Counter()
    for c in live["table"].values():
        counts.update(c)
    of = f" of {live['collected']}" if live["collected"] is not None else ""
    lines = [
        "",
        f"## {title}: {live['reported']}{of} tests reported; passed {counts['passed']}, "
        f"failed {counts['failed']}, skipped {counts['skipped']}",
        "",
    ]
    if live["table"]:
        lines += ["| test file | flavor | dtype | passed | failed | skipped |", "|---|---|---|---|---|---|"]
        for (module, flavor, dtype), c in sorted(live["table"].items()):
            lines.append(
                f"| {module} | {flavor} | {dtype} | {c['passed']} | {c['failed']} | {c['skipped']} |"
            )
    if live["failures"]:
        lines += ["", f"### Failures ({len(live['failures'])}; tracebacks in {failures_file})", ""]
        for test_id, message in live["failures"][:MAX_LISTED]:
            lines.append(f"- `{test_id}`: {' / '.join(message.split(chr(10)))[:MESSAGE_CHARS]}")
    return lines


def output_section(name: str, command: list[str], log: pathlib.Path) -> list[str]:
    text = log.read_text(errors="replace").strip() if log.exists() else ""
    if not text:
        return []
    tail = "\n".join(text.splitlines()[-OUTPUT_TAIL:])
    return [
        "",
        f"## {name}: output (last lines; all of it in {log.name})",
        "",
        "```",
        f"$ {shlex.join(command)}",
        tail,
        "```",
    ]


def write_atomic(path: pathlib.Path, text: str) -> None:
    """Replace `path` whole: a kill while writing leaves the previous version, never half of one."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
