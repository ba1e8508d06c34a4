// The grid of a launch in the cuda-on-cpu harness: a few OS threads (the blocks in flight) take the grid's
// blocks in order, each running a block's threads as fibers (fibers.cpp), and the launch returns when every
// block has run (launches are synchronous: one device, one stream). A launch still running after
// RLK_SIM_TIMEOUT_S seconds (a kernel that loops forever; a deadlock is found at once) prints which launch
// and aborts the process: a test run fails instead of hanging.
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <string>
#include <vector>

#include "state.h"

thread_local uint3 threadIdx;
thread_local uint3 blockIdx;
thread_local dim3 blockDim;
thread_local dim3 gridDim;

namespace rlk_sim {

thread_local ThreadContext t_ctx;

namespace {

// CUDA's launch limits (every GPU since Volta).
constexpr unsigned kMaxThreadsPerBlock = 1024;
constexpr unsigned kMaxBlockDimZ = 64;
constexpr unsigned kMaxGridDimX = 0x7fffffffu;
constexpr unsigned kMaxGridDimYZ = 65535;
constexpr size_t kMaxDynamicShared = 48 * 1024;  // without the opt-in attribute
// Blocks run at the same time, each on an OS thread of its own: more than one, so that blocks of a launch
// interleave for real (atomics, the last block of a grid-wide reduction).
constexpr unsigned kDefaultBlocksInFlight = 2;
// Seconds a launch may take before the harness gives up on it: far beyond any test's launch.
constexpr double kDefaultTimeoutS = 120;

// One launch, as the OS threads running its blocks see it.
struct Grid {
  Launch* launch;
  uint64_t seed;                       // of the orders its blocks' threads run in (fibers.cpp)
  void (*body)(const void*);
  const void* arg;
  size_t dynamic_smem;
  uint64_t total;                      // blocks
  std::atomic<uint64_t> next{0};       // the next block to take
  std::atomic<unsigned> remaining{0};  // OS threads still taking blocks
  std::mutex mutex;
  std::condition_variable cv;
  bool done = false;
};

// The OS threads that run blocks; the host starts a launch on the first `participants` of them.
std::atomic<uint32_t> g_ticket{0};  // bumped by the host for each launch
Grid* g_grid = nullptr;
unsigned g_participants = 0;
unsigned g_pool_size = 0;

std::mutex g_launch_mutex;  // one device: launches from host threads take turns
int64_t g_launches = 0;     // every launch so far (launch_count.cpp)
// The kernels launched since take_launched last ran, as their launch site spells them ("k<T, M, 1>"); the
// last kMaxLaunchedNames only (a test reads a few calls' worth).
constexpr size_t kMaxLaunchedNames = 4096;
std::vector<std::string> g_launched;

double env_or(const char* name, double fallback) {
  const char* v = getenv(name);
  return v && *v ? atof(v) : fallback;
}

uint3 block_index(uint64_t i, dim3 grid) {
  return uint3{unsigned(i % grid.x), unsigned(i / grid.x % grid.y), unsigned(i / (uint64_t(grid.x) * grid.y))};
}

void run_blocks(Grid& g) {
  const Launch& l = *g.launch;
  Block block;
  for (uint64_t i; (i = g.next.fetch_add(1, std::memory_order_relaxed)) < g.total;) {
    block.reset(g.launch, block_index(i, l.grid), l.block.x * l.block.y * l.block.z, g.dynamic_smem);
    run_block(block, g.seed ^ (i * 0xbf58476d1ce4e5b9ull), g.body, g.arg);
  }
}

// An OS thread of the pool finishes a launch before the host starts the next one, so it never misses one it
// takes part in.
void* worker_main(void* arg) {
  const unsigned index = unsigned(reinterpret_cast<uintptr_t>(arg));
  uint32_t seen = 0;
  for (;;) {
    g_ticket.wait(seen, std::memory_order_acquire);
    seen = g_ticket.load(std::memory_order_acquire);
    if (index >= g_participants) continue;
    Grid& g = *g_grid;
    run_blocks(g);
    if (g.remaining.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      const std::lock_guard<std::mutex> lock(g.mutex);
      g.done = true;
      g.cv.notify_one();  // under the lock: the host frees the grid once it sees `done`
    }
  }
  return nullptr;
}

void ensure_workers(unsigned n) {
  for (; g_pool_size < n; ++g_pool_size) {
    pthread_t th;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    const int err = pthread_create(&th, &attr, worker_main, reinterpret_cast<void*>(uintptr_t(g_pool_size)));
    pthread_attr_destroy(&attr);
    if (err != 0) {
      fprintf(stderr, "cuda-on-cpu: cannot start thread %u of the pool (error %d)\n", g_pool_size, err);
      abort();
    }
  }
}

std::string config_error(dim3 grid, dim3 block, size_t smem) {
  const uint64_t threads = uint64_t(block.x) * block.y * block.z;
  if (threads == 0 || grid.x == 0 || grid.y == 0 || grid.z == 0) return "an empty grid or block";
  if (threads > kMaxThreadsPerBlock || block.z > kMaxBlockDimZ) return "more than 1024 threads per block";
  if (grid.x > kMaxGridDimX || grid.y > kMaxGridDimYZ || grid.z > kMaxGridDimYZ) return "a grid beyond CUDA's limits";
  if (smem > kMaxDynamicShared) return "more than 48 KiB of dynamic shared memory";
  return "";
}

std::string dims(dim3 d) {
  return "(" + std::to_string(d.x) + "," + std::to_string(d.y) + "," + std::to_string(d.z) + ")";
}

}  // namespace

int64_t launch_count() {
  const std::lock_guard<std::mutex> launch_lock(g_launch_mutex);
  return g_launches;
}

std::vector<std::string> take_launched() {
  const std::lock_guard<std::mutex> launch_lock(g_launch_mutex);
  std::vector<std::string> out;
  out.swap(g_launched);
  return out;
}

void run_grid(const char* kernel, const char* where, dim3 grid, dim3 block, size_t dynamic_smem,
              void (*body)(const void*), const void* arg) {
  const std::lock_guard<std::mutex> launch_lock(g_launch_mutex);
  ++g_launches;
  if (g_launched.size() == kMaxLaunchedNames) g_launched.erase(g_launched.begin());
  g_launched.emplace_back(kernel);
  const std::string bad = config_error(grid, block, dynamic_smem);
  if (!bad.empty()) {
    set_last_error(cudaErrorInvalidConfiguration, std::string("cuda-on-cpu: ") + kernel + " launched at " + where +
                                                      " with grid " + dims(grid) + " and block " + dims(block) +
                                                      ": " + bad);
    return;
  }
  Launch launch;
  launch.kernel = kernel;
  launch.where = where;
  launch.grid = grid;
  launch.block = block;
  Grid g;
  g.launch = &launch;
  g.seed = uint64_t(g_launches) ^ uint64_t(env_or("RLK_SIM_SEED", 0)) << 32;
  g.body = body;
  g.arg = arg;
  g.dynamic_smem = dynamic_smem;
  g.total = uint64_t(grid.x) * grid.y * grid.z;
  const unsigned in_flight = std::max(1u, unsigned(env_or("RLK_SIM_BLOCKS_IN_FLIGHT", kDefaultBlocksInFlight)));
  const unsigned workers = unsigned(std::min<uint64_t>(g.total, in_flight));
  const auto timeout = std::chrono::duration<double>(env_or("RLK_SIM_TIMEOUT_S", kDefaultTimeoutS));
  ensure_workers(workers);
  g.remaining.store(workers, std::memory_order_relaxed);
  g_grid = &g;
  g_participants = workers;
  g_ticket.fetch_add(1, std::memory_order_release);
  g_ticket.notify_all();
  std::unique_lock<std::mutex> lock(g.mutex);
  if (!g.cv.wait_for(lock, timeout, [&g] { return g.done; })) {
    fprintf(stderr,
            "cuda-on-cpu: %s launched at %s: did not finish within %.0f s (RLK_SIM_TIMEOUT_S): a kernel that "
            "never returns. Aborting.\n",
            kernel, where, timeout.count());
    abort();
  }
  if (!launch.error.empty()) set_last_error(cudaErrorLaunchFailure, launch.error);
}

}  // namespace rlk_sim
