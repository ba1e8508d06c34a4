"""Does each trainer learn? Every algorithm of `python -m rlkernels train` at its defaults (fused log-probs,
the 'sort' task, a 128256-token vocabulary) for several seeds: the headline metric at the start and the end
of the run (as the command's own summary reports it) and the training loop's wall time. From the checkout:

    PYTHONPATH=. python benchmarks/train_seeds.py [--seeds 0 1 2] [--algos grpo ppo dpo rm]
"""

from __future__ import annotations

import argparse

from rlkernels.trainers import TRAINERS
from rlkernels.trainers.cli import HEADLINE, headline


def run(algo: str, seed: int) -> tuple[float, float, float, float]:
    cls = TRAINERS[algo]
    history = cls(cls.config_class(seed=seed, progress=False, save=False)).train()
    start, end = headline(algo, history)
    return start, end, sum(r["seconds"] for r in history), max(r["peak_mib"] or 0 for r in history)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--algos", nargs="+", default=list(TRAINERS), choices=list(TRAINERS))
    args = parser.parse_args()
    print("| algo | metric | seed | start -> end | training loop | peak memory |")
    print("|---|---|---|---|---|---|")
    for algo in args.algos:
        for seed in args.seeds:
            start, end, seconds, peak = run(algo, seed)
            cells = (
                algo,
                HEADLINE[algo],
                seed,
                f"{start:.3f} -> {end:.3f}",
                f"{seconds:.0f} s",
                f"{peak:.0f} MiB",
            )
            print("| " + " | ".join(map(str, cells)) + " |", flush=True)


if __name__ == "__main__":
    main()
