"""`python -m rlkernels <command>`:

info                     the build (extension, CUDA archs, threads) and which backends run here
bench [--ops OP ...]     every op's providers side by side (see benchmarks/); --shapes small|llm
traffic [--ops OP ...]   bytes moved by each Triton kernel (under the interpreter) against the minimum
compile-check            every Triton and CUDA C++ kernel compiled for sm_80 / sm_90 (no GPU needed)
fake-cuda [--dynamo]     every public op's GPU branch on fake CUDA tensors (no GPU needed)
selftest                 on a GPU: oracle tests on CUDA tensors, compute-sanitizer, benchmark; one report
train --algo ALGO        a reward model, PPO, GRPO or DPO on a built-in task (--algo ALGO --help: its options)
"""

from __future__ import annotations

import argparse
import importlib
import os
import pathlib
import shlex
import sys

BENCH_DIR = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"


def _info(args) -> int:
    import torch

    from rlkernels import __version__, _backend, _ext

    print(f"rlkernels {__version__}, torch {torch.__version__} (CUDA {torch.version.cuda})")
    if torch.cuda.is_available():
        cap = torch.cuda.get_device_capability()
        name, count = torch.cuda.get_device_name(), torch.cuda.device_count()
        print(f"device: GPU {name} (sm_{cap[0]}{cap[1]}) x{count}, and the CPU")
    else:
        why = "this torch is a CPU-only build" if torch.version.cuda is None else "none visible to torch"
        print(f"device: no GPU found ({why}), CPU tensors only")
    if _ext.ext_available():
        info = _ext.build_info()
        cuda = f"compiled for archs {info['cuda_archs'] or '-'}" if info["cuda"] else "not compiled"
        print(f"extension: built, CUDA kernels: {cuda}, CPU threads: {info['num_threads']}")
    else:
        print(f"extension: not available ({_ext.ext_error()})")
    devices = [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])
    for device in devices:
        for backend in ("cpu", "cuda", "triton", "reference"):
            reason = _backend.unavailable_reason(backend, device)
            if device.type == "cuda" and backend == "cpu" or device.type == "cpu" and backend == "cuda":
                continue
            print(f"  {device.type:4s} {backend:9s} {'ok' if reason is None else 'unavailable: ' + reason}")
    return 0


def _bench_modules():
    if not BENCH_DIR.is_dir():
        raise SystemExit(
            f"rlkernels bench: the benchmarks live in the source checkout ({BENCH_DIR} not found); "
            "clone the repository and install it with `pip install --no-build-isolation -e .`"
        )
    sys.path.insert(0, str(BENCH_DIR))
    return [importlib.import_module(p.stem) for p in sorted(BENCH_DIR.glob("bench_*.py"))]


def _in_order(cases: list, ops: list[str]) -> list:
    """The cases of `ops`, in the order `ops` names them."""
    return sorted((c for c in cases if c.op in ops), key=lambda c: ops.index(c.op))


def _bench_command(args) -> tuple[str, list[str]]:
    """The command line that reproduces this run, and its options other than --ops / --modes / --rounds."""
    base = ["--shapes", args.shapes, "--device", args.device]
    if args.threads:
        base += ["--threads", str(args.threads)]
    if args.providers:
        base += ["--providers", *(shlex.quote(p) for p in args.providers)]
    cmd = ["python -m rlkernels bench"]
    if args.ops:
        cmd += ["--ops", *args.ops]
    if args.modes:
        cmd += ["--modes", *args.modes]
    cmd += [*base, "--rounds", str(args.rounds)]
    if args.out:
        cmd += ["--out", args.out]
    if args.no_memory:
        cmd.append("--no-memory")
    if args.no_plot:
        cmd.append("--no-plot")
    return " ".join(cmd), base


def _bench(args) -> int:
    import datetime
    import time

    import torch

    modules = _bench_modules()
    import harness
    import plots
    import report
    import run_record
    import timing

    args.rounds = args.rounds or timing.ROUNDS
    if args.device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    cases = [c for m in modules for c in m.cases(args.shapes, device)]
    known = sorted({c.op for c in cases})
    if args.ops:
        unknown = sorted(set(args.ops) - set(known))
        if unknown:
            raise SystemExit(f"rlkernels bench: unknown op(s) {unknown}; known: {known}")
        cases = _in_order(cases, args.ops)
    if args.providers:
        for c in cases:
            c.providers = harness.select_providers(c.providers, args.providers)
    out_dir = pathlib.Path(args.out) if args.out else run_record.new_run_dir()
    command, base = _bench_command(args)
    print(
        f"rlkernels bench: {len(cases)} cases of {sorted({c.op for c in cases})} on {device} "
        f"({torch.get_num_threads()} threads), shapes={args.shapes}, {args.rounds} interleaved rounds",
        flush=True,
    )
    warning = run_record.busy_warning()
    if warning:
        print(warning, flush=True)
    started, load_before, t0 = datetime.datetime.now(), run_record.load_average(), time.perf_counter()
    results = harness.run_cases(
        cases,
        device,
        modes=args.modes,
        rounds=args.rounds,
        measure_memory=not args.no_memory,
        progress=not args.no_progress,
    )
    print(report.format_table(results))
    files = []
    for op in sorted({r.op for r in results}):
        rows = [r for r in results if r.op == op]
        stem = f"{op}-{device.type}-{args.shapes}"
        report.write_csv(rows, str(out_dir / f"{stem}.csv"))
        files.append(f"{stem}.csv")
        if not args.no_plot:
            plots.plot(rows, str(out_dir / f"{stem}.png"), f"{op} on {device.type} ({args.shapes} shapes)")
            files.append(f"{stem}.png")
    seconds = time.perf_counter() - t0
    summary = report.noise_summary(results, report.rerun_command(results, base, args.rounds))
    run_record.write_run_record(
        out_dir / "run.md",
        command=command,
        device=device,
        started=started,
        seconds=seconds,
        load_before=load_before,
        rounds=args.rounds,
        summary=summary,
        files=files,
    )
    print(summary)
    print(f"wrote {len(files)} files and run.md to {out_dir} in {seconds:.0f} s")
    return 0


def _traffic(args) -> int:
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported
    modules = _bench_modules()
    import harness

    cases = [c for m in modules if hasattr(m, "traffic_cases") for c in m.traffic_cases()]
    if args.ops:
        cases = _in_order(cases, args.ops)
    rows = harness.measure_traffic(cases)
    print(harness.format_traffic(rows))
    return 0


def _compile_check(args) -> int:
    from rlkernels import compile_check

    return compile_check.main(
        tuple(args.arch),
        jobs=args.jobs,
        triton=not args.cuda_only,
        cuda=not args.triton_only,
        select=args.only,
        out_dir=args.out,
    )


def _selftest(args) -> int:
    from rlkernels import selftest

    return selftest.main(args.report, dry_run=args.dry_run, flavors=args.flavors)


def _fake_cuda(args) -> int:
    from rlkernels import fake_cuda

    return fake_cuda.main(args.options)


def _train(args) -> int:
    from rlkernels.trainers import cli

    return cli.main(args.algo, args.options)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlkernels", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="build information and available backends").set_defaults(func=_info)
    bench = sub.add_parser("bench", help="benchmark ops against eager PyTorch and the peers")
    bench.add_argument("--ops", nargs="+", help="ops to run (default: all)")
    bench.add_argument(
        "--shapes",
        choices=("small", "llm"),
        default="small",
        help="small: minutes on a 2-core CPU; llm: realistic LLM sizes",
    )
    bench.add_argument(
        "--providers",
        nargs="+",
        metavar="PATTERN",
        help="providers to time, as shell patterns ('rlkernels*', liger-kernel); eager and the floors, "
        "which the ratios are taken against, always run (default: all)",
    )
    bench.add_argument("--device", default="auto", help="auto (cuda if available), cpu or cuda")
    bench.add_argument(
        "--modes",
        nargs="+",
        choices=("forward", "backward", "full", "no_grad"),
        help="modes to time (default: each case's own)",
    )
    bench.add_argument("--threads", type=int, default=0, help="CPU threads (default: torch's)")
    bench.add_argument(
        "--rounds", type=int, default=None, help="interleaved timing rounds per comparison (default: 5)"
    )
    bench.add_argument(
        "--out",
        help="where the CSV, PNG and run.md files go (default: a fresh bench-runs/<date>-<time>/; "
        "benchmarks/results/ holds the committed reference run)",
    )
    bench.add_argument("--no-memory", action="store_true", help="skip the peak-memory pass")
    bench.add_argument("--no-plot", action="store_true", help="skip the PNG plots")
    bench.add_argument("--no-progress", action="store_true", help="no progress bar")
    bench.set_defaults(func=_bench)
    traffic = sub.add_parser("traffic", help="bytes moved by the Triton kernels against the minimum")
    traffic.add_argument("--ops", nargs="+", help="ops to run (default: all)")
    traffic.set_defaults(func=_traffic)
    check = sub.add_parser(
        "compile-check",
        help="compile every Triton and CUDA C++ kernel for real GPU targets (no GPU needed)",
        description="Compile every Triton kernel specialization the launchers can produce (every autotune "
        "config the pruning keeps) and every CUDA C++ kernel for each target; report shared memory, "
        "registers and spills; fail on a compile or launch-binding error or a limit or budget exceeded.",
    )
    check.add_argument(
        "--arch", type=int, nargs="+", default=[80, 90], choices=[80, 90], help="targets (sm_XX)"
    )
    check.add_argument("--jobs", type=int, default=0, help="compile processes (default: one per CPU)")
    check.add_argument("--triton-only", action="store_true", help="skip the CUDA C++ sources")
    check.add_argument("--cuda-only", action="store_true", help="skip the Triton kernels")
    check.add_argument("--only", help="only the Triton compile cases whose label contains this")
    check.add_argument("--out", default="build/compile-check", help="where the CSV reports go")
    check.set_defaults(func=_compile_check)
    selftest = sub.add_parser(
        "selftest",
        help="on a GPU: oracle tests on CUDA tensors, compute-sanitizer and the benchmark, into one report",
        description="Everything that needs a GPU, with time limits (under 8 minutes on an H100): the test "
        "suite's oracle for every op x GPU flavor x dtype on CUDA tensors, compute-sanitizer memcheck and "
        "racecheck over a short run of every op, and the headline benchmark. Writes one Markdown report.",
    )
    selftest.add_argument("--report", help="report path (default: build/selftest/report.md)")
    selftest.add_argument("--flavors", default="cuda,triton", help="test flavors to run (tests/oracle.py)")
    selftest.add_argument("--dry-run", action="store_true", help="without a GPU: the same steps on the CPU")
    selftest.set_defaults(func=_selftest)
    sub.add_parser(
        "fake-cuda",
        help="every public op's GPU branch (auto, triton, cuda) on fake CUDA tensors, no GPU needed",
        description="python -m rlkernels fake-cuda --help lists its options",
        add_help=False,
    ).set_defaults(func=_fake_cuda)
    train = sub.add_parser(
        "train",
        help="train a tiny Hugging Face model with rlkernels: --algo rm|grpo|ppo|dpo",
        description="A trainer of rlkernels.trainers on a built-in task; the options after --algo are its "
        "config's (python -m rlkernels train --algo grpo --help).",
        add_help=False,
    )
    train.add_argument("--algo", required=True, help="rm, grpo, ppo or dpo")
    train.set_defaults(func=_train)
    args, extra = parser.parse_known_args(argv)  # the train command's options are its algorithm's
    if args.command not in ("train", "fake-cuda") and extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.options = extra
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")  # no compile worker pool on small machines
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
