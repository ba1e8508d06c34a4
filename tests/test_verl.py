"""rlkernels.integrations.verl against the installed verl (the `[integrations]` extra, verl 0.9.1 with
--no-deps): each adapter equals verl's own function on the same inputs, values and gradients, in float64;
the kernels' aggregation and returns scan follow verl 0.9.1 on every backend; install() puts the adapters
into verl's registries. Skipped without verl; test_pinned_version fails when the installed verl is not the
version these adapters follow."""

import contextlib
import functools
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from oracle import assert_oracle, cpu_kernel_backends

import rlkernels as rk
from rlkernels.reference.aggregation import AGG_MODES

verl = pytest.importorskip("verl", reason="verl is installed by the [integrations] extra (README)")
from verl.trainer.config import AlgoConfig  # noqa: E402
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
    from rlkernels.ops import agg_loss as agg_ops

    assert verl.__version__ == rk_verl.VERL_VERSION == agg_ops.VERL_VERSION


def _batch(seed: int, b: int = 6, t: int = 11):
    gen = torch.Generator().manual_seed(seed)
    logp = -torch.rand(b, t, dtype=torch.float64, generator=gen, device="cpu") * 3
    old = logp + 0.4 * torch.randn(b, t, dtype=torch.float64, generator=gen, device="cpu")
    adv = torch.randn(b, t, dtype=torch.float64, generator=gen, device="cpu")
    mask = (torch.rand(b, t, generator=gen, device="cpu") > 0.3).double()
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
    """verl's loss and d loss_mat (rk_verl.agg_loss is the fused op, rk.agg_loss)."""
    loss_mat, _, _, mask = _batch(0)
    info = _global_batch_info(case, mask)
    ours, theirs = (loss_mat.clone().requires_grad_() for _ in range(2))
    want = core_algos.agg_loss(theirs, mask, mode, **info)
    got = rk_verl.agg_loss(ours, mask, mode, **info)
    assert got.dtype == want.dtype
    torch.testing.assert_close(got, want.reshape(()), **_tol(mode))
    want.backward()
    got.backward()
    torch.testing.assert_close(ours.grad, theirs.grad, **_tol(mode))


def _tol(mode: str, magnitude: float = 0.0) -> dict:
    """Exact in float64, but for verl's S_b / (n_b + 1e-8) in seq-mean-token-mean (we divide exactly, on
    purpose): each row's mean differs by at most 1e-8 / n_b of itself (n_b >= 1), so the loss by at most
    1e-8 of the rows' |means| aggregated (`magnitude`: verl's aggregation of the |per-token terms|, which
    bounds it). Relative to the loss itself, where rows of either sign cancel, it can be more than 1e-8."""
    if mode != "seq-mean-token-mean":
        return EXACT
    return dict(rtol=1e-8, atol=max(1e-12, 1e-8 * magnitude))


@contextlib.contextmanager
def _recording_term_sizes(monkeypatch):
    """verl's agg_loss, recording each call's aggregation of |loss_mat| (float64) into the yielded list."""
    sizes, agg_loss = [], core_algos.agg_loss

    def recording(loss_mat, *args, **kwargs):
        with torch.no_grad():
            sizes.append(abs(float(agg_loss(loss_mat.abs(), *args, **kwargs))))
        return agg_loss(loss_mat, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(core_algos, "agg_loss", recording)
        yield sizes


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
def test_policy_losses(loss_mode, backend, mode, case, monkeypatch, seed):
    """Each registered loss through rk.policy_loss on every backend: verl's loss, its gradient and its
    metrics (vanilla: dual-clip PPO; gspo: the sequence ratio; sapo: always seq-mean-token-mean; cispo)."""
    monkeypatch.setattr(rk_verl.rk, "policy_loss", functools.partial(rk.policy_loss, backend=backend))
    logp, old, adv, mask = _batch(1)
    adv[0] = -adv[0].abs() - 2  # negative advantages with large ratios: the dual clip is active
    logp[0] = old[0] + 1.5
    gen = torch.Generator().manual_seed(seed)
    is_weights = torch.rand(logp.shape, dtype=torch.float64, generator=gen, device="cpu") + 0.5
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
    with _recording_term_sizes(monkeypatch) as sizes:
        for fn in (core_algos.get_policy_loss_fn(loss_mode), getattr(rk_verl, name)):
            lp = logp.clone().requires_grad_()
            loss, metrics = fn(old, lp, adv, mask, mode, config, is_weights)
            outs.append((loss.reshape(()), torch.autograd.grad(loss, lp)[0], metrics))
    (want, g_want, m_want), (got, g_got, m_got) = outs
    agg = "seq-mean-token-mean" if loss_mode in ("sapo", "geo_mean") else mode
    tol, grad_tol = _tol(agg, magnitude=sum(sizes)), _tol(agg)
    if str(backend) == "triton":  # fp32 hyper-parameters: each term off by ~1e-7 of the terms' scale
        scale = max(1.0, 4 * float(adv.abs().max() * is_weights.max()))
        tol = grad_tol = dict(rtol=1e-6, atol=1e-6 * scale)
    torch.testing.assert_close(got, want, **tol)
    torch.testing.assert_close(g_got, g_want, **grad_tol)
    assert m_got.keys() == m_want.keys()
    assert loss_mode != "vanilla" or m_want["actor/pg_clipfrac_lower"] > 0
    if loss_mode.startswith("dppo") or loss_mode == "clip_cov":  # some tokens dropped, not all
        assert 0 < m_want["actor/pg_clipfrac"] < 0.9
    for key in m_want:
        assert m_got[key] == pytest.approx(m_want[key], rel=1e-6, abs=1e-9), key


@pytest.mark.parametrize("weights", [False, True])
def test_geo_mean_with_token_level_advantages(weights):
    """verl's GMPO with advantages that vary along a row (verl documents sequence-level ones only, but
    computes -Ā·R for any): the loss, its gradient (-Ā·R/n per unclipped token, Ā the row's mean advantage)
    and the metrics are verl's. Rows mix signs, hold exact zeros (a token whose log-ratio then counts as 0),
    one is fully masked, one varies only at masked tokens and one is constant. (rk's per-token form, which
    weighs each token by its own A, gave verl's value but not its gradient here: the adapter computes such
    a batch in eager PyTorch, so there is no backend to choose.)"""
    logp, old, adv, mask = _batch(5, b=7)
    adv[0, ::3] = 0.0
    adv[2] = 0.7
    adv[3] = torch.where(mask[3] != 0, -0.4, adv[3])
    adv[4, ::2] = -adv[4, ::2].abs() - 1  # both signs in one row with a large mean
    adv[4, 1::2] = adv[4, 1::2].abs()
    gen = torch.Generator().manual_seed(6)
    is_weights = torch.rand(logp.shape, dtype=torch.float64, generator=gen) + 0.5 if weights else None
    config = ActorConfig(
        strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, clip_ratio_high=0.28,
        policy_loss=PolicyLossConfig(loss_mode="geo_mean"),
    )  # fmt: skip
    outs = []
    for fn in (core_algos.get_policy_loss_fn("geo_mean"), rk_verl.compute_policy_loss_geo_mean):
        lp = logp.clone().requires_grad_()
        loss, metrics = fn(old, lp, adv, mask, "token-mean", config, is_weights)
        outs.append((loss.reshape(()), torch.autograd.grad(loss, lp)[0], metrics))
    (want, g_want, m_want), (got, g_got, m_got) = outs
    assert float(g_want.abs().max()) > 0 and m_want["actor/pg_clipfrac"] > 0
    torch.testing.assert_close(
        got,
        want,
        **_tol("seq-mean-token-mean", _geo_mean_term_sizes(logp, old, adv, mask, is_weights, config)),
    )
    torch.testing.assert_close(g_got, g_want, **_tol("seq-mean-token-mean"))
    assert m_got.keys() == m_want.keys()
    for key in m_want:
        assert m_got[key] == pytest.approx(m_want[key], rel=1e-6, abs=1e-9), key


def _geo_mean_term_sizes(logp, old, adv, mask, is_weights, config):
    """The bound on verl's n_b + 1e-8 in GMPO, as `_tol`'s magnitude: verl divides three row sums by it (the
    advantage's, the clipped log-ratio's inside the exponential, the log-weights' inside theirs), so a row's
    term -Ā_b·R_b·w_b moves by at most 1e-8 · (1 + |log R_b| + |log w_b|) / n_b of itself; the loss is the
    mean of the rows' terms. Computed here in float64 with exact divisions, from the inputs and `config`'s
    clip range."""
    low = config.clip_ratio_low if config.clip_ratio_low is not None else config.clip_ratio
    high = config.clip_ratio_high if config.clip_ratio_high is not None else config.clip_ratio
    n = mask.sum(-1).clamp_min(1)
    log_ratio = logp - old
    sign = torch.sign(adv)
    kept = sign * torch.minimum(sign * log_ratio, sign * log_ratio.clamp(-low, high))
    log_r = (kept * mask).sum(-1) / n
    log_w = (torch.log(is_weights) * mask).sum(-1) / n if is_weights is not None else torch.zeros_like(n)
    term = (adv * mask).sum(-1) / n * torch.exp(log_r + log_w)
    return float((term.abs() * (1 + log_r.abs() + log_w.abs()) / n).mean())


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
    "kind", [n + plus for n in ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3") for plus in ("", "+")]
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
    mask = torch.rand(b, t, generator=gen, device="cpu") > 0.2
    rewards[torch.arange(b), torch.randint(0, t, (b,), generator=gen, device="cpu")] = torch.randn(
        b, dtype=torch.float64, generator=gen, device="cpu"
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
    rewards, values = torch.randn(2, 4, 9, dtype=torch.float64, generator=gen, device="cpu")
    mask = (torch.rand(4, 9, generator=gen, device="cpu") > 0.25).double()
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
    rewards = torch.randn(4, 9, dtype=torch.float64, generator=gen, device="cpu")
    mask = (torch.rand(4, 9, generator=gen, device="cpu") > 0.3).double()
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


def _uid_index(gen, sizes) -> np.ndarray:
    """verl's index: uid strings, groups of the given sizes, rows in a random order."""
    labels = np.array([f"uid-{g}" for g, size in enumerate(sizes) for _ in range(size)], dtype=object)
    return labels[torch.randperm(len(labels), generator=gen, device="cpu").numpy()]


def _estimator_batch(seed: int, sizes=(4, 3, 3, 2, 1, 1), t: int = 9):
    """float64 inputs of verl's estimators: right-padded masks (one row of group "uid-3" empty, one row
    with a hole: an observation token), each row's score on its last valid token (group "uid-0" constant; a
    tied best in "uid-1"), small token rewards elsewhere, uid strings (with singletons unless sizes has
    none)."""
    gen = torch.Generator().manual_seed(seed)
    index = _uid_index(gen, sizes)
    b = len(index)
    lengths = torch.randint(2, t + 1, (b,), generator=gen, device="cpu")
    lengths[np.flatnonzero(index == "uid-3")[0]] = 0  # an empty response in a group of two
    mask = (torch.arange(t)[None, :] < lengths[:, None]).double()
    hole = int(torch.nonzero(lengths > 3)[0])
    mask[hole, 1] = 0
    scores = (
        torch.randint(0, 3, (b,), generator=gen, device="cpu").double()
        + 0.5 * torch.randn(b, generator=gen, device="cpu").double()
    )
    scores[index == "uid-0"] = 0.7
    scores[[i for i in np.flatnonzero(index == "uid-1") if lengths[i] > 0][:2]] = scores.max() + 1  # tied
    rewards = 0.1 * torch.randn(b, t, dtype=torch.float64, generator=gen, device="cpu") * mask
    rewards[(index == "uid-0") | (index == "uid-1")] = 0  # their sums are their scores
    last = (mask.cumsum(-1) == mask.sum(-1, keepdim=True)) & (mask > 0)
    rewards[last] += scores[mask.sum(-1) > 0]
    return dict(
        token_level_rewards=rewards,
        response_mask=mask,
        index=index,
        reward_baselines=torch.randn(b, dtype=torch.float64, generator=gen, device="cpu"),
        old_log_probs=-3 * torch.rand(b, t, dtype=torch.float64, generator=gen, device="cpu"),
        sum_pi_squared=0.9 * torch.rand(b, t, dtype=torch.float64, generator=gen, device="cpu") + 0.05,
        rollout_is_weights=torch.rand(b, t, dtype=torch.float64, generator=gen, device="cpu") + 0.5,
    )


_OTB_INPUTS = dict(old_log_probs=None, sum_pi_squared=None, rollout_is_weights=None)  # None: from the batch
# The estimators adapted beyond grpo / rloo / gae / reinforce_plus_plus: verl's name -> (the keywords verl's
# trainer passes besides token_level_rewards, response_mask, config and index; tolerance in float64).
NEW_ESTIMATORS = {
    # verl's group of one divides by the float32 tensor 1.0 + epsilon: an epsilon exact in fp32 keeps that
    # rounding out of the float64 comparison; the whitening differs by verl's + 1e-8 in its counts.
    "gdpo": (dict(epsilon=2.0**-20), WHITENED),
    "grpo_passk": ({}, EXACT),
    "reinforce_plus_plus_baseline": ({}, WHITENED),
    "remax": (dict(reward_baselines=None), EXACT),
    "opo": ({}, EXACT),
    # verl's alpha = B / count_nonzero(scores) is a float32 tensor whatever the scores' dtype.
    "gpg": ({}, dict(rtol=2.0**-23, atol=1e-12)),
    "optimal_token_baseline": (_OTB_INPUTS, EXACT),
    "tir_optimal_token_baseline": (_OTB_INPUTS, EXACT),
}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("name", list(NEW_ESTIMATORS))
def test_advantage_estimators_as_verl(name, dtype):
    """verl's registered estimator and ours, called as verl's trainer calls it (keywords, an AlgoConfig,
    uid strings): the same (advantages, returns) in float64; in float32, ours by the error rule with verl's
    float32 run as the same-dtype reference and its float64 run as the oracle. Returns (and remax's
    advantages) are compared at valid tokens: at a masked token inside a response verl keeps the
    reward-to-go, ours are 0 there."""
    extra, tol = NEW_ESTIMATORS[name]
    sizes = (4, 3, 3, 2, 2) if name == "grpo_passk" else (4, 3, 3, 2, 1, 1)  # verl's pass@k raises on one
    d = _estimator_batch(11, sizes)
    valid = d["response_mask"] > 0
    keep = [valid if name == "remax" else torch.ones_like(valid), valid]  # advantages, returns
    verl_fn = core_algos.get_adv_estimator_fn(name)
    ours_fn = getattr(rk_verl, rk_verl.ADVANTAGE_ESTIMATORS[f"rlk_{name}"])

    def kwargs(config, dt, rounded_to=None):
        """verl's trainer's keywords, the tensors in dt (first rounded to rounded_to)."""
        kw = {k: d[k] for k in ("token_level_rewards", "response_mask", "index")} | extra | {"config": config}
        kw = {k: d[k] if v is None else v for k, v in kw.items()}
        cast = lambda x: x.to(rounded_to or dt).to(dt) if isinstance(x, torch.Tensor) else x  # noqa: E731
        return {k: cast(v) for k, v in kw.items()}

    variants = [(True, {})]
    if name == "grpo_passk":  # verl reads norm_adv_by_std_in_grpo from config
        variants.append((False, {}))
    if name.endswith("optimal_token_baseline"):
        variants.append((True, dict(handle_zero_tail=False)))
    for norm, option in variants:
        config = AlgoConfig(gamma=0.9, norm_adv_by_std_in_grpo=norm)
        got = ours_fn(**kwargs(config, dtype), **option)
        want = verl_fn(**kwargs(config, torch.float64, rounded_to=dtype), **option)
        same = verl_fn(**kwargs(config, dtype), **option)
        if name == "remax":
            assert (want[0][~valid] != 0).any()  # the difference at the hole is reached
        for i, what in enumerate(("advantages", "returns")):
            g, w, at = got[i], want[i], keep[i]
            assert g.dtype == dtype and g.shape == valid.shape, what
            assert (g[~valid] == 0).all(), what
            if dtype == torch.float64:
                torch.testing.assert_close(g[at], w[at], **tol)
            else:
                assert_oracle(f"{name} {what}", g[at], same[i][at], w[at])
        if name == "grpo_passk":  # the test reaches a unique best and a tied best
            tied = np.flatnonzero(d["index"] == "uid-1")
            assert (want[0] != 0).any() and (want[0][tied] == 0).all()


def test_gdpo_reward_keys_as_verl():
    """verl's GDPO with config.gdpo_reward_keys / gdpo_reward_weights reads each component's scores from
    non_tensor_batch as float32: ours from the same arguments by the error rule (verl's float32 run the
    same-dtype reference, ours on the float64 scores the oracle). Without non_tensor_batch (what verl's
    trainer passes to any name but "gdpo") ours raises where verl would drop the keys."""
    d = _estimator_batch(12)
    gen = torch.Generator().manual_seed(13)
    b, t = d["response_mask"].shape
    per_key = torch.randn(b, 3, dtype=torch.float64, generator=gen, device="cpu")
    per_key[:, 1] = (per_key[:, 1] > 0).double()  # a binary reward
    keys, weights = ["format", "accuracy", "length"], [1.0, 0.5, 2.0]
    config = AlgoConfig(gdpo_reward_keys=keys, gdpo_reward_weights=weights)
    prompt = 4
    batch = {
        "prompts": torch.zeros(b, prompt),
        "attention_mask": torch.cat([torch.ones(b, prompt), d["response_mask"]], 1).long(),
    }
    non_tensor = {k: per_key[:, i].float().numpy() for i, k in enumerate(keys)}
    args = (d["token_level_rewards"], d["response_mask"].long(), d["index"])  # verl's int64 response_mask
    want, _ = core_algos.compute_gdpo_outcome_advantage(*args, config=config, non_tensor_batch=non_tensor,
                                                        batch=batch)  # fmt: skip
    got, ret = rk_verl.compute_gdpo_outcome_advantage(*args, config=config, non_tensor_batch=non_tensor,
                                                      batch=batch)  # fmt: skip
    ids = torch.from_numpy(np.unique(d["index"], return_inverse=True)[1])
    oracle, _ = rk.gdpo_advantages(
        per_key.float().double(), d["response_mask"], group_ids=ids, weights=weights, backend="reference"
    )
    assert got.dtype == want.dtype == torch.float32 and ret is got
    assert_oracle("rk_verl gdpo reward keys", got, want, oracle)
    assert_oracle("verl gdpo reward keys", want, got, oracle)
    core_algos.compute_gdpo_outcome_advantage(*args, config=config)  # verl: the keys silently ignored
    with pytest.raises(ValueError, match="gdpo_reward_keys is set but non_tensor_batch"):
        rk_verl.compute_gdpo_outcome_advantage(*args, config=config)
    with pytest.raises(ValueError, match="not in non_tensor_batch"):
        rk_verl.compute_gdpo_outcome_advantage(*args, config=config, non_tensor_batch={}, batch=batch)
    short = dict(non_tensor, length=non_tensor["length"][:-1])
    with pytest.raises(ValueError, match=r"non_tensor_batch\['length'\] must hold one score per row"):
        rk_verl.compute_gdpo_outcome_advantage(*args, config=config, non_tensor_batch=short, batch=batch)
    bad = AlgoConfig(gdpo_reward_keys=keys, gdpo_reward_weights=[1.0])
    with pytest.raises(ValueError, match="gdpo_reward_weights must have one weight per"):
        rk_verl.compute_gdpo_outcome_advantage(*args, config=bad, non_tensor_batch=non_tensor, batch=batch)


def test_advantage_estimator_bad_inputs():
    d = _estimator_batch(14)
    r, m, index = d["token_level_rewards"], d["response_mask"], d["index"]
    otb = rk_verl.compute_optimal_token_baseline_advantage
    opo = rk_verl.compute_opo_outcome_advantage
    lp, sp = d["old_log_probs"], d["sum_pi_squared"]
    cases = [
        (ValueError, "needs config", lambda: rk_verl.compute_grpo_passk_outcome_advantage(r, m, index)),
        (ValueError, "index must hold one group label per row", lambda: opo(r, m, index[:-1])),
        (ValueError, "response_mask must be a tensor of token_level_rewards' shape",
         lambda: rk_verl.compute_gpg_outcome_advantage(r, m[:, :-1], index)),
        (ValueError, "token_level_rewards must be", lambda: rk_verl.compute_remax_outcome_advantage(
            r[0], d["reward_baselines"], m[0])),
        (TypeError, "token_level_rewards must be a float tensor", lambda: opo(r.long(), m, index)),
        (ValueError, "sum_pi_squared must be a tensor", lambda: otb(r, m, index, lp, None)),
        (ValueError, "old_log_probs must be a tensor", lambda: otb(r, m, index, r[:, :-1], sp)),
    ]  # fmt: skip
    for exc, match, fn in cases:
        with pytest.raises(exc, match=match):
            fn()


def _restored_after_install(monkeypatch) -> list:
    """What install() changes in verl, restored after the test: its registries, and the `agg_loss` of the
    modules that call it (AGG_LOSS_CALLERS; a later test compares with verl's own). Returns those modules."""
    import importlib

    monkeypatch.setattr(core_algos, "POLICY_LOSS_REGISTRY", dict(core_algos.POLICY_LOSS_REGISTRY))
    monkeypatch.setattr(core_algos, "ADV_ESTIMATOR_REGISTRY", dict(core_algos.ADV_ESTIMATOR_REGISTRY))
    modules = [importlib.import_module(m) for m in rk_verl.AGG_LOSS_CALLERS]
    for module in modules:
        monkeypatch.setattr(module, "agg_loss", module.agg_loss)
    return modules


def test_install_registers_into_verl(monkeypatch):
    _restored_after_install(monkeypatch)
    rk_verl.install()
    rk_verl.install()  # idempotent
    for name, fn in rk_verl.POLICY_LOSSES.items():
        assert core_algos.get_policy_loss_fn(name) is getattr(rk_verl, fn)
    # Every estimator verl 0.9.1 registers has an rlk_ adapter, and install() registers each one.
    assert set(rk_verl.ADVANTAGE_ESTIMATORS) == {f"rlk_{e.value}" for e in core_algos.AdvantageEstimator}
    for name, fn in rk_verl.ADVANTAGE_ESTIMATORS.items():
        assert core_algos.get_adv_estimator_fn(name) is getattr(rk_verl, fn)
    # verl code calling through its registry gets verl's numbers.
    rewards, mask, index = _rewards(7)
    got = core_algos.get_adv_estimator_fn("rlk_grpo")(
        token_level_rewards=rewards, response_mask=mask, index=index
    )
    want = core_algos.compute_grpo_outcome_advantage(rewards, mask, index)
    torch.testing.assert_close(got[0], want[0], **SINGLETON)


def test_install_gives_verl_losses_the_fused_agg_loss(monkeypatch):
    """After install(), the actor's loss (verl.workers.utils.losses: its entropy and KL terms) and core_algos
    aggregate with rk.agg_loss, with verl's numbers."""
    modules = _restored_after_install(monkeypatch)
    verl_agg_loss = core_algos.agg_loss
    rk_verl.install()
    calls = []
    op = rk.agg_loss
    monkeypatch.setattr(rk, "agg_loss", lambda *a, **k: calls.append(1) or op(*a, **k))
    for module in modules:
        assert module.agg_loss is rk_verl.agg_loss, module.__name__
    entropy, _, _, mask = _batch(3)
    for mode in AGG_MODES:
        got = modules[1].agg_loss(loss_mat=entropy, loss_mask=mask, loss_agg_mode=mode)
        torch.testing.assert_close(got, verl_agg_loss(entropy, mask, mode).reshape(()), **_tol(mode))
    assert len(calls) == len(AGG_MODES)


def test_install_can_replace_verl_estimators(monkeypatch):
    """install(replace_estimators=True): verl's own names (which its trainer hands gdpo's reward keys and the
    optimal token baselines' log-probs) and the two functions its trainer calls by attribute run ours."""
    _restored_after_install(monkeypatch)
    for name in ("compute_gae_advantage_return", "compute_grpo_outcome_advantage"):
        monkeypatch.setattr(core_algos, name, getattr(core_algos, name))
    verl_grpo = core_algos.compute_grpo_outcome_advantage
    with pytest.raises(TypeError, match="replace_estimators"):
        rk_verl.install(replace_estimators="yes")
    rk_verl.install(replace_estimators=True)
    for name, fn in rk_verl.ADVANTAGE_ESTIMATORS.items():
        assert core_algos.get_adv_estimator_fn(name) is getattr(rk_verl, fn)
        assert core_algos.get_adv_estimator_fn(name.removeprefix("rlk_")) is getattr(rk_verl, fn)
    assert core_algos.compute_grpo_outcome_advantage is rk_verl.compute_grpo_outcome_advantage
    assert core_algos.compute_gae_advantage_return is rk_verl.compute_gae_advantage_return
    rewards, mask, index = _rewards(7)
    got = core_algos.compute_grpo_outcome_advantage(rewards, mask, index)
    want = verl_grpo(rewards, mask, index)
    torch.testing.assert_close(got[0], want[0], **SINGLETON)


def _fused_inputs(dtype, seed: int = 8):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(2, 9, 16, dtype=torch.float64, generator=gen, device="cpu").to(dtype)
    weight = (torch.randn(211, 16, dtype=torch.float64, generator=gen, device="cpu") * 0.5).to(dtype)
    ids = torch.randint(0, 211, (2, 9), generator=gen, device="cpu")
    g_logp, g_ent = torch.randn(2, 2, 9, dtype=torch.float64, generator=gen, device="cpu")
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
    _restored_after_install(monkeypatch)
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
