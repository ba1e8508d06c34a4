// Context switches for the harness's fibers (context.h).
//
// x86-64 (System V): rlk_sim_switch(&from.sp, to.sp) pushes the callee-saved registers (rbp, rbx, r12-r15)
// and the SSE and x87 control words on the current stack, stores the stack pointer, loads the other one and
// pops the same frame. A new context's stack holds such a frame, whose return address is its entry.
#include "context.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#if defined(__x86_64__)

extern "C" void rlk_sim_switch(void** save_sp, void* load_sp);

asm(R"(
  .text
  .globl rlk_sim_switch
  .hidden rlk_sim_switch
  .type rlk_sim_switch, @function
rlk_sim_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size rlk_sim_switch, .-rlk_sim_switch
)");

namespace rlk_sim {

void make_context(Context& ctx, void* stack, size_t bytes, void (*entry)()) {
  // The top of the stack, 16-byte aligned; `entry` starts with the stack pointer 8 below it, as after a call.
  auto* sp = reinterpret_cast<uint64_t*>((reinterpret_cast<uintptr_t>(stack) + bytes) & ~uintptr_t(15));
  *--sp = 0;                                   // entry's return address: it never returns
  *--sp = reinterpret_cast<uint64_t>(entry);   // rlk_sim_switch's `ret` goes here
  for (int r = 0; r < 6; ++r) *--sp = 0;       // rbp, rbx, r12-r15
  uint32_t mxcsr;
  uint16_t fpucw;
  asm volatile("stmxcsr %0" : "=m"(mxcsr));
  asm volatile("fnstcw %0" : "=m"(fpucw));
  *--sp = uint64_t(mxcsr) | uint64_t(fpucw) << 32;  // the caller's rounding modes and exception masks
  ctx.sp = sp;
}

void switch_context(Context& from, Context& to) { rlk_sim_switch(&from.sp, to.sp); }

}  // namespace rlk_sim

#else  // ucontext

namespace rlk_sim {

void make_context(Context& ctx, void* stack, size_t bytes, void (*entry)()) {
  if (getcontext(&ctx.uc) != 0) {
    perror("cuda-on-cpu: getcontext");
    abort();
  }
  ctx.uc.uc_stack.ss_sp = stack;
  ctx.uc.uc_stack.ss_size = bytes;
  ctx.uc.uc_link = nullptr;  // entry never returns
  makecontext(&ctx.uc, entry, 0);
}

void switch_context(Context& from, Context& to) {
  if (swapcontext(&from.uc, &to.uc) != 0) {
    perror("cuda-on-cpu: swapcontext");
    abort();
  }
}

}  // namespace rlk_sim

#endif
