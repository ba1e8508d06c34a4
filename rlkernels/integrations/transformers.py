"""Per-token log-probs (and entropy) of a Hugging Face causal LM without its [B, T, V] logits.

`causal_lm_logprobs` runs the model's decoder to its last hidden state and applies the fused
`rlkernels.linear_logprobs` with the model's output embedding (tied or not, with its bias if any), so the LM
head never runs on the full sequence. It honors Gemma-2's `final_logit_softcapping` and folds Cohere's
`logit_scale` / Granite's `logits_scaling` into the temperature.
"""

from __future__ import annotations

import torch

from rlkernels._validate import assert_in_range, check_index
from rlkernels.ops.logprobs import linear_logprobs

IGNORE_INDEX = -100


def _decoder(model):
    """The module that maps input_ids to the last hidden state (model.model for *ForCausalLM)."""
    if hasattr(model, "get_decoder"):
        decoder = model.get_decoder()
        if decoder is not None:
            return decoder
    if hasattr(model, "model"):
        return model.model
    raise TypeError(
        f"causal_lm_logprobs: cannot find the decoder of {type(model).__name__} (no get_decoder())"
    )


def _vocab_size(model, head) -> int:
    """The token ids the model can embed: its input embedding's rows (else the LM head's)."""
    embed = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    weight = getattr(embed, "weight", None)
    return int((weight if weight is not None else head.weight).shape[0])


def _logit_scaling(config, temperature: float) -> tuple[float, float | None]:
    """(effective temperature, softcap) reproducing how the model turns head outputs into logits."""
    softcap = getattr(config, "final_logit_softcapping", None)
    scale = getattr(config, "logit_scale", None)  # Cohere: logits * logit_scale
    divide = getattr(config, "logits_scaling", None)  # Granite: logits / logits_scaling
    if (scale not in (None, 1.0) or divide not in (None, 1.0)) and softcap is not None:
        raise NotImplementedError(
            "causal_lm_logprobs: logit scaling combined with softcapping is not supported"
        )
    if scale not in (None, 1.0):
        temperature = temperature / float(scale)
    if divide not in (None, 1.0):
        temperature = temperature * float(divide)
    return temperature, (None if softcap is None else float(softcap))


def causal_lm_logprobs(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    logits_to_keep: int | None = None,
    temperature: float = 1.0,
    return_entropy: bool = False,
    return_sum_pi_squared: bool = False,
    chunk_size: int | None = None,
    backend: str = "auto",
    **model_kwargs,
):
    """Log-probs of each token given its prefix under a Hugging Face causal LM, fused with the LM head.

    Equal to `log_softmax(model(input_ids, attention_mask).logits / temperature)` gathered at the next token,
    without materializing the logits (forward or backward).

    Args:
        model: a `*ForCausalLM` (Llama, Qwen2, Gemma2, Mistral, ...): a decoder (`get_decoder()`) and an
            output embedding (`get_output_embeddings()`, tied to the input embedding or not).
        input_ids: [B, T] int32/int64 token ids in [0, vocabulary) (ValueError naming input_ids otherwise).
        attention_mask: [B, T] 0/1 or None. Predicted positions whose token is masked (padding) get logp 0,
            entropy 0 and no gradient.
        logits_to_keep: None: the log-probs of tokens 1..T-1 ([B, T-1]); k: those of the last k tokens
            ([B, k], TRL's convention: the completion of a prompt + completion sequence).
        temperature: > 0, divides the (softcapped) logits, as in sampling.
        return_entropy: also return the per-token entropy of the predictive distribution.
        return_sum_pi_squared: also return Σ_v p_v² per token (verl's sum_pi_squared), forward-only.
        chunk_size, backend: passed to `rlkernels.linear_logprobs`.
        **model_kwargs: passed to the decoder (position_ids, ...).

    Returns:
        logp [B, T-1] or [B, k] float32, or the tuple (logp, entropy if asked, sum_pi_squared if asked), as
        `rlkernels.linear_logprobs`; logp and entropy differentiable in the model's parameters.
    """
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
        raise ValueError(
            "causal_lm_logprobs: input_ids must be a [B, T] tensor, got "
            f"{getattr(input_ids, 'shape', type(input_ids).__name__)}"
        )
    seq_len = input_ids.shape[1]
    if logits_to_keep is not None and not (isinstance(logits_to_keep, int) and 1 <= logits_to_keep < seq_len):
        raise ValueError(
            f"causal_lm_logprobs: logits_to_keep must be an int in [1, T) with T = {seq_len}, "
            f"got {logits_to_keep!r}"
        )
    if attention_mask is not None and attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"causal_lm_logprobs: attention_mask has shape {tuple(attention_mask.shape)} but input_ids has "
            "shape "
            f"{tuple(input_ids.shape)}"
        )
    head = model.get_output_embeddings()
    if head is None or not hasattr(head, "weight"):
        raise TypeError(f"causal_lm_logprobs: {type(model).__name__} has no output embedding with a weight")
    check_index("causal_lm_logprobs", input_ids, "input_ids")
    # Before the embedding lookup, whose out-of-range error names no argument: a ValueError on CPU tensors,
    # an async assert (no host sync) on GPU ones.
    assert_in_range("causal_lm_logprobs", input_ids, "input_ids", 0, _vocab_size(model, head))
    temperature, softcap = _logit_scaling(model.config, temperature)

    outputs = _decoder(model)(
        input_ids=input_ids, attention_mask=attention_mask, use_cache=False, **model_kwargs
    )
    hidden = outputs.last_hidden_state if hasattr(outputs, "last_hidden_state") else outputs[0]
    keep = seq_len - 1 if logits_to_keep is None else logits_to_keep
    # Position t predicts token t + 1: hidden[:, -keep-1:-1] scores input_ids[:, -keep:].
    hidden = hidden[:, seq_len - 1 - keep : seq_len - 1]
    labels = input_ids[:, seq_len - keep :]
    if attention_mask is not None:
        labels = labels.masked_fill(attention_mask[:, seq_len - keep :] == 0, IGNORE_INDEX)
    bias = getattr(head, "bias", None)
    return linear_logprobs(
        hidden,
        head.weight,
        labels,
        bias=bias,
        temperature=temperature,
        softcap=softcap,
        ignore_index=IGNORE_INDEX,
        return_entropy=return_entropy,
        return_sum_pi_squared=return_sum_pi_squared,
        chunk_size=chunk_size,
        backend=backend,
    )
