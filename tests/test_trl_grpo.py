"""rlkernels.integrations.trl_grpo against the installed TRL (the `[integrations]` extra): its stand-in for
TRL's fused LM head by the error rule; TRL's GRPOTrainer run for a few steps on a tiny causal LM (CPU, a
reward function, no vLLM) with and without the adapter, every mapped loss_type: the same per-step losses
and gradients; unsupported options raise, naming them."""

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


def _train(trainer_cls, tmp_path, **config):
    """(per-step logged losses, per-step gradients) of 3 optimizer steps: 2 accumulation steps, 2 passes
    over each generation batch, in fp32 (bf16=False: TRL's head would otherwise run its GEMMs in bf16)."""
    tokenizer = _tokenizer()
    model_dir = tmp_path / "model"
    if not model_dir.exists():  # a path, so that TRL can load the reference model from it
        torch.manual_seed(0)
        config_lm = transformers.Qwen2Config(
            vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
            num_attention_heads=4, num_key_value_heads=2, pad_token_id=0, eos_token_id=1, bos_token_id=2,
        )  # fmt: skip
        transformers.Qwen2ForCausalLM(config_lm).save_pretrained(model_dir)
    prompts = datasets.Dataset.from_dict({"prompt": ["1+1=", "2+3=", "4+4=", "5+1="] * 2})

    def reward(completions, **kwargs):  # even digits are rewarded: varied rewards within a group
        return [float(sum(ch in "02468" for ch in c)) for c in completions]

    args = trl.GRPOConfig(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, num_generations=4,
        max_completion_length=8, max_steps=3, logging_steps=1, report_to=[], use_cpu=True, bf16=False,
        save_strategy="no", seed=0, gradient_accumulation_steps=2, num_iterations=2, learning_rate=1e-2,
        **config,
    )  # fmt: skip
    grads = _Grads()
    trainer = trainer_cls(
        model=str(model_dir), reward_funcs=reward, args=args, train_dataset=prompts,
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


@pytest.mark.parametrize(
    "config, match",
    [
        (dict(loss_type="vespo"), "loss_type='vespo'"),
        (dict(use_adaptive_entropy=True, entropy_target=1.0), "use_adaptive_entropy"),
        (dict(importance_sampling_level="sequence", top_entropy_quantile=0.5), "top_entropy_quantile"),
    ],
)
def test_unsupported_options_raise(config, match, tmp_path):
    args = trl.GRPOConfig(output_dir=str(tmp_path), report_to=[], use_cpu=True, **config)
    with pytest.raises(ValueError, match=match):
        trl_grpo.GRPOTrainer(model="unused", reward_funcs=lambda completions, **kw: [0.0], args=args)
