"""group_advantages: every backend x dtype x mode x grouping against the float64 reference, the verl
dictionary loop, hand-derived values, constant / singleton groups, token broadcast, validation, opcheck,
compile."""

import math

import pytest
import torch
from oracle import DTYPES, assert_oracle, cpu_kernel_backends, plain, raises_on_host

import rlkernels as rk
from rlkernels._dtypes import acc_dtype
from rlkernels.reference.advantages import GROUP_MODES, group_advantages_loop
from rlkernels.triton import advantages as triton_advantages

BACKENDS = cpu_kernel_backends()
# The widest contiguous group the Triton flavor's one-tile kernel takes under the interpreter in the tests
# below: groups past it take the sorted walk, as groups past MAX_TILE_GROUP (16384) do on a GPU, at a size
# the interpreter runs in seconds (the same kernels, 1027 members instead of 16387).
INTERPRETER_TILE_GROUP = 1024


def _widest_tile_group(backend, monkeypatch) -> int:
    """The widest group the flavor's tile path takes (the Triton flavor's lowered for the interpreter)."""
    if backend.kind == "triton":
        monkeypatch.setattr(triton_advantages, "MAX_TILE_GROUP", INTERPRETER_TILE_GROUP)
    return triton_advantages.MAX_TILE_GROUP


def shuffled_ids(b):
    """Ids for b rewards in random order: uneven groups (sizes 1 to 9, singletons included), negative and
    large int64 values."""
    sizes, total = [], 0
    while total < b:
        sizes.append(min(int(torch.randint(1, 10, ()).item()), b - total))
        total += sizes[-1]
    values = torch.randperm(10 * len(sizes))[: len(sizes)] * 7919 - 50000
    values[0] = 2**40 + 3
    ids = torch.repeat_interleave(values, torch.tensor(sizes))
    return ids[torch.randperm(b)]


def make_rewards(b, dtype):
    """Random rewards with a few constant stretches (constant contiguous groups of 5)."""
    r = torch.randn(b, dtype=torch.float64)
    r[5:10] = 0.1
    r[20:25] = -3.0
    return r.to(dtype)


GROUPINGS = {
    "size5": dict(group_size=5),
    "size1": dict(group_size=1),
    "ids": None,  # shuffled_ids(b), drawn per test
}


@pytest.mark.parametrize("grouping", list(GROUPINGS))
@pytest.mark.parametrize("mode", GROUP_MODES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_matches_float64_reference(backend, dtype, mode, grouping, seed):
    b = 65
    r = make_rewards(b, dtype)
    kw = GROUPINGS[grouping] or dict(group_ids=shuffled_ids(b))
    out = rk.group_advantages(r, **kw, mode=mode, backend=backend)
    same = rk.group_advantages(r, **kw, mode=mode, backend="reference")
    oracle = rk.group_advantages(r.double(), **kw, mode=mode, backend="reference")
    assert out.dtype == dtype and out.shape == (b,)
    assert_oracle(f"{backend}/{mode}/{grouping}", out, same, oracle)


@pytest.mark.parametrize("mode", GROUP_MODES)
def test_reference_matches_verl_dictionary_loop(mode, seed):
    b = 70
    r = make_rewards(b, torch.float64)
    ids = shuffled_ids(b)
    want = group_advantages_loop(r, ids.tolist(), mode)
    got = rk.group_advantages(r, group_ids=ids, mode=mode, backend="reference")
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS + ["reference"])
def test_hand_computed(backend):
    """rewards [1, 3, 5, 10], ids [7, 7, 7, -2]: group {1, 3, 5} has mean 3 and unbiased std
    sqrt((4 + 0 + 4) / 2) = 2; {10} is a group of one (mean 0, std 1). Batch std of [1, 3, 5, 10]:
    mean 4.75, squared deviations 14.0625 + 3.0625 + 0.0625 + 27.5625 = 44.75, std sqrt(44.75 / 3)."""
    r = torch.tensor([1.0, 3.0, 5.0, 10.0], dtype=torch.float64)
    ids = torch.tensor([7, 7, 7, -2])
    got = {
        m: rk.group_advantages(r, group_ids=ids, mode=m, eps=0.0, backend=backend).tolist()
        for m in GROUP_MODES
    }
    assert got["grpo"] == [-1.0, 0.0, 1.0, 10.0]
    assert got["dr_grpo"] == [-2.0, 0.0, 2.0, 10.0]
    assert got["rloo"] == [-3.0, 0.0, 3.0, 10.0]  # 3/2 * (r - 3); a group of one keeps r
    s = math.sqrt(44.75 / 3)
    assert got["batch"] == pytest.approx([-2 / s, 0.0, 2 / s, 10 / s], rel=1e-15)
    eps = rk.group_advantages(r, group_ids=ids, mode="grpo", eps=1e-6, backend=backend).tolist()
    assert eps == pytest.approx([-2 / (2 + 1e-6), 0.0, 2 / (2 + 1e-6), 10 / (1 + 1e-6)], rel=1e-15)


@pytest.mark.parametrize("dtype", DTYPES + (torch.float64,))
@pytest.mark.parametrize("backend", BACKENDS + ["reference"])
def test_constant_and_singleton_groups(backend, dtype):
    """Equal rewards give exactly 0 in every mode (0.1 does not sum exactly: the pivot makes it exact),
    also with eps = 0; groups of one keep r (grpo: r / (1 + eps))."""
    r = torch.tensor([0.1] * 6 + [7.0] * 3 + [0.3], dtype=torch.float64).to(dtype)
    ids = torch.tensor([4] * 6 + [9] * 3 + [1])
    for mode in GROUP_MODES:
        for eps in (1e-6, 0.0):
            out = rk.group_advantages(r, group_ids=ids, mode=mode, eps=eps, backend=backend)
            assert torch.isfinite(out).all()
            assert (out[:9] == 0).all(), (mode, eps, out)
    single = rk.group_advantages(r, group_size=1, mode="grpo", backend=backend)
    torch.testing.assert_close(single, (r.double() / (1 + 1e-6)).to(dtype))
    for mode in ("dr_grpo", "rloo"):
        assert torch.equal(rk.group_advantages(r, group_size=1, mode=mode, backend=backend), r)
    # A constant batch: batch std 0; with eps = 0 every advantage is 0, never NaN.
    const = torch.full((8,), 2.5, dtype=dtype)
    assert (rk.group_advantages(const, group_size=4, mode="batch", eps=0.0, backend=backend) == 0).all()


@pytest.mark.parametrize("backend", BACKENDS + ["reference"])
def test_shuffled_ids_equal_contiguous(backend, seed):
    """The same groups given contiguously, as ids, and as shuffled ids give the same advantages."""
    b, g = 48, 6
    r = torch.randn(b)
    perm = torch.randperm(b)
    for mode in GROUP_MODES:
        contiguous = rk.group_advantages(r, group_size=g, mode=mode, backend=backend)
        ids = torch.arange(b) // g * 13 - 40
        by_ids = rk.group_advantages(r, group_ids=ids.int(), mode=mode, backend=backend)
        shuffled = rk.group_advantages(r[perm], group_ids=ids[perm], mode=mode, backend=backend)
        torch.testing.assert_close(by_ids, contiguous, rtol=2e-6, atol=2e-6)
        torch.testing.assert_close(shuffled, contiguous[perm], rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_groups_larger_than_a_tile(backend, seed, monkeypatch):
    """Contiguous groups larger than the Triton tile take the representative path."""
    g = _widest_tile_group(backend, monkeypatch) + 3
    r = torch.randn(2 * g)
    for mode in ("grpo", "batch"):
        out = rk.group_advantages(r, group_size=g, mode=mode, backend=backend)
        same = rk.group_advantages(r, group_size=g, mode=mode, backend="reference")
        oracle = rk.group_advantages(r.double(), group_size=g, mode=mode, backend="reference")
        assert_oracle(f"{backend}/{mode}/large", out, same, oracle)


def order_sensitive_rewards(g: int) -> torch.Tensor:
    """Two groups of g whose first two members are +-1000 (and +-500) and whose others are +-0.3: once the
    large squares are in a running fp32 sum of squares (~2e6, a grid step of 0.25), each small square (0.09)
    added after them rounds away entirely. A GPU's atomics add in whatever order its threads arrive; the
    CPU flavors (the interpreter, the harness's threads) add roughly in index order, the large terms first."""
    r = 0.3 * torch.where(torch.rand(2 * g) < 0.5, -1.0, 1.0)
    r[[0, 1, g, g + 1]] = torch.tensor([1000.0, -1000.0, 500.0, -500.0])
    return r


@pytest.mark.parametrize("backend", BACKENDS)
def test_group_statistics_do_not_depend_on_summation_order(backend, seed, monkeypatch):
    """The paths whose group statistics are sums over members in no fixed order (arbitrary ids, and on
    Triton contiguous groups wider than a tile) keep them where the order cannot matter at the output's
    precision: fp64 accumulators. With fp32 ones the small squares of order_sensitive_rewards are lost and
    the std is off by ~1e-4 relative (the H200 run: groups > 16384 on Triton, some seeds)."""
    g = 3000
    r = order_sensitive_rewards(g)
    groupings = [dict(group_ids=torch.arange(2 * g) // g)]
    wide = _widest_tile_group(backend, monkeypatch) + 3
    groupings.append(dict(group_size=wide, _rewards=order_sensitive_rewards(wide)))
    for kw in groupings:
        rewards = kw.pop("_rewards", r)
        for mode in ("grpo", "batch", "rloo"):
            out = rk.group_advantages(rewards, **kw, mode=mode, backend=backend)
            same = rk.group_advantages(rewards, **kw, mode=mode, backend="reference")
            oracle = rk.group_advantages(rewards.double(), **kw, mode=mode, backend="reference")
            assert_oracle(f"{backend}/{mode}/{list(kw)[0]}", out, same, oracle)


@pytest.mark.fires_device_asserts(guarded=True)
@pytest.mark.parametrize("backend", BACKENDS)
def test_sorted_groups_across_chunks(backend, seed):
    """The sorted path of arbitrary ids in chunks: on a GPU more than 1024 sorted rewards take a program /
    block per chunk of 1024 (Triton under the interpreter: chunks of 32, its last program scanning the
    chunks 16 at a time) whose last program carries each run across chunks, then a writing launch. 5000
    rewards in groups of 1 to 1500 (runs spanning whole chunks, heads on either side of boundaries), int32
    and int64 ids shuffled, every mode and gpg's, the flag of one NaN, against float64."""
    sizes = [1, 1500, 2, 700, 1, 1, 1030, 3, 999, 1, 762]
    values = torch.arange(len(sizes)) * 13 - 40
    ids = torch.repeat_interleave(values, torch.tensor(sizes))
    ids = ids[torch.randperm(ids.numel())]
    r = torch.randn(ids.numel())
    r[ids == values[3]] = 0.5  # a constant group
    mask = torch.ones(ids.numel(), 2, dtype=torch.bool)
    for group_ids in (ids, ids.int()):
        for mode in GROUP_MODES:
            kw = dict(group_ids=group_ids, mode=mode)
            out = rk.group_advantages(r, **kw, backend=backend)
            same = rk.group_advantages(r, **kw, backend="reference")
            assert_oracle(
                f"{backend}/{mode}", out, same, rk.group_advantages(r.double(), **kw, backend="reference")
            )
            assert (out[ids == values[3]] == 0).all()
        out = rk.gpg_advantages(r, mask, group_ids=group_ids, backend=backend)[0]
        same = rk.gpg_advantages(r, mask, group_ids=group_ids, backend="reference")[0]
        oracle = rk.gpg_advantages(r.double(), mask, group_ids=group_ids, backend="reference")[0]
        assert_oracle(f"{backend}/gpg", out, same, oracle)
    if raises_on_host(backend):  # on a GPU a raised flag ends the CUDA context (oracle.py)
        bad = r.clone()
        bad[4321] = float("nan")
        with pytest.raises(ValueError, match="rewards must be finite"):
            rk.group_advantages(bad, group_ids=ids, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS + ["reference"])
def test_token_mask_broadcast(backend, seed):
    r = torch.randn(6)
    adv = rk.group_advantages(r, group_size=3, backend=backend)
    for mask in (torch.rand(6, 11) > 0.3, torch.rand(6, 11)):
        tok = rk.group_advantages(r, group_size=3, mask=mask, backend=backend)
        assert tok.shape == (6, 11) and tok.dtype == r.dtype
        torch.testing.assert_close(tok, adv[:, None] * mask.float(), rtol=0, atol=0)


@pytest.mark.parametrize("backend", BACKENDS + ["reference"])
def test_batch_of_one_and_empty(backend):
    one = torch.tensor([3.0])
    assert rk.group_advantages(one, group_size=1, mode="batch", eps=0.0, backend=backend).tolist() == [3.0]
    for kw in (dict(group_size=1), dict(group_ids=torch.zeros(0, dtype=torch.long))):
        out = rk.group_advantages(torch.zeros(0), **kw, backend=backend)
        assert out.shape == (0,)


def test_outputs_are_constants():
    r = torch.randn(8, requires_grad=True)
    assert rk.group_advantages(r, group_size=4).grad_fn is None


def test_bad_inputs():
    r = torch.randn(10)
    with pytest.raises(ValueError, match=r"group_size 4 does not divide B \(rewards shape \(10,\)\)"):
        rk.group_advantages(r, group_size=4)
    with pytest.raises(ValueError, match="exactly one of group_size or group_ids"):
        rk.group_advantages(r)
    with pytest.raises(ValueError, match="exactly one of group_size or group_ids"):
        rk.group_advantages(r, group_size=5, group_ids=torch.zeros(10, dtype=torch.long))
    with pytest.raises(ValueError, match="group_size must be >= 1"):
        rk.group_advantages(r, group_size=0)
    with pytest.raises(TypeError, match="group_size must be an int"):
        rk.group_advantages(r, group_size=2.0)
    with pytest.raises(TypeError, match="group_ids must be an int32 or int64"):
        rk.group_advantages(r, group_ids=torch.zeros(10))
    with pytest.raises(ValueError, match="group_ids has shape"):
        rk.group_advantages(r, group_ids=torch.zeros(9, dtype=torch.long))
    with pytest.raises(ValueError, match="rewards must be 1-D"):
        rk.group_advantages(r.view(2, 5), group_size=5)
    with pytest.raises(TypeError, match="rewards must be float32"):
        rk.group_advantages(r.long(), group_size=5)
    with pytest.raises(ValueError, match="mode must be one of"):
        rk.group_advantages(r, group_size=5, mode="gspo")
    with pytest.raises(ValueError, match="eps must be >= 0"):
        rk.group_advantages(r, group_size=5, eps=-1e-6)
    with pytest.raises(ValueError, match="mask must be"):
        rk.group_advantages(r, group_size=5, mask=torch.ones(9, 4))
    with pytest.raises(ValueError, match="on one device"):
        rk.group_advantages(r, group_ids=torch.zeros(10, dtype=torch.long, device="meta"))


@pytest.mark.parametrize("backend", BACKENDS)
def test_opcheck(backend):
    # The cpu and cuda kernels share the native op.
    name = "group_advantages_triton" if backend == "triton" else "group_advantages"
    op = getattr(torch.ops.rlkernels, name)
    r = torch.randn(12)
    for mode in GROUP_MODES:
        torch.library.opcheck(op, (r, None, 4, mode, 1e-6))
        torch.library.opcheck(op, (r, shuffled_ids(12), 0, mode, 1e-6))


@pytest.mark.parametrize("backend", BACKENDS)
def test_torch_compile_fullgraph(backend):
    backend = plain(backend)
    r = torch.randn(12)
    ids = shuffled_ids(12)
    mask = torch.rand(12, 5) > 0.5

    @torch.compile(fullgraph=True)
    def step(r, ids, mask):
        a = rk.group_advantages(r, group_size=4, mode="grpo", backend=backend)
        b = rk.group_advantages(r, group_ids=ids, mode="rloo", mask=mask, backend=backend)
        return a + 1, b

    got = step(r, ids, mask)
    torch.testing.assert_close(got[0], rk.group_advantages(r, group_size=4, backend=backend) + 1)
    want = rk.group_advantages(r, group_ids=ids, mode="rloo", mask=mask, backend=backend)
    torch.testing.assert_close(got[1], want)


def _ops(backend):
    """(group_advantages op, advantage_tokens op) of the flavor, called directly."""
    suffix = "_triton" if backend.kind == "triton" else ""
    ops = torch.ops.rlkernels
    return getattr(ops, "group_advantages" + suffix), getattr(ops, "advantage_tokens" + suffix)


@pytest.mark.fires_device_asserts
@pytest.mark.parametrize("backend", BACKENDS)
def test_the_kernels_check_the_values_they_read(backend):
    """Each path checks the rewards it reads into the op's flag (on a GPU, one torch._assert_async), and the
    token broadcast the mask's values, folding the flag of the kernel before it into its own."""
    device = torch.get_default_device()
    group, tokens = _ops(backend)
    r = torch.randn(12, device=device)
    bad = r.clone()
    bad[7] = math.nan
    ids = torch.arange(12, device=device) % 5
    for args in ((None, 4), (None, 1), (ids, 0)):
        for mode in GROUP_MODES:
            assert bool(group(r, *args, mode, 1e-6)[1])
            assert not bool(group(bad, *args, mode, 1e-6)[1]), (args[1], mode)
    adv = torch.randn(4, dtype=torch.float64, device=device)
    mask = torch.rand(4, 6, device=device) > 0.4
    yes = torch.ones((), dtype=torch.bool, device=device)
    two = mask.long()
    two[2, 3] = 2
    negative = mask.double()
    negative[0, 0] = -1.0
    assert bool(tokens(adv, mask.long(), yes)[1])
    assert not bool(tokens(adv, mask, ~yes)[1])
    assert not bool(tokens(adv, two, yes)[1])
    assert not bool(tokens(adv, negative, yes)[1])
    # verl's whitening of them, in the group pass (whitened_group_tokens): the scores and the mask's values.
    suffix = "_triton" if backend.kind == "triton" else ""
    whitened = getattr(torch.ops.rlkernels, "whitened_group_tokens" + suffix)
    scores, four = adv[:, None].clone(), torch.tensor([3, 1, 3, 1], device=device)
    assert bool(whitened(scores, four, None, "dr_grpo", 0.0, mask.long())[1])
    assert not bool(whitened(scores, four, None, "dr_grpo", 0.0, two)[1])
    assert not bool(whitened(scores, four, None, "dr_grpo", 0.0, negative)[1])
    scores[1] = math.nan
    assert not bool(whitened(scores, four, None, "dr_grpo", 0.0, mask)[1])


@pytest.mark.parametrize("mask_kind", ["bool", "int", "float"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_advantage_tokens_match_float64_reference(backend, dtype, mask_kind, seed):
    """The token broadcast against the float64 reference, every mask kind; an empty row and a row of one token
    included (its whitening: tests/test_advantage_estimators.py, whitened_group_tokens)."""
    from rlkernels.reference.advantages import broadcast_to_tokens

    device = torch.get_default_device()
    _, tokens = _ops(backend)
    adv = torch.randn(9, dtype=torch.float64).to(dtype)
    mask = torch.rand(9, 37) > 0.3
    mask[2] = False
    mask[5] = False
    mask[5, 11] = True
    m = {"bool": mask, "int": mask.long(), "float": mask * torch.rand(9, 37) * 2}[mask_kind]
    if mask_kind == "float" and backend.kind != "triton":
        m = m.to(acc_dtype(dtype))  # the native kernels read float weights of adv's accumulation dtype
    yes = torch.ones((), dtype=torch.bool)
    got, ok = tokens(adv.to(device), m.to(device), yes.to(device))
    assert bool(ok) and got.dtype == dtype
    same = broadcast_to_tokens(adv, m)
    want = broadcast_to_tokens(adv.double(), m.double())
    assert_oracle(f"{backend}/{mask_kind}", got.cpu(), same, want)


def test_cuda_kernels_registered():
    if not rk.build_info().get("cuda"):
        pytest.skip("extension built without CUDA")
    assert torch._C._dispatch_has_kernel_for_dispatch_key("rlkernels::group_advantages", "CUDA")
