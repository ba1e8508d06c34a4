// agg_loss CUDA kernels, the scheme of value_loss.cu (docs/gpu_token_ops.md): ONE forward launch of (row, chunk)
// blocks whose deterministic block reductions of Σ m·L, Σ m and the rejected mask values are published as
// partials, the last block finishing the loss, the rows' weights and the validity flag (loss_finish.cuh,
// aggregation.h); one elementwise backward launch writing grad_loss · row_weights[b] · m.
#include "block_reduce.cuh"
#include "common.cuh"
#include "agg_loss.h"
#include "loss_finish.cuh"
#include "rlkernels/agg_loss.h"
#include "rlkernels/aggregation.h"
#include "token_packs.cuh"

namespace rlk {
namespace cuda {
namespace {

// Threads per block: 8 warps, a good occupancy default on A100/H100.
constexpr int kThreads = 256;
// Tokens per thread per block: 4 independent loads of each input in flight per thread to cover memory latency.
constexpr int kItems = 4;
constexpr int kChunk = kThreads * kItems;
constexpr int kWarps = kThreads / 32;
// The partials' columns are AggLossPart's; the op returns no per-row sums and no stat.
using AggLossLayout = PartLayout<kAggLossParts, kAggLossSum, kAggLossCount, 0, 0, 0, 0, kAggLossBad>;

// V: tokens a load (token_packs.cuh), kTokenPack<T, kItems> on rows that take packs, else 1.
template <typename T, typename M, int V>
__global__ void __launch_bounds__(kThreads)
    agg_forward_kernel(Rows<T> loss_mat, Rows<M> mask,  // [B, T] each
                       int64_t B, int64_t T_, int64_t chunks,
                       typename Acc<T>::type* __restrict__ part,  // [grid, kAggLossParts]
                       unsigned int* __restrict__ counter,        // [1], zero
                       AggParams agg, LossOutputs<typename Acc<T>::type> out) {
  using A = typename Acc<T>::type;
  __shared__ A smem[kAggLossParts * kWarps];
  const int64_t b = blockIdx.x / chunks, c = blockIdx.x % chunks;
  A v[kAggLossParts] = {A(0), A(0), A(0)};
#pragma unroll
  for (int k = 0; k < kItems; k += V) {
    const int64_t t = pack_column<kThreads, kItems, V>(c, k);
    if (b < B && t < T_) {  // an empty batch launches one block of no row, which finishes; packs are whole
      const Pack<T, V> ls = load_pack<V>(loss_mat.row(b) + t);
      const Pack<M, V> ms = load_pack<V>(mask.row(b) + t);
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const A m = mask_weight<A>(ms.v[j]);
        v[kAggLossSum] += m != A(0) ? m * to_acc(ls.v[j]) : A(0);  // a masked-out NaN adds 0
        v[kAggLossCount] += m;
        v[kAggLossBad] += bad_mask_value(ms.v[j]) ? A(1) : A(0);
      }
    }
  }
  block_sum<kThreads>(v, smem);
  if (publish_partials(v, part, counter)) {
    finish_loss<kThreads, AggLossLayout>(part, B, chunks, agg, out,
                                         "rlkernels agg_loss: mask weights negative or not finite, or an integer mask "
                                         "value other than 0 and 1");
  }
}

template <typename T, typename M, int V>
__global__ void __launch_bounds__(kThreads)
    agg_backward_kernel(const typename Acc<T>::type* __restrict__ grad_loss,    // [1]
                        const typename Acc<T>::type* __restrict__ row_weights,  // [B]
                        Rows<M> mask,                                           // [B, T]
                        int64_t T_, int64_t chunks,
                        T* __restrict__ grad) {  // [B, T] contiguous
  using A = typename Acc<T>::type;
  const int64_t b = blockIdx.x / chunks, c = blockIdx.x % chunks;
  const A g = grad_loss[0] * row_weights[b];  // d output / d row sum
#pragma unroll
  for (int k = 0; k < kItems; k += V) {
    const int64_t t = pack_column<kThreads, kItems, V>(c, k);
    if (t < T_) {
      const Pack<M, V> ms = load_pack<V>(mask.row(b) + t);
      Pack<T, V> out;
#pragma unroll
      for (int j = 0; j < V; ++j) out.v[j] = from_acc<T>(g * mask_weight<A>(ms.v[j]));
      store_pack<V>(grad + b * T_ + t, out);
    }
  }
}

// Whether x's rows take packs of kTokenPack<T, kItems> tokens (token_packs.cuh).
template <typename T, typename M>
bool takes_packs(const AggLossTensors& x) {
  return pack_rows<kTokenPack<T, kItems>>(x.T, {{x.loss_mat, int(sizeof(T))}, {x.mask, int(sizeof(M))}});
}

}  // namespace

int64_t agg_loss_workspace(int64_t B, int64_t T) { return forward_blocks<kChunk>(B, T) * kAggLossParts; }

cudaError_t agg_loss_forward(DType dtype, const AggLossTensors& x, const AggParams& agg, const AggLossOutputs& outputs,
                             void* workspace, unsigned int* counter, cudaStream_t stream) {
  const int64_t chunks = num_chunks<kChunk>(x.T);
  const unsigned int blocks = static_cast<unsigned int>(forward_blocks<kChunk>(x.B, x.T));
  RLK_CUDA_DISPATCH_FLOATING(dtype, T, {
    using A = typename Acc<T>::type;
    const LossOutputs<A> out{static_cast<A*>(outputs.loss), nullptr, static_cast<A*>(outputs.row_weights), nullptr,
                             outputs.ok};
    dispatch_mask<A>(x.mask_type, [&](auto m) {
      using M = decltype(m);
      const Rows<T> l = rows_of<T>(x.loss_mat);
      const Rows<M> mk = rows_of<M>(x.mask);
      A* part = static_cast<A*>(workspace);
      if (takes_packs<T, M>(x)) {
        agg_forward_kernel<T, M, kTokenPack<T, kItems>>
            <<<blocks, kThreads, 0, stream>>>(l, mk, x.B, x.T, chunks, part, counter, agg, out);
      } else {
        agg_forward_kernel<T, M, 1><<<blocks, kThreads, 0, stream>>>(l, mk, x.B, x.T, chunks, part, counter, agg, out);
      }
    });
  });
  return cudaGetLastError();
}

cudaError_t agg_loss_backward(DType dtype, const AggLossTensors& x, const void* grad_loss, const void* row_weights,
                              void* grad, cudaStream_t stream) {
  if (x.B == 0 || x.T == 0) return cudaSuccess;
  const int64_t chunks = num_chunks<kChunk>(x.T);
  const unsigned int blocks = static_cast<unsigned int>(x.B * chunks);
  RLK_CUDA_DISPATCH_FLOATING(dtype, T, {
    using A = typename Acc<T>::type;
    dispatch_mask<A>(x.mask_type, [&](auto m) {
      using M = decltype(m);
      const A* gl = static_cast<const A*>(grad_loss);
      const A* w = static_cast<const A*>(row_weights);
      const Rows<M> mk = rows_of<M>(x.mask);
      T* out = static_cast<T*>(grad);
      if (takes_packs<T, M>(x)) {
        agg_backward_kernel<T, M, kTokenPack<T, kItems>><<<blocks, kThreads, 0, stream>>>(gl, w, mk, x.T, chunks, out);
      } else {
        agg_backward_kernel<T, M, 1><<<blocks, kThreads, 0, stream>>>(gl, w, mk, x.T, chunks, out);
      }
    });
  });
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace rlk
