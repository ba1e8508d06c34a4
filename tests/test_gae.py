"""gae and discounted_returns: every backend x dtype x (gamma, lam) x whitening x layout against the
float64 verl-style loop, hand-derived values, properties, edge cases, validation, opcheck, compile."""

import math

import pytest
import torch
from oracle import DTYPES, assert_oracle, cpu_kernel_backends, plain

import rlkernels as rk
from rlkernels.reference import gae as ref

BACKENDS = cpu_kernel_backends()
GAMMA_LAM = [(1.0, 1.0), (0.99, 0.95), (0.0, 0.0), (1.0, 0.0)]
NATIVE_OPS = ("gae", "discounted_returns")


def make_batch(b, t, dtype, *, holes=True, seed_mask=0.25):
    """Rewards, values, a mask with holes inside sequences and right padding, per-row lengths."""
    rewards = torch.randn(b, t, dtype=torch.float64)
    values = torch.randn(b, t, dtype=torch.float64)
    lengths = torch.randint(1, t + 1, (b,))
    lengths[0] = t  # one full row
    pos = torch.arange(t)
    mask = pos[None, :] < lengths[:, None]
    if holes:
        mask &= torch.rand(b, t) > seed_mask
    return rewards.to(dtype), values.to(dtype), mask, lengths


def pack(x, lengths):
    """[B, T] right-padded -> [N] packed, with cu_seqlens."""
    parts = [x[i, : int(n)] for i, n in enumerate(lengths)]
    cu = torch.zeros(len(parts) + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(lengths, 0)
    return torch.cat(parts), cu


def unpad(x, lengths):
    return torch.cat([x[i, : int(n)] for i, n in enumerate(lengths)])


@pytest.mark.parametrize("layout", ["padded", "packed"])
@pytest.mark.parametrize("whiten", [False, True])
@pytest.mark.parametrize("gamma,lam", GAMMA_LAM)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_gae_matches_float64_reference(backend, dtype, gamma, lam, whiten, layout, seed):
    r, v, m, lengths = make_batch(3, 37, dtype)
    kw = dict(gamma=gamma, lam=lam, whiten=whiten)
    if layout == "packed":
        (r, cu), (v, _), (m, _) = pack(r, lengths), pack(v, lengths), pack(m, lengths)
        kw["cu_seqlens"] = cu
    out = rk.gae(r, v, m, **kw, backend=backend)
    same = rk.gae(r, v, m, **kw, backend="reference")
    oracle = rk.gae(r.double(), v.double(), m, **kw, backend="reference")
    for name, o, s, g in zip(("advantages", "returns"), out, same, oracle, strict=True):
        assert o.dtype == dtype and o.shape == r.shape
        assert_oracle(f"{backend}/{name}", o, s, g)


@pytest.mark.parametrize("layout", ["padded", "packed"])
@pytest.mark.parametrize("gamma", [1.0, 0.99, 0.0])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_returns_match_float64_reference(backend, dtype, gamma, layout, seed):
    r, _, m, lengths = make_batch(3, 37, dtype)
    kw = dict(gamma=gamma)
    if layout == "packed":
        (r, cu), (m, _) = pack(r, lengths), pack(m, lengths)
        kw["cu_seqlens"] = cu
    out = rk.discounted_returns(r, m, **kw, backend=backend)
    same = rk.discounted_returns(r, m, **kw, backend="reference")
    oracle = rk.discounted_returns(r.double(), m, **kw, backend="reference")
    assert out.dtype == dtype and out.shape == r.shape
    assert_oracle(f"{backend}/returns", out, same, oracle)


@pytest.mark.parametrize("t", [1, 2, 1023, 1025, 8192], ids=lambda t: f"T{t}")
@pytest.mark.parametrize("backend", BACKENDS)
def test_sequence_lengths(backend, t, seed):
    """Chunk boundaries of the scans (1024 positions per Triton chunk) and long rows."""
    b = 1 if backend == "triton" else 3
    r, v, m, _ = make_batch(b, t, torch.float32, seed_mask=0.1)
    for kw in (dict(gamma=0.99, lam=0.95, whiten=True), dict(gamma=1.0, lam=1.0)):
        out = rk.gae(r, v, m, **kw, backend=backend)
        same = rk.gae(r, v, m, **kw, backend="reference")
        oracle = rk.gae(r.double(), v.double(), m, **kw, backend="reference")
        for o, s, g in zip(out, same, oracle, strict=True):
            assert_oracle(f"{backend}/T={t}", o, s, g)
    out = rk.discounted_returns(r, m, gamma=0.99, backend=backend)
    oracle = rk.discounted_returns(r.double(), m, gamma=0.99, backend="reference")
    assert_oracle(
        f"{backend}/returns/T={t}", out, rk.discounted_returns(r, m, gamma=0.99, backend="reference"), oracle
    )


@pytest.mark.parametrize("backend", BACKENDS + ["reference"])
def test_packed_equals_padded(backend, seed):
    """The packed layout gives the padded layout's values at every real token (whitening included)."""
    r, v, m, lengths = make_batch(5, 29, torch.float64)
    r, v = r * (torch.arange(29) < lengths[:, None]), v * (torch.arange(29) < lengths[:, None])
    (rp, cu), (vp, _), (mp, _) = pack(r, lengths), pack(v, lengths), pack(m, lengths)
    for kw in (dict(gamma=0.99, lam=0.95), dict(gamma=1.0, lam=1.0, whiten=True)):
        padded = rk.gae(r, v, m, **kw, backend=backend)
        packed = rk.gae(rp, vp, mp, **kw, cu_seqlens=cu, backend=backend)
        for a, b in zip(padded, packed, strict=True):
            torch.testing.assert_close(unpad(a, lengths), b, rtol=1e-12, atol=1e-12)
    padded = rk.discounted_returns(r, m, gamma=0.9, backend=backend)
    packed = rk.discounted_returns(rp, mp, gamma=0.9, cu_seqlens=cu, backend=backend)
    torch.testing.assert_close(unpad(padded, lengths), packed, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS + ["reference"])
def test_hand_computed(backend):
    """r = [1, 2, 3], V = [0.5, 1, 2], mask = [1, 0, 1], gamma = lam = 0.5, worked by hand:
    t=2: delta = 3 - 2 = 1, A = 1, nextV = 2;  t=1 (masked): A stays 1, nextV stays 2;
    t=0: delta = 1 + 0.5*2 - 0.5 = 1.5, A = 1.5 + 0.25*1 = 1.75.  Returns A + V = [2.25, 2, 3].
    REINFORCE++ with gamma 0.5 (verl 0.9.1): G2 = 3, C = 3; t=1 (masked): returns 0, C stays 3;
    G0 = 1 + 0.5*3 = 2.5."""
    r = torch.tensor([[1.0, 2.0, 3.0]])
    v = torch.tensor([[0.5, 1.0, 2.0]])
    m = torch.tensor([[True, False, True]])
    adv, ret = rk.gae(r, v, m, gamma=0.5, lam=0.5, backend=backend)
    assert adv.tolist() == [[1.75, 1.0, 1.0]]
    assert ret.tolist() == [[2.25, 2.0, 3.0]]
    assert rk.discounted_returns(r, m, gamma=0.5, backend=backend).tolist() == [[2.5, 0.0, 3.0]]
    # Whitening: valid advantages 1.75 and 1: mean 1.375, unbiased var 2 * 0.375^2 / 1 = 0.28125.
    white, _ = rk.gae(r, v, m, gamma=0.5, lam=0.5, whiten=True, backend=backend)
    s = 0.375 / (0.28125 + 1e-8) ** 0.5
    assert white[0].tolist() == pytest.approx([s, -s, -s], rel=1e-6)


@pytest.mark.parametrize("backend", BACKENDS + ["reference"])
def test_gamma_lam_one_is_reversed_cumsum(backend, seed):
    """gamma = lam = 1, no mask holes: A_t = sum_{k>=t} r_k - V_t, so returns = reversed cumsum of r."""
    r = torch.randn(4, 23, dtype=torch.float64)
    v = torch.randn(4, 23, dtype=torch.float64)
    m = torch.ones(4, 23, dtype=torch.bool)
    want = r.flip(-1).cumsum(-1).flip(-1)
    adv, ret = rk.gae(r, v, m, gamma=1.0, lam=1.0, backend=backend)
    torch.testing.assert_close(ret, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(adv, want - v, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(
        rk.discounted_returns(r, m, gamma=1.0, backend=backend), want, rtol=1e-12, atol=1e-12
    )


@pytest.mark.parametrize("backend", BACKENDS + ["reference"])
def test_float_mask_weights(backend, seed):
    """A float mask blends as in verl's formula (weights also weight the whitening moments)."""
    r, v, _, _ = make_batch(3, 19, torch.float32)
    m = torch.rand(3, 19) * (torch.rand(3, 19) > 0.3)
    for whiten in (False, True):
        out = rk.gae(r, v, m, gamma=0.9, lam=0.8, whiten=whiten, backend=backend)
        same = ref.gae(r, v, m, 0.9, 0.8, whiten)
        oracle = ref.gae(r.double(), v.double(), m.double(), 0.9, 0.8, whiten)
        for o, s, g in zip(out, same, oracle, strict=True):
            assert_oracle(f"{backend}/float mask", o, s, g)


@pytest.mark.parametrize("backend", BACKENDS + ["reference"])
def test_whiten_single_valid_token_and_fully_masked(backend):
    r, v, _, _ = make_batch(2, 9, torch.float32)
    one = torch.zeros(2, 9, dtype=torch.bool)
    one[1, 4] = True
    adv, _ = rk.gae(r, v, one, gamma=0.99, lam=0.95, whiten=True, backend=backend)
    assert torch.isfinite(adv).all()
    assert adv[1, 4] == 0  # (A - mean) with mean = A, var taken as 0
    none = torch.zeros(2, 9, dtype=torch.bool)
    for whiten in (False, True):
        adv, ret = rk.gae(r, v, none, gamma=0.99, lam=0.95, whiten=whiten, backend=backend)
        assert (adv == 0).all()  # nothing valid: A carries its initial 0
        assert torch.equal(ret, v)
    assert torch.isfinite(rk.discounted_returns(r, none, gamma=0.9, backend=backend)).all()


@pytest.mark.parametrize("backend", BACKENDS + ["reference"])
def test_empty(backend):
    for shape in ((0, 5), (3, 0)):
        z = torch.zeros(shape)
        adv, ret = rk.gae(z, z, z.bool(), whiten=True, backend=backend)
        assert adv.shape == ret.shape == shape
        assert rk.discounted_returns(z, z.bool(), backend=backend).shape == shape
    z = torch.zeros(0)
    for cu in (torch.tensor([0]), torch.tensor([0, 0, 0])):
        adv, ret = rk.gae(z, z, z.bool(), whiten=True, cu_seqlens=cu, backend=backend)
        assert adv.shape == ret.shape == (0,)


@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_sequences_inside_packed(backend, seed):
    lengths = torch.tensor([4, 0, 7, 0, 1])
    r, v, m, _ = make_batch(5, 7, torch.float32)
    m = torch.ones_like(m)
    (rp, cu), (vp, _), (mp, _) = pack(r, lengths), pack(v, lengths), pack(m, lengths)
    out = rk.gae(rp, vp, mp, gamma=0.9, lam=0.9, cu_seqlens=cu.long(), backend=backend)
    oracle = rk.gae(rp.double(), vp.double(), mp, gamma=0.9, lam=0.9, cu_seqlens=cu, backend="reference")
    for o, g in zip(out, oracle, strict=True):
        assert_oracle(f"{backend}/empty sequences", o, None, g)


@pytest.mark.parametrize("backend", BACKENDS + ["reference"])
def test_strided_inputs_and_mixed_dtypes(backend, seed):
    r, v, m, _ = make_batch(17, 6, torch.float32)
    rt, vt, mt = r.t(), v.t().to(torch.bfloat16), m.t()  # [6, 17], non-contiguous, mixed dtypes
    adv, ret = rk.gae(rt, vt, mt, gamma=0.9, lam=0.9, backend=backend)
    assert adv.dtype == ret.dtype == torch.float32
    oracle = ref.gae(rt.double(), vt.double(), mt, 0.9, 0.9)
    for o, g in zip((adv, ret), oracle, strict=True):
        assert_oracle(f"{backend}/strided", o, None, g)


def test_outputs_are_constants():
    r, v, m, _ = make_batch(2, 5, torch.float32)
    adv, ret = rk.gae(r.requires_grad_(), v.requires_grad_(), m)
    assert adv.grad_fn is None and ret.grad_fn is None and not adv.requires_grad


def test_reference_matches_verl_loop_literal():
    """The reference is the verl loop; check it on a case with a hole and padding against a plain Python
    recursion written independently (scalar floats)."""
    rs, vs, ms = [0.3, -1.0, 2.0, 0.5, 0.0], [1.0, 0.2, -0.4, 0.7, 0.0], [1, 1, 0, 1, 0]
    g, lam = 0.9, 0.7
    nv = a = 0.0
    adv = [0.0] * 5
    for t in reversed(range(5)):
        if ms[t]:
            a = rs[t] + g * nv - vs[t] + g * lam * a
            nv = vs[t]
        adv[t] = a
    got, ret = ref.gae(
        torch.tensor([rs], dtype=torch.float64),
        torch.tensor([vs], dtype=torch.float64),
        torch.tensor([ms]),
        g,
        lam,
    )
    assert got[0].tolist() == pytest.approx(adv, rel=1e-14)
    assert ret[0].tolist() == pytest.approx([x + y for x, y in zip(adv, vs, strict=True)], rel=1e-14)


BAD_CU = [
    (torch.tensor([0, 5, 3, 10]), "non-decreasing"),
    (torch.tensor([0, 5, 9]), "end at the number of packed tokens 10"),
    (torch.tensor([1, 5, 10]), "start at 0"),
    (torch.tensor([0.0, 10.0]), "int32 or int64"),
    (torch.tensor([[0, 10]]), "1-D"),
]


# Checked from the values: eagerly on CPU tensors, with torch._assert_async on CUDA tensors (no host sync).
VALUE_CHECKS = ("non-decreasing", "end at the number of packed tokens 10", "start at 0")


@pytest.mark.parametrize("cu,msg", BAD_CU)
@pytest.mark.parametrize("backend", BACKENDS + ["reference"])
def test_bad_cu_seqlens(backend, cu, msg):
    device = torch.get_default_device()
    if device.type == "cuda" and msg in VALUE_CHECKS:
        pytest.skip("a device-side assert on CUDA tensors: it would abort this process's CUDA context")
    cu = cu.to(device)
    z = torch.zeros(10)
    with pytest.raises((ValueError, TypeError), match=msg):
        rk.gae(z, z, z.bool(), cu_seqlens=cu, backend=backend)
    with pytest.raises((ValueError, TypeError), match=msg):
        rk.discounted_returns(z, z.bool(), cu_seqlens=cu, backend=backend)


def _scan_ops(backend):
    """(gae op, discounted_returns op) of the flavor, called directly."""
    suffix = "_triton" if backend.kind == "triton" else ""
    return getattr(torch.ops.rlkernels, "gae" + suffix), getattr(
        torch.ops.rlkernels, "discounted_returns" + suffix
    )


@pytest.mark.fires_device_asserts
@pytest.mark.parametrize("backend", BACKENDS)
def test_the_kernels_check_the_values_they_read(backend):
    """Each scan checks what it reads into the op's flag (on a GPU, one torch._assert_async): NaN / inf
    rewards or values (at masked positions too), integer masks other than 0 / 1, negative or non-finite mask
    weights, non-finite baselines, and cu_seqlens (the C++ CPU kernels raise on those before scanning)."""
    device = torch.get_default_device()
    gae_op, returns_op = _scan_ops(backend)
    r, v = torch.randn(3, 7, device=device), torch.randn(3, 7, device=device)
    mask = torch.rand(3, 7, device=device) > 0.3
    mask[1, 4] = False
    assert bool(gae_op(r, v, mask, None, 0.9, 0.8, False)[2])
    assert bool(gae_op(r, v, mask.long(), None, 0.9, 0.8, True)[2])
    assert bool(returns_op(r, mask.float(), None, 0.9, torch.randn(3, device=device), False)[2])
    cases = [
        lambda: gae_op(_poison(r, (1, 4), math.nan), v, mask, None, 0.9, 0.8, False),
        lambda: gae_op(r, _poison(v, (2, 6), math.inf), mask, None, 0.9, 0.8, True),
        lambda: gae_op(r, v, _poison(mask.long(), (0, 0), 2), None, 0.9, 0.8, False),
        lambda: gae_op(r, v, _poison(mask.float(), (0, 1), -0.5), None, 0.9, 0.8, False),
        lambda: returns_op(_poison(r, (0, 3), -math.inf), mask, None, 0.9, None, True),
        lambda: returns_op(r, mask, None, 1.0, _poison(torch.zeros(3, device=device), (1,), math.nan), False),
    ]
    for i, call in enumerate(cases):
        assert not bool(call()[2]), i
    flat = r.reshape(-1)
    packed_mask = mask.reshape(-1)
    for cu in ([0, 5, 3, 21], [1, 5, 9, 21], [0, 5, 9, 20], [0, 5, 9, 22], [0]):
        cu = torch.tensor(cu, device=device)
        if backend.kind == "native-cpu":
            with pytest.raises(RuntimeError, match="cu_seqlens must"):
                gae_op(flat, flat, packed_mask, cu, 1.0, 1.0, False)
        else:
            assert not bool(gae_op(flat, flat, packed_mask, cu, 1.0, 1.0, False)[2]), cu
            assert not bool(returns_op(flat, packed_mask, cu, 1.0, None, False)[2]), cu
    assert bool(
        gae_op(flat, flat, packed_mask, torch.tensor([0, 5, 5, 21], device=device), 1.0, 1.0, True)[2]
    )


def _poison(x, index, value):
    x = x.clone()
    x[index] = value
    return x


def test_bad_inputs():
    z = torch.zeros(3, 4)
    m = z.bool()
    with pytest.raises(ValueError, match="values has shape"):
        rk.gae(z, torch.zeros(3, 5), m)
    with pytest.raises(ValueError, match="mask has shape"):
        rk.gae(z, z, torch.zeros(3, 5, dtype=torch.bool))
    with pytest.raises(TypeError, match=r"mask must be a bool, integer \(0/1\) or floating"):
        rk.gae(z, z, z.to(torch.complex64))
    with pytest.raises(TypeError, match="rewards must be float32"):
        rk.gae(z.long(), z, m)
    with pytest.raises(ValueError, match="rewards must be 2-D"):
        rk.gae(z[0], z[0], m[0])
    with pytest.raises(ValueError, match=r"rewards \(packed, with cu_seqlens\) must be 1-D"):
        rk.gae(z, z, m, cu_seqlens=torch.tensor([0, 12]))
    with pytest.raises(ValueError, match="gamma must be <= 1"):
        rk.gae(z, z, m, gamma=1.5)
    with pytest.raises(ValueError, match="lam must be >= 0"):
        rk.gae(z, z, m, lam=-0.1)
    with pytest.raises(TypeError, match="whiten must be a bool"):
        rk.gae(z, z, m, whiten=1)
    with pytest.raises(ValueError, match="backend must be one of"):
        rk.gae(z, z, m, backend="gpu")
    with pytest.raises(ValueError, match="on one device"):
        rk.gae(z, z.to("meta"), m)
    with pytest.raises(TypeError, match="gamma must be a number"):
        rk.discounted_returns(z, m, gamma=torch.tensor(0.9))


@pytest.mark.parametrize("backend", BACKENDS)
def test_opcheck(backend):
    name = "{}_triton" if backend == "triton" else "{}"  # the cpu and cuda kernels share the native op
    r, v, m, lengths = make_batch(3, 11, torch.float32)
    (rp, cu), (vp, _), (mp, _) = pack(r, lengths), pack(v, lengths), pack(m, lengths)
    gae_op = getattr(torch.ops.rlkernels, name.format("gae"))
    ret_op = getattr(torch.ops.rlkernels, name.format("discounted_returns"))
    for args in ((r, v, m, None, 0.99, 0.95, True), (rp, vp, mp.float(), cu, 1.0, 1.0, False)):
        torch.library.opcheck(gae_op, args)
    for args in ((r, m, None, 0.9), (rp, mp, cu, 0.5)):
        torch.library.opcheck(ret_op, args)


@pytest.mark.parametrize("backend", BACKENDS)
def test_torch_compile_fullgraph(backend):
    backend = plain(backend)
    r, v, m, lengths = make_batch(3, 11, torch.float32)
    (rp, cu), (vp, _), (mp, _) = pack(r, lengths), pack(v, lengths), pack(m, lengths)

    @torch.compile(fullgraph=True)
    def step(r, v, m, rp, vp, mp, cu):
        adv, ret = rk.gae(r, v, m, gamma=0.99, lam=0.95, whiten=True, backend=backend)
        adv_p, _ = rk.gae(rp, vp, mp, gamma=0.99, lam=0.95, cu_seqlens=cu, backend=backend)
        g = rk.discounted_returns(rp, mp, gamma=0.9, cu_seqlens=cu, backend=backend)
        return adv * 2, ret, adv_p, g

    got = step(r, v, m, rp, vp, mp, cu)
    want = (
        2 * rk.gae(r, v, m, gamma=0.99, lam=0.95, whiten=True, backend=backend)[0],
        rk.gae(r, v, m, gamma=0.99, lam=0.95, backend=backend)[1],
        rk.gae(rp, vp, mp, gamma=0.99, lam=0.95, cu_seqlens=cu, backend=backend)[0],
        rk.discounted_returns(rp, mp, gamma=0.9, cu_seqlens=cu, backend=backend),
    )
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)


def test_cuda_kernels_registered():
    if not rk.build_info().get("cuda"):
        pytest.skip("extension built without CUDA")
    for name in NATIVE_OPS:
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"rlkernels::{name}", "CUDA")
