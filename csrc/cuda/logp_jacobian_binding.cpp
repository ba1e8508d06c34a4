// The frozen head's vocabulary stream on CUDA tensors (rlkernels/ops/logp_jacobian.py runs the loop and the
// cuBLAS GEMMs): checks of the layout the kernels of logp_jacobian.cu read, device guard and stream. Direct
// torch.ops callers get a clear error; the Python path always passes this layout.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "logp_jacobian.h"
#include "rlkernels/torch_utils.h"

namespace rlk {
namespace {

void check_rows(const char* op, const at::Tensor& t, const char* name, int64_t rows, at::ScalarType dtype) {
  TORCH_CHECK(t.dim() == 2 && t.size(0) == rows && t.stride(1) == 1, op, ": ", name,
              " must be [rows, n] with unit column stride, got ", t.sizes(), " strides ", t.strides());
  TORCH_CHECK(t.scalar_type() == dtype, op, ": ", name, " must be ", dtype, ", got ", t.scalar_type());
}

void check_labels(const char* op, const at::Tensor& labels, int64_t rows) {
  TORCH_CHECK(labels.dim() == 1 && labels.size(0) == rows && labels.is_contiguous() &&
                  labels.scalar_type() == at::kLong,
              op, ": labels must be contiguous int64 [", rows, "], got ", labels.scalar_type(), " ", labels.sizes());
}

void logp_jacobian_chunk_cuda(const at::Tensor& z, const at::Tensor& e, const at::Tensor& acc,
                              const at::Tensor& labels, const std::optional<at::Tensor>& bias, const at::Tensor& state,
                              int64_t v0, int64_t vocab, double temperature, std::optional<double> softcap,
                              int64_t ignore_index) {
  constexpr const char* op = "rlkernels::logp_jacobian_chunk";
  const int64_t rows = z.size(0), cols = z.size(1);
  const at::ScalarType head = e.scalar_type(), acc_t = acc_scalar_type(head);
  check_rows(op, z, "z", rows, acc_t);
  check_rows(op, e, "e", rows, head);
  check_rows(op, acc, "acc", rows, acc_t);
  TORCH_CHECK(e.size(1) == cols, op, ": e must have z's shape ", z.sizes(), ", got ", e.sizes());
  check_labels(op, labels, rows);
  TORCH_CHECK(state.is_contiguous() && state.dim() == 2 && state.size(0) == 5 && state.size(1) == rows &&
                  state.scalar_type() == acc_t,
              op, ": state must be contiguous ", acc_t, " [5, ", rows, "], got ", state.sizes());
  if (bias) {
    TORCH_CHECK(bias->is_contiguous() && bias->numel() == vocab && bias->scalar_type() == head, op,
                ": bias must be contiguous ", head, " [", vocab, "]");
  }
  TORCH_CHECK(v0 >= 0 && v0 + cols <= vocab, op, ": the chunk [", v0, ", ", v0 + cols, ") must lie in [0, ", vocab,
              ")");
  const c10::cuda::CUDAGuard guard(z.device());
  const cudaError_t err = cuda::logp_jacobian_chunk(
      to_dtype(e), z.const_data_ptr(), z.stride(0), e.mutable_data_ptr(), e.stride(0), acc.mutable_data_ptr(),
      acc.stride(0), labels.const_data_ptr<int64_t>(), bias ? bias->const_data_ptr() : nullptr,
      state.mutable_data_ptr(), rows, cols, acc.size(1), vocab, v0, temperature, softcap.value_or(0.0), ignore_index,
      c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, op, ": CUDA launch failed: ", cudaGetErrorString(err));
}

void logp_jacobian_finish_cuda(const at::Tensor& acc, const at::Tensor& state, const at::Tensor& labels,
                               const at::Tensor& weight, const at::Tensor& out, const at::Tensor& logp,
                               const std::optional<at::Tensor>& sum_sq, double temperature,
                               std::optional<double> /*softcap: its slope at the label is in the state*/,
                               int64_t ignore_index) {
  constexpr const char* op = "rlkernels::logp_jacobian_finish";
  const int64_t rows = acc.size(0), dim = acc.size(1);
  const at::ScalarType head = weight.scalar_type(), acc_t = acc_scalar_type(head);
  check_rows(op, acc, "acc", rows, acc_t);
  TORCH_CHECK(out.dim() == 2 && out.size(0) == rows && out.stride(1) == 1, op,
              ": out must be [rows, dim] with unit column stride, got ", out.sizes(), " strides ", out.strides());
  TORCH_CHECK(out.scalar_type() == head || out.scalar_type() == acc_t, op, ": out must be ", head, " or ", acc_t,
              ", got ", out.scalar_type());
  check_labels(op, labels, rows);
  TORCH_CHECK(weight.dim() == 2 && weight.size(1) == dim, op, ": weight must be [V, ", dim, "], got ", weight.sizes());
  TORCH_CHECK(out.size(1) == dim, op, ": out must be [", rows, ", ", dim, "], got ", out.sizes());
  TORCH_CHECK(state.is_contiguous() && state.dim() == 2 && state.size(0) == 5 && state.size(1) == rows &&
                  state.scalar_type() == acc_t,
              op, ": state must be contiguous ", acc_t, " [5, ", rows, "], got ", state.sizes());
  for (const at::Tensor* t : {&logp, sum_sq ? &*sum_sq : nullptr}) {
    if (t == nullptr) continue;
    TORCH_CHECK(t->is_contiguous() && t->numel() == rows && t->scalar_type() == acc_t, op,
                ": logp and sum_sq must be contiguous ", acc_t, " [", rows, "]");
  }
  const c10::cuda::CUDAGuard guard(acc.device());
  const cudaError_t err = cuda::logp_jacobian_finish(
      to_dtype(weight), acc.const_data_ptr(), acc.stride(0), state.const_data_ptr(), labels.const_data_ptr<int64_t>(),
      weight.const_data_ptr(), weight.stride(0), weight.stride(1), out.scalar_type() != head, out.mutable_data_ptr(),
      out.stride(0), logp.mutable_data_ptr(), sum_sq ? sum_sq->mutable_data_ptr() : nullptr, rows, dim, weight.size(0),
      temperature, ignore_index, c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, op, ": CUDA launch failed: ", cudaGetErrorString(err));
}

}  // namespace

TORCH_LIBRARY_IMPL(rlkernels, CUDA, m) {
  m.impl("logp_jacobian_chunk", &logp_jacobian_chunk_cuda);
  m.impl("logp_jacobian_finish", &logp_jacobian_finish_cuda);
}

}  // namespace rlk
