"""`python -m rlkernels train --algo rm|grpo|ppo|dpo [options]`: a trainer on a built-in task, its options
generated from the algorithm's config dataclass (`--algo grpo --help` lists them). `--logprobs both` runs the
fused and the eager log-probs one after the other from the same seed and prints their speed and peak
memory side by side, with both runs' curves on one figure."""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import pathlib
import statistics
import typing

from rlkernels.trainers.config import CONFIGS, LOGPROBS

# The metric a run is judged by: the mean reward (RL) or the held-out preference accuracy.
HEADLINE = {"grpo": "reward", "ppo": "reward", "dpo": "eval_accuracy", "rm": "eval_accuracy"}
EDGE_STEPS = (
    5  # a metric logged every step starts and ends as the mean of this many values (rewards are noisy)
)


# Where the command line writes when --out-dir is not given (the Python API writes no files then).
DEFAULT_OUT_DIR = "train-runs/<algo>-<date>-<time>/"


def _field_parser(algo: str) -> argparse.ArgumentParser:
    """The options of `algo`'s config, each help ending with the default the command line uses."""
    config = CONFIGS[algo]
    parser = argparse.ArgumentParser(
        prog=f"python -m rlkernels train --algo {algo}", description=f"{config.__name__}'s options"
    )
    hints = typing.get_type_hints(config)
    for f in dataclasses.fields(config):
        flag = "--" + f.name.replace("_", "-")
        kind, text = hints[f.name], f.metadata["help"]
        if f.name == "logprobs":
            text += f"; both: the two runs compared (default: {f.default})"
            parser.add_argument(flag, choices=(*LOGPROBS, "both"), default=f.default, help=text)
        elif f.name == "out_dir":  # the dataclass's None (no files) is the command line's fresh directory
            where = DEFAULT_OUT_DIR.replace("<algo>", algo)
            text = (
                f"where the JSONL log, the PNG of the curves and the checkpoint go (default: a fresh {where})"
            )
            parser.add_argument(flag, default=None, help=text)
        elif kind is bool:
            shown = flag if f.default else "--no-" + flag[2:]
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default,
                                help=f"{text} (default: {shown})")  # fmt: skip
        else:
            convert = str if kind in (str, str | None) else kind
            parser.add_argument(flag, type=convert, default=f.default, help=f"{text} (default: {f.default})")
    return parser


def _plan(algo: str, args: dict, modes: tuple[str, ...]) -> str:
    """The run's first line: what it trains, how long, and where its files go."""
    warm = args.get("warmup_steps") or 0
    steps = f"{args['steps']} step{'s' * (args['steps'] != 1)}" + (
        f" after {warm} supervised warm-start steps" if warm else ""
    )
    runs = " then ".join(modes)
    task, out = args["task"], args["out_dir"]
    return f"rlkernels train: {algo} on task '{task}', {steps}, log-probs {runs}; files in {out}"


def headline(algo: str, history: list[dict]) -> tuple[float, float]:
    """The run's metric (HEADLINE) at its start and end: means of EDGE_STEPS values when it is logged every
    step, else (a sparse metric) its first and last value."""
    points = [r[HEADLINE[algo]] for r in history if r.get(HEADLINE[algo]) is not None]
    edge = EDGE_STEPS if len(points) >= 4 * EDGE_STEPS else 1
    return statistics.fmean(points[:edge]), statistics.fmean(points[-edge:])


def _summary(algo: str, runs: dict[str, list[dict]]) -> str:
    key = HEADLINE[algo]
    lines = [
        f"| logprobs | {key}: start -> end | median s/step "
        "| median tokens/s "
        "| peak memory (max over steps) |",
        "|---|---|---|---|---|",
    ]
    for label, history in runs.items():
        start, end = headline(algo, history)
        peaks = [r["peak_mib"] for r in history if r.get("peak_mib") is not None]
        peak = f"{max(peaks):.0f} MiB" if peaks else "n/a"
        lines.append(
            f"| {label} | {start:.3f} -> {end:.3f} | {statistics.median(r['seconds'] for r in history):.3f} "
            f"| {statistics.median(r['tokens_per_s'] for r in history):.0f} | {peak} |"
        )
    return "\n".join(lines)


def main(algo: str, argv: list[str]) -> int:
    if algo not in CONFIGS:
        raise SystemExit(f"rlkernels train: --algo must be one of {tuple(CONFIGS)}, got {algo!r}")
    args = vars(_field_parser(algo).parse_args(argv))
    modes = LOGPROBS if args["logprobs"] == "both" else (args["logprobs"],)
    if args["out_dir"] is None:
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        args["out_dir"] = str(pathlib.Path("train-runs") / f"{algo}-{stamp}")
    if args["progress"] and int(os.environ.get("RANK", "0")) == 0:
        print(_plan(algo, args, modes), flush=True)  # before transformers is imported and the model built

    from rlkernels.trainers import TRAINERS
    from rlkernels.trainers.distributed import teardown

    runs, main_rank = {}, True
    for mode in modes:
        trainer = TRAINERS[algo](CONFIGS[algo](**{**args, "logprobs": mode}))
        runs[mode] = trainer.train()
        main_rank = trainer.dist.main
    if main_rank:
        _report(algo, argv, args, runs)
    # under torchrun teardown ends the process; not on an error: torchrun ends the other ranks when one
    # fails, and a barrier would wait for them
    teardown()
    return 0


def _report(algo: str, argv: list[str], args: dict, runs: dict) -> None:
    """Rank 0's summary table, the comparison of the log-prob modes and where the run's files are."""
    from rlkernels.trainers.plot import plot_runs

    out = pathlib.Path(args["out_dir"])
    table = _summary(algo, runs)
    print(table)
    if len(runs) > 1:
        plot_runs(runs, out / "compare.png", f"{algo} on '{args['task']}': fused vs eager log-probs")
        (out / "compare.md").write_text(
            f"`python -m rlkernels train --algo {algo} {' '.join(argv)}`\n\n{table}\n"
        )
    print(f"{'logs, curves and checkpoints' if args['save'] else 'logs and curves'} in {out}")
