// value_loss on CPU: one forward pass reducing the per-row masked sums of the clipped critic loss and checking
// the input values it reads (non-finite values, old values or returns anywhere, bad mask values: the op's `ok`
// flag), finished into the loss from the rows' fp64 sums (aggregation_host.h finish_rows); one backward pass
// writing d values. Same (row, chunk) task split and block loops as policy_loss.cpp.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <type_traits>
#include <vector>

#include "rlkernels/policy_loss_host.h"
#include "rlkernels/value_loss.h"
#include "loss_masks.h"
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
  alignas(64) A bad[kBlock];      // 1 where an input value is rejected
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
    s->bad[i] = one_if<A>(!finite_value(v_[i]) | !finite_value(old_[i]) | !finite_value(ret_[i]) | bad_weight(m));
  }
}

struct ValueInputs {
  at::Tensor v, old, ret, mask;
  MaskType mask_type;
};

ValueInputs prepare(const char* op, const at::Tensor& values, const at::Tensor& old_values, const at::Tensor& returns,
                    const at::Tensor& mask) {
  TORCH_CHECK(values.dim() == 2, op, ": values must be [B, T], got ", values.sizes());
  check_same_layout(op, values, "values", old_values, "old_values");
  check_same_layout(op, values, "values", returns, "returns");
  const MaskType mask_type = check_token_mask(op, mask, values);
  return {values.contiguous(), old_values.contiguous(), returns.contiguous(), mask.contiguous(), mask_type};
}

// Runs value_block on tokens [off, off + n) of the flattened inputs: read in place when they are of the
// accumulation type, else converted into the scratch arrays first. Returns the block's mask values; adds to
// *bad the integer mask values other than 0 and 1.
template <typename T, typename A>
const A* run_block(const ValueInputs& x, ValueScratch<A>* s, int64_t off, int64_t n, A clip, int64_t* bad) {
  auto acc = [n](const T* src, A* buf) -> const A* {
    if constexpr (std::is_same_v<T, A>) {
      return src;
    } else {
      convert_span(src, buf, n);
      return buf;
    }
  };
  const A* m = MaskIn<A>{x.mask_type, x.mask.const_data_ptr()}.span(off, n, s->m, bad);
  value_block(acc(x.v.const_data_ptr<T>() + off, s->v), acc(x.old.const_data_ptr<T>() + off, s->old),
              acc(x.ret.const_data_ptr<T>() + off, s->ret), m, s, n, clip);
  return m;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> value_loss_cpu(
    const at::Tensor& values, const at::Tensor& old_values, const at::Tensor& returns, const at::Tensor& mask,
    std::optional<double> clip, RLK_AGG_CONFIG_PARAMS) {
  const char* op = "rlkernels::value_loss";
  const AggParams agg_params = make_agg_args(op, values.device(), RLK_AGG_CONFIG_ARGS);
  const ValueInputs x = prepare(op, values, old_values, returns, mask);
  TORCH_CHECK(!clip || *clip > 0, "rlkernels::value_loss: clip must be > 0");
  const int64_t B = values.size(0), T = values.size(1);
  const auto acc = values.options().dtype(acc_scalar_type(values.scalar_type()));
  at::Tensor loss = at::empty({}, acc);
  at::Tensor clipfrac = at::empty({1}, acc);
  at::Tensor row_weights = at::empty({B}, acc);
  at::Tensor ok = at::empty({}, values.options().dtype(at::kBool));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, values.scalar_type(), "value_loss_cpu", [&] {
    using A = at::opmath_type<scalar_t>;
    const RowTasks tasks(B, T);
    const A c = value_or_inf<A>(clip);
    std::vector<double> part(tasks.count * kValueParts, 0.0);
    tasks.for_each([&](int64_t task) {
      ValueScratch<A> s;
      const int64_t b = tasks.row(task), c1 = tasks.end(task, T);
      double* q = &part[kValueParts * task];
      int64_t bad_mask = 0;
      for (int64_t t0 = tasks.begin(task); t0 < c1; t0 += kBlock) {
        const int64_t n = std::min(kBlock, c1 - t0);
        const A* m = run_block<scalar_t>(x, &s, b * T + t0, n, c, &bad_mask);
        q[kValueLoss] += block_sum(s.wl, n);
        q[kValueCount] += block_sum(m, n);
        q[kValueClipped] += block_sum(s.clipped, n);
        q[kValueBad] += block_sum(s.bad, n);
      }
      q[kValueBad] += double(bad_mask);
    });
    const std::vector<double> rows = tasks.row_sums(part, B, kValueParts);
    *ok.mutable_data_ptr<bool>() =
        finish_rows<A>(rows.data(), B, kValueParts, kValueLoss, kValueCount, kValueClipped, 1, kValueBad, agg_params,
                       loss.mutable_data_ptr<A>(), clipfrac.mutable_data_ptr<A>(), row_weights.mutable_data_ptr<A>());
  });
  return {loss, clipfrac, row_weights, ok};
}

at::Tensor value_loss_backward_cpu(const at::Tensor& grad_loss, const at::Tensor& row_weights,
                                   const at::Tensor& values, const at::Tensor& old_values, const at::Tensor& returns,
                                   const at::Tensor& mask, std::optional<double> clip) {
  const char* op = "rlkernels::value_loss_backward";
  const ValueInputs x = prepare(op, values, old_values, returns, mask);
  const int64_t B = values.size(0), T = values.size(1);
  check_loss_grad(op, grad_loss, row_weights, B, acc_scalar_type(values.scalar_type()), values.device());
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
        int64_t checked = 0;  // by the forward pass
        run_block<scalar_t>(x, &s, b * T + t0, n, c, &checked);
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
