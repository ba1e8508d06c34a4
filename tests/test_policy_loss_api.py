"""policy_loss at the API boundary: the bad-input table, opcheck of every custom op (native and Triton
flavors, both backward designs) and torch.compile(fullgraph=True)."""

import pytest
import torch
from oracle import cpu_kernel_backends, plain
from policy_inputs import make_inputs, run

import rlkernels as rk
from rlkernels.ops._aggregation import AggConfig
from rlkernels.ops.policy_loss import PolicyInputs
from rlkernels.policy_config import PolicyConfig

BACKENDS = cpu_kernel_backends()
# Every option at once: asymmetric clip (DAPO), KL, entropy bonus.
FULL = dict(clip_low=0.2, clip_high=0.28, kl_coef=0.1, kl_kind="k3", entropy_coef=0.01)


# ---- bad inputs ----

GOOD = dict(
    logp=torch.zeros(2, 3), old_logp=torch.zeros(2, 3), advantages=torch.zeros(2), mask=torch.ones(2, 3)
)
BAD = [
    (dict(clip_low=0.0), ValueError, "clip_low must be > 0"),
    (dict(clip_low=-0.1), ValueError, "clip_low must be > 0"),
    (dict(clip_high=0.0), ValueError, "clip_high must be > 0"),
    (dict(dual_clip=1.0), ValueError, "dual_clip must be > 1"),
    (dict(dual_clip=0.5), ValueError, "dual_clip must be > 1"),
    (dict(ratio_cap=1.0), ValueError, "ratio_cap must be > 1"),
    (dict(agg="mean"), ValueError, "agg must be one of"),
    (dict(objective="ppo"), ValueError, "objective must be one of"),
    (dict(level="seq"), ValueError, "level must be one of"),
    (dict(kl_kind="k4", kl_coef=0.1, ref_logp=torch.zeros(2, 3)), ValueError, "kl_kind must be one of"),
    (dict(kl_coef=0.1), ValueError, "kl_coef=0.1 needs ref_logp"),
    (dict(entropy_coef=0.1), ValueError, "entropy_coef=0.1 needs entropy"),
    (dict(objective="cispo", dual_clip=3.0), ValueError, "dual_clip applies to objective='clip' only"),
    (dict(objective="sapo", ratio_cap=3.0), ValueError, "ratio_cap applies to objective in"),
    (dict(objective="dro"), ValueError, "objective='dro' needs dro_beta > 0"),
    (dict(objective="dro", dro_beta=0.0), ValueError, "dro_beta must be > 0"),
    (dict(objective="gpg", level="sequence"), ValueError, "supports objective='clip' only"),
    (dict(objective="geo_mean", level="sequence"), ValueError, "geo_mean and vespo build their own"),
    (dict(objective="vespo", is_weights=torch.ones(2)), ValueError, "folds per-token is_weights"),
    (dict(objective="vespo", vespo_k_neg=-1.0), ValueError, "vespo_k_neg must be >= 0"),
    (dict(objective="kl_cov", cov_options=(0.1, 1.0)), TypeError, "cov_options must be an rk.CovOptions"),
    (
        dict(objective="clip_cov", cov_options=rk.CovOptions(ratio=0.0)),
        ValueError,
        "cov_options.ratio must be > 0",
    ),
    (
        dict(objective="clip_cov", cov_options=rk.CovOptions(lower=5.0, upper=1.0)),
        ValueError,
        "lower must be <",
    ),
    (dict(objective="clip_cov", generator=0), TypeError, "generator must be a torch.Generator"),
    (dict(objective="clip_cov", dual_clip=3.0), ValueError, "dual_clip applies to objective='clip' only"),
    (dict(objective="sapo", level="sequence"), ValueError, "supports objective='clip' only"),
    (dict(dp_size=0), ValueError, "dp_size must be an int >= 1"),
    (dict(num_tokens=-1), ValueError, "num_tokens must be >= 0"),
    (dict(num_seqs=torch.ones(2)), ValueError, "num_seqs must be a number or a one-element tensor"),
    (dict(norm_len=0), ValueError, "norm_len must be > 0"),
    (dict(sapo_tau_neg=0.0), ValueError, "sapo_tau_neg must be > 0"),
    (
        dict(old_logp=torch.zeros(2, 4)),
        ValueError,
        r"old_logp has shape \(2, 4\) but logp has shape \(2, 3\)",
    ),
    (
        dict(advantages=torch.zeros(3)),
        ValueError,
        r"advantages must be \[B\], \[B, 1\] or \[B, T\] = \(2, 3\), got shape \(3,\)",
    ),
    (dict(advantages=torch.zeros(2, 4)), ValueError, "advantages must be"),
    (dict(mask=torch.ones(2, 2)), ValueError, r"mask has shape \(2, 2\)"),
    (dict(mask=torch.ones(2, 3, dtype=torch.complex64)), TypeError, r"mask must be a bool, integer \(0/1\)"),
    (dict(mask=torch.full((2, 3), 2, dtype=torch.int64)), ValueError, "must hold only 0 and 1"),
    (dict(is_weights=torch.ones(3, 3)), ValueError, "is_weights must be"),
    (dict(ref_logp=torch.zeros(3, 3)), ValueError, "ref_logp has shape"),
    (dict(entropy=torch.zeros(2)), ValueError, "entropy has shape"),
    (dict(logp=torch.zeros(6)), ValueError, r"logp must be 2-D, got shape \(6,\)"),
    (dict(logp=torch.zeros(2, 3, dtype=torch.int64)), TypeError, "logp must be float32"),
    (dict(advantages=[0.0, 1.0]), TypeError, "advantages must be a torch.Tensor"),
    (dict(backend="gpu"), ValueError, "backend must be one of"),
]


@pytest.mark.parametrize("kwargs,exc,match", BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_inputs(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        rk.policy_loss(**dict(GOOD, **kwargs))


def test_options_checked_once_still_reject_what_they_rejected():
    """The scalar options are checked once per distinct combination (ops/policy_loss.py _options, an LRU
    cache): a value equal to a cached one but of another type, an unhashable value and a tensor still raise
    the error naming the option."""
    rk.policy_loss(**GOOD, clip_low=1.0, kl_coef=0.0)  # cached: 1.0 == True, 0.0 == False
    for name, value in (
        ("clip_low", True),
        ("kl_coef", False),
        ("clip_low", [0.2]),
        ("clip_high", {"value": 0.2}),
        ("kl_coef", torch.tensor(0.0)),
    ):
        with pytest.raises(TypeError, match=f"{name} must be a number"):
            rk.policy_loss(**GOOD, **dict(dict(clip_low=1.0, kl_coef=0.0), **{name: value}))


def test_explicit_unavailable_backend_raises():
    with pytest.raises(rk.BackendUnavailableError):
        rk.policy_loss(**GOOD, backend="cuda")


# ---- registration: opcheck and torch.compile ----


def _op_name(backend):
    from rlkernels.ops.policy_loss import _FLAVORS

    return _FLAVORS[backend]


def _op_agg_args(level):
    """The aggregation arguments: a global count as a number, and one as a tensor (on the test's device)."""
    if level == "token":
        return AggConfig("token-mean", 2, 10.0, 40.0, None, None, None)
    return AggConfig("seq-mean-token-mean", 1, 10.0, None, None, None, torch.tensor(5))


def _op_inputs_and_config(level="token"):
    x = make_inputs(3, 10, torch.float32, dict(level=level), isw="token")
    inputs = PolicyInputs(
        x["logp"].requires_grad_(), x["old_logp"], x["advantages"], x["mask"], x["ref_logp"],
        x["entropy"].requires_grad_(), x["is_weights"],
    )  # fmt: skip
    config = PolicyConfig(
        objective="clip", seq_level=level == "sequence", clip_low=0.2, clip_high=0.28, dual_clip=3.0,
        ratio_cap=None, tau_pos=1.0, tau_neg=1.05, dro_beta=1.0,
        vespo_k_pos=2.0, vespo_lambda_pos=3.0, vespo_k_neg=3.0, vespo_lambda_neg=2.0,
        kl_coef=0.1, kl_kind="k3", kl_clamp=10.0,
        entropy_coef=0.01,
    )  # fmt: skip
    return inputs, config


def _backward_args(forward_outputs, inputs, config, grad_loss=None):
    """The backward op's arguments (both gradients wanted) after a forward call, its data detached."""
    loss, _stats, row_weights, row_stats, saved, _ok = forward_outputs
    data = PolicyInputs._make(t.detach() if t is not None else None for t in inputs)
    grad_loss = torch.randn_like(loss) if grad_loss is None else grad_loss
    return (grad_loss, row_weights, row_stats, saved, *data, *config, True, True)


@pytest.mark.parametrize("save_grad", [True, False])
@pytest.mark.parametrize("backend", BACKENDS)
def test_opcheck(backend, save_grad):
    flavor = _op_name(backend)
    op = getattr(torch.ops.rlkernels, flavor)
    for level in ("token", "sequence"):
        inputs, config = _op_inputs_and_config(level)
        args = (*inputs, *config, *_op_agg_args(level), save_grad)
        torch.library.opcheck(op, args)
        bargs = _backward_args(op(*args), inputs, config)
        torch.library.opcheck(getattr(torch.ops.rlkernels, flavor + "_backward"), bargs)


@pytest.mark.skipif(
    "cpu" not in BACKENDS, reason="policy_loss_backward_into_saved is a native CPU op (extension not built)"
)
@pytest.mark.parametrize("float_mask", [False, True])
def test_backward_into_saved_matches_functional_backward(float_mask):
    """The eager backward's in-place CPU op gives exactly what the functional backward op gives (the same
    products), and passes opcheck as a mutating op."""
    inputs, config = _op_inputs_and_config()
    if float_mask:
        inputs = inputs._replace(mask=inputs.mask.float() * 0.5)
    outputs = torch.ops.rlkernels.policy_loss(*inputs, *config, *_op_agg_args("token"), True)
    _loss, _stats, row_weights, row_stats, saved, _ok = outputs
    grad_loss = torch.tensor(-1.7)
    bargs = _backward_args(outputs, inputs, config, grad_loss)
    want_logp, want_ent = torch.ops.rlkernels.policy_loss_backward(*bargs)
    into_saved = torch.ops.rlkernels.policy_loss_backward_into_saved
    for entropy_grad in (True, False):
        buf = saved.clone()
        got_ent = into_saved(buf, grad_loss, row_weights, inputs.mask, config.entropy_coef, entropy_grad)
        torch.testing.assert_close(buf, want_logp, rtol=0, atol=0)
        if entropy_grad:
            torch.testing.assert_close(got_ent, want_ent, rtol=0, atol=0)
        else:
            assert got_ent.numel() == 0
        op_args = (saved.clone(), grad_loss, row_weights, inputs.mask, 0.01, entropy_grad)
        torch.library.opcheck(into_saved, op_args)


@pytest.mark.parametrize("backend", BACKENDS)
def test_torch_compile_fullgraph(backend):
    backend = plain(backend)
    torch._dynamo.reset()
    kw = dict(FULL, dual_clip=3.0, agg="seq-mean-token-mean", backend=backend)
    inputs = make_inputs(4, 16, torch.float32, isw="row")

    def fn(**x):
        loss, stats = rk.policy_loss(**x, **kw)
        return loss, stats["clipfrac"], stats["kl"]

    compiled = torch.compile(fn, fullgraph=True)
    eager = run(lambda **x: (fn(**x)[0], {}), inputs, {}, 1.0)
    got = run(lambda **x: (compiled(**x)[0], {}), inputs, {}, 1.0)
    torch.testing.assert_close(got[0], eager[0])
    for a, b in zip(got[2], eager[2], strict=True):
        torch.testing.assert_close(a, b)
