// What the C++ autograd nodes over the native ops (csrc/autograd/*.cpp) share: the ops they call by name, and a
// boxed kernel's argument list taken off its stack.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

namespace rlk {

// The registered op `name` ("rlkernels::value_loss"), for a call that skips the Python of its registration.
inline c10::OperatorHandle native_op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "");
}

// The op's whole argument list, in order, moved off the boxed stack.
inline torch::jit::Stack take_arguments(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const size_t count = op.schema().arguments().size();
  torch::jit::Stack args(stack->end() - count, stack->end());
  torch::jit::drop(*stack, count);
  return args;
}

}  // namespace rlk
