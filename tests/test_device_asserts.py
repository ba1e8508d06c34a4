"""The CUDA C++ and the Triton kernels fail a device-side assert where they lower their op's validity flag
(csrc/cuda/common.cuh RLK_REQUIRE_VALUES, rlkernels/triton/_device_assert.py), so that neither flavor needs a
torch._assert_async after them on a GPU (rlkernels/ops/_flags.py asserted_in_kernel; docs/gpu_token_ops.md,
"Input values without a host sync").

On the cuda-on-cpu harness the assert is recorded, not fatal (tests/cuda_on_cpu, rlkernels_sim_stats::
device_asserts), so each case checks three things of one bad input value: the op still raises the
ValueError naming the argument (the flag, then the eager checks on CPU tensors), exactly one kernel
asserted, with the op's message, and the same call on valid values asserts nothing. Triton's interpreter,
with the GPU's asserts forced on, raises at the first kernel that asserts: the same cases check that it is
one with the same message, and that valid values assert nothing. On fake CUDA tensors neither flavor
enqueues a torch._assert_async for these flags."""

from __future__ import annotations

import dataclasses
import pathlib
import re
import sys

import pytest
import torch
from cuda_on_cpu import build, flavor
from oracle import chunked_responses, kernel_flavors

import rlkernels as rk
from rlkernels.fake_cuda import Maker

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))
import gpu_cost  # noqa: E402

# Where the cuda-on-cpu flavor runs (tests/oracle.py kernel_flavors): with a GPU the kernels run there (the
# last test), and the harness is not built.
on_the_harness = pytest.mark.skipif(
    not build.platform_supported() or torch.cuda.is_available(),
    reason="the harness runs on Linux without a GPU",
)

B, T = 6, 9


def _gen() -> torch.Generator:
    return torch.Generator().manual_seed(0)


def _ids(b: int) -> torch.Tensor:
    return (torch.arange(b) // 3)[torch.randperm(b, generator=_gen())]


def _mask(b: int = B, t: int = T) -> torch.Tensor:
    mask = torch.ones(b, t, dtype=torch.int64)
    mask[:, t - 2 :] = 0
    return mask


def _bad_mask(b: int = B, t: int = T) -> torch.Tensor:
    mask = _mask(b, t)
    mask[1, 2] = 2  # an integer mask value other than 0 / 1
    return mask


def _scores(b: int, bad: bool) -> torch.Tensor:
    s = torch.randn(b, generator=_gen())
    if bad:
        s[b // 2] = float("nan")
    return s


def _token_rewards(bad: bool) -> torch.Tensor:
    r = torch.randn(B, T, generator=_gen())
    if bad:
        r[2, 3] = float("inf")
    return r


def _policy(bad: bool, be: str):
    logp = -torch.rand(B, T, generator=_gen())
    adv = torch.randn(B, generator=_gen())
    if bad:
        adv[1] = float("nan")
    return rk.policy_loss(logp.requires_grad_(), logp.detach() - 0.1, adv, _mask(), backend=be)


def _value(bad: bool, be: str):
    v = torch.randn(B, T, generator=_gen())
    ret = v + 0.5
    if bad:
        ret[0, 0] = float("nan")
    return rk.value_loss(v.requires_grad_(), v.detach(), ret, _mask(), backend=be)


def _agg(bad: bool, be: str):
    loss_mat = torch.randn(B, T, generator=_gen())
    return rk.agg_loss(loss_mat.requires_grad_(), _bad_mask() if bad else _mask(), backend=be)


def _logits(bad: bool, be: str):
    labels = torch.randint(0, 11, (B,), generator=_gen())
    if bad:
        labels[3] = 11  # outside [0, V)
    return rk.logprobs_from_logits(torch.randn(B, 11, generator=_gen()), labels, backend=be)


def _otb(bad: bool, be: str):
    sp = 0.5 * torch.rand(B, T, generator=_gen())
    return rk.optimal_token_baseline_advantages(
        _token_rewards(bad), _mask(), group_ids=_ids(B), old_logp=-torch.rand(B, T, generator=_gen()),
        sum_pi_squared=sp, backend=be,
    )  # fmt: skip


# (label, call(bad), the argument the ValueError names, the kernel's message)
GROUP = "rlkernels group advantages: a reward (score) is NaN or inf"
TOKENS = "rlkernels advantage tokens: a mask value is not 0 / 1"
OUTCOME = "rlkernels grpo_passk / opo: a score is NaN or inf"
CASES = [
    (
        "group_advantages, contiguous groups",
        lambda bad, be: rk.group_advantages(_scores(B, bad), group_size=3, backend=be),
        "rewards",
        GROUP,
    ),
    (
        "group_advantages, ids (the walk)",
        lambda bad, be: rk.group_advantages(_scores(B, bad), group_ids=_ids(B), backend=be),
        "rewards",
        GROUP,
    ),
    (
        "group_advantages, ids (chunks)",
        lambda bad, be: rk.group_advantages(
            _scores(chunked_responses(be), bad), group_ids=_ids(chunked_responses(be)), backend=be
        ),
        "rewards",
        GROUP,
    ),
    (
        "gdpo, two columns (chunks)",
        lambda bad, be: rk.gdpo_advantages(
            torch.stack([_scores(chunked_responses(be), False), _scores(chunked_responses(be), bad)], 1),
            _mask(chunked_responses(be), 4),
            group_ids=_ids(chunked_responses(be)),
            backend=be,
        ),
        "scores",
        GROUP,
    ),
    (
        "gdpo, two columns (the walk, with the mask rows' whitening moments)",
        lambda bad, be: rk.gdpo_advantages(
            torch.stack([_scores(B, False), _scores(B, bad)], 1), _mask(), group_ids=_ids(B), backend=be
        ),
        "scores",
        GROUP,
    ),
    (
        "group_advantages tokens, a mask value",
        lambda bad, be: rk.group_advantages(
            _scores(B, False), group_ids=_ids(B), mask=_bad_mask() if bad else _mask(), backend=be
        ),
        "mask",
        TOKENS,
    ),
    (
        "reinforce_plus_plus_baseline whitened tokens, a mask value",
        lambda bad, be: rk.reinforce_plus_plus_baseline_advantages(
            _scores(B, False), _bad_mask() if bad else _mask(), group_ids=_ids(B), backend=be
        ),
        "mask",
        TOKENS,
    ),
    (
        "grpo_passk (the walk)",
        lambda bad, be: rk.grpo_passk_advantages(_scores(B, bad), _mask(), group_ids=_ids(B), backend=be),
        "scores",
        OUTCOME,
    ),
    (
        "opo (chunks)",
        lambda bad, be: rk.opo_advantages(
            _scores(chunked_responses(be), bad),
            _mask(chunked_responses(be), 4),
            group_ids=_ids(chunked_responses(be)),
            backend=be,
        ),
        "scores",
        OUTCOME,
    ),
    ("optimal_token_baseline", _otb, "rewards", "rlkernels optimal_token_baseline: NaN or inf rewards"),
    (
        "gae",
        lambda bad, be: rk.gae(_token_rewards(bad), torch.zeros(B, T), _mask(), backend=be),
        "rewards",
        "rlkernels gae / discounted returns:",
    ),
    (
        "rollout_correction, a mask value",
        lambda bad, be: rk.rollout_correction(
            -torch.rand(B, T, generator=_gen()),
            -torch.rand(B, T, generator=_gen()),
            _bad_mask() if bad else _mask(),
            backend=be,
        ),
        "mask",
        "rlkernels rollout_correction: a mask value",
    ),
    ("logprobs_from_logits", _logits, "labels", "rlkernels logprobs_from_logits: a label outside [0, V)"),
    ("policy_loss", _policy, "advantages", "rlkernels policy_loss: NaN or inf advantages"),
    ("value_loss", _value, "returns", "rlkernels value_loss: NaN or inf values, old_values or returns"),
    ("agg_loss", _agg, "mask", "rlkernels agg_loss: mask weights negative or not finite"),
]


def _asserts() -> list[str]:
    return list(torch.ops.rlkernels_sim_stats.device_asserts())


@on_the_harness
@pytest.mark.parametrize("label,call,argument,message", CASES, ids=[c[0] for c in CASES])
def test_a_bad_value_fails_one_device_assert(label, call, argument, message):
    with flavor.cuda_on_cpu():
        _asserts()  # earlier calls' records
        call(False, "cpu")
        assert _asserts() == [], f"{label}: valid values asserted"
        with pytest.raises(ValueError, match=argument):
            call(True, "cpu")
        fired = _asserts()
    assert len(fired) == 1 and message in fired[0], f"{label}: {fired}"


# ---- the Triton kernels under the interpreter, with the asserts they compile on a GPU ----


@pytest.fixture
def triton_gpu_asserts(monkeypatch):
    """The Triton launchers pass CHECK_MSG on CPU tensors too (_device_assert.FORCE), and the interpreter
    runs tl.device_assert (its own debug option, which the GPU launch sets)."""
    from triton.runtime import interpreter

    from rlkernels.triton import _device_assert

    monkeypatch.setattr(_device_assert, "FORCE", True)
    builder = interpreter.interpreter_builder
    monkeypatch.setattr(builder, "options", dataclasses.replace(builder.options, debug=True))


needs_interpreter = pytest.mark.skipif(
    torch.cuda.is_available(), reason="the Triton kernels run under the interpreter only without a GPU"
)


@needs_interpreter
@pytest.mark.parametrize("label,call,argument,message", CASES, ids=[c[0] for c in CASES])
def test_a_bad_value_fails_the_triton_kernels_assert(label, call, argument, message, triton_gpu_asserts):
    call(False, "triton")  # valid values: no kernel asserts
    with pytest.raises(Exception, match=re.escape(message)) as raised:
        call(True, "triton")
    assert not isinstance(raised.value, ValueError), f"{label}: the eager checks ran before any assert"


# ---- on fake CUDA tensors: no flavor's flag takes a torch._assert_async ----


def _fake_policy(mode):
    m = Maker(torch.device("cuda" if mode is not None else "cpu"), mode)
    return dict(logp=m.logp(B, T, grad=True), old_logp=m.logp(B, T), advantages=m.randn(B), mask=m.mask(B, T))


def _fake_group(mode):
    m = Maker(torch.device("cuda" if mode is not None else "cpu"), mode)
    return dict(rewards=m.randn(B), mask=m.mask(B, T))


FAKE = [
    ("policy_loss", lambda be, **x: rk.policy_loss(**x, backend=be)[0], _fake_policy),
    (
        "group_advantages, contiguous, mask",
        lambda be, **x: rk.group_advantages(x["rewards"], group_size=3, mask=x["mask"], backend=be),
        _fake_group,
    ),
]


@pytest.mark.parametrize("label,call,make", FAKE, ids=[f[0] for f in FAKE])
def test_no_flavor_enqueues_the_assert(label, call, make):
    asserts = {}
    for backend in ("triton", "cuda"):
        cost = gpu_cost.count(lambda be=backend, **x: call(be, **x), make)
        asserts[backend] = [k.name for k in cost.launches if "_assert_async" in k.name]
    assert asserts == {"triton": [], "cuda": []}, f"{label}: {asserts}"


# ---- on a GPU: the assert ends the process with the message (a subprocess: it ends the CUDA context) ----

# argv: the call ("policy_loss": its forward + backward; "opo": 3000 responses, the chunk path's passes and
# their message, a device global), "good" or "bad" (one NaN), and the backend.
_ON_GPU = """
import sys, torch, rlkernels as rk
call, bad, backend = sys.argv[1], sys.argv[2] == "bad", sys.argv[3]
if call == "policy_loss":
    logp = -torch.rand(4, 64, device="cuda")
    adv = torch.randn(4, device="cuda")
    if bad:
        adv[1] = float("nan")
    mask = torch.ones(4, 64, dtype=torch.bool, device="cuda")
    loss, _ = rk.policy_loss(logp.requires_grad_(), logp.detach() - 0.1, adv, mask, backend=backend)
    loss.backward()
    out = loss
else:
    scores = torch.randn(3000, device="cuda")
    if bad:
        scores[2999] = float("nan")
    ids = torch.arange(3000, device="cuda") // 3
    out = rk.opo_advantages(scores, torch.ones(3000, 8, dtype=torch.bool, device="cuda"), group_ids=ids,
                            backend=backend)[0].sum()
torch.cuda.synchronize()
print("finished", float(out))
"""


# The GPU flavors on a GPU (none here: an empty parameter set), flavors so that the GPU lease's flavored
# tests (rlkernels/selftest_plugin.py --rlk-flavored-only) run them.
GPU_FLAVORS = [f for f in kernel_flavors() if f.name in ("cuda", "triton")]


@pytest.mark.parametrize("backend", GPU_FLAVORS)
@pytest.mark.parametrize(
    "call,message",
    [("policy_loss", "rlkernels policy_loss: NaN or inf advantages"), ("opo", "rlkernels grpo_passk / opo")],
)
def test_on_a_gpu_a_bad_value_fails_the_kernels_assert_with_its_message(backend, call, message):
    """The CUDA C++ and the Triton kernels on a NaN input (policy_loss's forward; opo's chunk passes): the
    process fails with CUDA's device-side assert and the kernel's message is printed (by __assert_fail); on
    valid values the same call finishes."""
    import subprocess

    run = [sys.executable, "-c", _ON_GPU, call]
    good = subprocess.run([*run, "good", str(backend)], capture_output=True, text=True, timeout=300)
    assert good.returncode == 0 and "finished" in good.stdout, good.stderr[-2000:]
    bad = subprocess.run([*run, "bad", str(backend)], capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0 and "finished" not in bad.stdout
    printed = bad.stdout + bad.stderr  # the device's assert message: written by the driver, either stream
    assert message in printed, printed[-2000:]
    assert "device-side assert" in bad.stderr, bad.stderr[-2000:]
