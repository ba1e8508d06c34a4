"""The Triton half of the compile check: every launcher's compile cases (rlkernels/triton/
_specializations.py), compiled for each target in worker processes, checked against the target's limits
and the budgets."""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import functools
import importlib
import multiprocessing
import os
import time
import traceback

from rlkernels.compile_check.budgets import TRITON_FP64_SPILL_BYTES, TRITON_SPILL_BYTES
from rlkernels.compile_check.launch import Compiled
from rlkernels.compile_check.targets import TARGETS

# The modules whose launchers the check runs: every rlkernels/triton module with @triton.jit kernels.
MODULES = (
    "kl",
    "gae",
    "advantages",
    "policy_loss",
    "value_loss",
    "agg_loss",
    "logprobs_from_logits",
    "linear_logprobs",
    "linear_logprobs_backward",
    "linear_blocked",
    "linear_gemm_stats",
    "linear_gemm_dlogits",
    "rollout_correction",
    "outcome_estimators",
    "optimal_token_baseline",
    "logp_jacobian",
)


@dataclasses.dataclass
class CaseResult:
    arch: int
    module: str
    label: str
    compiled: list[Compiled]
    error: str | None = None


@functools.cache
def _cases(module: str):
    """A module's compile cases; `module` is a name in rlkernels/triton/ or a dotted module path."""
    name = module if "." in module else f"rlkernels.triton.{module}"
    return list(importlib.import_module(name).compile_cases())


def _worker_init():
    # Launchers must take their GPU path (autotune, GPU block sizes), not the interpreter's (a guard: the
    # workers are spawned without the variable, see run()).
    os.environ.pop("TRITON_INTERPRET", None)
    import warnings

    warnings.filterwarnings("ignore", message="TRITON_DEFAULT_FP_FUSION")


def _run_case(arch: int, module: str, index: int) -> CaseResult:
    from rlkernels.compile_check.launch import compile_only

    case = _cases(module)[index]
    with compile_only(TARGETS[arch], all_configs=case.all_configs) as recorder:
        try:
            case.run()
            error = None
        except Exception as e:  # a compile or launch-binding error is the finding
            error = f"{type(e).__name__}: {_last_line(e)}\n{traceback.format_exc(limit=-3)}"
    return CaseResult(arch, module, case.label, recorder.compiled, error)


def _last_line(e: Exception) -> str:
    lines = [ln for ln in str(e).strip().splitlines() if ln.strip()]
    return lines[-1] if lines else repr(e)


def list_cases(modules=MODULES) -> list[tuple[str, int, str]]:
    """(module, index, label) of every compile case, in a fixed order."""
    out = []
    for m in modules:
        out += [(m, i, c.label) for i, c in enumerate(_cases(m))]
    return out


@contextlib.contextmanager
def _environment_without(name: str):
    """os.environ without `name` inside the block (processes spawned there inherit it), restored after."""
    saved = os.environ.pop(name, None)
    try:
        yield
    finally:
        if saved is not None:
            os.environ[name] = saved


def run(archs, modules=MODULES, jobs: int | None = None, select: str | None = None, progress=None):
    """Compile every case for every arch in worker processes; returns the CaseResults. `select`: only
    cases whose label contains it. The calling process only enumerates the cases (it may run under the
    interpreter, e.g. inside pytest); the workers start without TRITON_INTERPRET."""
    cases = [c for c in list_cases(modules) if select is None or select in c[2]]
    tasks = [(arch, m, i) for arch in archs for m, i, _ in cases]
    jobs = jobs or os.cpu_count() or 1
    ctx = multiprocessing.get_context("spawn")
    results = []
    with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=ctx, initializer=_worker_init) as pool:
        with _environment_without("TRITON_INTERPRET"):  # the workers spawn while the tasks are submitted
            futures = [pool.submit(_run_case, *t) for t in tasks]
        for done, future in enumerate(concurrent.futures.as_completed(futures), 1):
            results.append(future.result())
            if progress:
                progress(done, len(futures))
    order = {t: k for k, t in enumerate(tasks)}
    index = {(m, label): i for m, i, label in cases}
    results.sort(key=lambda r: order[(r.arch, r.module, index[(r.module, r.label)])])
    return results


@dataclasses.dataclass
class Finding:
    arch: int
    where: str
    what: str


def check(results) -> tuple[dict, list[Finding]]:
    """Deduplicated specializations per target ({arch: {key: Compiled}}) and the findings: case errors,
    shared memory over the target's limit, fp32 scalar arguments, spills over the budget, a device assert
    asked for (CHECK_MSG) but not compiled in, and autotuned tiles whose shared memory exceeds the pruning
    model's bound (rlkernels/triton/_gemm.py)."""
    from rlkernels.triton._gemm import REGISTRY, operand_class, shared_memory_bytes

    findings, specs = [], {}
    for r in results:
        target = TARGETS[r.arch]
        if r.error:
            findings.append(Finding(r.arch, f"{r.module}: {r.label}", r.error))
        for c in r.compiled:
            specs.setdefault(r.arch, {}).setdefault(c.key() + (c.pruned is not None,), c)
            if c.pruned:
                continue
            where = f"{c.kernel}[{describe(c)}]"
            if c.shared > target.max_shared_mem:
                findings.append(
                    Finding(
                        r.arch, where, f"shared memory {c.shared} B > {target.max_shared_mem} B per block"
                    )
                )
            for name in _fp32_scalars(c):
                findings.append(
                    Finding(
                        r.arch,
                        where,
                        f"`{name}` is an fp32 scalar argument: Triton passes a Python float "
                        "as fp32, which a float64 kernel sees rounded; declare it `tl.float64`",
                    )
                )
            if c.constexprs.get("CHECK_MSG") is not None and c.asserts == 0:
                findings.append(
                    Finding(
                        r.arch, where, "CHECK_MSG is given but no device assert was compiled: the launch "
                        "must pass rlkernels/triton/_device_assert.py's options (debug=True)",
                    )
                )  # fmt: skip
            budget = TRITON_FP64_SPILL_BYTES if _fp64(c) else TRITON_SPILL_BYTES
            if c.stack > budget:
                findings.append(Finding(r.arch, where, f"spills {c.stack} B/thread > {budget} B"))
            tiles = REGISTRY.get(c.kernel)
            if tiles is not None:
                tile = tiles.tile_of(c.constexprs, c.num_warps, c.num_stages)
                operand = operand_class(_operand_dtype(c, tiles), c.constexprs.get("INPUT_PRECISION", "ieee"))
                bound = shared_memory_bytes(tile, operand, r.arch)
                if c.shared > bound:
                    findings.append(
                        Finding(r.arch, where, f"shared memory {c.shared} B > pruning bound {bound} B")
                    )
    return specs, findings


def _fp32_scalars(c: Compiled) -> list[str]:
    """The arguments compiled as fp32 scalars (every float option must be declared tl.float64)."""
    return [name for name, ty in c.arg_types.items() if ty.removesuffix("/16") == "fp32"]


def _fp64(c: Compiled) -> bool:
    """A specialization whose data is fp64 (its first pointer argument)."""
    pointers = [t for t in c.arg_types.values() if t.startswith("*")]
    return bool(pointers) and pointers[0].startswith("*fp64")


def _operand_dtype(c: Compiled, tiles):
    import torch

    ty = c.arg_types[tiles.operand_arg].removeprefix("*").removesuffix("/16")
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "fp64": torch.float64}[ty]


def describe(c: Compiled) -> str:
    consts = ",".join(f"{k}={_short(v)}" for k, v in c.constexprs.items())
    return f"{c.signature}|{consts}|w{c.num_warps}s{c.num_stages}"


def _short(v) -> str:
    s = str(v)
    return s.removeprefix("triton.language.").removeprefix("fp")


def timed(fn, *args, **kwargs):
    start = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - start
