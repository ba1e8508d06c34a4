"""rk.rollout_correction against the peers' eager code on the same batch, interleaved in one process:
verl 0.9.1's compute_rollout_correction_and_rejection_mask, TRL 1.16's importance-sampling block and its
metrics block (cut from GRPOTrainer's source and run as they are, as tests/test_rollout_correction.py
does), and torch.compile of rlkernels' reference. A floor: one fused elementwise pass over the same bytes
(read logp_old, logp_rollout, mask; write the weights), torch.add into a preallocated output.

    PYTHONPATH=. python benchmarks/rollout_correction.py [--b 64] [--t 4096] [--rounds 5] [--device cuda]

Writes benchmarks/results/rollout_correction.md (rollout_correction-cuda.md with --device cuda). "rlkernels"
is the fused pass (C++ on the CPU, Triton on a GPU), "rlkernels (eager)" the reference path. Each provider
computes its own metric set: verl's includes perplexities and chi-square terms and reads every metric back
with .item(); TRL's logs min/mean/max of the ratio and the log-prob difference; rlkernels' the set in its
docstring, as 0-dim tensors.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import pathlib
import platform
import statistics
import sys
import textwrap
from collections import defaultdict
from types import SimpleNamespace

import torch

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from timing import time_interleaved  # noqa: E402

import rlkernels as rk  # noqa: E402
from rlkernels.ops.rollout_correction import check_config, from_trl, from_verl  # noqa: E402
from rlkernels.reference import rollout_correction as reference  # noqa: E402

RESULTS = pathlib.Path(__file__).parent / "results" / "rollout_correction.md"


def _trl_code():
    spec = importlib.util.find_spec("trl")
    if spec is None:
        return None
    text = (pathlib.Path(spec.submodule_search_locations[0]) / "trainer" / "grpo_trainer.py").read_text()

    def block(start, end):
        i = text.rindex("\n", 0, text.index(start)) + 1
        j = text.rindex("\n", 0, text.index(end, i)) + 1
        return compile(textwrap.dedent(text[i:j]), "trl-grpo_trainer", "exec")

    return (
        block(
            "# Compute the importance sampling ratio when using vLLM",
            "# Compute the per-token log probabilities",
        ),
        block("delta = torch.abs(old_per_token_logps - sampling_per_token_logps)", "output = {"),
    )


def _trl_step(code, old, rollout, mask, mode, clip_max):
    def step():
        trainer = SimpleNamespace(
            use_vllm=True, vllm_importance_sampling_correction=True, vllm_importance_sampling_mode=mode,
            vllm_importance_sampling_clip_max=clip_max, vllm_importance_sampling_clip_min=None,
            accelerator=SimpleNamespace(gather=lambda x: x.reshape(1)),
            _metrics=defaultdict(lambda: defaultdict(list)),
        )  # fmt: skip
        scope = dict(
            self=trainer, torch=torch, math=math, completion_mask=mask, tool_mask=None,
            old_per_token_logps=old, sampling_per_token_logps=rollout, mode="train", device=old.device,
            nanmin=lambda x: x[~x.isnan()].min(), nanmax=lambda x: x[~x.isnan()].max(),
        )  # fmt: skip
        exec(code[0], scope)
        exec(code[1], scope)
        return scope["vllm_importance_sampling_ratio"]

    return step


def _loadavg() -> str:
    try:
        return " ".join(pathlib.Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--b", type=int, default=64)
    parser.add_argument("--t", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    args = parser.parse_args()
    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    b, t = args.b, args.t
    gen = torch.Generator().manual_seed(0)
    rollout = -3 * torch.rand(b, t, generator=gen)
    old = rollout + 0.05 * torch.randn(b, t, generator=gen)
    lengths = torch.randint(t // 4, t + 1, (b,), generator=gen)
    mask = torch.arange(t)[None, :] < lengths[:, None]
    rollout, old, mask = rollout.to(device), old.to(device), mask.to(device)
    maskf, maski = mask.float(), mask.long()
    out = torch.empty(b, t, device=device)

    try:
        from verl.trainer.ppo import rollout_corr_helper as verl_helper
    except ImportError:
        verl_helper = None
    trl_code = _trl_code()

    # The configurations: verl's / TRL's option spellings and the same options for rlkernels.
    configs = {
        "token TIS (C=2)": (
            dict(rollout_is="token", rollout_is_threshold=2.0), "token_truncate", 2.0,
        ),
        "sequence MIS (C=2) + seq_sum_k1 RS": (
            dict(rollout_is="sequence", rollout_is_threshold="0.5_2.0", rollout_rs="seq_sum_k1",
                 rollout_rs_threshold="0.5_2.0"), "sequence_mask", 2.0,
        ),
    }  # fmt: skip
    lines = [
        f"# rollout_correction on {'CPU' if device.type == 'cpu' else torch.cuda.get_device_name(device)}",
        "",
        "Command: `PYTHONPATH=. python benchmarks/rollout_correction.py "
        f"--b {b} --t {t} --rounds {args.rounds}"
        + (f" --threads {args.threads}" if args.threads else "")
        + (f" --device {args.device}`" if device.type != "cpu" else "`"),
        "",
        f"B={b}, T={t}, fp32 log-probs, bool mask (lengths uniform in [T/4, T]); torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads, {platform.processor() or platform.machine()}, "
        f"python {platform.python_version()}. Interleaved rounds (benchmarks/timing.py): per provider the "
        "median of all samples, the min, and the spread of the round medians ((max - min) / median). "
        f"Load average at the start: {_loadavg()}.",
        "",
    ]
    for title, (verl_case, trl_mode, trl_cap) in configs.items():
        options = from_verl(**verl_case)
        config = check_config(reference.RolloutCorrectionConfig(**options))
        compiled = torch.compile(
            lambda o, r, m, c=config: reference.rollout_correction(o, r, m, c), dynamic=False
        )
        steps = {
            "rlkernels": lambda o=options: rk.rollout_correction(old, rollout, mask, **o),
            "rlkernels (eager)": lambda o=options: rk.rollout_correction(
                old, rollout, mask, **o, backend="reference"
            ),
            "torch.compile(reference)": lambda f=compiled: f(old, rollout, mask),
            "floor (one fused pass)": lambda: torch.add(old, rollout, out=out),
        }
        if verl_helper is not None:
            steps["verl (eager)"] = lambda c=verl_case: (
                verl_helper.compute_rollout_correction_and_rejection_mask(old, rollout, maskf, **c)
            )
        if trl_code is not None:
            steps["TRL (eager, IS only)"] = _trl_step(trl_code, old, rollout, maski, trl_mode, trl_cap)
            trl_options = from_trl(trl_mode, trl_cap)
            steps["rlkernels, TRL's options"] = lambda o=trl_options: rk.rollout_correction(
                old, rollout, mask, **o
            )
        result = time_interleaved(steps, device, rounds=args.rounds)
        base = result.timings["rlkernels"].median_ms
        lines += [
            f"## {title}",
            "",
            "| provider | median ms | min ms | spread | x rlkernels |",
            "|---|---|---|---|---|",
        ]
        for name, tm in result.timings.items():
            meds = tm.round_medians
            spread = (max(meds) - min(meds)) / statistics.median(meds)
            ratio = tm.median_ms / base
            lines.append(f"| {name} | {tm.median_ms:.3f} | {tm.min_ms:.3f} | {spread:.1%} | {ratio:.2f} |")
        for name, err in result.errors.items():
            lines.append(f"| {name} | failed: {err} | | | |")
        if result.neighbor_cpus is not None:
            lines += ["", f"CPUs used by other processes during the rounds: {result.neighbor_cpus:.2f}."]
        lines.append("")
    text = "\n".join(lines)
    print(text)
    (RESULTS if device.type == "cpu" else RESULTS.with_name("rollout_correction-cuda.md")).write_text(text)


if __name__ == "__main__":
    main()
