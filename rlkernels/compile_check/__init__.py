"""`python -m rlkernels compile-check`: every GPU kernel compiled for the GPUs users run, on a machine
without one.

- Triton (triton_check.py): every launcher's compile cases (rlkernels/triton/_specializations.py) run with
  launches turned into compiles for sm_80 and sm_90 (launch.py), through the launchers' own argument
  binding, every autotune config the pruning keeps; each specialization's shared memory, registers and
  spills checked against the target (targets.py) and the budgets (budgets.py).
- CUDA C++ (nvcc.py): every csrc/cuda/*.cu compiled for the same targets with `nvcc -Xptxas -v`.
docs/compile_check.md explains the design and the budgets.
"""

from __future__ import annotations

import pathlib
import sys
import time

from rlkernels.compile_check import nvcc, report, triton_check
from rlkernels.compile_check.targets import TARGETS


def main(
    archs=(80, 90), *, jobs=None, triton=True, cuda=True, select=None, out_dir=None, progress=True
) -> int:
    """Run the check; print the summary; write the CSV reports into `out_dir`. Returns 0 when every kernel
    compiled within its target's limits and the budgets, else 1."""
    out = pathlib.Path(out_dir or "build/compile-check")
    out.mkdir(parents=True, exist_ok=True)
    problems = []
    start = time.perf_counter()
    if triton:
        cases = [c for c in triton_check.list_cases() if select is None or select in c[2]]
        results = triton_check.run(
            archs, jobs=jobs, select=select, progress=_bar("Triton") if progress else None
        )
        specs, findings = triton_check.check(results)
        report.write_triton_csv(specs, out / "triton.csv")
        print(report.triton_summary(specs, len(cases)))
        print(report.pruned_summary(specs))
        problems += [f"sm_{f.arch} {f.where}: {f.what}" for f in findings]
    if cuda:
        if nvcc.nvcc() is None:
            problems.append(
                "CUDA C++: nvcc not found on PATH (install the CUDA toolkit or pass --triton-only)"
            )
        elif not nvcc.sources():
            print(f"CUDA C++: no sources under {nvcc.CSRC} (run from a source checkout); skipped")
        else:
            kernels, errors = nvcc.run(archs, jobs=jobs)
            report.write_cuda_csv(kernels, out / "cuda.csv")
            print(report.cuda_summary(kernels))
            problems += errors + nvcc.findings(kernels)
    print(f"reports: {out}/triton.csv, {out}/cuda.csv ({time.perf_counter() - start:.0f} s)")
    if problems:
        print(f"\nFAILED: {len(problems)} problem(s)")
        for p in problems:
            print(f"  {p}")
        return 1
    print(
        "OK: every kernel compiles for "
        + ", ".join(TARGETS[a].name for a in archs)
        + " within limits and budgets"
    )
    return 0


def _bar(name):
    def progress(done, total):
        if done == total or done % 25 == 0:
            print(f"  {name}: {done}/{total} compile cases", file=sys.stderr, flush=True)

    return progress
