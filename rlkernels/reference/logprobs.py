"""Per-token log-probs and entropy of a softmax over the vocabulary: the executable spec of
`linear_logprobs` and `logprobs_from_logits` (docs/semantics.md).

z = (h Wᵀ + b), softcap c: z = c·tanh(z / c), then z / temperature;
logp = z_y − LSE(z), entropy = LSE(z) − Σ softmax(z)·z, sum_pi_squared = Σ softmax(z)² =
exp(LSE(2z) − 2·LSE(z)) (verl's, forward-only: detached); rows whose label is `ignore_index` give 0 for all
three and no gradient.

Like an eager trainer, the matrix product runs in the dtype it is given (bf16 logits from bf16 inputs) and the
softmax in fp32 (fp64 for fp64 inputs): that is the "reference at the same dtype" of the test oracle.
"""

from __future__ import annotations

import torch

from rlkernels._dtypes import acc_dtype
from rlkernels.reference.sampling import kept_tokens


def transform_logits(
    logits: torch.Tensor, temperature: float | torch.Tensor = 1.0, softcap: float | None = None
) -> torch.Tensor:
    """Softcap (c·tanh(x / c)), then division by the temperature (a float, or a [...] tensor: one per row)."""
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    if isinstance(temperature, torch.Tensor):
        return logits / temperature.to(logits.dtype)[..., None]
    if temperature != 1.0:
        logits = logits / temperature
    return logits


def logprobs_from_logits(
    logits: torch.Tensor,
    labels: torch.Tensor,
    temperature: float = 1.0,
    ignore_index: int = -100,
    return_entropy: bool = False,
    softcap: float | None = None,
    return_sum_pi_squared: bool = False,
    top_k: torch.Tensor | None = None,
    top_p: torch.Tensor | None = None,
    min_p: torch.Tensor | None = None,
):
    """logits [..., V] any float dtype, labels [...] int -> logp [...] (then entropy [...] if return_entropy,
    then sum_pi_squared [...] if return_sum_pi_squared; a tuple when more than one) in fp32 (fp64 for fp64
    logits). Labels equal to `ignore_index` give 0 for each, with zero gradient; sum_pi_squared is
    detached. temperature: a float or a [...] tensor. top_k / top_p / min_p ([...] tensors or None): the
    distribution the rollout sampled from, renormalized over the tokens it keeps (reference/sampling.py); a
    label outside them gets logp -inf with zero gradient."""
    z = transform_logits(logits.to(acc_dtype(logits.dtype)), temperature, softcap)
    valid = labels != ignore_index
    safe = torch.where(valid, labels, torch.zeros_like(labels)).long()
    keep = None
    if top_k is not None or top_p is not None or min_p is not None:
        with torch.no_grad():
            keep = kept_tokens(z.detach(), top_k, top_p, min_p)
        z = torch.where(keep, z, -torch.inf)
    log_q = torch.log_softmax(z, dim=-1)
    logp = log_q.gather(-1, safe.unsqueeze(-1)).squeeze(-1)
    zero = torch.zeros((), dtype=logp.dtype, device=logp.device)
    if keep is not None:
        label_kept = keep.gather(-1, safe.unsqueeze(-1)).squeeze(-1)
        logp = torch.where(label_kept, logp, -torch.inf)
    logp = torch.where(valid, logp, zero)
    outputs = [logp]
    if return_entropy:
        # -Σ q log q == LSE - Σ q z; q underflowing to 0 contributes 0 (log_q stays finite for finite z).
        # A -inf logit (a masked token: a logits processor's, or a token the sampler dropped): q = 0 and
        # log q = -inf; its term is 0 (no 0 * -inf in the value or the gradient), the limit of q log q.
        finite_log_q = torch.where(log_q == -torch.inf, zero, log_q)
        entropy = -(log_q.exp() * finite_log_q).sum(-1)
        outputs.append(torch.where(valid, entropy, zero))
    if return_sum_pi_squared:
        # verl 0.9.1: exp(logsumexp(2·logits) − 2·logsumexp(logits)) on temperature-scaled logits, no grad.
        with torch.no_grad():
            zd = z.detach()
            sum_sq = torch.exp(torch.logsumexp(2 * zd, dim=-1) - 2 * torch.logsumexp(zd, dim=-1))
            outputs.append(torch.where(valid, sum_sq, zero.detach()))
    return outputs[0] if len(outputs) == 1 else tuple(outputs)


def linear_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    bias: torch.Tensor | None = None,
    temperature: float = 1.0,
    softcap: float | None = None,
    ignore_index: int = -100,
    return_entropy: bool = False,
    return_sum_pi_squared: bool = False,
    top_k: torch.Tensor | None = None,
    top_p: torch.Tensor | None = None,
    min_p: torch.Tensor | None = None,
):
    """hidden [..., D], weight [V, D], bias [V] or None, labels [...] -> logp [...] (and entropy [...], then
    sum_pi_squared [...], as logprobs_from_logits, with the same temperature / top_k / top_p / min_p).
    Materializes the [..., V] logits: the spec, not the kernel."""
    logits = torch.nn.functional.linear(hidden, weight, bias)
    return logprobs_from_logits(
        logits, labels, temperature, ignore_index, return_entropy, softcap, return_sum_pi_squared,
        top_k, top_p, min_p,
    )  # fmt: skip
