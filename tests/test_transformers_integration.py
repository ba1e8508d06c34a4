"""causal_lm_logprobs on tiny randomly initialized Llama (untied head), Qwen2 (tied) and Gemma2 (tied,
final-logit softcapping) models built from configs (no downloads): equal to log_softmax(model(...).logits)
gathered at the next token, with the same gradients, and the LM head never runs on the sequence."""

import pytest
import torch
from oracle import ATOL, assert_oracle, cpu_kernel_backends, max_err

transformers = pytest.importorskip("transformers")

from rlkernels.integrations.transformers import causal_lm_logprobs  # noqa: E402

BACKENDS = cpu_kernel_backends()
VOCAB = 101
COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
)


def make_model(family: str) -> torch.nn.Module:
    if family == "llama":
        cfg = transformers.LlamaConfig(**COMMON, tie_word_embeddings=False)
        model = transformers.LlamaForCausalLM(cfg)
    elif family == "qwen2":
        cfg = transformers.Qwen2Config(**COMMON, tie_word_embeddings=True)
        model = transformers.Qwen2ForCausalLM(cfg)
    else:  # Gemma2 with a small cap so that softcapping changes the logits a lot
        cfg = transformers.Gemma2Config(
            **COMMON, head_dim=8, final_logit_softcapping=2.0, tie_word_embeddings=True
        )
        model = transformers.Gemma2ForCausalLM(cfg)
    with torch.no_grad():  # random init is tiny; spread the logits so that the softmax is not flat
        model.get_output_embeddings().weight.mul_(20.0)
    return model.eval()


def make_batch(batch=2, seq=9):
    ids = torch.randint(0, VOCAB, (batch, seq))
    mask = torch.ones(batch, seq, dtype=torch.long)
    mask[0, :3] = 0  # left padding of the first sequence
    return ids, mask


def hf_logprobs(model, ids, mask, keep, temperature, return_entropy):
    """The eager reference: full logits from the model, log_softmax, gather, masked like the fused path."""
    logits = (
        model(input_ids=ids, attention_mask=mask).logits[:, ids.shape[1] - 1 - keep : -1].float()
        / temperature
    )
    log_q = torch.log_softmax(logits, -1)
    labels = ids[:, -keep:]
    valid = mask[:, -keep:] != 0
    logp = torch.where(valid, log_q.gather(-1, labels[..., None]).squeeze(-1), 0.0)
    ent = torch.where(valid, -(log_q.exp() * log_q).sum(-1), 0.0)
    return logp, ent


@pytest.fixture
def float64_softmax(monkeypatch):
    """Softmax of float64 inputs in float64. Gemma2's attention asks for an fp32 softmax; in a float64 model
    its mask minimum (-1.8e308) becomes -inf there, the left-padded row's first query (no key to attend
    to) turns NaN, and 0 x NaN spreads it to every output: a float64 oracle of NaN, against which the error
    rule checks nothing. A float64 oracle computes in float64 throughout."""
    softmax = torch.nn.functional.softmax

    def in_float64(x, dim=None, _stacklevel=3, dtype=None):
        return softmax(x, dim=dim, dtype=torch.float64 if x.dtype == torch.float64 else dtype)

    monkeypatch.setattr(torch.nn.functional, "softmax", in_float64)


def values_and_grads(fn, model, g_logp, g_ent, params):
    """([logp, entropy, d hidden (the final norm's output, what the head reads), the params' grads], the
    final norm's input)."""
    model.zero_grad(set_to_none=True)
    seen = {}

    def keep(module, args, output):
        seen["x"] = args[0].detach()
        output.retain_grad()
        seen["hidden"] = output

    hook = model.model.norm.register_forward_hook(keep)
    try:
        logp, ent = fn(model)
    finally:
        hook.remove()
    ((logp * g_logp).sum() + (ent * g_ent).sum()).backward()
    grads = [dict(model.named_parameters())[p].grad.clone() for p in params]
    return [logp, ent, seen["hidden"].grad] + grads, seen["x"]


def norm_weight_atol(model, x, d_hidden_err, norm_grad) -> float:
    """The final RMSNorm's weight gradient is Σ_t d hidden_t ⊙ x̂_t (Llama, Qwen2, and Gemma2's 1 + w alike),
    HF's backward of the d hidden the head returns. The kernel's d hidden, off the float64 oracle's by at
    most d_hidden_err per element, moves it by up to d_hidden_err · max_j Σ_t |x̂_tj|: allowed on top of
    the usual fp32 slack of the sum itself, since the eager reference's own d hidden error, cancelling in
    that sum, can make its error there much smaller. Returned as assert_oracle's atol (relative to the
    gradient's scale)."""
    norm = model.model.norm
    eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6))
    x = x.double()
    x_hat = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    propagated = d_hidden_err * float(x_hat.abs().sum(dim=(0, 1)).max())
    return ATOL[torch.float32] + propagated / max(1.0, float(norm_grad.abs().max()))


@pytest.mark.parametrize("family", ["llama", "qwen2", "gemma2"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_matches_log_softmax_of_hf_logits(family, backend, seed, float64_softmax):
    model = make_model(family)
    ids, mask = make_batch()
    keep, temperature = ids.shape[1] - 1, 0.8
    g_logp, g_ent = torch.randn(2, keep), torch.randn(2, keep)
    head = "lm_head.weight" if family == "llama" else "model.embed_tokens.weight"
    params = [head, "model.norm.weight", "model.layers.1.self_attn.q_proj.weight"]

    def fused(m):
        return causal_lm_logprobs(m, ids, mask, temperature=temperature, return_entropy=True, backend=backend)

    def eager(m):
        return hf_logprobs(m, ids, mask, keep, temperature, True)

    def lm_head_must_not_run(module, args):
        raise AssertionError("the LM head ran on the full sequence")

    hook = model.get_output_embeddings().register_forward_pre_hook(lm_head_must_not_run)
    try:
        out, _ = values_and_grads(fused, model, g_logp, g_ent, params)
    finally:
        hook.remove()
    same, _ = values_and_grads(eager, model, g_logp, g_ent, params)
    oracle, x = values_and_grads(eager, model.double(), g_logp.double(), g_ent.double(), params)
    assert all(torch.isfinite(t).all() for t in oracle), "the float64 oracle is not finite"
    assert out[0].shape == (2, keep)
    assert (out[0][0, :2] == 0).all()  # tokens 1, 2 of the left-padded sequence are padding
    # The kernel's outputs, d hidden and the head's gradient by the error rule. The decoder's parameter
    # gradients are HF's backward of the kernel's d hidden: the final norm's weight, a sum over every token
    # that amplifies d hidden's error, is allowed that error propagated (norm_weight_atol; d hidden's own
    # error is held to the rule first, so the allowance is bounded); the attention weight is checked as is.
    names = ["logp", "entropy", "d hidden"] + params
    d_hidden_err = max_err(out[2], oracle[2])
    for name, o, s, r in zip(names, out, same, oracle, strict=True):
        atol = norm_weight_atol(model, x, d_hidden_err, r) if name == "model.norm.weight" else None
        assert_oracle(f"{family}/{backend}/{name}", o, s, r, atol=atol)


@pytest.mark.parametrize("backend", BACKENDS)
def test_logits_to_keep_and_no_grad(backend):
    model = make_model("gemma2")
    ids, mask = make_batch(seq=11)
    with torch.no_grad():
        full = causal_lm_logprobs(model, ids, mask, backend=backend)
        last = causal_lm_logprobs(model, ids, mask, logits_to_keep=4, backend=backend)
        want, _ = hf_logprobs(model, ids, mask, 4, 1.0, False)
    assert full.shape == (2, 10) and last.shape == (2, 4) and last.grad_fn is None
    torch.testing.assert_close(last, full[:, -4:])
    torch.testing.assert_close(last, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_sum_pi_squared(backend):
    """Σ_v p_v² of the HF logits (softcapped Gemma-2, a temperature), from the same fused call."""
    model = make_model("gemma2")
    ids, mask = make_batch(seq=11)
    with torch.no_grad():
        logp, sum_sq = causal_lm_logprobs(model, ids, mask, temperature=0.8, return_sum_pi_squared=True,
                                          backend=backend)  # fmt: skip
        alone = causal_lm_logprobs(model, ids, mask, temperature=0.8, backend=backend)
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].double() / 0.8
    want = logits.softmax(-1).pow(2).sum(-1) * (mask[:, 1:] != 0)
    torch.testing.assert_close(logp, alone)
    torch.testing.assert_close(sum_sq.double(), want, rtol=1e-5, atol=1e-6)


def test_validation_errors():
    model = make_model("llama")
    ids, mask = make_batch()
    with pytest.raises(ValueError, match="logits_to_keep"):
        causal_lm_logprobs(model, ids, logits_to_keep=9)
    with pytest.raises(ValueError, match="attention_mask has shape"):
        causal_lm_logprobs(model, ids, mask[:, :4])
    with pytest.raises(ValueError, match="input_ids must be"):
        causal_lm_logprobs(model, ids[0])


def test_token_ids_outside_the_vocabulary_name_input_ids(monkeypatch):
    """An id >= the vocabulary (or < 0) is a ValueError naming input_ids before the embedding lookup (whose
    IndexError names nothing); on GPU tensors the check is an async assert, no host sync."""
    from rlkernels import _validate

    model = make_model("llama")
    ids, mask = make_batch()
    for bad in (VOCAB, VOCAB + 7, -1):
        poisoned = ids.clone()
        poisoned[1, 3] = bad
        with pytest.raises(
            ValueError, match=rf"causal_lm_logprobs: input_ids must lie in \[0, {VOCAB}\), found {bad}"
        ):
            causal_lm_logprobs(model, poisoned, mask)
    with pytest.raises(TypeError, match="causal_lm_logprobs: input_ids must be an int32 or int64 tensor"):
        causal_lm_logprobs(model, ids.float(), mask)
    assert causal_lm_logprobs(model, ids.clamp(max=VOCAB - 1), mask).shape == (ids.shape[0], ids.shape[1] - 1)

    # The path GPU tensors take: no eager check, no read of a tensor's value; _assert_async on a CPU tensor
    # fails at once.
    monkeypatch.setattr(_validate, "checks_eagerly", lambda x: False)
    reads = []
    monkeypatch.setattr(torch.Tensor, "item", lambda *a: reads.append("item"))
    poisoned = ids.clone()
    poisoned[0, 0] = VOCAB
    with pytest.raises(RuntimeError, match=rf"causal_lm_logprobs: input_ids out of range \[0, {VOCAB}\)"):
        causal_lm_logprobs(model, poisoned, mask)
    assert reads == []
