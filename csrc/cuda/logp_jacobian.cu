// The frozen head's vocabulary stream on CUDA (rlkernels/ops/logp_jacobian.py; the Triton flavor's twin is
// rlkernels/triton/logp_jacobian.py): between cuBLAS's GEMMs of a block of rows and a vocabulary chunk, one
// block per row reads the chunk's fp32 logits twice (their max, then e = e^{y − m}·c'), and once a block a
// finish writes logp, Σπ² and d logp / d hidden = (c'_y·W_y − A / Σe) / T. The reference m moves only when a
// chunk's max passes it by more than kLazyGrowth, and only then is the row's accumulator A rescaled.
#include <type_traits>  // std::true_type

#include "block_reduce.cuh"
#include "common.cuh"
#include "logp_jacobian.h"
#include "rlkernels/logprobs.h"
#include "row_walk.cuh"

namespace rlk {
namespace cuda {
namespace {

// Threads per row: 8 warps, enough 16-byte loads in flight to stream a chunk's row (kPacksInFlight each).
constexpr int kRowThreads = 256;
// How far a chunk's max may pass a row's reference before the reference moves: e <= e^8 ≈ 3e3 keeps e·c', Σe
// and Σe² far from overflow in fp32 and in GEMM 2's 16-bit operand, and a chunk that moves it by less leaves A's
// row unread (the Triton kernel's LAZY_GROWTH).
constexpr float kLazyGrowth = 8.0f;

template <typename A, typename H, bool kSoftcap>
__global__ void __launch_bounds__(kRowThreads)
    chunk_kernel(const A* __restrict__ z, int64_t ld_z,  // [rows, cols] the chunk's logits
                 H* __restrict__ e, int64_t ld_e,         // [rows, cols] written
                 A* __restrict__ acc, int64_t ld_acc,     // [rows, dim] rescaled where the reference moves
                 const int64_t* __restrict__ labels,      // [rows]
                 const H* __restrict__ bias,              // [vocab] or null
                 A* __restrict__ state,                   // [5, rows]
                 int64_t rows, int64_t cols, int64_t dim, int64_t vocab, int64_t v0, int64_t ignore_index,
                 LogitTransform<A> t) {
  __shared__ A smem[2 * (kRowThreads / 32)];
  __shared__ A shared_ref;
  __shared__ A shared_rescale;
  const int64_t row = blockIdx.x;
  const int64_t y = labels[row];
  H* er = e + row * ld_e;
  if (y == ignore_index || y < 0 || y >= vocab) {  // uniform across the block: nothing reaches A's row
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) er[j] = from_acc<H>(A(0));
    return;
  }
  const A* zr = z + row * ld_z;
  const A neg_inf = -INFINITY;
  A chunk_max[1] = {neg_inf};
  const auto max_one = [&](int64_t j, A x) {
    const A v = row_logit<A, A, kSoftcap>(x, bias, v0 + j, t);
    chunk_max[0] = v > chunk_max[0] ? v : chunk_max[0];
  };
  const auto max_pack = [&](int64_t, int64_t j0, const Pack<A, kPack<A>>& x) {
#pragma unroll
    for (int i = 0; i < kPack<A>; ++i) max_one(j0 + i, x.v[i]);
  };
  walk_row(zr, cols, max_one, max_pack);
  block_max<kRowThreads>(chunk_max, smem, neg_inf);
  if (threadIdx.x == 0) {
    const A m = state[kStateMax * rows + row];
    const bool moves = chunk_max[0] > m + A(kLazyGrowth);  // the first chunk: m = -inf
    const A s = state[kStateSum * rows + row];
    const A r = moves && s > A(0) ? exp_(m - chunk_max[0]) : A(1);
    shared_ref = moves ? chunk_max[0] : m;
    shared_rescale = r;
    state[kStateSum * rows + row] = s * r;
    state[kStateSumSq * rows + row] *= r * r;
  }
  __syncthreads();
  const A ref = shared_ref, r = shared_rescale;
  if (r != A(1)) {
    A* ar = acc + row * ld_acc;
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) ar[j] *= r;
  }
  A sums[2] = {A(0), A(0)};
  // e for the transformed logit v at column j; the label's logit and slope stored by the thread that reads it.
  // ref = -inf only while every logit so far is -inf (masked tokens): those give e = 0.
  const auto e_one = [&](int64_t j, A x) {
    const A v = row_logit<A, A, kSoftcap>(x, bias, v0 + j, t);
    A ev = v == neg_inf ? A(0) : exp_(v - ref);
    sums[0] += ev;
    sums[1] += ev * ev;
    const A slope = kSoftcap ? transform_grad<A, kSoftcap>(v, t.temp_over_cap, A(1)) : A(1);
    ev *= slope;
    er[j] = from_acc<H>(ev);
    if (v0 + j == y) {
      state[kStateLabelLogit * rows + row] = v;
      state[kStateLabelSlope * rows + row] = slope;
    }
  };
  const auto e_pack = [&](int64_t, int64_t j0, const Pack<A, kPack<A>>& x) {
#pragma unroll
    for (int i = 0; i < kPack<A>; ++i) e_one(j0 + i, x.v[i]);
  };
  walk_row(zr, cols, e_one, e_pack);
  block_sum<kRowThreads>(sums, smem);
  if (threadIdx.x == 0) {
    state[kStateMax * rows + row] = ref;
    state[kStateSum * rows + row] += sums[0];
    state[kStateSumSq * rows + row] += sums[1];
  }
}

// The finish's output dtype, as a value (a tag) for the launch lambda.
template <typename T>
struct OutType {
  using type = T;
};

template <typename A, typename H, typename O>
__global__ void __launch_bounds__(kRowThreads)
    finish_kernel(const A* __restrict__ acc, int64_t ld_acc,  // [rows, dim]
                  const A* __restrict__ state,                 // [5, rows]
                  const int64_t* __restrict__ labels,          // [rows]
                  const H* __restrict__ weight, int64_t ld_w, int64_t col_w,  // [vocab, dim]
                  O* __restrict__ out, int64_t ld_out,         // [rows, dim]
                  A* __restrict__ logp, A* __restrict__ sum_sq,  // [rows]; sum_sq may be null
                  int64_t rows, int64_t dim, int64_t vocab, int64_t ignore_index, A inv_temp) {
  const int64_t row = blockIdx.x;
  const int64_t y = labels[row];
  O* o = out + row * ld_out;
  if (y == ignore_index || y < 0 || y >= vocab) {  // uniform across the block
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) o[j] = from_acc<O>(A(0));
    if (threadIdx.x == 0) {
      logp[row] = A(0);
      if (sum_sq != nullptr) sum_sq[row] = A(0);
    }
    return;
  }
  const A m = state[kStateMax * rows + row], s = state[kStateSum * rows + row];
  if (threadIdx.x == 0) {
    logp[row] = (state[kStateLabelLogit * rows + row] - m) - log_(s);
    if (sum_sq != nullptr) sum_sq[row] = state[kStateSumSq * rows + row] / (s * s);
  }
  const A label_scale = state[kStateLabelSlope * rows + row] * inv_temp, sum_scale = inv_temp / s;
  const A* ar = acc + row * ld_acc;
  const H* wr = weight + y * ld_w;
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) {
    o[j] = from_acc<O>(label_scale * A(to_acc(wr[j * col_w])) - sum_scale * ar[j]);
  }
}

}  // namespace

cudaError_t logp_jacobian_chunk(DType head, const void* z, int64_t ld_z, void* e, int64_t ld_e, void* acc,
                                int64_t ld_acc, const int64_t* labels, const void* bias, void* state, int64_t rows,
                                int64_t cols, int64_t dim, int64_t vocab, int64_t v0, double temperature,
                                double softcap, int64_t ignore_index, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  RLK_CUDA_DISPATCH_FLOATING(head, H, {
    using A = typename Acc<H>::type;
    const LogitTransform<A> t(temperature, softcap);
    const auto launch = [&](auto kSoftcap) {
      chunk_kernel<A, H, decltype(kSoftcap)::value><<<static_cast<unsigned int>(rows), kRowThreads, 0, stream>>>(
          static_cast<const A*>(z), ld_z, static_cast<H*>(e), ld_e, static_cast<A*>(acc), ld_acc, labels,
          static_cast<const H*>(bias), static_cast<A*>(state), rows, cols, dim, vocab, v0, ignore_index, t);
      return cudaGetLastError();
    };
    return softcap > 0 ? launch(std::true_type{}) : launch(std::false_type{});
  });
  return cudaErrorInvalidValue;
}

cudaError_t logp_jacobian_finish(DType head, const void* acc, int64_t ld_acc, const void* state,
                                 const int64_t* labels, const void* weight, int64_t ld_w, int64_t col_w,
                                 bool out_in_acc, void* out, int64_t ld_out, void* logp, void* sum_sq, int64_t rows,
                                 int64_t dim, int64_t vocab, double temperature, int64_t ignore_index,
                                 cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  RLK_CUDA_DISPATCH_FLOATING(head, H, {
    using A = typename Acc<H>::type;
    const auto launch = [&](auto out_type) {
      using O = typename decltype(out_type)::type;
      finish_kernel<A, H, O><<<static_cast<unsigned int>(rows), kRowThreads, 0, stream>>>(
          static_cast<const A*>(acc), ld_acc, static_cast<const A*>(state), labels, static_cast<const H*>(weight),
          ld_w, col_w, static_cast<O*>(out), ld_out, static_cast<A*>(logp), static_cast<A*>(sum_sq), rows, dim,
          vocab, ignore_index, A(1.0 / temperature));
      return cudaGetLastError();
    };
    return out_in_acc ? launch(OutType<A>{}) : launch(OutType<H>{});
  });
  return cudaErrorInvalidValue;
}

}  // namespace cuda
}  // namespace rlk
