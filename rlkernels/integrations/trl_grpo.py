"""TRL 1.16's GRPOTrainer with rlkernels' log-probs and loss: `GRPOTrainer` here is a drop-in subclass.

- Log-probs and entropies: TRL 1.16 already scores the policy, old and reference models from the last hidden
  state through a fused LM head (`trl.trainer.utils.add_fused_lm_head`, whose chunked autograd function is
  `trl.trainer.utils._ChunkedLogProbFunction`). `install_logprobs()` replaces that function with
  `LinearLogProbs`, which runs `rk.linear_logprobs` (the same logit scale, softcap and temperature). It is
  process-wide: every TRL trainer of the process then scores through rlkernels.
- The loss: `GRPOTrainer._compute_loss` computes TRL's loss with `rk.policy_loss`, its `loss_type` mapped as
  `rlkernels.integrations.trl` documents, with TRL 1.16's normalizers (the gradient-accumulation steps and,
  for dapo / cispo / vespo, the generation batch's token count rescaled to one accumulation window). TRL's
  per-token factors of the policy term (the off-policy sequence mask, the top-entropy token mask, the vLLM
  importance-sampling ratio) are rk's `is_weights`; the KL to the reference is k3 without clamping; the
  static entropy bonus is TRL's token mean. TRL's metrics are logged as TRL logs them.
- vespo (TRL's `get_gamma_weights`): TRL folds the vLLM importance-sampling ratio into the sequence weight
  φ(w) and multiplies the per-token loss -φ·A·logp by the off-policy and top-entropy masks after φ is
  formed. Here the ratio is vespo's `is_weights` (rk folds them into w in log space, as TRL), and the two
  masks multiply the advantages: at a fixed, detached φ the loss is linear in A, so value and gradient are
  TRL's (a token whose factor is 0 contributes 0 in both; φ's choice of (k, λ) by the sign of A is moot
  there). The masks must not enter `mask` or `is_weights`: both would change w. TRL sums the log of its
  ratio over every position and rk over the masked ones; that is the same while TRL's ratio is 1 off the
  mask, i.e. while 1 lies in [vllm_importance_sampling_clip_min, _clip_max] (TRL exponentiates a masked
  difference, then truncates / masks it).

With `use_bias_correction_kl` (TRL's default) and beta != 0, the KL term is k3 times the differentiable
importance ratio: rk.kl_penalty times the ratio, aggregated with the loss's own normalizers next to
rk.policy_loss (aggregation is linear).

Two traps of TRL 1.16 are caught here, not in TRL's terms: with beta != 0 TRL loads its reference model with
`from_pretrained(model.config._name_or_path)`, which is '' for a model built from a config, and fails with
"Repo id must use alphanumeric chars ...: ''"; this raises a ValueError naming the workaround (save the model,
pass its path) before TRL does. And when every completion of a step decodes to an empty string (e.g. a
tokenizer that knows a few tokens, under a 128k-vocabulary head that samples others), a text reward sees ''
everywhere, every group's rewards are equal and the loss is 0: that warns, once per trainer.

Options with no rlkernels counterpart raise a ValueError naming them when the trainer is built:
use_adaptive_entropy; importance_sampling_level="sequence" with top_entropy_quantile < 1 for the loss types
with a ratio (per-token factors under a sequence ratio: rk's straight-through GSPO gradient differs from
TRL's there, see rlkernels.integrations.trl; vespo builds its own weight and is not affected); loss_type
"cispo" or "sapo" with importance_sampling_level="sequence" (rk's sequence level is the clip objective's,
GSPO); and loss_type="vespo" with the vLLM importance-sampling correction whose clip range excludes 1
(vllm_importance_sampling_clip_min > 1 or _clip_max < 1): TRL's ratio is then not 1 on padding, and TRL
adds its log over the padding into each row's weight, which rk's masked sum cannot reproduce.
"""

from __future__ import annotations

import inspect
import warnings

import torch

try:
    import trl
    from trl.trainer import utils as trl_utils
except ModuleNotFoundError as e:
    raise ModuleNotFoundError(
        f"rlkernels.integrations.trl_grpo needs TRL 1.16.0 ({e}): pip install 'rlkernels[integrations]'",
        name=e.name,
    ) from e

import rlkernels as rk
from rlkernels.integrations.trl import trl_policy_loss_kwargs
from rlkernels.reference.aggregation import AGG_KEYWORDS

TRL_VERSION = "1.16.0"
# The fields of TRL's fused LM head output that rk.linear_logprobs computes.
OUTPUTS = ("log_probs", "entropy", "log_sum_sq_probs")


class LinearLogProbs:
    """Stands in for TRL 1.16's `_ChunkedLogProbFunction`: `apply(hidden [N, D], weight [V, D], bias [V] or
    None, targets [N] int, temperature, chunk_size, final_logit_softcapping, logit_scale, outputs)` ->
    (log_probs [N] fp32, entropy [N] fp32 or None, log Σp² [N] fp32 or None, None, None), differentiable
    in hidden, weight and bias. chunk_size is TRL's vocabulary tile, not needed by rk.linear_logprobs.

    Under autocast TRL runs its tiles' GEMMs in the autocast dtype; this runs them in the head's dtype (fp32
    for an fp32 head: slower on a GPU, closer to the exact values), with hidden cast to it."""

    @staticmethod
    def apply(hidden, weight, bias, targets, temperature, chunk_size, final_logit_softcapping=None,
              logit_scale=1.0, outputs=OUTPUTS):  # fmt: skip
        missing = [name for name in outputs if name not in OUTPUTS]
        if missing:
            raise ValueError(f"rlkernels' fused LM head computes {OUTPUTS}, not {missing}")
        hidden = hidden.to(weight.dtype)  # an autocast backbone's 16-bit rows under an fp32 head
        if logit_scale != 1.0:  # z = s·(h Wᵀ + b): scale the [N, D] rows, not a copy of the [V, D] head
            hidden = hidden * logit_scale
            bias = None if bias is None else bias * logit_scale
        want_entropy, want_sq = "entropy" in outputs, "log_sum_sq_probs" in outputs
        with torch.autocast(hidden.device.type, enabled=False):
            out = rk.linear_logprobs(
                hidden, weight, targets, bias=bias, temperature=float(temperature),
                softcap=final_logit_softcapping, return_entropy=want_entropy, return_sum_pi_squared=want_sq,
            )  # fmt: skip
        out = list(out) if isinstance(out, tuple) else [out]
        logp = out.pop(0)
        entropy = out.pop(0) if want_entropy else None
        log_sq = out.pop(0).log() if want_sq else None
        return logp, entropy, log_sq, None, None


def install_logprobs() -> None:
    """Make TRL's fused LM head (every TRL trainer in this process) run rk.linear_logprobs."""
    _check_version()
    trl_utils._ChunkedLogProbFunction = LinearLogProbs


def _check_version() -> None:
    if trl.__version__ != TRL_VERSION:
        raise RuntimeError(
            f"rlkernels.integrations.trl_grpo follows TRL {TRL_VERSION}, found {trl.__version__}"
        )


def unsupported_options(args) -> list[str]:
    """The options of a TRL 1.16 GRPOConfig `args` set to something this adapter does not compute, as
    strings naming them (an empty list: all supported; the module docstring says why each is refused)."""
    bad = []
    if getattr(args, "use_adaptive_entropy", False):
        bad.append("use_adaptive_entropy=True")
    if (
        args.loss_type != "vespo"
        and args.importance_sampling_level == "sequence"
        and args.top_entropy_quantile < 1.0
    ):
        bad.append("importance_sampling_level='sequence' with top_entropy_quantile < 1")
    if args.loss_type in ("cispo", "sapo") and args.importance_sampling_level == "sequence":
        bad.append(f"loss_type={args.loss_type!r} with importance_sampling_level='sequence'")
    # TRL itself refuses vespo with the sequence-level modes.
    token_is = args.vllm_importance_sampling_mode in ("token_truncate", "token_mask")
    if args.loss_type == "vespo" and args.use_vllm and args.vllm_importance_sampling_correction and token_is:
        low, high = args.vllm_importance_sampling_clip_min, args.vllm_importance_sampling_clip_max
        if (low is not None and low > 1.0) or (high is not None and high < 1.0):
            bad.append(
                "loss_type='vespo' with a vLLM importance-sampling clip range that excludes 1 "
                f"(vllm_importance_sampling_clip_min={low}, vllm_importance_sampling_clip_max={high})"
            )
    return bad


def reference_model_error(model, args, peft_config=None) -> str | None:
    """Why TRL 1.16 could not build the reference model of `model` under GRPOConfig `args` (None: it can, or
    needs none). TRL loads it with from_pretrained(model.config._name_or_path) when beta != 0 and the model is
    neither a path nor a PEFT model; a model built from a config has '' there."""
    if args is None or args.beta == 0.0 or isinstance(model, str) or peft_config is not None:
        return None
    from accelerate.utils import is_peft_model

    config = getattr(model, "config", None)
    if config is None or is_peft_model(model) or trl_utils.get_config_model_id(config):
        return None
    return (
        f"beta={args.beta} needs a reference model, which TRL 1.16 loads with "
        f"from_pretrained(model.config._name_or_path), and this {type(model).__name__} has no name or path "
        'there (it was built from a config, not loaded), so TRL would fail with "Repo id must use '
        "alphanumeric chars ...: ''\". Save it first and pass the path: model.save_pretrained(path); "
        "GRPOTrainer(model=path, ...). Or set beta=0.0 (no KL term, no reference model)"
    )


class GRPOTrainer(trl.GRPOTrainer):
    """trl.GRPOTrainer (TRL 1.16) whose log-probs come from rk.linear_logprobs and whose loss is
    rk.policy_loss (see the module docstring). Same constructor; raises ValueError for the options listed
    there, and for a reference model TRL could not load; warns once when a step's completions all decode
    to empty strings."""

    def __init__(self, *args, **kwargs):
        _check_version()
        given = inspect.signature(trl.GRPOTrainer.__init__).bind(self, *args, **kwargs).arguments
        config = given.get("args")
        if config is not None:
            bad = unsupported_options(config)
            if bad:
                raise ValueError(f"rlkernels' GRPOTrainer does not support {', '.join(bad)}")
        why = reference_model_error(given.get("model"), config, given.get("peft_config"))
        if why is not None:
            raise ValueError(f"rlkernels' GRPOTrainer: {why}")
        install_logprobs()
        self._warned_empty_completions = False
        super().__init__(*args, **kwargs)

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        if not self._warned_empty_completions and completions and all(_text(c) == "" for c in completions):
            self._warned_empty_completions = True
            warnings.warn(self._empty_completions_message(completion_ids_list), UserWarning, stacklevel=2)
        return super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)

    def _empty_completions_message(self, completion_ids_list) -> str:
        ids = [int(i) for c in completion_ids_list for i in c]
        head = (
            f"rlkernels' GRPOTrainer: all {len(completion_ids_list)} completions of this step decoded to ''"
        )
        tail = (
            "so a reward computed from the text sees '' everywhere, each group's rewards are equal and the "
            "loss is 0 (shown once per trainer)"
        )
        if not ids:
            return f"{head}: none has a token before its end, {tail}"
        tokenizer = getattr(self.processing_class, "tokenizer", self.processing_class)
        known = (
            f"the tokenizer knows {len(tokenizer)} tokens"
            if hasattr(tokenizer, "__len__")
            else "the tokenizer"
        )
        vocab = getattr(getattr(self.model, "config", None), "vocab_size", None)
        model = f", the model's head {vocab}" if vocab is not None else ""
        return (
            f"{head}: their {len(ids)} sampled tokens (ids {min(ids)} to {max(ids)}; {known}{model}) decode "
            f"to nothing, {tail}. A head larger than the tokenizer samples ids the tokenizer cannot decode; "
            "a reward function that reads completion_ids sees them"
        )

    def _compute_loss(self, model, inputs):
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        input_ids = torch.cat([inputs["prompt_ids"], completion_ids], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], completion_mask], dim=1)
        mask = completion_mask if "tool_mask" not in inputs else completion_mask * inputs["tool_mask"]
        extra = {k: inputs.get(k) for k in _MULTIMODAL_KEYS}
        logp, entropies, aux_loss = self._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, completion_ids.size(1), compute_entropy=True,
            compute_aux_loss=self.aux_loss_enabled, **extra,
        )  # fmt: skip
        advantages = inputs["advantages"]
        advantages = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
        old = inputs.get("old_per_token_logps")
        old = logp.detach() if old is None else old

        # TRL's multiplicative per-token factors of the policy term -> is_weights (vespo: see below)
        entropy_mask = None
        if self.top_entropy_quantile < 1.0:
            entropy_mask = self.get_high_entropy_mask(entropies, mask, 1 - self.top_entropy_quantile)
        factors = [] if entropy_mask is None else [entropy_mask]
        if self.off_policy_mask_threshold is not None:
            sampling = inputs.get("sampling_per_token_logps", old)
            factors.append(
                self.get_off_policy_mask(advantages, logp, sampling, mask, self.off_policy_mask_threshold)
            )
        policy_advantages = advantages
        if self.loss_type == "vespo":
            # TRL folds its vLLM IS ratio (whenever the batch carries one) into φ, and multiplies -φ·A·logp
            # by the masks after φ is formed: the ratio is vespo's is_weights, the masks scale A.
            for f in factors:
                policy_advantages = policy_advantages * f.to(advantages.dtype)
            is_ratio = inputs.get("importance_sampling_ratio")
            factors = [] if is_ratio is None else [is_ratio]
        elif self.use_vllm and self.vllm_importance_sampling_correction:
            factors.append(inputs["importance_sampling_ratio"])
        is_weights = None
        for f in factors:
            is_weights = f if is_weights is None else is_weights * f
        if is_weights is not None:
            is_weights = is_weights.to(logp.dtype).expand_as(logp)

        mode = "train" if self.model.training else "eval"
        accumulation = self.current_gradient_accumulation_steps if mode == "train" else 1.0
        num_items = inputs.get("num_items_in_batch")
        if num_items is not None and mode == "train":  # one accumulation window of the generation batch
            num_items = num_items * self.current_gradient_accumulation_steps / self.args.steps_per_generation
        kwargs = trl_policy_loss_kwargs(
            self.loss_type, batch_size=logp.shape[0], max_completion_length=self.max_completion_length,
            num_items_in_batch=None if num_items is None else num_items.clamp(min=1.0),
            num_processes=self.accelerator.num_processes, epsilon=self.epsilon_low,
            epsilon_high=self.epsilon_high, delta=self.args.delta,
            importance_sampling_level=self.importance_sampling_level, beta=self.beta,
            sapo_temperature_pos=self.args.sapo_temperature_pos,
            sapo_temperature_neg=self.args.sapo_temperature_neg, vespo_k_pos=self.args.vespo_k_pos,
            vespo_lambda_pos=self.args.vespo_lambda_pos, vespo_k_neg=self.args.vespo_k_neg,
            vespo_lambda_neg=self.args.vespo_lambda_neg,
        )  # fmt: skip
        ref = inputs.get("ref_per_token_logps") if self.beta != 0.0 else None
        corrected = ref is not None and self.args.use_bias_correction_kl
        if kwargs["kl_coef"] == 0.0 or corrected:  # the corrected KL is added below
            kwargs.pop("kl_coef")
        a = policy_advantages
        loss, _ = rk.policy_loss(
            logp, old, a.squeeze(1) if a.shape[1] == 1 else a, mask, ref_logp=None if corrected else ref,
            is_weights=is_weights, **kwargs,
        )  # fmt: skip
        kl = None
        if ref is not None:
            kl = rk.kl_penalty(logp, ref, "k3", clamp=None)
            if corrected:  # TRL: k3 times the (token or sequence) importance ratio, differentiable
                kl = kl * torch.exp(_log_ratio(logp, old, mask, self.importance_sampling_level))
                agg = {k: kwargs[k] for k in AGG_KEYWORDS if k in kwargs}
                loss = loss + self.beta * rk.agg_loss(kl, mask, **agg)
        policy_loss = loss.detach()
        if self.loss_type not in ("dapo", "cispo", "vespo"):  # TRL divides the others by the accumulation
            loss = loss / accumulation
        if self._entropy_bonus_enabled:  # TRL: a token mean over the tokens the policy term acts on
            effective = mask if entropy_mask is None else mask * entropy_mask
            # TRL's Σ m·H / max(Σ m, 1): the fused token mean over its own normalizer (no host sync)
            tokens = effective.sum().clamp(min=1.0)
            bonus = rk.agg_loss(entropies, effective, "token-mean", num_tokens=tokens) / accumulation
            loss = loss - self.entropy_coef * bonus
            self._metrics[mode]["policy_loss"].append(self.accelerator.gather(policy_loss).nanmean().item())
            if mode == "train" and self.accelerator.sync_gradients:
                self._metrics[mode]["entropy_coef"].append(self.entropy_coef)
        if self.aux_loss_enabled:
            loss = loss + self.router_aux_loss_coef * aux_loss / accumulation
            self._metrics[mode]["aux_loss"].append(
                self.accelerator.gather_for_metrics(aux_loss).mean().item()
            )
        is_ratio = inputs.get("importance_sampling_ratio")
        self._log_metrics(mode, logp.detach(), old, advantages, mask, entropies, kl, is_ratio)
        return loss

    def _log_metrics(self, mode, logp, old, advantages, mask, entropies, kl, is_ratio=None):
        """TRL 1.16's GRPO metrics (names and definitions), from the detached log-probs. is_ratio: the batch's
        vLLM importance-sampling ratio (vespo's φ folds it in)."""

        def global_mean(x):
            if x.shape[1] == 1:
                local = torch.stack([x.sum(), torch.tensor(float(x.shape[0]), device=x.device)])
            else:
                local = torch.stack([(x * mask).sum(), mask.sum().float()])
            totals = self.accelerator.reduce(local, reduction="sum")
            return (totals[0] / totals[1].clamp(min=1.0)).item()

        metrics = self._metrics[mode]
        if kl is not None:
            metrics["kl"].append(global_mean(kl.detach()))
        metrics["entropy"].append(global_mean(entropies))
        if self.loss_type == "vespo":  # TRL's own (detached) gamma weights of the unmasked advantages
            a = self.args
            phi = self.get_gamma_weights(advantages, logp - old, mask, is_ratio, a.vespo_k_pos,
                                         a.vespo_lambda_pos, a.vespo_k_neg, a.vespo_lambda_neg)  # fmt: skip
            metrics["vespo/phi_seq_mean"].append(global_mean(phi))
            return
        ratio = torch.exp(_log_ratio(logp, old, mask, self.importance_sampling_level))
        if self.loss_type == "sapo":
            return
        if self.loss_type == "cispo":
            metrics["cispo_clip_ratio"].append(
                global_mean(((ratio > self.epsilon_high) & (advantages > 0)).float())
            )
            return
        low = ((ratio < 1 - self.epsilon_low) & (advantages < 0)).float()
        high = ((ratio > 1 + self.epsilon_high) & (advantages > 0)).float()

        def per_seq(x):
            return x.squeeze(1) if x.shape[1] == 1 else (x * mask).sum(-1) / mask.sum(-1)

        metrics["clip_ratio/low_mean"].append(global_mean(low))
        metrics["clip_ratio/high_mean"].append(global_mean(high))
        metrics["clip_ratio/region_mean"].append(global_mean(torch.maximum(low, high)))
        metrics["clip_ratio/low_min"].append(trl_utils.nanmin(self.accelerator.gather(per_seq(low))).item())
        metrics["clip_ratio/high_max"].append(trl_utils.nanmax(self.accelerator.gather(per_seq(high))).item())


def _text(completion) -> str:
    """A completion's decoded text: TRL passes a string, or (conversational) a list of messages; a message
    with tool calls counts as text."""
    if isinstance(completion, str):
        return completion
    parts = []
    for message in completion if isinstance(completion, list) else [completion]:
        if not isinstance(message, dict):
            return str(message)
        if message.get("tool_calls"):
            return "<tool call>"
        content = message.get("content")
        parts.append(content if isinstance(content, str) else "" if content is None else str(content))
    return "".join(parts)


def _log_ratio(logp, old, mask, level: str) -> torch.Tensor:
    """TRL's log importance weights: [B, T] per token, or [B, 1] the row's masked mean (differentiable)."""
    log_ratio = logp - old
    if level == "sequence":
        return ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    return log_ratio


# The multimodal inputs TRL's _compute_loss passes through to the model.
_MULTIMODAL_KEYS = (
    "pixel_values", "image_grid_thw", "num_images", "pixel_attention_mask", "spatial_shapes", "num_tiles",
    "image_sizes", "token_type_ids", "mm_token_type_ids", "image_position_ids",
)  # fmt: skip
