// The token kernels' loads in packs (value_loss.cu, agg_loss.cu, policy_loss.cu): where every [B, T] input's
// rows start on a pack boundary, a thread loads V consecutive tokens of an input at once (16 bytes of fp32:
// LDG.E.128) instead of V tokens kThreads apart one at a time; the CUDA C++ forwards took 1.8x the Triton
// ones' time on the fourth H200 run with 32-bit loads (docs/gpu_token_ops.md). Rows at any other offset
// (verl's log-probs sliced out of a padded sequence) take V = 1, the same kernels a token per load.
#pragma once

#include <stdint.h>
#include <string.h>

#include <initializer_list>
#include <utility>

#include "common.cuh"
#include "rows.h"

namespace rlk {
namespace cuda {

// Tokens a pack of T's inputs holds in a kernel whose threads take kItems tokens a block: 16 bytes of T, at
// most kItems (value_loss's 4 bf16 tokens: 8 bytes).
template <typename T, int kItems>
constexpr int kTokenPack = kPack<T> < kItems ? kPack<T> : kItems;

// Column of a thread's token k (0 <= k < kItems) of block chunk c (kThreads · kItems tokens), in packs of V:
// the thread's pack k / V lies kThreads · V columns after its previous one, so a warp's pack loads are
// adjacent. V = 1: tokens kThreads apart.
template <int kThreads, int kItems, int V>
__device__ __forceinline__ int64_t pack_column(int64_t c, int k) {
  return c * (kThreads * kItems) + (int64_t(k / V) * kThreads + threadIdx.x) * V + k % V;
}

// p[0, V) in one load (p on a multiple of V elements: pack_rows).
template <int V, typename E>
__device__ __forceinline__ Pack<E, V> load_pack(const E* __restrict__ p) {
  return *reinterpret_cast<const Pack<E, V>*>(p);
}

// p[0, V) = x in one store. nvcc (13.0) splits a Pack's store from registers into a store per element in the
// token kernels (st.global.f32 x 4 where the loads are one ld.global.nc.v4; a float4's store too), so 16 and
// 8-byte packs are stored by PTX itself; the cuda-on-cpu harness (RLK_CUDA_ON_CPU, which defines
// __CUDA_ARCH__ too) copies the Pack.
template <int V, typename E>
__device__ __forceinline__ void store_pack(E* __restrict__ p, const Pack<E, V>& x) {
#if defined(__CUDA_ARCH__) && !defined(RLK_CUDA_ON_CPU)
  constexpr size_t kBytes = sizeof(Pack<E, V>);
  if constexpr (kBytes == 16) {
    unsigned w[4];
    memcpy(w, &x, kBytes);
    asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(w[0]), "r"(w[1]), "r"(w[2]), "r"(w[3])
                 : "memory");
    return;
  } else if constexpr (kBytes == 8) {
    unsigned w[2];
    memcpy(w, &x, kBytes);
    asm volatile("st.global.v2.b32 [%0], {%1, %2};" ::"l"(p), "r"(w[0]), "r"(w[1]) : "memory");
    return;
  }
#endif
  *reinterpret_cast<Pack<E, V>*>(p) = x;
}

// Whether a launch on these rows may take packs of V tokens: T (the contiguous outputs' row stride) a multiple
// of V, and every input present (data non-null) with its data on a multiple of V elements' bytes and its row
// stride a multiple of V. `inputs`: (rows, bytes of one element).
template <int V>
inline bool pack_rows(int64_t T, std::initializer_list<std::pair<RowsArg, int>> inputs) {
  if (T % V != 0) return false;
  for (const auto& [rows, bytes] : inputs) {
    if (rows.data == nullptr) continue;
    if (reinterpret_cast<uintptr_t>(rows.data) % (uintptr_t(V) * bytes) != 0 || rows.ld % V != 0) return false;
  }
  return true;
}

}  // namespace cuda
}  // namespace rlk
