"""Two traps of TRL 1.16's GRPOTrainer that rlkernels' adapter reports in its own words (the `[integrations]`
extra): beta > 0 on a model built from a config (TRL cannot load its reference model and says "Repo id must
use alphanumeric chars"), and a step whose completions all decode to '' (a text reward then gives equal
rewards and the loss stays 0, silently)."""

import warnings

import pytest
import torch

trl = pytest.importorskip("trl", reason="TRL is installed by the [integrations] extra (README)")
datasets = pytest.importorskip("datasets")
transformers = pytest.importorskip("transformers")
from tokenizers import Tokenizer, models, pre_tokenizers  # noqa: E402
from trl.trainer import utils as trl_utils  # noqa: E402

from rlkernels.integrations import trl_grpo  # noqa: E402

TRL_FUSED_HEAD = trl_utils._ChunkedLogProbFunction


@pytest.fixture(autouse=True)
def restore_trl(monkeypatch):
    """The adapter patches TRL's fused head process-wide: undo it after each test."""
    monkeypatch.setattr(trl_utils, "_ChunkedLogProbFunction", TRL_FUSED_HEAD)


def _tokenizer():
    vocab = {"<pad>": 0, "<eos>": 1, **{c: i + 2 for i, c in enumerate("0123456789+=")}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")


def _model(vocab_size):
    torch.manual_seed(0)
    config = transformers.Qwen2Config(
        vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, pad_token_id=0, eos_token_id=1,
    )  # fmt: skip
    return transformers.Qwen2ForCausalLM(config)


def _args(tmp_path, **options):
    return trl.GRPOConfig(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, num_generations=4,
        max_completion_length=6, report_to=[], use_cpu=True, bf16=False, save_strategy="no", seed=0,
        logging_steps=1, **options,
    )  # fmt: skip


def _reward(completions, **kwargs):
    return [float(sum(c in "02468" for c in s)) for s in completions]


PROMPTS = {"prompt": ["1+1=", "2+3="] * 4}


def test_beta_on_a_model_built_from_a_config_names_the_workaround(tmp_path):
    tokenizer, model = _tokenizer(), _model(14)
    args = _args(tmp_path, beta=0.04, max_steps=1)
    data = datasets.Dataset.from_dict(PROMPTS)
    # TRL's own trainer fails in its constructor, in its own words.
    with pytest.raises(OSError, match="Repo id must use alphanumeric chars"):
        trl.GRPOTrainer(model=model, reward_funcs=_reward, args=args, train_dataset=data,
                        processing_class=tokenizer)  # fmt: skip
    message = r"beta=0\.04 needs a reference model.*model\.save_pretrained\(path\); GRPOTrainer\(model=path"
    with pytest.raises(ValueError, match=message):
        trl_grpo.GRPOTrainer(model=model, reward_funcs=_reward, args=args, train_dataset=data,
                             processing_class=tokenizer)  # fmt: skip
    with pytest.raises(ValueError, match=message):  # the same, with the arguments given by position
        trl_grpo.GRPOTrainer(model, _reward, args, data, processing_class=tokenizer)
    # The workaround it names builds (TRL loads the reference from the path) ...
    model.save_pretrained(tmp_path / "model")
    trainer = trl_grpo.GRPOTrainer(model=str(tmp_path / "model"), reward_funcs=_reward, args=args,
                                   train_dataset=data, processing_class=tokenizer)  # fmt: skip
    assert trainer.ref_model is not None
    # ... and without a KL term the model built from a config needs no reference: no error.
    trainer = trl_grpo.GRPOTrainer(model=_model(14), reward_funcs=_reward, args=_args(tmp_path, max_steps=1),
                                   train_dataset=data, processing_class=tokenizer)  # fmt: skip
    assert trainer.ref_model is None


def test_completions_that_all_decode_empty_warn_once(tmp_path):
    """A 128256-token head under a 14-token tokenizer samples ids the tokenizer cannot decode: every
    completion is '', the even-digit reward is 0 for all, the loss 0. Two steps of 4 completions, one
    warning."""
    trainer = trl_grpo.GRPOTrainer(
        model=_model(128256), reward_funcs=_reward, args=_args(tmp_path, max_steps=2),
        train_dataset=datasets.Dataset.from_dict(PROMPTS), processing_class=_tokenizer(),
    )  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.train()
    ours = [str(w.message) for w in caught if "decoded to ''" in str(w.message)]
    assert len(ours) == 1, ours
    assert "all 4 completions of this step decoded to ''" in ours[0]
    assert "the tokenizer knows 14 tokens, the model's head 128256" in ours[0]
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 2 and all(loss == 0.0 for loss in losses)


@pytest.mark.parametrize(
    "completions, empty",
    [
        (["", ""], True),
        (["", "7"], False),
        ([[{"role": "assistant", "content": ""}], [{"role": "assistant", "content": None}]], True),
        ([[{"role": "assistant", "content": ""}], [{"role": "assistant", "content": "4"}]], False),
        ([[{"role": "assistant", "content": "", "tool_calls": [{"name": "f"}]}]], False),
    ],
)
def test_what_counts_as_an_empty_completion(completions, empty):
    assert all(trl_grpo._text(c) == "" for c in completions) is empty
