// linear_logprobs on CPU without ever materializing the [N, V] logits.
//
// The logits are produced chunk by chunk into ONE reused [R, C] buffer (fp32; fp64 for fp64 inputs) that is
// allocated with ATen, so memory profiling sees it: vocabulary slices of C columns (outer loop) by row blocks
// of R rows (inner loop). Per chunk, an ATen GEMM (MKL) fills the buffer, then one vectorized pass per row
// (rows in parallel) transforms the logits and reduces them to per-row softmax statistics (max / sum-exp /
// entropy sum / Σ softmax² sum / target logit), merged across slices online. Only lse, entropy and Σ softmax²
// per row are kept.
//
// The backward recomputes each chunk the same way, writes the softmax gradient in place into the buffer,
// then d hidden[rows] += buf @ W[slice] and d W[slice] (+)= bufᵀ @ hidden[rows]: 3 GEMMs per chunk, 2 when
// one of hidden / weight needs no gradient. Vocabulary-outer order makes d W of a slice complete before the
// next slice starts (one fp32 [C, D] accumulator, converted once for 16-bit weights) while d hidden, the
// smaller of the two for N < V, accumulates across slices in fp32.
//
// Rows whose label is ignore_index are dropped before any GEMM (prompt tokens cost nothing) and get exactly
// zero gradient. bf16/fp16 inputs are converted to fp32 once (hidden) and per slice (weight): the GEMMs run in
// fp32 with fp32 logits, more accurate than eager's bf16 logits. (bf16 GEMMs, ~5x faster on this AMX CPU,
// round the logits and partial products to bf16 as eager does; their error is eager's order but different
// rounding events, which breaks the "within 2x of eager's error" test contract ~1 run in 10.)
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <algorithm>
#include <vector>

#include "logprobs_rows.h"
#include "rlkernels/logprobs_host.h"

namespace rlk {
namespace {

using namespace cpu;

constexpr const char* kOp = "rlkernels::linear_logprobs";
constexpr const char* kOpBackward = "rlkernels::linear_logprobs_backward";
// Logits per chunk: at most 64 MiB, and at most 1/16 of the N·V logits eager would materialize (small problems
// get small chunks). Measured here, [2048 x D] x [D x 4096] chunks run within a few % of one full-size GEMM;
// smaller chunks lose GEMM efficiency faster than they gain cache locality.
constexpr int64_t kChunkBytes = int64_t(64) << 20;
constexpr int64_t kMinChunkBytes = int64_t(1) << 20;
// Rows per block: enough for MKL to reach full speed, leaving the rest of the budget to vocabulary columns.
constexpr int64_t kMaxRows = 2048;
// Fewest vocabulary columns of an automatic chunk, so that the GEMMs keep a wide N dimension.
constexpr int64_t kMinCols = 256;
// Logits per parallel task in the row passes: ~64 KiB of fp32, enough to amortize the thread-pool hand-off.
constexpr int64_t kGrainElems = 16384;

struct Plan {
  int64_t rows;  // R
  int64_t cols;  // C
};

Plan make_plan(int64_t n, int64_t vocab, int64_t elem_size, std::optional<int64_t> chunk_size) {
  const int64_t rows = std::max<int64_t>(1, std::min(n, kMaxRows));
  const int64_t budget = std::min(kChunkBytes, std::max(kMinChunkBytes, n * vocab * elem_size / 16));
  int64_t cols = chunk_size.has_value() ? *chunk_size : std::max(kMinCols, budget / (elem_size * rows));
  cols = std::min(std::max<int64_t>(cols, 1), vocab);
  return {rows, cols};
}

// The rows whose label is not ignore_index, gathered and converted to the accumulation dtype once.
struct ValidRows {
  at::Tensor index;   // [count] int64 positions in the original rows; undefined when every row is valid
  at::Tensor hidden;  // [count, D] contiguous, accumulation dtype
  at::Tensor labels;  // [count] int64 contiguous
  int64_t count = 0;

  // A per-row tensor of the original rows restricted to the valid ones, as acc-dtype contiguous.
  at::Tensor select(const at::Tensor& t, at::ScalarType acc) const {
    return (index.defined() ? t.index_select(0, index) : t).to(acc).contiguous();
  }
  // Scatter per-valid-row values back to all n rows (0 for ignored rows).
  at::Tensor scatter(const at::Tensor& t, int64_t n) const {
    if (!index.defined()) return t;
    std::vector<int64_t> shape(t.sizes().begin(), t.sizes().end());
    shape[0] = n;
    return at::zeros(shape, t.options()).index_copy_(0, index, t);
  }
};

ValidRows gather_valid_rows(const at::Tensor& hidden, const at::Tensor& labels, int64_t ignore_index,
                            at::ScalarType acc) {
  ValidRows v;
  const at::Tensor y = labels.to(at::kLong);
  const at::Tensor valid = y.ne(ignore_index);
  v.count = valid.sum().item<int64_t>();
  if (v.count == hidden.size(0)) {
    v.hidden = hidden.to(acc).contiguous();
    v.labels = y.contiguous();
  } else {
    v.index = valid.nonzero().view({-1});
    v.hidden = hidden.index_select(0, v.index).to(acc).contiguous();
    v.labels = y.index_select(0, v.index);
  }
  return v;
}

// weight[v0, v0 + c) in the accumulation dtype: a view when it already is, else converted into `buf`.
at::Tensor weight_slice(const at::Tensor& weight, int64_t v0, int64_t c, at::Tensor& buf) {
  const at::Tensor w = weight.narrow(0, v0, c);
  if (!buf.defined()) return w;
  return buf.narrow(0, 0, c).copy_(w);
}

// The [r, c] chunk as a contiguous view of the flat buffer.
at::Tensor chunk_view(const at::Tensor& flat, int64_t r, int64_t c) { return flat.narrow(0, 0, r * c).view({r, c}); }

template <typename A, bool kSoftcap, bool kBias, bool kEntropy, bool kSumSq>
void forward_chunks(const ValidRows& rows, const at::Tensor& weight, const A* bias, LogitTransform<A> t, Plan plan,
                    A* logp, A* entropy, double* lse, A* sum_sq) {
  const int64_t n = rows.count, vocab = weight.size(0);
  const at::ScalarType acc = rows.hidden.scalar_type();
  const auto opts = rows.hidden.options();
  at::Tensor buf = at::empty({plan.rows * plan.cols}, opts);
  at::Tensor wbuf = weight.scalar_type() == acc ? at::Tensor() : at::empty({plan.cols, weight.size(1)}, opts);
  std::vector<SoftmaxStats<A>> stats(n, empty_softmax_stats<A>());
  std::vector<A> z_target(n, A(0));
  const int64_t* labels = rows.labels.const_data_ptr<int64_t>();
  for (int64_t v0 = 0; v0 < vocab; v0 += plan.cols) {
    const int64_t c = std::min(plan.cols, vocab - v0);
    const at::Tensor w = weight_slice(weight, v0, c, wbuf);
    for (int64_t r0 = 0; r0 < n; r0 += plan.rows) {
      const int64_t r = std::min(plan.rows, n - r0);
      at::Tensor out = chunk_view(buf, r, c);
      at::mm_out(out, rows.hidden.narrow(0, r0, r), w.t());
      A* base = out.mutable_data_ptr<A>();
      at::parallel_for(0, r, std::max<int64_t>(1, kGrainElems / c), [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
          const int64_t row = r0 + i;
          const SoftmaxStats<A> st = row_stats<A, A, kSoftcap, kBias, kEntropy, kSumSq>(
              base + i * c, kBias ? bias + v0 : nullptr, c, t, labels[row] - v0, &z_target[row]);
          stats[row] = merge_softmax_stats(stats[row], st);
        }
      });
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    lse[i] = softmax_lse(stats[i]);
    logp[i] = logprob_value(z_target[i], split_lse<A>(lse[i]));
    if (kEntropy) entropy[i] = softmax_entropy(stats[i]);
    if (kSumSq) sum_sq[i] = softmax_sum_sq(stats[i]);
  }
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> linear_logprobs_cpu(
    const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& labels, const std::optional<at::Tensor>& bias,
    double temperature, std::optional<double> softcap, int64_t ignore_index, bool return_entropy,
    bool return_sum_pi_squared, std::optional<int64_t> chunk_size) {
  check_linear_inputs(kOp, hidden, weight, bias, chunk_size);
  check_temperature_softcap(kOp, temperature, softcap);
  const int64_t n = hidden.size(0), vocab = weight.size(0);
  check_logprob_labels(kOp, labels, n, vocab, ignore_index);
  const at::ScalarType acc = acc_scalar_type(hidden.scalar_type());
  const auto opts = hidden.options().dtype(acc);
  const ValidRows rows = gather_valid_rows(hidden, labels, ignore_index, acc);
  at::Tensor logp = at::empty({rows.count}, opts), lse = at::empty({rows.count}, opts.dtype(at::kDouble));
  at::Tensor entropy = at::empty({return_entropy ? rows.count : 0}, opts);
  at::Tensor sum_sq = at::empty({return_sum_pi_squared ? rows.count : 0}, opts);
  if (rows.count > 0) {
    const at::Tensor b = bias.has_value() ? bias->to(acc).contiguous() : at::Tensor();
    const Plan plan = make_plan(rows.count, vocab, at::elementSize(acc), chunk_size);
    AT_DISPATCH_FLOATING_TYPES(acc, "linear_logprobs_cpu", [&] {
      using A = scalar_t;
      const LogitTransform<A> t(temperature, softcap.value_or(0.0));
      dispatch_bool(softcap.has_value(), [&](auto kSoftcap) {
        dispatch_bool(bias.has_value(), [&](auto kBias) {
          dispatch_bool(return_entropy, [&](auto kEntropy) {
            dispatch_bool(return_sum_pi_squared, [&](auto kSumSq) {
              forward_chunks<A, kSoftcap.value, kBias.value, kEntropy.value, kSumSq.value>(
                  rows, weight, kBias.value ? b.const_data_ptr<A>() : nullptr, t, plan, logp.mutable_data_ptr<A>(),
                  return_entropy ? entropy.mutable_data_ptr<A>() : nullptr, lse.mutable_data_ptr<double>(),
                  return_sum_pi_squared ? sum_sq.mutable_data_ptr<A>() : nullptr);
            });
          });
        });
      });
    });
  }
  return {rows.scatter(logp, n), return_entropy ? rows.scatter(entropy, n) : entropy, rows.scatter(lse, n),
          return_sum_pi_squared ? rows.scatter(sum_sq, n) : sum_sq};
}

// Per-valid-row inputs of the backward, in the accumulation dtype (lse in float64).
template <typename A>
struct RowGrads {
  const double* lse;
  const A* entropy;  // null without entropy gradient
  const A* g_logp;
  const A* g_ent;  // null without entropy gradient
};

template <typename A, bool kSoftcap, bool kBias, bool kEntropy>
void backward_chunks(const ValidRows& rows, const at::Tensor& weight, const A* bias, LogitTransform<A> t, Plan plan,
                     RowGrads<A> g, at::Tensor& dh, at::Tensor& grad_weight, at::Tensor& db) {
  const int64_t n = rows.count, vocab = weight.size(0);
  const at::ScalarType acc = rows.hidden.scalar_type();
  const auto opts = rows.hidden.options();
  const bool need_w = grad_weight.defined(), convert_w = weight.scalar_type() != acc;
  at::Tensor buf = at::empty({plan.rows * plan.cols}, opts);
  at::Tensor wbuf = convert_w ? at::empty({plan.cols, weight.size(1)}, opts) : at::Tensor();
  at::Tensor dwbuf = need_w && convert_w ? at::empty({plan.cols, weight.size(1)}, opts) : at::Tensor();
  const int64_t* labels = rows.labels.const_data_ptr<int64_t>();
  for (int64_t v0 = 0; v0 < vocab; v0 += plan.cols) {
    const int64_t c = std::min(plan.cols, vocab - v0);
    const at::Tensor w = weight_slice(weight, v0, c, wbuf);
    at::Tensor dw = need_w ? (convert_w ? dwbuf.narrow(0, 0, c) : grad_weight.narrow(0, v0, c)) : at::Tensor();
    for (int64_t r0 = 0; r0 < n; r0 += plan.rows) {
      const int64_t r = std::min(plan.rows, n - r0);
      const at::Tensor h = rows.hidden.narrow(0, r0, r);
      at::Tensor out = chunk_view(buf, r, c);
      at::mm_out(out, h, w.t());
      A* base = out.mutable_data_ptr<A>();
      at::parallel_for(0, r, std::max<int64_t>(1, kGrainElems / c), [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
          A* x = base + i * c;
          const int64_t row = r0 + i, y = labels[row] - v0;
          const bool has_target = y >= 0 && y < c;
          const A x_target = has_target ? x[y] + (kBias ? bias[v0 + y] : A(0)) : A(0);
          const A ent = kEntropy ? g.entropy[row] : A(0), g_ent = kEntropy ? g.g_ent[row] : A(0);
          const RowLse<A> lse = split_lse<A>(g.lse[row]);
          logit_grad_inplace<A, A, kSoftcap, kBias, kEntropy>(x, kBias ? bias + v0 : nullptr, c, t, lse, ent,
                                                           g.g_logp[row], g_ent);
          if (has_target) x[y] = target_logit_grad<A, kSoftcap>(x_target, t, lse, ent, g.g_logp[row], g_ent);
        }
      });
      if (db.defined()) db.narrow(0, v0, c).add_(out.sum(0));
      if (dh.defined()) dh.narrow(0, r0, r).addmm_(out, w);
      if (need_w) {
        if (r0 == 0) {
          at::mm_out(dw, out.t(), h);
        } else {
          dw.addmm_(out.t(), h);
        }
      }
    }
    if (need_w && convert_w) grad_weight.narrow(0, v0, c).copy_(dw);
  }
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> linear_logprobs_backward_cpu(
    const at::Tensor& grad_logp, const std::optional<at::Tensor>& grad_entropy, const at::Tensor& hidden,
    const at::Tensor& weight, const at::Tensor& labels, const std::optional<at::Tensor>& bias, const at::Tensor& lse,
    const at::Tensor& entropy, double temperature, std::optional<double> softcap, int64_t ignore_index,
    std::array<bool, 3> output_mask, std::optional<int64_t> chunk_size) {
  check_linear_inputs(kOpBackward, hidden, weight, bias, chunk_size);
  check_temperature_softcap(kOpBackward, temperature, softcap);
  const int64_t n = hidden.size(0), vocab = weight.size(0), d = hidden.size(1);
  check_logprob_labels(kOpBackward, labels, n, vocab, ignore_index);
  check_row_vector(kOpBackward, grad_logp, "grad_logp", n);
  check_row_vector(kOpBackward, lse, "lse", n);
  const bool with_entropy = grad_entropy.has_value();
  if (with_entropy) {
    check_row_vector(kOpBackward, *grad_entropy, "grad_entropy", n);
    check_row_vector(kOpBackward, entropy, "entropy", n);
  }
  const bool need_h = output_mask[0], need_w = output_mask[1], need_b = output_mask[2] && bias.has_value();
  const at::ScalarType acc = acc_scalar_type(hidden.scalar_type());
  const auto acc_opts = hidden.options().dtype(acc);
  const ValidRows rows = gather_valid_rows(hidden, labels, ignore_index, acc);

  at::Tensor dh = need_h ? at::zeros({rows.count, d}, acc_opts) : at::Tensor();
  at::Tensor grad_weight = need_w ? at::empty({vocab, d}, weight.options()) : at::Tensor();
  at::Tensor db = need_b ? at::zeros({vocab}, acc_opts) : at::Tensor();
  if (rows.count == 0) {
    if (need_w) grad_weight.zero_();
  } else {
    const at::Tensor l = rows.select(lse, at::kDouble), gl = rows.select(grad_logp, acc);
    const at::Tensor h_ent = with_entropy ? rows.select(entropy, acc) : at::Tensor();
    const at::Tensor g_ent = with_entropy ? rows.select(*grad_entropy, acc) : at::Tensor();
    const at::Tensor b = bias.has_value() ? bias->to(acc).contiguous() : at::Tensor();
    const Plan plan = make_plan(rows.count, vocab, at::elementSize(acc), chunk_size);
    AT_DISPATCH_FLOATING_TYPES(acc, "linear_logprobs_backward_cpu", [&] {
      using A = scalar_t;
      const LogitTransform<A> t(temperature, softcap.value_or(0.0));
      const RowGrads<A> g{l.const_data_ptr<double>(), with_entropy ? h_ent.const_data_ptr<A>() : nullptr,
                          gl.const_data_ptr<A>(), with_entropy ? g_ent.const_data_ptr<A>() : nullptr};
      dispatch_bool(softcap.has_value(), [&](auto kSoftcap) {
        dispatch_bool(bias.has_value(), [&](auto kBias) {
          dispatch_bool(with_entropy, [&](auto kEntropy) {
            backward_chunks<A, kSoftcap.value, kBias.value, kEntropy.value>(
                rows, weight, kBias.value ? b.const_data_ptr<A>() : nullptr, t, plan, g, dh, grad_weight, db);
          });
        });
      });
    });
  }
  const auto empty = [&](const at::Tensor& like) { return at::empty({0}, like.options()); };
  at::Tensor grad_hidden = need_h ? rows.scatter(dh, n).to(hidden.scalar_type()) : empty(hidden);
  at::Tensor grad_bias = need_b ? db.to(bias->scalar_type()) : empty(weight);
  return {grad_hidden, need_w ? grad_weight : empty(weight), grad_bias};
}

}  // namespace

TORCH_LIBRARY_IMPL(rlkernels, CPU, m) {
  m.impl("linear_logprobs", &linear_logprobs_cpu);
  m.impl("linear_logprobs_backward", &linear_logprobs_backward_cpu);
}

}  // namespace rlk
