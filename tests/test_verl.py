"""rlkernels.integrations.verl against the installed verl (the `[integrations]` extra, verl 0.9.1 with
--no-deps): each adapter equals verl's own function on the same inputs, values and gradients, in float64;
the kernels' aggregation and returns scan follow verl 0.9.1 on every backend; install() puts the adapters
into verl's registries. Skipped without verl; test_pinned_version fails when the installed verl is not the
version these adapters follow."""

import functools
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from oracle import assert_oracle, cpu_kernel_backends

import rlkernels as rk
from rlkernels.reference.aggregation import AGG_MODES

verl = pytest.importorskip("verl", reason="verl is installed by the [integrations] extra (README)")
from verl.trainer.ppo import core_algos  # noqa: E402
from verl.workers.config import ActorConfig, PolicyLossConfig  # noqa: E402

from rlkernels.integrations import verl as rk_verl  # noqa: E402

BACKENDS = cpu_kernel_backends() + ["reference"]
EXACT = dict(rtol=1e-12, atol=1e-12)
# verl's grpo loop gives a group of one the float32 std tensor 1.0, so it divides by fp32(1 + 1e-6): a
# relative difference up to fp32's half ulp (6e-8) from the float64 1 + 1e-6.
SINGLETON = dict(rtol=1e-7, atol=1e-12)
# verl's vectorized grpo computes the group statistics in float32 (verl.utils.group_mean_std).
FP32 = dict(rtol=1e-6, atol=1e-6)
# verl's masked_mean divides by Σm + 1e-8 (we divide by Σm): whitened values differ by ~1e-8 relative
# to their scale.
WHITENED = dict(rtol=1e-8, atol=1e-8)


def test_pinned_version():
    assert verl.__version__ == rk_verl.VERL_VERSION


def _batch(seed: int, b: int = 6, t: int = 11):
    gen = torch.Generator().manual_seed(seed)
    logp = -torch.rand(b, t, dtype=torch.float64, generator=gen) * 3
    old = logp + 0.4 * torch.randn(b, t, dtype=torch.float64, generator=gen)
    adv = torch.randn(b, t, dtype=torch.float64, generator=gen)
    mask = (torch.rand(b, t, generator=gen) > 0.3).double()
    mask[1] = 0  # a fully masked row: excluded from the seq-mean counts by both
    return logp, old, adv, mask


def _global_batch_info(case: str, mask) -> dict:
    if case == "local":
        return {}
    if case == "dp2":  # the global counts of a batch twice this shard's, split over 2 ranks
        return dict(dp_size=2, batch_num_tokens=2 * mask.sum(), global_batch_size=9, loss_scale_factor=7)
    return dict(loss_scale_factor=5)


@pytest.mark.parametrize("case", ["local", "dp2", "scale"])
@pytest.mark.parametrize("mode", AGG_MODES)
def test_agg_loss(mode, case):
    loss_mat, _, _, mask = _batch(0)
    info = _global_batch_info(case, mask)
    want = core_algos.agg_loss(loss_mat, mask, mode, **info)
    torch.testing.assert_close(rk_verl.agg_loss(loss_mat, mask, mode, **info), want.reshape(()), **_tol(mode))


def _tol(mode: str) -> dict:
    """Exact in float64, but for verl's S_b / (n_b + 1e-8) in seq-mean-token-mean (we divide exactly, on
    purpose): a relative difference of at most 1e-8 / min n_b (n_b >= 1)."""
    return dict(rtol=1e-8, atol=1e-12) if mode == "seq-mean-token-mean" else EXACT


def test_agg_loss_errors_as_verl():
    loss_mat, _, _, mask = _batch(0)
    for mode, match in (("token-mean", "batch_num_tokens"), ("seq-mean-token-sum", "global_batch_size")):
        with pytest.raises(ValueError, match=match):
            core_algos.agg_loss(loss_mat, mask, mode, dp_size=2)
        with pytest.raises(ValueError, match=match):
            rk_verl.agg_loss(loss_mat, mask, mode, dp_size=2)


# The global normalizers (dp2, scale) belong to the aggregation every loss shares: checked with four losses.
LOSS_CASES = [
    (loss_mode, case)
    for loss_mode in rk_verl.POLICY_LOSSES
    for case in ("local", "dp2", "scale")
    if case == "local" or loss_mode in ("vanilla", "gspo", "sapo", "cispo")
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", AGG_MODES)
@pytest.mark.parametrize("loss_mode,case", LOSS_CASES)
def test_policy_losses(loss_mode, backend, mode, case, monkeypatch):
    """Each registered loss through rk.policy_loss on every backend: verl's loss, its gradient and its
    metrics (vanilla: dual-clip PPO; gspo: the sequence ratio; sapo: always seq-mean-token-mean; cispo)."""
    monkeypatch.setattr(rk_verl.rk, "policy_loss", functools.partial(rk.policy_loss, backend=backend))
    logp, old, adv, mask = _batch(1)
    adv[0] = -adv[0].abs() - 2  # negative advantages with large ratios: the dual clip is active
    logp[0] = old[0] + 1.5
    is_weights = torch.rand(logp.shape, dtype=torch.float64) + 0.5
    if loss_mode == "geo_mean":  # verl's GMPO supports sequence-level advantages only
        adv = adv[:, :1].expand_as(adv).contiguous()
    config = ActorConfig(
        strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, clip_ratio_high=0.28,
        # clip_cov: a ratio of 1 takes every candidate (verl draws them at random); kl_cov: the top 10 %.
        policy_loss=PolicyLossConfig(
            loss_mode=loss_mode, dro_beta=0.3, clip_cov_ratio=1.0, clip_cov_lb=0.05, clip_cov_ub=5.0,
            kl_cov_ratio=0.1, ppo_kl_coef=0.5,
        ),
    )  # fmt: skip
    config.global_batch_info.update(_global_batch_info(case, mask))
    name = rk_verl.POLICY_LOSSES[loss_mode]
    outs = []
    for fn in (core_algos.get_policy_loss_fn(loss_mode), getattr(rk_verl, name)):
        lp = logp.clone().requires_grad_()
        loss, metrics = fn(old, lp, adv, mask, mode, config, is_weights)
        outs.append((loss.reshape(()), torch.autograd.grad(loss, lp)[0], metrics))
    (want, g_want, m_want), (got, g_got, m_got) = outs
    agg = "seq-mean-token-mean" if loss_mode in ("sapo", "geo_mean") else mode
    tol = _tol(agg)
    if str(backend) == "triton":  # fp32 hyper-parameters: each term off by ~1e-7 of the terms' scale
        scale = max(1.0, 4 * float(adv.abs().max() * is_weights.max()))
        tol = dict(rtol=1e-6, atol=1e-6 * scale)
    torch.testing.assert_close(got, want, **tol)
    torch.testing.assert_close(g_got, g_want, **tol)
    assert m_got.keys() == m_want.keys()
    assert loss_mode != "vanilla" or m_want["actor/pg_clipfrac_lower"] > 0
    if loss_mode.startswith("dppo") or loss_mode == "clip_cov":  # some tokens dropped, not all
        assert 0 < m_want["actor/pg_clipfrac"] < 0.9
    for key in m_want:
        assert m_got[key] == pytest.approx(m_want[key], rel=1e-6, abs=1e-9), key


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", ["local", "dp2", "scale"])
@pytest.mark.parametrize("mode", AGG_MODES)
def test_value_loss(backend, mode, case, monkeypatch):
    monkeypatch.setattr(rk_verl.rk, "value_loss", functools.partial(rk.value_loss, backend=backend))
    returns, values, vpreds, mask = _batch(9)
    vpreds = values + 0.5 * (vpreds - values)  # some inside the clip range, some outside
    info = _global_batch_info(case, mask)
    outs = []
    for fn in (core_algos.compute_value_loss, rk_verl.compute_value_loss):
        v = vpreds.clone().requires_grad_()
        loss, clipfrac = fn(v, returns, values, mask, 0.2, mode, **info)
        outs.append((loss.reshape(()), torch.autograd.grad(loss, v)[0], clipfrac.reshape(())))
    (want, g_want, c_want), (got, g_got, c_got) = outs
    tol = _tol(mode) if str(backend) != "triton" else dict(rtol=1e-6, atol=1e-6)  # Triton: fp32 clip value
    torch.testing.assert_close(got, want, **tol)
    torch.testing.assert_close(g_got, g_want, **tol)
    assert 0 < float(c_want) < 1
    torch.testing.assert_close(c_got, c_want, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize(
    "kind", ["kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3", "k1+", "k3+", "low_var_kl+"]
)
def test_kl_penalty(kind):
    logp, ref, _, _ = _batch(2)
    ref = ref * 8  # some k3 values past verl's ±10 clamp
    outs = []
    for fn in (core_algos.kl_penalty, rk_verl.kl_penalty):
        lp = logp.clone().requires_grad_()
        value = fn(lp, ref, kind)
        outs.append((value, torch.autograd.grad(value.sum(), lp)[0]))
    for got, want in zip(outs[1], outs[0], strict=True):
        torch.testing.assert_close(got, want, **EXACT)


def _rewards(seed: int, b: int = 12, t: int = 7):
    gen = torch.Generator().manual_seed(seed)
    rewards = torch.zeros(b, t, dtype=torch.float64)
    mask = torch.rand(b, t, generator=gen) > 0.2
    rewards[torch.arange(b), torch.randint(0, t, (b,), generator=gen)] = torch.randn(
        b, dtype=torch.float64, generator=gen
    )
    # uid strings as verl's trainer passes them: groups of 3, 3, 4, 1 and 1 (a singleton), in any order
    index = np.array(["a", "b", "a", "c", "b", "c", "c", "a", "b", "c", "d", "e"], dtype=object)
    return rewards, mask.double(), index


@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize(
    "name", ["compute_grpo_outcome_advantage", "compute_grpo_vectorized_outcome_advantage"]
)
def test_grpo_advantages(name, norm):
    rewards, mask, index = _rewards(3)
    want = getattr(core_algos, name)(rewards, mask, index, norm_adv_by_std_in_grpo=norm)
    got = getattr(rk_verl, name)(rewards, mask, index, norm_adv_by_std_in_grpo=norm)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, **(FP32 if "vectorized" in name else SINGLETON))


@pytest.mark.parametrize(
    "name", ["compute_rloo_outcome_advantage", "compute_rloo_vectorized_outcome_advantage"]
)
def test_rloo_advantages(name):
    rewards, mask, index = _rewards(4)
    want = getattr(core_algos, name)(rewards, mask, index)
    got = getattr(rk_verl, name)(rewards, mask, index)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, **EXACT)


def test_gae():
    gen = torch.Generator().manual_seed(5)
    rewards, values = torch.randn(2, 4, 9, dtype=torch.float64, generator=gen)
    mask = (torch.rand(4, 9, generator=gen) > 0.25).double()
    want = core_algos.compute_gae_advantage_return(rewards, values, mask, gamma=0.97, lam=0.9)
    got = rk_verl.compute_gae_advantage_return(rewards, values, mask, gamma=0.97, lam=0.9)
    torch.testing.assert_close(got[0], want[0], **WHITENED)
    torch.testing.assert_close(got[1], want[1], **EXACT)


@pytest.mark.parametrize("backend", BACKENDS)
def test_reinforce_plus_plus(backend, monkeypatch):
    """Masked positions inside a row (observation tokens) carry the running return, on every backend."""
    returns = functools.partial(rk.discounted_returns, backend=backend)
    monkeypatch.setattr(rk_verl.rk, "discounted_returns", returns)
    gen = torch.Generator().manual_seed(6)
    rewards = torch.randn(4, 9, dtype=torch.float64, generator=gen)
    mask = (torch.rand(4, 9, generator=gen) > 0.3).double()
    config = SimpleNamespace(gamma=0.9)  # verl reads only AlgoConfig.gamma
    want = core_algos.compute_reinforce_plus_plus_outcome_advantage(rewards, mask, config)
    got = rk_verl.compute_reinforce_plus_plus_outcome_advantage(rewards, mask, config)
    torch.testing.assert_close(got[0], want[0], **WHITENED)
    torch.testing.assert_close(got[1], want[1], **EXACT)


@pytest.mark.parametrize("backend", BACKENDS)
def test_reinforce_is_gpg_with_is_weights(backend):
    """verl's bypass-mode REINFORCE (`compute_policy_loss_reinforce`, -A·logp·w) is rk objective="reinforce"
    with its IS weights as is_weights: loss, gradient and its "actor/ppo_kl" metric."""
    logp, old, adv, mask = _batch(3)
    w = torch.rand(logp.shape, dtype=torch.float64) + 0.5
    config = ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1)
    lp = logp.clone().requires_grad_()
    want, metrics = core_algos.compute_policy_loss_reinforce(
        old, lp, adv, mask, "seq-mean-token-sum", config, w
    )
    (g_want,) = torch.autograd.grad(want, lp)
    lp = logp.clone().requires_grad_()
    got, stats = rk.policy_loss(
        lp, old, adv, mask, objective="reinforce", is_weights=w, agg="seq-mean-token-sum", backend=backend
    )
    (g_got,) = torch.autograd.grad(got, lp)
    tol = dict(rtol=1e-6, atol=1e-6) if str(backend) == "triton" else EXACT
    torch.testing.assert_close(got, want.reshape(()), **tol)
    torch.testing.assert_close(g_got, g_want, **tol)
    assert stats["approx_kl"].item() == pytest.approx(metrics["actor/ppo_kl"], rel=1e-9)


def test_install_registers_into_verl(monkeypatch):
    monkeypatch.setattr(core_algos, "POLICY_LOSS_REGISTRY", dict(core_algos.POLICY_LOSS_REGISTRY))
    monkeypatch.setattr(core_algos, "ADV_ESTIMATOR_REGISTRY", dict(core_algos.ADV_ESTIMATOR_REGISTRY))
    rk_verl.install()
    rk_verl.install()  # idempotent
    for name, fn in rk_verl.POLICY_LOSSES.items():
        assert core_algos.get_policy_loss_fn(name) is getattr(rk_verl, fn)
    for name, fn in rk_verl.ADVANTAGE_ESTIMATORS.items():
        assert core_algos.get_adv_estimator_fn(name) is getattr(rk_verl, fn)
    # verl code calling through its registry gets verl's numbers.
    rewards, mask, index = _rewards(7)
    got = core_algos.get_adv_estimator_fn("rlk_grpo")(
        token_level_rewards=rewards, response_mask=mask, index=index
    )
    want = core_algos.compute_grpo_outcome_advantage(rewards, mask, index)
    torch.testing.assert_close(got[0], want[0], **SINGLETON)


def _fused_inputs(dtype, seed: int = 8):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(2, 9, 16, dtype=torch.float64, generator=gen).to(dtype)
    weight = (torch.randn(211, 16, dtype=torch.float64, generator=gen) * 0.5).to(dtype)
    ids = torch.randint(0, 211, (2, 9), generator=gen)
    g_logp, g_ent = torch.randn(2, 2, 9, dtype=torch.float64, generator=gen)
    return hidden, weight, ids, g_logp, g_ent


def _fused_outputs(fn, hidden, weight, ids, g_logp, g_ent):
    """(log_probs, entropy, d hidden, d weight) of fn(hidden, weight, ids) with upstream g_logp, g_ent."""
    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    logp, entropy = fn(h, w, ids)
    loss = (logp * g_logp.to(logp.dtype).view(logp.shape)).sum()
    loss = loss + (entropy * g_ent.to(entropy.dtype).view(entropy.shape)).sum()
    return (logp, entropy, *torch.autograd.grad(loss, [h, w]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("entry", ["FusedLinearForPPO", "linear_cross_entropy"])
def test_fused_log_prob_path(entry, dtype):
    """verl's fused log-prob / entropy entry points (model.use_fused_kernels=True) on rlkernels: verl's
    torch implementation's outputs and gradients, by the error rule against the float64 reference (verl's
    own linear_cross_entropy is Triton-only, so its torch path is the same-dtype reference for both)."""
    from verl.utils.experimental.torch_functional import FusedLinearForPPO

    temperature = 0.7
    if entry == "FusedLinearForPPO":
        ours = rk_verl.FusedLinearForPPO()
        got_fn = lambda h, w, y: ours(h, w, y, temperature)  # noqa: E731
    else:
        got_fn = lambda h, w, y: rk_verl.linear_cross_entropy(h, w, y, temperature)  # noqa: E731

    def oracle(h, w, y):
        return rk.linear_logprobs(h, w, y, temperature=temperature, return_entropy=True, backend="reference")

    hidden, weight, ids, g_logp, g_ent = _fused_inputs(dtype)
    got = _fused_outputs(got_fn, hidden, weight, ids, g_logp, g_ent)
    same = _fused_outputs(lambda h, w, y: FusedLinearForPPO()(h, w, y, temperature), hidden, weight, ids,
                          g_logp, g_ent)  # fmt: skip
    want = _fused_outputs(oracle, hidden.double(), weight.double(), ids, g_logp, g_ent)
    if entry == "linear_cross_entropy":  # verl's kernel returns flat [N] log-probs and entropies
        assert got[0].shape == got[1].shape == (18,)
        got = (got[0].view(2, 9), got[1].view(2, 9), *got[2:])
    assert got[0].dtype == same[0].dtype == torch.float32
    if entry == "FusedLinearForPPO":
        assert got[1].dtype == same[1].dtype == dtype  # verl returns the entropy in the hidden dtype
    for name, o, s, r in zip(("log_probs", "entropy", "d hidden", "d weight"), got, same, want, strict=True):
        assert_oracle(f"{entry} {name}", o, s, r)


def test_install_swaps_verl_fused_kernels(monkeypatch):
    """After install(), verl's own model forward (model.use_fused_kernels with the torch backend) runs
    rlkernels, with its results."""
    transformers = pytest.importorskip("transformers")
    from verl.models.transformers import dense_common
    from verl.utils.experimental import torch_functional
    from verl.utils.kernel import linear_cross_entropy as lce

    monkeypatch.setattr(torch_functional, "FusedLinearForPPO", torch_functional.FusedLinearForPPO)
    monkeypatch.setattr(lce, "linear_cross_entropy", lce.linear_cross_entropy)
    monkeypatch.setattr(core_algos, "POLICY_LOSS_REGISTRY", dict(core_algos.POLICY_LOSS_REGISTRY))
    monkeypatch.setattr(core_algos, "ADV_ESTIMATOR_REGISTRY", dict(core_algos.ADV_ESTIMATOR_REGISTRY))
    torch.manual_seed(0)
    config = transformers.Qwen2Config(
        vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2,
    )  # fmt: skip
    model = transformers.Qwen2ForCausalLM(config)
    ids = torch.randint(0, 300, (2, 9))

    def run():
        model.zero_grad()
        out = dense_common.forward_with_torch_backend(model, input_ids=ids, return_dict=True, temperature=0.8)
        (out.log_probs.sum() + out.entropy.sum()).backward()
        return out.log_probs, out.entropy, model.lm_head.weight.grad.clone()

    want = run()
    calls = []
    linear_logprobs = rk.linear_logprobs
    monkeypatch.setattr(rk, "linear_logprobs", lambda *a, **k: calls.append(1) or linear_logprobs(*a, **k))
    rk_verl.install()
    got = run()
    assert calls and torch_functional.FusedLinearForPPO is rk_verl.FusedLinearForPPO
    assert lce.linear_cross_entropy is rk_verl.linear_cross_entropy
    # The numbers are held to the error rule by test_fused_log_prob_path; this checks the routing: verl's
    # own fp32 forward and ours agree to fp32 rounding of O(1) values.
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
