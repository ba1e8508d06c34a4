// The harness's state behind the device API (rlk_sim/device.h): a launch, its blocks in flight, their warps,
// and the context of the thread that runs one CUDA thread.
#pragma once

#include <barrier>
#include <condition_variable>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
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
  std::mutex mutex;
  std::string error;  // empty: none
};

// One warp-wide operation of the lanes of `mask`, from the first lane's arrival until the last lane has
// read its result.
struct Collective {
  WarpOp op;
  int width, size;
  unsigned mask;
  unsigned arrived = 0;                 // written under the warp's mutex until `complete`
  std::atomic<uint32_t> complete{0};    // set (release) by the lane that computes the results
  std::atomic<uint32_t> readers{0};     // lanes done reading `out`; the last one frees the collective
  Site site;  // the first lane's call
  uint64_t in[kWarpSize];
  long long param[kWarpSize];
  uint64_t out[kWarpSize];
};

struct Warp {
  std::mutex mutex;
  unsigned exited = 0;  // lanes that returned, and the lanes past the end of a partial warp
  std::list<Collective> open;
};

struct Block;

// Checks at each __syncthreads that every thread still running reached the same one.
struct BarrierCheck {
  Block* block;
  void operator()() noexcept;
};

struct Block {
  Launch* launch = nullptr;
  uint3 idx{};
  unsigned threads = 0;
  std::optional<std::barrier<BarrierCheck>> barrier;
  std::vector<Site> barrier_site;  // per thread: its current __syncthreads
  std::vector<char> exited;        // per thread
  std::unique_ptr<Warp[]> warps;
  std::mutex shared_mutex;
  std::vector<std::pair<const void*, void*>> shared;  // __shared__ declaration tag -> storage
  size_t shared_bytes = 0;
  void* dynamic = nullptr;
  size_t dynamic_bytes = 0;

  void reset(Launch* l, uint3 index, unsigned nthreads, size_t dyn_bytes);
  void release_shared();
  ~Block() { release_shared(); }
};

// What the thread running one CUDA thread is running.
struct ThreadContext {
  Block* block = nullptr;
  Warp* warp = nullptr;
  unsigned tid = 0, lane = 0;
};
extern thread_local ThreadContext t_ctx;

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
