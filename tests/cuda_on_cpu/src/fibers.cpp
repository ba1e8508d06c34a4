// A block's threads as fibers of one OS thread (run_block). The scheduler resumes each thread still running
// once per pass, in an order shuffled afresh each pass. A thread runs until it waits (at a __syncthreads or a
// warp operation: wait_until in state.h) or returns, so the threads interleave at every barrier and warp
// operation, in orders that vary: a missing __syncthreads lets some thread read shared memory before another
// wrote it (the poison: block.cpp), whichever side of the race the code got wrong. The shuffles are
// pseudo-random, seeded by the launch's number and the block's index (and RLK_SIM_SEED), so a test run alone
// repeats itself. A pass in which every thread still running found its wait unmet is a deadlock: the process
// aborts, naming where the threads wait.
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include <map>
#include <utility>

#include "context.h"
#include "state.h"

extern thread_local uint3 threadIdx;
extern thread_local uint3 blockIdx;
extern thread_local dim3 blockDim;
extern thread_local dim3 gridDim;

namespace rlk_sim {
namespace {

// Stack of one fiber, virtual memory touched as it is used: kernels keep a few registers' worth of locals,
// and an error message's strings; a guard page below it turns an overflow into a fault, not corruption.
constexpr size_t kFiberStack = size_t(256) << 10;

struct Fiber {
  Context context;
  void* stack = nullptr;  // kFiberStack bytes above a guard page, kept for the OS thread's next blocks
  unsigned tid = 0;
  bool done = false;
  Site waiting_at;  // the wait it yielded from last
};

// One per OS thread that runs blocks.
struct Scheduler {
  Context main;  // the OS thread's own context, which runs the scheduler
  std::vector<Fiber> fibers;
  std::vector<unsigned> order;  // of the fibers in the current pass
  Fiber* current = nullptr;
  bool stalled = false;  // the current fiber's turn only found its wait unmet
  Block* block = nullptr;
  void (*body)(const void*) = nullptr;
  const void* arg = nullptr;

  void ensure_fibers(unsigned n);
};

thread_local Scheduler t_scheduler;

void* new_stack() {
  const size_t guard = size_t(sysconf(_SC_PAGESIZE));
  void* p = mmap(nullptr, guard + kFiberStack, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                 -1, 0);
  if (p == MAP_FAILED || mprotect(p, guard, PROT_NONE) != 0) {
    perror("cuda-on-cpu: a fiber's stack");
    abort();
  }
  return static_cast<char*>(p) + guard;
}

void Scheduler::ensure_fibers(unsigned n) {
  if (fibers.size() >= n) return;
  fibers.resize(n);  // before any fiber runs: their addresses stay fixed while the block runs
  for (Fiber& f : fibers) {
    if (f.stack == nullptr) f.stack = new_stack();
  }
}

// Points the thread-locals of the device API at fiber `f` of the running block.
void enter(Scheduler& s, Fiber& f) {
  Block& b = *s.block;
  const dim3 bd = b.launch->block;
  threadIdx = uint3{f.tid % bd.x, f.tid / bd.x % bd.y, f.tid / (bd.x * bd.y)};
  t_ctx = ThreadContext{&b, &b.warps[f.tid / kWarpSize], f.tid, f.tid % kWarpSize};
  s.current = &f;
  s.stalled = false;
}

void fiber_main() {
  Scheduler& s = t_scheduler;
  s.body(s.arg);
  warp_exit();
  block_exit();
  s.current->done = true;
  switch_context(s.current->context, s.main);  // never resumed
  abort();
}

[[noreturn]] void deadlock(const Scheduler& s, unsigned running) {
  const Block& b = *s.block;
  std::map<std::string, unsigned> sites;  // "file:line" -> threads waiting there
  for (unsigned t = 0; t < b.threads; ++t) {
    if (!s.fibers[t].done) ++sites[where(s.fibers[t].waiting_at)];
  }
  std::string at;
  for (const auto& [site, n] : sites) at += (at.empty() ? "" : ", ") + std::to_string(n) + " at " + site;
  fprintf(stderr,
          "cuda-on-cpu: %s launched at %s: block (%u,%u,%u) did not finish: a deadlock. Each of its %u threads "
          "still running waits at a __syncthreads or warp operation that others never reach (threads waiting: "
          "%s). Aborting.\n",
          b.launch->kernel, b.launch->where, b.idx.x, b.idx.y, b.idx.z, running, at.c_str());
  abort();
}

}  // namespace

void fiber_yield(const Site& site, bool stalled) {
  Scheduler& s = t_scheduler;
  Fiber& f = *s.current;
  f.waiting_at = site;
  s.stalled = stalled;
  switch_context(f.context, s.main);
}

void run_block(Block& b, uint64_t seed, void (*body)(const void*), const void* arg) {
  Scheduler& s = t_scheduler;
  const unsigned n = b.threads;
  s.ensure_fibers(n);
  s.block = &b;
  s.body = body;
  s.arg = arg;
  blockIdx = b.idx;
  blockDim = b.launch->block;
  gridDim = b.launch->grid;
  for (unsigned t = 0; t < n; ++t) {
    Fiber& f = s.fibers[t];
    f.tid = t;
    f.done = false;
    f.waiting_at = Site();
    make_context(f.context, f.stack, kFiberStack, fiber_main);
  }
  s.order.resize(n);
  for (unsigned t = 0; t < n; ++t) s.order[t] = t;
  uint64_t random = seed * 0x9e3779b97f4a7c15ull | 1;  // xorshift64 state: odd, so never 0
  unsigned running = n;
  while (running > 0) {
    for (unsigned k = n - 1; k > 0; --k) {  // Fisher-Yates
      random ^= random << 13;
      random ^= random >> 7;
      random ^= random << 17;
      std::swap(s.order[k], s.order[random % (k + 1)]);
    }
    bool progress = false;
    for (const unsigned t : s.order) {
      Fiber& f = s.fibers[t];
      if (f.done) continue;
      enter(s, f);
      switch_context(s.main, f.context);
      if (f.done) --running;
      progress |= f.done || !s.stalled;
    }
    if (running > 0 && !progress) deadlock(s, running);
  }
  t_ctx = ThreadContext{};
  s.block = nullptr;
  s.current = nullptr;
}

}  // namespace rlk_sim
