// Every rlkernels op schema, in one place. The CPU implementations live in csrc/cpu/<op>.cpp
// (TORCH_LIBRARY_IMPL(rlkernels, CPU, m)), the CUDA ones in csrc/cuda/<op>_binding.cpp; fake (meta)
// implementations and autograd formulas are registered from Python in rlkernels/ops/<op>.py.
#include <ATen/Parallel.h>
#include <pybind11/pybind11.h>
#include <torch/library.h>

#include "rlkernels/agg_config.h"
#include "rlkernels/policy_config.h"

TORCH_LIBRARY(rlkernels, m) {
  // ---- kl_penalty: per-token KL estimators (rlkernels/ops/kl.py) ----
  // kind: "k1" | "abs" | "k2" | "k3", each optionally followed by "+"; clamp bounds k3's output (None: unbounded).
  m.def("kl_penalty(Tensor logp, Tensor ref_logp, str kind, float? clamp) -> Tensor");
  // (d loss / d logp, d loss / d ref_logp = its negative), written by one pass; each an empty [0] tensor
  // unless asked for (logp_grad, ref_grad). grad: [...] as logp, or expanded from one element (stride 0).
  m.def(
      "kl_penalty_backward(Tensor grad, Tensor logp, Tensor ref_logp, str kind, float? clamp, bool logp_grad=True, "
      "bool ref_grad=False) -> (Tensor, Tensor)");
  // The public function's eager call (rlkernels/ops/kl.py): kl_penalty's, with its autograd node in C++
  // (csrc/autograd/kl_penalty.cpp): the backward pass never enters Python. No device kernel of its own.
  m.def("kl_penalty_autograd(Tensor logp, Tensor ref_logp, str kind, float? clamp) -> Tensor");

  // ---- log-probs and entropy over a vocabulary (rlkernels/ops/logprobs.py) ----
  // Rows: hidden [N, D] / logits [N, V], labels [N] int32/int64 (ignore_index rows give 0 and no gradient).
  // Outputs (logp [N], entropy [N] or [0] when not return_entropy, lse [N], sum_pi_squared [N] or [0] when not
  // return_sum_pi_squared) in fp32 (fp64 for fp64 inputs); lse is the per-row statistic the backward needs (never
  // an [N, V] tensor); sum_pi_squared = Σ softmax(z)² is forward-only (no gradient flows through it).
  m.def(
      "logprobs_from_logits(Tensor logits, Tensor labels, float temperature, float? softcap, int ignore_index, "
      "bool return_entropy, bool return_sum_pi_squared) -> (Tensor, Tensor, Tensor, Tensor)");
  // d loss / d logits [N, V] in the logits' dtype; grad_entropy None when the entropy gets no gradient.
  m.def(
      "logprobs_from_logits_backward(Tensor grad_logp, Tensor? grad_entropy, Tensor logits, Tensor labels, "
      "Tensor lse, Tensor entropy, float temperature, float? softcap, int ignore_index) -> Tensor");
  // The public function's pair (rlkernels/ops/logprobs_checked.py): the same outputs, and ok [] bool: every label
  // in [0, V) or ignore_index (a row with another gives 0); its backward takes a None grad_logp (a loss of the
  // entropy alone) and upstream gradients expanded from one element.
  m.def(
      "logprobs_from_logits_checked(Tensor logits, Tensor labels, float temperature, float? softcap, "
      "int ignore_index, bool return_entropy, bool return_sum_pi_squared) -> (Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.def(
      "logprobs_from_logits_checked_backward(Tensor? grad_logp, Tensor? grad_entropy, Tensor logits, Tensor labels, "
      "Tensor lse, Tensor entropy, float temperature, float? softcap, int ignore_index) -> Tensor");
  // The same gradient written over the logits (CPU only: the row sweep's block, docs/row_sweep.md).
  m.def(
      "logprobs_from_logits_backward_into_logits(Tensor grad_logp, Tensor? grad_entropy, Tensor(a!) logits, "
      "Tensor labels, Tensor lse, Tensor entropy, float temperature, float? softcap, int ignore_index) -> ()");
  // z = softcap(hidden @ weight.T + bias) / temperature, reduced in chunks of chunk_size vocabulary columns.
  m.def(
      "linear_logprobs(Tensor hidden, Tensor weight, Tensor labels, Tensor? bias, float temperature, "
      "float? softcap, int ignore_index, bool return_entropy, bool return_sum_pi_squared, int? chunk_size) "
      "-> (Tensor, Tensor, Tensor, Tensor)");
  // (d hidden, d weight, d bias), each an empty [0] tensor where output_mask says it is not needed.
  m.def(
      "linear_logprobs_backward(Tensor grad_logp, Tensor? grad_entropy, Tensor hidden, Tensor weight, "
      "Tensor labels, Tensor? bias, Tensor lse, Tensor entropy, float temperature, float? softcap, "
      "int ignore_index, bool[3] output_mask, int? chunk_size) -> (Tensor, Tensor, Tensor)");

  // ---- the frozen head's vocabulary stream (rlkernels/ops/logp_jacobian.py; CUDA only: the C++ CPU flavor
  // streams in ATen ops). A chunk of a block's logits z: e written, acc and state updated; then the block's
  // logp, sum_sq and d logp / d hidden rows (out, in the head's dtype).
  m.def(
      "logp_jacobian_chunk(Tensor z, Tensor(a!) e, Tensor(b!) acc, Tensor labels, Tensor? bias, Tensor(c!) state, "
      "int v0, int vocab, float temperature, float? softcap, int ignore_index) -> ()");
  m.def(
      "logp_jacobian_finish(Tensor acc, Tensor state, Tensor labels, Tensor weight, Tensor(a!) out, "
      "Tensor(b!) logp, Tensor(c!)? sum_sq, float temperature, float? softcap, int ignore_index) -> ()");

  // ---- rollout_correction in one pass over the tokens, finished in the same launch (rlkernels/ops/
  // rollout_correction.py; C++ on CPU, CUDA C++ and Triton on a GPU) ----
  // logp_old, logp_rollout [B, T] of one dtype, mask [B, T] bool, int64 (0 / 1) or float weights of the
  // accumulation type (nonzero: valid; rows with unit column stride); level 0 none, 1 token, 2 sequence.
  // -> (weights [B, T] / [B, 1] / [0], the mask with the rejected tokens zeroed [B, T] in its dtype (with a
  // rejection) or [0], metrics [17] (ops/rollout_correction.py METRICS order), ok [] bool: every mask value
  // valid), in fp32 (fp64 for fp64 inputs). Open bounds: inf / 0 / -inf; log_upper = log(clip_max), log_low =
  // log(the low bound).
  m.def(
      "rollout_correction(Tensor logp_old, Tensor logp_rollout, Tensor mask, int level, bool mask_mode, "
      "float clamp, float clip_min, float clip_max, float low_bound, str? rejection, float rej_low, "
      "float rej_high, bool batch_normalize, float log_upper, float log_low) -> (Tensor, Tensor, Tensor, Tensor)");

  // ---- the optimal token baseline (rlkernels/ops/advantage_estimators.py; C++ on CPU, CUDA C++ and Triton on a
  // GPU) ----
  // rewards, old_logp, sum_pi_squared, rollout_is_weights [B, T] float32/float64 (one dtype), mask [B, T] bool,
  // int64 (0 / 1) or that dtype, group_ids [B] int32/int64 (any integers) -> (advantages, returns [B, T] in that
  // dtype, ok [] bool: rewards finite, Σπ² and rollout_is_weights finite and >= 0, the mask's values valid).
  m.def(
      "optimal_token_baseline(Tensor rewards, Tensor mask, Tensor group_ids, Tensor old_logp, "
      "Tensor sum_pi_squared, Tensor? rollout_is_weights, bool handle_zero_tail, float eps) "
      "-> (Tensor, Tensor, Tensor)");

  // ---- grpo_passk and opo per response (rlkernels/ops/advantage_estimators.py broadcasts them to tokens) ----
  // scores [B] float32/float64, group_ids [B] int32/int64 (any integers) -> (advantages [B] in scores' dtype,
  // ok [] bool: every score finite).
  m.def("grpo_passk(Tensor scores, Tensor group_ids, float eps, bool norm_by_std) -> (Tensor, Tensor)");
  // mask [B, T] bool / int64 (0 / 1) / scores' dtype (weights): each row's sum is the response's length.
  m.def("opo(Tensor scores, Tensor mask, Tensor group_ids) -> (Tensor, Tensor)");

  // ---- advantages: group advantages and GAE / discounted returns (rlkernels/ops/{advantages,gae}.py) ----
  // Outputs are constants for the loss: no backward ops.
  // rewards [B]; groups: group_ids [B] (any integers), or contiguous blocks of group_size when None.
  // mode: "grpo" | "dr_grpo" | "rloo" | "batch". -> (advantages [B], ok [] bool: every reward finite).
  m.def(
      "group_advantages(Tensor rewards, Tensor? group_ids, int group_size, str mode, float eps) -> (Tensor, Tensor)");
  // scores [B, K] float32/float64, a column per reward function; weights [K] (None: all 1); mode as above
  // without a batch statistic (grpo, dr_grpo, rloo, with or without _trl). -> (Σ_k w_k advantages of column k
  // [B], ok: every score finite); renormalize: then TRL's batch pass, the sums as one group ("grpo") and a
  // group of one 0 with _trl (trl_grpo_advantages' normalize_then_sum; gdpo without).
  m.def(
      "group_advantages_sum(Tensor scores, Tensor? group_ids, int group_size, Tensor? weights, str mode, float eps, "
      "bool renormalize) -> (Tensor, Tensor)");
  // Per-row values adv [B] to the tokens: adv[b] * mask[b, t] [B, T] in adv's dtype; mask bool, int64 (0 / 1)
  // or adv's dtype (weights >= 0). -> (tokens, ok and every mask value valid); ok: the flag of the op that
  // wrote adv.
  m.def("advantage_tokens(Tensor adv, Tensor mask, Tensor ok) -> (Tensor, Tensor)");
  // verl's masked whitening of group advantages as tokens (reinforce_plus_plus_baseline, gdpo): scores [B, K]
  // and weights as group_advantages_sum's, group_ids [B], mask as advantage_tokens'. -> (masked_whiten(A[:, None]
  // * mask, mask) * mask [B, T] with A the weighted sum of the columns' advantages, ok: every score finite and
  // every mask value valid). CUDA: the group walk, the mask rows' moments and the statistics in one launch.
  m.def(
      "whitened_group_tokens(Tensor scores, Tensor group_ids, Tensor? weights, str mode, float eps, Tensor mask) "
      "-> (Tensor, Tensor)");
  // rewards, values, mask [B, T], or packed [N] with cu_seqlens [S + 1]; mask bool, int64 (0 / 1) or rewards'
  // dtype. -> (advantages, returns, ok); whiten: verl masked_whiten of the advantages. ok [] bool: every input
  // value valid (finite rewards and values, 0 / 1 integer masks, finite mask weights >= 0, cu_seqlens from 0,
  // non-decreasing, to N), set by the kernels (the CPU kernels raise on bad cu_seqlens instead).
  m.def(
      "gae(Tensor rewards, Tensor values, Tensor mask, Tensor? cu_seqlens, float gamma, float lam, bool whiten) "
      "-> (Tensor, Tensor, Tensor)");
  // REINFORCE++ returns (the running return resets after a masked token), same layouts as gae. -> (returns,
  // advantages, ok): advantages = masked_whiten(returns, mask) * mask with whiten (REINFORCE++), returns -
  // baseline[row] * mask with baseline [rows] (ReMax; finite, checked into ok), else an empty [0] tensor.
  m.def(
      "discounted_returns(Tensor rewards, Tensor mask, Tensor? cu_seqlens, float gamma, Tensor? baseline=None, "
      "bool whiten=False) -> (Tensor, Tensor, Tensor)");

  // ---- policy_loss: clipped / CISPO / SAPO policy terms + KL + entropy (rlkernels/ops/policy_loss.py) ----
  // logp, old_logp, ref_logp, entropy: [B, T] of one float dtype; advantages, is_weights: [B] or [B, T];
  // mask: [B, T] bool, uint8 / int32 / int64 (0 / 1: a Hugging Face attention_mask, read as it is) or float
  // weights of the accumulation type (fp32; fp64 for fp64 inputs). The options
  // (RLK_POLICY_CONFIG_SCHEMA) are rlkernels/policy_config.py PolicyConfig, the aggregation arguments
  // (RLK_AGG_CONFIG_SCHEMA) rlkernels/ops/_aggregation.py AggConfig: both from generated headers. Returns,
  // in the accumulation type: the loss [], the stat means [7] (policy_config.STAT_KEYS order), the row
  // weights d loss / d row sum [B], the per-row sums [B, kRowStats] (columns: RowStat, policy_config.ROW_STATS),
  // when save_grad, d(row sum) / d logp [B, T] (else an empty tensor), and ok [] bool: no input value the op
  // rejects (policy_loss.py BAD_VALUES: a NaN log-prob where the mask keeps the token, a non-finite advantage,
  // a negative or non-finite IS or mask weight, an integer mask value other than 0 and 1), checked by the
  // kernels as they read the values. The loss and its normalizers (a num_tokens / num_seqs tensor is read on
  // the device) are finished inside the op: on CUDA in the forward launch's last block
  // (csrc/cuda/loss_finish.cuh). rlkernels/ops/policy_loss.py builds the Triton op's schema from the same
  // tables (tests/test_op_schemas.py compares them).
  m.def(
      "policy_loss(Tensor logp, Tensor old_logp, Tensor advantages, Tensor mask, Tensor? ref_logp, "
      "Tensor? entropy, Tensor? is_weights, " RLK_POLICY_CONFIG_SCHEMA ", " RLK_AGG_CONFIG_SCHEMA
      ", bool save_grad) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)");
  // grad_loss: d output / d loss (one element); row_weights, row_stats, saved_grad: the forward's outputs.
  // Uses saved_grad when it is not empty, else recomputes the tokens; the kernel scales each row by
  // grad_loss · row_weights[b] itself (one launch on CUDA). Returns d output / d logp [B, T] when logp_grad
  // and d output / d entropy [B, T] when entropy_grad (else empty tensors).
  m.def(
      "policy_loss_backward(Tensor grad_loss, Tensor row_weights, Tensor row_stats, Tensor saved_grad, "
      "Tensor logp, Tensor old_logp, Tensor advantages, Tensor mask, Tensor? ref_logp, Tensor? entropy, "
      "Tensor? is_weights, " RLK_POLICY_CONFIG_SCHEMA ", bool logp_grad, bool entropy_grad) -> (Tensor, Tensor)");
  // For the eager backward pass (rlkernels/ops/policy_loss.py _consume_saved): the last read of the
  // forward's saved_grad scales it in place into d output / d logp (= grad_loss · row_weights[b] ·
  // saved_grad) and returns d output / d entropy [B, T] when entropy_grad (else an empty tensor), in one pass
  // (one launch on CUDA). mask: as policy_loss's.
  m.def(
      "policy_loss_backward_into_saved(Tensor(a!) saved_grad, Tensor grad_loss, Tensor row_weights, "
      "Tensor mask, float entropy_coef, bool entropy_grad) -> Tensor");
  // The public function's eager call (rlkernels/ops/policy_loss.py): policy_loss's arguments -> (loss, stat
  // means, ok), with its autograd node in C++ (csrc/autograd/policy_loss.cpp): the backward pass never enters
  // Python. No device kernel of its own: it calls the ops above.
  m.def(
      "policy_loss_autograd(Tensor logp, Tensor old_logp, Tensor advantages, Tensor mask, Tensor? ref_logp, "
      "Tensor? entropy, Tensor? is_weights, " RLK_POLICY_CONFIG_SCHEMA ", " RLK_AGG_CONFIG_SCHEMA
      ", bool save_grad) -> (Tensor, Tensor, Tensor)");

  // ---- value_loss: clipped PPO critic loss (rlkernels/ops/value_loss.py) ----
  // values, old_values, returns: [B, T] of one float dtype; mask: as policy_loss's; clip None: unclipped; the
  // aggregation arguments as policy_loss. Returns, in the accumulation type: the loss [], the clipped fraction
  // [1], the row weights d loss / d row sum [B], and ok [] bool: no input value the op rejects (value_loss.py
  // BAD_VALUES: a non-finite value, old value or return anywhere, a negative or non-finite mask weight, an
  // integer mask value other than 0 and 1), checked by the kernels. Finished inside the op as policy_loss.
  m.def(
      "value_loss(Tensor values, Tensor old_values, Tensor returns, Tensor mask, float? clip, "
      RLK_AGG_CONFIG_SCHEMA ") -> (Tensor, Tensor, Tensor, Tensor)");
  // grad_loss: d output / d loss (one element); row_weights: the forward's. Returns d output / d values
  // [B, T] (the kernel scales each row by grad_loss · row_weights[b] itself).
  m.def(
      "value_loss_backward(Tensor grad_loss, Tensor row_weights, Tensor values, Tensor old_values, "
      "Tensor returns, Tensor mask, float? clip) -> Tensor");
  // The public function's eager call (rlkernels/ops/value_loss.py): value_loss's arguments -> (loss, clipfrac,
  // ok), with its autograd node in C++ (csrc/autograd/value_loss.cpp): the backward pass never enters Python.
  m.def(
      "value_loss_autograd(Tensor values, Tensor old_values, Tensor returns, Tensor mask, float? clip, "
      RLK_AGG_CONFIG_SCHEMA ") -> (Tensor, Tensor, Tensor)");

  // ---- agg_loss: verl's agg_loss over a given token loss (rlkernels/ops/agg_loss.py) ----
  // loss_mat: [B, T] float; mask: as policy_loss's; the aggregation arguments as policy_loss. Returns, in the
  // accumulation type: the loss [], the row weights d loss / d row sum [B], and ok [] bool: no mask value the
  // op rejects (a negative or non-finite weight, an integer value other than 0 and 1). A NaN or inf of
  // loss_mat at a kept token is the loss's (verl); a masked-out one adds 0. Finished inside the op.
  m.def("agg_loss(Tensor loss_mat, Tensor mask, " RLK_AGG_CONFIG_SCHEMA ") -> (Tensor, Tensor, Tensor)");
  // grad_loss: d output / d loss (one element); row_weights: the forward's. Returns d output / d loss_mat
  // [B, T] = grad_loss · row_weights[b] · m, in loss_mat's dtype.
  m.def("agg_loss_backward(Tensor grad_loss, Tensor row_weights, Tensor loss_mat, Tensor mask) -> Tensor");
  // The public function's eager call (rlkernels/ops/agg_loss.py): agg_loss's arguments -> (loss, ok), with its
  // autograd node in C++ (csrc/autograd/agg_loss.cpp): the backward pass never enters Python.
  m.def("agg_loss_autograd(Tensor loss_mat, Tensor mask, " RLK_AGG_CONFIG_SCHEMA ") -> (Tensor, Tensor)");
}

namespace {

pybind11::dict build_info() {
  pybind11::dict info;
  info["version"] = RLK_VERSION;
#ifdef RLK_WITH_CUDA
  info["cuda"] = true;
  info["cuda_archs"] = RLK_CUDA_ARCHS;
#else
  info["cuda"] = false;
  info["cuda_archs"] = "";
#endif
  info["num_threads"] = at::get_num_threads();
  info["parallel"] = at::get_parallel_info();
  return info;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "rlkernels C++/CUDA kernels; the ops are registered under torch.ops.rlkernels";
  m.def("build_info", &build_info, "version, compiled CUDA archs and CPU threads of this build");
}
