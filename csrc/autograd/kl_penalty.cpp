// kl_penalty's eager autograd in C++: rlkernels::kl_penalty_autograd runs the native forward op below autograd
// inside a torch::autograd::Function whose backward is the native backward op (one pass writes d logp and
// d ref_logp = -d logp), so the backward pass never enters Python. The public function takes it in plain eager
// mode only; under torch.compile and dispatch modes it takes the registered op with the Python formula of
// rlkernels/ops/kl.py, which this one mirrors (policy_loss.cpp says why).
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <optional>
#include <string>

#include "native_ops.h"

namespace rlk {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

using ForwardFn = at::Tensor(const at::Tensor&, const at::Tensor&, c10::string_view, std::optional<double>);
using BackwardFn = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                       c10::string_view, std::optional<double>, bool, bool);

at::Tensor kl_forward(const at::Tensor& logp, const at::Tensor& ref_logp, c10::string_view kind,
                      std::optional<double> clamp) {
  static const auto op = native_op("rlkernels::kl_penalty").typed<ForwardFn>();
  return op.call(logp, ref_logp, kind, clamp);
}

struct KlPenaltyFunction : torch::autograd::Function<KlPenaltyFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logp, const at::Tensor& ref_logp,
                            c10::string_view kind, std::optional<double> clamp) {
    ctx->save_for_backward({logp, ref_logp});
    ctx->saved_data["kind"] = std::string(kind);
    ctx->saved_data["clamp"] = clamp ? c10::IValue(*clamp) : c10::IValue();
    // Straight to the device kernel: kl_penalty's own autograd kernel is the Python formula.
    at::AutoDispatchBelowADInplaceOrView below;
    return kl_forward(logp, ref_logp, kind, clamp);
  }

  // -> (d logp, d ref_logp, nothing for kind and clamp); grads[0] may be expanded from one element (a loss's
  // .sum()): the backward op reads it as it is.
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const bool logp_grad = ctx->needs_input_grad(0), ref_grad = ctx->needs_input_grad(1);
    variable_list out(4);
    if (!grads[0].defined() || !(logp_grad || ref_grad)) return out;
    static const auto op =
        native_op("rlkernels::kl_penalty_backward").typed<BackwardFn>();
    const variable_list saved = ctx->get_saved_variables();
    const std::string kind = ctx->saved_data["kind"].toStringRef();
    const c10::IValue& clamp = ctx->saved_data["clamp"];
    auto [grad_logp, grad_ref] = op.call(grads[0], saved[0], saved[1], kind,
                                         clamp.isNone() ? std::nullopt : std::optional<double>(clamp.toDouble()),
                                         logp_grad, ref_grad);
    if (logp_grad) out[0] = grad_logp;
    if (ref_grad) out[1] = grad_ref;
    return out;
  }
};

at::Tensor kl_penalty_autograd(const at::Tensor& logp, const at::Tensor& ref_logp, c10::string_view kind,
                               std::optional<double> clamp) {
  return KlPenaltyFunction::apply(logp, ref_logp, kind, clamp);
}

}  // namespace

TORCH_LIBRARY_IMPL(rlkernels, Autograd, m) { m.impl("kl_penalty_autograd", TORCH_FN(kl_penalty_autograd)); }

// Below autograd (inference mode, or a caller already below the autograd key): the forward alone.
TORCH_LIBRARY_IMPL(rlkernels, CompositeExplicitAutograd, m) { m.impl("kl_penalty_autograd", TORCH_FN(kl_forward)); }

}  // namespace rlk
