"""The per-call launch and sync budgets of the token-level ops on a GPU (docs/gpu_token_ops.md), counted on
fake CUDA tensors by benchmarks/gpu_cost.py: every kernel a forward + backward call launches (Triton
launches, ATen ops, the CUDA C++ ops' own kernels and ATen calls, counted through the cuda-on-cpu
harness), every host sync, and the host work a call does (the calls it makes from Python). Counts, not
timings: a machine does not change them."""

import pathlib
import sys

import pytest
import torch

import rlkernels as rk
from rlkernels.fake_cuda import Maker

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))
import gpu_cost  # noqa: E402

B, T = 4, 37


def _policy_inputs(mask_dtype=torch.bool, ref=True, entropy=True, b=B, t=T):
    def make(mode):
        m = Maker(torch.device("cuda" if mode is not None else "cpu"), mode)
        mask = m.mask(b, t)
        x = dict(logp=m.logp(b, t, grad=True), old_logp=m.logp(b, t), advantages=m.randn(b), mask=mask)
        if mask_dtype != torch.bool:
            x["mask"] = mask.to(mask_dtype)
        if ref:
            x["ref_logp"] = m.logp(b, t)
        if entropy:
            x["entropy"] = m.randn(b, t, grad=True)
        return x

    return make


# (label, public call, inputs, launches allowed per forward + backward: the forward, the backward, and a
# sequence pass where the objective has one; the forward asserts on a bad value itself)
POLICY = [
    ("clip kl entropy", dict(clip_high=0.28, dual_clip=3.0, kl_coef=0.05, entropy_coef=0.01), {}, 2),
    ("seq-mean-token-mean int mask", dict(agg="seq-mean-token-mean"), dict(mask_dtype=torch.int64), 2),
    ("token-sum float mask", dict(agg="token-sum"), dict(mask_dtype=torch.float32), 2),
    ("gspo (a sequence pass)", dict(level="sequence", agg="seq-mean-token-mean"), {}, 3),
    ("geo_mean", dict(objective="geo_mean", agg="seq-mean-token-mean"), {}, 3),
    ("cispo, no ref, no entropy", dict(objective="cispo"), dict(ref=False, entropy=False), 2),
]


@pytest.mark.parametrize("label,options,inputs,budget", POLICY, ids=[p[0] for p in POLICY])
def test_policy_loss_triton_launches(label, options, inputs, budget):
    cost = gpu_cost.count(
        lambda **x: rk.policy_loss(**x, **options, backend="triton"), _policy_inputs(**inputs)
    )
    assert not cost.syncs, cost.syncs
    assert cost.kernels() <= budget, f"{label}: {cost.summary()}: {[(k.kind, k.name) for k in cost.launches]}"
    assert cost.custom_ops <= 2  # the forward op and the backward op


@pytest.mark.parametrize("label,options,inputs,budget", POLICY, ids=[p[0] for p in POLICY])
def test_policy_loss_persistent_forward_keeps_the_budgets(label, options, inputs, budget, monkeypatch):
    """The persistent forward (policy_loss.FORWARD_PROGRAMS_PER_SM) on fake CUDA tensors, its grid sized by
    an H100's 132 SMs: the same launches, no host sync, one forward kernel on a (programs,) grid."""
    from test_linear_gemm_stats import offline_h100

    from rlkernels.triton import policy_loss as triton_policy_loss

    monkeypatch.setattr(triton_policy_loss, "FORWARD_PROGRAMS_PER_SM", 1)
    call = lambda **x: rk.policy_loss(**x, **options, backend="triton")  # noqa: E731
    with offline_h100():
        cost = gpu_cost.count(call, _policy_inputs(b=128, t=4096, **inputs))
    assert not cost.syncs, cost.syncs
    assert cost.kernels() <= budget, f"{label}: {cost.summary()}: {[(k.kind, k.name) for k in cost.launches]}"
    forward = [k for k in cost.launches if k.name == "_policy_forward_kernel"]
    assert len(forward) == 1 and forward[0].grid == (132,), forward  # 128 x 2 tiles of 2048 > 132 programs


def test_policy_loss_triton_bytes():
    """The bytes a token-level forward + backward moves (each kernel's tensor arguments, read or written
    once): per token, the forward reads logp, old_logp, ref_logp and entropy (fp32) and the bool mask and
    writes the saved m · dL/dlogp (fp32); the backward reads the saved values and the mask and writes d logp
    and d entropy. 34 bytes, plus the [B]-sized rows. A kernel that took an input it does not read (the
    backward once took all eleven) counts it here, as a GPU's time model must."""
    b, t = 8, 4096  # rows much longer than the [B]-sized tensors
    inputs = _policy_inputs(b=b, t=t)
    cost = gpu_cost.count(lambda **x: rk.policy_loss(**x, **POLICY[0][1], backend="triton"), inputs)
    per_token = 4 * 4 + 1 + 4 + (4 + 1 + 4 + 4)
    assert cost.bytes <= per_token * b * t + 1024 * b, f"{cost.bytes / (b * t):.1f} bytes per token"


# ---- the other token-level ops (kl_penalty, gae, discounted_returns, group_advantages, the advantage
# estimators, rollout_correction, logprobs_from_logits), both GPU flavors ----


def _maker(mode) -> Maker:
    return Maker(torch.device("cuda" if mode is not None else "cpu"), mode)


def _triton_cost(call, make) -> gpu_cost.Cost:
    return gpu_cost.count(lambda **x: call("triton", **x), make)


def _native_cost(call, make) -> tuple[int, list[str], list[str]]:
    """(kernels, what they are, host syncs) of the CUDA C++ flavor: the ATen ops the Python code launches on
    fake CUDA tensors (backend="cuda"), plus each native op's own kernels and the ATen ops its binding calls,
    counted by running the op through the cuda-on-cpu harness (backend="cpu" on its CPU tensors; the second
    run counted: the first also makes the launch counter a binding keeps, once per process)."""
    outer = gpu_cost.count(lambda **x: call("cuda", **x), make)
    gpu_cost.native_costs(lambda **x: call("cpu", **x), make)
    inner = gpu_cost.native_costs(lambda **x: call("cpu", **x), make)
    names = [launch.name for launch in outer.launches if launch.kind == "aten"]
    for op, native in inner.items():
        names += [f"{op}:kernel"] * native.kernels + [f"{op}:{name}" for name in native.aten]
    syncs = outer.syncs + [name for name in names if name.split(":")[-1] in gpu_cost.SYNCS]
    return len(names), names, syncs


def _assert_budget(label: str, flavor: str, call, make, budget: int) -> None:
    """budget: the launches of a call, on either flavor. None is a torch._assert_async: the kernels of both
    flavors assert where they lower an op's value flag (csrc/cuda/common.cuh RLK_REQUIRE_VALUES,
    rlkernels/triton/_device_assert.py; tests/test_device_asserts.py)."""
    if flavor == "triton":
        cost = _triton_cost(call, make)
        kernels, syncs = cost.kernels(), cost.syncs
        names = [k.name for k in cost.launches]
    else:
        pytest.importorskip("cuda_on_cpu.build").platform_supported() or pytest.skip("no cuda-on-cpu harness")
        kernels, names, syncs = _native_cost(call, make)
    assert not [n for n in names if "_assert_async" in n], f"{label} [{flavor}]: {names}"
    assert not syncs, f"{label} [{flavor}]: host syncs {syncs}"
    assert kernels <= budget, f"{label} [{flavor}]: {kernels} launches > {budget}: {names}"


GPU_FLAVORS = ("triton", "cuda")


def _kl_inputs(grads=("logp", "ref_logp")):
    def make(mode):
        m = _maker(mode)
        return {name: m.logp(B, T, grad=name in grads) for name in ("logp", "ref_logp")}

    return make


def _kl_view_inputs(mode):
    """verl's actor's call: its log-probs sliced out of the padded sequence's (a leaf here, as
    _policy_view_inputs'), the reference's a contiguous [B, T]."""
    m, pad = _maker(mode), 9
    logp = m.logp(B, T + pad)[:, pad - 1 : -1].detach().requires_grad_()
    return dict(logp=logp, ref_logp=m.logp(B, T))


# (label, call(backend, **inputs), inputs, launches allowed): forward + backward (kl_penalty) or forward
KL = [
    ("k3, both gradients", lambda be, **x: rk.kl_penalty(**x, kind="k3", backend=be), _kl_inputs(), 2),
    ("k1+, d logp only", lambda be, **x: rk.kl_penalty(**x, kind="k1+", backend=be), _kl_inputs(["logp"]), 2),
    (
        "abs, d ref_logp only",
        lambda be, **x: rk.kl_penalty(**x, kind="abs", backend=be),
        _kl_inputs(["ref_logp"]),
        2,
    ),
    ("no grad", lambda be, **x: rk.kl_penalty(**x, backend=be), _kl_inputs(()), 1),
    ("k3, row-strided views", lambda be, **x: rk.kl_penalty(**x, kind="k3", backend=be), _kl_view_inputs, 2),
]


@pytest.mark.parametrize("flavor", GPU_FLAVORS)
@pytest.mark.parametrize("label,call,make,budget", KL, ids=[k[0] for k in KL])
def test_kl_penalty_launches(label, call, make, budget, flavor):
    """One forward launch; one backward launch writes d logp and d ref_logp (= -d logp) together; no value
    is checked, so no flag."""
    _assert_budget(label, flavor, call, make, budget)


def _scan_inputs(packed=False, values=True, mask_dtype=torch.bool):
    def make(mode):
        m = _maker(mode)
        shape = (B * T,) if packed else (B, T)
        x = dict(rewards=m.randn(*shape), mask=m.mask(*shape))
        if mask_dtype != torch.bool:
            x["mask"] = x["mask"].to(mask_dtype)
        if values:
            x["values"] = m.randn(*shape)
        if packed:
            x["cu_seqlens"] = m.tensor([0, 5, 5, 60, B * T], dtype=torch.int32)
        return x

    return make


SCANS = [
    ("gae", lambda be, **x: rk.gae(**x, gamma=0.99, lam=0.95, backend=be), _scan_inputs(), 1),
    ("gae whiten", lambda be, **x: rk.gae(**x, whiten=True, backend=be), _scan_inputs(), 2),
    ("gae packed", lambda be, **x: rk.gae(**x, backend=be), _scan_inputs(packed=True), 1),
    ("gae packed whiten", lambda be, **x: rk.gae(**x, whiten=True, backend=be), _scan_inputs(packed=True), 2),
    ("gae int mask", lambda be, **x: rk.gae(**x, backend=be), _scan_inputs(mask_dtype=torch.int64), 1),
    ("gae float mask", lambda be, **x: rk.gae(**x, backend=be), _scan_inputs(mask_dtype=torch.float32), 1),
    (
        "discounted_returns",
        lambda be, **x: rk.discounted_returns(**x, gamma=0.9, backend=be),
        _scan_inputs(values=False),
        1,
    ),
    (
        "discounted_returns packed",
        lambda be, **x: rk.discounted_returns(**x, backend=be),
        _scan_inputs(packed=True, values=False),
        1,
    ),
]


@pytest.mark.parametrize("flavor", GPU_FLAVORS)
@pytest.mark.parametrize("label,call,make,budget", SCANS, ids=[s[0] for s in SCANS])
def test_scan_launches(label, call, make, budget, flavor):
    """One scan launch that also checks the values it reads (cu_seqlens included) and, in its last program,
    merges the whitening statistics; +1 elementwise launch to whiten."""
    _assert_budget(label, flavor, call, make, budget)


# ---- policy_loss (CUDA C++) and value_loss, both GPU flavors: one forward launch that finishes the loss and
# checks the values it reads and asserts on a bad one (+1 pass for a per-row ratio), one backward launch ----


@pytest.mark.parametrize("label,options,inputs,budget", POLICY, ids=[p[0] for p in POLICY])
def test_policy_loss_native_launches(label, options, inputs, budget):
    def call(be, **x):
        return rk.policy_loss(**x, **options, backend=be)

    _assert_budget(label, "cuda", call, _policy_inputs(**inputs), budget)


def _policy_bf16_inputs(normalizer):
    """bf16 log-probs (the saved fp32 gradients are read by the backward op instead of becoming d logp) and
    a global token count given as a device tensor."""

    def make(mode):
        m, bf16 = _maker(mode), torch.bfloat16
        return dict(
            logp=m.logp(B, T, dtype=bf16, grad=True), old_logp=m.logp(B, T, dtype=bf16),
            advantages=m.randn(B, dtype=bf16), mask=m.mask(B, T), ref_logp=m.logp(B, T, dtype=bf16),
            entropy=m.randn(B, T, dtype=bf16, grad=True), num_tokens=m.tensor(normalizer),
        )  # fmt: skip

    return make


POLICY_MORE = [
    ("bf16, num_tokens tensor", lambda be, **x: rk.policy_loss(**x, kl_coef=0.1, backend=be), 2),
    (
        "entropy as data",
        lambda be, **x: rk.policy_loss(**dict(x, entropy=x["entropy"].detach()), backend=be),
        2,
    ),
]


@pytest.mark.parametrize("flavor", GPU_FLAVORS)
@pytest.mark.parametrize("label,call,budget", POLICY_MORE, ids=[p[0] for p in POLICY_MORE])
def test_policy_loss_more_launches(label, call, budget, flavor):
    _assert_budget(label, flavor, call, _policy_bf16_inputs(100.0), budget)


def _policy_view_inputs():
    """verl's inputs as they reach its loss (tests/test_policy_loss.py verl_views): logp and entropy sliced
    out of padded rows ([:, -T - 1:-1]; leaves here, whose gradients the count takes: the slices' own
    backward is the model's), the mask an int64 attention mask's [:, -T:], ref_logp a view."""

    def make(mode):
        m, pad = _maker(mode), 9

        def sliced(wide):
            return wide[:, pad - 1 : -1].detach().requires_grad_()

        return dict(
            logp=sliced(m.logp(B, T + pad)), old_logp=m.logp(B, T), advantages=m.randn(B),
            mask=m.mask(B, T + pad).to(torch.int64)[:, pad:], ref_logp=m.logp(B, T + pad)[:, 2 : 2 + T],
            entropy=sliced(m.randn(B, T + pad)),
        )  # fmt: skip

    return make


@pytest.mark.parametrize("flavor", GPU_FLAVORS)
@pytest.mark.parametrize("level,budget", [("token", 2), ("sequence", 3)])
def test_policy_loss_reads_row_strided_views_in_place(level, budget, flavor):
    """Rows at a stride other than T are read where they lie: no contiguous copy of logp, entropy, ref_logp
    or the mask (4 copies in the forward and 1 in the backward before), the budget of contiguous inputs."""

    def call(be, **x):
        assert not x["logp"].is_contiguous() and not x["mask"].is_contiguous()
        return rk.policy_loss(**x, kl_coef=0.1, entropy_coef=0.01, level=level, backend=be)

    _assert_budget(f"views, {level}", flavor, call, _policy_view_inputs(), budget)


def _value_inputs(mask_dtype=torch.bool, normalizer=False):
    def make(mode):
        m = _maker(mode)
        x = dict(
            values=m.randn(B, T, grad=True),
            old_values=m.randn(B, T),
            returns=m.randn(B, T),
            mask=m.mask(B, T),
        )
        if mask_dtype != torch.bool:
            x["mask"] = x["mask"].to(mask_dtype)
        if normalizer:
            x["num_seqs"] = m.tensor(9.0)
        return x

    return make


def _value_view_inputs(mode):
    """verl's critic inputs: the values sliced out of padded rows (a leaf, as _policy_view_inputs'), the mask
    an int64 attention mask's [:, -T:]."""
    m, pad = _maker(mode), 9
    return dict(
        values=m.randn(B, T + pad)[:, pad - 1 : -1].detach().requires_grad_(), old_values=m.randn(B, T),
        returns=m.randn(B, T), mask=m.mask(B, T + pad).to(torch.int64)[:, pad:],
    )  # fmt: skip


VALUE = [
    ("token-mean", lambda be, **x: rk.value_loss(**x, backend=be), _value_inputs(), 2),
    ("row-strided views", lambda be, **x: rk.value_loss(**x, backend=be), _value_view_inputs, 2),
    (
        "seq-mean-token-mean int mask, num_seqs tensor",
        lambda be, **x: rk.value_loss(**x, agg="seq-mean-token-mean", clip=None, backend=be),
        _value_inputs(torch.int64, normalizer=True),
        2,
    ),
    (
        "float mask",
        lambda be, **x: rk.value_loss(**x, agg="token-sum", backend=be),
        _value_inputs(torch.float32),
        2,
    ),
]


@pytest.mark.parametrize("flavor", GPU_FLAVORS)
@pytest.mark.parametrize("label,call,make,budget", VALUE, ids=[v[0] for v in VALUE])
def test_value_loss_launches(label, call, make, budget, flavor):
    """One forward launch (it asserts on a bad value), one backward launch."""
    _assert_budget(label, flavor, call, make, budget)


def _agg_inputs(mask_dtype=torch.bool, normalizer=False, pad=0):
    """verl's entropy / KL term: a token loss (sliced out of padded rows where pad > 0: a leaf, as
    _policy_view_inputs'), a mask (an int64 attention mask's [:, -T:] when sliced), a num_seqs tensor."""

    def make(mode):
        m = _maker(mode)
        x = dict(
            loss_mat=m.randn(B, T + pad)[:, max(pad - 1, 0) : T + max(pad - 1, 0)].detach().requires_grad_(),
            mask=m.mask(B, T + pad)[:, pad:],
        )
        if mask_dtype != torch.bool:
            x["mask"] = x["mask"].to(mask_dtype)
        if normalizer:
            x["num_seqs"] = m.tensor(9.0)
        return x

    return make


AGG = [
    ("token-mean", lambda be, **x: rk.agg_loss(**x, backend=be), _agg_inputs(), 2),
    ("row-strided views", lambda be, **x: rk.agg_loss(**x, backend=be), _agg_inputs(torch.int64, pad=9), 2),
    (
        "seq-mean-token-mean float mask, num_seqs tensor",
        lambda be, **x: rk.agg_loss(**x, agg="seq-mean-token-mean", backend=be),
        _agg_inputs(torch.float32, normalizer=True),
        2,
    ),
]


@pytest.mark.parametrize("flavor", GPU_FLAVORS)
@pytest.mark.parametrize("label,call,make,budget", AGG, ids=[a[0] for a in AGG])
def test_agg_loss_launches(label, call, make, budget, flavor):
    """One forward launch (it asserts on a bad mask value), one backward launch."""
    _assert_budget(label, flavor, call, make, budget)


def test_agg_loss_replaces_the_eager_composition():
    """What verl's actor ran for each entropy / KL aggregation (the eager composition: the reference, as
    rlkernels.integrations.verl.agg_loss ran it before the op) launches 25 to 31 kernels for a forward +
    backward on CUDA tensors (this one 25); the op two (test_agg_loss_launches)."""
    from rlkernels.reference.aggregation import agg_loss as eager

    make = AGG[2][2]
    cost = gpu_cost.count(
        lambda **x: eager(x["loss_mat"], x["mask"], "seq-mean-token-mean", num_seqs=x["num_seqs"]), make
    )
    assert cost.kernels() >= 20, cost.summary()


def _group_inputs(ids=False, mask_dtype=None, b=12):
    def make(mode):
        m = _maker(mode)
        x = dict(rewards=m.randn(b))
        if ids:
            x["group_ids"] = m.ints(4, b)
        if mask_dtype is not None:
            x["mask"] = m.mask(b, 5) if mask_dtype == torch.bool else m.mask(b, 5).to(mask_dtype)
        return x

    return make


def _group(mode="grpo", **options):
    return lambda be, **x: rk.group_advantages(**x, **options, mode=mode, backend=be)


GROUPS = [
    ("contiguous", _group(group_size=3), _group_inputs(), 1),
    ("contiguous batch std", _group("batch", group_size=3), _group_inputs(), 1),
    ("contiguous rloo int mask", _group("rloo", group_size=3), _group_inputs(mask_dtype=torch.int64), 2),
    ("ids (a sort)", _group(), _group_inputs(ids=True), 2),
    (
        "ids, 3000 rewards (a sort, the chunk-parallel scan and writing)",
        _group(),
        _group_inputs(True, b=3000),
        3,
    ),
    ("ids batch float mask", _group("batch"), _group_inputs(ids=True, mask_dtype=torch.float32), 3),
]


@pytest.mark.parametrize("flavor", GPU_FLAVORS)
@pytest.mark.parametrize("label,call,make,budget", GROUPS, ids=[g[0] for g in GROUPS])
def test_group_advantages_launches(label, call, make, budget, flavor):
    """One launch (the batch std inside it), +1 for the token broadcast with a mask, +1 for the sort of
    arbitrary ids (a group pass; past 1024 rewards two, a program per chunk and the writing)."""
    _assert_budget(label, flavor, call, make, budget)


def _logits_inputs(make_mode):
    m = _maker(make_mode)
    return dict(logits=m.randn(29, 301, grad=True), labels=m.labels(301, 29))


def _sliced_logits_inputs(make_mode):
    """A model's logits [B, T + 1, V] without their last position (logits[:, :-1]), a leaf here: rows at two
    strides, which [N, V] would copy whole."""
    m = _maker(make_mode)
    logits = m.randn(3, 11, 301)[:, :-1].detach().requires_grad_()
    return dict(logits=logits, labels=m.labels(301, 3, 10))


LOGITS = [
    ("logp", lambda be, **x: rk.logprobs_from_logits(**x, backend=be), 2),
    (
        "logp and entropy, softcap, temperature",
        lambda be, **x: rk.logprobs_from_logits(
            **x, temperature=0.7, softcap=30.0, return_entropy=True, return_sum_pi_squared=True, backend=be
        ),
        2,
    ),
    ("entropy alone", lambda be, **x: rk.logprobs_from_logits(**x, return_entropy=True, backend=be)[1], 2),
]


@pytest.mark.parametrize("flavor", GPU_FLAVORS)
@pytest.mark.parametrize("label,call,budget", LOGITS, ids=[c[0] for c in LOGITS])
def test_logprobs_from_logits_launches(label, call, budget, flavor):
    """One forward launch that also checks the labels (and asserts on a bad one), one backward
    launch; no zeros for the outputs that reach no loss, no copy of an expanded upstream gradient."""
    _assert_budget(label, flavor, call, _logits_inputs, budget)


@pytest.mark.parametrize("flavor", GPU_FLAVORS)
def test_a_sliced_batch_of_logits_is_read_in_place(flavor):
    """logits[:, :-1]: the same two launches, no copy of the logits before them (2026-11-30; until then
    the [N, V] reshape copied them, and the copy lived on for the backward)."""
    call = LOGITS[1][1]
    _assert_budget("logits[:, :-1]", flavor, call, _sliced_logits_inputs, 2)


@pytest.mark.parametrize("flavor", GPU_FLAVORS)
def test_a_sliced_batch_of_logits_holds_no_copy_for_the_backward(flavor):
    """The forward on logits[:, :-1] allocates its per-row outputs only, where the [N, V] copy it made
    before stayed alive, saved for the backward, until the backward ran (4 x 2048 rows of a 151936-token
    vocabulary in bf16: 2.49 GB, fake CUDA tensors, benchmarks/gpu_cost.py)."""

    def forward(be, **x):
        logp, entropy = rk.logprobs_from_logits(**x, return_entropy=True, backend=be)
        return logp.detach(), entropy.detach()

    cost = gpu_cost.count(lambda **x: forward(flavor, **x), _sliced_logits_inputs)
    rows, sliced_bytes = 3 * 10, 3 * 10 * 301 * 4
    assert cost.peak_bytes <= rows * (4 + 4 + 8 + 4) + 64 < sliced_bytes, cost.peak_bytes


def _rollout_inputs(mask_dtype=torch.bool):
    def make(mode):
        m = _maker(mode)
        mask = m.mask(B, T)
        return dict(logp_old=m.logp(B, T), logp_rollout=m.logp(B, T), mask=mask.to(mask_dtype))

    return make


ROLLOUT = [
    ("token TIS, token_k3 rejection", dict(rejection="token_k3", rejection_max=0.5), torch.bool, 1),
    ("token, int mask", dict(clip_min=0.5, mode="mask"), torch.int64, 1),
    ("token, batch normalized (a token pass)", dict(batch_normalize=True), torch.bool, 2),
    (
        "sequence MIS, seq_mean_k1 rejection (a token pass), batch normalized",
        dict(level="sequence", mode="mask", rejection="seq_mean_k1", rejection_max=1.0, batch_normalize=True),
        torch.float32,
        2,
    ),
    (
        "no weights, seq_max_k3 rejection (a token pass)",
        dict(level=None, rejection="seq_max_k3", rejection_max=0.1),
        torch.bool,
        2,
    ),
]


@pytest.mark.parametrize("flavor", GPU_FLAVORS)
@pytest.mark.parametrize("label,options,mask_dtype,budget", ROLLOUT, ids=[r[0] for r in ROLLOUT])
def test_rollout_correction_launches(label, options, mask_dtype, budget, flavor):
    """One launch: the rows' pass, finished by its last program (metrics, sequence weights, batch
    normalization, rows' rejection, the mask's flag); +1 elementwise pass where the tokens need the batch's
    answer."""
    call = lambda be, **x: rk.rollout_correction(**x, **options, backend=be)  # noqa: E731
    _assert_budget(label, flavor, call, _rollout_inputs(mask_dtype), budget)


def _estimator_inputs(token_rewards=False, two_keys=False, b=B):
    def make(mode):
        m = _maker(mode)
        ids = m.tensor([0, 0, 1, 1]) if b == B else m.ints(b // 2, b)
        x = dict(mask=m.mask(b, T), group_ids=ids)
        if token_rewards:
            x["rewards"], x["baselines"] = m.randn(b, T), m.randn(b)
            x["old_logp"], x["sum_pi_squared"] = m.randn(b, T), m.randn(b, T).abs()
        else:
            x["scores"] = m.randn(b, 2) if two_keys else m.randn(b)
        return x

    return make


# (name, call, inputs, launches allowed): docs/gpu_token_ops.md says why each number is what it is.
ESTIMATORS = [
    (
        "reinforce_plus_plus (a scan, a whitening pass)",
        lambda be, **x: rk.reinforce_plus_plus_advantages(x["rewards"], x["mask"], gamma=0.99, backend=be),
        _estimator_inputs(token_rewards=True),
        2,
    ),
    (
        "remax (a scan)",
        lambda be, **x: rk.remax_advantages(
            x["rewards"], x["mask"], reward_baselines=x["baselines"], backend=be
        ),
        _estimator_inputs(token_rewards=True),
        1,
    ),
    (
        "trl_grpo, contiguous groups, mask",
        lambda be, **x: rk.trl_grpo_advantages(x["scores"], group_size=2, mask=x["mask"], backend=be),
        _estimator_inputs(),
        2,
    ),
    (
        "trl_grpo, group_ids, mask (sort, the group pass with TRL's groups of one, tokens)",
        lambda be, **x: rk.trl_grpo_advantages(
            x["scores"], group_ids=x["group_ids"], mask=x["mask"], backend=be
        ),
        _estimator_inputs(),
        3,
    ),
    (
        "reinforce_plus_plus_baseline (sort, the group walk after a program per mask row with the whitening "
        "statistics, tokens)",
        lambda be, **x: rk.reinforce_plus_plus_baseline_advantages(
            x["scores"], x["mask"], group_ids=x["group_ids"], backend=be
        ),
        _estimator_inputs(),
        3,
    ),
    (
        "gpg (sort, the group pass counting the nonzero scores, tokens)",
        lambda be, **x: rk.gpg_advantages(x["scores"], x["mask"], group_ids=x["group_ids"], backend=be),
        _estimator_inputs(),
        3,
    ),
    (
        "grpo_passk (sort, the per-response walk, tokens)",
        lambda be, **x: rk.grpo_passk_advantages(
            x["scores"], x["mask"], group_ids=x["group_ids"], backend=be
        ),
        _estimator_inputs(),
        3,
    ),
    (
        "opo (sort, the per-response walk after a program per mask row, tokens)",
        lambda be, **x: rk.opo_advantages(x["scores"], x["mask"], group_ids=x["group_ids"], backend=be),
        _estimator_inputs(),
        3,
    ),
    (
        "gdpo, two reward keys (sort, one group pass over both keys and their sum after a program per mask "
        "row, with the whitening statistics, tokens)",
        lambda be, **x: rk.gdpo_advantages(x["scores"], x["mask"], group_ids=x["group_ids"], backend=be),
        _estimator_inputs(two_keys=True),
        3,
    ),
    (
        "trl_grpo normalize_then_sum, two reward functions (sort, one group pass over both functions, their "
        "sum and its batch pass, tokens)",
        lambda be, **x: rk.trl_grpo_advantages(
            x["scores"],
            group_ids=x["group_ids"],
            mask=x["mask"],
            multi_objective_aggregation="normalize_then_sum",
            backend=be,
        ),  # fmt: skip
        _estimator_inputs(two_keys=True),
        3,
    ),
    (
        "grpo_passk, 3000 responses (the chunk path: sort, heads, three passes, tokens)",
        lambda be, **x: rk.grpo_passk_advantages(
            x["scores"], x["mask"], group_ids=x["group_ids"], backend=be
        ),
        _estimator_inputs(b=3000),
        6,
    ),
    (
        "opo, 3000 responses (the chunk path: sort, heads and the mask rows' sums, two passes, tokens)",
        lambda be, **x: rk.opo_advantages(x["scores"], x["mask"], group_ids=x["group_ids"], backend=be),
        _estimator_inputs(b=3000),
        5,
    ),
    (
        "gdpo, two reward keys, 3000 responses (the chunk path: sort, a scan and a writing launch per key, "
        "the first scan with the mask rows' moments, the last writing launch with the whitening statistics, "
        "tokens)",
        lambda be, **x: rk.gdpo_advantages(x["scores"], x["mask"], group_ids=x["group_ids"], backend=be),
        _estimator_inputs(two_keys=True, b=3000),
        6,
    ),
    (
        "reinforce_plus_plus_baseline, 3000 responses (the chunk path: sort, a scan with the mask rows' "
        "moments, a writing launch with the whitening statistics, tokens)",
        lambda be, **x: rk.reinforce_plus_plus_baseline_advantages(
            x["scores"], x["mask"], group_ids=x["group_ids"], backend=be
        ),
        _estimator_inputs(b=3000),
        4,
    ),
    (
        "trl_grpo normalize_then_sum, 3000 responses (the chunk path: sort, a scan and a writing launch per "
        "function, the batch pass, tokens)",
        lambda be, **x: rk.trl_grpo_advantages(
            x["scores"],
            group_ids=x["group_ids"],
            mask=x["mask"],
            multi_objective_aggregation="normalize_then_sum",
            backend=be,
        ),  # fmt: skip
        _estimator_inputs(two_keys=True, b=3000),
        7,
    ),
    (
        "trl_grpo normalize_then_sum, group_size, 3000 responses (the chunk path in index order: a scan and "
        "a writing launch per function, the batch pass, tokens)",
        lambda be, **x: rk.trl_grpo_advantages(
            x["scores"],
            group_size=8,
            mask=x["mask"],
            multi_objective_aggregation="normalize_then_sum",
            backend=be,
        ),  # fmt: skip
        _estimator_inputs(two_keys=True, b=3000),
        6,
    ),
    (
        "optimal_token_baseline (sort, the rows pass, the groups pass)",
        lambda be, **x: rk.optimal_token_baseline_advantages(
            x["rewards"],
            x["mask"],
            group_ids=x["group_ids"],
            old_logp=x["old_logp"],
            sum_pi_squared=x["sum_pi_squared"],
            backend=be,
        ),  # fmt: skip
        _estimator_inputs(token_rewards=True),
        3,
    ),
]


@pytest.mark.parametrize("flavor", GPU_FLAVORS)
@pytest.mark.parametrize("label,call,make,budget", ESTIMATORS, ids=[e[0] for e in ESTIMATORS])
def test_advantage_estimator_launches(label, call, make, budget, flavor):
    """The estimators on the fused ops: within the token budget where they are one scan or one group pass
    (+ the token broadcast); the others held to the counts docs/gpu_token_ops.md explains, no host sync."""
    _assert_budget(label, flavor, call, make, budget)


# ---- host work: the calls a forward + backward makes from Python (Python functions and C functions such
# as torch ops; benchmarks/gpu_host_time.py host_calls), on small CPU tensors with the Triton launches
# stubbed out, as the tool times them. "cpu" is the C++ flavor: the public function and the Python the CUDA
# C++ flavor runs too. A count, not a time: benchmarks/gpu_model.py turns the host work the tool measures
# into an H200 host's time (a control unit per 80 to 100 calls, about 86 us per unit there;
# docs/gpu_token_ops.md). These budgets hold today's counts with 10 % of room: lower them with a change
# that lowers them. The 50 us of host time per call that issue 28 asked for is under the floor of any op
# reached through Python autograd on that host (docs/gpu_token_ops.md), so no budget here can stand for it.

HOST_WORK = [
    (
        "policy_loss clip kl entropy",
        lambda be, **x: rk.policy_loss(**x, **POLICY[0][1], backend=be),
        _policy_inputs(),
        dict(triton=328, cpu=198),
    ),
    ("kl_penalty k3, both gradients", KL[0][1], KL[0][2], dict(triton=182, cpu=99)),
    ("value_loss token-mean", VALUE[0][1], VALUE[0][2], dict(triton=262, cpu=147)),
    ("agg_loss token-mean", AGG[0][1], AGG[0][2], dict(triton=218, cpu=110)),
    ("gae", SCANS[0][1], SCANS[0][2], dict(triton=111, cpu=71)),
    ("group_advantages contiguous", GROUPS[0][1], GROUPS[0][2], dict(triton=87, cpu=44)),
    (
        "rollout_correction token TIS, token_k3 rejection",
        lambda be, **x: rk.rollout_correction(**x, **ROLLOUT[0][1], backend=be),
        _rollout_inputs(ROLLOUT[0][2]),
        dict(triton=277, cpu=226),
    ),
    ("logprobs_from_logits", LOGITS[0][1], _logits_inputs, dict(triton=220, cpu=139)),
]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the Triton flavor on CPU tensors runs interpreted")
@pytest.mark.parametrize("flavor", ("triton", "cpu"))
@pytest.mark.parametrize("label,call,make,budgets", HOST_WORK, ids=[h[0] for h in HOST_WORK])
def test_host_calls(label, call, make, budgets, flavor, monkeypatch):
    import gpu_host_time
    from triton.runtime.interpreter import InterpretedFunction

    from rlkernels import _ext
    from rlkernels.fake_cuda.check import leaves_of

    if flavor == "cpu" and not _ext.ext_available():
        pytest.skip("the C++ extension is not built")
    monkeypatch.setattr(InterpretedFunction, "run", gpu_host_time.noop_launch)
    x = make(None)
    leaves = [t for t in x.values() if isinstance(t, torch.Tensor) and t.requires_grad]

    def step():
        parts = [t for t in leaves_of(call(flavor, **x)) if t is not None and t.requires_grad]
        if parts and leaves:
            torch.autograd.grad(parts, leaves, [torch.ones_like(p) for p in parts], allow_unused=True)

    calls = gpu_host_time.host_calls(step)
    assert calls <= budgets[flavor], f"{label} [{flavor}]: {calls} calls from Python > {budgets[flavor]}"


@pytest.mark.skipif(torch.cuda.is_available(), reason="the Triton flavor on CPU tensors runs interpreted")
@pytest.mark.parametrize("flavor,budget", [("triton", 146), ("cpu", 91)])
def test_linear_policy_loss_block_gradient_host_calls(flavor, budget, monkeypatch):
    """linear_policy_loss's loss gradient a row block (512 tokens, entropy bonus and KL;
    benchmarks/linear_policy_loss_host.py times it): the policy_loss forward's saved gradient, today's count
    with 10 % of room, and fewer calls than the autograd round trip through the public function it
    replaced."""
    import gpu_host_time
    import linear_policy_loss_host
    from triton.runtime.interpreter import InterpretedFunction

    from rlkernels import _ext

    if flavor == "cpu" and not _ext.ext_available():
        pytest.skip("the C++ extension is not built")
    monkeypatch.setattr(InterpretedFunction, "run", gpu_host_time.noop_launch)
    calls = gpu_host_time.host_calls(linear_policy_loss_host.block_loss(flavor))
    before = gpu_host_time.host_calls(linear_policy_loss_host.block_loss(flavor, "autograd"))
    assert calls <= budget and calls < before, (calls, budget, before)


def test_views_cost_script(capsys):
    """benchmarks/views_cost.py, the note's table of verl's views: it runs, and each op's views launch the
    kernels its contiguous inputs do (the copies it used to add are gone)."""
    import views_cost

    assert views_cost.main(["--B", "4", "--T", "37"]) == 0
    rows = [line.split(" | ") for line in capsys.readouterr().out.splitlines() if line.startswith("| ")][1:]
    kernels = {(row[0].strip("| "), row[1]): row[4].strip(" |") for row in rows}
    assert len(kernels) == 6, rows
    for op in ("policy_loss", "value_loss", "kl_penalty"):
        assert kernels[op, "verl's views"] == kernels[op, "contiguous"], (op, kernels)
