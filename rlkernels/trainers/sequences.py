"""Prompt + completion batches and their per-token log-probs, fused (rlkernels, from the hidden states) or
eager (the full [B, T, V] logits, then log_softmax), behind one switch so the two runs differ only there.

A batch is a dict of tensors sharing their first dimension (rows), so that micro-batches are slices:
    input_ids [B, P + C] int64, attention_mask [B, P + C] int64 (0 after a completion's EOS),
    labels [B, C] int64 (the completion; IGNORE after its EOS), mask [B, C] bool (the completion's tokens,
    its EOS included); the trainers add their per-row or per-token tensors (old_logp [B, C], ...).
"""

from __future__ import annotations

import torch
from torch import nn

import rlkernels as rk
from rlkernels.trainers.tasks import EOS, PAD

IGNORE = -100


class Backbone(nn.Module):
    """A Hugging Face causal LM whose forward returns the last hidden state [B, T, D] (the LM head is applied
    by the loss), with an optional scalar head on it (PPO's values, the reward model's score). This is the
    module DDP wraps: the LM head's weight is one of its parameters even though the loss applies it."""

    def __init__(self, lm: nn.Module, scalar_head: bool = False):
        super().__init__()
        self.lm = lm
        width = lm.config.hidden_size
        self.scalar = nn.Linear(width, 1) if scalar_head else None

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        out = self.lm.get_decoder()(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
        return out.last_hidden_state

    @property
    def head(self) -> nn.Module:
        return self.lm.get_output_embeddings()


def completion_hidden(hidden: torch.Tensor, completion_len: int) -> torch.Tensor:
    """[B, P + C, D] -> the [B, C, D] rows that predict the completion (position t predicts token t + 1)."""
    total = hidden.shape[1]
    return hidden[:, total - completion_len - 1 : total - 1]


def token_logprobs(model: Backbone, hidden, labels, *, mode: str, temperature: float = 1.0,
                   return_entropy: bool = False):  # fmt: skip
    """Per-token log-probs [B, C] fp32 of `labels` [B, C] from `hidden` [B, C, D] (and the entropy [B, C] if
    asked): `mode="fused"` through rk.linear_logprobs, `"eager"` through the head's full logits."""
    if mode == "fused":
        return rk.linear_logprobs(
            hidden, model.head.weight, labels, bias=getattr(model.head, "bias", None),
            temperature=temperature, ignore_index=IGNORE, return_entropy=return_entropy,
        )  # fmt: skip
    logits = at_least_fp32(model.head(hidden)) / temperature  # [B, C, V]: what the fused path never holds
    logsm = logits.log_softmax(-1)
    valid = labels != IGNORE
    logp = logsm.gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1) * valid
    if not return_entropy:
        return logp
    entropy = -(logsm.exp() * logsm).sum(-1) * valid
    return logp, entropy


def at_least_fp32(t: torch.Tensor) -> torch.Tensor:
    """float32 for 16-bit tensors; float64 stays (the tests' float64 oracle runs the same code)."""
    return t if t.dtype == torch.float64 else t.float()


def policy_loss(model: Backbone, hidden, batch: dict, *, mode: str, temperature: float, **options):
    """rk.policy_loss of the batch's completion under `model`: fused, rk.linear_policy_loss on the hidden
    states; eager, the eager log-probs into rk.policy_loss. options: rk.policy_loss's."""
    args = (batch["old_logp"], batch["advantages"], batch["mask"])
    if mode == "fused":
        return rk.linear_policy_loss(
            hidden, model.head.weight, batch["labels"], *args, bias=getattr(model.head, "bias", None),
            temperature=temperature, ignore_index=IGNORE, **options,
        )  # fmt: skip
    logp = token_logprobs(model, hidden, batch["labels"], mode=mode, temperature=temperature)
    return rk.policy_loss(logp, *args, **options)


def micro_batches(batch: dict, size: int) -> list[dict]:
    """The batch dict's rows in slices of `size` (the last may be shorter)."""
    rows = next(iter(batch.values())).shape[0]
    return [{k: v[start : start + size] for k, v in batch.items()} for start in range(0, rows, size)]


def encode_prompts(tokenizer, prompts: list[str], device) -> torch.Tensor:
    ids = [tokenizer.encode(p) for p in prompts]
    if len({len(i) for i in ids}) != 1:
        raise ValueError("the prompts of a batch must have one length (the built-in tasks' do)")
    return torch.tensor(ids, dtype=torch.long, device=device)


def completion_batch(prompt_ids: torch.Tensor, completion: torch.Tensor) -> dict:
    """The batch dict of prompts [B, P] and completions [B, C] (PAD after an EOS or at the end)."""
    is_eos = completion == EOS
    mask = (is_eos.long().cumsum(1) - is_eos.long()) == 0  # up to and including the first EOS
    labels = completion.masked_fill(~mask, IGNORE)
    input_ids = torch.cat([prompt_ids, completion.masked_fill(~mask, PAD)], 1)
    attention_mask = torch.cat([torch.ones_like(prompt_ids), mask.long()], 1)
    return dict(input_ids=input_ids, attention_mask=attention_mask, labels=labels, mask=mask)


def answer_batch(tokenizer, prompts: list[str], answers: list[str], device) -> dict:
    """The batch dict of prompts and given answers (each followed by EOS, padded to the longest)."""
    prompt_ids = encode_prompts(tokenizer, prompts, device)
    ids = [tokenizer.encode(a) + [EOS] for a in answers]
    width = max(len(i) for i in ids)
    completion = torch.tensor([i + [PAD] * (width - len(i)) for i in ids], dtype=torch.long, device=device)
    return completion_batch(prompt_ids, completion)


@torch.no_grad()
def sample(lm, prompt_ids: torch.Tensor, max_new_tokens: int, temperature: float) -> dict:
    """`lm.generate` with plain sampling over the whole vocabulary (no top-k / top-p, so that the trainer's
    log-probs are those of the distribution sampled from); the batch dict, completions padded to
    max_new_tokens."""
    out = lm.generate(
        input_ids=prompt_ids, attention_mask=torch.ones_like(prompt_ids), do_sample=True,
        temperature=temperature, top_k=0, top_p=1.0, max_new_tokens=max_new_tokens, pad_token_id=PAD,
        eos_token_id=EOS,
    )  # fmt: skip
    completion = out[:, prompt_ids.shape[1] :]
    short = max_new_tokens - completion.shape[1]  # generate stops when every row has ended
    if short:
        completion = torch.nn.functional.pad(completion, (0, short), value=PAD)
    return completion_batch(prompt_ids, completion)
