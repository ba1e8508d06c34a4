"""rlkernels.trainers: each trainer runs and writes its log, curves and checkpoint; fused and eager log-probs
give the same first-step loss and gradients (error rule, float64 oracle); the update does not depend on the
micro-batch split or on the number of DDP ranks (2 gloo processes against 1, on the same global batch); with
a fixed seed the metric improves; bad configs raise, naming the option; the command line works, under
torchrun too."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
import torch.multiprocessing as mp
from oracle import assert_oracle

from rlkernels.reference.gae import masked_whiten

pytest.importorskip("transformers")
from rlkernels.trainers import TRAINERS, distributed  # noqa: E402
from rlkernels.trainers import cli as train_cli  # noqa: E402

ALGOS = ("grpo", "ppo", "dpo", "rm")
# Small shapes: a run of a few steps takes seconds.
SMALL = dict(vocab_size=512, hidden_size=32, num_layers=1, batch_size=8, micro_batch_size=8, steps=2,
             progress=False, save=False)  # fmt: skip
# epochs=1: one optimizer step per batch, so that learn() accumulates one gradient (the run test takes 2).
# DPO scores every training and held-out pair with the reference model before its first step: 64 + 32 pairs
# instead of the default 2048 + 256, which a run of 2 steps of 8 pairs never uses. With the defaults the
# run test took 16.7 s on 2 cores (1.9 s now), and it was the likely cause of its failure in a 16-worker run
# with a 90 s per-test limit on a GPU host.
PER_ALGO = {"grpo": dict(warmup_steps=2, group_size=4, epochs=1), "ppo": dict(warmup_steps=2, epochs=1),
            "dpo": dict(num_pairs=64, eval_pairs=32), "rm": {}}  # fmt: skip


def make(algo, **changes):
    cls = TRAINERS[algo]
    return cls(cls.config_class(**{**SMALL, **PER_ALGO[algo], **changes}))


def first_batch(algo, **changes) -> dict:
    """The batch of training step 1 (rollouts and their scores for RL, pairs with reference log-probs for
    DPO), made by a one-process trainer."""
    trainer = make(algo, **changes)
    trainer.before_training()
    batch, _ = trainer.make_batch(1)
    return batch


def cast(batch: dict, dtype) -> dict:
    return {k: v.to(dtype) if v.is_floating_point() else v for k, v in batch.items()}


def grads_after_learn(trainer, batch, dtype=torch.float32) -> dict:
    """The gradients one learn(batch) accumulates (no optimizer step, no clipping), in `dtype`."""
    trainer.model.to(dtype)
    batch = cast(batch, dtype)
    trainer.optimizer.step = lambda *a, **k: None
    trainer.optimizer.zero_grad = lambda *a, **k: None
    trainer.learn(batch)
    grads = {n: p.grad for n, p in trainer.model.named_parameters() if p.grad is not None}
    # FSDP2's gradients are sharded DTensors: gather them (a collective: every rank calls this)
    return {
        n: (g.full_tensor() if hasattr(g, "full_tensor") else g).detach().clone() for n, g in grads.items()
    }


@pytest.mark.parametrize("algo", ALGOS)
def test_trainer_runs_and_writes_its_files(algo, tmp_path):
    rl = dict(epochs=2) if algo in ("grpo", "ppo") else {}
    trainer = make(algo, out_dir=str(tmp_path), save=True, **rl)
    history = trainer.train()
    assert [r["step"] for r in history] == [1, 2]
    metric = "reward" if algo in ("grpo", "ppo") else "accuracy"
    for r in history:
        for key in (metric, "loss", "seconds", "tokens_per_s", "peak_mib"):
            assert isinstance(r[key], float) and torch.isfinite(torch.tensor(r[key])), (key, r)
    if algo in ("grpo", "ppo"):
        assert all(0 < r["entropy"] and r["kl"] >= 0 for r in history)
    else:
        assert history[0]["eval_accuracy"] is not None and history[-1]["eval_accuracy"] is not None
    name = trainer.run_name
    lines = (tmp_path / f"{name}.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == history
    assert (tmp_path / f"{name}.png").stat().st_size > 10_000
    assert (tmp_path / f"{name}-model" / "config.json").exists()
    assert (tmp_path / f"{name}-model" / "scalar_head.pt").exists() == (algo in ("ppo", "rm"))


@pytest.mark.parametrize("algo", ("grpo", "ppo", "dpo"))
def test_fused_and_eager_first_step(algo):
    """The first step's loss and gradients (every parameter) of the fused path against the eager logits in
    fp32, with the eager path in float64 as the oracle."""
    batch = first_batch(algo, beta=0.05) if algo == "grpo" else first_batch(algo)
    runs = {}
    for name, mode, dtype in (("fused", "fused", torch.float32), ("eager", "eager", torch.float32),
                              ("oracle", "eager", torch.float64)):  # fmt: skip
        trainer = make(algo, logprobs=mode)
        trainer.model.to(dtype)
        loss, _, _ = trainer.loss_fn(cast(batch, dtype))(cast(batch, dtype))
        loss.backward()
        grads = {n: p.grad for n, p in trainer.model.named_parameters() if p.grad is not None}
        runs[name] = (loss.detach(), grads)
    (loss_f, grads_f), (loss_e, grads_e), (loss_o, grads_o) = runs.values()
    assert grads_f.keys() == grads_e.keys() == grads_o.keys() and len(grads_o) > 5
    assert float(loss_o) != 0.0 and max(float(g.abs().max()) for g in grads_o.values()) > 0
    assert_oracle("loss", loss_f, loss_e, loss_o)
    for name in grads_o:
        assert_oracle(f"d {name}", grads_f[name], grads_e[name], grads_o[name])


def one_process_grads(algo, batch) -> tuple[dict, dict]:
    """The whole batch's gradients in one micro-batch: fp32 (the reference) and float64 (the oracle)."""
    ref = grads_after_learn(make(algo, micro_batch_size=8, max_grad_norm=0), batch)
    oracle = grads_after_learn(make(algo, micro_batch_size=8, max_grad_norm=0), batch, torch.float64)
    assert ref.keys() == oracle.keys() and max(float(g.abs().max()) for g in oracle.values()) > 0
    return ref, oracle


def assert_same_update(got: dict, ref: dict, oracle: dict) -> None:
    """The error rule per parameter: a different summation order (micro-batches, ranks) is fp32 rounding."""
    assert got.keys() == oracle.keys()
    for name in oracle:
        assert_oracle(f"d {name}", got[name], ref[name], oracle[name])


@pytest.mark.parametrize("algo", ALGOS)
def test_update_does_not_depend_on_the_micro_batch_split(algo):
    """Micro-batches of 3, 3 and 2 sequences (or pairs) against the whole batch at once."""
    batch = first_batch(algo)
    split = grads_after_learn(make(algo, micro_batch_size=3, max_grad_norm=0), batch)
    assert_same_update(split, *one_process_grads(algo, batch))


def _ddp_worker(rank, world, store, algo, parallel, batch_path, out_path):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world))
    if parallel == "fsdp":  # as on a GPU host: FSDP's default mesh would be CUDA's (see the test below)
        torch._C._get_accelerator = lambda: torch.device("cuda")
    torch.distributed.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    batch = torch.load(batch_path)
    rows = next(iter(batch.values())).shape[0] // world
    mine = {k: v[rank * rows : (rank + 1) * rows] for k, v in batch.items()}
    trainer = make(algo, micro_batch_size=3, max_grad_norm=0, fsdp=parallel == "fsdp")
    assert trainer.dist.world == world and trainer.local_batch == rows
    if algo == "ppo":  # the advantages are whitened over every rank's tokens (verl's masked_whiten)
        values = batch["returns"].double()
        want = masked_whiten(values, batch["mask"])[rank * rows : (rank + 1) * rows]
        torch.testing.assert_close(
            trainer.whiten(values[rank * rows : (rank + 1) * rows], mine["mask"]), want
        )
    grads = grads_after_learn(trainer, mine)
    if rank == 0:
        torch.save(grads, out_path)
    distributed.teardown()  # as the command line ends a rank: a barrier, and an exit without finalization


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
@pytest.mark.parametrize("algo", ALGOS)
def test_two_processes_give_the_one_process_update(algo, parallel, tmp_path):
    """Each of 2 gloo ranks takes half of the global batch (GRPO: whole groups); the gradient DDP averages
    (or FSDP2 reduce-scatters, gathered here) equals one process's gradient of the whole batch."""
    batch = first_batch(algo)
    torch.save(batch, tmp_path / "batch.pt")
    args = (
        2,
        str(tmp_path / "store"),
        algo,
        parallel,
        str(tmp_path / "batch.pt"),
        str(tmp_path / "grads.pt"),
    )
    mp.spawn(_ddp_worker, args=args, nprocs=2, join=True)
    assert_same_update(torch.load(tmp_path / "grads.pt"), *one_process_grads(algo, batch))


def _fsdp_device_worker(rank, store):
    from torch.distributed.fsdp import FSDPModule

    calls = []
    real = torch.distributed.fsdp.fully_shard

    def spy(module, **kwargs):
        calls.append(kwargs.get("mesh"))
        return real(module, **kwargs)

    trainer = make("rm")
    trainer.before_training()
    batch, _ = trainer.make_batch(1)
    torch._C._get_accelerator = lambda: torch.device("cuda")
    torch.distributed.fsdp.fully_shard = spy
    torch.distributed.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=1)
    distributed.shard(trainer.model)
    assert isinstance(trainer.model, FSDPModule) and len(calls) == SMALL["num_layers"] + 1
    assert all(mesh is not None and mesh.device_type == "cpu" for mesh in calls), calls
    loss, _, _ = trainer.loss_fn(batch)(batch)
    loss.backward()
    params = list(trainer.model.parameters())
    assert all(p.to_local().device.type == "cpu" for p in params)
    assert all(p.grad is not None and p.grad.to_local().device.type == "cpu" for p in params)
    distributed.teardown()  # FSDP keeps the group and its threads: no finalization (docs/trainers.md)


def test_fsdp_keeps_the_model_on_the_trainers_device(tmp_path):
    """On a host with an accelerator, fully_shard without a mesh builds one on the accelerator and moves the
    parameters there, while a CPU trainer's batches and gloo group stay on the CPU (the two-process FSDP
    cases failed so on a GPU host). Here torch is told that CUDA is the host's accelerator (the device
    fully_shard's default mesh asks for): shard() must give every fully_shard call a mesh of the trainer's
    device type, the parameters and gradients stay on the CPU, and a step's forward and backward run. In a
    process of its own, a world of one: the group FSDP holds would otherwise keep its threads running into
    this process's exit."""
    mp.spawn(_fsdp_device_worker, args=(str(tmp_path / "store"),), nprocs=1, join=True)


@pytest.mark.parametrize(
    "algo, changes, error, match",
    [
        ("grpo", dict(group_size=3), ValueError, "group_size"),
        ("grpo", dict(loss_type="vespo"), ValueError, "loss_type"),
        ("grpo", dict(context_length=8), ValueError, "context_length"),
        ("ppo", dict(epochs=0), ValueError, "epochs"),
        ("dpo", dict(kind="kto"), ValueError, "kind"),
        ("rm", dict(logprobs="eager"), ValueError, "logprobs"),
        ("rm", dict(task="copy"), ValueError, "task"),
        ("dpo", dict(micro_batch_size=0), ValueError, "micro_batch_size"),
        ("rm", dict(eval_every=0), ValueError, "eval_every"),
        ("dpo", dict(num_pairs=0), ValueError, "num_pairs"),
    ],
)
def test_bad_config_raises(algo, changes, error, match):
    with pytest.raises(error, match=match):
        make(algo, **changes)


def test_config_of_another_trainer_raises():
    with pytest.raises(TypeError, match="GRPOConfig"):
        TRAINERS["grpo"](TRAINERS["ppo"].config_class())


@pytest.mark.parametrize("bad", [lambda p, c: [0.0] * (len(c) - 1), lambda p, c: [float("nan")] * len(c)])
def test_reward_function_is_checked(bad):
    cls = TRAINERS["grpo"]
    trainer = cls(cls.config_class(**{**SMALL, **PER_ALGO["grpo"]}), reward_fn=bad)
    with pytest.raises(ValueError, match="reward_fn"):
        trainer.train()


def test_ppo_with_a_trained_reward_model():
    """A trained reward model's as_reward_fn() as PPO's score: it rates the right answer above its near
    miss, and PPO runs on it."""
    rm = make("rm", steps=40, vocab_size=2048)
    rm.train()
    reward = rm.as_reward_fn()
    scores = reward(["dbca=", "dbca="], ["abcd", "abdc"])
    assert scores.shape == (2,) and scores.dtype == torch.float32 and scores[0] > scores[1]
    history = TRAINERS["ppo"](
        TRAINERS["ppo"].config_class(**{**SMALL, **PER_ALGO["ppo"]}), reward_fn=reward
    ).train()
    assert len(history) == 2 and all(torch.isfinite(torch.tensor(r["reward"])) for r in history)


def test_unknown_algo_on_the_command_line():
    with pytest.raises(SystemExit, match="--algo must be one of"):
        train_cli.main("sft", [])


TINY_FLAGS = ["--steps", "2", "--vocab-size", "512", "--hidden-size", "32", "--num-layers", "1",
              "--batch-size", "8", "--micro-batch-size", "4", "--no-progress"]  # fmt: skip


def test_command_line_compares_fused_and_eager(tmp_path, capsys):
    flags = [*TINY_FLAGS, "--warmup-steps", "1", "--group-size", "4", "--logprobs", "both"]
    assert train_cli.main("grpo", [*flags, "--out-dir", str(tmp_path)]) == 0
    table = capsys.readouterr().out
    assert "| fused |" in table and "| eager |" in table and "MiB" in table
    assert "| fused |" in (tmp_path / "compare.md").read_text()
    assert (tmp_path / "compare.png").stat().st_size > 10_000
    for mode in ("fused", "eager"):
        assert len((tmp_path / f"grpo-sort-{mode}.jsonl").read_text().splitlines()) == 2
        assert (tmp_path / f"grpo-sort-{mode}-model" / "config.json").exists()


def _ranks_stderr(log_dir) -> str:
    """Each rank's stderr as torchrun's --redirects wrote it: from the fault handler's report on, when there
    is one (the abort's stacks), else its last lines."""
    parts = []
    for path in sorted(log_dir.rglob("stderr.log")):
        text = path.read_text(errors="replace")
        start = text.find("Fatal Python error")
        parts.append(f"--- {path.relative_to(log_dir)}\n" + (text[start:] if start >= 0 else text[-1500:]))
    return "\n".join(parts) + "\n--- torchrun\n"


@pytest.mark.slow
@pytest.mark.parametrize(
    "algo, flags", [("dpo", []), ("grpo", ["--fsdp", "--warmup-steps", "1", "--group-size", "4"])]
)
def test_command_line_under_torchrun(algo, flags, tmp_path):
    """`torchrun --nproc-per-node 2 -m rlkernels train ...` on CPU (gloo), with DDP, and with FSDP2 through
    generation, the reference model and the checkpoint: one log and one checkpoint, written by rank 0."""
    # --redirects 2: each rank's stderr goes to its own file under --log-dir, which a failure reports whole;
    # PYTHONFAULTHANDLER: a rank that aborts (the exit abort, docs/trainers.md) writes its threads' stacks
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "--log-dir", str(tmp_path / "ranks"), "--redirects", "2", "-m",
           "rlkernels", "train", "--algo", algo, *TINY_FLAGS, *flags, "--out-dir", str(tmp_path)]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, _ranks_stderr(tmp_path / "ranks") + done.stderr[-2000:]
    records = [json.loads(line) for line in (tmp_path / f"{algo}-sort-fused.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in records)
    assert (tmp_path / f"{algo}-sort-fused-model" / "config.json").exists()
    assert "| fused |" in done.stdout


@pytest.mark.slow
@pytest.mark.parametrize("algo", ALGOS)
def test_the_metric_improves(algo):
    """A fixed seed and the default hyper-parameters on the default task ('sort') with an 8192-token
    vocabulary: RL raises the mean reward (last 10 steps against the first 10; the warm start has made the
    policy partly right), DPO and the reward model raise the preference accuracy on held-out prompts."""
    cls = TRAINERS[algo]
    steps = 40
    history = cls(cls.config_class(vocab_size=8192, steps=steps, progress=False, save=False)).train()
    if algo in ("grpo", "ppo"):
        rewards = [r["reward"] for r in history]
        first, last = sum(rewards[:10]) / 10, sum(rewards[-10:]) / 10
        assert last > first + 0.08, (first, last)
    else:
        accuracy = [r["eval_accuracy"] for r in history if r.get("eval_accuracy") is not None]
        assert accuracy[-1] >= 0.9 and accuracy[-1] > accuracy[0] + 0.2, accuracy
