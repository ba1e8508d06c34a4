"""The compile check (`python -m rlkernels compile-check`): its covering designs, its specialization tables,
and that it reports each kind of defect a real GPU compile or launch hits (planted in
tests/compile_check_fixtures/planted.py). CI runs the whole check for sm_80 and sm_90 as a step of its own."""

import ast
import dataclasses
import itertools
import pathlib

import pytest
import torch

from rlkernels.compile_check import launch, nvcc, triton_check
from rlkernels.triton import _specializations as spec

TRITON_DIR = pathlib.Path(__file__).resolve().parents[1] / "rlkernels" / "triton"


def test_pairwise_covers_every_pair():
    axes = {
        "a": (1, 2, 3),
        "b": ("x", "y"),
        "c": (None, 0, 1, 2, 3, 4, 5),
        "d": (True, False),
        "e": (7, 8, 9),
    }
    rows = spec.pairwise(axes)
    for (n1, v1s), (n2, v2s) in itertools.combinations(axes.items(), 2):
        for v1, v2 in itertools.product(v1s, v2s):
            assert any(r[n1] == v1 and r[n2] == v2 for r in rows), (n1, v1, n2, v2)
    assert len(rows) < 3 * 7 * 2  # far below the full product (3*2*7*2*3 = 252)


def test_covering_has_every_resource_combination_at_the_heaviest_options():
    rows = spec.covering(
        features={"opt": (False, True), "dtype": ("f32", "bf16")},
        resources={"dtype": ("f32", "bf16"), "block": (64, 1024)},
        heaviest={"opt": True},
    )
    resource_rows = [r for r, is_resource in rows if is_resource]
    assert sorted((r["dtype"], r["block"]) for r in resource_rows) == sorted(
        itertools.product(("f32", "bf16"), (64, 1024))
    )
    assert all(r["opt"] is True for r in resource_rows)
    assert all(
        r["block"] == 1024 for r, is_resource in rows if not is_resource
    )  # options at the largest block


@pytest.mark.parametrize("module", triton_check.MODULES)
def test_every_triton_module_has_compile_cases(module):
    cases = triton_check._cases(module)
    assert cases and len({c.label for c in cases}) == len(cases)


def test_every_jit_kernel_is_in_a_checked_module():
    """A new rlkernels/triton module with @triton.jit kernels must join triton_check.MODULES."""
    for path in TRITON_DIR.glob("*.py"):
        tree = ast.parse(path.read_text())
        jitted = [
            f.name
            for f in tree.body
            if isinstance(f, ast.FunctionDef)
            and any(ast.unparse(d).startswith("triton.jit") for d in f.decorator_list)
            and f.name.startswith("_")
            and f.name.endswith("_kernel")
        ]
        if jitted:
            assert path.stem in triton_check.MODULES, (
                f"{path.name} launches {jitted} but is not compile-checked"
            )


def test_no_annotated_module_constants():
    """`X: tl.constexpr = v` at module level runs under the interpreter but not on a GPU."""
    for path in TRITON_DIR.glob("*.py"):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.AnnAssign) and "constexpr" in ast.unparse(node.annotation):
                pytest.fail(
                    f"{path.name}:{node.lineno}: write `{ast.unparse(node.target)} = tl.constexpr(...)`"
                )


@pytest.fixture(scope="module")
def planted():
    results = triton_check.run([80], modules=("compile_check_fixtures.planted",), jobs=2)
    return {r.label: r for r in results}, triton_check.check(results)[1]


def test_a_good_kernel_compiles_with_its_resources(planted):
    results, _ = planted
    (c,) = results["scale[ok]"].compiled
    assert results["scale[ok]"].error is None
    assert c.kernel == "_scale_kernel" and c.constexprs["BLOCK"] == 64
    assert 0 < c.registers <= 255 and c.stack == 0 and c.num_warps == 4


def test_an_annotated_global_is_a_compile_error(planted):
    results, findings = planted
    assert "Cannot access global variable ANNOTATED" in results["annotated[global]"].error
    assert any("annotated[global]" in f.where for f in findings)


def test_a_missing_constexpr_is_a_binding_error(planted):
    results, _ = planted
    assert "missing 1 required positional argument: 'BLOCK'" in results["scale[missing BLOCK]"].error


def test_shared_memory_over_the_limit_is_a_finding(planted):
    results, findings = planted
    (c,) = results["deep_pipeline[5 stages]"].compiled
    assert c.shared > 166_912
    assert any(f.where.startswith("_deep_pipeline_kernel") and "shared memory" in f.what for f in findings)


def test_an_fp32_scalar_argument_is_a_finding(planted):
    """A float option must reach a float64 kernel unrounded (the H200 run's float64 loss was off by 1.7e-8
    where the interpreter, which keeps Python floats, was exact): an undeclared float argument is compiled
    as fp32 and reported; the declared tl.float64 one is not, and costs a float32 kernel no fp64
    arithmetic."""
    results, findings = planted
    for dtype in ("float32", "float64"):
        (plain,) = results[f"_scaled_by_kernel[{dtype}]"].compiled
        (declared,) = results[f"_scaled_by_fp64_kernel[{dtype}]"].compiled
        assert plain.arg_types["scale"] == "fp32" and declared.arg_types["scale"] == "fp64"
    reported = [f.where for f in findings if "`scale` is an fp32 scalar argument" in f.what]
    assert len(reported) == 2 and all(w.startswith("_scaled_by_kernel[") for w in reported)
    (f32,) = results["_scaled_by_fp64_kernel[float32]"].compiled
    (f64,) = results["_scaled_by_fp64_kernel[float64]"].compiled
    assert f32.f64_ops == 0 and f64.f64_ops == 1  # float32: one conversion; float64: the multiply


def test_a_device_assert_is_compiled_in_with_its_options_only(planted):
    """rlkernels/triton/_device_assert.py: a kernel given CHECK_MSG with the module's launch options holds one
    __assertfail call; without debug=True the assert is compiled out, which the check reports; debug=True
    alone compiles Triton's integer-overflow checks too (more asserts), which the options turn off."""
    results, findings = planted
    (asserting,) = results["checked[asserting]"].compiled
    (no_debug,) = results["checked[no debug]"].compiled
    (sanitized,) = results["checked[sanitized]"].compiled
    assert asserting.asserts == 1 and no_debug.asserts == 0 and sanitized.asserts > 1
    reported = [f.where for f in findings if "no device assert was compiled" in f.what]
    assert len(reported) == 1 and reported[0].startswith("_checked_kernel["), reported  # no debug


def test_f64_ops_counts_fp64_arithmetic_only():
    ptx = """
\tld.param.b64 \t%rd8, [k_param_3];
\tcvt.rn.f32.f64 \t%r7, %rd8;
\tmul.f64 \t%rd3, %rd7, %rd1;
\t@%p1 fma.rn.f64 \t%rd1, %rd2, %rd3, %rd4;
\tsetp.gt.f64 \t%p94, %rd9, 0d3690000000000000;
\tmov.f64 \t%rd1, 0d0000000000000000;
\tst.global.f64 \t[%rd2], %rd1;
\tadd.f32 \t%r1, %r2, %r3;
"""
    assert launch.f64_ops(ptx) == 3


def test_async_copies_counts_the_copies_only():
    ptx = """
\tcp.async.cg.shared.global [ %r23 + 0 ], [ %rd5 + 0 ], 0x10, %r24;
\t@%p3 cp.async.ca.shared.global [ %r25 + 0 ], [ %rd6 + 0 ], 0x4, %r26;
\tcp.async.commit_group;
\tcp.async.wait_group 2;
\tld.global.v4.b32 { %r1, %r2, %r3, %r4 }, [ %rd7 + 0 ];
"""
    assert launch.async_copies(ptx) == 2


def test_wgmma_and_tma_counts_the_instructions_only():
    ptx = """
\twgmma.fence.sync.aligned;
\twgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {%r1}, %rd1, %rd2, p, 1, 1, 0, 1;
\twgmma.commit_group.sync.aligned;
\twgmma.wait_group.sync.aligned 1;
\t@%p7 cp.async.bulk.tensor.2d.shared::cta.global.mbarrier::complete_tx::bytes [%r3], [%rd4, {%r5}], [%r7];
\tcp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%r3], [%rd4, {%r5}], [%r7];
\tcp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%rd4, {%r5, %r6}], [%r3];
\tmbarrier.try_wait.parity.shared::cta.b64 %p1, [%r8], %r9;
"""
    assert launch.wgmma_ops(ptx) == 1
    assert launch.tma_loads(ptx) == 2  # the two loads, not the store to global


def test_fma_ops_counts_fp32_fma_only():
    ptx = """
\tfma.rn.f32 \t%r417, %r1, %r122, %r416;
\t@%p2 fma.rn.ftz.f32 \t%r5, %r1, %r2, %r3;
\tfma.rn.f64 \t%rd1, %rd2, %rd3, %rd4;
\tmul.f32 \t%r154, %r1, %r132;
\tsub.f32 \t%r304, %r242, %r2;
"""
    assert launch.fma_ops(ptx) == 1  # libdevice's (ftz) and the fp64 one are not contractions


def test_logits_kernels_round_z_before_the_statistics():
    """logprobs_from_logits' forward saves each row's LSE from z = x / τ; its backward recomputes log q = z −
    LSE. Both compile with _softmax.UNFUSED: no product fused into the add after it, so both round z, as the
    interpreter does. With Triton 3.6's default the forward's z − max became fma(x, 1/τ, −max) while the
    backward's z, after a select, was rounded: the H200 lease of 2026-11-30 found d logits 40x the fp32
    reference's error at a dominant logit (tests/test_logprobs_from_logits.py test_rows_at_any_alignment)."""
    module = "rlkernels.triton.logprobs_from_logits"
    results = triton_check.run([90], modules=(module,), jobs=2, select="float32]")
    compiled = [c for r in results for c in r.compiled]
    assert {c.kernel for c in compiled} == {"_logits_forward_kernel", "_logits_backward_kernel"}
    assert all(c.fma_ops == 0 for c in compiled), [(c.kernel, c.constexprs, c.fma_ops) for c in compiled]


def test_policy_forward_fits_three_programs_an_sm():
    """The bench's policy_loss forward (fp32, bool mask, dual clip, KL and entropy, its gradient saved; the
    2048-token tiles of 8 warps at T=8192) compiles for sm_90 to at most 80 registers a thread: 3 programs an
    SM, where at 2 a program's loads, arithmetic and finish overlapped little (docs/gpu_token_ops.md). A
    bool or integer mask weighs a kept token 1 with no product (triton/_mask.py `kept`); with the
    products it took 90 registers under Triton 3.6 and 96 under 3.9."""
    import json
    import os
    import subprocess
    import sys

    root = pathlib.Path(__file__).resolve().parents[1]
    script = (  # a process of its own: Triton compiles there, not under this one's interpreter
        "import json, gpu_model\n"
        "from rlkernels.compile_check.launch import cubin_resources\n"
        "tile, kernel = gpu_model.token_forwards()['policy_loss']\n"
        "print(json.dumps([tile, cubin_resources(kernel.asm['cubin'])[0]]))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(root / "benchmarks"), str(root), env.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    (block, warps), registers = json.loads(out.stdout.splitlines()[-1])
    sys.path.insert(0, str(root / "benchmarks"))
    import gpu_model

    assert (block, warps) == (2048, 8)
    assert gpu_model.programs_per_sm(registers, warps) >= 3, registers


def test_gemm_kernels_run_on_wgmma_and_tma():
    """The persistent GEMMs with the softmax in their epilogues (linear_gemm_stats.py, linear_gemm_dlogits.py)
    compile, on sm_90, to Hopper's warpgroup MMA with their operands loaded by TMA; not for sm_80 (they take
    sm_90 and later only). Their heaviest cases (bf16, softcap and entropy on); the compile check compiles
    every case and holds each to the budgets."""
    modules = ("rlkernels.triton.linear_gemm_stats", "rlkernels.triton.linear_gemm_dlogits")
    results = triton_check.run([80, 90], modules=modules, jobs=2, select="bfloat16,True,True")
    compiled = {arch: [c for r in results if r.arch == arch for c in r.compiled] for arch in (80, 90)}
    assert not compiled[80]
    assert {c.kernel for c in compiled[90]} == {"_gemm_stats_kernel", "_gemm_dlogits_kernel"}
    assert all(c.wgmma > 0 and c.tma_loads > 0 for c in compiled[90]), [
        (c.kernel, c.wgmma, c.tma_loads) for c in compiled[90]
    ]
    assert not triton_check.check(results)[1]


def test_ptxas_log_parsing():
    log = """ptxas info    : Compiling entry function '_Z6kernelPf' for 'sm_80'
ptxas info    : Function properties for _Z6kernelPf
    16 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers, 256 bytes smem, 400 bytes cmem[0]
ptxas info    : Compiling entry function '_Z5otherPd' for 'sm_90'
ptxas info    : Function properties for _Z5otherPd
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 200 registers, used 0 barriers, 400 bytes cmem[0]
"""
    a, b = nvcc.parse_ptxas(log, "x.cu")
    assert (a.arch, a.name, a.registers, a.stack, a.spill_stores, a.spill_loads, a.shared) == (
        80,
        "_Z6kernelPf",
        40,
        16,
        8,
        12,
        256,
    )
    assert (b.arch, b.registers, b.shared) == (90, 200, 0)
    found = nvcc.findings([a, b])
    assert any("spills 12 B" in f for f in found) and any("200 registers" in f for f in found)


def test_wide_loads_counts_each_kernels_128_bit_loads():
    sass = """
	code for sm_90
		Function : _Z1aPKf
        /*0090*/                   LDG.E.64.CONSTANT R2, desc[UR12][R2.64] ;
        /*0f50*/              @!P2 LDG.E.128 R24, desc[UR12][R38.64] ;
        /*0fa0*/                   LDG.E.128.CONSTANT R20, desc[UR12][R36.64] ;
        /*0fb0*/                   STG.E.128 desc[UR12][R36.64], R20 ;
		Function : _Z1bPKf
        /*0390*/                   LDG.E.U16.CONSTANT R14, desc[UR8][R14.64] ;
"""
    assert nvcc.wide_loads(sass) == {"_Z1aPKf": 2, "_Z1bPKf": 0}
    name = "void logits_rows_kernel<float, float>(float const*)"
    row = nvcc.CudaKernel(90, "logprobs.cu", name, 40, 0, 0, 0, 0)
    other = dataclasses.replace(row, name="void whiten_kernel<float>(float const*)")
    assert row.streams_packs and not other.streams_packs
    assert any("no 128-bit loads" in f for f in nvcc.findings([row, other]))
    assert not nvcc.findings([dataclasses.replace(row, wide_loads=4), other])
    assert nvcc.wide_loads(sass, nvcc._WIDE_STORE) == {"_Z1aPKf": 1, "_Z1bPKf": 0}


def test_token_kernels_packed_instantiations_are_held_to_128_bit_accesses():
    """The fp32 / fp64 instantiations of the token kernels on rows that take packs (the last template
    argument V > 1) must load or store 128 bits at a time; their V = 1 twins and the 8-byte bf16 packs need
    not."""
    ns = "void rlk::cuda::(anonymous namespace)::"
    packed = nvcc.CudaKernel(
        90, "value_loss.cu", ns + "value_forward_kernel<float, bool, 4>(float*)", 40, 0, 0, 0, 0
    )
    assert packed.token_packs
    for name in ("value_forward_kernel<float, bool, 1>", "agg_backward_kernel<__nv_bfloat16, bool, 4>"):
        assert not dataclasses.replace(packed, name=f"{ns}{name}(float*)").token_packs, name
    for name in ("agg_backward_kernel<double, float, 2>", "policy_forward_kernel<float, long, 4>",
                 "seq_partial_kernel<double, bool, 2>", "into_saved_kernel<float, bool, 4>"):  # fmt: skip
        assert dataclasses.replace(packed, name=f"{ns}{name}(double*)").token_packs, name
    assert any("no 128-bit loads or stores" in f for f in nvcc.findings([packed]))
    assert not nvcc.findings([dataclasses.replace(packed, wide_loads=0, wide_stores=1)])


def _fake_csrc(tmp_path, monkeypatch):
    """A csrc tree of one .cu and one header, nvcc's version stubbed: the cache's inputs, no compiler run."""
    csrc = tmp_path / "csrc"
    (csrc / "cuda").mkdir(parents=True)
    (csrc / "include").mkdir()
    (csrc / "cuda" / "k.cu").write_text("__global__ void k() {}\n")
    (csrc / "include" / "h.cuh").write_text("#pragma once\n")
    monkeypatch.setattr(nvcc, "CSRC", csrc)
    monkeypatch.setattr(nvcc, "nvcc", lambda: "nvcc")
    monkeypatch.setattr(nvcc, "_nvcc_version", lambda path: "release 13.0")
    monkeypatch.setenv("RLKERNELS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("RLKERNELS_NVCC_CHECK_CACHE", raising=False)
    return csrc


def test_nvcc_check_takes_an_unchanged_file_from_its_cache(tmp_path, monkeypatch):
    """A file compiled once is not compiled again while its inputs are the same; its kernels come back
    whole."""
    csrc = _fake_csrc(tmp_path, monkeypatch)
    compiled = []
    kernel = nvcc.CudaKernel(90, "k.cu", "k()", 40, 0, 0, 0, 128, wide_loads=2, mangled="_Z1kv")
    monkeypatch.setattr(
        nvcc, "_compile", lambda source, arch: compiled.append((source.name, arch)) or [kernel]
    )
    source = csrc / "cuda" / "k.cu"
    assert nvcc.compile_source(source, 90) == [kernel]
    assert nvcc.compile_source(source, 90) == [kernel]
    assert compiled == [("k.cu", 90)]
    assert nvcc.compile_source(source, 80) == [kernel]  # another target: compiled
    assert compiled == [("k.cu", 90), ("k.cu", 80)]
    monkeypatch.setenv("RLKERNELS_NVCC_CHECK_CACHE", "0")
    nvcc.compile_source(source, 90)
    assert len(compiled) == 3  # the cache off: compiled every time


def test_nvcc_check_cache_key_follows_every_input(tmp_path, monkeypatch):
    """The key changes with the source, any header under csrc (the include paths), nvcc's version, the
    target and the flags."""
    csrc = _fake_csrc(tmp_path, monkeypatch)
    source = csrc / "cuda" / "k.cu"
    key = nvcc.cache_key(source, 90)
    assert nvcc.cache_key(source, 90) == key
    keys = {key, nvcc.cache_key(source, 80)}
    (csrc / "include" / "h.cuh").write_text("#pragma once\n// changed\n")
    keys.add(nvcc.cache_key(source, 90))
    (csrc / "cuda" / "new.cuh").write_text("#pragma once\n")  # a header added
    keys.add(nvcc.cache_key(source, 90))
    source.write_text("__global__ void k() { }\n")
    keys.add(nvcc.cache_key(source, 90))
    monkeypatch.setattr(nvcc, "_nvcc_version", lambda path: "release 13.1")
    keys.add(nvcc.cache_key(source, 90))
    monkeypatch.setattr(nvcc, "NVCC_FLAGS", (*nvcc.NVCC_FLAGS, "-lineinfo"))
    keys.add(nvcc.cache_key(source, 90))
    assert len(keys) == 7


def _prune_on(target, tiles, dtype, precision, row_stride):
    import torch
    from triton.runtime import driver

    from rlkernels.compile_check.targets import OfflineDriver

    previous = driver._active
    driver.set_active(OfflineDriver(target))
    try:
        args = {tiles.operand_arg: torch.empty(1, dtype=dtype), **{s: row_stride for s in tiles.row_strides}}
        return [tiles.tile(c) for c in tiles.prune(tiles.configs, args, INPUT_PRECISION=precision)]
    finally:
        driver._active = previous


# The row loops that stream logits, and a compile case of each with 16-byte aligned rows, as the LLM
# vocabularies' are (an odd vocabulary such as GPT-2's 50257 has 2-byte aligned bf16 rows, which cp.async
# cannot take).
ROW_LOOPS = {  # (module, compile cases selected): the kernels they compile
    ("logprobs_from_logits", "aligned,bfloat16]"): {"_logits_forward_kernel", "_logits_backward_kernel"},
    ("linear_blocked", "block_stats[bfloat16"): {"_block_stats_kernel"},
    ("linear_blocked", "block_dlogits[bfloat16"): {"_block_dlogits_kernel"},
}


@pytest.mark.parametrize("module, select", ROW_LOOPS)
def test_logits_row_loops_keep_several_blocks_in_flight(module, select):
    """The kernels that stream [rows, V] logits through a loop over the columns (logprobs_from_logits'
    forward and backward, one program per row; the blocked path's statistics and d logits epilogues) load
    the next tiles while they work on one (LOAD_STAGES, EPI_STAGES: Triton pipelines the loop's loads with
    cp.async into shared memory), where a loop that loads as it computes, or a program per tile, has one
    tile in flight. Read off the sm_90 PTX the compile check counts them in."""
    kernels = ROW_LOOPS[module, select]
    results = triton_check.run([90], modules=(f"rlkernels.triton.{module}",), jobs=2, select=select)
    compiled = [c for r in results for c in r.compiled]
    assert {c.kernel for c in compiled} == kernels
    assert all(c.async_copies > 0 for c in compiled), [(c.kernel, c.async_copies) for c in compiled]


def test_prune_keeps_the_tiles_that_fit_the_device():
    """On a GPU with 99 KiB of shared memory per block (RTX 3090 / 4090, L40: sm_86 / sm_89) the tf32
    forward keeps only the tile whose operand buffers fit; A100 keeps both."""
    import torch

    from rlkernels.compile_check.targets import TARGETS, Target
    from rlkernels.triton._gemm import EPILOGUE_TILES, shared_memory_bytes
    from rlkernels.triton.linear_logprobs import LOGIT_TILES

    sm86 = Target(86, "RTX 3090 (sm_86)", max_shared_mem=101_376, multiprocessor_count=82)
    kept = _prune_on(sm86, LOGIT_TILES, torch.float32, "tf32", 4096)
    assert kept and all(shared_memory_bytes(t, "tf32", 86) <= sm86.max_shared_mem for t in kept)
    assert len(kept) < len(EPILOGUE_TILES["tf32"])
    assert _prune_on(TARGETS[80], LOGIT_TILES, torch.float32, "tf32", 4096) == list(EPILOGUE_TILES["tf32"])


def test_prune_picks_the_unaligned_tiles_for_unaligned_rows():
    import torch

    from rlkernels.compile_check.targets import TARGETS
    from rlkernels.triton._gemm import EPILOGUE_TILES, UNALIGNED_EPILOGUE_TILES
    from rlkernels.triton.linear_logprobs import LOGIT_TILES

    assert _prune_on(TARGETS[90], LOGIT_TILES, torch.bfloat16, "ieee", 4096) == list(EPILOGUE_TILES["fp16"])
    assert _prune_on(TARGETS[90], LOGIT_TILES, torch.bfloat16, "ieee", 1000) == list(
        UNALIGNED_EPILOGUE_TILES["fp16"]
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU the tests do not run the interpreter")
def test_running_the_check_leaves_this_process_under_the_interpreter(planted):
    """The check compiles in worker processes; the calling process (this test session) keeps its
    TRITON_INTERPRET (a run once removed it, and every later Triton test lost the interpreter)."""
    import os

    assert os.environ.get("TRITON_INTERPRET") == "1"
