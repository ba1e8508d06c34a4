// A block of the cuda-on-cpu harness: __syncthreads (its threads are fibers: a thread waits by letting the
// others run until the last one still running arrives; a thread that returns stops counting, as on a GPU),
// a check that the threads still running meet at the same __syncthreads, and the block's __shared__
// storage.
#include <stdlib.h>
#include <string.h>

#include "state.h"

namespace rlk_sim {
namespace {

// Static plus dynamic shared memory a block may use without an opt-in attribute, on every GPU since Volta.
constexpr size_t kMaxSharedBytes = 48 * 1024;
// Alignment of every shared allocation: a cache line, more than any type a kernel keeps there needs.
constexpr size_t kSharedAlign = 64;

bool same_site(const Site& a, const Site& b) {
  return a.line() == b.line() && a.column() == b.column() && strcmp(a.file_name(), b.file_name()) == 0;
}

}  // namespace

void* aligned_poisoned(size_t bytes) {
  void* p = ::operator new((bytes + kSharedAlign - 1) / kSharedAlign * kSharedAlign, std::align_val_t(kSharedAlign));
  memset(p, 0xff, bytes);  // NaN in every float and double, -1 in every integer: a read before a write shows
  return p;
}

void aligned_free(void* p) {
  if (p) ::operator delete(p, std::align_val_t(kSharedAlign));
}

void Block::complete_barrier() {
  arrived = 0;
  ++generation;
  int first = -1;
  for (unsigned t = 0; t < threads; ++t) {
    if (exited[t]) continue;
    if (first < 0) {
      first = int(t);
    } else if (!same_site(barrier_site[t], barrier_site[first])) {
      device_error(barrier_site[t],
                   "__syncthreads reached by thread " + std::to_string(t) + " here and by thread " +
                       std::to_string(first) + " at " + where(barrier_site[first]) + ": a barrier in divergent code",
                   int(t));
      return;
    }
  }
}

void Block::reset(Launch* l, uint3 index, unsigned nthreads, size_t dyn_bytes) {
  release_shared();
  launch = l;
  idx = index;
  threads = nthreads;
  arrived = 0;
  running = nthreads;
  generation = 0;
  barrier_site.assign(nthreads, Site());
  exited.assign(nthreads, 0);
  const unsigned nwarps = (nthreads + kWarpSize - 1) / kWarpSize;
  warps.reset(new Warp[nwarps]);
  const unsigned tail = nthreads % kWarpSize;  // lanes of a partial last warp
  if (tail) warps[nwarps - 1].exited = kFullMask << tail;
  dynamic_bytes = dyn_bytes;
  shared_bytes = dyn_bytes;
  dynamic = dyn_bytes ? aligned_poisoned(dyn_bytes) : nullptr;
}

void Block::release_shared() {
  for (auto& s : shared) aligned_free(s.second);
  shared.clear();
  aligned_free(dynamic);
  dynamic = nullptr;
  shared_bytes = 0;
}

void syncthreads(const Site& site) {
  const ThreadContext& c = t_ctx;
  Block& b = *c.block;
  b.barrier_site[c.tid] = site;
  const unsigned generation = b.generation;
  if (++b.arrived == b.running) b.complete_barrier();
  wait_until(site, [&b, generation] { return b.generation != generation; });
}

void block_exit() {
  const ThreadContext& c = t_ctx;
  Block& b = *c.block;
  b.exited[c.tid] = 1;
  --b.running;
  if (b.arrived > 0 && b.arrived == b.running) b.complete_barrier();
}

void* block_shared(const void* tag, size_t bytes, size_t align) {
  Block& b = *t_ctx.block;
  for (const auto& s : b.shared) {
    if (s.first == tag) return s.second;
  }
  if (align > kSharedAlign) device_error(Site::current(), "a __shared__ type aligned to more than 64 bytes");
  void* p = aligned_poisoned(bytes);
  b.shared.emplace_back(tag, p);
  b.shared_bytes += bytes;
  if (b.shared_bytes > kMaxSharedBytes) {
    device_error(Site::current(), "the block uses " + std::to_string(b.shared_bytes) +
                                      " bytes of shared memory, more than the 48 KiB a launch gets by default");
  }
  return p;
}

void* dynamic_shared() { return t_ctx.block->dynamic; }

}  // namespace rlk_sim
