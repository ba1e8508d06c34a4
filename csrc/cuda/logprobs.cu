// Row kernels of the log-prob ops: one block per row streams the row with coalesced loads, each thread keeps
// online softmax statistics (one exp per logit), merged across the block with warp shuffles. The math is the
// shared rlkernels/logprobs.h. Used on full logits rows (logprobs_from_logits) and on the [N, C] logits chunks
// that cuBLAS produces for linear_logprobs (csrc/cuda/logprobs_binding.cpp).
#include "block_reduce.cuh"
#include "common.cuh"
#include "last_block.cuh"
#include "logprobs.h"
#include "rlkernels/logprobs.h"
#include "row_walk.cuh"

namespace rlk {
namespace cuda {
namespace {

// Threads per row: 8 warps, enough loads in flight to stream a 128k-entry row at full bandwidth.
constexpr int kRowThreads = 256;
constexpr int kWarp = 32;

template <typename A, bool kSumSq>
__device__ __forceinline__ SoftmaxStats<A> warp_merge_stats(SoftmaxStats<A> st) {
  for (int offset = kWarp / 2; offset > 0; offset >>= 1) {
    const SoftmaxStats<A> other{__shfl_xor_sync(0xffffffffu, st.m, offset),
                                __shfl_xor_sync(0xffffffffu, st.s, offset),
                                __shfl_xor_sync(0xffffffffu, st.a, offset),
                                kSumSq ? __shfl_xor_sync(0xffffffffu, st.s2, offset) : A(0)};
    st = merge_softmax_stats(st, other);
  }
  return st;
}

// The statistics of the whole block, valid in thread 0.
template <typename A, bool kSumSq>
__device__ __forceinline__ SoftmaxStats<A> block_merge_stats(SoftmaxStats<A> st) {
  __shared__ SoftmaxStats<A> partial[kRowThreads / kWarp];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  st = warp_merge_stats<A, kSumSq>(st);
  if (lane == 0) partial[warp] = st;
  __syncthreads();
  if (warp == 0) {
    st = lane < int(blockDim.x / kWarp) ? partial[lane] : empty_softmax_stats<A>();
    st = warp_merge_stats<A, kSumSq>(st);
  }
  return st;
}

// Adds the N transformed logits z to st: one rescale to their max, then one exponential each. A −inf logit
// (a masked token) adds nothing (exp_reference, entropy_term); a NaN goes on into the sums.
template <typename A, bool kEntropy, bool kSumSq, int N>
__device__ __forceinline__ void add_logits(SoftmaxStats<A>& st, const A (&z)[N]) {
  A m = z[0];
#pragma unroll
  for (int i = 1; i < N; ++i) m = z[i] > m ? z[i] : m;
  if (m > st.m) {  // a new running max: rescale what was seen (nothing the first time)
    const bool seen = st.s > A(0);
    const A d = seen ? st.m - m : A(0);
    const A e = seen ? exp_(d) : A(0);
    if (kEntropy) st.a = e * (st.a + d * st.s);
    if (kSumSq) st.s2 = e * e * st.s2;
    st.s = e * st.s;
    st.m = m;
  }
  const A ref = exp_reference(st.m);
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const A d = z[i] - ref;
    const A e = exp_(d);
    st.s += e;
    if (kEntropy) st.a += entropy_term(e, d);
    if (kSumSq) st.s2 += e * e;
  }
}

// This thread's online softmax statistics of its logits of one row (column j is vocabulary entry col0 + j,
// bias [cols] added first when non-null); the transformed logit of label y goes to *z_target when this
// thread reads it.
template <typename In, typename A, bool kSoftcap, bool kEntropy, bool kSumSq>
__device__ __forceinline__ SoftmaxStats<A> thread_row_stats(const In* __restrict__ xr, int64_t cols, int64_t col0,
                                                            const A* __restrict__ bias, int64_t y,
                                                            const LogitTransform<A>& t, A* z_target) {
  constexpr int P = kPack<In>;
  SoftmaxStats<A> st = empty_softmax_stats<A>();
  const auto one = [&](int64_t j, In xj) {
    const A z[1] = {row_logit<In, A, kSoftcap>(xj, bias, j, t)};
    add_logits<A, kEntropy, kSumSq>(st, z);
    if (col0 + j == y) *z_target = z[0];
  };
  const auto pack = [&](int64_t, int64_t j0, const Pack<In, P>& x) {
    A z[P];
#pragma unroll
    for (int i = 0; i < P; ++i) {
      z[i] = row_logit<In, A, kSoftcap>(x.v[i], bias, j0 + i, t);
      if (col0 + j0 + i == y) *z_target = z[i];
    }
    add_logits<A, kEntropy, kSumSq>(st, z);
  };
  walk_row(xr, cols, one, pack);
  return st;
}

template <typename In, typename A, bool kSoftcap, bool kEntropy, bool kSumSq>
__global__ void __launch_bounds__(kRowThreads)
    row_stats_kernel(const In* __restrict__ x,            // [rows, cols], row stride ld
                     int64_t ld, int64_t cols, int64_t col0,
                     const A* __restrict__ bias,           // [cols] or null
                     const int64_t* __restrict__ labels,   // [rows]
                     int64_t ignore_index, LogitTransform<A> t,
                     A* m_io, A* s_io, A* a_io, A* s2_io,  // [rows] running statistics
                     A* z_target) {                        // [rows]
  const int64_t row = blockIdx.x;
  const int64_t y = labels[row];
  if (y == ignore_index) return;  // uniform across the block
  SoftmaxStats<A> st = thread_row_stats<In, A, kSoftcap, kEntropy, kSumSq>(x + row * ld, cols, col0, bias, y, t,
                                                                          z_target + row);
  st = block_merge_stats<A, kSumSq>(st);
  if (threadIdx.x == 0) {
    const SoftmaxStats<A> prev{m_io[row], s_io[row], kEntropy ? a_io[row] : A(0), kSumSq ? s2_io[row] : A(0)};
    const SoftmaxStats<A> out = merge_softmax_stats(prev, st);
    m_io[row] = out.m;
    s_io[row] = out.s;
    if (kEntropy) a_io[row] = out.a;
    if (kSumSq) s2_io[row] = out.s2;
  }
}

template <typename A>
__global__ void finalize_kernel(const A* __restrict__ m, const A* __restrict__ s, const A* __restrict__ a,
                                const A* __restrict__ s2, const A* __restrict__ z_target,
                                const int64_t* __restrict__ labels, int64_t rows, int64_t ignore_index, bool entropy,
                                bool sum_sq, A* __restrict__ logp, A* __restrict__ ent, double* __restrict__ lse,
                                A* __restrict__ sq) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < rows; i += stride) {
    if (labels[i] == ignore_index) {
      logp[i] = A(0);
      lse[i] = 0.0;
      if (entropy) ent[i] = A(0);
      if (sum_sq) sq[i] = A(0);
      continue;
    }
    const SoftmaxStats<A> st{m[i], s[i], entropy ? a[i] : A(0), sum_sq ? s2[i] : A(0)};
    const double l = softmax_lse(st);
    lse[i] = l;
    logp[i] = logprob_value(z_target[i], split_lse<A>(l));
    if (entropy) ent[i] = softmax_entropy(st);
    if (sum_sq) sq[i] = softmax_sum_sq(st);
  }
}

// logprobs_from_logits in one launch: one block per full logits row (its label checked: in [0, cols) or
// ignore_index; another gives 0 and is counted), statistics, then thread 0 writes the row's outputs as
// finalize_kernel; the last block writes ok (no bad label).
template <typename In, typename A, bool kSoftcap, bool kEntropy, bool kSumSq>
__global__ void __launch_bounds__(kRowThreads)
    logits_rows_kernel(const In* __restrict__ x,  // [rows, cols], rows at x_rows
                       RowStrides x_rows, int64_t cols,
                       const int64_t* __restrict__ labels,  // [rows]
                       int64_t ignore_index, LogitTransform<A> t,
                       A* __restrict__ logp, A* __restrict__ ent, double* __restrict__ lse,
                       A* __restrict__ sq,           // [rows] (ent when kEntropy, sq when kSumSq)
                       float* __restrict__ parts,    // [rows] each row's bad label
                       unsigned int* __restrict__ counter,  // [1] zero (launch_counter.h)
                       bool* __restrict__ ok) {             // [] every label valid
  __shared__ A z_target;
  const int64_t row = blockIdx.x;
  const int64_t y = labels[row];
  const bool bad = y != ignore_index && (y < 0 || y >= cols);
  if (y != ignore_index && !bad) {  // uniform across the block
    if (threadIdx.x == 0) z_target = A(0);  // overwritten by the thread that reads the label's column
    __syncthreads();
    SoftmaxStats<A> st = thread_row_stats<In, A, kSoftcap, kEntropy, kSumSq>(x + x_rows.offset(row), cols, 0, nullptr,
                                                                            y, t, &z_target);
    st = block_merge_stats<A, kSumSq>(st);  // synchronizes: z_target is written
    if (threadIdx.x == 0) {
      const double l = softmax_lse(st);
      lse[row] = l;
      logp[row] = logprob_value(z_target, split_lse<A>(l));
      if (kEntropy) ent[row] = softmax_entropy(st);
      if (kSumSq) sq[row] = softmax_sum_sq(st);
    }
  } else if (threadIdx.x == 0) {
    logp[row] = A(0);
    lse[row] = 0.0;
    if (kEntropy) ent[row] = A(0);
    if (kSumSq) sq[row] = A(0);
  }
  if (threadIdx.x == 0) parts[row] = bad ? 1.0f : 0.0f;
  if (!last_block(counter, gridDim.x)) return;
  float total[1] = {0.0f};
  for (int64_t i = threadIdx.x; i < gridDim.x; i += kRowThreads) total[0] += load_partial(parts + i);
  __shared__ float smem[kRowThreads / kWarp];
  block_sum<kRowThreads>(total, smem);
  if (threadIdx.x == 0) {
    *ok = total[0] == 0.0f;
    RLK_REQUIRE_VALUES(*ok, "rlkernels logprobs_from_logits: a label outside [0, V) that is not ignore_index");
  }
}

// out[j] = f(j, x[j]) over one row's columns [0, cols): x read in packs, kPacksInFlight at a time, and out
// written in packs of as many values where its row is aligned as x's is (else one value at a time). x and out
// may alias (same dtype and row): every element is read, then written, by one thread.
template <typename In, typename Out, typename F>
__device__ __forceinline__ void map_row(const In* x, Out* out, int64_t cols, F f) {
  constexpr int P = kPack<In>;
  auto* out_packs = reinterpret_cast<Pack<Out, P>*>(out + split_row(x, cols).head);
  const bool packed = reinterpret_cast<uintptr_t>(out_packs) % sizeof(Pack<Out, P>) == 0;
  const auto one = [&](int64_t j, In xj) { out[j] = f(j, xj); };
  const auto pack = [&](int64_t p, int64_t j0, const Pack<In, P>& xs) {
    Pack<Out, P> w;
#pragma unroll
    for (int i = 0; i < P; ++i) w.v[i] = f(j0 + i, xs.v[i]);
    if (packed) {
      out_packs[p] = w;
    } else {
#pragma unroll
      for (int i = 0; i < P; ++i) out[j0 + i] = w.v[i];
    }
  };
  walk_row(x, cols, one, pack);
}

// out[0, cols) = 0, in packs.
template <typename Out>
__device__ __forceinline__ void zero_row(Out* out, int64_t cols) {
  constexpr int P = kPack<Out>;
  const Out z = from_acc<Out>(typename Acc<Out>::type(0));
  const RowSplit r = split_row(out, cols);
  for (int64_t j = threadIdx.x; j < r.head; j += blockDim.x) out[j] = z;
  auto* packs = reinterpret_cast<Pack<Out, P>*>(out + r.head);
  Pack<Out, P> zero;
#pragma unroll
  for (int i = 0; i < P; ++i) zero.v[i] = z;
  for (int64_t p = threadIdx.x; p < r.packs; p += blockDim.x) packs[p] = zero;
  for (int64_t j = r.tail + threadIdx.x; j < cols; j += blockDim.x) out[j] = z;
}

// x and out may alias (same dtype and row stride): every element is read, then written, by one thread.
template <typename In, typename Out, typename A, bool kSoftcap, bool kEntropy>
__global__ void __launch_bounds__(kRowThreads)
    row_grad_kernel(const In* x, RowStrides x_rows,       // [rows, cols]
                    Out* out, int64_t ld_out,              // [rows, cols]
                    int64_t cols, int64_t col0,
                    const A* __restrict__ bias,            // [cols] or null
                    const int64_t* __restrict__ labels,    // [rows]
                    int64_t ignore_index, LogitTransform<A> t,
                    const double* __restrict__ lse, const A* __restrict__ entropy,  // [rows]
                    const A* __restrict__ g_logp, const A* __restrict__ g_ent,  // [rows] at g_stride, or null
                    int64_t g_stride) {
  const int64_t row = blockIdx.x;
  const int64_t y = labels[row];
  const In* xr = x + x_rows.offset(row);
  Out* o = out + row * ld_out;
  if (y == ignore_index) {
    zero_row(o, cols);
    return;
  }
  const RowLse<A> l = split_lse<A>(lse[row]);
  const A gl = g_logp != nullptr ? g_logp[row * g_stride] : A(0);  // null: only the entropy reaches the loss
  const A h = kEntropy ? entropy[row] : A(0), ge = kEntropy ? g_ent[row * g_stride] : A(0);
  map_row(xr, o, cols, [&](int64_t j, In xj) {
    const A z = row_logit<In, A, kSoftcap>(xj, bias, j, t);
    const A dz = softmax_logit_grad<A, kEntropy>(z, l, h, gl, ge) + (col0 + j == y ? gl : A(0));
    return from_acc<Out>(dz * transform_grad<A, kSoftcap>(z, t.temp_over_cap, t.inv_temp));
  });
}

// f(bool_constant<softcap>, bool_constant<entropy>)
template <typename F>
cudaError_t dispatch_flags(bool softcap, bool entropy, F&& f) {
  if (softcap) {
    if (entropy) return f(std::true_type{}, std::true_type{});
    return f(std::true_type{}, std::false_type{});
  }
  if (entropy) return f(std::false_type{}, std::true_type{});
  return f(std::false_type{}, std::false_type{});
}

unsigned int row_blocks(int64_t rows) { return static_cast<unsigned int>(rows); }

template <typename In, typename Out>
cudaError_t launch_grad(const void* x, RowStrides x_rows, void* out, int64_t ld_out, int64_t rows, int64_t cols,
                        int64_t col0, const void* bias, const int64_t* labels, LogitArgs args, const void* lse,
                        const void* entropy, const void* g_logp, const void* g_ent, int64_t g_stride,
                        cudaStream_t stream) {
  using A = typename Acc<In>::type;
  const LogitTransform<A> t(args.temperature, args.softcap);
  return dispatch_flags(args.softcap > 0, args.entropy, [&](auto kSoftcap, auto kEntropy) {
    row_grad_kernel<In, Out, A, decltype(kSoftcap)::value, decltype(kEntropy)::value>
        <<<row_blocks(rows), kRowThreads, 0, stream>>>(
            static_cast<const In*>(x), x_rows, static_cast<Out*>(out), ld_out, cols, col0,
            static_cast<const A*>(bias), labels, args.ignore_index, t, static_cast<const double*>(lse),
            static_cast<const A*>(entropy), static_cast<const A*>(g_logp), static_cast<const A*>(g_ent), g_stride);
    return cudaGetLastError();
  });
}

}  // namespace

cudaError_t softmax_rows_stats(DType x_dtype, const void* x, int64_t ld, int64_t rows, int64_t cols, int64_t col0,
                               const void* bias, const int64_t* labels, LogitArgs args, void* m, void* s, void* a,
                               void* s2, void* z_target, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  RLK_CUDA_DISPATCH_FLOATING(x_dtype, T, {
    using A = typename Acc<T>::type;
    const LogitTransform<A> t(args.temperature, args.softcap);
    return dispatch_flags(args.softcap > 0, args.entropy, [&](auto kSoftcap, auto kEntropy) {
      const auto launch = [&](auto kSumSq) {
        row_stats_kernel<T, A, decltype(kSoftcap)::value, decltype(kEntropy)::value, decltype(kSumSq)::value>
            <<<row_blocks(rows), kRowThreads, 0, stream>>>(
                static_cast<const T*>(x), ld, cols, col0, static_cast<const A*>(bias), labels, args.ignore_index, t,
                static_cast<A*>(m), static_cast<A*>(s), static_cast<A*>(a), static_cast<A*>(s2),
                static_cast<A*>(z_target));
        return cudaGetLastError();
      };
      return args.sum_sq ? launch(std::true_type{}) : launch(std::false_type{});
    });
  });
  return cudaErrorInvalidValue;
}

cudaError_t softmax_rows_finalize(DType acc, const void* m, const void* s, const void* a, const void* s2,
                                  const void* z_target, const int64_t* labels, int64_t rows, LogitArgs args,
                                  void* logp, void* entropy, void* lse, void* sum_sq, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  const unsigned int blocks = elementwise_blocks(rows);
  if (acc == DType::Float64) {
    finalize_kernel<double><<<blocks, kElementwiseThreads, 0, stream>>>(
        static_cast<const double*>(m), static_cast<const double*>(s), static_cast<const double*>(a),
        static_cast<const double*>(s2), static_cast<const double*>(z_target), labels, rows, args.ignore_index,
        args.entropy, args.sum_sq, static_cast<double*>(logp), static_cast<double*>(entropy),
        static_cast<double*>(lse), static_cast<double*>(sum_sq));
  } else if (acc == DType::Float32) {
    finalize_kernel<float><<<blocks, kElementwiseThreads, 0, stream>>>(
        static_cast<const float*>(m), static_cast<const float*>(s), static_cast<const float*>(a),
        static_cast<const float*>(s2), static_cast<const float*>(z_target), labels, rows, args.ignore_index,
        args.entropy, args.sum_sq, static_cast<float*>(logp), static_cast<float*>(entropy), static_cast<double*>(lse),
        static_cast<float*>(sum_sq));
  } else {
    return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t softmax_rows_grad(DType x_dtype, const void* x, RowStrides x_rows, DType out_dtype, void* out,
                              int64_t ld_out, int64_t rows, int64_t cols, int64_t col0, const void* bias,
                              const int64_t* labels, LogitArgs args, const void* lse, const void* entropy,
                              const void* g_logp, const void* g_ent, cudaStream_t stream, int64_t g_stride) {
  if (rows == 0 || cols == 0) return cudaSuccess;
#define RLK_GRAD_CASE(IN, OUT)                                                                                    \
  return launch_grad<IN, OUT>(x, x_rows, out, ld_out, rows, cols, col0, bias, labels, args, lse, entropy, g_logp, \
                              g_ent, g_stride, stream)
  switch (x_dtype) {
    case DType::Float32:
      if (out_dtype == DType::Float32) RLK_GRAD_CASE(float, float);
      if (out_dtype == DType::Float16) RLK_GRAD_CASE(float, __half);
      if (out_dtype == DType::BFloat16) RLK_GRAD_CASE(float, __nv_bfloat16);
      break;
    case DType::Float64:
      if (out_dtype == DType::Float64) RLK_GRAD_CASE(double, double);
      break;
    case DType::Float16:
      if (out_dtype == DType::Float16) RLK_GRAD_CASE(__half, __half);
      break;
    case DType::BFloat16:
      if (out_dtype == DType::BFloat16) RLK_GRAD_CASE(__nv_bfloat16, __nv_bfloat16);
      break;
  }
#undef RLK_GRAD_CASE
  return cudaErrorInvalidValue;
}

cudaError_t logits_rows(DType x_dtype, const void* x, RowStrides x_rows, int64_t rows, int64_t cols,
                        const int64_t* labels, LogitArgs args, void* logp, void* entropy, void* lse, void* sum_sq,
                        float* parts, unsigned int* counter, bool* ok, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  RLK_CUDA_DISPATCH_FLOATING(x_dtype, T, {
    using A = typename Acc<T>::type;
    const LogitTransform<A> t(args.temperature, args.softcap);
    return dispatch_flags(args.softcap > 0, args.entropy, [&](auto kSoftcap, auto kEntropy) {
      const auto launch = [&](auto kSumSq) {
        logits_rows_kernel<T, A, decltype(kSoftcap)::value, decltype(kEntropy)::value, decltype(kSumSq)::value>
            <<<row_blocks(rows), kRowThreads, 0, stream>>>(
                static_cast<const T*>(x), x_rows, cols, labels, args.ignore_index, t, static_cast<A*>(logp),
                static_cast<A*>(entropy), static_cast<double*>(lse), static_cast<A*>(sum_sq), parts, counter, ok);
        return cudaGetLastError();
      };
      return args.sum_sq ? launch(std::true_type{}) : launch(std::false_type{});
    });
  });
  return cudaErrorInvalidValue;
}

}  // namespace cuda
}  // namespace rlk
