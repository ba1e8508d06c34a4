// agg_loss's eager autograd in C++: rlkernels::agg_loss_autograd runs the native forward op below autograd inside
// a torch::autograd::Function whose backward is the native backward op (one pass of grad · c_b · m), so the
// backward pass never enters Python. verl's actor calls agg_loss twice a step (its entropy and KL terms). The
// public function takes it in plain eager mode only; under torch.compile and dispatch modes it takes the
// registered op with the Python formula of rlkernels/ops/agg_loss.py, which this one mirrors (policy_loss.cpp
// says why).
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include "native_ops.h"

namespace rlk {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// agg_loss's arguments on a boxed stack (its schema, csrc/rlkernels.cpp; agg_loss_autograd's are the same):
// loss_mat, mask, then the aggregation's.
constexpr size_t kLossMat = 0, kMask = 1;

struct AggLossFunction : torch::autograd::Function<AggLossFunction> {
  // loss_mat: the differentiable input (edge 0); args: agg_loss's whole argument list.
  static variable_list forward(AutogradContext* ctx, const at::Tensor& loss_mat, torch::jit::Stack args) {
    const at::Tensor mask = args[kMask].toTensor();
    {
      // Straight to the device kernel: agg_loss's own autograd kernel is the Python formula.
      at::AutoDispatchBelowADInplaceOrView below;
      static const c10::OperatorHandle forward = native_op("rlkernels::agg_loss");
      forward.callBoxed(&args);  // -> (loss, row weights, ok)
    }
    at::Tensor loss = args[0].toTensor(), row_weights = args[1].toTensor(), ok = args[2].toTensor();
    ctx->save_for_backward({row_weights, loss_mat, mask});
    ctx->mark_non_differentiable({ok});
    ctx->set_materialize_grads(false);
    return {loss, ok};
  }

  // -> (d loss_mat, nothing for args) from d output / d loss.
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list out(2);
    if (!grads[0].defined() || !ctx->needs_input_grad(0)) return out;
    static const auto backward =
        native_op("rlkernels::agg_loss_backward")
            .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&)>();
    const variable_list saved = ctx->get_saved_variables();
    out[0] = backward.call(grads[0], saved[0], saved[1], saved[2]);
    return out;
  }
};

// agg_loss's arguments -> (loss, ok); the loss carries the C++ node when grad mode is on and loss_mat requires
// grad (torch::autograd::Function decides).
void agg_loss_autograd(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  torch::jit::Stack args = take_arguments(op, stack);
  const at::Tensor loss_mat = args[kLossMat].toTensor();
  variable_list out = AggLossFunction::apply(loss_mat, std::move(args));
  torch::jit::push(*stack, std::move(out[0]), std::move(out[1]));
}

// Below autograd (inference mode, or a caller already below the autograd key): the forward alone.
void agg_loss_autograd_below(const c10::OperatorHandle&, c10::DispatchKeySet, torch::jit::Stack* stack) {
  static const c10::OperatorHandle forward = native_op("rlkernels::agg_loss");
  forward.callBoxed(stack);
  auto out = torch::jit::pop(*stack, 3);
  torch::jit::push(*stack, std::move(out[0]), std::move(out[2]));
}

}  // namespace

TORCH_LIBRARY_IMPL(rlkernels, Autograd, m) {
  m.impl("agg_loss_autograd", torch::CppFunction::makeFromBoxedFunction<&agg_loss_autograd>());
}

TORCH_LIBRARY_IMPL(rlkernels, CompositeExplicitAutograd, m) {
  m.impl("agg_loss_autograd", torch::CppFunction::makeFromBoxedFunction<&agg_loss_autograd_below>());
}

}  // namespace rlk
