"""DAPO utilities: dynamic_sampling against a per-group Python oracle (np.std, as verl's filter) and
hand-made groups; overlong_penalty against the formula in float64, hand-made lengths around the buffer,
and verl 0.9.1's own DAPORewardManager; bad inputs. (One implementation: the eager one.)"""

import math
from collections import defaultdict
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from oracle import assert_oracle

import rlkernels as rk

# ---------------------------------------------------------------------------------------------------------
# dynamic_sampling


def _oracle_groups(rewards, ids, keep_singletons=True):
    """Per group, in Python: kept iff its std (np.std, as verl) is > 0, or it is a singleton."""
    groups = defaultdict(list)
    for r, g in zip(rewards.tolist(), ids.tolist(), strict=True):
        groups[g].append(r)
    kept = {g for g, vals in groups.items() if np.std(vals) > 0 or (keep_singletons and len(vals) == 1)}
    return [g in kept for g in ids.tolist()], sorted(groups), [g in kept for g in sorted(groups)]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("keep_singletons", [True, False])
def test_dynamic_sampling_against_the_oracle(seed, keep_singletons):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(-50, 50, (97,), generator=gen) * 7919  # arbitrary values, any order, uneven sizes
    rewards = torch.randint(0, 2, (97,), generator=gen).double()  # 0/1 accuracy: many all-equal groups
    keep, group_ids, group_keep = _oracle_groups(rewards, ids, keep_singletons)
    out = rk.dynamic_sampling(rewards, ids, target_groups=60, keep_singletons=keep_singletons)
    assert out.keep.tolist() == keep
    assert out.indices.tolist() == [i for i, k in enumerate(keep) if k]
    assert out.group_ids.tolist() == group_ids and out.group_keep.tolist() == group_keep
    assert out.num_groups.item() == sum(group_keep)
    assert out.groups_needed.item() == max(60 - sum(group_keep), 0)
    assert 0 < sum(group_keep) < len(group_keep)  # the case has both kinds


def test_dynamic_sampling_hand_made():
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0, 0.5, 0.2, 0.2])
    ids = torch.tensor([9, 9, 9, 4, 4, -1, 3, 3])
    # group 9: all equal -> dropped; 4: differs -> kept; -1: singleton -> kept; 3: equal -> dropped.
    out = rk.dynamic_sampling(rewards, ids, target_groups=2)
    assert out.keep.tolist() == [False, False, False, True, True, True, False, False]
    assert out.indices.tolist() == [3, 4, 5]
    assert out.group_ids.tolist() == [-1, 3, 4, 9] and out.group_keep.tolist() == [True, False, True, False]
    assert out.num_groups.item() == 2 and out.groups_needed.item() == 0  # target reached: never negative
    out = rk.dynamic_sampling(rewards, ids, target_groups=5, keep_singletons=False)
    assert out.num_groups.item() == 1 and out.groups_needed.item() == 4
    assert out.groups_needed.dtype == torch.int64
    # Contiguous groups of 2: (1, 1) dropped, (1, 0), (1, 0.5) kept, (0.2, 0.2) dropped.
    out = rk.dynamic_sampling(rewards, group_size=2)
    assert out.keep.tolist() == [False, False, True, True, True, True, False, False]
    assert out.groups_needed is None


def test_dynamic_sampling_equal_values_are_exact():
    """Three float64 copies of 0.1: np.std gives 1.4e-17 (the mean rounds), so verl's `np.std == 0` test
    keeps the group; all three rewards are equal, and the op drops it (max == min). A 1e-7 spread is a
    spread."""
    assert np.std([0.1] * 3) > 0  # the rounding this test is about
    r = torch.tensor([0.1, 0.1, 0.1, 0.1, 0.1 + 1e-7], dtype=torch.float64)
    out = rk.dynamic_sampling(r, torch.tensor([0, 0, 0, 1, 1]))
    assert out.keep.tolist() == [False, False, False, True, True]


def test_dynamic_sampling_empty_batch():
    out = rk.dynamic_sampling(torch.zeros(0), torch.zeros(0, dtype=torch.long), target_groups=3)
    assert out.keep.numel() == 0 and out.indices.numel() == 0
    assert out.num_groups.item() == 0 and out.groups_needed.item() == 3


# ---------------------------------------------------------------------------------------------------------
# overlong_penalty


def _penalty64(lengths, max_len, buf, factor):
    """The DAPO formula, in Python floats."""
    return [min(-(length - (max_len - buf)) / buf * factor, 0.0) for length in lengths]


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.float32, torch.float64])
def test_overlong_penalty_against_the_formula(dtype):
    gen = torch.Generator().manual_seed(3)
    lengths = torch.randint(0, 4200, (301,), generator=gen).to(dtype)
    out = rk.overlong_penalty(lengths, max_resp_len=4096, buffer_len=512, penalty_factor=1.5)
    want = torch.tensor(_penalty64(lengths.double().tolist(), 4096, 512, 1.5), dtype=torch.float64)
    assert out.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    assert out.shape == lengths.shape
    if dtype == torch.float64:
        torch.testing.assert_close(out, want, rtol=1e-15, atol=1e-15)
    else:
        assert_oracle("overlong_penalty", out, None, want)


def test_overlong_penalty_hand_made():
    """max 20, buffer 4 (expected length 16), factor 2: 0 up to 16 inclusive, -2·(L-16)/4 after."""
    lengths = torch.tensor([0, 15, 16, 17, 18, 20, 24])
    out = rk.overlong_penalty(lengths, max_resp_len=20, buffer_len=4, penalty_factor=2.0)
    assert out.tolist() == [0.0, 0.0, 0.0, -0.5, -1.0, -2.0, -4.0]  # beyond max: not bounded (verl)
    assert not torch.signbit(out[:3]).any()  # +0 at the boundary, not -0
    assert (rk.overlong_penalty(lengths, max_resp_len=20, buffer_len=20, penalty_factor=0.0) == 0).all()
    full = rk.overlong_penalty(lengths, max_resp_len=20, buffer_len=20)  # the whole range is the buffer
    assert full[0].item() == 0.0 and full[5].item() == -1.0
    assert rk.overlong_penalty(torch.zeros(0), max_resp_len=8, buffer_len=2).numel() == 0


def test_overlong_penalty_matches_verl():
    """verl's DAPORewardManager with a zero score: the reward it puts on each response's last token is the
    overlong penalty (float32 in verl, rounded twice: rtol of one float32 ulp)."""
    dapo = pytest.importorskip("verl.workers.reward_manager.dapo")
    from verl import DataProto

    max_len, buf, factor = 24, 8, 0.7
    lengths = torch.tensor([1, 10, 16, 17, 20, 23, 24])
    b, prompt_len = lengths.numel(), 3
    attention = torch.zeros(b, prompt_len + max_len, dtype=torch.long)
    attention[:, :prompt_len] = 1
    for i, n in enumerate(lengths.tolist()):
        attention[i, prompt_len : prompt_len + n] = 1
    data = DataProto.from_dict(
        tensors=dict(
            prompts=torch.ones(b, prompt_len, dtype=torch.long),
            responses=torch.ones(b, max_len, dtype=torch.long),
            attention_mask=attention,
        ),
        non_tensors=dict(
            data_source=np.array(["x"] * b, dtype=object),
            reward_model=np.array([{"ground_truth": ""}] * b, dtype=object),
        ),
    )
    tokenizer = SimpleNamespace(decode=lambda ids, skip_special_tokens=True: "", eos_token="</s>")
    manager = dapo.DAPORewardManager(
        tokenizer, num_examine=0, compute_score=lambda **kw: 0.0, max_resp_len=max_len,
        overlong_buffer_cfg=SimpleNamespace(enable=True, len=buf, penalty_factor=factor, log=False),
    )  # fmt: skip
    reward = manager(data)
    verl_penalty = reward[torch.arange(b), lengths - 1]
    assert reward.sum().item() == pytest.approx(verl_penalty.sum().item())  # nothing elsewhere
    ours = rk.overlong_penalty(lengths, max_resp_len=max_len, buffer_len=buf, penalty_factor=factor)
    torch.testing.assert_close(ours, verl_penalty, rtol=1.2e-7, atol=0)
    assert (ours < 0).tolist() == [False, False, False, True, True, True, True]
    assert math.isclose(ours[-1].item(), -factor, rel_tol=1e-6)


# ---------------------------------------------------------------------------------------------------------
# Bad inputs

_ds, _op = rk.dynamic_sampling, rk.overlong_penalty
_R = torch.zeros(4)
_I = torch.zeros(4, dtype=torch.long)


@pytest.mark.parametrize(
    "call,error,match",
    [
        (lambda: _ds([1.0], _I), TypeError, "rewards must be a torch.Tensor"),
        (lambda: _ds(_I, _I), TypeError, "rewards must be float"),
        (lambda: _ds(_R[None], _I), ValueError, "rewards must be 1-D"),
        (lambda: _ds(_R, _I.float()), TypeError, "group_ids must be an int32 or int64"),
        (lambda: _ds(_R, _I[:3]), ValueError, "group_ids has shape"),
        (lambda: _ds(_R), ValueError, "exactly one of group_ids or group_size"),
        (lambda: _ds(_R, _I, group_size=2), ValueError, "exactly one of"),
        (lambda: _ds(_R, group_size=3), ValueError, "group_size must be an int dividing B"),
        (lambda: _ds(_R, group_size=0), ValueError, "group_size must be >= 1"),
        (lambda: _ds(_R, _I, target_groups=-1), ValueError, "target_groups must be >= 0"),
        (lambda: _ds(_R, _I, target_groups=2.0), TypeError, "target_groups must be an int"),
        (lambda: _ds(_R, _I, keep_singletons=0), TypeError, "keep_singletons must be a bool"),
        (lambda: _ds(torch.tensor([0.0, math.nan]), _I[:2]), ValueError, "rewards must be finite"),
        (lambda: _ds(_R, _I, backend="cpu"), rk.BackendUnavailableError, "not implemented"),
        (lambda: _op([3], max_resp_len=8, buffer_len=2), TypeError, "lengths must be a torch"),
        (lambda: _op(_I.bool(), max_resp_len=8, buffer_len=2), TypeError, "integer or floating"),
        (lambda: _op(_I, max_resp_len=8.0, buffer_len=2), TypeError, "max_resp_len must be an int"),
        (lambda: _op(_I, max_resp_len=8, buffer_len=0), ValueError, "buffer_len must be > 0"),
        (lambda: _op(_I, max_resp_len=8, buffer_len=9), ValueError, "buffer_len must be <= 8"),
        (lambda: _op(_I, max_resp_len=0, buffer_len=1), ValueError, "max_resp_len must be > 0"),
        (lambda: _op(_I, max_resp_len=8, buffer_len=2, penalty_factor=-1), ValueError,
         "penalty_factor must be >= 0"),
        (lambda: _op(_I - 1, max_resp_len=8, buffer_len=2), ValueError, "lengths must be >= 0"),
        (lambda: _op(_R - 1, max_resp_len=8, buffer_len=2), ValueError, "lengths must be finite"),
        (lambda: _op(_I, 8, 2), TypeError, "keyword-only"),
    ],
)  # fmt: skip
def test_bad_inputs(call, error, match):
    with pytest.raises(error, match=match):
        call()
