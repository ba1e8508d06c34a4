"""Mistakes in how a function is called get an error that says how to call it: options passed
positionally (`group_advantages(r, 3)`), a transposed LM head; and `info` says which device it found."""

import inspect

import pytest
import torch

import rlkernels as rk
from rlkernels import cli

PUBLIC = [
    rk.discounted_returns, rk.dpo_loss, rk.gae, rk.group_advantages, rk.kl_penalty, rk.linear_logprobs,
    rk.linear_policy_loss, rk.linear_preference_loss, rk.logprobs_from_logits, rk.policy_loss, rk.value_loss,
    rk.rollout_correction, rk.dynamic_sampling, rk.overlong_penalty,
    rk.gdpo_advantages, rk.grpo_passk_advantages, rk.reinforce_plus_plus_advantages,
    rk.reinforce_plus_plus_baseline_advantages, rk.remax_advantages, rk.opo_advantages, rk.gpg_advantages,
    rk.optimal_token_baseline_advantages, rk.trl_grpo_advantages,
]  # fmt: skip


def _positional(fn) -> int:
    params = inspect.signature(fn).parameters.values()
    return sum(p.kind is p.POSITIONAL_OR_KEYWORD for p in params)


@pytest.mark.parametrize("fn", PUBLIC, ids=lambda f: f.__name__)
def test_every_public_function_hints_at_keywords(fn):
    """One argument too many raises the hint (before any other check), not Python's bare message."""
    n = _positional(fn)
    with pytest.raises(TypeError, match=rf"{fn.__name__}\(\) takes {n} positional argument.*keyword-only"):
        fn(*([None] * (n + 1)))
    assert inspect.signature(fn).parameters["backend"].kind is inspect.Parameter.KEYWORD_ONLY


def test_hints_name_the_keywords():
    r, z, m = torch.randn(6), torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.bool)
    calls = [
        (lambda: rk.group_advantages(r, 3), r"e\.g\. group_advantages\(rewards, group_size=3\)$"),
        (
            lambda: rk.group_advantages(r, 3, "rloo"),
            r"group_advantages\(rewards, group_size=3, mode='rloo'\)",
        ),
        (
            lambda: rk.group_advantages(r, torch.zeros(6, dtype=torch.int64)),
            r"group_advantages\(rewards, group_ids=<tensor of shape \(6,\)>\)",
        ),
        (lambda: rk.gae(z, z, m, 0.99, 0.95), r"gae\(rewards, values, mask, gamma=0\.99, lam=0\.95\)"),
        (
            lambda: rk.policy_loss(z, z, z, m, 0.2),
            r"policy_loss\(logp, old_logp, advantages, mask, clip_low=0\.2\)",
        ),
        (lambda: rk.policy_loss(z, z, z, m, z), r"mask, ref_logp=<tensor of shape \(2, 3\)>\)"),
        (lambda: rk.kl_penalty(z, z, "k3", 10.0), r"kl_penalty\(logp, ref_logp, kind, clamp=10\.0\)"),
        # No keyword-only tensor to guess: the options are listed instead.
        (lambda: rk.dpo_loss(r, r, r, r, r), r"keyword-only \(beta, kind, label_smoothing, backend\)$"),
    ]
    for call, message in calls:
        with pytest.raises(TypeError, match=message):
            call()


def test_hints_give_a_value_to_the_first_keyword_whose_annotation_takes_it():
    """`temperature: float | Tensor` takes 0.7 before `softcap: float | None`; None goes to an optional
    parameter, a bool to a bool one, a float never to an int one."""
    h, w, y = torch.randn(2, 4), torch.randn(7, 4), torch.zeros(2, dtype=torch.long)
    z, m = torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.bool)
    calls = [
        (
            lambda: rk.linear_logprobs(h, w, y, 0.7),
            r"e\.g\. linear_logprobs\(hidden, weight, labels, temperature=0\.7\)$",
        ),
        (
            lambda: rk.linear_logprobs(h, w, y, None, 1.0, 30.0),
            r"linear_logprobs\(hidden, weight, labels, bias=None, temperature=1\.0, softcap=30\.0\)$",
        ),
        (
            lambda: rk.linear_logprobs(h, w, y, True),
            r"linear_logprobs\(hidden, weight, labels, return_entropy=True\)$",
        ),
        (
            lambda: rk.logprobs_from_logits(z, m.long(), 0.7),
            r"logprobs_from_logits\(logits, labels, temperature=0\.7\)$",
        ),
        # 2.5 is no group_size (an int): the next float option takes it.
        (lambda: rk.group_advantages(torch.randn(6), 2.5), r"group_advantages\(rewards, eps=2\.5\)$"),
    ]
    for call, message in calls:
        with pytest.raises(TypeError, match=message):
            call()


@pytest.mark.parametrize(
    "fn", [rk.linear_logprobs, rk.linear_policy_loss, rk.linear_preference_loss], ids=lambda f: f.__name__
)
def test_transposed_weight_is_named(fn):
    hidden, weight = torch.randn(2, 3, 5), torch.randn(9, 5)
    labels = torch.randint(0, 9, (2, 3))
    extra = () if fn is not rk.linear_policy_loss else (-torch.rand(2, 3), torch.randn(2), torch.ones(2, 3))
    transposed = r"weight looks transposed: got shape \(5, 9\) = \[D, V\].*expected \[V, D\] = \(9, 5\)"
    with pytest.raises(ValueError, match=f"{fn.__name__}: {transposed}"):
        fn(hidden, weight.T, labels, *extra)
    # A weight that is neither: the shapes are stated.
    with pytest.raises(ValueError, match=r"D = weight.shape\[1\] = 4 \(weight is \[V, D\] = \(9, 4\)\)"):
        fn(hidden, weight[:, :4], labels, *extra)


def test_info_states_the_device(capsys):
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    if torch.cuda.is_available():
        assert f"device: GPU {torch.cuda.get_device_name()}" in out
    else:
        assert "device: no GPU found" in out and "CPU tensors only" in out
    if rk.ext_available():
        built = rk.build_info()["cuda"]
        assert ("CUDA kernels: compiled for archs" if built else "CUDA kernels: not compiled") in out
