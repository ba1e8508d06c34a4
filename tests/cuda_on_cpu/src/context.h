// Execution contexts of the cuda-on-cpu harness's fibers: a stack and the callee-saved registers, switched
// in user space. A switch is a function call that returns in another context: on x86-64 a few instructions
// (context.cpp), elsewhere ucontext's swapcontext (which also saves the signal mask: one system call).
#pragma once

#include <stddef.h>

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

namespace rlk_sim {

struct Context {
#if defined(__x86_64__)
  void* sp = nullptr;  // the saved stack pointer; the registers are on that stack
#else
  ucontext_t uc;
#endif
};

// Prepares `ctx` to run `entry()` on the stack [stack, stack + bytes) at its first switch. `entry` never
// returns: it switches away for the last time.
void make_context(Context& ctx, void* stack, size_t bytes, void (*entry)());

// Saves the running context into `from` and resumes `to`; returns when something switches back to `from`.
void switch_context(Context& from, Context& to);

}  // namespace rlk_sim
