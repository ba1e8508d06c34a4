// The device side of CUDA for the cuda-on-cpu harness: the thread builtins, __syncthreads, the warp
// intrinsics, block-shared storage, atomics and the launch. The implementation (each block in flight on an
// OS thread, its CUDA threads fibers of it) is tests/cuda_on_cpu/src/; docs/testing.md describes the model.
#pragma once

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <atomic>
#include <bit>
#include <new>
#include <source_location>
#include <tuple>
#include <type_traits>
#include <utility>

#include "rlk_sim/api.h"
#include "rlk_sim/qualifiers.h"

// Set for each thread before it runs a kernel.
extern thread_local uint3 threadIdx;
extern thread_local uint3 blockIdx;
extern thread_local dim3 blockDim;
extern thread_local dim3 gridDim;
constexpr int warpSize = 32;

namespace rlk_sim {

using Site = std::source_location;

enum class WarpOp : int { ShflIdx, ShflUp, ShflDown, ShflXor, Ballot, Any, All, SyncWarp };

void syncthreads(const Site& site);
// One warp-wide operation: waits for every non-exited lane of `mask`, then returns this lane's result
// (the shuffled value's bits, or the vote). Records an error (the launch then fails) when the calling
// lane is not in `mask`, when a lane reads a lane that is not in `mask` or has exited, when lanes of one
// mask meet in different operations, or when `width` is not a power of two in [1, 32].
uint64_t warp_collective(WarpOp op, unsigned mask, uint64_t value, long long param, int width, int size,
                         const Site& site);
// The block's storage for the __shared__ declaration identified by `tag`, filled with 0xff bytes (NaN
// for floats) when the block first reaches it.
void* block_shared(const void* tag, size_t bytes, size_t align);
void* dynamic_shared();
[[noreturn]] void trap(const Site& site);

template <typename T>
T& block_shared_as(const void* tag) {
  static_assert(std::is_trivially_default_constructible_v<std::remove_all_extents_t<T>>,
                "__shared__ variables cannot have constructors");
  return *std::launder(static_cast<T*>(block_shared(tag, sizeof(T), alignof(T))));
}

template <typename T>
T* dynamic_shared_as() {
  return static_cast<T*>(dynamic_shared());
}

template <typename T>
uint64_t to_bits(const T& v) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8, "warp shuffles move values of up to 8 bytes");
  uint64_t b = 0;
  memcpy(&b, &v, sizeof(T));
  return b;
}

template <typename T>
T from_bits(uint64_t b) {
  T v;
  memcpy(&v, &b, sizeof(T));
  return v;
}

template <typename T>
T shuffle(WarpOp op, unsigned mask, const T& var, long long param, int width, const Site& site) {
  return from_bits<T>(warp_collective(op, mask, to_bits(var), param, width, int(sizeof(T)), site));
}

// Kernel launches run so far in this process (benchmarks/gpu_cost.py counts a binding's launches with it).
int64_t launch_count();
// A failed device-side assert (csrc/cuda/common.cuh require_values): recorded with its kernel, not fatal as
// on a GPU, so that the op still returns its flag and the CPU-tensor checks raise their ValueError;
// tests/test_device_asserts.py reads the records (rlkernels_sim_stats::device_asserts).
void device_assert(const char* message, const char* file, unsigned line, const char* function);

void run_grid(const char* kernel, const char* where, dim3 grid, dim3 block, size_t dynamic_smem,
              void (*body)(const void*), const void* arg);

// kernel<<<grid, block, smem, stream>>>(args...), as rewritten by tests/cuda_on_cpu/preprocess.py. The
// arguments are converted to the kernel's parameter types once, and each thread gets its own copy.
template <typename... P, typename... Args>
void launch(const char* kernel, const char* where, void (*f)(P...), dim3 grid, dim3 block, size_t smem,
            cudaStream_t, Args&&... args) {
  static_assert(sizeof...(P) == sizeof...(Args), "kernel launched with the wrong number of arguments");
  struct Call {
    void (*f)(P...);
    std::tuple<std::decay_t<P>...> params;
    static void run(const void* self) {
      const Call& c = *static_cast<const Call*>(self);
      std::apply([&c](const auto&... p) { c.f(p...); }, c.params);
    }
  };
  const Call call{f, std::tuple<std::decay_t<P>...>(std::forward<Args>(args)...)};
  run_grid(kernel, where, grid, block, smem, &Call::run, &call);
}

}  // namespace rlk_sim

inline void __syncthreads(const std::source_location site = std::source_location::current()) {
  rlk_sim::syncthreads(site);
}

inline void __syncwarp(unsigned mask = 0xffffffffu, const std::source_location site = std::source_location::current()) {
  rlk_sim::warp_collective(rlk_sim::WarpOp::SyncWarp, mask, 0, 0, warpSize, 0, site);
}

template <typename T>
T __shfl_sync(unsigned mask, T var, int srcLane, int width = warpSize,
              const std::source_location site = std::source_location::current()) {
  return rlk_sim::shuffle(rlk_sim::WarpOp::ShflIdx, mask, var, srcLane, width, site);
}

template <typename T>
T __shfl_up_sync(unsigned mask, T var, unsigned int delta, int width = warpSize,
                 const std::source_location site = std::source_location::current()) {
  return rlk_sim::shuffle(rlk_sim::WarpOp::ShflUp, mask, var, delta, width, site);
}

template <typename T>
T __shfl_down_sync(unsigned mask, T var, unsigned int delta, int width = warpSize,
                   const std::source_location site = std::source_location::current()) {
  return rlk_sim::shuffle(rlk_sim::WarpOp::ShflDown, mask, var, delta, width, site);
}

template <typename T>
T __shfl_xor_sync(unsigned mask, T var, int laneMask, int width = warpSize,
                  const std::source_location site = std::source_location::current()) {
  return rlk_sim::shuffle(rlk_sim::WarpOp::ShflXor, mask, var, laneMask, width, site);
}

inline unsigned __ballot_sync(unsigned mask, int predicate,
                              const std::source_location site = std::source_location::current()) {
  return unsigned(rlk_sim::warp_collective(rlk_sim::WarpOp::Ballot, mask, predicate != 0, 0, warpSize, 0, site));
}

inline int __any_sync(unsigned mask, int predicate, const std::source_location site = std::source_location::current()) {
  return int(rlk_sim::warp_collective(rlk_sim::WarpOp::Any, mask, predicate != 0, 0, warpSize, 0, site));
}

inline int __all_sync(unsigned mask, int predicate, const std::source_location site = std::source_location::current()) {
  return int(rlk_sim::warp_collective(rlk_sim::WarpOp::All, mask, predicate != 0, 0, warpSize, 0, site));
}

// On a GPU, the lanes converged with the caller at this point: the harness does not model convergence (its
// lanes run independently between warp operations), so code that asks fails to compile.
#define __activemask() __activemask_is_not_supported_by_the_cuda_on_cpu_harness()

inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence_block() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __trap(const std::source_location site = std::source_location::current()) { rlk_sim::trap(site); }

template <typename T>
T __ldg(const T* p) {
  return *p;
}

// Bit reinterpretations of floats (CUDA's type-punning intrinsics).
inline int __float_as_int(float x) { return std::bit_cast<int>(x); }
inline float __int_as_float(int x) { return std::bit_cast<float>(x); }
inline long long __double_as_longlong(double x) { return std::bit_cast<long long>(x); }
inline double __longlong_as_double(long long x) { return std::bit_cast<double>(x); }

// Atomics on global or shared memory: read-modify-write through std::atomic_ref (relaxed, as CUDA's).
template <typename T>
T atomicAdd(T* address, T val) {
  return std::atomic_ref<T>(*address).fetch_add(val, std::memory_order_relaxed);
}
template <typename T>
T atomicSub(T* address, T val) {
  static_assert(std::is_integral_v<T>, "atomicSub takes integers");
  return std::atomic_ref<T>(*address).fetch_sub(val, std::memory_order_relaxed);
}
template <typename T>
T atomicExch(T* address, T val) {
  return std::atomic_ref<T>(*address).exchange(val, std::memory_order_relaxed);
}
template <typename T>
T atomicCAS(T* address, T compare, T val) {
  std::atomic_ref<T>(*address).compare_exchange_strong(compare, val, std::memory_order_relaxed);
  return compare;  // the old value either way
}
template <typename T>
T atomicMax(T* address, T val) {
  static_assert(std::is_integral_v<T>, "atomicMax takes integers");
  std::atomic_ref<T> a(*address);
  T old = a.load(std::memory_order_relaxed);
  while (old < val && !a.compare_exchange_weak(old, val, std::memory_order_relaxed)) {
  }
  return old;
}
template <typename T>
T atomicMin(T* address, T val) {
  static_assert(std::is_integral_v<T>, "atomicMin takes integers");
  std::atomic_ref<T> a(*address);
  T old = a.load(std::memory_order_relaxed);
  while (old > val && !a.compare_exchange_weak(old, val, std::memory_order_relaxed)) {
  }
  return old;
}
template <typename T>
T atomicAnd(T* address, T val) {
  return std::atomic_ref<T>(*address).fetch_and(val, std::memory_order_relaxed);
}
template <typename T>
T atomicOr(T* address, T val) {
  return std::atomic_ref<T>(*address).fetch_or(val, std::memory_order_relaxed);
}
template <typename T>
T atomicXor(T* address, T val) {
  return std::atomic_ref<T>(*address).fetch_xor(val, std::memory_order_relaxed);
}

// CUDA's global min / max overloads for arithmetic types: the usual arithmetic conversions for mixed types,
// fmin / fmax (a NaN loses to a number) for floating point.
template <typename T, typename U, typename = std::enable_if_t<std::is_arithmetic_v<T> && std::is_arithmetic_v<U>>>
std::common_type_t<T, U> min(T a, U b) {
  using C = std::common_type_t<T, U>;
  if constexpr (std::is_floating_point_v<C>) return fmin(C(a), C(b));
  return C(b) < C(a) ? C(b) : C(a);
}
template <typename T, typename U, typename = std::enable_if_t<std::is_arithmetic_v<T> && std::is_arithmetic_v<U>>>
std::common_type_t<T, U> max(T a, U b) {
  using C = std::common_type_t<T, U>;
  if constexpr (std::is_floating_point_v<C>) return fmax(C(a), C(b));
  return C(a) < C(b) ? C(b) : C(a);
}
