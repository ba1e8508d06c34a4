// The grid of a launch in the cuda-on-cpu harness: a pool of real threads runs the blocks a few at a time,
// one thread per CUDA thread, and the launch returns when every block has run (launches are synchronous:
// one device, one stream). A launch stuck for longer than RLK_SIM_TIMEOUT_S seconds (a deadlock: a barrier
// or a warp operation some thread never reaches) prints which launch and aborts the process: a test run
// fails instead of hanging.
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include <chrono>
#include <deque>

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
// Stack of a pool thread: kernels keep a few registers' worth of locals.
constexpr size_t kWorkerStack = size_t(1) << 20;
// Blocks run at the same time: more than one, so that blocks of a launch also interleave.
constexpr unsigned kDefaultBlocksInFlight = 2;
// Seconds a launch may take before the harness calls it a deadlock: far beyond any test's launch.
constexpr double kDefaultTimeoutS = 120;

// The blocks in flight of one launch: their threads each run `body(arg)` once.
struct Round {
  void (*body)(const void*);
  const void* arg;
  Block* blocks;
  unsigned threads;
  dim3 grid, block;
  std::atomic<unsigned> remaining{0};
  std::mutex mutex;
  std::condition_variable cv;
  bool done = false;
};

// Pool threads in groups of 32 that share a futex: the host starts a round with one wake per group, not one
// per thread, and the groups a smaller launch does not need stay asleep.
constexpr unsigned kGroup = 32;

struct Group {
  std::atomic<uint32_t> ticket{0};  // bumped by the host to start the group's threads on `round`
  Round* round = nullptr;
  unsigned participants = 0;        // threads of the round: pool thread i runs when i < participants
};

struct Worker {
  Group* group;
  unsigned index;  // thread i of the pool runs thread i % threads of block i / threads of the round
};

std::mutex g_launch_mutex;                            // one device: launches from host threads take turns
int64_t g_launches = 0;                               // every launch so far (launch_count.cpp)
std::deque<Group>* g_groups = new std::deque<Group>;  // never destroyed: the threads outlive main()
size_t g_pool_size = 0;

double env_or(const char* name, double fallback) {
  const char* v = getenv(name);
  return v && *v ? atof(v) : fallback;
}

void run_thread(Round& r, unsigned slot, unsigned tid) {
  Block& b = r.blocks[slot];
  threadIdx = uint3{tid % r.block.x, tid / r.block.x % r.block.y, tid / (r.block.x * r.block.y)};
  blockIdx = b.idx;
  blockDim = r.block;
  gridDim = r.grid;
  t_ctx = ThreadContext{&b, &b.warps[tid / kWarpSize], tid, tid % kWarpSize};
  r.body(r.arg);
  warp_exit();
  block_exit();
  t_ctx = ThreadContext{};
}

// A thread of a round finishes it before the host starts the next one, so it never misses a round it takes
// part in.
void* worker_main(void* arg) {
  const Worker w = *static_cast<Worker*>(arg);
  delete static_cast<Worker*>(arg);
  uint32_t seen = 0;
  for (;;) {
    w.group->ticket.wait(seen, std::memory_order_acquire);
    seen = w.group->ticket.load(std::memory_order_acquire);
    if (w.index >= w.group->participants) continue;
    Round& r = *w.group->round;
    run_thread(r, w.index / r.threads, w.index % r.threads);
    if (r.remaining.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      const std::lock_guard<std::mutex> lock(r.mutex);
      r.done = true;
      r.cv.notify_one();  // under the lock: the host frees the round once it sees `done`
    }
  }
  return nullptr;
}

void ensure_workers(size_t n) {
  for (; g_pool_size < n; ++g_pool_size) {
    if (g_pool_size % kGroup == 0) g_groups->emplace_back();  // a deque: addresses stay valid as it grows
    Worker* w = new Worker{&g_groups->back(), unsigned(g_pool_size)};
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, kWorkerStack);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_t th;
    const int err = pthread_create(&th, &attr, worker_main, w);
    pthread_attr_destroy(&attr);
    if (err != 0) {
      fprintf(stderr, "cuda-on-cpu: cannot start thread %zu of the pool (error %d)\n", g_pool_size, err);
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

void run_grid(const char* kernel, const char* where, dim3 grid, dim3 block, size_t dynamic_smem,
              void (*body)(const void*), const void* arg) {
  const std::lock_guard<std::mutex> launch_lock(g_launch_mutex);
  ++g_launches;
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
  const unsigned threads = block.x * block.y * block.z;
  const uint64_t total = uint64_t(grid.x) * grid.y * grid.z;
  const unsigned in_flight = unsigned(env_or("RLK_SIM_BLOCKS_IN_FLIGHT", kDefaultBlocksInFlight));
  const unsigned slots = unsigned(total < in_flight ? total : (in_flight ? in_flight : 1));
  const auto timeout = std::chrono::duration<double>(env_or("RLK_SIM_TIMEOUT_S", kDefaultTimeoutS));
  ensure_workers(size_t(slots) * threads);
  std::unique_ptr<Block[]> blocks(new Block[slots]);
  for (uint64_t first = 0; first < total; first += slots) {
    const unsigned n = unsigned(total - first < slots ? total - first : slots);
    for (unsigned s = 0; s < n; ++s) {
      const uint64_t bi = first + s;
      blocks[s].reset(&launch, uint3{unsigned(bi % grid.x), unsigned(bi / grid.x % grid.y),
                                     unsigned(bi / (uint64_t(grid.x) * grid.y))},
                      threads, dynamic_smem);
    }
    Round round;
    round.body = body;
    round.arg = arg;
    round.blocks = blocks.get();
    round.threads = threads;
    round.grid = grid;
    round.block = block;
    round.remaining.store(n * threads, std::memory_order_relaxed);
    for (unsigned g = 0; g * kGroup < n * threads; ++g) {
      Group& group = (*g_groups)[g];
      group.round = &round;
      group.participants = n * threads;
      group.ticket.fetch_add(1, std::memory_order_release);
      group.ticket.notify_all();
    }
    std::unique_lock<std::mutex> lock(round.mutex);
    if (!round.cv.wait_for(lock, timeout, [&round] { return round.done; })) {
      fprintf(stderr,
              "cuda-on-cpu: %s launched at %s: blocks %llu..%llu did not finish within %.0f s (RLK_SIM_TIMEOUT_S); "
              "a deadlock: some thread waits at a __syncthreads or warp operation that others never reach. "
              "%u of %u threads still running. Aborting.\n",
              kernel, where, (unsigned long long)first, (unsigned long long)(first + n - 1), timeout.count(),
              round.remaining.load(), n * threads);
      abort();
    }
  }
  if (!launch.error.empty()) set_last_error(cudaErrorLaunchFailure, launch.error);
}

}  // namespace rlk_sim
