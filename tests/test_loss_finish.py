"""The token-level losses finished inside their forward kernel (docs/gpu_token_ops.md): policy_loss and
value_loss on every kernel flavor against the float64 reference for every aggregation mode and every form of
the global normalizers (numbers, tensors of several dtypes read by the kernel, dp_size), with fully masked
rows and a fully masked batch; repeated and alternating calls (the last block's persistent counter); more
rows than the finishing program reduces at once; and the kernels' validity flag (`ok`) for every value they
check."""

import pytest
import torch
from oracle import assert_oracle, cpu_kernel_backends, raises_on_host
from policy_inputs import loss_magnitude
from policy_inputs import make_inputs as policy_inputs
from test_value_loss import make_inputs as value_inputs

import rlkernels as rk
from rlkernels.ops import policy_loss as policy_ops
from rlkernels.ops import value_loss as value_ops
from rlkernels.reference.aggregation import AGG_MODES
from rlkernels.triton import policy_loss as triton_policy_loss
from rlkernels.triton import value_loss as triton_value_loss

BACKENDS = cpu_kernel_backends()
NAN, INF = float("nan"), float("inf")
POLICY_KW = dict(clip_high=0.28, dual_clip=3.0, kl_coef=0.1, entropy_coef=0.01)
# How the global normalizers are given: not at all, as numbers, as one-element tensors of a few dtypes (the
# kernels read them on the device), and with dp_size. The values are not the batch's own counts, so that a
# kernel ignoring them fails.
NORMALIZERS = ["none", "numbers", "tensor-float32", "tensor-int64", "tensor-float16", "numbers-dp3"]


def normalizer_kwargs(form: str, mask: torch.Tensor) -> dict:
    m = mask.double()
    tokens, seqs = float(m.sum()) + 7.0, float((m.sum(-1) > 0).sum()) + 2.0
    if form == "none":
        return {}
    if form.startswith("numbers"):
        return dict(num_tokens=tokens, num_seqs=seqs, dp_size=3 if form.endswith("dp3") else 1)
    dtype = getattr(torch, form.removeprefix("tensor-"))
    return dict(num_tokens=torch.tensor(tokens, dtype=dtype), num_seqs=torch.tensor(seqs, dtype=dtype))


def as_float64(kwargs: dict) -> dict:
    """kwargs with its float tensors (normalizers) in float64, for the oracle."""
    return {k: v.double() if torch.is_tensor(v) and v.is_floating_point() else v for k, v in kwargs.items()}


def policy_run(inputs, backend, upstream=-1.3, **kw):
    """(loss, stats, d logp, d entropy) of rk.policy_loss with an upstream gradient."""
    x = {k: t.detach().clone() for k, t in inputs.items()}
    x["logp"].requires_grad_()
    x["entropy"].requires_grad_()
    loss, stats = rk.policy_loss(**x, **kw, backend=backend)
    grads = torch.autograd.grad(loss * upstream, [x["logp"], x["entropy"]])
    return loss, stats, *grads


def value_run(inputs, backend, upstream=-1.3, **kw):
    """(loss, stats, d values) of rk.value_loss with an upstream gradient."""
    x = {k: t.detach().clone() for k, t in inputs.items()}
    x["values"].requires_grad_()
    loss, stats = rk.value_loss(**x, **kw, backend=backend)
    (grad,) = torch.autograd.grad(loss * upstream, x["values"])
    return loss, stats, grad


def check_policy(name, backend, inputs, kw):
    out = policy_run(inputs, backend, **kw)
    same = policy_run(inputs, "reference", **kw)
    inputs64 = {k: (t.double() if t.is_floating_point() else t) for k, t in inputs.items()}
    oracle = policy_run(inputs64, "reference", **as_float64(kw))
    # The loss's error scales with the terms it sums (the suite's rule for losses, policy_inputs.py).
    magnitude = loss_magnitude(inputs64, as_float64(kw))
    assert_oracle(f"{name}/loss", out[0], same[0], oracle[0], magnitude=magnitude)
    assert set(out[1]) == set(oracle[1])
    for key in oracle[1]:
        assert_oracle(f"{name}/{key}", out[1][key], same[1][key], oracle[1][key])
    assert_oracle(f"{name}/d logp", out[2], same[2], oracle[2])
    assert_oracle(f"{name}/d entropy", out[3], same[3], oracle[3])
    return out


def check_value(name, backend, inputs, kw):
    out = value_run(inputs, backend, **kw)
    same = value_run(inputs, "reference", **kw)
    inputs64 = {k: (t.double() if t.is_floating_point() else t) for k, t in inputs.items()}
    oracle = value_run(inputs64, "reference", **as_float64(kw))
    assert_oracle(f"{name}/loss", out[0], same[0], oracle[0])
    assert_oracle(f"{name}/clipfrac", out[1]["clipfrac"], same[1]["clipfrac"], oracle[1]["clipfrac"])
    assert_oracle(f"{name}/d values", out[2], same[2], oracle[2])
    return out


@pytest.mark.parametrize("normalizer", NORMALIZERS)
@pytest.mark.parametrize("agg", AGG_MODES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_policy_loss_every_agg_and_normalizer(backend, agg, normalizer, seed):
    """Row 1 is fully masked (make_inputs), and so is a whole second batch: its loss and stats are 0 (the
    normalizers given or not), its gradients 0, nothing NaN."""
    for level in ("token", "sequence"):
        kw = dict(POLICY_KW, agg=agg, level=level)
        inputs = policy_inputs(6, 37, torch.float32, kw)
        kw.update(normalizer_kwargs(normalizer, inputs["mask"]))
        check_policy(f"{backend}/{agg}/{normalizer}/{level}", backend, inputs, kw)
        inputs["mask"][:] = False
        loss, stats, g_logp, g_ent = policy_run(inputs, backend, **kw)
        assert loss.item() == 0.0 and all(s.item() == 0.0 for s in stats.values()), (level, stats)
        assert (g_logp == 0).all() and (g_ent == 0).all()


@pytest.mark.parametrize("normalizer", NORMALIZERS)
@pytest.mark.parametrize("agg", AGG_MODES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_value_loss_every_agg_and_normalizer(backend, agg, normalizer, seed):
    """Row 1 is fully masked (make_inputs), and so is a whole second batch: loss and clipfrac 0, gradients
    0, nothing NaN."""
    inputs = value_inputs(6, 37, torch.float32, 0.2, float_mask=agg == "seq-mean-token-mean")
    kw = dict(clip=0.2, agg=agg, **normalizer_kwargs(normalizer, inputs["mask"]))
    check_value(f"{backend}/{agg}/{normalizer}", backend, inputs, kw)
    inputs["mask"][:] = False
    loss, stats, grad = value_run(inputs, backend, **kw)
    assert loss.item() == 0.0 and stats["clipfrac"].item() == 0.0
    assert (grad == 0).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_more_rows_than_one_finishing_pass(backend, seed):
    """300 rows: more than the finishing program's row tile (Triton: 64 rows for policy_loss, 256 for
    value_loss) or block (CUDA: 256 threads), so that its loops over the rows take several steps; integer
    masks read as they are."""
    kw = dict(POLICY_KW, agg="seq-mean-token-mean")
    inputs = policy_inputs(300, 5, torch.float32, kw)
    inputs["mask"] = inputs["mask"].to(torch.int64)
    check_policy(f"{backend}/300 rows", backend, inputs, kw)
    inputs = value_inputs(300, 5, torch.float32, 0.2)
    inputs["mask"] = inputs["mask"].to(torch.int32)
    check_value(f"{backend}/300 rows", backend, inputs, dict(clip=0.2, agg="seq-mean-token-sum"))


@pytest.mark.parametrize("T", [6 * 2048 + 37, 2048 + 600])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("backend", [b for b in BACKENDS if b.kind != "triton"])
def test_rows_of_many_blocks(backend, dtype, T, seed):
    """Rows longer than several of the CUDA kernels' blocks (2048 tokens, 8 a thread of 256): 7 chunks, the
    last of 37 tokens, or 2, the last of 600, so that the CUDA last block's chunk loop (4 chunks a step) has
    a remainder, its threads hold 8, 3, 2, 1 or no tokens of a block, and fp64's queue (4 tokens at a time)
    takes one or two rounds. Every input the queues carry: per-token advantages and IS weights, ref
    log-probs, entropy; both levels (the sequence level's pass reads through the same queues). Not the
    Triton flavor: under the interpreter its launcher tiles rows by up to 8192 tokens (its GPU tiles:
    test_policy_loss.py's test_gpu_token_tiles_under_the_interpreter)."""
    for level in ("token", "sequence"):
        kw = dict(POLICY_KW, agg="seq-mean-token-mean", level=level)
        inputs = policy_inputs(3, T, dtype, kw, per_token_adv=True, isw="token")
        check_policy(f"{backend}/{dtype}/{level}/long rows", backend, inputs, kw)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
@pytest.mark.parametrize("backend", [b for b in BACKENDS if b.kind == "triton"])
def test_finishing_loads_of_several_rows_and_chunks(backend, agg, monkeypatch, seed):
    """The Triton finishing program's loads (rlkernels/triton/_aggregation.py finish_tile) at tiles smaller
    than a GPU's, so every loop of it takes several steps: 7 rows of 5 chunks (64-token programs over
    300-token rows), read 2 rows x 2 chunks a load in the first pass (three row tiles, the last one short;
    three chunk groups, the last one chunk), then 4 rows a load in the second."""
    monkeypatch.setattr(triton_policy_loss, "_forward_tile", lambda T: (64, 4))
    monkeypatch.setattr(triton_policy_loss, "finish_tile", lambda *_: (2, 2))
    monkeypatch.setattr(triton_value_loss, "_block", lambda T: 64)
    monkeypatch.setattr(triton_value_loss, "finish_tile", lambda *_: (2, 2))
    for level in ("token", "sequence"):
        kw = dict(POLICY_KW, agg=agg, level=level)
        inputs = policy_inputs(7, 300, torch.float32, kw)
        check_policy(f"{backend}/{agg}/{level}/small finishing tiles", backend, inputs, kw)
    inputs = value_inputs(7, 300, torch.float32, 0.2, float_mask=True)
    check_value(f"{backend}/{agg}/small finishing tiles", backend, inputs, dict(clip=0.2, agg=agg))


@pytest.mark.fires_device_asserts(guarded=True)
@pytest.mark.parametrize("backend", BACKENDS)
def test_repeated_and_alternating_calls(backend, seed):
    """The forward kernels' last program takes a ticket from a counter kept across launches, which it
    resets: calls of one op after another, and of the two ops in turn (the CUDA ops share one counter per
    device and stream), each on fresh inputs, all match the reference; a call whose flag is raised (a NaN
    advantage) leaves the next calls intact."""
    for round_ in range(2):
        for level in ("token", "sequence"):  # the sequence level: a second launch before the forward one
            name = f"{backend}/{round_}/{level}"
            kw = dict(POLICY_KW, agg="token-mean", level=level)
            check_policy(f"{name}/policy", backend, policy_inputs(4, 29, torch.float32, kw), kw)
            kw = dict(clip=0.2, agg="seq-mean-token-mean")
            check_value(f"{name}/value", backend, value_inputs(3, 23, torch.float32, 0.2), kw)
        if raises_on_host(backend):  # on a GPU a raised flag ends the CUDA context (oracle.py)
            bad = policy_inputs(4, 29, torch.float32)
            bad["advantages"][2] = NAN
            with pytest.raises(ValueError, match="advantages must be finite"):
                policy_run(bad, backend)


def _flag(monkeypatch, module, call) -> bool:
    """The `ok` flag the op's kernel returned for `call()`, read where the op checks it (ops/_flags.py)."""
    seen = []
    monkeypatch.setattr(module, "check_flag", lambda op, ok, message, eager, backend: seen.append(bool(ok)))
    call()
    monkeypatch.undo()
    assert len(seen) == 1
    return seen[0]


B, T = 3, 6
VALID, MASKED = (0, 1), (1, 4)  # a token the mask keeps, and one it drops (_mask)


def _mask():
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[1, 3:] = False
    return mask


def _poisoned(x, index, value):
    x = x.clone()
    x[index] = value
    return x


def _policy_call(**override):
    x = dict(logp=-torch.rand(B, T), old_logp=-torch.rand(B, T), advantages=torch.randn(B), mask=_mask(),
             ref_logp=-torch.rand(B, T), kl_coef=0.1)  # fmt: skip
    x.update(override)
    return x


def _value_call(**override):
    x = dict(values=torch.randn(B, T), old_values=torch.randn(B, T), returns=torch.randn(B, T), mask=_mask())
    x.update(override)
    return x


FINITE, NONNEGATIVE, ZERO_ONE = "must be finite", "must be finite and >= 0", "must hold only 0 and 1"
# label -> (op, its arguments poisoned (_arguments), None where the kernel accepts them, else the message of
# the eager check that names the bad value)
FLAG_CASES = {
    "policy/valid": ("policy", {}, None),
    "policy/nan logp at padding": ("policy", dict(logp=("logp", MASKED, NAN)), None),
    "policy/nan old_logp at padding": ("policy", dict(old_logp=("old_logp", MASKED, NAN)), None),
    "policy/-inf logp": ("policy", dict(logp=("logp", VALID, -INF)), None),
    "policy/nan logp": ("policy", dict(logp=("logp", VALID, NAN)), "logp is NaN"),
    "policy/nan old_logp": ("policy", dict(old_logp=("old_logp", VALID, NAN)), "old_logp is NaN"),
    "policy/nan ref_logp": ("policy", dict(ref_logp=("ref_logp", VALID, NAN)), "ref_logp is NaN"),
    "policy/inf advantage": ("policy", dict(advantages=("advantages", 1, INF)), "advantages " + FINITE),
    "policy/nan token advantage at padding": (
        "policy",
        dict(advantages=("token-advantages", MASKED, NAN)),
        "advantages " + FINITE,
    ),
    "policy/negative is_weights": ("policy", dict(is_weights=("is_weights", VALID, -1.0)), NONNEGATIVE),
    "policy/inf row is_weights": ("policy", dict(is_weights=("row-is_weights", 2, INF)), NONNEGATIVE),
    "policy/vespo negative is_weights": (
        "policy",
        dict(is_weights=("is_weights", VALID, -1.0), objective=("vespo",)),
        NONNEGATIVE,
    ),
    "policy/int64 mask 2": ("policy", dict(mask=("int64-mask", VALID, 2)), ZERO_ONE),
    "policy/int32 mask -1": ("policy", dict(mask=("int32-mask", MASKED, -1)), ZERO_ONE),
    "policy/uint8 mask 3": ("policy", dict(mask=("uint8-mask", VALID, 3)), ZERO_ONE),
    "policy/int8 mask 2": ("policy", dict(mask=("int8-mask", VALID, 2)), ZERO_ONE),
    "policy/negative mask weight": ("policy", dict(mask=("float-mask", MASKED, -0.5)), "mask weights"),
    "policy/nan mask weight": ("policy", dict(mask=("float-mask", VALID, NAN)), "mask weights"),
    "value/valid": ("value", {}, None),
    "value/int mask": ("value", dict(mask=("int64-mask", VALID, 1)), None),
    "value/nan values at padding": ("value", dict(values=("values", MASKED, NAN)), "values " + FINITE),
    "value/inf old_values": ("value", dict(old_values=("old_values", VALID, INF)), "old_values " + FINITE),
    "value/-inf returns": ("value", dict(returns=("returns", VALID, -INF)), "returns " + FINITE),
    "value/int64 mask 2": ("value", dict(mask=("int64-mask", VALID, 2)), ZERO_ONE),
    "value/inf mask weight": ("value", dict(mask=("float-mask", VALID, INF)), "mask weights " + NONNEGATIVE),
}


def _arguments(make, spec: dict) -> dict:
    """make()'s arguments with each entry of `spec` applied: (what, index, value) poisons a tensor at index
    (token-advantages / row-is_weights / <dtype>-mask: made first), a 1-tuple is a plain option."""
    x = make()
    for key, entry in spec.items():
        if len(entry) == 1:
            x[key] = entry[0]
            continue
        what, index, value = entry
        if what == "token-advantages":
            base = torch.randn(B, T)
        elif what == "row-is_weights":
            base = torch.rand(B) + 0.5
        elif what == "is_weights":
            base = torch.rand(B, T) + 0.5
        elif what.endswith("-mask"):
            base = _mask().to(getattr(torch, what.removesuffix("-mask").replace("float", "float32")))
        else:
            base = x[key]
        x[key] = _poisoned(base, index, value)
    return x


@pytest.mark.fires_device_asserts
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # NaN inputs, interpreter
@pytest.mark.parametrize("label", list(FLAG_CASES))
@pytest.mark.parametrize("backend", BACKENDS)
def test_kernels_flag_the_values_they_reject(backend, label, monkeypatch):
    """The kernels check the values they read and return `ok` (no Python-level value check runs before them);
    on CPU tensors a False flag makes the op raise the eager check's ValueError naming the argument. (On a GPU
    it asserts on the device instead, which ends the process's CUDA context: a GPU flavor checks the flag.)"""
    op, spec, message = FLAG_CASES[label]
    fn, module, make = (
        (rk.policy_loss, policy_ops, _policy_call)
        if op == "policy"
        else (rk.value_loss, value_ops, _value_call)
    )
    x = _arguments(make, spec)
    assert _flag(monkeypatch, module, lambda: fn(**x, backend=backend)) is (message is None), label
    if message is None:
        loss, stats = fn(**x, backend=backend)
        assert torch.isfinite(loss) and all(torch.isfinite(s) for s in stats.values())
    elif raises_on_host(backend):
        with pytest.raises(ValueError, match=message):
            fn(**x, backend=backend)
