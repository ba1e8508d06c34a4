"""rlkernels.integrations.trl_grpo against the installed TRL (the `[integrations]` extra): its stand-in for
TRL's fused LM head by the error rule; TRL's GRPOTrainer run for a few steps on a tiny causal LM (CPU, a
reward function, no vLLM) with and without the adapter, every mapped loss_type: the same per-step losses
and gradients; vespo's vLLM IS ratio through TRL's own _compute_loss; unsupported options raise, naming
them."""

import pytest
import torch
from oracle import assert_oracle

import rlkernels as rk
from rlkernels.memory import cpu_peak_bytes

trl = pytest.importorskip("trl", reason="TRL is installed by the [integrations] extra (README)")
datasets = pytest.importorskip("datasets")
transformers = pytest.importorskip("transformers")
from tokenizers import Tokenizer, models, pre_tokenizers  # noqa: E402
from trl.trainer import utils as trl_utils  # noqa: E402

from rlkernels.integrations import trl_grpo  # noqa: E402

TRL_FUSED_HEAD = trl_utils._ChunkedLogProbFunction


@pytest.fixture(autouse=True)
def restore_trl(monkeypatch):
    """install_logprobs() patches TRL process-wide: undo it after each test."""
    monkeypatch.setattr(trl_utils, "_ChunkedLogProbFunction", TRL_FUSED_HEAD)


def test_pinned_version():
    assert trl.__version__ == trl_grpo.TRL_VERSION


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_fused_head_stand_in(dtype):
    """LinearLogProbs.apply with TRL's arguments (bias, softcap, logit scale, temperature, every output it
    computes): TRL's own function at the same dtype is the reference, the float64 spec the oracle."""
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(40, 24, dtype=torch.float64, generator=gen)
    weight = torch.randn(301, 24, dtype=torch.float64, generator=gen) * 0.3
    bias = torch.randn(301, dtype=torch.float64, generator=gen) * 0.1
    targets = torch.randint(0, 301, (40,), generator=gen)
    g_logp, g_ent = torch.randn(2, 40, dtype=torch.float64, generator=gen)
    args = (0.8, 128, 9.0, 1.3, ("log_probs", "entropy", "log_sum_sq_probs"))

    def run(fn, dt):
        h, w, b = (t.to(dt).requires_grad_() for t in (hidden, weight, bias))
        logp, ent, log_sq, *rest = fn(h, w, b, targets, *args)
        assert rest == [None, None] or fn is not trl_grpo.LinearLogProbs.apply
        loss = (logp * g_logp.to(logp.dtype)).sum() + (ent * g_ent.to(ent.dtype)).sum()
        return (logp, ent, log_sq, *torch.autograd.grad(loss, [h, w, b]))

    def spec(h, w, b, y, temperature, _chunk, softcap, scale, _outputs):
        logp, ent, sq = rk.linear_logprobs(
            h * scale, w, y, bias=b * scale, temperature=temperature, softcap=softcap, return_entropy=True,
            return_sum_pi_squared=True, backend="reference",
        )  # fmt: skip
        return logp, ent, sq.log()

    got = run(trl_grpo.LinearLogProbs.apply, dtype)
    same = run(TRL_FUSED_HEAD.apply, dtype)
    want = run(spec, torch.float64)
    names = ("log_probs", "entropy", "log_sum_sq_probs", "d hidden", "d weight", "d bias")
    for name, o, s, r in zip(names, got, same, want, strict=True):
        assert_oracle(
            name, o, s, r, dtype=torch.float32 if name.startswith("log") or name == "entropy" else None
        )


def test_unknown_output_raises():
    h, w, y = torch.randn(3, 4), torch.randn(7, 4), torch.zeros(3, dtype=torch.long)
    with pytest.raises(ValueError, match="is_top1"):
        trl_grpo.LinearLogProbs.apply(h, w, None, y, 1.0, 8, None, 1.0, ("log_probs", "is_top1"))


def _tokenizer():
    chars = list("abcdefghijklmnopqrstuvwxyz0123456789 +=?")
    vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2, **{c: i + 3 for i, c in enumerate(chars)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    hf = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>"
    )
    hf.padding_side = "left"
    return hf


class _Grads(transformers.TrainerCallback):
    def __init__(self):
        self.grads = []

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        self.grads.append(
            {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
        )


def _model_dir(tmp_path, tokenizer):
    """A tiny Qwen2 saved under tmp_path (a path, so that TRL can load the reference model from it)."""
    model_dir = tmp_path / "model"
    if not model_dir.exists():
        torch.manual_seed(0)
        config_lm = transformers.Qwen2Config(
            vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
            num_attention_heads=4, num_key_value_heads=2, pad_token_id=0, eos_token_id=1, bos_token_id=2,
        )  # fmt: skip
        transformers.Qwen2ForCausalLM(config_lm).save_pretrained(model_dir)
    return model_dir


def _reward(completions, **kwargs):  # even digits are rewarded: varied rewards within a group
    return [float(sum(ch in "02468" for ch in c)) for c in completions]


def _train(trainer_cls, tmp_path, **config):
    """(per-step logged losses, per-step gradients) of 3 optimizer steps: 2 accumulation steps, 2 passes
    over each generation batch, in fp32 (bf16=False: TRL's head would otherwise run its GEMMs in bf16).
    Plain SGD (lr 0.3), not Adam: Adam's first step moves every weight by about ±lr whatever its gradient's
    size, so a weight whose gradient is 0 up to fp32 rounding moves by +lr in one run and -lr in the other,
    and the later steps' gradients differ by more than rounding (with transformers 5.24 one dr_grpo weight
    did, at 1.7e-6 of the largest gradient, and which weight depends on the thread count). SGD's step is
    linear in the gradient: every case then agrees to 8e-8 of the largest gradient at every step, and the
    second pass over a batch still clips a quarter to a half of its tokens (at lr 1 vespo's off-policy mask
    dropped nearly every token of it).
    """
    tokenizer = _tokenizer()
    model_dir = _model_dir(tmp_path, tokenizer)
    prompts = datasets.Dataset.from_dict({"prompt": ["1+1=", "2+3=", "4+4=", "5+1="] * 2})
    args = trl.GRPOConfig(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, num_generations=4,
        max_completion_length=8, max_steps=3, logging_steps=1, report_to=[], use_cpu=True, bf16=False,
        save_strategy="no", seed=0, gradient_accumulation_steps=2, num_iterations=2, learning_rate=0.3,
        optim="sgd",
        **config,
    )  # fmt: skip
    grads = _Grads()
    trainer = trainer_cls(
        model=str(model_dir), reward_funcs=_reward, args=args, train_dataset=prompts,
        processing_class=tokenizer, callbacks=[grads],
    )  # fmt: skip
    trainer.train()
    return [h["loss"] for h in trainer.state.log_history if "loss" in h], grads.grads


LOSS_CASES = {
    "dapo": dict(loss_type="dapo"),
    "grpo + k3 KL (bias-corrected, TRL's default)": dict(loss_type="grpo", beta=0.04),
    "grpo + k3 KL, sequence level": dict(
        loss_type="grpo", beta=0.04, importance_sampling_level="sequence", use_bias_correction_kl=False
    ),  # fmt: skip
    "dr_grpo + entropy bonus": dict(loss_type="dr_grpo", entropy_coef=0.01),
    "bnpo + top-entropy tokens + delta": dict(loss_type="bnpo", top_entropy_quantile=0.5, delta=1.5),
    "cispo": dict(loss_type="cispo", epsilon_high=5.0),
    "luspo, sequence level": dict(loss_type="luspo", importance_sampling_level="sequence"),
    "sapo + off-policy mask": dict(loss_type="sapo", off_policy_mask_threshold=1e-4),
    "vespo + top-entropy tokens + off-policy mask": dict(
        loss_type="vespo", top_entropy_quantile=0.5, off_policy_mask_threshold=1e-4
    ),
    # TRL warns that vespo builds its own weight; the level still sets the KL's importance ratio.
    "vespo + k3 KL (bias-corrected), sequence level, top-entropy tokens": dict(
        loss_type="vespo", beta=0.04, importance_sampling_level="sequence", top_entropy_quantile=0.5
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(LOSS_CASES))
def test_grpo_trainer_with_and_without_the_adapter(case, tmp_path):
    """The same completions (same seed), so the same per-step losses and gradients: TRL's fused head and loss
    against rk.linear_logprobs and rk.policy_loss, both in fp32, agree to fp32 rounding (the op-level error
    rule is test_fused_head_stand_in's and the policy-loss tests')."""
    want_losses, want_grads = _train(trl.GRPOTrainer, tmp_path, **LOSS_CASES[case])
    got_losses, got_grads = _train(trl_grpo.GRPOTrainer, tmp_path, **LOSS_CASES[case])
    assert len(want_grads) == len(got_grads) == 3
    torch.testing.assert_close(torch.tensor(got_losses), torch.tensor(want_losses), rtol=1e-5, atol=1e-6)
    for step, (got, want) in enumerate(zip(got_grads, want_grads, strict=True)):
        assert got.keys() == want.keys()
        scale = max(float(g.abs().max()) for g in want.values())
        for name in want:
            torch.testing.assert_close(
                got[name], want[name], rtol=1e-5, atol=1e-6 * scale, msg=f"{step} {name}"
            )


@pytest.mark.slow
def test_grpo_trainer_peak_memory_with_a_large_vocabulary(tmp_path):
    """One GRPOTrainer step (generation, scoring, loss, backward, optimizer) on a 128256-token vocabulary,
    544 scored tokens: TRL's fused head keeps [tokens, 32768] tiles, rk.linear_logprobs keeps none, so the
    step's peak CPU memory (model, Adam state and gradients included, which both runs share) is well under
    half of TRL's; the logged loss, gradient norm and entropy agree. `pytest -s` prints the measured pair."""
    tokenizer = _tokenizer()
    torch.manual_seed(0)
    config_lm = transformers.Qwen2Config(
        vocab_size=128256, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, pad_token_id=0, eos_token_id=1, bos_token_id=2,
    )  # fmt: skip
    transformers.Qwen2ForCausalLM(config_lm).save_pretrained(tmp_path / "model")
    prompts = datasets.Dataset.from_dict({"prompt": ["1+1=", "2+3="] * 4})

    def reward(completions, completion_ids, **kwargs):  # most sampled ids are not in the tiny tokenizer
        return [sum(i % 2 for i in ids) / len(ids) for ids in completion_ids]

    def step(trainer_cls):
        args = trl.GRPOConfig(
            output_dir=str(tmp_path / "out"), per_device_train_batch_size=8, num_generations=4,
            max_completion_length=64, max_steps=1, logging_steps=1, report_to=[], use_cpu=True, bf16=False,
            save_strategy="no", seed=0,
        )  # fmt: skip
        trainer = trainer_cls(
            model=str(tmp_path / "model"), reward_funcs=reward, args=args, train_dataset=prompts,
            processing_class=tokenizer,
        )  # fmt: skip
        peak = cpu_peak_bytes(trainer.train)
        (logged,) = [h for h in trainer.state.log_history if "loss" in h]
        return peak, logged

    trl_peak, want = step(trl.GRPOTrainer)
    rk_peak, got = step(trl_grpo.GRPOTrainer)
    assert want["num_tokens"] == got["num_tokens"] == 8 * (4 + 64)  # every completion runs to the limit
    assert want["reward_std"] > 0 and want["grad_norm"] > 0  # a real gradient flowed (on-policy loss is ~0)
    for key in ("loss", "grad_norm", "entropy", "reward"):
        assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-6), key
    mib = trl_peak / 2**20, rk_peak / 2**20
    print(f"\nGRPOTrainer step peak: TRL {mib[0]:.0f} MiB, with the adapter {mib[1]:.0f} MiB")
    assert rk_peak < 0.5 * trl_peak, (rk_peak / 2**20, trl_peak / 2**20)


def test_vespo_compute_loss_with_the_vllm_is_ratio(tmp_path):
    """vespo with every factor TRL applies: the vLLM IS ratio (folded into φ; no vLLM here, so the batch
    carries the ratio TRL would compute, token_truncate), the top-entropy and off-policy masks (applied
    after φ), and the bias-corrected KL. TRL's own _compute_loss and the adapter's on the same trainer and
    inputs: the same loss, gradients and vespo/phi_seq_mean metric (fp32 rounding, as the trainer test)."""
    tokenizer = _tokenizer()
    args = trl.GRPOConfig(
        output_dir=str(tmp_path / "out"), report_to=[], use_cpu=True, bf16=False, loss_type="vespo",
        top_entropy_quantile=0.5, off_policy_mask_threshold=0.5, beta=0.04, per_device_train_batch_size=6,
        num_generations=3, max_completion_length=9,
    )  # fmt: skip
    trainer = trl_grpo.GRPOTrainer(
        model=str(_model_dir(tmp_path, tokenizer)), reward_funcs=_reward, args=args,
        processing_class=tokenizer, train_dataset=datasets.Dataset.from_dict({"prompt": ["1+1="] * 6}),
    )  # fmt: skip
    trainer.use_vllm = trainer.vllm_importance_sampling_correction = True  # as if TRL ran vLLM
    trainer.current_gradient_accumulation_steps = 2
    model = trainer.model.train()
    gen = torch.Generator().manual_seed(3)
    b, p, t = 6, 4, 9
    prompt_ids = torch.randint(3, len(tokenizer), (b, p), generator=gen)
    completion_ids = torch.randint(3, len(tokenizer), (b, t), generator=gen)
    completion_mask = (torch.arange(t)[None, :] < torch.tensor([9, 5, 7, 2, 9, 6])[:, None]).long()
    with torch.no_grad():
        logp, _, _ = trainer._get_per_token_logps_and_entropies(
            model, torch.cat([prompt_ids, completion_ids], 1),
            torch.cat([torch.ones(b, p, dtype=torch.long), completion_mask], 1), t,
        )  # fmt: skip
    old = logp + 0.15 * torch.randn(b, t, generator=gen)
    sampling = old + 0.15 * torch.randn(b, t, generator=gen)
    sampling[[1, 4]] += 1.0  # rows 1 (A < 0) and 4 (A > 0) drift past the off-policy threshold
    ratio = torch.exp((old - sampling) * completion_mask).clamp(max=args.vllm_importance_sampling_clip_max)
    inputs = dict(
        prompt_ids=prompt_ids, prompt_mask=torch.ones(b, p, dtype=torch.long), completion_ids=completion_ids,
        completion_mask=completion_mask, advantages=torch.tensor([0.8, -1.1, 0.3, -0.4, 1.2, -0.7]),
        num_items_in_batch=completion_mask.sum() * 2.0, old_per_token_logps=old,
        sampling_per_token_logps=sampling, importance_sampling_ratio=ratio,
        ref_per_token_logps=logp + 0.1 * torch.randn(b, t, generator=gen),
    )  # fmt: skip
    kept = trainer.get_off_policy_mask(inputs["advantages"][:, None], logp, sampling, completion_mask, 0.5)
    assert kept.squeeze(1).tolist() == [1, 0, 1, 1, 1, 1]  # one row is dropped
    outs = []
    for compute_loss in (trl.GRPOTrainer._compute_loss, trl_grpo.GRPOTrainer._compute_loss):
        model.zero_grad()
        loss = compute_loss(trainer, model, inputs)
        loss.backward()
        grads = {n: q.grad.clone() for n, q in model.named_parameters() if q.grad is not None}
        outs.append((loss.detach(), grads, trainer._metrics["train"]["vespo/phi_seq_mean"][-1]))
    (want, g_want, phi_want), (got, g_got, phi_got) = outs
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    scale = max(float(g.abs().max()) for g in g_want.values())
    assert g_got.keys() == g_want.keys() and scale > 0
    for name in g_want:
        torch.testing.assert_close(g_got[name], g_want[name], rtol=1e-5, atol=1e-6 * scale, msg=name)
    assert phi_got == pytest.approx(phi_want, rel=1e-6) and phi_want != pytest.approx(1.0)


# vespo with TRL's vLLM IS ratio masked outside [1.5, 3]: TRL's ratio is then 0 on padding, and TRL adds its
# log (clamped to ln 1e-8) into each row's weight.
VESPO_IS_ABOVE_1 = dict(
    loss_type="vespo", use_vllm=True, vllm_importance_sampling_mode="token_mask",
    vllm_importance_sampling_clip_min=1.5,
)  # fmt: skip


@pytest.mark.parametrize(
    "config, match",
    [
        (VESPO_IS_ABOVE_1, "vespo' with a vLLM importance-sampling clip range that excludes 1"),
        (dict(use_adaptive_entropy=True, entropy_target=1.0), "use_adaptive_entropy"),
        (dict(importance_sampling_level="sequence", top_entropy_quantile=0.5), "top_entropy_quantile"),
        (dict(loss_type="cispo", importance_sampling_level="sequence"), "cispo' with importance_sampling"),
        (dict(loss_type="sapo", importance_sampling_level="sequence"), "sapo' with importance_sampling"),
    ],
)
def test_unsupported_options_raise(config, match, tmp_path):
    args = trl.GRPOConfig(output_dir=str(tmp_path), report_to=[], use_cpu=True, **config)
    with pytest.raises(ValueError, match=match):
        trl_grpo.GRPOTrainer(model="unused", reward_funcs=lambda completions, **kw: [0.0], args=args)
