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

  // ---- log-probs and entropy over a vocabulary (rlkernels/ops/logprobs.py) ----
  // Rows: hidden [N, D] / logits [N, V], labels [N] int32/int64 (ignore_index rows give 0 and no gradient).
  // Outputs (logp [N], entropy [N] or [0] when not return_entropy, lse [N]) in fp32 (fp64 for fp64 inputs);
  // lse is the per-row statistic the backward needs (never an [N, V] tensor).
  m.def(
      "logprobs_from_logits(Tensor logits, Tensor labels, float temperature, float? softcap, int ignore_index, "
      "bool return_entropy) -> (Tensor, Tensor, Tensor)");
  // d loss / d logits [N, V] in the logits' dtype; grad_entropy None when the entropy gets no gradient.
  m.def(
      "logprobs_from_logits_backward(Tensor grad_logp, Tensor? grad_entropy, Tensor logits, Tensor labels, "
      "Tensor lse, Tensor entropy, float temperature, float? softcap, int ignore_index) -> Tensor");
  // z = softcap(hidden @ weight.T + bias) / temperature, reduced in chunks of chunk_size vocabulary columns.
  m.def(
      "linear_logprobs(Tensor hidden, Tensor weight, Tensor labels, Tensor? bias, float temperature, "
      "float? softcap, int ignore_index, bool return_entropy, int? chunk_size) -> (Tensor, Tensor, Tensor)");
  // (d hidden, d weight, d bias), each an empty [0] tensor where output_mask says it is not needed.
  m.def(
      "linear_logprobs_backward(Tensor grad_logp, Tensor? grad_entropy, Tensor hidden, Tensor weight, "
      "Tensor labels, Tensor? bias, Tensor lse, Tensor entropy, float temperature, float? softcap, "
      "int ignore_index, bool[3] output_mask, int? chunk_size) -> (Tensor, Tensor, Tensor)");
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
