"""benchmarks/kernel_times.py and benchmarks/graph_replay.py, the GPU traces' tools, on the CPU: the busy time
is the union of the device intervals (overlaps once, gaps not at all), the tables say what they hold, and
both scripts run the bench's own cases end to end (on a CPU: no device intervals, no graph). Timings are
never asserted (docs/testing.md)."""

import json
import pathlib
import sys

import pytest

BENCHMARKS = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
import graph_replay  # noqa: E402
import kernel_times  # noqa: E402


@pytest.mark.parametrize(
    "intervals,busy",
    [
        ([], 0.0),
        ([(0, 10)], 10.0),
        ([(0, 10), (20, 25)], 15.0),  # a gap is idle
        ([(0, 10), (5, 12)], 12.0),  # an overlap counts once
        ([(20, 25), (0, 10), (2, 3)], 15.0),  # unordered, one inside another
        ([(0, 10), (10, 12)], 12.0),  # touching
    ],
)
def test_busy_is_the_union_of_the_intervals(intervals, busy):
    assert kernel_times._union(intervals) == busy


def test_row_lists_the_largest_kernels_and_sums_the_rest():
    kernels = {f"k{i}": [1.0, (20 - i) * 1e-6] for i in range(kernel_times.TOP + 3)}
    row = {"wall_s": 400e-6, "host_s": 300e-6, "busy_s": 200e-6, "kernels": kernels, "host_ops": {}}
    text = kernel_times.format_row("case", row)
    assert "wall 400.0 us/call, host issue 300.0, GPU busy 200.0 (50%), idle 200.0" in text
    assert f"{kernel_times.TOP + 3}.0 device activities/call" in text
    listed = [line for line in text.splitlines() if line.strip().endswith(tuple(kernels))]
    assert len(listed) == kernel_times.TOP
    rest = sum(s for _, s in list(kernels.values())[kernel_times.TOP :]) * 1e6
    assert f"{rest:10.1f} us  x  3.0  (3 others)" in text


def test_kernel_times_runs_the_bench_cases_on_cpu(tmp_path, capsys):
    out = tmp_path / "rows.json"
    args = ["--device", "cpu", "--shapes", "small", "--ops", "kl_penalty", "--calls", "1", "--warmup", "1"]
    assert kernel_times.main(args + ["--providers", "rlkernels?cpu?", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert rows and all(r["case"].startswith("kl_penalty |") and r["busy_s"] == 0.0 for r in rows)
    assert all(r["kernels"] == {} and r["host_ops"] for r in rows)  # host ops recorded, no device ones
    assert "rlkernels[cpu]" in capsys.readouterr().out


def test_graph_replay_runs_eager_only_on_cpu(capsys):
    args = ["--device", "cpu", "--shapes", "small", "--ops", "kl_penalty", "--calls", "1"]
    assert graph_replay.main(args + ["--providers", "rlkernels?cpu?"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("kl_penalty |")]
    assert lines and all("rlkernels[cpu]" in line and line.split()[-1] == "-" for line in lines)
