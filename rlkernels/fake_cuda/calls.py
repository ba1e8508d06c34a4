"""The catalogue of the fake-CUDA check: one call of every public op with a kernel, in its main options;
each GPU branch (sweep / fused / frozen head, token / sequence level, ids / contiguous groups, padded /
packed) once. A call is (maker, backend) -> whatever the public function returns; the maker draws its
tensors. With the calls: the host syncs each may make, and which run eagerly only."""

from __future__ import annotations

from collections.abc import Callable

import torch

import rlkernels as rk
from rlkernels.fake_cuda.host_syncs import placing_inputs

GPU_BACKENDS = ("auto", "triton", "cuda")


class Maker:
    """Test tensors: drawn from a CPU generator (the same values on every run), then placed on `device`
    (under a FakeTensorMode, fake tensors there)."""

    def __init__(self, device: torch.device, fake_mode=None, seed: int = 0):
        self.device, self.fake_mode = device, fake_mode
        self.gen = torch.Generator(device="cpu").manual_seed(seed)
        self.leaves: list[torch.Tensor] = []

    def _place(self, t: torch.Tensor, grad: bool) -> torch.Tensor:
        if self.fake_mode is not None:
            t = self.fake_mode.from_tensor(t)
        with placing_inputs():  # the inputs are on the device before the call: not its host syncs
            t = t.to(self.device)
        if grad:
            t.requires_grad_()
            self.leaves.append(t)
        return t

    def randn(self, *shape, dtype=torch.float32, scale=1.0, shift=0.0, grad=False) -> torch.Tensor:
        t = torch.randn(*shape, generator=self.gen, dtype=torch.float64) * scale + shift
        return self._place(t.to(dtype), grad)

    def logp(self, *shape, dtype=torch.float32, grad=False) -> torch.Tensor:
        return self._place((-3 * torch.rand(*shape, generator=self.gen)).to(dtype), grad)

    def mask(self, *shape, p=0.2) -> torch.Tensor:
        m = torch.rand(*shape, generator=self.gen) > p
        m.view(-1)[0] = True
        return self._place(m, False)

    def ints(self, high: int, *shape, dtype=torch.int64) -> torch.Tensor:
        return self._place(torch.randint(0, high, shape, generator=self.gen, dtype=dtype), False)

    def tensor(self, values, dtype=None) -> torch.Tensor:
        return self._place(torch.tensor(values, dtype=dtype), False)

    def labels(self, vocab: int, *shape) -> torch.Tensor:
        t = torch.randint(0, vocab, shape, generator=self.gen)
        t.view(-1)[::5] = -100
        return self._place(t, False)


B, T, N, D, V = 4, 37, 29, 24, 301


def _policy_inputs(m: Maker):
    logp = m.logp(B, T, grad=True)
    return logp, m.logp(B, T), m.randn(B), m.mask(B, T)


def _linear_inputs(m: Maker, *, head_grad=True, dtype=torch.float32):
    hidden = m.randn(N, D, dtype=dtype, grad=True)
    weight = m.randn(V, D, dtype=dtype, scale=0.2, grad=head_grad)
    return hidden, weight, m.labels(V, N)


def _groups(m: Maker):
    """Per-response scores [B], the response mask [B, T] and group ids [B] (2 groups of 2)."""
    return m.randn(B), m.mask(B, T, p=0.0), m.tensor([0, 0, 1, 1])


def _estimator(fn, *, token_rewards: bool = False, **options):
    """A call of an advantage estimator on fresh [B] scores (or [B, T] rewards) with its group ids."""

    def call(m: Maker, be: str):
        scores, mask, ids = _groups(m)
        if token_rewards:
            return fn(m.randn(B, T), mask, backend=be, **options)
        return fn(scores, mask, group_ids=ids, backend=be, **options)

    return call


CALLS: dict[str, Callable] = {
    "kl_penalty": lambda m, be: rk.kl_penalty(m.logp(B, T, grad=True), m.logp(B, T), "k3", backend=be),
    "kl_penalty[k3+,bf16]": lambda m, be: rk.kl_penalty(
        m.logp(B, T, dtype=torch.bfloat16, grad=True), m.logp(B, T, dtype=torch.bfloat16), "k3+", backend=be
    ),
    "policy_loss[token,kl,entropy]": lambda m, be: rk.policy_loss(
        *_policy_inputs(m),
        clip_high=0.28,
        dual_clip=3.0,
        ref_logp=m.logp(B, T),
        kl_coef=0.01,
        entropy=m.randn(B, T, grad=True),
        entropy_coef=0.01,
        backend=be,
    ),
    "policy_loss[seq-mean-token-mean,is_weights]": lambda m, be: rk.policy_loss(
        *_policy_inputs(m),
        agg="seq-mean-token-mean",
        is_weights=m.randn(B, T, scale=0.1, shift=1.0),
        backend=be,
    ),
    "policy_loss[gspo]": lambda m, be: rk.policy_loss(
        *_policy_inputs(m), level="sequence", agg="seq-mean-token-mean", backend=be
    ),
    "policy_loss[cispo]": lambda m, be: rk.policy_loss(*_policy_inputs(m), objective="cispo", backend=be),
    "policy_loss[sapo,global num_tokens]": lambda m, be: rk.policy_loss(
        *_policy_inputs(m), objective="sapo", num_tokens=m.tensor(100.0), dp_size=2, backend=be
    ),
    "value_loss": lambda m, be: rk.value_loss(
        m.randn(B, T, grad=True), m.randn(B, T), m.randn(B, T), m.mask(B, T), backend=be
    ),
    "agg_loss[seq-mean-token-mean,global num_seqs]": lambda m, be: rk.agg_loss(
        m.randn(B, T, grad=True), m.mask(B, T), "seq-mean-token-mean", num_seqs=m.tensor(8.0), backend=be
    ),
    "group_advantages[size]": lambda m, be: rk.group_advantages(m.randn(12), group_size=3, backend=be),
    "group_advantages[ids,batch,mask]": lambda m, be: rk.group_advantages(
        m.randn(12), group_ids=m.ints(4, 12), mode="batch", mask=m.mask(12, 5), backend=be
    ),
    "group_advantages[ids,chunks]": lambda m, be: rk.group_advantages(  # past one chunk: the parallel path
        m.randn(3000), group_ids=m.ints(700, 3000), backend=be
    ),
    "group_advantages[rloo,bf16]": lambda m, be: rk.group_advantages(
        m.randn(12, dtype=torch.bfloat16), group_size=4, mode="rloo", backend=be
    ),
    "gae[whiten]": lambda m, be: rk.gae(
        m.randn(B, T), m.randn(B, T), m.mask(B, T), gamma=0.99, lam=0.95, whiten=True, backend=be
    ),
    "gae[packed]": lambda m, be: rk.gae(
        m.randn(B * T),
        m.randn(B * T),
        m.mask(B * T),
        cu_seqlens=m.tensor([0, 5, 5, 60, B * T], dtype=torch.int32),
        backend=be,
    ),
    "discounted_returns": lambda m, be: rk.discounted_returns(
        m.randn(B, T), m.mask(B, T), gamma=0.9, backend=be
    ),
    "grpo_passk_advantages": _estimator(rk.grpo_passk_advantages),
    "opo_advantages": _estimator(rk.opo_advantages),
    "grpo_passk_advantages[chunks]": lambda m, be: rk.grpo_passk_advantages(  # past one chunk
        m.randn(3000), m.mask(3000, 3, p=0.0), group_ids=m.ints(700, 3000), backend=be
    ),
    "opo_advantages[chunks]": lambda m, be: rk.opo_advantages(
        m.randn(3000), m.mask(3000, 3, p=0.0), group_ids=m.ints(700, 3000), backend=be
    ),
    "gpg_advantages": _estimator(rk.gpg_advantages),
    "reinforce_plus_plus_baseline_advantages": _estimator(rk.reinforce_plus_plus_baseline_advantages),
    "reinforce_plus_plus_advantages": _estimator(
        rk.reinforce_plus_plus_advantages, token_rewards=True, gamma=0.99
    ),
    "gdpo_advantages": lambda m, be: rk.gdpo_advantages(
        m.randn(B, 2), m.mask(B, T, p=0.0), group_ids=m.tensor([0, 0, 1, 1]), backend=be
    ),
    # reward weights as numbers (verl's gdpo_reward_weights): put on the device without a host sync
    "gdpo_advantages[weights]": lambda m, be: rk.gdpo_advantages(
        m.randn(B, 2), m.mask(B, T, p=0.0), group_ids=m.tensor([0, 0, 1, 1]), weights=[1.0, 0.5], backend=be
    ),
    "remax_advantages": lambda m, be: rk.remax_advantages(
        m.randn(B, T), m.mask(B, T, p=0.0), reward_baselines=m.randn(B), backend=be
    ),
    "optimal_token_baseline_advantages": lambda m, be: rk.optimal_token_baseline_advantages(
        m.randn(B, T),
        m.mask(B, T, p=0.0),
        group_ids=m.tensor([0, 0, 1, 1]),
        old_logp=m.logp(B, T),
        sum_pi_squared=m.randn(B, T).abs(),
        backend=be,
    ),
    "dynamic_sampling": lambda m, be: rk.dynamic_sampling(m.randn(12), group_size=3, backend=be),
    "trl_grpo_advantages": lambda m, be: rk.trl_grpo_advantages(m.randn(8), group_size=4, backend=be),
    "gdpo_advantages[chunks]": lambda m, be: rk.gdpo_advantages(
        m.randn(3000, 2), m.mask(3000, 3, p=0.0), group_ids=m.ints(700, 3000), backend=be
    ),
    "trl_grpo_advantages[normalize_then_sum]": lambda m, be: rk.trl_grpo_advantages(
        m.randn(B, 2),
        group_ids=m.tensor([0, 0, 1, 2]),
        reward_weights=[1.0, 0.5],
        multi_objective_aggregation="normalize_then_sum",
        backend=be,
    ),
    "trl_grpo_advantages[normalize_then_sum,group_size,chunks]": lambda m, be: rk.trl_grpo_advantages(
        m.randn(3000, 2),  # past one chunk: the chunk path in index order
        group_size=6,
        multi_objective_aggregation="normalize_then_sum",
        backend=be,
    ),
    "rollout_correction[token]": lambda m, be: rk.rollout_correction(
        m.logp(B, T), m.logp(B, T), m.mask(B, T), rejection="token_k3", rejection_max=0.5, backend=be
    ),
    "rollout_correction[sequence,mask]": lambda m, be: rk.rollout_correction(
        m.logp(B, T),
        m.logp(B, T),
        m.mask(B, T),
        level="sequence",
        mode="mask",
        rejection="seq_mean_k1",
        rejection_max=1.0,
        batch_normalize=True,
        backend=be,
    ),
    "dpo_loss": lambda m, be: rk.dpo_loss(
        m.randn(B, grad=True), m.randn(B, grad=True), m.randn(B), m.randn(B), beta=0.1, backend=be
    ),
    "overlong_penalty": lambda m, be: rk.overlong_penalty(
        m.ints(64, B), max_resp_len=64, buffer_len=16, backend=be
    ),
    "logprobs_from_logits": lambda m, be: rk.logprobs_from_logits(
        m.randn(N, V, grad=True), m.labels(V, N), temperature=0.7, return_entropy=True, backend=be
    ),
    # a causal LM's next-token logits: [B, T, V] rows at two strides, read in place
    "logprobs_from_logits[logits[:, :-1]]": lambda m, be: rk.logprobs_from_logits(
        m.randn(3, 11, V, grad=True)[:, :-1], m.labels(V, 3, 10), return_entropy=True, backend=be
    ),
    "logprobs_from_logits[top_k,top_p,sum_pi_squared]": lambda m, be: rk.logprobs_from_logits(
        m.randn(N, V, grad=True), m.labels(V, N), top_k=50, top_p=0.9, return_sum_pi_squared=True, backend=be
    ),
    "linear_logprobs[trainable head,entropy]": lambda m, be: rk.linear_logprobs(
        *_linear_inputs(m), bias=m.randn(V, grad=True), softcap=30.0, return_entropy=True, backend=be
    ),
    "linear_logprobs[bf16,chunked]": lambda m, be: rk.linear_logprobs(
        *_linear_inputs(m, dtype=torch.bfloat16), chunk_size=128, backend=be
    ),
    "linear_logprobs[frozen head]": lambda m, be: rk.linear_logprobs(
        *_linear_inputs(m, head_grad=False), temperature=0.8, backend=be
    ),
    "linear_logprobs[no grad]": lambda m, be: _no_grad(
        lambda: rk.linear_logprobs(*_linear_inputs(m), return_sum_pi_squared=True, backend=be)
    ),
    "linear_logprobs[tensor temperature,top_p]": lambda m, be: rk.linear_logprobs(
        *_linear_inputs(m), temperature=m.randn(N).abs() + 0.5, top_p=0.9, backend=be
    ),
    "linear_policy_loss[token,sweep]": lambda m, be: rk.linear_policy_loss(
        m.randn(B, 7, D, grad=True),
        m.randn(V, D, scale=0.2, grad=True),
        m.labels(V, B, 7),
        m.logp(B, 7),
        m.randn(B),
        m.mask(B, 7),
        entropy_coef=0.01,
        ref_logp=m.logp(B, 7),
        kl_coef=0.1,
        backend=be,
    ),
    "linear_policy_loss[gspo]": lambda m, be: rk.linear_policy_loss(
        m.randn(B, 7, D, grad=True),
        m.randn(V, D, scale=0.2, grad=True),
        m.labels(V, B, 7),
        m.logp(B, 7),
        m.randn(B),
        m.mask(B, 7),
        level="sequence",
        agg="seq-mean-token-mean",
        backend=be,
    ),
    "linear_preference_loss[sigmoid]": lambda m, be: rk.linear_preference_loss(
        m.randn(2 * B, 7, D, grad=True),
        m.randn(V, D, scale=0.2, grad=True),
        m.labels(V, 2 * B, 7),
        ref_logps=m.randn(2 * B),
        backend=be,
    ),
    # KTO's reference point given as a number: put on the device without a host sync
    "linear_preference_loss[kto,kl number]": lambda m, be: rk.linear_preference_loss(
        m.randn(B, 7, D, grad=True),
        m.randn(V, D, scale=0.2, grad=True),
        m.labels(V, B, 7),
        kind="kto",
        preference_labels=m.tensor([True, False, True, False]),
        kl=0.3,
        ref_logps=m.randn(B),
        backend=be,
    ),
}

# Host syncs a call may make on a GPU (at these sizes: one row block), with the reason; every other call
# makes none.
_DROPS_ROWS = (1, "the rows whose label is ignore_index are dropped before the first GEMM (nonzero)")
SYNC_BUDGET: dict[str, tuple[int, str]] = {
    "linear_policy_loss[token,sweep]": _DROPS_ROWS,
    "linear_preference_loss[sigmoid]": _DROPS_ROWS,
    "linear_preference_loss[kto,kl number]": _DROPS_ROWS,
    # the rollout's sampling options: the largest top_k of the block and the width of top_p's candidate
    # search are read per block (ops/sampling.py)
    "linear_logprobs[tensor temperature,top_p]": (2, "rows dropped, and top_p's search width per block"),
    "logprobs_from_logits[top_k,top_p,sum_pi_squared]": (
        3,
        "rows dropped, the block's largest top_k, top_p's search width",
    ),
}
SYNC_BUDGET["dynamic_sampling"] = (2, "the kept responses' count and the distinct ids (data-dependent sizes)")
# Calls whose outputs' sizes depend on the data: on fake tensors only their dtypes are compared.
SIZES_FROM_DATA = {"dynamic_sampling"}
# Calls that run eagerly only, not as one graph under torch.compile (docs/sampling.md), with the reason.
_SAMPLING = "the rollout's sampling options run eagerly (docs/sampling.md): data-dependent widths per block"
EAGER_ONLY: dict[str, str] = {
    "linear_logprobs[tensor temperature,top_p]": _SAMPLING,
    "logprobs_from_logits[top_k,top_p,sum_pi_squared]": _SAMPLING,
    "linear_preference_loss[sigmoid]": "drops ignored rows with a data-dependent nonzero",
    "linear_preference_loss[kto,kl number]": "drops ignored rows with a data-dependent nonzero",
    "dynamic_sampling": "its outputs' sizes depend on the data (which groups are kept)",
}


def _no_grad(fn):
    with torch.no_grad():
        return fn()
