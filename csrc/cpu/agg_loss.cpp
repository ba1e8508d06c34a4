// agg_loss on CPU: one forward pass reducing the per-row masked sums of the token loss and checking the mask
// values (the op's `ok` flag), finished into the loss from the rows' fp64 sums (aggregation_host.h
// finish_rows); one backward pass writing d loss_mat = grad · c_b · m. The (row, chunk) task split and block
// loops of value_loss.cpp.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <type_traits>
#include <vector>

#include "rlkernels/agg_loss.h"
#include "rlkernels/policy_loss_host.h"
#include "loss_masks.h"
#include "row_loops.h"

namespace rlk {
namespace {

// Conversion buffers of one block (fp16/bf16 losses, bool and integer masks) and its per-token results.
template <typename A>
struct AggScratch {
  alignas(64) A loss[kBlock];
  alignas(64) A m[kBlock];
  alignas(64) A wl[kBlock];   // m · L (0 where m == 0)
  alignas(64) A bad[kBlock];  // 1 where a mask weight is rejected
};

template <typename A>
RLK_CPU_MULTIVERSION __attribute__((flatten)) void agg_block(const A* __restrict__ loss, const A* __restrict__ m_,
                                                             AggScratch<A>* __restrict__ s, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const A m = m_[i];
    s->wl[i] = m != A(0) ? m * loss[i] : A(0);
    s->bad[i] = one_if<A>(bad_weight(m));
  }
}

// src[0, n) in the accumulation type: in place when it is of that type, else converted into buf.
template <typename T, typename A>
const A* in_acc(const T* src, A* buf, int64_t n) {
  if constexpr (std::is_same_v<T, A>) {
    return src;
  } else {
    convert_span(src, buf, n);
    return buf;
  }
}

struct AggInputs {
  at::Tensor loss, mask;
  MaskType mask_type;
};

AggInputs prepare(const char* op, const at::Tensor& loss_mat, const at::Tensor& mask) {
  TORCH_CHECK(loss_mat.dim() == 2, op, ": loss_mat must be [B, T], got ", loss_mat.sizes());
  const MaskType mask_type = check_token_mask(op, mask, loss_mat);
  return {loss_mat.contiguous(), mask.contiguous(), mask_type};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> agg_loss_cpu(const at::Tensor& loss_mat, const at::Tensor& mask,
                                                            RLK_AGG_CONFIG_PARAMS) {
  const char* op = "rlkernels::agg_loss";
  const AggParams agg_params = make_agg_args(op, loss_mat.device(), RLK_AGG_CONFIG_ARGS);
  const AggInputs x = prepare(op, loss_mat, mask);
  const int64_t B = loss_mat.size(0), T = loss_mat.size(1);
  const auto acc = loss_mat.options().dtype(acc_scalar_type(loss_mat.scalar_type()));
  at::Tensor loss = at::empty({}, acc);
  at::Tensor row_weights = at::empty({B}, acc);
  at::Tensor ok = at::empty({}, loss_mat.options().dtype(at::kBool));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, loss_mat.scalar_type(), "agg_loss_cpu", [&] {
    using A = at::opmath_type<scalar_t>;
    const RowTasks tasks(B, T);
    std::vector<double> part(tasks.count * kAggLossParts, 0.0);
    tasks.for_each([&](int64_t task) {
      AggScratch<A> s;
      const int64_t b = tasks.row(task), c1 = tasks.end(task, T);
      double* q = &part[kAggLossParts * task];
      int64_t bad_mask = 0;
      for (int64_t t0 = tasks.begin(task); t0 < c1; t0 += kBlock) {
        const int64_t n = std::min(kBlock, c1 - t0), off = b * T + t0;
        const A* m = MaskIn<A>{x.mask_type, x.mask.const_data_ptr()}.span(off, n, s.m, &bad_mask);
        agg_block<A>(in_acc(x.loss.const_data_ptr<scalar_t>() + off, s.loss, n), m, &s, n);
        q[kAggLossSum] += block_sum(s.wl, n);
        q[kAggLossCount] += block_sum(m, n);
        q[kAggLossBad] += block_sum(s.bad, n);
      }
      q[kAggLossBad] += double(bad_mask);
    });
    const std::vector<double> rows = tasks.row_sums(part, B, kAggLossParts);
    *ok.mutable_data_ptr<bool>() =
        finish_rows<A>(rows.data(), B, kAggLossParts, kAggLossSum, kAggLossCount, 0, 0, kAggLossBad, agg_params,
                       loss.mutable_data_ptr<A>(), nullptr, row_weights.mutable_data_ptr<A>());
  });
  return {loss, row_weights, ok};
}

at::Tensor agg_loss_backward_cpu(const at::Tensor& grad_loss, const at::Tensor& row_weights,
                                 const at::Tensor& loss_mat, const at::Tensor& mask) {
  const char* op = "rlkernels::agg_loss_backward";
  const AggInputs x = prepare(op, loss_mat, mask);
  const int64_t B = loss_mat.size(0), T = loss_mat.size(1);
  check_loss_grad(op, grad_loss, row_weights, B, acc_scalar_type(loss_mat.scalar_type()), loss_mat.device());
  const at::Tensor w = row_weights.contiguous();
  at::Tensor grad = at::empty({B, T}, loss_mat.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, loss_mat.scalar_type(), "agg_loss_backward_cpu", [&] {
    using A = at::opmath_type<scalar_t>;
    const RowTasks tasks(B, T);
    const A g = grad_loss.item<A>();
    const A* wp = w.const_data_ptr<A>();
    scalar_t* out = grad.mutable_data_ptr<scalar_t>();
    tasks.for_each([&](int64_t task) {
      alignas(64) A buf[kBlock];
      const int64_t b = tasks.row(task), c1 = tasks.end(task, T);
      for (int64_t t0 = tasks.begin(task); t0 < c1; t0 += kBlock) {
        const int64_t n = std::min(kBlock, c1 - t0), off = b * T + t0;
        int64_t checked = 0;  // by the forward pass
        const A* m = MaskIn<A>{x.mask_type, x.mask.const_data_ptr()}.span(off, n, buf, &checked);
        scale_span(m, g * wp[b], out + off, n);  // d output / d row sum · d row sum / d L = m
      }
    });
  });
  return grad;
}

}  // namespace

TORCH_LIBRARY_IMPL(rlkernels, CPU, m) {
  m.impl("agg_loss", &agg_loss_cpu);
  m.impl("agg_loss_backward", &agg_loss_backward_cpu);
}

}  // namespace rlk
