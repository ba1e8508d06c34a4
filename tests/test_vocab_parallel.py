"""linear_logprobs / linear_policy_loss with process_group: the vocabulary split unevenly over 2 and 3 gloo
processes on the CPU; each rank's logp / entropy, d hidden and its slice of d weight / d bias against the
unsharded call (the float64 reference under the oracle rule), and the errors every rank raises alike.

One spawn per world size; the workers run every case and raise on the first mismatch (torch.multiprocessing
re-raises it here with the worker's traceback)."""

import math
import os
import sys
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from oracle import ATOL, assert_oracle, cpu_kernel_backends

import rlkernels as rk
from rlkernels.reference.logprobs import transform_logits

V, D, N = 37, 16, 29
# Uneven splits of V: no world size divides 37.
SPLITS = {2: [30, 7], 3: [5, 20, 12]}
DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
OPTIONS = {
    "plain": dict(),
    "entropy+temperature+chunks": dict(temperature=0.7, return_entropy=True, chunk_size=8),
    "all": dict(temperature=1.3, softcap=8.0, bias=True, return_entropy=True),
    # Logits of magnitude ~1e3: most ranks' share w_r of the probability mass underflows to 0. The unsharded
    # fp32 kernels miss the oracle rule on d hidden here (3e-3 where the rule allows 1e-3), so the error
    # allowed is twice the unsharded kernel's own (vs_kernel) rather than twice the reference's. Not run on
    # the reference backend: its sharded form has the kernels' accuracy there (the ranks' lse are exchanged
    # in fp32), not the unsharded reference's.
    "huge": dict(scale=300.0, bias=True, return_entropy=True, vs_kernel=True),
}


def _case(dtype, split, *, bias, seed=0, scale=3.0):
    """hidden [N, D], weight [V, D], bias [V] or None (all rounded to dtype), labels [N] with every fourth
    row ignored, the first rows labelled with the first id of each shard, some with their argmax token;
    identical on every rank (a seeded CPU generator)."""
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(N, D, dtype=torch.float64, generator=gen)
    weight = torch.randn(V, D, dtype=torch.float64, generator=gen) * (scale / math.sqrt(D))
    b = torch.randn(V, dtype=torch.float64, generator=gen) if bias else None
    labels = torch.randint(0, V, (N,), generator=gen)
    labels[2::5] = (hidden @ weight.T)[2::5].argmax(-1)
    starts = [sum(split[:r]) for r in range(len(split))]
    labels[1 : 1 + len(split)] = torch.tensor(starts)
    labels[0::4] = -100
    labels[-1] = V - 1
    cast = lambda t: None if t is None else t.to(dtype)
    return cast(hidden), cast(weight), cast(b), labels


def _run(hidden, weight, bias, labels, g_logp, g_ent, **kw):
    """(logp, entropy or None, d hidden, d weight, d bias or None) of Σ g_logp·logp + Σ g_ent·entropy."""
    leaves = [None if t is None else t.detach().clone().requires_grad_() for t in (hidden, weight, bias)]
    h, w, b = leaves
    out = rk.linear_logprobs(h, w, labels, bias=b, **kw)
    logp, ent = out if kw.get("return_entropy") else (out, None)
    loss = (logp * g_logp).sum() + ((ent * g_ent).sum() if ent is not None else 0.0)
    grads = iter(torch.autograd.grad(loss, [t for t in leaves if t is not None]))
    return (logp, ent) + tuple(None if t is None else next(grads) for t in leaves)


def _check_logprobs(backend, dtype, option, group, split):
    rank = dist.get_rank(group)
    lo, hi = sum(split[:rank]), sum(split[: rank + 1])
    kw = dict(OPTIONS[option])
    hidden, weight, bias, labels = _case(dtype, split, bias=kw.pop("bias", False), scale=kw.pop("scale", 3.0))
    baseline = backend if kw.pop("vs_kernel", False) else "reference"
    gen = torch.Generator().manual_seed(1)
    g_logp, g_ent = torch.randn(N, dtype=torch.float64, generator=gen), torch.randn(N, generator=gen)
    shard_b = None if bias is None else bias[lo:hi]
    got = _run(hidden, weight[lo:hi], shard_b, labels, g_logp, g_ent, backend=backend, process_group=group,
               **kw)  # fmt: skip
    same = _run(hidden, weight, bias, labels, g_logp, g_ent, backend=baseline, **kw)
    as64 = lambda t: None if t is None else t.double()
    oracle = _run(as64(hidden), as64(weight), as64(bias), labels, g_logp, g_ent, backend="reference", **kw)
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    z = transform_logits(F.linear(*(as64(t) for t in (hidden, weight, bias))), kw.get("temperature", 1.0),
                         kw.get("softcap"))  # fmt: skip
    lse_scale = max(1.0, float(torch.logsumexp(z, -1).abs().max()))
    assert got[0].dtype == acc and got[0].shape == (N,)
    ignored = labels == -100
    assert (got[0][ignored] == 0).all() and (got[2][ignored] == 0).all()
    # Every rank computes the outputs from the same gathered statistics: bitwise equal across ranks.
    peers = [torch.empty_like(got[0]) for _ in split]
    dist.all_gather(peers, got[0], group=group)
    assert all(torch.equal(p, got[0]) for p in peers), "logp differs between ranks"
    names = ("logp", "entropy", "d hidden", "d weight", "d bias")
    slices = (slice(None), slice(None), slice(None), slice(lo, hi), slice(lo, hi))
    for name, o, s, r, sl in zip(names, got, same, oracle, slices, strict=True):
        if r is None:
            assert o is None, name
            continue
        if name.startswith("d "):
            assert o.dtype == dtype, name
        where = f"rank {rank}/{len(split)} {backend}/{dtype}/{option}/{name}"
        # The entropy is combined from the ranks' lse_r, each rounded to fp32 (fp64): its error is bounded
        # in ulps of |lse|, not of |entropy| as unsharded (docs/vocab_parallel.md).
        atol = ATOL[acc] * lse_scale if name == "entropy" else None
        assert_oracle(where, o, s[sl], r[sl], atol=atol, dtype=dtype if name.startswith("d ") else None)


def _check_policy_loss(backend, group, split):
    rank = dist.get_rank(group)
    lo, hi = sum(split[:rank]), sum(split[: rank + 1])
    hidden, weight, bias, labels = _case(torch.float64, split, bias=True)
    gen = torch.Generator().manual_seed(2)
    B, T = 1, N
    old = torch.randn(B, T, dtype=torch.float64, generator=gen) * 0.2 - 2.5
    adv = torch.randn(B, dtype=torch.float64, generator=gen)
    mask = torch.rand(B, T, generator=gen) > 0.2
    kw = dict(temperature=0.7, softcap=6.0, entropy_coef=0.01, dual_clip=3.0, backend=backend)

    def loss_and_grads(w, b, **extra):
        h = hidden.view(B, T, D).clone().requires_grad_()
        w, b = w.clone().requires_grad_(), b.clone().requires_grad_()
        loss, stats = rk.linear_policy_loss(h, w, labels.view(B, T), old, adv, mask, bias=b, **kw, **extra)
        return (loss, stats["entropy"]) + torch.autograd.grad(loss, (h, w, b))

    got = loss_and_grads(weight[lo:hi], bias[lo:hi], process_group=group)
    want = loss_and_grads(weight, bias)
    want = want[:3] + (want[3][lo:hi], want[4][lo:hi])
    for name, g, w in zip(("loss", "entropy", "d hidden", "d weight", "d bias"), got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12, msg=lambda m, name=name: f"{name}: {m}")


def _check_frozen_head_int32(backend, group, split):
    """int32 labels, a frozen weight (only d hidden and d bias), and no_grad: as the unsharded call."""
    rank = dist.get_rank(group)
    lo, hi = sum(split[:rank]), sum(split[: rank + 1])
    hidden, weight, bias, labels = _case(torch.float64, split, bias=True, seed=3)
    kw = dict(softcap=4.0, temperature=0.9, return_entropy=True)
    outs = []
    for w, b, extra in (
        (weight[lo:hi], bias[lo:hi], dict(process_group=group, backend=backend)),
        (weight, bias, {}),
    ):
        h, b = hidden.clone().requires_grad_(), b.clone().requires_grad_()
        logp, ent = rk.linear_logprobs(h, w, labels.int(), bias=b, **kw, **extra)
        with torch.no_grad():
            again = rk.linear_logprobs(h, w, labels.int(), bias=b, **kw, **extra)
        assert torch.equal(again[0], logp) and not again[0].requires_grad
        outs.append((logp, ent) + torch.autograd.grad((logp * 0.5 - ent).sum(), (h, b)))
    got, want = outs
    want = want[:3] + (want[3][lo:hi],)
    for name, g, w in zip(("logp", "entropy", "d hidden", "d bias"), got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12, msg=lambda m, name=name: f"{name}: {m}")


def _check_sum_pi_squared(backend, dtype, group, split):
    """Σπ² = Σ_r w_r² Σπ²_r from the gathered shard statistics, against the unsharded float64 reference
    (ordinary logits, and logits of magnitude ~1e3 where most ranks' w_r underflow), with entropy and
    without."""
    rank = dist.get_rank(group)
    lo, hi = sum(split[:rank]), sum(split[: rank + 1])
    for scale, return_entropy in ((3.0, True), (300.0, False)):
        hidden, weight, bias, labels = _case(dtype, split, bias=True, seed=4, scale=scale)
        kw = dict(temperature=0.8, softcap=30.0, return_entropy=return_entropy, return_sum_pi_squared=True)
        *_, got = rk.linear_logprobs(hidden, weight[lo:hi], labels, bias=bias[lo:hi], backend=backend,
                                     process_group=group, **kw)  # fmt: skip
        *_, same = rk.linear_logprobs(hidden, weight, labels, bias=bias, backend="reference", **kw)
        h64, w64, b64 = (t.double() for t in (hidden, weight, bias))
        *_, want = rk.linear_logprobs(h64, w64, labels, bias=b64, backend="reference", **kw)
        assert not got.requires_grad and (got[labels == -100] == 0).all()
        assert_oracle(f"rank {rank} {backend}/{dtype}/scale {scale} sum_pi_squared", got, same, want)


def _check_errors(group, split):
    rank = dist.get_rank(group)
    lo, hi = sum(split[:rank]), sum(split[: rank + 1])
    hidden, weight, _, labels = _case(torch.float32, split, bias=False)
    shard = weight[lo:hi]
    bad = labels.clone()
    bad[3] = V  # one past the global vocabulary (but a valid id of no shard)
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 37\)"):
        rk.linear_logprobs(hidden, shard, bad, backend="cpu", process_group=group)
    with pytest.raises(ValueError, match="hidden must be"):
        rk.linear_logprobs(hidden, torch.randn(hi - lo, D + 1), labels, process_group=group)
    # D differing between ranks (rank 0 drops a column): caught on every rank by the shape all_gather.
    h, w = (hidden[:, :-1], shard[:, :-1]) if rank == 0 else (hidden, shard)
    with pytest.raises(ValueError, match="share D"):
        rk.linear_logprobs(h, w, labels, backend="cpu", process_group=group)
    # process_group=None is today's call: a shard with global labels is out of range.
    if hi - lo < V:
        with pytest.raises(ValueError, match="labels must lie"):
            rk.linear_logprobs(hidden, shard, labels, backend="cpu")


def _worker(rank, world, init_file, backends):
    # A bounded timeout: a rank that fails before a collective must not leave the others waiting forever.
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world, timeout=timedelta(minutes=5)
    )
    try:
        group = dist.group.WORLD
        split = SPLITS[world]
        for backend in backends:
            dtypes = DTYPES if backend != "triton" else (torch.float32,)  # the interpreter is slow
            for dtype in dtypes:
                for option in OPTIONS:
                    if option == "huge" and backend == "reference":
                        continue
                    _check_logprobs(backend, dtype, option, group, split)
                if dtype in (torch.float32, torch.float64):
                    _check_sum_pi_squared(backend, dtype, group, split)
        _check_policy_loss(backends[0], group, split)
        _check_frozen_head_int32(backends[0], group, split)
        _check_errors(group, split)
        # A subgroup: ranks 1.. of a 3-process world, with the split of 2 ranks.
        if world == 3:
            sub = dist.new_group([1, 2])
            if rank in (1, 2):
                _check_logprobs(backends[0], torch.float64, "all", sub, SPLITS[2])
        # Every rank done before any tears its connections down: a rank that exits while the others still
        # talk (rank 0 skips the subgroup case) can make gloo abort them (seen as SIGABRT in a worker).
        dist.barrier()
        # The barrier alone still let that happen (1 CI run in ~5): a rank can return from it while a peer
        # is still receiving its last message. Each rank marks its return in a file and waits, outside
        # gloo, until every rank has returned.
        _all_returned(init_file, rank, world)
    finally:
        dist.destroy_process_group()
    # Every check passed: leave without the interpreter's teardown. With both fixes above, a worker still
    # died once in CI after its last check ("terminate called without an active exception", SIGABRT): a
    # native thread destroyed while joinable during exit. A failed check raises before this line, and
    # mp.spawn reports it with its traceback as before.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _all_returned(init_file: str, rank: int, world: int, timeout_s: float = 120.0) -> None:
    """File rendezvous: this rank has left its last collective; wait until every rank has."""
    import pathlib
    import time

    pathlib.Path(f"{init_file}.returned.{rank}").touch()
    deadline = time.monotonic() + timeout_s
    while not all(pathlib.Path(f"{init_file}.returned.{r}").exists() for r in range(world)):
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank {rank}: not every rank returned from the final barrier")
        time.sleep(0.01)


BACKENDS = [str(b) for b in cpu_kernel_backends() if b.name in ("cpu", "triton-interpret")]


@pytest.mark.slow  # 2 and 3 spawned processes
@pytest.mark.parametrize("world", [2, 3])
def test_sharded_matches_unsharded(world, tmp_path):
    backends = BACKENDS + ["reference"]
    os.environ.setdefault("TRITON_INTERPRET", "1")  # the workers' Triton runs on CPU tensors too
    mp.spawn(_worker, args=(world, str(tmp_path / "store"), backends), nprocs=world, join=True)
