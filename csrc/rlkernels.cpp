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
