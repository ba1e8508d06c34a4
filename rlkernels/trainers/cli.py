"""`python -m rlkernels train --algo rm|grpo|ppo|dpo [options]`: a trainer on a built-in task, its options
generated from the algorithm's config dataclass (`--algo grpo --help` lists them). `--logprobs both` runs the
fused and the eager log-probs one after the other from the same seed and prints their speed and peak
memory side by side, with both runs' curves on one figure."""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import pathlib
import statistics
import typing

from rlkernels.trainers.config import CONFIGS, LOGPROBS

# The metric a run is judged by: the mean reward (RL) or the held-out preference accuracy.
HEADLINE = {"grpo": "reward", "ppo": "reward", "dpo": "eval_accuracy", "rm": "eval_accuracy"}
EDGE_STEPS = (
    5  # a metric logged every step starts and ends as the mean of this many values (rewards are noisy)
)


def _field_parser(algo: str) -> argparse.ArgumentParser:
    config = CONFIGS[algo]
    parser = argparse.ArgumentParser(
        prog=f"python -m rlkernels train --algo {algo}", description=f"{config.__name__}'s options"
    )
    hints = typing.get_type_hints(config)
    for f in dataclasses.fields(config):
        flag = "--" + f.name.replace("_", "-")
        kind = hints[f.name]
        if f.name == "logprobs":
            parser.add_argument(flag, choices=(*LOGPROBS, "both"), default=f.default, help=f.metadata["help"]
                                + "; both: the two runs compared")  # fmt: skip
        elif kind is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default,
                                help=f.metadata["help"])  # fmt: skip
        else:
            convert = str if kind in (str, str | None) else kind
            parser.add_argument(flag, type=convert, default=f.default, help=f"{f.metadata['help']} "
                                f"(default: {f.default})")  # fmt: skip
    return parser


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
    from rlkernels.trainers import TRAINERS
    from rlkernels.trainers.plot import plot_runs

    if algo not in CONFIGS:
        raise SystemExit(f"rlkernels train: --algo must be one of {tuple(CONFIGS)}, got {algo!r}")
    args = vars(_field_parser(algo).parse_args(argv))
    modes = LOGPROBS if args["logprobs"] == "both" else (args["logprobs"],)
    if args["out_dir"] is None:
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        args["out_dir"] = str(pathlib.Path("train-runs") / f"{algo}-{stamp}")
    runs, main_rank = {}, True
    for mode in modes:
        trainer = TRAINERS[algo](CONFIGS[algo](**{**args, "logprobs": mode}))
        runs[mode] = trainer.train()
        main_rank = trainer.dist.main
    if not main_rank:
        return 0
    out = pathlib.Path(args["out_dir"])
    table = _summary(algo, runs)
    print(table)
    if len(runs) > 1:
        plot_runs(runs, out / "compare.png", f"{algo} on '{args['task']}': fused vs eager log-probs")
        (out / "compare.md").write_text(
            f"`python -m rlkernels train --algo {algo} {' '.join(argv)}`\n\n{table}\n"
        )
    print(f"logs, curves{' and checkpoints' if args['save'] else ''} in {out}")
    return 0
