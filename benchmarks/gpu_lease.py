"""One call on a lent GPU for the speed issues (27: linear log-probs at GEMM speed; 28: the token ops with
the host out of the way): what only a GPU can say about them, most informative first, each step under its
own time limit and the whole under a deadline, into one report (the selftest's machinery:
rlkernels/selftest.py).

1. the extension loads and runs a CUDA C++ kernel (else it is built there);
2. the token ops' device time alone (CUDA graph replay: benchmarks/graph_replay.py) and policy_loss's forward
   tile sweep (benchmarks/policy_forward_sweep.py), the first measurements of the finishing tail's loads
   (docs/gpu_token_ops.md);
3. the blocked linear_logprobs path's constants swept at N=8192 D=4096 V=128256, against its GEMM floors,
   with the forward's accuracy against float64, and the frozen head's vocabulary stream against the row
   sweep it replaced (time and peak memory) (benchmarks/linear_blocked_sweep.py);
4. the tests that have a kernel flavor, on CUDA tensors, the linear and token-op files first;
5. the bench of linear_logprobs and linear_policy_loss (rlkernels, Liger-Kernel and cut-cross-entropy where
   carried as wheels, eager, the GEMM floors), with peak memory;
6. the bench of the token ops at their LLM shapes, forward + backward (forward for the constant ops),
   rlkernels against torch.compile and eager;
7. the bench of the advantage estimators' kernel flavors, against their byte floor;
8. the host work of policy_loss and kl_penalty in that machine's own control units
   (benchmarks/gpu_host_time.py), for the time model's host term.

    python benchmarks/gpu_lease.py --out /tmp/lease     # then carry /tmp/lease back (a tarball)
    python benchmarks/gpu_lease.py --dry-run            # without a GPU: the step list, nothing run
    python benchmarks/gpu_lease.py --skip sweep bench-linear   # leave out steps whose code did not change
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shlex
import sys

from rlkernels import selftest
from rlkernels.selftest_process import Step

# The whole call, made once per lease: what a lent machine's 15 minutes leave after its start (1-2 min),
# the transfers and a margin. The 2026-11-30 lease ran 560 s (--total) in a first call of 554 s, then two
# short calls while the machine was warm (benchmarks/results/h200/2026-11-30/README.md).
TOTAL_LIMIT = 560
# The flavored tests (the first lease's 1838 took 112 s), the files FIRST_TESTS names first. 2026-11-30: 1618
# of 2021 reported in 110 s, 8 workers lost to device asserts (marked fires_device_asserts since).
TESTS_LIMIT = 100
PY = sys.executable
BENCH = [PY, "-m", "rlkernels", "bench", "--device", "cuda", "--shapes", "llm", "--rounds", "3"]
BENCH += ["--no-plot", "--no-progress"]
# In this order: the ops whose kernels changed since the last run first (agg_loss: its GPU_ORDER waits on its
# row; the CUDA C++ 16-byte packs of 2026-11-30), gae last (its eager scan takes seconds a call: the step was
# cut after its rows on 2026-11-30). group_advantages is left out: its eager baseline over group ids is a
# Python loop of seconds per call, which takes a step's whole time (the first lease).
TOKEN_OPS = ["policy_loss", "agg_loss", "value_loss", "kl_penalty", "logprobs_from_logits"]
TOKEN_OPS += ["rollout_correction", "gae"]
# benchmarks/bench_advantage_estimators.py's ops, the ones with kernels of their own first.
ESTIMATOR_OPS = [
    "group_advantages[ids, mask]",  # verl's grpo: its sorted path in chunks at B=8192, never on a GPU yet
    "optimal_token_baseline_advantages", "grpo_passk_advantages", "opo_advantages", "gpg_advantages",
    "reinforce_plus_plus_baseline_advantages", "gdpo_advantages", "trl_grpo_advantages",
    "trl_grpo_advantages[normalize_then_sum]", "reinforce_plus_plus_advantages", "remax_advantages",
]  # fmt: skip
# The test files of the paths these issues changed, and of the H200 run's failures, before the rest.
FIRST_TESTS = [
    "tests/test_float_arg.py", "tests/test_device_asserts.py", "tests/test_cuda_graphs.py",
    "tests/test_linear_blocked.py", "tests/test_linear_gemm_stats.py", "tests/test_linear_gemm_dlogits.py",
    "tests/test_linear_logprobs.py",
    "tests/test_linear_sweep.py",
    "tests/test_linear_policy_loss.py", "tests/test_policy_loss.py", "tests/test_loss_finish.py",
    "tests/test_policy_loss_eager_autograd.py", "tests/test_kl.py", "tests/test_kl_eager_autograd.py",
    "tests/test_rollout_correction.py", "tests/test_value_loss.py", "tests/test_agg_loss.py",
    "tests/test_logprobs_from_logits.py",
    "tests/test_gae.py", "tests/test_group_advantages.py", "tests/test_advantage_estimators.py", "tests",
]  # fmt: skip


def _step(name: str, slug: str, command: list[str], limit: float) -> tuple[Step, float]:
    return Step(name, slug, command), limit


def plan(out: pathlib.Path) -> tuple[list[tuple[Step, float]], list[tuple[Step, float]]]:
    """(step, limit in seconds) before the tests and after them, in order."""
    sweep = [PY, "benchmarks/linear_blocked_sweep.py", "--json", str(out / "sweep.json")]
    tokens = [
        "--ops",
        *TOKEN_OPS,
        "--modes",
        "full",
        "--no-memory",
        "--providers",
        "rlkernels*",
        "torch.compile",
    ]
    linear = ["--ops", "linear_logprobs", "linear_policy_loss", "--providers", "rlkernels*"]
    replay = [PY, "benchmarks/graph_replay.py", "--ops", "policy_loss", "value_loss", "kl_penalty"]
    replay += ["agg_loss"]  # new since the fourth run
    replay += ["logprobs_from_logits"]  # the CUDA C++ row kernels' 16-byte packs (2026-11-29), both flavors
    forward_sweep = [PY, "benchmarks/policy_forward_sweep.py"]
    before = [
        _step("nvidia-smi", "nvidia-smi", ["nvidia-smi"], 10),
        _step("token ops by CUDA graph replay", "graph-replay", replay + ["--calls", "100"], 60),
        # cut at 30 s on 2026-11-30 before its finishing-tail variants (the last two)
        _step("policy_loss forward tile sweep", "policy-forward-sweep", forward_sweep, 45),
        # 45 s on 2026-11-27; the GEMM kernels' variants add their compiles, the frozen head's 5 paths ~20 s,
        # and its small batch's 3 (2026-11-30) a few seconds
        _step("linear_logprobs blocked-path sweep", "sweep", sweep, 100),
    ]
    after = [
        _step(
            "bench linear ops",
            "bench-linear",
            BENCH + linear + ["liger-kernel", "cut-cross*", "--out", str(out / "bench-linear")],
            130,  # 73 s on 2026-11-27; 2026-11-30: cut at 100 s in linear_policy_loss with a frozen head
        ),
        # 2026-11-30: cut at 80 and at 100 s after gae's rows (its eager scan takes 1.8 s a call)
        _step("bench token ops", "bench-tokens", BENCH + tokens + ["--out", str(out / "bench-tokens")], 110),
    ]
    return before, after


def after_tests(out: pathlib.Path) -> list[tuple[Step, float]]:
    """The steps after the tests: the advantage estimators' kernels; the host work in control units, for the
    time model's host term (last: it printed nothing within 50 s on 2026-11-30, and the CPU machine measures
    the units under the GPU machine's software too, benchmarks/gpu_model.py HOST_UNITS_146)."""
    cmd = [PY, "benchmarks/gpu_host_time.py", "--rounds", "2", "--cases", "policy_loss", "kl_penalty"]
    estimators = BENCH + ["--ops", *ESTIMATOR_OPS, "--no-memory", "--providers", "rlkernels*"]
    return [
        _step(
            "bench advantage estimators",
            "bench-estimators",
            estimators + ["--out", str(out / "bench-est")],
            40,
        ),
        _step("host work in control units", "host-time", cmd + ["--providers", "triton", "cpu"], 50),
    ]


def slugs(out: pathlib.Path) -> list[str]:
    """The names --skip takes, in the call's order."""
    before, benches = plan(out)
    return [s.slug for s, _ in before] + ["tests"] + [s.slug for s, _ in benches + after_tests(out)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="build/gpu-lease", help="the report and every step's files")
    parser.add_argument("--dry-run", action="store_true", help="print the steps, run nothing")
    parser.add_argument("--total", type=float, default=TOTAL_LIMIT, help="the deadline, seconds")
    parser.add_argument(
        "--skip", nargs="+", default=[], metavar="SLUG", help="steps left out (as --dry-run names them)"
    )
    args = parser.parse_args(argv)
    out = pathlib.Path(args.out).resolve()
    before, benches = plan(out)
    unknown = set(args.skip) - set(slugs(out))
    if unknown:
        parser.error(f"--skip: no step {sorted(unknown)}; the steps: {' '.join(slugs(out))}")

    def kept(listed):
        return [(step, limit) for step, limit in listed if step.slug not in args.skip]

    before, benches = kept(before), kept(benches)
    after = kept(after_tests(out))
    run_tests = "tests" not in args.skip
    if args.dry_run:
        for step, limit in before:
            print(f"{limit:4.0f} s  {step.slug}: {shlex.join(step.command)}")
        if run_tests:
            print(f"{TESTS_LIMIT:4.0f} s  tests: pytest {' '.join(FIRST_TESTS)}")
        for step, limit in benches + after:
            print(f"{limit:4.0f} s  {step.slug}: {shlex.join(step.command)}")
        return 0
    import torch

    if not torch.cuda.is_available():
        print("gpu_lease: no CUDA device here (--dry-run prints the steps)", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    run = selftest.Run(out, out / "report.md", dry_run=False, total=args.total)
    os.environ.pop("TRITON_INTERPRET", None)

    def steps(listed):
        def run_them(run):
            for step, limit in listed:
                run.run(step, limit)

        return run_them

    def tests(run):
        selftest.tests_step(run, FIRST_TESTS, "cuda,triton", limit=TESTS_LIMIT)

    order = [selftest.extension_steps, steps(before)] + [tests] * run_tests + [steps(benches), steps(after)]
    return selftest.run_steps(run, order)


if __name__ == "__main__":
    sys.exit(main())
