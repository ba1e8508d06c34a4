// grpo_passk and opo CUDA kernels: each group's statistics accumulate at its representative with atomics (in
// double whatever the scores' dtype: atomics add in no fixed order, which fp32 running sums would depend on),
// one launch per pass that needs the previous pass complete, then a pass writes each response's advantage
// (rlkernels/outcome_estimators.h). CUDA has no float atomicMax: the best and second-best scores are kept
// as ordered integer keys (key(a) < key(b) iff a < b), whose atomicMax is the float max.
#include "common.cuh"
#include "outcome_estimators.h"
#include "rlkernels/outcome_estimators.h"

namespace rlk {
namespace cuda {
namespace {

// Flipping the magnitude bits of a negative float makes its two's-complement bits ordered like its value.
__device__ __forceinline__ long long ordered_key(float x) {
  const int bits = __float_as_int(x);
  return (long long)(bits ^ ((bits >> 31) & 0x7fffffff));
}
__device__ __forceinline__ long long ordered_key(double x) {
  const long long bits = __double_as_longlong(x);
  return bits ^ ((bits >> 63) & 0x7fffffffffffffffLL);
}
template <typename T>
__device__ __forceinline__ T from_key(long long key);
template <>
__device__ __forceinline__ float from_key<float>(long long key) {
  const int k = int(key);
  return __int_as_float(k ^ ((k >> 31) & 0x7fffffff));
}
template <>
__device__ __forceinline__ double from_key<double>(long long key) {
  return __longlong_as_double(key ^ ((key >> 63) & 0x7fffffffffffffffLL));
}

#define RLK_GRID_STRIDE(i, n) \
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); i += int64_t(gridDim.x) * blockDim.x)

template <typename T>
__global__ void passk_first_kernel(const T* __restrict__ s,        // [b] scores
                                   const int64_t* __restrict__ rep,  // [b]
                                   double* __restrict__ stats,       // [4, b] at representatives
                                   long long* __restrict__ keys,     // [2, b] at representatives
                                   int64_t b) {
  RLK_GRID_STRIDE(i, b) {
    const int64_t g = rep[i];
    atomicAdd(stats + g, 1.0);
    atomicAdd(stats + b + g, double(s[i]) - double(s[g]));  // around the group's first score
    atomicMax(keys + g, ordered_key(s[i]));
  }
}

template <typename T>
__global__ void passk_second_kernel(const T* __restrict__ s,        // [b]
                                    const int64_t* __restrict__ rep,  // [b]
                                    double* __restrict__ stats,       // [4, b]
                                    long long* __restrict__ keys,     // [2, b]
                                    int64_t b) {
  RLK_GRID_STRIDE(i, b) {
    const int64_t g = rep[i];
    const double d = double(s[i]) - (double(s[g]) + stats[b + g] / stats[g]);
    atomicAdd(stats + 2 * b + g, d * d);
    if (s[i] == from_key<T>(keys[g])) {
      atomicAdd(stats + 3 * b + g, 1.0);
    } else {
      atomicMax(keys + b + g, ordered_key(s[i]));
    }
  }
}

template <typename T>
__global__ void passk_finish_kernel(const T* __restrict__ s,            // [b]
                                    const int64_t* __restrict__ rep,      // [b]
                                    const double* __restrict__ stats,     // [4, b]
                                    const long long* __restrict__ keys,   // [2, b]
                                    T* __restrict__ out,                  // [b]
                                    int64_t b, double eps, bool norm_by_std) {
  RLK_GRID_STRIDE(i, b) {
    const int64_t g = rep[i];
    out[i] = T(passk_advantage<double>(s[i], stats[g], from_key<T>(keys[g]), stats[3 * b + g],
                                       from_key<T>(keys[b + g]), stats[2 * b + g], eps, norm_by_std));
  }
}

template <typename T>
__global__ void opo_sums_kernel(const T* __restrict__ s,        // [b] scores
                                const T* __restrict__ len,      // [b] lengths
                                const int64_t* __restrict__ rep,  // [b]
                                double* __restrict__ stats,       // [3, b] at representatives
                                int64_t b) {
  RLK_GRID_STRIDE(i, b) {
    const int64_t g = rep[i];
    atomicAdd(stats + g, 1.0);
    atomicAdd(stats + b + g, double(len[i]));
    atomicAdd(stats + 2 * b + g, double(len[i]) * (double(s[i]) - double(s[g])));
  }
}

template <typename T>
__global__ void opo_finish_kernel(const T* __restrict__ s,        // [b]
                                  const int64_t* __restrict__ rep,  // [b]
                                  const double* __restrict__ stats,  // [3, b]
                                  T* __restrict__ out,               // [b]
                                  int64_t b) {
  RLK_GRID_STRIDE(i, b) {
    const int64_t g = rep[i];
    out[i] = T(opo_advantage<double>(s[i], stats[g], s[g], stats[2 * b + g], stats[b + g]));
  }
}

#undef RLK_GRID_STRIDE

template <typename T>
void passk_launch(const void* scores, const int64_t* rep, void* stats, int64_t* keys, void* out, int64_t b,
                  double eps, bool norm_by_std, cudaStream_t stream) {
  const unsigned int blocks = elementwise_blocks(b);
  const T* s = static_cast<const T*>(scores);
  double* st = static_cast<double*>(stats);
  long long* k = reinterpret_cast<long long*>(keys);
  passk_first_kernel<T><<<blocks, kElementwiseThreads, 0, stream>>>(s, rep, st, k, b);
  passk_second_kernel<T><<<blocks, kElementwiseThreads, 0, stream>>>(s, rep, st, k, b);
  passk_finish_kernel<T><<<blocks, kElementwiseThreads, 0, stream>>>(s, rep, st, k, static_cast<T*>(out), b, eps,
                                                                     norm_by_std);
}

template <typename T>
void opo_launch(const void* scores, const void* lengths, const int64_t* rep, void* stats, void* out, int64_t b,
                cudaStream_t stream) {
  const unsigned int blocks = elementwise_blocks(b);
  const T* s = static_cast<const T*>(scores);
  double* st = static_cast<double*>(stats);
  opo_sums_kernel<T><<<blocks, kElementwiseThreads, 0, stream>>>(s, static_cast<const T*>(lengths), rep, st, b);
  opo_finish_kernel<T><<<blocks, kElementwiseThreads, 0, stream>>>(s, rep, st, static_cast<T*>(out), b);
}

}  // namespace

cudaError_t grpo_passk_by_rep(DType dtype, const void* scores, const int64_t* rep, void* stats, int64_t* keys,
                              void* out, int64_t b, double eps, bool norm_by_std, cudaStream_t stream) {
  if (b == 0) return cudaSuccess;
  if (dtype == DType::Float64) {
    passk_launch<double>(scores, rep, stats, keys, out, b, eps, norm_by_std, stream);
  } else if (dtype == DType::Float32) {
    passk_launch<float>(scores, rep, stats, keys, out, b, eps, norm_by_std, stream);
  } else {
    return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t opo_by_rep(DType dtype, const void* scores, const void* lengths, const int64_t* rep, void* stats,
                       void* out, int64_t b, cudaStream_t stream) {
  if (b == 0) return cudaSuccess;
  if (dtype == DType::Float64) {
    opo_launch<double>(scores, lengths, rep, stats, out, b, stream);
  } else if (dtype == DType::Float32) {
    opo_launch<float>(scores, lengths, rep, stats, out, b, stream);
  } else {
    return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace rlk
