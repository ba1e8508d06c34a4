// CUDA-side helpers shared by the .cu kernels: element conversions, dtype dispatch, launch sizing.
// Torch-free on purpose: a .cu that includes torch headers takes minutes to compile.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <initializer_list>
#include <type_traits>

#include "rlkernels/dtype.h"
#include "rows.h"

namespace rlk {
namespace cuda {

// Accumulation type: fp32 for every input type but fp64.
template <typename T>
struct Acc {
  using type = float;
};
template <>
struct Acc<double> {
  using type = double;
};

// A launcher's RowsArg typed: row b of a [B, T] input from row(b) on, element b of a [B] input at row(b)[0].
template <typename E>
struct Rows {
  const E* p;
  int64_t ld;
  __device__ __forceinline__ const E* row(int64_t b) const { return p + b * ld; }
};

template <typename E>
Rows<E> rows_of(const RowsArg& a) {
  return Rows<E>{static_cast<const E*>(a.data), a.ld};
}

// torch compiles with __CUDA_NO_BFLOAT16_CONVERSIONS__ / __CUDA_NO_HALF_CONVERSIONS__: convert explicitly.
__device__ __forceinline__ float to_acc(float x) { return x; }
__device__ __forceinline__ double to_acc(double x) { return x; }
__device__ __forceinline__ float to_acc(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_acc(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T from_acc(float x);
template <>
__device__ __forceinline__ float from_acc<float>(float x) { return x; }
template <>
__device__ __forceinline__ __half from_acc<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_acc<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <typename T>
__device__ __forceinline__ T from_acc(double x) { return x; }

// A [B, T] mask element as mask_weight / mask_value_bad (rlkernels/gae.h, aggregation.h) read it: bool and
// int64 as they are, float weights in A.
template <typename A, typename M>
__device__ __forceinline__ auto mask_raw(const M* p) {
  if constexpr (std::is_same_v<M, bool> || std::is_same_v<M, int64_t>) {
    return *p;
  } else {
    return A(to_acc(*p));
  }
}

// Where a kernel lowers its op's validity flag (an input value the op rejects), it also fails a device-side
// assert with `message`, the op's checks: the error the op's torch._assert_async(flag) raised after the
// launch, without that launch (docs/gpu_token_ops.md, "Input values without a host sync"), so the op issues
// none on its CUDA tensors (rlkernels/ops/_flags.py ASSERTED_IN_KERNEL). The flag is still written: the
// cuda-on-cpu harness records the assert instead of failing (tests/test_device_asserts.py), and the ops'
// CPU-tensor checks then raise the ValueError naming the value.
#define RLK_REQUIRE_VALUES(ok, message) ::rlk::cuda::require_values((ok), (message), __FILE__, __LINE__, __func__)
__device__ __forceinline__ void require_values(bool ok, const char* message, const char* file, unsigned line,
                                               const char* function) {
#if defined(RLK_CUDA_ON_CPU)  // first: the harness defines __CUDA_ARCH__ too (tests/cuda_on_cpu/preprocess.py)
  if (!ok) rlk_sim::device_assert(message, file, line, function);
#elif defined(__CUDA_ARCH__)
  if (!ok) __assert_fail(message, file, line, function);  // CUDA's device-side assert (crt/common_functions.h)
#endif
}

// 16 bytes of T, one 128-bit load or store: 4 fp32, 8 16-bit or 2 fp64 values.
template <typename T>
constexpr int kPack = 16 / int(sizeof(T));
template <typename T, int N = kPack<T>>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

// Whether every non-null pointer is 16-byte aligned (a view at an odd storage offset is not).
inline bool packs_aligned(std::initializer_list<const void*> pointers) {
  for (const void* p : pointers) {
    if (p != nullptr && reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  }
  return true;
}

// Threads per block for elementwise kernels: 8 warps, a good occupancy default on A100/H100.
constexpr int kElementwiseThreads = 256;
// Grid cap for grid-stride loops: plenty of waves for 132 SMs without huge grids for small inputs.
constexpr int64_t kMaxElementwiseBlocks = 132 * 32;

inline unsigned int elementwise_blocks(int64_t n) {
  int64_t blocks = (n + kElementwiseThreads - 1) / kElementwiseThreads;
  if (blocks > kMaxElementwiseBlocks) blocks = kMaxElementwiseBlocks;
  return static_cast<unsigned int>(blocks < 1 ? 1 : blocks);
}

}  // namespace cuda
}  // namespace rlk

// Runs the statement with `T` bound to the CUDA element type of `dtype`.
#define RLK_CUDA_DISPATCH_FLOATING(dtype, T, ...)        \
  switch (dtype) {                                       \
    case ::rlk::DType::Float32: {                        \
      using T = float;                                   \
      __VA_ARGS__;                                       \
      break;                                             \
    }                                                    \
    case ::rlk::DType::Float64: {                        \
      using T = double;                                  \
      __VA_ARGS__;                                       \
      break;                                             \
    }                                                    \
    case ::rlk::DType::Float16: {                        \
      using T = __half;                                  \
      __VA_ARGS__;                                       \
      break;                                             \
    }                                                    \
    case ::rlk::DType::BFloat16: {                       \
      using T = __nv_bfloat16;                           \
      __VA_ARGS__;                                       \
      break;                                             \
    }                                                    \
    default:                                             \
      return cudaErrorInvalidValue;                      \
  }
