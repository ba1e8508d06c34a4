// linear_logprobs and logprobs_from_logits on CUDA tensors: checks, device guard and stream, the blocked cuBLAS
// GEMMs of linear_logprobs (through ATen), and the torch-free row kernels of logprobs.cu.
//
// linear_logprobs here has the shape of the Triton flavor's GPU path (rlkernels/triton/linear_blocked.py, its
// budgets and their reasons in docs/gpu_linear.md) with the row kernels as its epilogues. The forward takes
// row blocks x vocabulary slices: each block's logits one fp32 GEMM output (cuBLAS, fp32 accumulation;
// bf16/fp16 inputs stay in their dtype via mm's out_dtype) small enough for the L2 cache, then the row kernel
// merges them into the rows' running statistics (its blocks wider than Triton's: a thread block a row). The
// backward takes row groups: per vocabulary slice it recomputes the group's logits block by block, writes
// their softmax gradient d z in the input dtype (the tensor-core operand), then d weight[slice] (+)= d zᵀ @
// hidden[group] and the group's fp32 d hidden += d z @ weight[slice], both cuBLAS GEMMs. The buffers' rows
// are 16-element aligned whatever the slice's width: cuBLAS's fast kernels want aligned rows (an odd width,
// 5461 columns, had this backward at 4.5x the GEMM floor on the H200, benchmarks/results/h200/2026-11-27/).
#include <ATen/ops/addmm.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdlib>
#include <limits>

#include "launch_counter.h"
#include "logprobs.h"
#include "rlkernels/logprobs_host.h"

namespace rlk {
namespace {

// The sizes of linear_blocked.py, for the same reasons (its comments say them in full):
// a logits block between a GEMM and its row kernel within the L2 cache (50 MiB on H100 / H200);
constexpr int64_t kBlockBytes = int64_t(32) << 20;
// forward blocks 8192 columns wide (1024 rows at kBlockBytes): the row kernel runs a thread block a row, so
// its rows are long (32 KiB of fp32 logits, against 4 KiB in Triton's 8192 x 1024 blocks, whose programs
// take 32 rows each), and 1024 of them are about 8 thread blocks an SM;
constexpr int64_t kForwardCols = 8192;
// the backward's three buffers (the group's fp32 d hidden, its d z slice, the logits block; a third each)
// within 1.5x the bytes of d hidden (Liger's chunked logits take about twice those), clamped to
// [96 MiB, 384 MiB] (below, the recompute GEMM leaves SMs idle; above, more row groups cost little);
constexpr double kWorkPerHidden = 1.5;
constexpr int64_t kWorkMinBytes = int64_t(96) << 20, kWorkCapBytes = int64_t(384) << 20;
// at least this many columns a slice, for the tensor cores;
constexpr int64_t kMinCols = 1024;
// and the buffers' row stride a multiple of this many elements (64-byte aligned fp32 rows).
constexpr int64_t kRowAlign = 16;

// Overrides of kForwardCols, kBlockBytes and the backward's work budget (a fixed number of bytes in place of
// the clamped 1.5x): RLK_CUDA_LINEAR_FORWARD_COLS, RLK_CUDA_LINEAR_BLOCK_BYTES, RLK_CUDA_LINEAR_WORK_BYTES.
// Unset in normal use; the tests run several row groups and blocks at small sizes with them, a GPU sweep
// other sizes without a rebuild.
int64_t size_from_env(const char* name, int64_t fallback) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? std::max<int64_t>(1, std::strtoll(value, nullptr, 10)) : fallback;
}

int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }
int64_t aligned_down(int64_t cols) { return std::max(kRowAlign, cols - cols % kRowAlign); }

// (rows, columns) of a forward logits block: kForwardCols columns (chunk_size when given), as many rows as
// kBlockBytes holds.
std::pair<int64_t, int64_t> forward_shape(int64_t n, int64_t vocab, int64_t acc_size,
                                          std::optional<int64_t> chunk_size) {
  const int64_t cols = std::max<int64_t>(
      1, std::min(vocab, chunk_size.value_or(size_from_env("RLK_CUDA_LINEAR_FORWARD_COLS", kForwardCols))));
  const int64_t block_bytes = size_from_env("RLK_CUDA_LINEAR_BLOCK_BYTES", kBlockBytes);
  return {std::max<int64_t>(1, std::min(n, block_bytes / (acc_size * cols))), cols};
}

struct BackwardShape {
  int64_t group, cols, rows;  // rows a group, columns a slice, rows a logits block
};

BackwardShape backward_shape(int64_t n, int64_t vocab, int64_t d, int64_t itemsize, int64_t acc_size,
                             std::optional<int64_t> chunk_size) {
  const double hidden_bytes = kWorkPerHidden * double(n) * double(d) * double(itemsize);
  const auto clamped =
      static_cast<int64_t>(std::min<double>(std::max<double>(hidden_bytes, kWorkMinBytes), kWorkCapBytes));
  const int64_t work = size_from_env("RLK_CUDA_LINEAR_WORK_BYTES", clamped);
  const int64_t part = std::max<int64_t>(1, work / 3);
  const int64_t group = std::max<int64_t>(1, std::min(n, part / (acc_size * std::max<int64_t>(d, 1))));
  int64_t cols = chunk_size.has_value() ? *chunk_size : std::max(kMinCols, aligned_down(part / (group * itemsize)));
  cols = std::max<int64_t>(1, std::min(vocab, cols));
  const int64_t block_bytes = size_from_env("RLK_CUDA_LINEAR_BLOCK_BYTES", kBlockBytes);
  const int64_t rows = std::max<int64_t>(1, std::min(group, std::min(part, block_bytes) / (acc_size * cols)));
  return {group, cols, rows};
}

// [rows, cols] of a flat buffer at row stride ld.
at::Tensor rows_view(const at::Tensor& flat, int64_t rows, int64_t cols, int64_t ld) {
  return flat.narrow(0, 0, rows * ld).view({rows, ld}).narrow(1, 0, cols);
}

// The element pointer of t at offset i (null for an undefined tensor).
const void* at_row(const at::Tensor& t, int64_t i) {
  return t.defined() ? static_cast<const char*>(t.const_data_ptr()) + i * t.element_size() : nullptr;
}
void* at_row_mut(at::Tensor& t, int64_t i) {
  return t.defined() ? static_cast<char*>(t.mutable_data_ptr()) + i * t.element_size() : nullptr;
}

void check_cuda(cudaError_t err, const char* op) {
  TORCH_CHECK(err == cudaSuccess, op, ": CUDA launch failed: ", cudaGetErrorString(err));
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
  RowStats st(n, x.options().dtype(acc_scalar_type(x.scalar_type())), return_sum_pi_squared);
  check_cuda(cuda::softmax_rows_stats(to_dtype(x), x.const_data_ptr(), x.stride(0), n, vocab, 0, nullptr,
                                      y.const_data_ptr<int64_t>(), args, st.m.mutable_data_ptr(),
                                      st.s.mutable_data_ptr(), st.a.mutable_data_ptr(),
                                      return_sum_pi_squared ? st.s2.mutable_data_ptr() : nullptr,
                                      st.z_target.mutable_data_ptr(), c10::cuda::getCurrentCUDAStream()),
             op);
  return finalize(st, y, args, op);
}

// Per-row inputs of a backward, contiguous in the accumulation dtype, lse in float64 (entropy and g_ent
// undefined without the entropy: at_row gives null pointers).
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
  const RowGrads g(grad_logp, grad_entropy, lse, entropy, acc_scalar_type(x.scalar_type()));
  const cuda::LogitArgs args{temperature, softcap.value_or(0.0), ignore_index, grad_entropy.has_value(), false};
  at::Tensor grad = at::empty({n, vocab}, x.options());
  check_cuda(cuda::softmax_rows_grad(to_dtype(x), x.const_data_ptr(), cuda::RowStrides::matrix(x.stride(0)),
                                     to_dtype(grad), grad.mutable_data_ptr(), vocab, n, vocab, 0, nullptr,
                                     y.const_data_ptr<int64_t>(), args, g.lse.const_data_ptr(), at_row(g.entropy, 0),
                                     g.g_logp.const_data_ptr(), at_row(g.g_ent, 0), c10::cuda::getCurrentCUDAStream()),
             op);
  return grad;
}

// The logits of the checked ops: [N, V], or [B, T, V] read in place (a slice such as logits[:, :-1], whose rows
// are at two strides), with unit column stride (else a contiguous copy); n = B * T rows.
struct LogitRows {
  at::Tensor x;
  int64_t n, vocab;
  cuda::RowStrides rows;
};

LogitRows logit_rows(const char* op, const at::Tensor& logits) {
  TORCH_CHECK((logits.dim() == 2 || logits.dim() == 3) && logits.size(-1) >= 1, op,
              ": logits must be [N, V] or [B, T, V] with V >= 1, got ", logits.sizes());
  const at::Tensor x = logits.stride(-1) == 1 ? logits : logits.contiguous();
  if (x.dim() == 2) return {x, x.size(0), x.size(1), cuda::RowStrides::matrix(x.stride(0))};
  return {x, x.size(0) * x.size(1), x.size(2), {x.stride(1), std::max<int64_t>(x.size(1), 1), x.stride(0)}};
}

// logprobs_from_logits_checked: one launch (logits_rows), the labels checked into the fifth output; no value
// check on the host (it would sync).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> logprobs_from_logits_checked_cuda(
    const at::Tensor& logits, const at::Tensor& labels, double temperature, std::optional<double> softcap,
    int64_t ignore_index, bool return_entropy, bool return_sum_pi_squared) {
  constexpr const char* op = "rlkernels::logprobs_from_logits_checked";
  const LogitRows r = logit_rows(op, logits);
  const at::Tensor& x = r.x;
  const int64_t n = r.n, vocab = r.vocab;
  check_logprob_label_shape(op, labels, n);
  check_temperature_softcap(op, temperature, softcap);
  const c10::cuda::CUDAGuard guard(logits.device());
  const at::Tensor y = labels.scalar_type() == at::kLong ? labels.contiguous() : labels.to(at::kLong).contiguous();
  const auto opts = x.options().dtype(acc_scalar_type(x.scalar_type()));
  at::Tensor logp = at::empty({n}, opts), lse = at::empty({n}, opts.dtype(at::kDouble));
  at::Tensor entropy = at::empty({return_entropy ? n : 0}, opts);
  at::Tensor sum_sq = at::empty({return_sum_pi_squared ? n : 0}, opts);
  at::Tensor ok = at::empty({}, x.options().dtype(at::kBool));
  if (n == 0) return {logp, entropy, lse, sum_sq, ok.fill_(true)};
  const at::Tensor parts = at::empty({n}, x.options().dtype(at::kFloat));
  const cuda::LogitArgs args{temperature, softcap.value_or(0.0), ignore_index, return_entropy, return_sum_pi_squared};
  check_cuda(cuda::logits_rows(to_dtype(x), x.const_data_ptr(), r.rows, n, vocab, y.const_data_ptr<int64_t>(), args,
                               logp.mutable_data_ptr(), return_entropy ? entropy.mutable_data_ptr() : nullptr,
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
  const LogitRows r = logit_rows(op, logits);
  const at::Tensor& x = r.x;
  const int64_t n = r.n, vocab = r.vocab;
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
  const at::Tensor y = labels.scalar_type() == at::kLong ? labels.contiguous() : labels.to(at::kLong).contiguous();
  const at::ScalarType acc = acc_scalar_type(x.scalar_type());
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
  at::Tensor grad = at::empty(logits.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  check_cuda(cuda::softmax_rows_grad(to_dtype(x), x.const_data_ptr(), r.rows, to_dtype(grad), grad.mutable_data_ptr(),
                                     vocab, n, vocab, 0, nullptr, y.const_data_ptr<int64_t>(), args, l.const_data_ptr(),
                                     at_row(h, 0), at_row(g_logp, 0), at_row(g_ent, 0),
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
  const at::ScalarType acc = acc_scalar_type(hidden.scalar_type());
  const auto opts = hidden.options().dtype(acc);
  const at::Tensor y = labels.to(at::kLong).contiguous();
  const cuda::LogitArgs args{temperature, softcap.value_or(0.0), ignore_index, return_entropy, return_sum_pi_squared};
  RowStats st(n, opts, return_sum_pi_squared);
  if (n > 0) {
    const at::Tensor b = bias.has_value() ? bias->to(acc).contiguous() : at::Tensor();
    const auto [rows, cols] = forward_shape(n, vocab, at::elementSize(acc), chunk_size);
    const at::Tensor buf = at::empty({rows * round_up(cols, kRowAlign)}, opts);
    const auto stream = c10::cuda::getCurrentCUDAStream();
    for (int64_t r0 = 0; r0 < n; r0 += rows) {
      const int64_t r = std::min(rows, n - r0);
      const at::Tensor h = hidden.narrow(0, r0, r);
      for (int64_t v0 = 0; v0 < vocab; v0 += cols) {
        const int64_t c = std::min(cols, vocab - v0), ld = round_up(c, kRowAlign);
        at::Tensor out = rows_view(buf, r, c, ld);
        logits_gemm(out, h, weight.narrow(0, v0, c));
        check_cuda(cuda::softmax_rows_stats(to_dtype(out), out.const_data_ptr(), ld, r, c, v0, at_row(b, v0),
                                            y.const_data_ptr<int64_t>() + r0, args, at_row_mut(st.m, r0),
                                            at_row_mut(st.s, r0), at_row_mut(st.a, r0),
                                            return_sum_pi_squared ? at_row_mut(st.s2, r0) : nullptr,
                                            at_row_mut(st.z_target, r0), stream),
                   op);
      }
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
  const at::ScalarType dtype = hidden.scalar_type(), acc = acc_scalar_type(dtype);
  const auto acc_opts = hidden.options().dtype(acc);
  const auto [group, cols, rows] =
      backward_shape(n, vocab, d, at::elementSize(dtype), at::elementSize(acc), chunk_size);
  at::Tensor dh = need_h ? at::empty({n, d}, hidden.options()) : at::Tensor();
  // The group's d hidden accumulates in the accumulation dtype: in dh itself when that is hidden's dtype.
  at::Tensor dh_acc = need_h && dtype != acc ? at::empty({std::min(group, n), d}, acc_opts) : at::Tensor();
  at::Tensor gw = need_w ? at::empty({vocab, d}, weight.options()) : at::Tensor();
  at::Tensor db = need_b ? at::zeros({vocab}, acc_opts) : at::Tensor();
  if (n == 0 && need_w) gw.zero_();
  if (n > 0 && (need_h || need_w || need_b)) {
    const at::Tensor y = labels.to(at::kLong).contiguous();
    const RowGrads g(grad_logp, grad_entropy, lse, entropy, acc);
    const cuda::LogitArgs args{temperature, softcap.value_or(0.0), ignore_index, grad_entropy.has_value(), false};
    const at::Tensor b = bias.has_value() ? bias->to(acc).contiguous() : at::Tensor();
    const int64_t ld_max = round_up(cols, kRowAlign);
    const at::Tensor z = at::empty({rows * ld_max}, acc_opts);               // a logits block
    const at::Tensor dz_flat = at::empty({group * ld_max}, hidden.options());  // the group's d z slice
    const auto stream = c10::cuda::getCurrentCUDAStream();
    for (int64_t g0 = 0; g0 < n; g0 += group) {
      const int64_t gn = std::min(group, n - g0);
      const at::Tensor h = hidden.narrow(0, g0, gn);
      at::Tensor dh_g;
      if (need_h) {
        dh_g = dh_acc.defined() ? dh_acc.narrow(0, 0, gn) : dh.narrow(0, g0, gn);
        dh_g.zero_();
      }
      for (int64_t v0 = 0; v0 < vocab; v0 += cols) {
        const int64_t c = std::min(cols, vocab - v0), ld = round_up(c, kRowAlign);
        const at::Tensor w = weight.narrow(0, v0, c);
        at::Tensor dz = rows_view(dz_flat, gn, c, ld);
        for (int64_t r0 = 0; r0 < gn; r0 += rows) {
          const int64_t r = std::min(rows, gn - r0), row = g0 + r0;
          at::Tensor block = rows_view(z, r, c, ld);
          logits_gemm(block, h.narrow(0, r0, r), w);
          check_cuda(cuda::softmax_rows_grad(to_dtype(block), block.const_data_ptr(), cuda::RowStrides::matrix(ld),
                                             to_dtype(dz), at_row_mut(dz, r0 * ld), ld, r, c, v0, at_row(b, v0),
                                             y.const_data_ptr<int64_t>() + row, args, at_row(g.lse, row),
                                             at_row(g.entropy, row), at_row(g.g_logp, row), at_row(g.g_ent, row),
                                             stream),
                     op);
        }
        if (need_b) db.narrow(0, v0, c).add_(dz.sum(0, false, acc));
        if (need_w) {  // the later groups add to the slice: one rounding to weight's dtype a group
          at::Tensor gw_slice = gw.narrow(0, v0, c);
          if (g0 == 0) {
            at::mm_out(gw_slice, dz.t(), h);
          } else {
            gw_slice.addmm_(dz.t(), h);
          }
        }
        if (need_h) {
          if (dtype == acc) {
            dh_g.addmm_(dz, w);
          } else {  // 16-bit operands, fp32 accumulation into the fp32 group buffer (no product tensor)
            at::addmm_out(dh_g, dh_g, dz, w, acc);
          }
        }
      }
      if (dh_acc.defined()) dh.narrow(0, g0, gn).copy_(dh_g);
    }
  }
  const auto empty = [](const at::Tensor& like) { return at::empty({0}, like.options()); };
  return {need_h ? dh : empty(hidden), need_w ? gw : empty(weight),
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
