"""The advantage estimators (rk.advantages) against verl 0.9.1's own functions, on CPU, in one process.

Outcome estimators at B=65536 responses (4096 prompts x 16, rows shuffled: arbitrary uids) with T=8 response
tokens (their [B, T] output stays small; the group work is what differs); token-level ones (and the two
whitened outcome ones again) at B=64 (4 prompts x 16), T=4096. Providers, timed in interleaved rounds
(benchmarks/timing.py: rotated order, median, min and the spread of the round medians):

- verl 0.9.1: the registered function, driven as verl's trainer drives it (token_level_rewards [B, T],
  response_mask, a numpy array of uid strings as index): Python loops over rows and groups;
- rk: the public function (backend "auto": the C++ CPU kernels, the estimator's own or those of
  group_advantages / discounted_returns it is built from) on int64 group ids, including the sum of the
  token rewards;
- rk reference: the same with backend="reference" (vectorized torch);
- torch.compile: the reference math (rlkernels/reference/advantage_estimators.py) under torch.compile, except
  for SCAN_BASED (--no-compile skips it).

    PYTHONPATH=. python benchmarks/advantage_estimators.py [--rounds 5] [--threads 1] [--no-compile]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import platform
import statistics
import sys
import time

import numpy as np
import torch

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from timing import time_interleaved  # noqa: E402

import rlkernels as rk  # noqa: E402
from rlkernels.reference import advantage_estimators as ref  # noqa: E402

GROUP = 16
# Their reference runs discounted_returns' reference, a Python loop over T: torch.compile unrolls it (4096
# steps) and did not finish compiling in minutes; they get no torch.compile row.
SCAN_BASED = ("reinforce_plus_plus", "remax", "optimal_token_baseline")
OUTCOME_SHAPE = (65536, 8)
TOKEN_SHAPE = (64, 4096)
# verl's optimal_token_baseline loops over groups (4 at TOKEN_SHAPE): also at 64 groups.
MANY_GROUPS_SHAPE = (1024, 512)


class _Config(dict):
    __getattr__ = dict.__getitem__


def make(b: int, t: int, seed: int = 0) -> dict:
    gen = torch.Generator().manual_seed(seed)
    ids = (torch.arange(b) // GROUP * 7919 + 12345)[torch.randperm(b, generator=gen)]
    lengths = torch.randint(t // 4, t + 1, (b,), generator=gen)
    mask = torch.arange(t)[None, :] < lengths[:, None]
    scores = (torch.rand(b, generator=gen) > 0.5).float() + 0.1 * torch.randn(b, generator=gen)
    rewards = torch.zeros(b, t)
    rewards[torch.arange(b), lengths - 1] = scores
    return dict(
        ids=ids,
        uids=np.array([f"uid-{int(i)}" for i in ids], dtype=object),
        mask=mask,
        fmask=mask.float(),
        scores=scores,
        per_key=torch.stack([scores, (torch.rand(b, generator=gen) > 0.3).float()], 1),
        rewards=rewards,
        baselines=torch.rand(b, generator=gen),
        old_logp=-torch.rand(b, t, generator=gen),
        sum_pi_squared=0.5 * torch.rand(b, t, generator=gen),
    )


def providers(name: str, d: dict, compile_ref: bool) -> dict:
    from verl.trainer.ppo import core_algos as ca

    m, fm, ids, uids, r = d["mask"], d["fmask"], d["ids"], d["uids"], d["rewards"]
    s = lambda: r.sum(-1)  # (verl sums token_level_rewards inside its functions)
    if name == "gdpo":
        keys = {"k0": d["per_key"][:, 0].numpy(), "k1": d["per_key"][:, 1].numpy()}
        p = d["per_key"].shape[0]
        batch = {"prompts": torch.zeros(p, 1), "attention_mask": torch.cat([torch.ones(p, 1), fm], 1).long()}
        cfg = _Config(gdpo_reward_keys=list(keys), gdpo_reward_weights=[1.0, 0.5])
        verl = lambda: ca.compute_gdpo_outcome_advantage(
            r, fm, uids, config=cfg, non_tensor_batch=keys, batch=batch
        )
        ours = lambda bk: rk.gdpo_advantages(d["per_key"], m, group_ids=ids, weights=[1.0, 0.5], backend=bk)
        kern = ref.REFERENCE
        w = torch.tensor([1.0, 0.5])
        spec = lambda: ref.gdpo(d["per_key"], m, ids, w, 1e-6, True, kern)
    elif name == "grpo_passk":
        verl = lambda: ca.compute_grpo_passk_outcome_advantage(r, fm, uids, config=_Config())
        ours = lambda bk: rk.grpo_passk_advantages(s(), m, group_ids=ids, backend=bk)
        spec = lambda: ref.grpo_passk(s(), m, ids)
    elif name == "reinforce_plus_plus":
        verl = lambda: ca.compute_reinforce_plus_plus_outcome_advantage(r, fm, config=_Config(gamma=1.0))
        ours = lambda bk: rk.reinforce_plus_plus_advantages(r, m, backend=bk)
        spec = lambda: ref.reinforce_plus_plus(r, m)
    elif name == "reinforce_plus_plus_baseline":
        verl = lambda: ca.compute_reinforce_plus_plus_baseline_outcome_advantage(r, fm, uids)
        ours = lambda bk: rk.reinforce_plus_plus_baseline_advantages(s(), m, group_ids=ids, backend=bk)
        spec = lambda: ref.reinforce_plus_plus_baseline(s(), m, ids)
    elif name == "remax":
        verl = lambda: ca.compute_remax_outcome_advantage(r, d["baselines"], fm)
        ours = lambda bk: rk.remax_advantages(r, m, reward_baselines=d["baselines"], backend=bk)
        spec = lambda: ref.remax(r, m, d["baselines"])
    elif name == "opo":
        verl = lambda: ca.compute_opo_outcome_advantage(r, fm, uids)
        ours = lambda bk: rk.opo_advantages(s(), m, group_ids=ids, backend=bk)
        spec = lambda: ref.opo(s(), m, ids)
    elif name == "gpg":
        verl = lambda: ca.compute_gpg_outcome_advantage(r, fm, uids)
        ours = lambda bk: rk.gpg_advantages(s(), m, group_ids=ids, backend=bk)
        spec = lambda: ref.gpg(s(), m, ids)
    elif name == "optimal_token_baseline":
        lp, sp = d["old_logp"], d["sum_pi_squared"]
        verl = lambda: ca.compute_optimal_token_baseline_advantage(r, fm, uids, lp, sp)
        ours = lambda bk: rk.optimal_token_baseline_advantages(
            r, m, group_ids=ids, old_logp=lp, sum_pi_squared=sp, backend=bk
        )
        spec = lambda: ref.optimal_token_baseline(r, m, ids, lp, sp)
    else:
        raise ValueError(name)
    out = {"verl 0.9.1": verl, "rk": lambda: ours("auto"), "rk reference": lambda: ours("reference")}
    if compile_ref and name not in SCAN_BASED:
        compiled = torch.compile(spec)
        out["torch.compile(reference)"] = compiled
    return out


CASES = [
    ("gdpo", OUTCOME_SHAPE),
    ("grpo_passk", OUTCOME_SHAPE),
    ("reinforce_plus_plus_baseline", OUTCOME_SHAPE),
    ("opo", OUTCOME_SHAPE),
    ("gpg", OUTCOME_SHAPE),
    ("gdpo", TOKEN_SHAPE),
    ("reinforce_plus_plus_baseline", TOKEN_SHAPE),
    ("reinforce_plus_plus", TOKEN_SHAPE),
    ("remax", TOKEN_SHAPE),
    ("optimal_token_baseline", TOKEN_SHAPE),
    ("optimal_token_baseline", MANY_GROUPS_SHAPE),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--only", nargs="*", help="estimator names")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (1: verl's loops are single-threaded, and on a "
        "shared machine OpenMP workers waiting for a busy neighbor's scheduler tick dominate small ops)",
    )
    parser.add_argument(
        "--out", default=str(pathlib.Path(__file__).parent / "results" / "advantage_estimators.md")
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    args.load_before = os.getloadavg()
    started = time.time()
    rows = []
    for name, (b, t) in CASES:
        if args.only and name not in args.only:
            continue
        d = make(b, t)
        steps = providers(name, d, not args.no_compile)
        got = time_interleaved(steps, torch.device("cpu"), rounds=args.rounds)
        verl_ms = got.timings["verl 0.9.1"].median_ms if "verl 0.9.1" in got.timings else None
        for prov, tm in got.timings.items():
            meds = tm.round_medians
            spread = max(meds) / min(meds) - 1 if min(meds) > 0 else float("nan")
            speedup = f"{verl_ms / tm.median_ms:.3g}x" if verl_ms else "-"
            rows.append((name, f"B={b} T={t}", prov, tm.median_ms, tm.min_ms, spread, speedup, tm.warmup_s))
            print(f"{name:30s} B={b:<6d} T={t:<5d} {prov:26s} median {tm.median_ms:10.3f} ms  "
                  f"min {tm.min_ms:10.3f}  spread {spread:5.1%}  vs verl {speedup}", flush=True)  # fmt: skip
        for prov, err in got.errors.items():
            rows.append((name, f"B={b} T={t}", prov, float("nan"), float("nan"), float("nan"), err, 0.0))
            print(f"{name} {prov}: {err}", flush=True)
    write(args, rows, time.time() - started)


def write(args, rows, seconds: float) -> None:
    lines = [
        "# Advantage estimators vs verl 0.9.1 (CPU)",
        "",
        f"- command: `PYTHONPATH=. python benchmarks/advantage_estimators.py --rounds {args.rounds} "
        f"--threads {args.threads}" + (" --no-compile" if args.no_compile else "") + "`",
        f"- date: {time.strftime('%Y-%m-%d %H:%M:%S')}, {seconds:.0f} s",
        f"- machine: {platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads, "
        f"torch {torch.__version__}, Python {platform.python_version()}",
        f"- load average (1/5/15 min) before: {'/'.join(f'{x:.1f}' for x in args.load_before)}, after: "
        f"{'/'.join(f'{x:.1f}' for x in os.getloadavg())} (a shared machine: medians are noisy, see spread)",
        f"- timing: {args.rounds} interleaved rounds per estimator (benchmarks/timing.py); median and min of "
        "all samples in ms; spread = largest / smallest round median - 1; 'vs verl' = verl's median / this "
        "median. 'warm-up' is the first call (torch.compile's compilation). No torch.compile row for "
        f"{', '.join(SCAN_BASED)}: their reference's returns are a Python loop over T, which torch.compile "
        "unrolls (it did not finish compiling 4096 steps in minutes).",
        "- inputs: outcome estimators B=65536 (16 responses per uid, rows shuffled), T=8; token-level "
        "B=64 (16 per uid), T=4096 (optimal_token_baseline also B=1024, T=512: 64 uids). verl gets a "
        "numpy array of uid strings; rk gets int64 ids (mapping "
        "string uids to ints is the caller's, e.g. np.unique(uids, return_inverse=True)).",
        "",
        "| estimator | shape | provider | median ms | min ms | spread | vs verl | warm-up s |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for name, shape, prov, med, mn, spread, speedup, warm in rows:
        lines.append(
            f"| {name} | {shape} | {prov} | {med:.3f} | {mn:.3f} | {spread:.0%} | {speedup} | {warm:.1f} |"
        )
    ms = [r[3] for r in rows if r[2] == "rk" and r[3] == r[3]]
    if ms:
        lines += [
            "",
            f"rk medians range {min(ms):.3f} to {max(ms):.3f} ms (median {statistics.median(ms):.3f}).",
        ]
    pathlib.Path(args.out).write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
