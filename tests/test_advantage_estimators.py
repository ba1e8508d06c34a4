"""The advantage estimators of verl 0.9.1 and TRL 1.16 (rk.advantages and its functions): every estimator
x dtype x backend against the float64 reference (assert_oracle), against verl's installed functions and
TRL's own GRPO code on the same inputs, hand-computed values, constant / singleton groups and empty masks,
arbitrary ids, and bad inputs."""

import ast
import importlib.util
import itertools
import math
import pathlib
import textwrap
import types

import numpy as np
import pytest
import torch
from oracle import DTYPES, assert_oracle, chunked_responses, cpu_kernel_backends

import rlkernels as rk
from rlkernels._errors import BackendUnavailableError
from rlkernels.ops import advantage_estimators as ae

BACKENDS = cpu_kernel_backends()
TOKEN_LEVEL = ("reinforce_plus_plus", "remax", "optimal_token_baseline")  # rewards [B, T]


def make_ids(b, min_size=1):
    """Uneven groups (sizes min_size..6, singletons when min_size is 1) under large, negative, shuffled
    int64 ids."""
    sizes, total = [], 0
    while total < b:
        size = min(int(torch.randint(min_size, 7, ())), b - total)
        if size < min_size:  # fold a short tail into the previous group
            sizes[-1] += size
        else:
            sizes.append(size)
        total += size
    values = torch.randperm(50 * len(sizes))[: len(sizes)] * 7919 - 100000
    values[0] = 2**40 + 5
    return torch.repeat_interleave(values, torch.tensor(sizes))[torch.randperm(b)]


def sum_pi_squared_for(old_logp):
    """A Σπ² a policy can have with the sampled token at probability π = exp(old_logp): from π² (the
    rest spread thin over the vocabulary) to π² + (1 - π)² (the rest on one token). Then the estimator's
    weight 1 - 2π + Σπ² = (1 - π)² (1 + u) >= 0, as for any distribution; independent draws make it
    negative, and a group's Σ W·m may then cancel to near 0: an ill-conditioned baseline that no kernel
    computes to the slack."""
    pi = old_logp.exp()
    return pi.square() + torch.rand_like(pi) * (1 - pi).square()


def make_data(b=29, t=13, min_size=1):
    """float64 inputs: right-padded masks (one row empty, one with a hole), integer-valued scores (ties,
    and a constant group) plus noise elsewhere, K=3 reward keys, token rewards at each row's last token."""
    ids = make_ids(b, min_size)
    lengths = torch.randint(1, t + 1, (b,))
    lengths[1] = 0 if min_size == 1 else lengths[1]
    lengths[2] = t
    mask = torch.arange(t)[None, :] < lengths[:, None]
    mask[2, 1] = False  # a hole (an observation token)
    scores = torch.randint(0, 3, (b,)).double()
    noisy = torch.rand(b) < 0.5
    scores[noisy] += torch.randn(int(noisy.sum())).double()
    scores[ids == ids[0]] = 0.7  # a constant group
    per_key = torch.randn(b, 3, dtype=torch.float64)
    per_key[:, 1] = torch.randint(0, 2, (b,)).double()  # a binary reward
    rewards = torch.zeros(b, t, dtype=torch.float64)
    last = (mask.cumsum(-1) == mask.sum(-1, keepdim=True)) & mask
    rewards[last] = scores[mask.any(-1)]
    rewards += 0.1 * torch.randn(b, t, dtype=torch.float64) * mask
    old_logp = -3 * torch.rand(b, t, dtype=torch.float64)
    return dict(
        ids=ids,
        mask=mask,
        scores=scores,
        per_key=per_key,
        rewards=rewards,
        baselines=torch.randn(b, dtype=torch.float64),
        old_logp=old_logp,
        sum_pi_squared=sum_pi_squared_for(old_logp),
        is_weights=torch.rand(b, t, dtype=torch.float64) + 0.5,
    )


def call(name, d, dtype, backend):
    """rk.advantages(name, ...) on the data rounded to dtype."""
    f = lambda x: x.to(dtype)
    opts = dict(backend=backend)
    if name != "reinforce_plus_plus" and name != "remax":
        opts["group_ids"] = d["ids"]
    rewards = f(d["rewards"]) if name in TOKEN_LEVEL else f(d["scores"])
    if name == "gdpo":
        rewards, opts["weights"] = f(d["per_key"]), [1.0, 0.5, 2.0]
    elif name == "reinforce_plus_plus":
        opts["gamma"] = 0.9
    elif name == "remax":
        opts["reward_baselines"] = f(d["baselines"])
    elif name == "gpg":
        opts["f_norm"] = 1.5
    elif name == "optimal_token_baseline":
        opts.update(old_logp=f(d["old_logp"]), sum_pi_squared=f(d["sum_pi_squared"]))
        opts["rollout_is_weights"] = f(d["is_weights"])
    return rk.advantages(name, rewards, d["mask"], **opts)


def rounded(d, dtype):
    return {k: (x.to(dtype).double() if x.is_floating_point() else x) for k, x in d.items()}


@pytest.mark.parametrize(
    "backend, dtype",
    [(b, torch.float32) for b in BACKENDS] + [("auto", dt) for dt in (*DTYPES[1:], torch.float64)],
)
def test_estimators_match_float64_reference(backend, dtype, seed):
    """Every estimator on every backend in fp32; the other dtypes on "auto" only: the estimators upcast 16-bit
    inputs to fp32 before any kernel, so a kernel sees fp32 or fp64 whatever the input dtype (the
    interpreter is slow)."""
    d = make_data()
    for name in rk.ADVANTAGE_ESTIMATORS:
        adv, ret = call(name, d, dtype, backend)
        same_adv, same_ret = call(name, d, dtype, "reference")
        oracle_adv, oracle_ret = call(name, rounded(d, dtype), torch.float64, "reference")
        assert adv.dtype == dtype and adv.shape == d["mask"].shape
        assert_oracle(f"{backend}/{name}/advantages", adv, same_adv, oracle_adv)
        assert_oracle(f"{backend}/{name}/returns", ret, same_ret, oracle_ret)


def test_pinned_versions():
    """The peers these tests compare with are the versions the docstrings name."""
    from importlib.metadata import version

    pytest.importorskip("verl", reason="verl is installed by the [integrations] extra (README)")
    pytest.importorskip("trl", reason="TRL is installed by the [integrations] extra (README)")

    assert version("verl") == ae.VERL_VERSION and version("trl") == ae.TRL_VERSION


def _verl():
    """verl's core_algos, or a skip where verl is not installed."""
    return pytest.importorskip(
        "verl.trainer.ppo.core_algos", reason="verl is installed by the [integrations] extra (README)"
    )


class _Config(dict):
    """verl reads its AlgoConfig with .get and attributes."""

    __getattr__ = dict.__getitem__


def _uids(ids):
    """verl's index: a numpy array of uid strings."""
    return np.array([f"uid-{int(i)}" for i in ids], dtype=object)


# verl's masked_whiten divides by mask.sum() + 1e-8 in two places: a relative change of ~1e-8 / tokens
# (~1e-10 here) in the whitened estimators, far above float64 rounding.
WHITENED_RTOL = 1e-9


@pytest.mark.parametrize("name", rk.ADVANTAGE_ESTIMATORS)
def test_matches_verl(name, seed):
    """Each estimator against the installed verl function it is named after, driven as verl's trainer
    drives it (token_level_rewards [B, T], response_mask, a numpy array of uids), in float64 with a float64
    mask (verl's whitening computes its Bessel factor in the mask's dtype)."""
    ca = _verl()
    d = make_data(b=40, t=17, min_size=2 if name == "grpo_passk" else 1)
    ids, mask = d["ids"], d["mask"].double()
    outcome = torch.zeros_like(d["rewards"])
    outcome[:, 0] = d["scores"]  # verl sums token_level_rewards over T
    ours = call(name, d, torch.float64, "auto")
    valid = d["mask"]
    tol = dict(rtol=1e-12, atol=1e-12)
    if name == "gdpo":
        # verl's group of one divides by the float32 tensor 1.0 + epsilon: an epsilon exact in fp32 keeps
        # that rounding out of a float64 comparison.
        eps = 2.0**-20
        want = ca.compute_gdpo_outcome_advantage(outcome, mask, _uids(ids), epsilon=eps)
        ours = rk.gdpo_advantages(d["scores"], mask, group_ids=ids, eps=eps)
        tol = dict(rtol=WHITENED_RTOL, atol=WHITENED_RTOL)
    elif name == "grpo_passk":
        want = ca.compute_grpo_passk_outcome_advantage(
            outcome, mask, _uids(ids), config=_Config(norm_adv_by_std_in_grpo=True)
        )
        off = ca.compute_grpo_passk_outcome_advantage(
            outcome, mask, _uids(ids), config=_Config(norm_adv_by_std_in_grpo=False)
        )
        torch.testing.assert_close(
            rk.grpo_passk_advantages(d["scores"], mask, group_ids=ids, norm_by_std=False)[0], off[0], **tol
        )
    elif name == "reinforce_plus_plus":
        want = ca.compute_reinforce_plus_plus_outcome_advantage(d["rewards"], mask, config=_Config(gamma=0.9))
        tol = dict(rtol=WHITENED_RTOL, atol=WHITENED_RTOL)
    elif name == "reinforce_plus_plus_baseline":
        want = ca.compute_reinforce_plus_plus_baseline_outcome_advantage(outcome, mask, _uids(ids))
        tol = dict(rtol=WHITENED_RTOL, atol=WHITENED_RTOL)
    elif name == "remax":
        want = ca.compute_remax_outcome_advantage(d["rewards"], d["baselines"], mask)
    elif name == "opo":
        want = ca.compute_opo_outcome_advantage(outcome, mask, _uids(ids))
        empty_group = mask.sum(-1) == 0  # verl: 0 / 0 where every response of a group is empty
        keep = ~torch.isnan(want[0]).all(-1) | ~empty_group
        want, ours, valid = [x[keep] for x in want], [x[keep] for x in ours], valid[keep]
    elif name == "gpg":
        want = ca.compute_gpg_outcome_advantage(outcome, mask, _uids(ids), f_norm=1.5)
        # verl's alpha = B / count_nonzero(scores) is a float32 tensor (int / int64 tensor) whatever the
        # scores' dtype: verl's result carries that one fp32 rounding (relative 2**-24).
        tol = dict(rtol=2.0**-23, atol=1e-12)
    elif name == "optimal_token_baseline":
        want = ca.compute_optimal_token_baseline_advantage(
            d["rewards"], mask, _uids(ids), d["old_logp"], d["sum_pi_squared"], d["is_weights"]
        )
        plain = ca.compute_optimal_token_baseline_advantage(
            d["rewards"], mask, _uids(ids), d["old_logp"], d["sum_pi_squared"], handle_zero_tail=False
        )
        got = rk.optimal_token_baseline_advantages(
            d["rewards"], mask, group_ids=ids, old_logp=d["old_logp"], sum_pi_squared=d["sum_pi_squared"],
            handle_zero_tail=False,
        )  # fmt: skip
        torch.testing.assert_close(got[0], plain[0], **tol)
    # verl leaves the reward-to-go at masked positions inside a response (the hole) in its returns, and
    # remax in its advantages too; ours are 0 there. Every other advantage is compared everywhere.
    if name == "remax":
        assert (want[0][~valid] != 0).any()  # the test does reach that difference
        want = (want[0] * valid, want[1])
    torch.testing.assert_close(ours[0], want[0], **tol)
    torch.testing.assert_close(ours[1] * valid, want[1] * valid, **tol)
    assert (ours[1][~valid] == 0).all() and (ours[0][~valid] == 0).all()


def test_gdpo_reward_keys_match_verl(seed):
    """verl's GDPO with algorithm.gdpo_reward_keys / gdpo_reward_weights reads each key's scores from the
    non-tensor batch as float32: verl's result must meet the error rule against our float64 reference, as
    any fp32 kernel would."""
    ca = _verl()
    d = make_data(b=40, t=17)
    ids, mask, per_key = d["ids"], d["mask"].long(), d["per_key"].float()
    prompt = 5
    batch = {
        "prompts": torch.zeros(40, prompt),
        "attention_mask": torch.cat([torch.ones(40, prompt), mask], 1).long(),
    }
    keys = ["format", "accuracy", "length"]
    weights = [1.0, 0.5, 2.0]
    config = _Config(gdpo_reward_keys=keys, gdpo_reward_weights=weights)
    non_tensor = {k: per_key[:, i].numpy() for i, k in enumerate(keys)}
    want, _ = ca.compute_gdpo_outcome_advantage(
        torch.zeros(40, 17), mask, _uids(ids), config=config, non_tensor_batch=non_tensor, batch=batch
    )
    same = rk.gdpo_advantages(per_key, mask, group_ids=ids, weights=weights)[0]
    oracle = rk.gdpo_advantages(per_key.double(), mask, group_ids=ids, weights=weights, backend="reference")[
        0
    ]
    assert_oracle("verl gdpo (fp32)", want, same, oracle)
    assert_oracle("rk gdpo (fp32)", same, want, oracle)


def _trl_source(relative: str) -> str:
    spec = importlib.util.find_spec("trl")
    if spec is None:
        pytest.skip("trl is not installed")
    return (pathlib.Path(spec.origin).parent / relative).read_text()


def trl_advantages(rewards_per_func, num_generations, weights, scale_rewards, aggregation):
    """TRL 1.16's own code: the lines of GRPOTrainer that turn rewards_per_func into advantages, read from
    the installed trl (not imported: that would pull in the whole training stack) and run as they are. A
    change of those lines in TRL fails here."""
    trainer = _trl_source("trainer/grpo_trainer.py")
    start = trainer.index("        unscorable_mask = torch.isnan(rewards_per_func).all(dim=1)")
    end_marker = "advantages = torch.nan_to_num(advantages, nan=0.0)"
    block = textwrap.dedent(trainer[start : trainer.index(end_marker, start) + len(end_marker)])
    utils = ast.parse(_trl_source("trainer/utils.py"))
    nanstd = next(n for n in utils.body if isinstance(n, ast.FunctionDef) and n.name == "nanstd")
    namespace = {"torch": torch}
    exec(compile(ast.Module([nanstd], []), "trl/trainer/utils.py", "exec"), namespace)
    namespace.update(
        rewards_per_func=rewards_per_func,
        num_generations=num_generations,
        device="cpu",
        self=types.SimpleNamespace(
            multi_objective_aggregation=aggregation,
            scale_rewards=scale_rewards,
            reward_weights=torch.tensor(weights, dtype=torch.float32),
            reward_funcs=[None] * rewards_per_func.shape[1],
        ),
    )
    exec(compile(block, "trl/trainer/grpo_trainer.py", "exec"), namespace)
    return namespace["advantages"]


@pytest.mark.parametrize("aggregation", ["sum_then_normalize", "normalize_then_sum"])
@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_trl_matches_trl(scale, aggregation, seed):
    g, n = 6, 7
    scores = torch.randn(g * n, 3)
    scores[:, 1] = torch.randint(0, 2, (g * n,)).float()
    scores[:g, :] = 0.25  # a constant group
    weights = [1.0, 0.5, 2.0]
    want = trl_advantages(scores, g, weights, scale, aggregation)
    kw = dict(reward_weights=weights, scale_rewards=scale, multi_objective_aggregation=aggregation)
    got = rk.trl_grpo_advantages(scores, group_size=g, **kw)
    oracle = rk.trl_grpo_advantages(scores.double(), group_size=g, **kw, backend="reference")
    assert_oracle(f"rk trl {scale}/{aggregation}", got, want, oracle)
    assert_oracle(f"TRL {scale}/{aggregation}", want, got, oracle)
    # Shuffled arbitrary ids: the same advantages, shuffled.
    perm = torch.randperm(g * n)
    ids = (torch.arange(g * n) // g * 104729 - 7)[perm]
    shuffled = rk.trl_grpo_advantages(scores[perm], group_ids=ids, **kw)
    torch.testing.assert_close(shuffled, got[perm], rtol=2e-6, atol=2e-6)
    # A group of one (TRL's num_generations=1): every advantage 0.
    ones = trl_advantages(scores[:5], 1, weights, scale, aggregation)
    assert (ones == 0).all() and (rk.trl_grpo_advantages(scores[:5], group_size=1, **kw) == 0).all()


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("aggregation", ["sum_then_normalize", "normalize_then_sum"])
def test_trl_group_ids_with_groups_of_one(backend, scale, aggregation, seed):
    """Arbitrary group ids with groups of one among larger ones (the group kernels' ZERO_SINGLES flag; TRL's
    GDPO aggregation also sets them to 0 after its batch pass): TRL's 0 for each single, the float64
    reference's advantages elsewhere, and the tokens; contiguous groups of one (group_size=1) are all 0
    too."""
    ids = torch.tensor([3, 9, 3, 40, 3, 9, -1, 7, 9, 3, 12], dtype=torch.int32)  # 40, -1, 7, 12 alone
    scores = torch.randn(ids.numel(), 2)
    mask = torch.rand(ids.numel(), 5) > 0.3
    kw = dict(
        group_ids=ids, reward_weights=[1.0, 0.5], scale_rewards=scale, multi_objective_aggregation=aggregation
    )
    got = rk.trl_grpo_advantages(scores, **kw, backend=backend)
    same = rk.trl_grpo_advantages(scores, **kw, backend="reference")
    oracle = rk.trl_grpo_advantages(scores.double(), **kw, backend="reference")
    assert_oracle(f"{backend}/trl {scale} {aggregation}", got, same, oracle)
    single = torch.isin(ids, torch.tensor([40, -1, 7, 12], dtype=torch.int32))
    assert (got[single] == 0).all() and (got[~single] != 0).all()
    tokens = rk.trl_grpo_advantages(scores, **kw, mask=mask, backend=backend)
    label = f"{backend}/trl {scale} {aggregation} tokens"
    assert_oracle(label, tokens, same[:, None] * mask, oracle[:, None] * mask)
    del kw["group_ids"]
    ones = rk.trl_grpo_advantages(scores, group_size=1, **kw, backend=backend)
    assert ones.tolist() == [0.0] * ids.numel()


def test_trl_scale_rewards_is_group_advantages():
    """scale_rewards maps onto group_advantages' modes with TRL's eps 1e-4 (no new normalization)."""
    r = torch.randn(24)
    for scale, mode in (
        ("group", "grpo"),
        ("batch", "batch"),
        ("none", "dr_grpo"),
        (True, "grpo"),
        (False, "dr_grpo"),
    ):
        got = rk.trl_grpo_advantages(r, group_size=4, scale_rewards=scale)
        assert torch.equal(got, rk.group_advantages(r, group_size=4, mode=mode, eps=1e-4)), scale


@pytest.mark.parametrize("backend", BACKENDS + ["reference"])
def test_hand_computed(backend):
    kb = backend
    ones = lambda b, t: torch.ones(b, t, dtype=torch.bool)
    # grpo_passk: group 3 = [1, 4, 2] (best 4, second 2, std sqrt(7/3)); group 8 = [3, 3] tied; 9 alone.
    s = torch.tensor([1.0, 4.0, 2.0, 3.0, 3.0, 5.0], dtype=torch.float64)
    ids = torch.tensor([3, 3, 3, 8, 8, 9])
    adv, _ = rk.grpo_passk_advantages(s, ones(6, 2), group_ids=ids, eps=0.0, backend=kb)
    assert adv[:, 0].tolist() == pytest.approx([0.0, 2 / math.sqrt(7 / 3), 0.0, 0.0, 0.0, 0.0], rel=1e-15)
    # opo: lengths 1 and 3, baseline (1*1 + 3*3) / 4 = 2.5.
    m = torch.tensor([[1, 0, 0], [1, 1, 1]], dtype=torch.bool)
    adv, _ = rk.opo_advantages(torch.tensor([1.0, 3.0]), m, group_ids=torch.tensor([0, 0]), backend=kb)
    assert adv.tolist() == [[-1.5, 0.0, 0.0], [0.5, 0.5, 0.5]]
    # gpg: 2 of 4 scores nonzero -> alpha 2; group means 1 and 2.
    gpg_ids = torch.tensor([5, 5, -1, -1])
    adv, _ = rk.gpg_advantages(torch.tensor([0.0, 2.0, 4.0, 0.0]), ones(4, 1), group_ids=gpg_ids, backend=kb)
    assert adv[:, 0].tolist() == [-2.0, 2.0, 4.0, -4.0]
    # remax: reward-to-go [1, 1, 0] minus the baseline 0.5 on the valid tokens.
    adv, ret = rk.remax_advantages(torch.tensor([[0.0, 1.0, 2.0]]), torch.tensor([[1, 1, 0]]),
                                   reward_baselines=torch.tensor([0.5]), backend=kb)  # fmt: skip
    assert ret.tolist() == [[1.0, 1.0, 0.0]] and adv.tolist() == [[0.5, 0.5, 0.0]]
    # reinforce_plus_plus_baseline: [-1, 1] per token, whitened: mean 0, variance 4/3 over the 4 tokens.
    pair = torch.tensor([1.0, 3.0], dtype=torch.float64)
    adv, _ = rk.reinforce_plus_plus_baseline_advantages(
        pair, ones(2, 2), group_ids=torch.tensor([0, 0]), backend=kb
    )
    x = 1 / math.sqrt(4 / 3 + 1e-8)
    torch.testing.assert_close(adv, torch.tensor([[-x, -x], [x, x]], dtype=torch.float64), rtol=1e-15, atol=0)
    # optimal_token_baseline: pi = 0.5 and sum pi^2 = 0.5 -> w = 0.5; row 1 is one token long, so row 0
    # is the unique longest: its baseline is 0 from t = 1 on (handle_zero_tail).
    r = torch.tensor([[0.0, 1.0], [0.0, 0.0]], dtype=torch.float64)
    m = torch.tensor([[1, 1], [1, 0]], dtype=torch.bool)
    half = torch.full((2, 2), 0.5, dtype=torch.float64)
    kw = dict(group_ids=torch.tensor([4, 4]), old_logp=half.log(), sum_pi_squared=half, eps=0.0, backend=kb)
    adv, ret = rk.optimal_token_baseline_advantages(r, m, **kw)
    assert ret.tolist() == [[1.0, 1.0], [0.0, 0.0]]
    assert adv.tolist() == [[0.5, 1.0], [-0.5, 0.0]]  # baselines [0.5, 0] and [0.5, -]
    adv, _ = rk.optimal_token_baseline_advantages(r, m, **kw | dict(handle_zero_tail=False))
    assert adv.tolist() == [[0.5, 0.0], [-0.5, 0.0]]  # t = 1: baseline (1 * 1) / 1


@pytest.mark.parametrize("backend", BACKENDS + ["reference"])
def test_constant_singleton_and_empty(backend):
    """A constant group, a group of one, an all-empty group and an empty mask row: finite everywhere;
    the unwhitened outcome estimators give the constant group exactly 0 (gpg, passk, opo); eps = 0 too."""
    s = torch.tensor([0.1, 0.1, 0.1, 2.0, -1.0, 3.0, 0.5], dtype=torch.float32)
    ids = torch.tensor([7, 7, 7, 1, 2, 2, 3])
    m = torch.ones(7, 5, dtype=torch.bool)
    m[4] = False  # an empty row
    m[6] = False  # a group whose only response is empty
    d = dict(ids=ids, mask=m, scores=s, per_key=torch.stack([s, -s, s * 0], 1), rewards=torch.randn(7, 5) * m,
             baselines=torch.randn(7), old_logp=-torch.rand(7, 5), sum_pi_squared=torch.rand(7, 5),
             is_weights=torch.rand(7, 5))  # fmt: skip
    for name in rk.ADVANTAGE_ESTIMATORS:
        adv, ret = call(name, d, torch.float32, backend)
        assert torch.isfinite(adv).all() and torch.isfinite(ret).all(), name
        assert (adv[~m] == 0).all(), name
        if name in ("gpg", "grpo_passk", "opo"):
            assert (adv[:3] == 0).all(), name
    for eps in (0.0,):
        for fn in (rk.grpo_passk_advantages, rk.gdpo_advantages):
            assert torch.isfinite(fn(s, m, group_ids=ids, eps=eps, backend=backend)[0]).all()
    # Everything masked: whitening has no token, nothing is NaN.
    none = torch.zeros(7, 5, dtype=torch.bool)
    assert (rk.gdpo_advantages(s, none, group_ids=ids, backend=backend)[0] == 0).all()
    assert (rk.reinforce_plus_plus_advantages(torch.randn(7, 5), none, backend=backend)[0] == 0).all()
    # No token at all (T = 0): the rows' sums and moments are empty, the outputs [B, 0].
    for fn in (rk.gdpo_advantages, rk.reinforce_plus_plus_baseline_advantages, rk.opo_advantages):
        assert fn(s, m[:, :0], group_ids=ids, backend=backend)[0].shape == (7, 0)


def test_arbitrary_ids_permutation_equivariant(seed):
    """Relabeling and shuffling the rows permutes the outputs (every estimator)."""
    d = make_data(b=31, t=9)
    perm = torch.randperm(31)
    shuffled = {k: x[perm] for k, x in d.items()}
    _, relabel = torch.unique(d["ids"], return_inverse=True)
    shuffled["ids"] = (relabel * -977 + 3)[perm].int()
    for name in rk.ADVANTAGE_ESTIMATORS:
        a, r = call(name, d, torch.float64, "reference")
        b, q = call(name, shuffled, torch.float64, "reference")
        torch.testing.assert_close(b, a[perm], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(q, r[perm], rtol=1e-12, atol=1e-12)


def test_outputs_are_constants():
    s = torch.randn(6, requires_grad=True)
    m = torch.ones(6, 3, dtype=torch.bool)
    adv, _ = rk.gpg_advantages(s, m, group_ids=torch.zeros(6, dtype=torch.long))
    assert adv.grad_fn is None


def test_bad_inputs():
    s, m, ids = torch.randn(6), torch.ones(6, 4, dtype=torch.bool), torch.tensor([0, 0, 1, 1, 2, 2])
    r = torch.randn(6, 4)
    gpg, gdpo, opo, trl = rk.gpg_advantages, rk.gdpo_advantages, rk.opo_advantages, rk.trl_grpo_advantages
    cases = [
        (ValueError, "estimator must be one of", lambda: rk.advantages("ppo", s, m)),
        (ValueError, "use rk.group_advantages", lambda: rk.advantages("grpo", s, m)),
        (TypeError, "takes the options", lambda: rk.advantages("opo", s, m, group_ids=ids, gamma=0.9)),
        (ValueError, "group_ids is required", lambda: rk.opo_advantages(s, m, group_ids=None)),
        (TypeError, "group_ids must be an int32 or int64", lambda: gpg(s, m, group_ids=ids.float())),
        (ValueError, "group_ids has shape", lambda: rk.gpg_advantages(s, m, group_ids=ids[:5])),
        (ValueError, "mask must be", lambda: rk.opo_advantages(s, m[:5], group_ids=ids)),
        (ValueError, "scores must be 1-D", lambda: rk.grpo_passk_advantages(r, m, group_ids=ids)),
        (TypeError, "scores must be float32", lambda: rk.opo_advantages(s.long(), m, group_ids=ids)),
        (ValueError, "scores must be finite", lambda: rk.gpg_advantages(s / 0, m, group_ids=ids)),
        (ValueError, "weights must have one entry", lambda: gdpo(s, m, group_ids=ids, weights=[1, 2])),
        (ValueError, "at least one reward column", lambda: gdpo(r[:, :0], m, group_ids=ids)),
        (ValueError, "at least one reward column", lambda: trl(r[:, :0], group_ids=ids)),
        (TypeError, "weights must be", lambda: rk.gdpo_advantages(s, m, group_ids=ids, weights="12")),
        (ValueError, "eps must be >= 0", lambda: rk.grpo_passk_advantages(s, m, group_ids=ids, eps=-1.0)),
        (TypeError, "norm_by_std must be a bool", lambda: gdpo(s, m, group_ids=ids, norm_by_std=1)),
        (ValueError, "gamma must be <= 1", lambda: rk.reinforce_plus_plus_advantages(r, m, gamma=1.5)),
        (ValueError, "rewards must be 2-D", lambda: rk.reinforce_plus_plus_advantages(s, m)),
        (ValueError, "reward_baselines has shape", lambda: rk.remax_advantages(r, m, reward_baselines=s[:3])),
        (ValueError, "f_norm must be > 0", lambda: rk.gpg_advantages(s, m, group_ids=ids, f_norm=0.0)),
        (ValueError, "sum_pi_squared must be finite and >= 0", lambda: rk.optimal_token_baseline_advantages(
            r, m, group_ids=ids, old_logp=-r.abs(), sum_pi_squared=-r.abs() - 1)),
        (ValueError, "old_logp has shape", lambda: rk.optimal_token_baseline_advantages(
            r, m, group_ids=ids, old_logp=s, sum_pi_squared=r.abs())),
        (TypeError, "handle_zero_tail must be a bool", lambda: rk.optimal_token_baseline_advantages(
            r, m, group_ids=ids, old_logp=-r.abs(), sum_pi_squared=r.abs(), handle_zero_tail=None)),
        (BackendUnavailableError, "'cuda' is unavailable", lambda: opo(s, m, group_ids=ids, backend="cuda")),
        (ValueError, "backend must be one of", lambda: rk.gpg_advantages(s, m, group_ids=ids, backend="gpu")),
        (ValueError, "scale_rewards must be one of", lambda: trl(s, group_size=2, scale_rewards="x")),
        (ValueError, "multi_objective_aggregation must be", lambda: rk.trl_grpo_advantages(
            s, group_size=2, multi_objective_aggregation="sum")),
        (ValueError, "exactly one of group_size or group_ids", lambda: rk.trl_grpo_advantages(s)),
        (ValueError, "divide B = 6", lambda: rk.trl_grpo_advantages(s, group_size=4)),
        (ValueError, "on one device", lambda: rk.opo_advantages(s, m, group_ids=ids.to("meta"))),
    ]  # fmt: skip
    for exc, match, fn in cases:
        with pytest.raises(exc, match=match):
            fn()


def grouped_edge_cases(dtype):
    """(scores [B], lengths [B], int32 ids [B]) with what make_data leaves out: a group of 150, negative
    bests, +0 and -0 (equal scores, different bits), ties at the best and at the second best, a group of
    one, a group of empty responses, fractional lengths, ids near the int32 limits, shuffled."""
    parts = [
        (torch.randn(150, dtype=torch.float64), 1),
        (torch.tensor([-3.0, -1.5, -2.0]), -(2**31)),
        (torch.tensor([0.0, -0.0, -1.0]), 2**31 - 1),
        (torch.tensor([2.0, 2.0, 1.0]), 5),
        (torch.tensor([3.0, 1.0, 1.0]), 6),
        (torch.tensor([4.0]), 7),
        (torch.tensor([1.0, 2.0, 9.0]), 8),  # its lengths are 0
        (torch.tensor([1e-30, -1e-30]), 9),
    ]
    scores = torch.cat([p for p, _ in parts]).to(torch.float64)
    ids = torch.cat([torch.full((len(p),), i, dtype=torch.int64) for p, i in parts]).to(torch.int32)
    lengths = torch.rand(scores.shape[0], dtype=torch.float64) * 4
    lengths[ids == 8] = 0
    perm = torch.randperm(scores.shape[0])
    return scores[perm].to(dtype), lengths[perm].to(dtype), ids[perm]


@pytest.mark.parametrize("backend", BACKENDS)
def test_grpo_passk_and_opo_walk_across_chunks(backend, seed):
    """Past one chunk of responses (1024 on a GPU, 32 under the interpreter) the GPU kernels take the chunk
    path: each position's head by a binary search of the sorted ids, a launch per pass (one program walks
    them below that, carrying the open group's head between chunks). 2600 responses in groups of 1 to 1500
    (one spans a whole chunk; heads fall on either side of chunk boundaries), ids shuffled, int32, against
    the float64 reference."""
    sizes = [7, 1010, 1500, 1, 3, 64, 15]
    ids = torch.repeat_interleave(
        torch.tensor([5, -3, 11, 2, 40, 9, 0], dtype=torch.int32), torch.tensor(sizes)
    )
    perm = torch.randperm(ids.numel())
    ids = ids[perm]
    scores = torch.randint(0, 50, (ids.numel(),)).float() / 7  # ties within groups
    mask = torch.rand(ids.numel(), 3) > 0.3
    for name, call_it in (
        ("grpo_passk", lambda s, bk: rk.grpo_passk_advantages(s, mask, group_ids=ids, backend=bk)[0]),
        ("opo", lambda s, bk: rk.opo_advantages(s, mask, group_ids=ids, backend=bk)[0]),
    ):
        got = call_it(scores, backend)
        assert_oracle(
            f"{backend}/{name}", got, call_it(scores, "reference"), call_it(scores.double(), "reference")
        )
        assert got.abs().sum() > 0  # a learner (passk) and nonzero baselines (opo) in some group


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("b", [24, 70], ids=["walk", "chunks"])
def test_opo_sums_each_mask_kind_into_its_lengths(backend, b, seed, monkeypatch):
    """opo's kernels sum each response's length from the mask in their own launch (a program / block per
    row; rlkernels/triton/mask_rows.py): bool, int64 0 / 1 and float weights, rows of 300 positions read 64
    at a time under the interpreter (the CUDA blocks: 256 a step), on the walk and on the chunk path (70
    responses: past 32 under the interpreter; CUDA C++ walks up to 1024), against the float64 reference's
    mask sums."""
    from rlkernels.triton import outcome_estimators

    monkeypatch.setattr(outcome_estimators, "row_block", lambda t: 64)
    ids = make_ids(b)
    scores = torch.randint(0, 9, (b,)).double() / 3
    lengths = torch.randint(0, 301, (b,))
    base = torch.arange(300)[None, :] < lengths[:, None]
    base[3, 5] = False  # a hole
    for mask in (base, base.long(), base.double() * torch.rand(b, 300, dtype=torch.float64) * 2):

        def call(s, bk, mask=mask):
            return rk.opo_advantages(s, mask.to(s.dtype) if mask.is_floating_point() else mask, group_ids=ids,
                                     backend=bk)[0]  # fmt: skip

        got = call(scores.float(), backend)
        assert_oracle(
            f"{backend}/opo/{mask.dtype}", got, call(scores.float(), "reference"), call(scores, "reference")
        )
        assert got.abs().sum() > 0


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("b", [24, 70, 1100], ids=["walk", "chunks", "cuda-chunks"])
def test_whitening_takes_its_moments_from_each_mask_kind(backend, b, seed, monkeypatch):
    """reinforce_plus_plus_baseline and gdpo whiten A_b · m_bt with moments that the group pass's launches
    take from the mask rows (a program / block per row; rlkernels/triton/mask_rows.py): bool, int64 0 / 1
    and float weights (their second read), rows of 300 positions read 64 at a time under the interpreter,
    against the float64 reference. On the walk (the rows and the statistics in its launch) and on the chunk
    path (the rows in the first scan launch, the statistics in the last writing launch): 70 responses take
    it under the interpreter (past 32), 1100 on CUDA C++ (past 1024; too slow for the interpreter)."""
    if b == 1100 and backend.name == "triton-interpret":
        pytest.skip("the interpreter's chunk path runs at 70 responses")
    from rlkernels.triton import advantages

    monkeypatch.setattr(advantages, "row_block", lambda t: 64)
    ids = make_ids(b)
    scores = torch.randn(b, 2, dtype=torch.float64)
    scores[:, 1] = torch.randint(0, 2, (b,)).double()
    lengths = torch.randint(0, 301, (b,))
    base = torch.arange(300)[None, :] < lengths[:, None]
    base[3, 5] = False  # a hole
    weights = torch.rand(b, 300, dtype=torch.float64) * 2
    for mask in (base, base.long(), base.double() * weights):
        calls = {
            "rpp_baseline": lambda s, bk, m: rk.reinforce_plus_plus_baseline_advantages(
                s[:, 0], m, group_ids=ids, backend=bk
            )[0],
            "gdpo": lambda s, bk, m: rk.gdpo_advantages(s, m, group_ids=ids, weights=[0.5, 2.0], backend=bk)[
                0
            ],
        }
        for name, call in calls.items():
            m32 = mask.float() if mask.is_floating_point() else mask
            got = call(scores.float(), backend, m32)
            want = call(scores, "reference", mask)
            assert_oracle(f"{backend}/{name}/{mask.dtype}", got, call(scores.float(), "reference", m32), want)
            assert got.abs().sum() > 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_reward_columns_in_one_group_pass_across_chunks(backend, seed):
    """gdpo and TRL's normalize_then_sum take every reward column in one group kernel
    (`group_advantages_sum`: the sorted walk once per column, the weighted sum in the reference's order, and
    TRL's batch pass after it): 2600 responses in groups of 1 to 1500 across the GPU walk's 1024-response
    chunks, three columns with weights, int32 ids shuffled; contiguous groups of 1300 and of one; against
    float64."""
    sizes = [7, 1010, 1500, 1, 3, 64, 15]
    ids = torch.repeat_interleave(
        torch.tensor([5, -3, 11, 2, 40, 9, 0], dtype=torch.int32), torch.tensor(sizes)
    )
    ids = ids[torch.randperm(ids.numel())]
    scores = torch.randn(ids.numel(), 3)
    scores[:, 1] = torch.randint(0, 2, (ids.numel(),)).float()  # a binary reward
    mask = torch.rand(ids.numel(), 3) > 0.3
    weights = [0.5, 2.0, 1.0]
    calls = {
        "gdpo": lambda s, bk: rk.gdpo_advantages(s, mask, group_ids=ids, weights=weights, backend=bk)[0],
        "gdpo dr": lambda s, bk: rk.gdpo_advantages(s, mask, group_ids=ids, norm_by_std=False, backend=bk)[0],
    }
    for label, groups in (
        ("ids", dict(group_ids=ids)),
        ("1300", dict(group_size=1300)),
        ("1", dict(group_size=1)),
    ):
        calls[f"trl groups {label}"] = lambda s, bk, g=groups: rk.trl_grpo_advantages(
            s, reward_weights=weights, multi_objective_aggregation="normalize_then_sum", backend=bk, **g
        )
    assert len(calls) == 5
    for name, call_it in calls.items():
        got = call_it(scores, backend)
        assert_oracle(
            f"{backend}/{name}", got, call_it(scores, "reference"), call_it(scores.double(), "reference")
        )
        assert got.abs().sum() > 0 or name == "trl groups 1"  # TRL: a group of one gets 0


@pytest.mark.fires_device_asserts
@pytest.mark.parametrize("backend", BACKENDS)
def test_reward_columns_flag_non_finite_scores(backend):
    """The one group pass over every column flags a NaN or inf in any column (not the first only), on the
    walk (5 responses) and on the chunk path (each column's flag AND-ed into the one before): 3000 responses,
    3 of the GPU walk's chunks of 1024; 70 under the interpreter, whose chunks are 32."""
    chunked = chunked_responses(backend)
    for (b, row, col), bad in itertools.product(
        ((5, 3, 2), (chunked, chunked - 1, 1)), (float("nan"), float("inf"))
    ):
        ids = torch.arange(b) // 2
        mask = torch.ones(b, 3, dtype=torch.bool)
        scores = torch.randn(b, 3)
        scores[row, col] = bad
        with pytest.raises(ValueError, match="scores must be finite"):
            rk.gdpo_advantages(scores, mask, group_ids=ids, backend=backend)
        with pytest.raises(ValueError, match="scores must be finite"):
            rk.trl_grpo_advantages(
                scores, group_ids=ids, multi_objective_aggregation="normalize_then_sum", backend=backend
            )


@pytest.mark.parametrize("backend", BACKENDS)
def test_group_advantages_sum_opcheck(backend):
    op = getattr(
        torch.ops.rlkernels, "group_advantages_sum_triton" if backend == "triton" else "group_advantages_sum"
    )
    s, ids = torch.randn(7, 2), torch.tensor([0, 0, 1, 1, 1, 2, 0])
    torch.library.opcheck(op.default, (s, ids, 0, torch.tensor([1.0, 0.5]), "grpo_trl", 1e-4, True))
    torch.library.opcheck(op.default, (s.double(), None, 7, None, "dr_grpo", 1e-6, False))


@pytest.mark.fires_device_asserts
@pytest.mark.parametrize("backend", BACKENDS)
def test_grpo_passk_and_opo_kernels_flag_non_finite_scores(backend):
    """The per-response kernels' flag: a NaN or infinite score raises the eager check's ValueError (CPU
    tensors; a GPU asserts the same flag), whichever group it falls in, on the walk (5 responses) and on
    the chunk path (the count the passes share): 3000 responses, 3 of the GPU walk's chunks of 1024; 70 under
    the interpreter, whose chunks are 32."""
    chunked = (chunked_responses(backend), chunked_responses(backend) * 3 // 4)
    for (b, row), bad in itertools.product(((5, 3), chunked), (float("nan"), float("inf"))):
        ids = torch.arange(b) // 2
        mask = torch.ones(b, 3, dtype=torch.bool)
        scores = torch.randn(b)
        scores[row] = bad
        with pytest.raises(ValueError, match="scores must be finite"):
            rk.grpo_passk_advantages(scores, mask, group_ids=ids, backend=backend)
        with pytest.raises(ValueError, match="scores must be finite"):
            rk.opo_advantages(scores, mask, group_ids=ids, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_grpo_passk_and_opo_kernels_on_edge_cases(backend, dtype, seed):
    """The per-response kernels of grpo_passk and opo (every backend) against the float64 reference on
    grouped_edge_cases, through the public functions (a [B, 1] mask carries opo's lengths)."""
    scores, lengths, ids = grouped_edge_cases(dtype)
    mask = lengths[:, None]
    for name, call_it in (
        ("grpo_passk", lambda s, bk: rk.grpo_passk_advantages(s, mask, group_ids=ids, backend=bk)[0]),
        ("grpo_passk/no_std", lambda s, bk: rk.grpo_passk_advantages(
            s, mask > 0, group_ids=ids, norm_by_std=False, eps=0.0, backend=bk)[0]),
        ("opo", lambda s, bk: rk.opo_advantages(s, mask.to(s.dtype), group_ids=ids, backend=bk)[0]),
    ):  # fmt: skip
        got = call_it(scores, backend)
        same = call_it(scores, "reference")
        oracle = call_it(scores.double(), "reference") if dtype != torch.float64 else same
        assert got.dtype == dtype
        assert_oracle(f"{backend}/{name}", got, same, oracle)
    # Exact zeros where the estimator gives none: only a group's unique best learns; ties, the +0/-0 group
    # and the group of one give 0.
    adv = rk.grpo_passk_advantages(scores, torch.ones_like(mask), group_ids=ids, backend=backend)[0][:, 0]
    learners = adv != 0
    assert int(learners.sum()) == 5  # the unique bests of groups 1, -2**31, 6, 8 and 9
    for i in (2**31 - 1, 5, 7):
        assert (adv[ids == i] == 0).all(), i
    # A constant group's opo advantage is exactly 0.
    const = torch.full((4,), 0.1, dtype=dtype)
    m = torch.rand(4, 3, dtype=dtype)
    assert (
        rk.opo_advantages(const, m, group_ids=torch.zeros(4, dtype=torch.long), backend=backend)[0] == 0
    ).all()
    # No responses.
    empty = rk.grpo_passk_advantages(scores[:0], mask[:0], group_ids=ids[:0], backend=backend)[0]
    assert empty.shape == (0, 1)
    assert rk.opo_advantages(scores[:0], mask[:0], group_ids=ids[:0], backend=backend)[0].shape == (0, 1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_outcome_and_whitening_ops_opcheck(backend):
    suffix = "_triton" if backend == "triton" else ""
    s, ids = torch.randn(11, dtype=torch.float64), torch.tensor([3, 3, 1, 1, 1, 9, 3, 0, 0, 5, 5])
    passk, opo = (getattr(torch.ops.rlkernels, f"{name}{suffix}").default for name in ("grpo_passk", "opo"))
    torch.library.opcheck(passk, (s, ids, 1e-6, True))
    mask = torch.tensor([[1, 0, 1]] * 11, dtype=torch.bool)
    whitened = getattr(torch.ops.rlkernels, f"whitened_group_tokens{suffix}").default
    for m in (mask, mask.long(), mask.float() * 0.5):  # each kind of mask a kernel reads
        torch.library.opcheck(opo, (s.float(), m, ids))
        torch.library.opcheck(whitened, (s.float()[:, None], ids, None, "dr_grpo", 0.0, m))
    torch.library.opcheck(whitened, (torch.stack([s, -s], 1), ids, torch.tensor([0.5, 2.0]).double(), "grpo",
                                     1e-6, mask.double()))  # fmt: skip


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("mask_kind", ["bool", "weights"])
def test_optimal_token_baseline_kernels_match_float64_reference(backend, dtype, mask_kind, seed):
    """The kernels (C++ CPU csrc/cpu/optimal_token_baseline.cpp, Triton rlkernels/triton/
    optimal_token_baseline.py) on the input forms the composed test leaves out: float mask weights (up to 2,
    so a row's length may pass T: the zero tail then starts past the row), int32 ids, no rollout_is_weights
    and with them, strided inputs, old_logp = -inf (pi = 0), groups of one, and a group whose longest
    response is unique, with and without the zero tail."""
    b, t = 23, 17
    ids = torch.tensor([7, 7, 7, -3, -3, 5, 9, 9, 9, 9, 11, 11] * 2)[:b].to(torch.int32)
    lengths = torch.randint(1, t + 1, (b,))
    lengths[0], lengths[1], lengths[2] = t, 3, 5  # group 7: a unique longest response
    mask = torch.arange(t)[None, :] < lengths[:, None]
    if mask_kind == "weights":
        mask = mask * (2 * torch.rand(b, t, dtype=torch.float64))
        mask[0] = 2.0  # length 2T
    rewards = torch.randn(b, t, dtype=torch.float64)
    old_logp = (-3 * torch.rand(t, b, dtype=torch.float64)).T  # strided
    old_logp[4, 2] = -math.inf
    sum_sq = sum_pi_squared_for(old_logp)
    is_w = torch.rand(b, t, dtype=torch.float64) + 0.5

    def cast(x, dt):
        return None if x is None else x.to(dt)

    for weights in (None, is_w):
        for zero_tail in (True, False):
            args = dict(group_ids=ids, handle_zero_tail=zero_tail, eps=1e-8)
            got, same, oracle = (
                rk.optimal_token_baseline_advantages(
                    cast(rewards, dt),
                    mask if mask.dtype == torch.bool else cast(mask, dt),
                    old_logp=cast(old_logp, dt),
                    sum_pi_squared=cast(sum_sq, dt),
                    rollout_is_weights=cast(weights, dt),
                    backend=backend,
                    **args,
                )
                for dt, backend in ((dtype, backend), (dtype, "reference"), (torch.float64, "reference"))
            )
            for i, name in enumerate(("advantages", "returns")):
                assert got[i].dtype == dtype
                assert_oracle(f"{backend}/{mask_kind}/{zero_tail}/{name}", got[i], same[i], oracle[i])


@pytest.mark.parametrize("backend", BACKENDS)
def test_optimal_token_baseline_across_blocks_and_large_groups(backend, seed):
    """The GPU kernels take each row in blocks of 1024 positions (the rows pass carries both scans between
    blocks; the groups pass runs a program per group and block) and a group's lengths 128 members at a time:
    T = 1100, a group of 150 members whose unique longest response's tail starts in the second block, a group
    of 2 whose tail starts in the first, singletons, int64 ids shuffled, int (0 / 1) mask, against float64."""
    t = 1100
    ids = torch.repeat_interleave(torch.tensor([9, -4, 2**33, 6, 7]), torch.tensor([150, 2, 1, 1, 3]))
    b = ids.numel()
    ids = ids[torch.randperm(b)]
    lengths = torch.randint(1, 1030, (b,))
    nine, four = (ids == 9).nonzero().flatten(), (ids == -4).nonzero().flatten()
    # group 9: its unique longest (1100) the last member in the stable sort (past the first 128), the second
    # longest 1040 (a cut in the second block); group -4: unique longest 700, cut at 300 (the first block)
    lengths[nine[-1]], lengths[nine[0]] = t, 1040
    lengths[four[0]], lengths[four[1]] = 700, 300
    mask = (torch.arange(t)[None, :] < lengths[:, None]).long()
    rewards = torch.randn(b, t, dtype=torch.float64)
    old_logp = -3 * torch.rand(b, t, dtype=torch.float64)
    sum_sq = sum_pi_squared_for(old_logp)
    for zero_tail in (True, False):
        kw = dict(group_ids=ids, handle_zero_tail=zero_tail, sum_pi_squared=sum_sq.float())
        got, same = (
            rk.optimal_token_baseline_advantages(
                rewards.float(), mask, old_logp=old_logp.float(), backend=bk, **kw
            )
            for bk in (backend, "reference")
        )
        oracle = rk.optimal_token_baseline_advantages(
            rewards.float().double(), mask, group_ids=ids, old_logp=old_logp.float().double(),
            sum_pi_squared=sum_sq.float().double(), handle_zero_tail=zero_tail, backend="reference",
        )  # fmt: skip
        for i, name in enumerate(("advantages", "returns")):
            assert_oracle(f"{backend}/{zero_tail}/{name}", got[i], same[i], oracle[i])


@pytest.mark.fires_device_asserts
@pytest.mark.parametrize("backend", BACKENDS)
def test_optimal_token_baseline_kernels_flag_bad_values(backend):
    """The kernels check the values they read into one flag: a non-finite reward, a negative Σπ² or
    importance weight, an integer mask value other than 0 / 1 each raise the eager check's ValueError (CPU
    tensors; a GPU asserts the same flag), in any row."""
    b, t = 5, 7
    ids = torch.tensor([0, 0, 1, 1, 2])
    good = dict(
        rewards=torch.randn(b, t), mask=torch.ones(b, t, dtype=torch.int64), old_logp=-torch.rand(b, t),
        sum_pi_squared=torch.rand(b, t), rollout_is_weights=torch.rand(b, t),
    )  # fmt: skip

    def run(**bad):
        x = good | bad
        return rk.optimal_token_baseline_advantages(
            x["rewards"], x["mask"], group_ids=ids, old_logp=x["old_logp"],
            sum_pi_squared=x["sum_pi_squared"], rollout_is_weights=x["rollout_is_weights"], backend=backend,
        )  # fmt: skip

    run()
    for name, value, message in (
        ("rewards", float("nan"), "rewards must be finite"),
        ("rewards", float("inf"), "rewards must be finite"),
        ("sum_pi_squared", -0.5, "sum_pi_squared must be finite and >= 0"),
        ("rollout_is_weights", float("inf"), "rollout_is_weights must be finite and >= 0"),
        ("mask", 2, "must hold only 0 and 1"),
    ):
        x = good[name].clone()
        x[3, 5] = value
        with pytest.raises(ValueError, match=message):
            run(**{name: x})


@pytest.mark.parametrize("backend", BACKENDS)
def test_optimal_token_baseline_opcheck(backend):
    suffix = "_triton" if backend == "triton" else ""
    b, t = 6, 5
    args = (
        torch.randn(b, t), torch.rand(b, t) > 0.3, torch.tensor([0, 0, 1, 1, 1, 2]), -torch.rand(b, t),
        torch.rand(b, t), torch.rand(b, t) + 0.5, True, 1e-8,
    )  # fmt: skip
    torch.library.opcheck(getattr(torch.ops.rlkernels, f"optimal_token_baseline{suffix}").default, args)
