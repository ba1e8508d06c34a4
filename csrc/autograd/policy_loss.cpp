// policy_loss's eager autograd in C++: rlkernels::policy_loss_autograd runs the native forward op below autograd
// inside a torch::autograd::Function whose backward calls the native backward ops, so the backward pass never
// enters Python. On a GPU the Python autograd.Function around the op cost more host time than its kernels
// (docs/gpu_token_ops.md, "What the time model predicts"). The public function takes this op in plain eager mode
// only; under torch.compile and dispatch modes it takes the registered op with the Python autograd formula of
// rlkernels/ops/policy_loss.py, which this one mirrors.
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/library.h>

#include <optional>
#include <vector>

#include "native_ops.h"

namespace rlk {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Where policy_loss's arguments sit on a boxed stack (its schema, csrc/rlkernels.cpp; policy_loss_autograd's
// arguments are the same).
struct ForwardArgs {
  size_t logp, entropy, first_option, last_option;

  explicit ForwardArgs(const c10::FunctionSchema& s)
      : logp(index(s, "logp")),
        entropy(index(s, "entropy")),
        first_option(index(s, "objective")),
        last_option(index(s, "entropy_coef")) {}

  static size_t index(const c10::FunctionSchema& s, const char* name) {
    const auto i = s.argumentIndexWithName(name);
    TORCH_CHECK(i.has_value(), "rlkernels::policy_loss_autograd: its schema has no argument ", name);
    return *i;
  }
};

const ForwardArgs& forward_args() {
  static const ForwardArgs args(native_op("rlkernels::policy_loss").schema());
  return args;
}

// The saved tensors: the forward's row weights, row sums and saved d S_b / d logp, then its seven tensor
// arguments (logp ... is_weights: policy_loss_backward's order after its first four; absent ones undefined).
enum Saved { kRowWeights, kRowStats, kSavedGrad, kLogp, kOldLogp, kAdvantages, kMask, kRefLogp, kEntropy, kIsWeights };
constexpr size_t kTensorArgs = 7;

struct PolicyLossFunction : torch::autograd::Function<PolicyLossFunction> {
  // logp and entropy: the differentiable inputs (edges 0 and 1; entropy may be absent); args: policy_loss's
  // whole argument list.
  static variable_list forward(AutogradContext* ctx, const at::Tensor& logp, const std::optional<at::Tensor>& entropy,
                               torch::jit::Stack args) {
    const ForwardArgs& at_ = forward_args();
    std::vector<at::Tensor> tensors;
    tensors.reserve(3 + kTensorArgs);
    tensors.resize(3);
    for (size_t i = at_.logp; i < at_.logp + kTensorArgs; ++i)
      tensors.push_back(args[i].isTensor() ? args[i].toTensor() : at::Tensor());
    c10::impl::GenericList options(c10::AnyType::get());
    for (size_t i = at_.first_option; i <= at_.last_option; ++i) options.push_back(args[i]);
    ctx->saved_data["options"] = std::move(options);
    {
      // Straight to the device kernel: policy_loss's own autograd kernel is the Python formula.
      at::AutoDispatchBelowADInplaceOrView below;
      static const c10::OperatorHandle forward = native_op("rlkernels::policy_loss");
      forward.callBoxed(&args);  // -> (loss, stats, row weights, row sums, saved, ok)
    }
    at::Tensor loss = args[0].toTensor(), stats = args[1].toTensor(), ok = args[5].toTensor();
    for (size_t i = 0; i < 3; ++i) tensors[i] = args[2 + i].toTensor();
    ctx->save_for_backward(tensors);
    ctx->mark_non_differentiable({stats, ok});
    ctx->set_materialize_grads(false);
    return {loss, stats, ok};
  }

  // -> (d logp, d entropy, nothing for args) from d output / d loss.
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list t = ctx->get_saved_variables();
    const bool logp_grad = ctx->needs_input_grad(0), entropy_grad = t[kEntropy].defined() && ctx->needs_input_grad(1);
    variable_list out(3);
    const at::Tensor& grad_loss = grads[0];
    if (!grad_loss.defined() || !(logp_grad || entropy_grad)) return out;
    const auto options = ctx->saved_data["options"].toList();  // RLK_POLICY_CONFIG_SCHEMA's order
    at::Tensor& saved = t[kSavedGrad];
    // The last read of the forward's saved d S_b / d logp, when no later backward can read it (the graph is
    // freed after this pass): scaled in place into d logp, in one pass that also writes d entropy (the
    // Python formula's _consume_saved).
    if (logp_grad && saved.numel() > 0 && saved.scalar_type() == t[kLogp].scalar_type() &&
        torch::autograd::get_current_graph_task_id() != -1 && !torch::autograd::get_current_graph_task_keep_graph()) {
      static const auto into_saved =
          native_op("rlkernels::policy_loss_backward_into_saved")
              .typed<at::Tensor(at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, double, bool)>();
      const double entropy_coef = options.get(options.size() - 1).toDouble();  // the last option
      at::Tensor grad_entropy = into_saved.call(saved, grad_loss, t[kRowWeights], t[kMask], entropy_coef, entropy_grad);
      out[0] = saved;
      if (entropy_grad) out[1] = grad_entropy;
      return out;
    }
    static const c10::OperatorHandle backward = native_op("rlkernels::policy_loss_backward");
    torch::jit::Stack stack;
    stack.reserve(4 + kTensorArgs + options.size() + 2);
    stack.insert(stack.end(), {grad_loss, t[kRowWeights], t[kRowStats], saved});
    for (size_t i = kLogp; i <= kIsWeights; ++i) {
      const bool optional = i == kRefLogp || i == kEntropy || i == kIsWeights;
      stack.emplace_back(optional && !t[i].defined() ? c10::IValue() : c10::IValue(t[i]));
    }
    for (const c10::IValue& option : options) stack.push_back(option);
    stack.emplace_back(logp_grad);
    stack.emplace_back(entropy_grad);
    backward.callBoxed(&stack);
    if (logp_grad) out[0] = stack[0].toTensor();
    if (entropy_grad) out[1] = stack[1].toTensor();
    return out;
  }
};

// policy_loss's arguments -> (loss, stat means, ok); the loss carries the C++ node when grad mode is on and logp
// or entropy requires grad (torch::autograd::Function decides).
void policy_loss_autograd(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  const ForwardArgs& at_ = forward_args();
  torch::jit::Stack args = take_arguments(op, stack);
  const at::Tensor logp = args[at_.logp].toTensor();
  const std::optional<at::Tensor> entropy = args[at_.entropy].toOptional<at::Tensor>();
  variable_list out = PolicyLossFunction::apply(logp, entropy, std::move(args));
  torch::jit::push(*stack, std::move(out[0]), std::move(out[1]), std::move(out[2]));
}

// Below autograd (inference mode, or a caller already below the autograd key): the forward alone.
void policy_loss_autograd_below(const c10::OperatorHandle&, c10::DispatchKeySet, torch::jit::Stack* stack) {
  static const c10::OperatorHandle forward = native_op("rlkernels::policy_loss");
  forward.callBoxed(stack);
  auto out = torch::jit::pop(*stack, 6);
  torch::jit::push(*stack, std::move(out[0]), std::move(out[1]), std::move(out[5]));
}

}  // namespace

TORCH_LIBRARY_IMPL(rlkernels, Autograd, m) {
  m.impl("policy_loss_autograd", torch::CppFunction::makeFromBoxedFunction<&policy_loss_autograd>());
}

TORCH_LIBRARY_IMPL(rlkernels, CompositeExplicitAutograd, m) {
  m.impl("policy_loss_autograd", torch::CppFunction::makeFromBoxedFunction<&policy_loss_autograd_below>());
}

}  // namespace rlk
