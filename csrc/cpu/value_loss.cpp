// value_loss on CPU: one forward pass reducing the per-row masked sums of the clipped critic loss, one
// backward pass writing d values. Same (row, chunk) task split and block loops as policy_loss.cpp.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <type_traits>
#include <vector>

#include "rlkernels/policy_loss_host.h"
#include "rlkernels/value_loss.h"
#include "row_loops.h"

namespace rlk {
namespace {

// Conversion buffers of one block (fp16/bf16 inputs, bool masks) and its per-token results.
template <typename A>
struct ValueScratch {
  alignas(64) A v[kBlock];
  alignas(64) A old[kBlock];
  alignas(64) A ret[kBlock];
  alignas(64) A m[kBlock];
  alignas(64) A wl[kBlock];       // m · L
  alignas(64) A wd[kBlock];       // m · dL/dv
  alignas(64) A clipped[kBlock];  // m · clipped
};

template <typename A>
RLK_CPU_MULTIVERSION __attribute__((flatten)) void value_block(const A* __restrict__ v_, const A* __restrict__ old_,
                                                               const A* __restrict__ ret_, const A* __restrict__ m_,
                                                               ValueScratch<A>* __restrict__ s, int64_t n, A clip) {
  for (int64_t i = 0; i < n; ++i) {
    const VLToken<A> t = value_token<A>(v_[i], old_[i], ret_[i], clip);
    const A m = m_[i];
    const bool on = m != A(0);
    s->wl[i] = on ? m * t.loss : A(0);
    s->wd[i] = on ? m * t.dvalue : A(0);
    s->clipped[i] = on ? m * t.clipped : A(0);
  }
}

struct ValueInputs {
  at::Tensor v, old, ret, mask;
};

ValueInputs prepare(const char* op, const at::Tensor& values, const at::Tensor& old_values, const at::Tensor& returns,
                    const at::Tensor& mask) {
  TORCH_CHECK(values.dim() == 2, op, ": values must be [B, T], got ", values.sizes());
  check_same_layout(op, values, "values", old_values, "old_values");
  check_same_layout(op, values, "values", returns, "returns");
  check_token_mask(op, mask, values);
  return {values.contiguous(), old_values.contiguous(), returns.contiguous(), mask.contiguous()};
}

// Runs value_block on tokens [off, off + n) of the flattened inputs: read in place when they are of the
// accumulation type, else converted into the scratch arrays first. Returns the block's mask values.
template <typename T, typename A>
const A* run_block(const ValueInputs& x, ValueScratch<A>* s, int64_t off, int64_t n, A clip) {
  auto acc = [n](const T* src, A* buf) -> const A* {
    if constexpr (std::is_same_v<T, A>) {
      return src;
    } else {
      convert_span(src, buf, n);
      return buf;
    }
  };
  const A* m = s->m;
  if (x.mask.scalar_type() == at::kBool) {
    convert_span(reinterpret_cast<const uint8_t*>(x.mask.const_data_ptr<bool>() + off), s->m, n);  // 0 / 1 bytes
  } else {
    m = x.mask.const_data_ptr<A>() + off;
  }
  value_block(acc(x.v.const_data_ptr<T>() + off, s->v), acc(x.old.const_data_ptr<T>() + off, s->old),
              acc(x.ret.const_data_ptr<T>() + off, s->ret), m, s, n, clip);
  return m;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> value_loss_cpu(
    const at::Tensor& values, const at::Tensor& old_values, const at::Tensor& returns, const at::Tensor& mask,
    std::optional<double> clip, RLK_AGG_CONFIG_PARAMS) {
  const char* op = "rlkernels::value_loss";
  const AggArgs agg_args = make_agg_args(op, RLK_AGG_CONFIG_ARGS);
  const ValueInputs x = prepare(op, values, old_values, returns, mask);
  TORCH_CHECK(!clip || *clip > 0, "rlkernels::value_loss: clip must be > 0");
  const int64_t B = values.size(0), T = values.size(1);
  const auto acc = values.options().dtype(at::toOpMathType(values.scalar_type()));
  at::Tensor row_loss = at::empty({B}, acc);
  at::Tensor row_stats = at::empty({B, kValueRowStats}, acc);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, values.scalar_type(), "value_loss_cpu", [&] {
    using A = at::opmath_type<scalar_t>;
    const RowTasks tasks(B, T);
    const A c = value_or_inf<A>(clip);
    std::vector<double> part(tasks.count * 3, 0.0);
    tasks.for_each([&](int64_t task) {
      ValueScratch<A> s;
      const int64_t b = tasks.row(task), c1 = tasks.end(task, T);
      double* q = &part[3 * task];
      for (int64_t t0 = tasks.begin(task); t0 < c1; t0 += kBlock) {
        const int64_t n = std::min(kBlock, c1 - t0);
        const A* m = run_block<scalar_t>(x, &s, b * T + t0, n, c);
        q[0] += block_sum(s.wl, n);
        q[1] += block_sum(m, n);
        q[2] += block_sum(s.clipped, n);
      }
    });
    A* loss_ptr = row_loss.mutable_data_ptr<A>();
    A* stats_ptr = row_stats.mutable_data_ptr<A>();
    for (int64_t b = 0; b < B; ++b) {
      double total[3] = {};
      for (int64_t c = 0; c < tasks.chunks_per_row; ++c) {
        for (int k = 0; k < 3; ++k) total[k] += part[3 * (b * tasks.chunks_per_row + c) + k];
      }
      loss_ptr[b] = A(total[0]);
      stats_ptr[b * kValueRowStats + kValueCount] = A(total[1]);
      stats_ptr[b * kValueRowStats + kValueClipped] = A(total[2]);
    }
  });
  return finish_rows(row_loss, row_stats, kValueCount, kValueClipped, agg_args);
}

at::Tensor value_loss_backward_cpu(const at::Tensor& grad_loss, const at::Tensor& row_weights,
                                   const at::Tensor& values, const at::Tensor& old_values, const at::Tensor& returns,
                                   const at::Tensor& mask, std::optional<double> clip) {
  const char* op = "rlkernels::value_loss_backward";
  const ValueInputs x = prepare(op, values, old_values, returns, mask);
  const int64_t B = values.size(0), T = values.size(1);
  check_loss_grad(op, grad_loss, row_weights, B, at::toOpMathType(values.scalar_type()), values.device());
  const at::Tensor w = row_weights.contiguous();
  at::Tensor grad = at::empty({B, T}, values.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, values.scalar_type(), "value_loss_backward_cpu", [&] {
    using A = at::opmath_type<scalar_t>;
    const RowTasks tasks(B, T);
    const A c = value_or_inf<A>(clip);
    const A g = grad_loss.item<A>();
    const A* wp = w.const_data_ptr<A>();
    scalar_t* out = grad.mutable_data_ptr<scalar_t>();
    tasks.for_each([&](int64_t task) {
      ValueScratch<A> s;
      const int64_t b = tasks.row(task), c1 = tasks.end(task, T);
      for (int64_t t0 = tasks.begin(task); t0 < c1; t0 += kBlock) {
        const int64_t n = std::min(kBlock, c1 - t0);
        run_block<scalar_t>(x, &s, b * T + t0, n, c);
        scale_span(s.wd, g * wp[b], out + b * T + t0, n);  // d output / d row sum · d row sum / d values
      }
    });
  });
  return grad;
}

}  // namespace

TORCH_LIBRARY_IMPL(rlkernels, CPU, m) {
  m.impl("value_loss", &value_loss_cpu);
  m.impl("value_loss_backward", &value_loss_backward_cpu);
}

}  // namespace rlk
