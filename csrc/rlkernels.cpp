// Every rlkernels op schema, in one place. The CPU implementations live in csrc/cpu/<op>.cpp
// (TORCH_LIBRARY_IMPL(rlkernels, CPU, m)), the CUDA ones in csrc/cuda/<op>_binding.cpp; fake (meta)
// implementations and autograd formulas are registered from Python in rlkernels/ops/<op>.py.
#include <ATen/Parallel.h>
#include <pybind11/pybind11.h>
#include <torch/library.h>

TORCH_LIBRARY(rlkernels, m) {
  // ---- kl_penalty: per-token KL estimators (rlkernels/ops/kl.py) ----
  // kind: "k1" | "abs" | "k2" | "k3" | "k1+" | "k3+"; clamp bounds k3's output (None: unbounded).
  m.def("kl_penalty(Tensor logp, Tensor ref_logp, str kind, float? clamp) -> Tensor");
  // d loss / d logp; d loss / d ref_logp is its negative.
  m.def("kl_penalty_backward(Tensor grad, Tensor logp, Tensor ref_logp, str kind, float? clamp) -> Tensor");

  // ---- advantages: group advantages and GAE / discounted returns (rlkernels/ops/{advantages,gae}.py) ----
  // Outputs are constants for the loss: no backward ops.
  // rewards [B]; groups: group_ids [B] (any integers), or contiguous blocks of group_size when None.
  // mode: "grpo" | "dr_grpo" | "rloo" | "batch".
  m.def("group_advantages(Tensor rewards, Tensor? group_ids, int group_size, str mode, float eps) -> Tensor");
  // rewards, values, mask [B, T], or packed [N] with cu_seqlens [S + 1]; mask bool or rewards' dtype.
  // -> (advantages, returns); whiten: verl masked_whiten of the advantages.
  m.def(
      "gae(Tensor rewards, Tensor values, Tensor mask, Tensor? cu_seqlens, float gamma, float lam, bool whiten) "
      "-> (Tensor, Tensor)");
  // REINFORCE++ returns (the running return resets after a masked token), same layouts as gae.
  m.def("discounted_returns(Tensor rewards, Tensor mask, Tensor? cu_seqlens, float gamma) -> Tensor");

  // ---- policy_loss: clipped / CISPO / SAPO policy terms + KL + entropy (rlkernels/ops/policy_loss.py) ----
  // logp, old_logp, ref_logp, entropy: [B, T] of one float dtype; advantages, is_weights: [B] or [B, T];
  // mask: [B, T] bool or of the accumulation type (fp32; fp64 for fp64 inputs). Returns the per-row masked
  // loss sums [B], the per-row sums behind the stats [B, 9] (column order in csrc/include/rlkernels/
  // policy_loss.h, RowStat), and, when save_grad, d(row sum)/d logp [B, T] (else an empty tensor); all in
  // the accumulation type. Disabled options: dual_clip/ratio_cap/kl_clamp None; kl_kind is unused without
  // ref_logp.
  m.def(
      "policy_loss(Tensor logp, Tensor old_logp, Tensor advantages, Tensor mask, Tensor? ref_logp, "
      "Tensor? entropy, Tensor? is_weights, str objective, bool seq_level, float clip_low, float clip_high, "
      "float? dual_clip, float? ratio_cap, float tau_pos, float tau_neg, float kl_coef, str kl_kind, "
      "float? kl_clamp, float entropy_coef, bool save_grad) -> (Tensor, Tensor, Tensor)");
  // grad_rows [B]: d loss / d row sum. Uses saved_grad when it is not empty, else recomputes the tokens.
  // Returns d loss / d logp [B, T] when logp_grad and d loss / d entropy [B, T] when entropy_grad (else
  // empty tensors).
  m.def(
      "policy_loss_backward(Tensor grad_rows, Tensor row_stats, Tensor saved_grad, Tensor logp, "
      "Tensor old_logp, Tensor advantages, Tensor mask, Tensor? ref_logp, Tensor? entropy, "
      "Tensor? is_weights, str objective, bool seq_level, float clip_low, float clip_high, float? dual_clip, "
      "float? ratio_cap, float tau_pos, float tau_neg, float kl_coef, str kl_kind, float? kl_clamp, "
      "float entropy_coef, bool logp_grad, bool entropy_grad) -> (Tensor, Tensor)");

  // ---- value_loss: clipped PPO critic loss (rlkernels/ops/value_loss.py) ----
  // values, old_values, returns: [B, T] of one float dtype; mask: [B, T] bool or of the accumulation type;
  // clip None: unclipped. Returns the per-row masked loss sums [B] and the per-row [count, clipped] sums
  // [B, 2], in the accumulation type.
  m.def("value_loss(Tensor values, Tensor old_values, Tensor returns, Tensor mask, float? clip) -> (Tensor, Tensor)");
  // grad_rows [B]: d loss / d row sum. Returns d loss / d values [B, T].
  m.def(
      "value_loss_backward(Tensor grad_rows, Tensor values, Tensor old_values, Tensor returns, Tensor mask, "
      "float? clip) -> Tensor");
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
