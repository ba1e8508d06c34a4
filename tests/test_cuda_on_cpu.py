"""The cuda-on-cpu harness itself (tests/cuda_on_cpu): it builds, its warp intrinsics, barrier, shared
memory, atomics and 16-bit conversions follow CUDA's documented semantics (expected values written from the
CUDA programming guide, and torch's own rounding for the conversions), undefined behavior is reported as a
launch error, and the flavor's context swaps the native CPU kernels for the sim and back.

The harness's kernels are in tests/cuda_on_cpu/selftest.cu, called through ctypes."""

import ctypes
import os
import pathlib
import subprocess
import sys

import pytest
import torch
from cuda_on_cpu import build, flavor
from oracle import kernel_flavors

import rlkernels  # noqa: F401  (loads the extension whose schemas the sim copies)

pytestmark = pytest.mark.skipif(not build.platform_supported(), reason="the harness runs on Linux only")

CUDA_SUCCESS, CUDA_ERROR_INVALID_CONFIGURATION, CUDA_ERROR_LAUNCH_FAILURE = 0, 9, 719
FULL = 0xFFFFFFFF
# The ops csrc/rlkernels.cpp declares for the CPU only (no CUDA binding): the flavor must refuse them. A GPU
# takes another path (logprobs_from_logits' out-of-place backward). policy_loss_backward_into_saved has a CUDA
# kernel since eb635fe, the optimal token baseline since 2026-11-29.
CPU_ONLY_OPS = {
    "logprobs_from_logits_backward_into_logits",
}


@pytest.fixture(scope="module")
def lib():
    sim = build.load()
    dll = ctypes.CDLL(sim.path)
    dll.rlk_sim_test_error.restype = ctypes.c_char_p
    return dll


def test_a_built_sim_is_kept_under_a_digest_of_its_inputs(tmp_path, monkeypatch):
    """The cache of built simulators: the digest moves with a source, a header, the flags, and not with the
    checkout's path; a kept build is copied whole and only the KEEP_BUILDS newest stay; RLKERNELS_SIM_CACHE=0
    turns the cache off."""
    sources, _ = build.generate()
    digest = build.sim_digest(sources)
    assert build.sim_digest(sources) == digest
    monkeypatch.setattr(build, "HERE", tmp_path)  # the harness's headers: this one
    (tmp_path / "include").mkdir()
    (tmp_path / "include" / "x.h").write_text("#pragma once\n")
    moved = {build.sim_digest(sources)}
    (tmp_path / "include" / "x.h").write_text("#pragma once\n// changed\n")
    moved.add(build.sim_digest(sources))
    monkeypatch.setattr(build, "CFLAGS", [*build.CFLAGS, "-DX"])
    moved.add(build.sim_digest(sources))
    extra = tmp_path / "extra.cpp"
    extra.write_text("int x;\n")
    moved.add(build.sim_digest([*sources, extra]))
    extra.write_text("int y;\n")
    moved.add(build.sim_digest([*sources, extra]))
    assert digest not in moved and len(moved) == 5

    def clone_digest(name, body):  # one rewritten source in a checkout at tmp_path / name
        root = tmp_path / name
        (root / "src").mkdir(parents=True, exist_ok=True)
        (root / "src" / "k.cu.cpp").write_text(f'#line 1 "{root}/csrc/cuda/k.cu"\n{body}')
        monkeypatch.setattr(build, "ROOT", root)
        return build.sim_digest([root / "src" / "k.cu.cpp"])

    assert clone_digest("a", "int x;\n") == clone_digest("b", "int x;\n")  # another clone, the same build
    assert clone_digest("a", "int x;\n") != clone_digest("b", "int y;\n")

    monkeypatch.setenv("RLKERNELS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(build, "KEEP_BUILDS", 2)
    built = tmp_path / "built.so"
    for i in range(3):
        built.write_bytes(bytes([i]) * 100)
        kept = build.cache_dir() / f"rlkernels_cuda_on_cpu-{i}.so"
        build._keep(built, kept)
        os.utime(kept, (i, i))  # the copies' order, whatever the clock's resolution
    left = sorted(p.name for p in build.cache_dir().iterdir())
    assert left == ["rlkernels_cuda_on_cpu-1.so", "rlkernels_cuda_on_cpu-2.so"]
    assert (build.cache_dir() / "rlkernels_cuda_on_cpu-2.so").read_bytes() == bytes([2]) * 100
    monkeypatch.setenv("RLKERNELS_SIM_CACHE", "0")
    assert build.cache_dir() is None and build._kept_build(sources) is None


def launch(lib, name, *args):
    """Run entry point `name` (tensors pass as pointers); returns (cudaError_t, its message)."""
    conv = [ctypes.c_void_p(a.data_ptr()) if isinstance(a, torch.Tensor) else a for a in args]
    code = getattr(lib, f"rlk_sim_test_{name}")(*conv)
    return code, lib.rlk_sim_test_error(code).decode()


def test_sim_builds_and_implements_every_cuda_binding():
    """A build failure fails here (and every cuda-on-cpu test), never drops the flavor."""
    sim = build.load()
    native = set(flavor._native_ops())
    assert set(sim.ops) <= native
    assert native - set(sim.ops) == CPU_ONLY_OPS
    for op in sim.ops:
        assert (
            str(getattr(torch.ops.rlkernels_sim, op).default._schema).split("::")[1]
            == str(getattr(torch.ops.rlkernels, op).default._schema).split("::")[1]
        )


@pytest.mark.skipif("RLK_TEST_FLAVORS" in os.environ, reason="RLK_TEST_FLAVORS picks the flavors")
def test_flavor_runs_exactly_without_a_gpu():
    names = [f.name for f in kernel_flavors()]
    assert ("cuda-on-cpu" in names) == (not torch.cuda.is_available())


def test_context_swaps_the_cpu_kernels_and_restores_them():
    x, r = torch.randn(300), torch.randn(300)
    real = torch.ops.rlkernels.kl_penalty(x, r, "k3", 10.0)
    saved, grad, weights = torch.randn(2, 3), torch.ones(()), torch.ones(2)
    mask, ids = torch.ones(2, 3, dtype=torch.bool), torch.zeros(2, dtype=torch.int64)
    before = flavor.STATS.calls
    with flavor.cuda_on_cpu():
        in_sim = torch.ops.rlkernels.kl_penalty(x, r, "k3", 10.0)
        with pytest.raises(NotImplementedError, match="has no CUDA kernel"):
            torch.ops.rlkernels.logprobs_from_logits_backward_into_logits(
                grad, None, saved, ids, weights, weights, 1.0, None, -100
            )
    assert flavor.STATS.calls == before + 1
    torch.testing.assert_close(in_sim, real, rtol=1e-6, atol=1e-6)
    # the CPU kernel again
    torch.ops.rlkernels.policy_loss_backward_into_saved(saved, grad, weights, mask, 0.0, False)
    assert flavor.STATS.calls == before + 1


def values(blocks, threads):
    """What thread t of block b shuffles (selftest.cu value_of)."""
    b = torch.arange(blocks).repeat_interleave(threads)
    t = torch.arange(threads).repeat(blocks)
    return (b * 1000 + t) * 3 + 1


def warp_op(lib, op, *, width=32, size=4, blocks=2, threads=64, masks=FULL, param=0, active=None):
    """Per thread: the result of warp op `op` (selftest.cu warp_op_kernel), and the launch's error."""
    n = blocks * threads
    per = lambda v, dt: v if isinstance(v, torch.Tensor) else torch.full((threads,), v, dtype=dt)  # noqa: E731
    m = per(masks, torch.int64).to(torch.int64).to(torch.int32)  # unsigned bits through int32
    p = per(param, torch.int64)
    a = per(1 if active is None else active, torch.int32).to(torch.int32)
    out = torch.full((n,), -7, dtype=torch.int64)
    ops = {"idx": 0, "up": 1, "down": 2, "xor": 3, "ballot": 4, "any": 5, "all": 6, "syncwarp": 7}
    code, msg = launch(lib, "warp_op", ops[op], width, size, blocks, threads, m, p, a, out)
    return out, code, msg


def lanes(threads=64):
    return torch.arange(threads) % 32


@pytest.mark.parametrize("size", [4, 8])
def test_shuffles_follow_cudas_rules(lib, size):
    v = values(2, 64)
    t = torch.arange(128)
    lane = t % 32
    cases = {
        # __shfl_down_sync(full, v, 3): lane + 3 past the warp keeps its own value
        ("down", 3, 32): torch.where(lane + 3 < 32, v[(t + 3).clamp(max=127)], v),
        # width 16: each half-warp shifts on its own
        ("down", 5, 16): torch.where(lane % 16 + 5 < 16, v[(t + 5).clamp(max=127)], v),
        # __shfl_up_sync(full, v, 2, 16): the first two lanes of each 16-lane segment keep their value
        ("up", 2, 16): torch.where(lane % 16 >= 2, v[(t - 2).clamp(min=0)], v),
        ("xor", 5, 32): v[t - lane + (lane ^ 5)],
        # __shfl_sync(full, v, 7, 8): lane 7 of each 8-lane segment
        ("idx", 7, 8): v[t - lane % 8 + 7],
        # srcLane 40 with width 32 is lane 40 % 32 = 8
        ("idx", 40, 32): v[t - lane + 8],
    }
    for (op, param, width), expected in cases.items():
        out, code, msg = warp_op(lib, op, width=width, size=size, param=param)
        assert code == CUDA_SUCCESS, msg
        assert torch.equal(out, expected), (op, param, width)


def test_shuffle_per_lane_source_and_xor_across_segments(lib):
    v = values(2, 64)
    t = torch.arange(128)
    lane = t % 32
    # every lane names its own source: the warp reversed
    out, code, msg = warp_op(lib, "idx", param=31 - lanes())
    assert code == CUDA_SUCCESS, msg
    assert torch.equal(out, v[t - lane + 31 - lane])
    # CUDA: with width < 32 a lane may read earlier segments but gets its own value for later ones
    out, code, msg = warp_op(lib, "xor", param=8, width=8)
    assert code == CUDA_SUCCESS, msg
    earlier = (lane // 8) % 2 == 1  # lane ^ 8 is in the previous segment
    assert torch.equal(out, torch.where(earlier, v[t - lane + (lane ^ 8)], v))


def test_votes(lib):
    lane = lanes()
    pred = (lane % 3 == 0).to(torch.int64)
    every_third = sum(1 << k for k in range(0, 32, 3))
    out, code, msg = warp_op(lib, "ballot", param=pred)
    assert code == CUDA_SUCCESS, msg
    assert (out == every_third).all()
    out, _, _ = warp_op(lib, "any", param=pred)
    assert (out == 1).all()
    out, _, _ = warp_op(lib, "all", param=pred)
    assert (out == 0).all()
    out, _, _ = warp_op(lib, "all", param=1)
    assert (out == 1).all()


def test_disjoint_masks_vote_separately(lib):
    """Half-warps with their own masks run their ballots at the same time, each over its own lanes."""
    lane = lanes()
    low = lane < 16
    masks = torch.where(low, 0x0000FFFF, 0xFFFF0000)
    pred = (lane % 2 == 1).to(torch.int64)
    out, code, msg = warp_op(lib, "ballot", masks=masks, param=pred)
    assert code == CUDA_SUCCESS, msg
    odd = sum(1 << k for k in range(1, 32, 2))
    expected = torch.where(low.repeat(2), odd & 0x0000FFFF, odd & 0xFFFF0000)
    assert torch.equal(out, expected)


def test_exited_lanes_named_in_the_mask_are_ignored(lib):
    """CUDA: "all non-exited threads named in mask must execute the same intrinsic"; exited ones do not."""
    lane = lanes()
    active = (lane % 4 != 3).to(torch.int32)  # every fourth lane returns at once
    alive = sum(1 << k for k in range(32) if k % 4 != 3)
    running = active.repeat(2).bool()
    out, code, msg = warp_op(lib, "syncwarp", active=active)
    assert code == CUDA_SUCCESS, msg
    assert (out[running] == 1).all() and (out[~running] == -7).all()
    out, code, msg = warp_op(lib, "ballot", param=1, active=active)
    assert code == CUDA_SUCCESS, msg
    assert (out[running] == alive).all()
    out, code, msg = warp_op(lib, "all", param=1, active=active)
    assert code == CUDA_SUCCESS, msg
    assert (out[running] == 1).all()


def test_reading_a_lane_outside_the_mask_is_reported(lib):
    """The planted bug: lanes 0-15 (mask 0x0000ffff) read lane 20."""
    lane = lanes()
    out, code, msg = warp_op(lib, "idx", masks=0x0000FFFF, param=20, active=(lane < 16).to(torch.int32))
    assert code == CUDA_ERROR_LAUNCH_FAILURE
    assert "__shfl_sync with mask 0x0000ffff" in msg and "reads lane 20, which is not in the mask" in msg, msg
    assert "warp_op_kernel" in msg and "selftest.cu" in msg


def test_reading_an_exited_lane_is_reported(lib):
    lane = lanes()
    _, code, msg = warp_op(lib, "down", param=8, active=(lane < 16).to(torch.int32))
    assert code == CUDA_ERROR_LAUNCH_FAILURE
    assert "reads lane 16, which has exited" in msg, msg


def test_caller_outside_its_mask_and_bad_width_are_reported(lib):
    _, code, msg = warp_op(lib, "ballot", masks=0x1, param=1)
    assert code == CUDA_ERROR_LAUNCH_FAILURE and "which is not in the mask" in msg, msg
    _, code, msg = warp_op(lib, "down", param=1, width=12)
    assert code == CUDA_ERROR_LAUNCH_FAILURE and "width 12" in msg, msg


def test_lanes_of_one_mask_in_different_operations_are_reported(lib):
    code, msg = launch(lib, "mixed_ops", torch.zeros(32, dtype=torch.int64))
    assert code == CUDA_ERROR_LAUNCH_FAILURE and "meet in different warp operations" in msg, msg


def test_partial_warp_reads_past_the_block_are_reported(lib):
    """A 48-thread block: lanes 16-31 of its second warp do not exist."""
    _, code, msg = warp_op(lib, "down", param=16, threads=48)
    assert code == CUDA_ERROR_LAUNCH_FAILURE and "which has exited (or does not exist)" in msg, msg


@pytest.mark.parametrize("exit_warps", [0b0, 0b1001010, 0b11111110, 0b11111111])
def test_barrier_with_early_returning_warps(lib, exit_warps):
    """Warps that return before a __syncthreads do not hold the others; the rest exchange through shared
    memory in lockstep rounds."""
    threads, rounds = 256, 3
    warp = torch.arange(threads) // 32
    live = ((exit_warps >> warp) & 1) == 0
    ids = torch.nonzero(live).flatten()
    partner = torch.zeros(threads, dtype=torch.int32)
    partner[ids] = ids.flip(0).to(torch.int32)  # the live threads in reverse order
    out = torch.full((rounds * threads,), -1, dtype=torch.int32)
    code, msg = launch(lib, "barrier", threads, ctypes.c_uint(exit_warps), rounds, partner, out)
    assert code == CUDA_SUCCESS, msg
    got = out.view(rounds, threads)
    for r in range(rounds):
        assert torch.equal(got[r][live], r * 100000 + partner[live])
        assert (got[r][~live] == -1).all()


def test_divergent_barrier_is_reported(lib):
    out = torch.zeros(64, dtype=torch.int32)
    code, msg = launch(lib, "divergent_barrier", 64, out)
    assert code == CUDA_ERROR_LAUNCH_FAILURE
    assert "a barrier in divergent code" in msg, msg


def test_a_missing_barrier_shows_as_a_read_before_the_write(lib):
    """The block's threads run in orders shuffled at each wait, so a reader of shared memory whose
    __syncthreads is missing runs before the writer in some block, and reads the poison (-1)."""
    blocks, threads = 4, 256
    out = torch.zeros(blocks * threads, dtype=torch.int32)
    code, msg = launch(lib, "missing_barrier", blocks, threads, out)
    assert code == CUDA_SUCCESS, msg
    assert ((out == 42) | (out == -1)).all()
    assert (out == -1).any() and (out == 42).any()


def test_a_deadlock_aborts_with_a_message(lib):
    """A launch whose threads all wait for each other stops the process with a message naming where they
    wait, instead of hanging the run."""
    code = (
        "import ctypes, sys; sys.path.insert(0, sys.argv[1]); import rlkernels; "
        "from cuda_on_cpu import build; ctypes.CDLL(build.load().path).rlk_sim_test_deadlock()"
    )
    tests_dir = str(pathlib.Path(__file__).parent)
    out = subprocess.run([sys.executable, "-c", code, tests_dir], capture_output=True, text=True, timeout=300)
    assert out.returncode != 0
    assert "deadlock_kernel launched at selftest.cu" in out.stderr, out.stderr
    assert "did not finish: a deadlock" in out.stderr, out.stderr
    assert "1 at selftest.cu:" in out.stderr and "31 at selftest.cu:" in out.stderr, out.stderr


def test_atomics_under_contention(lib):
    blocks, threads, iters = 6, 256, 40
    total = blocks * threads * iters  # exact in fp32 (< 2**24)
    f, d = torch.zeros(1), torch.zeros(1, dtype=torch.float64)
    i, u = torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int64)
    imax = torch.full((1,), -1, dtype=torch.int32)
    code, msg = launch(lib, "atomics", blocks, threads, iters, f, d, i, u, imax)
    assert code == CUDA_SUCCESS, msg
    assert f.item() == total and d.item() == 0.25 * total and i.item() == total and u.item() == total
    assert imax.item() == blocks * threads - 1


def conversion_inputs():
    """Every fp16 and bf16 value, the midpoints between neighbors (ties), their neighbors one fp32 ulp
    away, fp32 subnormals, and random floats over the whole range."""
    bits = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16)
    exact = torch.cat([bits.view(torch.float16).float(), bits.view(torch.bfloat16).float()])
    finite = exact[torch.isfinite(exact)].unique()
    mid = (finite[:-1].double() + finite[1:].double()) / 2
    mid = mid[mid.float().double() == mid].float()  # midpoints that fp32 represents exactly
    up = torch.nextafter(mid, torch.tensor(float("inf")))
    down = torch.nextafter(mid, torch.tensor(float("-inf")))
    raw = torch.randint(-(2**31), 2**31 - 1, (200_000,)).to(torch.int32).view(torch.float32)
    inf = float("inf")
    specials = torch.tensor([0.0, -0.0, inf, -inf, float("nan"), 65504.0, 65519.996, 65520.0])
    subnormal = torch.tensor([1e-40, -3e-39, 1.4e-45, 5.96e-8, 2.98e-8, 2.99e-8, 6.1e-5])
    return torch.cat([exact, mid, up, down, raw, specials, subnormal])


def same_bits_or_both_nan(got_bits: torch.Tensor, expected: torch.Tensor) -> bool:
    got = got_bits.view(expected.dtype)
    both_nan = got.isnan() & expected.isnan()
    return bool(((got_bits == expected.view(torch.int16)) | both_nan).all())


def test_float_to_fp16_and_bf16_round_like_torch(lib):
    x = conversion_inputs()
    h = torch.zeros(x.numel(), dtype=torch.int16)
    b = torch.zeros(x.numel(), dtype=torch.int16)
    code, msg = launch(lib, "convert", x, ctypes.c_int64(x.numel()), h, b)
    assert code == CUDA_SUCCESS, msg
    assert same_bits_or_both_nan(h, x.to(torch.float16))
    assert same_bits_or_both_nan(b, x.to(torch.bfloat16))


def test_fp16_and_bf16_widen_exactly(lib):
    bits = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16)
    fh, fb = torch.zeros(bits.numel()), torch.zeros(bits.numel())
    code, msg = launch(lib, "widen", bits, ctypes.c_int64(bits.numel()), fh, fb)
    assert code == CUDA_SUCCESS, msg
    for got, expected in ((fh, bits.view(torch.float16).float()), (fb, bits.view(torch.bfloat16).float())):
        same = got.view(torch.int32) == expected.view(torch.int32)
        assert bool((same | (got.isnan() & expected.isnan())).all())


def test_shared_memory_is_per_block_and_poisoned(lib):
    blocks = 5  # more than the blocks in flight at once
    out = torch.zeros(3 * blocks, dtype=torch.int32)
    code, msg = launch(lib, "shared", blocks, out)
    assert code == CUDA_SUCCESS, msg
    got = out.view(blocks, 3)
    assert (got[:, 0] == -1).all()  # 0xff bytes before the first write
    assert torch.equal(got[:, 1], torch.arange(blocks, dtype=torch.int32))
    assert (got[:, 2] == 1).all()  # an unwritten float is NaN


def test_builtins_of_a_3d_launch(lib):
    grid, block = (3, 2, 2), (4, 3, 2)
    nb, nt = 12, 24
    out = torch.zeros(nb * nt * 12, dtype=torch.int32)
    code, msg = launch(lib, "builtins", *grid, *block, out)
    assert code == CUDA_SUCCESS, msg
    got = out.view(nb, nt, 12)
    for b in range(nb):
        bidx = (b % 3, b // 3 % 2, b // 6)
        for t in range(nt):
            tidx = (t % 4, t // 4 % 3, t // 12)
            assert got[b, t].tolist() == [*tidx, *bidx, *block, *grid]


def test_bad_launch_configuration_is_reported(lib):
    out = torch.zeros(12 * 1025, dtype=torch.int32)
    code, msg = launch(lib, "builtins", 1, 1, 1, 1025, 1, 1, out)
    assert code == CUDA_ERROR_INVALID_CONFIGURATION
    assert "more than 1024 threads per block" in msg, msg
    assert (out == 0).all()  # nothing ran
