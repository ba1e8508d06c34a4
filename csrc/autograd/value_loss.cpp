// value_loss's eager autograd in C++: rlkernels::value_loss_autograd runs the native forward op below autograd
// inside a torch::autograd::Function whose backward is the native backward op (one pass that recomputes the
// exp-free tokens), so the backward pass never enters Python. The public function takes it in plain eager mode
// only; under torch.compile and dispatch modes it takes the registered op with the Python formula of
// rlkernels/ops/value_loss.py, which this one mirrors (policy_loss.cpp says why).
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include "native_ops.h"

namespace rlk {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// value_loss's arguments on a boxed stack (its schema, csrc/rlkernels.cpp; value_loss_autograd's are the same):
// values, old_values, returns, mask, clip, then the aggregation's.
constexpr size_t kValues = 0, kOldValues = 1, kReturns = 2, kMask = 3, kClip = 4;

struct ValueLossFunction : torch::autograd::Function<ValueLossFunction> {
  // values: the differentiable input (edge 0); args: value_loss's whole argument list.
  static variable_list forward(AutogradContext* ctx, const at::Tensor& values, torch::jit::Stack args) {
    const at::Tensor old_values = args[kOldValues].toTensor(), returns = args[kReturns].toTensor();
    const at::Tensor mask = args[kMask].toTensor();
    const std::optional<double> clip = args[kClip].toOptional<double>();
    {
      // Straight to the device kernel: value_loss's own autograd kernel is the Python formula.
      at::AutoDispatchBelowADInplaceOrView below;
      static const c10::OperatorHandle forward = native_op("rlkernels::value_loss");
      forward.callBoxed(&args);  // -> (loss, clipfrac, row weights, ok)
    }
    at::Tensor loss = args[0].toTensor(), clipfrac = args[1].toTensor(), row_weights = args[2].toTensor();
    at::Tensor ok = args[3].toTensor();
    ctx->save_for_backward({row_weights, values, old_values, returns, mask});
    ctx->saved_data["clip"] = clip.has_value() ? c10::IValue(*clip) : c10::IValue();
    ctx->mark_non_differentiable({clipfrac, ok});
    ctx->set_materialize_grads(false);
    return {loss, clipfrac, ok};
  }

  // -> (d values, nothing for args) from d output / d loss.
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list out(2);
    if (!grads[0].defined() || !ctx->needs_input_grad(0)) return out;
    static const auto backward =
        native_op("rlkernels::value_loss_backward")
            .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                              const at::Tensor&, const at::Tensor&, std::optional<double>)>();
    const variable_list saved = ctx->get_saved_variables();
    const c10::IValue& clip = ctx->saved_data["clip"];
    out[0] = backward.call(grads[0], saved[0], saved[1], saved[2], saved[3], saved[4],
                           clip.isNone() ? std::nullopt : std::optional<double>(clip.toDouble()));
    return out;
  }
};

// value_loss's arguments -> (loss, clipfrac, ok); the loss carries the C++ node when grad mode is on and values
// requires grad (torch::autograd::Function decides).
void value_loss_autograd(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  torch::jit::Stack args = take_arguments(op, stack);
  const at::Tensor values = args[kValues].toTensor();
  variable_list out = ValueLossFunction::apply(values, std::move(args));
  torch::jit::push(*stack, std::move(out[0]), std::move(out[1]), std::move(out[2]));
}

// Below autograd (inference mode, or a caller already below the autograd key): the forward alone.
void value_loss_autograd_below(const c10::OperatorHandle&, c10::DispatchKeySet, torch::jit::Stack* stack) {
  static const c10::OperatorHandle forward = native_op("rlkernels::value_loss");
  forward.callBoxed(stack);
  auto out = torch::jit::pop(*stack, 4);
  torch::jit::push(*stack, std::move(out[0]), std::move(out[1]), std::move(out[3]));
}

}  // namespace

TORCH_LIBRARY_IMPL(rlkernels, Autograd, m) {
  m.impl("value_loss_autograd", torch::CppFunction::makeFromBoxedFunction<&value_loss_autograd>());
}

TORCH_LIBRARY_IMPL(rlkernels, CompositeExplicitAutograd, m) {
  m.impl("value_loss_autograd", torch::CppFunction::makeFromBoxedFunction<&value_loss_autograd_below>());
}

}  // namespace rlk
