// linear_logprobs and logprobs_from_logits on CUDA tensors: checks, device guard and stream, the chunked cuBLAS
// GEMMs of linear_logprobs (through ATen), and the torch-free row kernels of logprobs.cu.
//
// linear_logprobs here mirrors the CPU algorithm with every row in one block: vocabulary slices of C columns,
// logits of a slice as ONE [N, C] fp32 GEMM output (cuBLAS, fp32 accumulation; bf16/fp16 inputs stay in
// their dtype via mm's out_dtype), then the row kernel. The backward writes the softmax gradient of the slice
// in the input dtype (the tensor-core operand), then d weight[slice] = dzᵀ @ hidden as one GEMM over all
// rows (no cross-row reduction outside cuBLAS) and d hidden += dz @ weight[slice] in fp32. The Triton backend
// is the default on GPUs (no [N, C] fp32 round trip); this flavor is the cuBLAS-based alternative.
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <algorithm>
#include <limits>

#include "launch_counter.h"
#include "logprobs.h"
#include "rlkernels/logprobs_host.h"

namespace rlk {
namespace {

// Bytes of the per-slice buffers (fp32 logits + the input-dtype gradient) when chunk_size is not given:
// 256 MiB keeps C >= 8k columns at 8k tokens, a small fraction of the N·V·4 bytes eager materializes.
constexpr int64_t kSliceBytes = int64_t(256) << 20;
// Fewest columns of an automatic slice: keeps the slice GEMMs wide enough for the tensor cores.
constexpr int64_t kMinCols = 1024;

void check_cuda(cudaError_t err, const char* op) {
  TORCH_CHECK(err == cudaSuccess, op, ": CUDA launch failed: ", cudaGetErrorString(err));
}

int64_t slice_columns(int64_t n, int64_t vocab, int64_t bytes_per_logit, std::optional<int64_t> chunk_size) {
  if (chunk_size.has_value()) return std::min(*chunk_size, vocab);
  return std::min(vocab, std::max(kMinCols, kSliceBytes / (std::max<int64_t>(n, 1) * bytes_per_logit)));
}

// out [n, c] (acc dtype) = hidden @ w.T with fp32 (fp64) accumulation and output.
void logits_gemm(at::Tensor& out, const at::Tensor& hidden, const at::Tensor& w) {
  if (hidden.scalar_type() == out.scalar_type()) {
    at::mm_out(out, hidden, w.t());
  } else {
    at::mm_out(out, hidden, w.t(), out.scalar_type());
  }
}

// Running statistics (m, s, a, s2) and target logits of n rows, initialized to "nothing seen" (s2 [0] when
// Σ softmax² is not asked for).
struct RowStats {
  at::Tensor m, s, a, s2, z_target;

  RowStats(int64_t n, const at::TensorOptions& opts, bool sum_sq)
      : m(at::full({n}, -std::numeric_limits<double>::infinity(), opts)),
        s(at::zeros({n}, opts)),
        a(at::zeros({n}, opts)),
        s2(at::zeros({sum_sq ? n : 0}, opts)),
        // NaN until the label's column is seen: an out-of-range label (never checked on the GPU without a
        // sync) gives a NaN log-prob instead of a silent number.
        z_target(at::full({n}, std::numeric_limits<double>::quiet_NaN(), opts)) {}
};

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> finalize(const RowStats& st, const at::Tensor& labels,
                                                                    cuda::LogitArgs args, const char* op) {
  const int64_t n = labels.size(0);
  const auto opts = st.m.options();
  at::Tensor logp = at::empty({n}, opts), lse = at::empty({n}, opts.dtype(at::kDouble));
  at::Tensor entropy = at::empty({args.entropy ? n : 0}, opts);
  at::Tensor sum_sq = at::empty({args.sum_sq ? n : 0}, opts);
  check_cuda(cuda::softmax_rows_finalize(to_dtype(st.m), st.m.const_data_ptr(), st.s.const_data_ptr(),
                                         st.a.const_data_ptr(), args.sum_sq ? st.s2.const_data_ptr() : nullptr,
                                         st.z_target.const_data_ptr(), labels.const_data_ptr<int64_t>(), n, args,
                                         logp.mutable_data_ptr(), args.entropy ? entropy.mutable_data_ptr() : nullptr,
                                         lse.mutable_data_ptr(), args.sum_sq ? sum_sq.mutable_data_ptr() : nullptr,
                                         c10::cuda::getCurrentCUDAStream()),
             op);
  return {logp, entropy, lse, sum_sq};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> logprobs_from_logits_cuda(
    const at::Tensor& logits, const at::Tensor& labels, double temperature, std::optional<double> softcap,
    int64_t ignore_index, bool return_entropy, bool return_sum_pi_squared) {
  constexpr const char* op = "rlkernels::logprobs_from_logits";
  TORCH_CHECK(logits.dim() == 2 && logits.size(1) >= 1, op, ": logits must be [N, V] with V >= 1, got ",
              logits.sizes());
  const int64_t n = logits.size(0), vocab = logits.size(1);
  check_logprob_labels(op, labels, n, vocab, ignore_index);
  check_temperature_softcap(op, temperature, softcap);
  const c10::cuda::CUDAGuard guard(logits.device());
  const at::Tensor x = logits.stride(1) == 1 ? logits : logits.contiguous();
  const at::Tensor y = labels.to(at::kLong).contiguous();
  const cuda::LogitArgs args{temperature, softcap.value_or(0.0), ignore_index, return_entropy, return_sum_pi_squared};
  RowStats st(n, x.options().dtype(logprob_acc_dtype(x.scalar_type())), return_sum_pi_squared);
  check_cuda(cuda::softmax_rows_stats(to_dtype(x), x.const_data_ptr(), x.stride(0), n, vocab, 0, nullptr,
                                      y.const_data_ptr<int64_t>(), args, st.m.mutable_data_ptr(),
                                      st.s.mutable_data_ptr(), st.a.mutable_data_ptr(),
                                      return_sum_pi_squared ? st.s2.mutable_data_ptr() : nullptr,
                                      st.z_target.mutable_data_ptr(), c10::cuda::getCurrentCUDAStream()),
             op);
  return finalize(st, y, args, op);
}

// Per-row inputs of a backward, contiguous in the accumulation dtype, lse in float64 (null pointers without
// entropy).
struct RowGrads {
  at::Tensor lse, entropy, g_logp, g_ent;

  RowGrads(const at::Tensor& grad_logp, const std::optional<at::Tensor>& grad_entropy, const at::Tensor& lse_,
           const at::Tensor& entropy_, at::ScalarType acc)
      : lse(lse_.to(at::kDouble).contiguous()), g_logp(grad_logp.to(acc).contiguous()) {
    if (grad_entropy.has_value()) {
      entropy = entropy_.to(acc).contiguous();
      g_ent = grad_entropy->to(acc).contiguous();
    }
  }
  const void* ptr(const at::Tensor& t) const { return t.defined() ? t.const_data_ptr() : nullptr; }
};

void check_row_grads(const char* op, const at::Tensor& grad_logp, const std::optional<at::Tensor>& grad_entropy,
                     const at::Tensor& lse, const at::Tensor& entropy, int64_t n) {
  check_row_vector(op, grad_logp, "grad_logp", n);
  check_row_vector(op, lse, "lse", n);
  if (grad_entropy.has_value()) {
    check_row_vector(op, *grad_entropy, "grad_entropy", n);
    check_row_vector(op, entropy, "entropy", n);
  }
}

at::Tensor logprobs_from_logits_backward_cuda(const at::Tensor& grad_logp,
                                              const std::optional<at::Tensor>& grad_entropy,
                                              const at::Tensor& logits, const at::Tensor& labels,
                                              const at::Tensor& lse, const at::Tensor& entropy, double temperature,
                                              std::optional<double> softcap, int64_t ignore_index) {
  constexpr const char* op = "rlkernels::logprobs_from_logits_backward";
  TORCH_CHECK(logits.dim() == 2, op, ": logits must be 2-D [N, V], got ", logits.sizes());
  const int64_t n = logits.size(0), vocab = logits.size(1);
  check_logprob_labels(op, labels, n, vocab, ignore_index);
  check_temperature_softcap(op, temperature, softcap);
  check_row_grads(op, grad_logp, grad_entropy, lse, entropy, n);
  const c10::cuda::CUDAGuard guard(logits.device());
  const at::Tensor x = logits.stride(1) == 1 ? logits : logits.contiguous();
  const at::Tensor y = labels.to(at::kLong).contiguous();
  const RowGrads g(grad_logp, grad_entropy, lse, entropy, logprob_acc_dtype(x.scalar_type()));
  const cuda::LogitArgs args{temperature, softcap.value_or(0.0), ignore_index, grad_entropy.has_value(), false};
  at::Tensor grad = at::empty({n, vocab}, x.options());
  check_cuda(cuda::softmax_rows_grad(to_dtype(x), x.const_data_ptr(), x.stride(0), to_dtype(grad),
                                     grad.mutable_data_ptr(), vocab, n, vocab, 0, nullptr,
                                     y.const_data_ptr<int64_t>(), args, g.lse.const_data_ptr(), g.ptr(g.entropy),
                                     g.g_logp.const_data_ptr(), g.ptr(g.g_ent), c10::cuda::getCurrentCUDAStream()),
             op);
  return grad;
}

// logprobs_from_logits_checked: one launch (logits_rows), the labels checked into the fifth output; no value
// check on the host (it would sync).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> logprobs_from_logits_checked_cuda(
    const at::Tensor& logits, const at::Tensor& labels, double temperature, std::optional<double> softcap,
    int64_t ignore_index, bool return_entropy, bool return_sum_pi_squared) {
  constexpr const char* op = "rlkernels::logprobs_from_logits_checked";
  TORCH_CHECK(logits.dim() == 2 && logits.size(1) >= 1, op, ": logits must be [N, V] with V >= 1, got ",
              logits.sizes());
  const int64_t n = logits.size(0), vocab = logits.size(1);
  check_logprob_label_shape(op, labels, n);
  check_temperature_softcap(op, temperature, softcap);
  const c10::cuda::CUDAGuard guard(logits.device());
  const at::Tensor x = logits.stride(1) == 1 ? logits : logits.contiguous();
  const at::Tensor y = labels.scalar_type() == at::kLong ? labels.contiguous() : labels.to(at::kLong).contiguous();
  const auto opts = x.options().dtype(logprob_acc_dtype(x.scalar_type()));
  at::Tensor logp = at::empty({n}, opts), lse = at::empty({n}, opts.dtype(at::kDouble));
  at::Tensor entropy = at::empty({return_entropy ? n : 0}, opts);
  at::Tensor sum_sq = at::empty({return_sum_pi_squared ? n : 0}, opts);
  at::Tensor ok = at::empty({}, x.options().dtype(at::kBool));
  if (n == 0) return {logp, entropy, lse, sum_sq, ok.fill_(true)};
  const at::Tensor parts = at::empty({n}, x.options().dtype(at::kFloat));
  const cuda::LogitArgs args{temperature, softcap.value_or(0.0), ignore_index, return_entropy, return_sum_pi_squared};
  check_cuda(cuda::logits_rows(to_dtype(x), x.const_data_ptr(), x.stride(0), n, vocab, y.const_data_ptr<int64_t>(),
                               args, logp.mutable_data_ptr(), return_entropy ? entropy.mutable_data_ptr() : nullptr,
                               lse.mutable_data_ptr(), return_sum_pi_squared ? sum_sq.mutable_data_ptr() : nullptr,
                               parts.mutable_data_ptr<float>(), launch_counter(x), ok.mutable_data_ptr<bool>(),
                               c10::cuda::getCurrentCUDAStream()),
             op);
  return {logp, entropy, lse, sum_sq, ok};
}

// An upstream per-row gradient expanded from one element (the gradient of .sum()) in the accumulation dtype.
bool expanded_row_grad(const at::Tensor& g, at::ScalarType acc) {
  return g.numel() > 0 && g.stride(0) == 0 && g.scalar_type() == acc;
}

// Its backward: one launch; grad_logp None when only the entropy reaches the loss.
at::Tensor logprobs_from_logits_checked_backward_cuda(const std::optional<at::Tensor>& grad_logp,
                                                      const std::optional<at::Tensor>& grad_entropy,
                                                      const at::Tensor& logits, const at::Tensor& labels,
                                                      const at::Tensor& lse, const at::Tensor& entropy,
                                                      double temperature, std::optional<double> softcap,
                                                      int64_t ignore_index) {
  constexpr const char* op = "rlkernels::logprobs_from_logits_checked_backward";
  TORCH_CHECK(logits.dim() == 2, op, ": logits must be 2-D [N, V], got ", logits.sizes());
  const int64_t n = logits.size(0), vocab = logits.size(1);
  check_logprob_label_shape(op, labels, n);
  check_temperature_softcap(op, temperature, softcap);
  check_row_vector(op, lse, "lse", n);
  if (grad_logp.has_value()) check_row_vector(op, *grad_logp, "grad_logp", n);
  if (grad_entropy.has_value()) {
    check_row_vector(op, *grad_entropy, "grad_entropy", n);
    check_row_vector(op, entropy, "entropy", n);
  }
  TORCH_CHECK(grad_logp.has_value() || grad_entropy.has_value(), op, ": no gradient given");
  const c10::cuda::CUDAGuard guard(logits.device());
  const at::Tensor x = logits.stride(1) == 1 ? logits : logits.contiguous();
  const at::Tensor y = labels.scalar_type() == at::kLong ? labels.contiguous() : labels.to(at::kLong).contiguous();
  const at::ScalarType acc = logprob_acc_dtype(x.scalar_type());
  // One stride for both upstream gradients: 0 (read as they are) when every one given is expanded, else 1.
  const bool expanded = (!grad_logp.has_value() || expanded_row_grad(*grad_logp, acc)) &&
                        (!grad_entropy.has_value() || expanded_row_grad(*grad_entropy, acc));
  const auto per_row = [&](const std::optional<at::Tensor>& g) {
    return !g.has_value() ? at::Tensor() : (expanded ? *g : g->to(acc).contiguous());
  };
  const at::Tensor g_logp = per_row(grad_logp), g_ent = per_row(grad_entropy);
  const at::Tensor l = lse.scalar_type() == at::kDouble ? lse.contiguous() : lse.to(at::kDouble).contiguous();
  const at::Tensor h = grad_entropy.has_value() ? entropy.to(acc).contiguous() : at::Tensor();
  const cuda::LogitArgs args{temperature, softcap.value_or(0.0), ignore_index, grad_entropy.has_value(), false};
  at::Tensor grad = at::empty({n, vocab}, x.options());
  const auto ptr = [](const at::Tensor& t) -> const void* { return t.defined() ? t.const_data_ptr() : nullptr; };
  check_cuda(cuda::softmax_rows_grad(to_dtype(x), x.const_data_ptr(), x.stride(0), to_dtype(grad),
                                     grad.mutable_data_ptr(), vocab, n, vocab, 0, nullptr, y.const_data_ptr<int64_t>(),
                                     args, l.const_data_ptr(), ptr(h), ptr(g_logp), ptr(g_ent),
                                     c10::cuda::getCurrentCUDAStream(), expanded ? 0 : 1),
             op);
  return grad;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> linear_logprobs_cuda(
    const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& labels, const std::optional<at::Tensor>& bias,
    double temperature, std::optional<double> softcap, int64_t ignore_index, bool return_entropy,
    bool return_sum_pi_squared, std::optional<int64_t> chunk_size) {
  constexpr const char* op = "rlkernels::linear_logprobs";
  check_linear_inputs(op, hidden, weight, bias, chunk_size);
  check_temperature_softcap(op, temperature, softcap);
  const int64_t n = hidden.size(0), vocab = weight.size(0);
  check_logprob_labels(op, labels, n, vocab, ignore_index);
  const c10::cuda::CUDAGuard guard(hidden.device());
  const at::ScalarType acc = logprob_acc_dtype(hidden.scalar_type());
  const auto opts = hidden.options().dtype(acc);
  const at::Tensor y = labels.to(at::kLong).contiguous();
  const cuda::LogitArgs args{temperature, softcap.value_or(0.0), ignore_index, return_entropy, return_sum_pi_squared};
  RowStats st(n, opts, return_sum_pi_squared);
  if (n > 0) {
    const at::Tensor b = bias.has_value() ? bias->to(acc).contiguous() : at::Tensor();
    const int64_t cols = slice_columns(n, vocab, at::elementSize(acc), chunk_size);
    const at::Tensor buf = at::empty({n * cols}, opts);
    const auto stream = c10::cuda::getCurrentCUDAStream();
    for (int64_t v0 = 0; v0 < vocab; v0 += cols) {
      const int64_t c = std::min(cols, vocab - v0);
      at::Tensor out = buf.narrow(0, 0, n * c).view({n, c});
      logits_gemm(out, hidden, weight.narrow(0, v0, c));
      const void* bias_ptr = b.defined() ? static_cast<const char*>(b.const_data_ptr()) + v0 * b.element_size()
                                         : nullptr;
      check_cuda(cuda::softmax_rows_stats(to_dtype(out), out.const_data_ptr(), c, n, c, v0, bias_ptr,
                                          y.const_data_ptr<int64_t>(), args, st.m.mutable_data_ptr(),
                                          st.s.mutable_data_ptr(), st.a.mutable_data_ptr(),
                                          return_sum_pi_squared ? st.s2.mutable_data_ptr() : nullptr,
                                          st.z_target.mutable_data_ptr(), stream),
                 op);
    }
  }
  return finalize(st, y, args, op);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> linear_logprobs_backward_cuda(
    const at::Tensor& grad_logp, const std::optional<at::Tensor>& grad_entropy, const at::Tensor& hidden,
    const at::Tensor& weight, const at::Tensor& labels, const std::optional<at::Tensor>& bias, const at::Tensor& lse,
    const at::Tensor& entropy, double temperature, std::optional<double> softcap, int64_t ignore_index,
    std::array<bool, 3> output_mask, std::optional<int64_t> chunk_size) {
  constexpr const char* op = "rlkernels::linear_logprobs_backward";
  check_linear_inputs(op, hidden, weight, bias, chunk_size);
  check_temperature_softcap(op, temperature, softcap);
  const int64_t n = hidden.size(0), vocab = weight.size(0), d = hidden.size(1);
  check_logprob_labels(op, labels, n, vocab, ignore_index);
  check_row_grads(op, grad_logp, grad_entropy, lse, entropy, n);
  const c10::cuda::CUDAGuard guard(hidden.device());
  const bool need_h = output_mask[0], need_w = output_mask[1], need_b = output_mask[2] && bias.has_value();
  const at::ScalarType dtype = hidden.scalar_type(), acc = logprob_acc_dtype(dtype);
  const auto acc_opts = hidden.options().dtype(acc);
  at::Tensor dh = need_h ? at::zeros({n, d}, acc_opts) : at::Tensor();
  at::Tensor gw = need_w ? at::empty({vocab, d}, weight.options()) : at::Tensor();
  at::Tensor db = need_b ? at::zeros({vocab}, acc_opts) : at::Tensor();
  if (n == 0 && need_w) gw.zero_();
  if (n > 0 && (need_h || need_w || need_b)) {
    const at::Tensor y = labels.to(at::kLong).contiguous();
    const RowGrads g(grad_logp, grad_entropy, lse, entropy, acc);
    const cuda::LogitArgs args{temperature, softcap.value_or(0.0), ignore_index, grad_entropy.has_value(), false};
    const at::Tensor b = bias.has_value() ? bias->to(acc).contiguous() : at::Tensor();
    const bool separate_dz = dtype != acc;  // 16-bit inputs: the gradient goes to a buffer of their dtype
    const int64_t per_logit = at::elementSize(acc) + (separate_dz ? at::elementSize(dtype) : 0);
    const int64_t cols = slice_columns(n, vocab, per_logit, chunk_size);
    const at::Tensor buf = at::empty({n * cols}, acc_opts);
    const at::Tensor dz_buf = separate_dz ? at::empty({n * cols}, hidden.options()) : buf;
    const auto stream = c10::cuda::getCurrentCUDAStream();
    for (int64_t v0 = 0; v0 < vocab; v0 += cols) {
      const int64_t c = std::min(cols, vocab - v0);
      const at::Tensor w = weight.narrow(0, v0, c);
      at::Tensor logits = buf.narrow(0, 0, n * c).view({n, c});
      at::Tensor dz = dz_buf.narrow(0, 0, n * c).view({n, c});
      logits_gemm(logits, hidden, w);
      const void* bias_ptr = b.defined() ? static_cast<const char*>(b.const_data_ptr()) + v0 * b.element_size()
                                         : nullptr;
      check_cuda(cuda::softmax_rows_grad(to_dtype(logits), logits.const_data_ptr(), c, to_dtype(dz),
                                         dz.mutable_data_ptr(), c, n, c, v0, bias_ptr, y.const_data_ptr<int64_t>(),
                                         args, g.lse.const_data_ptr(), g.ptr(g.entropy), g.g_logp.const_data_ptr(),
                                         g.ptr(g.g_ent), stream),
                 op);
      if (need_b) db.narrow(0, v0, c).add_(dz.sum(0, false, acc));
      if (need_w) {  // one GEMM over every row: d weight needs no reduction across row blocks
        at::Tensor gw_slice = gw.narrow(0, v0, c);
        at::mm_out(gw_slice, dz.t(), hidden);
      }
      if (need_h) {
        if (separate_dz) {
          dh.add_(at::mm(dz, w, acc));
        } else {
          dh.addmm_(dz, w);
        }
      }
    }
  }
  const auto empty = [](const at::Tensor& like) { return at::empty({0}, like.options()); };
  return {need_h ? dh.to(dtype) : empty(hidden), need_w ? gw : empty(weight),
          need_b ? db.to(bias->scalar_type()) : empty(weight)};
}

}  // namespace

TORCH_LIBRARY_IMPL(rlkernels, CUDA, m) {
  m.impl("logprobs_from_logits", &logprobs_from_logits_cuda);
  m.impl("logprobs_from_logits_backward", &logprobs_from_logits_backward_cuda);
  m.impl("logprobs_from_logits_checked", &logprobs_from_logits_checked_cuda);
  m.impl("logprobs_from_logits_checked_backward", &logprobs_from_logits_checked_backward_cuda);
  m.impl("linear_logprobs", &linear_logprobs_cuda);
  m.impl("linear_logprobs_backward", &linear_logprobs_backward_cuda);
}

}  // namespace rlk
