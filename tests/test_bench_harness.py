"""The benchmark harness' structure (never its timings): interleaved rounds in rotated order, the noisy-row
logic on synthetic timings, skipped providers carrying their reason into the CSV and the plot, and runs
writing to a fresh run directory outside the committed reference results."""

import csv
import hashlib
import pathlib
import shutil
import subprocess
import sys
import types

import pytest
import torch

BENCH_DIR = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH_DIR))

import harness  # noqa: E402
import noise  # noqa: E402
import plots  # noqa: E402
import report  # noqa: E402
import run_record  # noqa: E402
import timing  # noqa: E402

CPU = torch.device("cpu")


def test_rounds_rotate_the_provider_order():
    assert ["".join(timing.round_order("abc", r)) for r in range(4)] == ["abc", "bca", "cab", "abc"]


def test_every_round_times_every_provider_after_one_warm_up_each():
    calls = []
    steps = {name: (lambda name=name: calls.append(("call", name))) for name in "abc"}

    def sample(step):
        step()
        calls.append(("sampled",))
        return [1.0]

    group = timing.time_interleaved(steps, CPU, rounds=3, sample=sample)
    called = [c[1] for c in calls if c[0] == "call"]
    assert called[:3] == list("abc")  # the warm-ups, before any round
    assert called[3:] == list("abc") + list("bca") + list("cab")
    assert group.errors == {} and all(len(t.rounds) == 3 for t in group.timings.values())


def test_a_failing_provider_is_reported_and_the_others_still_run():
    def broken():
        raise RuntimeError("shape rejected")

    group = timing.time_interleaved(
        {"ok": lambda: None, "broken": broken}, CPU, rounds=2, sample=lambda s: [1.0]
    )
    assert list(group.timings) == ["ok"] and "shape rejected" in group.errors["broken"]


def _timings(*rounds):
    return timing.Timings([list(r) for r in rounds])


def test_quiet_timings_are_not_noisy():
    t = _timings([1.0, 1.02, 1.01], [1.03, 1.0], [0.99, 1.01])
    assert noise.timing_noise(t) == []
    assert noise.row_noise(t, _timings([2.0], [2.05], [2.02]), [2.0, 2.0, 2.0]) == []


def test_round_medians_far_apart_are_noisy():
    (reason,) = noise.timing_noise(_timings([1.0, 1.0], [1.5, 1.5], [1.0, 1.0]))
    assert "round medians 50% apart" in reason


def test_a_median_far_above_the_min_is_noisy():
    # A fast call that, most of the time, waits out a scheduler tick: samples at the tick's multiples.
    stalled = [0.013] + [8.0] * 5 + [12.0] * 3
    reasons = noise.timing_noise(_timings(stalled, stalled, stalled))
    assert any(r.startswith("median") and r.endswith("x min") for r in reasons)


def test_the_eager_side_of_a_ratio_counts():
    quiet = _timings([1.0], [1.0], [1.0])
    assert noise.row_noise(quiet, _timings([1.0], [2.0], [1.0]), [1.0, 2.0, 1.0])[0].startswith("eager: ")


@pytest.mark.parametrize(
    "ratios,flips",
    [([0.8, 1.2, 1.0], True), ([0.97, 1.03, 1.0], False), ([1.5, 3.0, 2.0], False), ([0.5, 0.9], False)],
)
def test_a_ratio_flips_only_beyond_the_tie(ratios, flips):
    assert noise.ratio_flips(ratios) is flips
    quiet = _timings(*[[1.0]] * len(ratios))
    assert any("flips" in r for r in noise.row_noise(quiet, None, ratios)) is flips


@pytest.mark.parametrize(
    "others,cpus,threads,noisy",
    [(0.05, 2, 2, False), (1.3, 2, 2, True), (3.0, 16, 4, False), (13.0, 16, 4, True), (None, 2, 2, False)],
)
def test_other_processes_on_our_cpus_make_a_comparison_noisy(others, cpus, threads, noisy):
    reasons = noise.neighbor_noise(others, cpus, threads)
    assert bool(reasons) is noisy
    if noisy:
        assert reasons == [f"other processes used {others:.1f} of {cpus} CPUs"]


def _case():
    def make():
        return {"x": torch.randn(256, requires_grad=True)}

    return harness.Case(
        op="toy",
        shape="N=256",
        dtype=torch.float32,
        make_inputs=make,
        providers=[
            harness.Provider("eager", lambda x: x * 2),
            harness.Provider("fast", lambda x: x + x),
            harness.Provider("gpu-only", lambda x: x, unavailable="needs a CUDA device"),
        ],
        modes=("forward", "full"),
        floors=[harness.Floor("forward", "bytes", min_bytes=256 * 8)],
    )


@pytest.fixture
def short_rounds(monkeypatch):
    monkeypatch.setattr(timing, "CPU_ROUND_S", 1e-3)


def test_a_group_reports_every_provider_with_ratios_per_round(short_rounds):
    rows = harness.measure_group(_case(), "forward", CPU, rounds=3, measure_memory=False)
    by = {r.provider: r for r in rows}
    assert list(by) == ["eager", "fast", "gpu-only"]
    assert by["fast"].rounds == 3 and by["fast"].samples >= 3
    assert by["fast"].speedup_lo <= by["fast"].speedup_vs_eager <= by["fast"].speedup_hi
    assert by["fast"].min_ms <= by["fast"].median_ms and by["fast"].gbps is not None
    assert by["gpu-only"].median_ms is None and by["gpu-only"].note == "needs a CUDA device"


def test_skipped_providers_carry_their_reason_into_the_csv_table_and_plot(short_rounds, tmp_path):
    rows = harness.run_cases([_case()], CPU, rounds=2, measure_memory=False, progress=False)
    report.write_csv(rows, str(tmp_path / "toy.csv"))
    with open(tmp_path / "toy.csv") as f:
        skipped = [r for r in csv.DictReader(f) if r["provider"] == "gpu-only"]
    assert len(skipped) == 2 and all(
        r["note"] == "needs a CUDA device" and r["median_ms"] == "" for r in skipped
    )
    assert "    skipped: needs a CUDA device" in report.format_table(rows).splitlines()
    fig = plots.draw(rows, "toy")
    (legend,) = fig.legends  # a provider that never ran: one legend entry with the reason
    assert "gpu-only: not run (needs a CUDA device)" in [t.get_text() for t in legend.get_texts()]
    assert fig.axes[0].get_xscale() == "log"
    plots.plot(rows, str(tmp_path / "toy.png"), "toy")
    assert (tmp_path / "toy.png").stat().st_size > 0


def test_a_provider_skipped_for_one_shape_is_marked_in_its_slot():
    def row(shape, provider, speedup=None, note=""):
        return harness.Result(
            "toy", shape, "float32", "cpu", "forward", provider, speedup_vs_eager=speedup, note=note
        )

    rows = [row("T=128", "compiled", 3.0), row("T=8192", "compiled", note="would unroll the loop")]
    rows += [row("T=128", "kernel", 100.0), row("T=8192", "kernel", 200.0)]
    texts = [t.get_text() for ax in plots.draw(rows, "toy").axes for t in ax.texts]
    assert sum("compiled: would unroll the loop" in t for t in texts) == 1


def test_the_rerun_command_names_the_noisy_ops_and_modes():
    rows = [
        harness.Result("kl", "N=1", "float32", "cpu", "full", "eager", median_ms=1.0),
        harness.Result("gae", "B=1", "float32", "cpu", "forward", "rk", median_ms=1.0, noisy=True, noise="x"),
    ]
    cmd = report.rerun_command(rows, ["--shapes", "small"], rounds=5)
    assert cmd == "python -m rlkernels bench --ops gae --modes forward --shapes small --rounds 10 --no-memory"
    assert cmd in report.noise_summary(rows, cmd) and "1 of 2" in report.noise_summary(rows, cmd)
    assert report.rerun_command(rows[:1], [], 5) is None


def test_run_directories_are_fresh_and_outside_the_committed_results(tmp_path):
    now = run_record.datetime.datetime(2026, 1, 2, 3, 4, 5)
    first, second = run_record.new_run_dir(tmp_path, now), run_record.new_run_dir(tmp_path, now)
    assert first.name == "20260102-030405" and second.name == "20260102-030405-2"
    assert run_record.REFERENCE_DIR not in [run_record.RUNS_DIR, *run_record.RUNS_DIR.parents]
    assert run_record.RUNS_DIR not in [run_record.REFERENCE_DIR, *run_record.REFERENCE_DIR.parents]


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_run_directories_are_gitignored():
    root = run_record.ROOT
    if subprocess.run(["git", "-C", str(root), "rev-parse"], capture_output=True).returncode != 0:
        pytest.skip("not a git checkout")
    probe = run_record.RUNS_DIR / "20260102-030405" / "toy.csv"
    assert subprocess.run(["git", "-C", str(root), "check-ignore", "-q", str(probe)]).returncode == 0


def _digest(directory: pathlib.Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.glob("*")) if p.is_file()
    }


def test_bench_writes_a_run_directory_not_the_reference(short_rounds, tmp_path, monkeypatch, capsys):
    from rlkernels import cli

    toy_module = types.SimpleNamespace(cases=lambda shapes, device: [_case()])
    monkeypatch.setattr(cli, "_bench_modules", lambda: [toy_module])
    monkeypatch.setattr(run_record, "RUNS_DIR", tmp_path / "bench-runs")
    before = _digest(run_record.REFERENCE_DIR)
    assert cli.main(["bench", "--device", "cpu", "--rounds", "2", "--no-memory", "--no-progress"]) == 0
    (run,) = (tmp_path / "bench-runs").iterdir()
    assert sorted(p.name for p in run.iterdir()) == ["run.md", "toy-cpu-small.csv", "toy-cpu-small.png"]
    record = (run / "run.md").read_text()
    assert "python -m rlkernels bench --shapes small --device cpu --rounds 2 --no-memory" in record
    assert "machine:" in record and "load average" in record
    assert _digest(run_record.REFERENCE_DIR) == before
    out = capsys.readouterr().out
    assert "min ms" in out and "median ms" in out and "noise:" in out and str(run) in out


def _filled(eager: timing.Timings, own: timing.Timings) -> tuple[harness.Result, harness.Result]:
    rows = {n: harness.Result("toy", "N=1", "float32", "cpu", "forward", n) for n in ("eager", "own")}
    harness._fill(rows, {"eager": eager, "own": own}, None, None, [])
    return rows["eager"], rows["own"]


def test_the_ratio_shown_is_the_ratio_of_the_medians_shown():
    """A busy machine's kl_penalty row: eager fast in two rounds of many samples and stalled in three of
    one sample each, the provider stalled throughout. The medians of all samples (0.09 ms against 16 ms)
    contradicted the median of the per-round ratios (5.9x); the row now shows the medians of the round
    medians and their ratio, inside the rounds' range."""
    eager = _timings([0.09] * 1000, [0.09] * 1000, [94.0], [94.0], [94.0])
    own = _timings(*[[16.0] * 6] * 5)
    assert eager.median_ms == 0.09 and own.median_ms == 16.0  # what the old rows showed, beside 5.875x
    e, r = _filled(eager, own)
    assert (e.median_ms, r.median_ms) == (94.0, 16.0)
    assert r.speedup_vs_eager == 94.0 / 16.0 and (r.speedup_lo, r.speedup_hi) == (0.09 / 16.0, 94.0 / 16.0)
    assert e.speedup_vs_eager == 1.0


def _random_timings(gen: torch.Generator, rounds: int) -> timing.Timings:
    out = []
    for _ in range(rounds):
        n = int(torch.randint(1, 60, (), generator=gen, device="cpu"))
        scale = float(torch.exp(3 * torch.randn((), generator=gen, device="cpu")))
        out.append((scale * torch.exp(0.5 * torch.randn(n, generator=gen, device="cpu"))).tolist())
    return timing.Timings(out)


def _cell(line: str, header: str, column: str) -> str:
    """The text of `column` in a table line, by the header's column positions."""
    names = report.HEADER
    starts = [header.index(n) for n in names]
    i = names.index(column)
    end = starts[i + 1] if i + 1 < len(starts) else None
    return line[starts[i] : end].strip()


def test_ratios_and_medians_agree_on_random_rounds():
    """On random rounds (any sample counts, any scales): x eager is eager's median over the row's, within
    the rounds' range, and the table's digits agree (the displayed ratio of the displayed medians within
    their rounding)."""
    gen = torch.Generator().manual_seed(0)
    rows = []
    for _ in range(200):
        rounds = int(torch.randint(1, 8, (), generator=gen, device="cpu"))
        e, r = _filled(_random_timings(gen, rounds), _random_timings(gen, rounds))
        assert r.speedup_vs_eager == e.median_ms / r.median_ms
        assert r.speedup_lo * (1 - 1e-12) <= r.speedup_vs_eager <= r.speedup_hi * (1 + 1e-12)
        rows += [e, r]
    lines = report.format_table(rows).splitlines()
    header = lines[0]
    table = [line for line in lines[2:] if line.startswith(("eager ", "own "))]
    assert len(table) == 400
    for eager_line, own_line in zip(table[::2], table[1::2], strict=True):
        shown = float(_cell(own_line, header, "x eager"))
        medians = float(_cell(eager_line, header, "median ms")) / float(_cell(own_line, header, "median ms"))
        assert abs(shown - medians) <= 6e-3 * medians, (eager_line, own_line)  # 3 and 4 significant digits
        lo, hi = (float(x) for x in _cell(own_line, header, "rounds").split(".."))
        assert lo * (1 - 5e-3) <= shown <= hi * (1 + 5e-3)


# The widest numbers a row can show, and long noise reasons.
WIDEST = dict(
    min_ms=0.0001234, median_ms=12345.67, speedup_vs_eager=0.0001234, speedup_lo=0.0001234,
    speedup_hi=12345.6,
    extra_mb=123456.7, extra_vs_eager=0.001234, noisy=True, speedup_of_mins=0.0001234,
    noise="; ".join(["round medians 1234% apart", "median 123.4x min"] * 4),
)  # fmt: skip


def test_the_printed_table_fits_a_terminal():
    """Every case of every benchmark module (their real op, shape and provider names, small and llm shapes),
    with the widest numbers and long reasons, prints within report.TABLE_WIDTH (120) columns."""
    import importlib

    rows = []
    for path in sorted(BENCH_DIR.glob("bench_*.py")):
        module = importlib.import_module(path.stem)
        for case in module.cases("small", CPU) + module.cases("llm", CPU):
            for mode in case.modes:
                names = [p.name for p in case.providers] + [
                    harness.FLOOR_PREFIX + f.name for f in case.floors
                ]
                for i, name in enumerate(names):
                    floor = dict(vs_floor=1234.5) if i % 2 else dict(gbps=12345.6)
                    rows.append(
                        harness.Result(case.op, case.shape, "bfloat16", "cuda", mode, name, **WIDEST, **floor)
                    )
                rows.append(
                    harness.Result(case.op, case.shape, "float32", "cpu", mode, names[0], note="x" * 200)
                )
    text = report.format_table(rows)
    assert len(rows) > 500 and max(len(line) for line in text.splitlines()) <= report.TABLE_WIDTH
    summary = report.noise_summary(rows, "python -m rlkernels bench --ops kl_penalty")
    assert all(len(line) <= report.TABLE_WIDTH for line in summary.splitlines())
