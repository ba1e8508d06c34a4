// The harness's state behind the device API (rlk_sim/device.h): a launch, its blocks in flight, their warps,
// and the context of the CUDA thread running now. A block's threads are fibers of one OS thread
// (fibers.cpp), so a block's state needs no lock; blocks in flight run on different OS threads and share
// only their launch (and global memory).
#pragma once

#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "rlk_sim/device.h"

namespace rlk_sim {

constexpr unsigned kWarpSize = 32;
constexpr unsigned kFullMask = 0xffffffffu;

// One launch: where it came from, and the first error any of its threads recorded.
struct Launch {
  const char* kernel;
  const char* where;
  dim3 grid, block;
  std::mutex mutex;   // blocks on different OS threads may record errors at the same time
  std::string error;  // empty: none
};

// One warp-wide operation of the lanes of `mask`, from the first lane's arrival until the last lane has
// read its result.
struct Collective {
  WarpOp op;
  int width, size;
  unsigned mask;
  unsigned arrived = 0;   // lanes that joined
  bool complete = false;  // set by the lane that computes the results
  unsigned readers = 0;   // lanes done reading `out`; the last one frees the collective
  Site site;  // the first lane's call
  uint64_t in[kWarpSize];
  long long param[kWarpSize];
  uint64_t out[kWarpSize];
};

struct Warp {
  unsigned exited = 0;  // lanes that returned, and the lanes past the end of a partial warp
  std::list<Collective> open;
};

struct Block {
  Launch* launch = nullptr;
  uint3 idx{};
  unsigned threads = 0;
  // __syncthreads: the threads at the current one, the threads still running (one that returns stops
  // counting, as on a GPU), and how many have completed (a waiting thread leaves when it changes).
  unsigned arrived = 0, running = 0, generation = 0;
  std::vector<Site> barrier_site;  // per thread: its current __syncthreads
  std::vector<char> exited;        // per thread
  std::unique_ptr<Warp[]> warps;
  std::vector<std::pair<const void*, void*>> shared;  // __shared__ declaration tag -> storage
  size_t shared_bytes = 0;
  void* dynamic = nullptr;
  size_t dynamic_bytes = 0;

  void reset(Launch* l, uint3 index, unsigned nthreads, size_t dyn_bytes);
  // Every thread still running has arrived at the current __syncthreads: check that they all reached the
  // same one and let them go.
  void complete_barrier();
  void release_shared();
  ~Block() { release_shared(); }
};

// What the CUDA thread running now is running (set by the block's scheduler at each switch).
struct ThreadContext {
  Block* block = nullptr;
  Warp* warp = nullptr;
  unsigned tid = 0, lane = 0;
};
extern thread_local ThreadContext t_ctx;

// Runs every thread of `b` as a fiber on the calling OS thread, until all have returned, in an order that
// `seed` shuffles (fibers.cpp). A block whose threads all wait on each other (a deadlock) aborts the process
// with a message.
void run_block(Block& b, uint64_t seed, void (*body)(const void*), const void* arg);

// The calling CUDA thread waits at `site` until `ready()` holds, while the block's other threads run.
void fiber_yield(const Site& site, bool stalled);
template <typename Ready>
void wait_until(const Site& site, Ready ready) {
  // The first yield registers an arrival (progress); later ones found `ready()` still false (stalled).
  for (bool stalled = false; !ready(); stalled = true) fiber_yield(site, stalled);
}

// Records the first error of the current launch, naming the kernel, block and thread (`tid`, the linear
// thread index in the block, or the calling thread's when negative).
void device_error(const Site& site, const std::string& what, int tid = -1);
// What the host thread's next cudaGetLastError returns.
void set_last_error(cudaError_t code, const std::string& message);
// The calling thread returns from the kernel: other lanes and the block barrier stop waiting for it.
void warp_exit();
void block_exit();

std::string where(const Site& site);
// Shared storage: 64-byte aligned, every byte 0xff (NaN in every float, -1 in every integer).
void* aligned_poisoned(size_t bytes);
void aligned_free(void* p);

}  // namespace rlk_sim
