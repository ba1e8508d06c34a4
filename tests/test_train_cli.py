"""`python -m rlkernels train`: its help shows every option's default, and states them truly (the default
output directory is where a run writes); a run shows progress from its start (its plan, the model being
built, the warm start's or DPO's reference pass' bars) before its first training step."""

from __future__ import annotations

import pathlib

import pytest

pytest.importorskip("transformers")
from rlkernels.trainers import cli as train_cli  # noqa: E402
from rlkernels.trainers.config import CONFIGS  # noqa: E402

TINY = ["--vocab-size", "512", "--hidden-size", "32", "--num-layers", "1", "--batch-size", "8",
        "--micro-batch-size", "4"]  # fmt: skip


@pytest.mark.parametrize("algo", list(CONFIGS))
def test_help_shows_every_default(algo):
    parser = train_cli._field_parser(algo)
    options = [a for a in parser._actions if a.dest != "help"]
    assert len(options) == len(CONFIGS[algo].__dataclass_fields__)
    for action in options:
        assert "(default: " in action.help, action.option_strings
    help_text = parser.format_help()
    assert "no files" not in help_text  # the command line always writes files
    assert "--save, --no-save" in help_text and "(default: --save)" in help_text
    assert "(default: --progress)" in help_text and "(default: --no-fsdp)" in help_text
    out_dir = next(a for a in options if a.dest == "out_dir")
    assert f"(default: a fresh train-runs/{algo}-<date>-<time>/)" in out_dir.help


def test_the_default_output_directory_is_where_the_run_writes(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    flags = [*TINY, "--steps", "1", "--warmup-steps", "0", "--group-size", "4", "--no-save", "--no-progress"]
    assert train_cli.main("grpo", flags) == 0
    (run,) = (tmp_path / "train-runs").iterdir()
    assert run.name.startswith("grpo-") and (run / "grpo-sort-fused.jsonl").exists()
    assert f"logs and curves in {pathlib.Path('train-runs') / run.name}" in capsys.readouterr().out


@pytest.mark.parametrize("algo", ["grpo", "dpo"])
def test_progress_from_the_start(algo, tmp_path, capsys):
    """The plan and the model line come first; the phase before step 1 (GRPO's warm start, DPO's reference
    log-probs of every pair) has a bar; then the steps."""
    grpo, dpo = ["--warmup-steps", "2", "--group-size", "4"], ["--num-pairs", "16", "--eval-pairs", "8"]
    extra = grpo if algo == "grpo" else dpo
    flags = [*TINY, *extra, "--steps", "1", "--no-save", "--out-dir", str(tmp_path)]
    assert train_cli.main(algo, flags) == 0
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert lines[0] == (
        f"rlkernels train: {algo} on task 'sort', 1 step"
        + (" after 2 supervised warm-start steps" if algo == "grpo" else "")
        + f", log-probs fused; files in {tmp_path}"
    )
    assert lines[1].startswith(f"{algo}: building the model (a tiny Qwen2 with a 512-token vocabulary")
    step = next(i for i, line in enumerate(lines) if f"{algo}-sort-fused step    1" in line)
    if algo == "grpo":
        warm = next(
            i for i, line in enumerate(lines) if "supervised warm-start steps on the task's answers" in line
        )
        assert 1 < warm < step
        assert "grpo-sort-fused warm start: 100%" in captured.err and "nll=" in captured.err
    else:
        assert "dpo-sort-fused reference log-probs of the training pairs: 100%" in captured.err
        assert "dpo-sort-fused reference log-probs of the held-out pairs: 100%" in captured.err


def test_no_progress_prints_no_bars(tmp_path, capsys):
    flags = [*TINY, "--steps", "1", "--warmup-steps", "1", "--group-size", "4", "--no-save", "--no-progress",
             "--out-dir", str(tmp_path)]  # fmt: skip
    assert train_cli.main("grpo", flags) == 0
    captured = capsys.readouterr()
    assert "warm start" not in captured.err + captured.out and "building the model" not in captured.out
