// value_loss CUDA kernels over the shared per-token math of rlkernels/value_loss.h, the same scheme as
// policy_loss.cu (docs/gpu_token_ops.md): ONE forward launch of (row, chunk) blocks whose deterministic block
// reductions are published as partials, the last block finishing the loss, clipfrac, the rows' weights and
// the inputs' validity flag (loss_finish.cuh, aggregation.h); one elementwise backward launch that reads
// grad_loss · row_weights[b] itself.
#include "block_reduce.cuh"
#include "common.cuh"
#include "loss_finish.cuh"
#include "rlkernels/aggregation.h"
#include "rlkernels/value_loss.h"
#include "token_packs.cuh"
#include "value_loss.h"

namespace rlk {
namespace cuda {
namespace {

// Threads per block: 8 warps, a good occupancy default on A100/H100.
constexpr int kThreads = 256;
// Tokens per thread per block: 4 independent loads in flight per thread to cover memory latency.
constexpr int kItems = 4;
constexpr int kChunk = kThreads * kItems;
constexpr int kWarps = kThreads / 32;
// The partials' columns are ValuePart's; the op returns no per-row sums, one stat (clipfrac).
using ValueLayout = PartLayout<kValueParts, kValueLoss, kValueCount, 0, 0, kValueClipped, 1, kValueBad>;

// V: tokens a load (token_packs.cuh), kTokenPack<T, kItems> on rows that take packs, else 1.
template <typename T, typename M, int V>
__global__ void __launch_bounds__(kThreads)
    value_forward_kernel(Rows<T> values, Rows<T> old, Rows<T> ret, Rows<M> mask,  // [B, T] each
                         int64_t B, int64_t T_, int64_t chunks, typename Acc<T>::type clip,
                         typename Acc<T>::type* __restrict__ part,  // [grid, kValueParts]
                         unsigned int* __restrict__ counter,        // [1], zero
                         AggParams agg, LossOutputs<typename Acc<T>::type> out) {
  using A = typename Acc<T>::type;
  __shared__ A smem[kValueParts * kWarps];
  const int64_t b = blockIdx.x / chunks, c = blockIdx.x % chunks;
  A v[kValueParts] = {A(0), A(0), A(0), A(0)};
#pragma unroll
  for (int k = 0; k < kItems; k += V) {
    const int64_t t = pack_column<kThreads, kItems, V>(c, k);
    if (b < B && t < T_) {  // an empty batch launches one block of no row, which finishes; packs are whole
      const Pack<T, V> vs = load_pack<V>(values.row(b) + t), os = load_pack<V>(old.row(b) + t),
                       rs = load_pack<V>(ret.row(b) + t);
      const Pack<M, V> ms = load_pack<V>(mask.row(b) + t);
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const A vi = to_acc(vs.v[j]), oi = to_acc(os.v[j]), ri = to_acc(rs.v[j]);
        const VLToken<A> tok = value_token<A>(vi, oi, ri, clip);
        const A m = mask_weight<A>(ms.v[j]);
        const bool on = m != A(0);
        v[kValueLoss] += on ? m * tok.loss : A(0);
        v[kValueCount] += m;
        v[kValueClipped] += on ? m * tok.clipped : A(0);
        const bool bad = bad_mask_value(ms.v[j]) | !finite_value(vi) | !finite_value(oi) | !finite_value(ri);
        v[kValueBad] += bad ? A(1) : A(0);
      }
    }
  }
  block_sum<kThreads>(v, smem);
  if (publish_partials(v, part, counter)) {
    finish_loss<kThreads, ValueLayout>(part, B, chunks, agg, out,
                                       "rlkernels value_loss: NaN or inf values, old_values or returns, mask weights "
                                       "negative or not finite, or an integer mask value other than 0 and 1");
  }
}

template <typename T, typename M, int V>
__global__ void __launch_bounds__(kThreads)
    value_backward_kernel(const typename Acc<T>::type* __restrict__ grad_loss,    // [1]
                          const typename Acc<T>::type* __restrict__ row_weights,  // [B]
                          Rows<T> values, Rows<T> old, Rows<T> ret, Rows<M> mask,  // [B, T] each
                          int64_t T_, int64_t chunks, typename Acc<T>::type clip,
                          T* __restrict__ grad) {  // [B, T] contiguous
  using A = typename Acc<T>::type;
  const int64_t b = blockIdx.x / chunks, c = blockIdx.x % chunks;
  const A g = grad_loss[0] * row_weights[b];  // d output / d row sum
#pragma unroll
  for (int k = 0; k < kItems; k += V) {
    const int64_t t = pack_column<kThreads, kItems, V>(c, k);
    if (t < T_) {
      const Pack<T, V> vs = load_pack<V>(values.row(b) + t), os = load_pack<V>(old.row(b) + t),
                       rs = load_pack<V>(ret.row(b) + t);
      const Pack<M, V> ms = load_pack<V>(mask.row(b) + t);
      Pack<T, V> out;
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const VLToken<A> tok = value_token<A>(to_acc(vs.v[j]), to_acc(os.v[j]), to_acc(rs.v[j]), clip);
        const A m = mask_weight<A>(ms.v[j]);
        out.v[j] = from_acc<T>(m != A(0) ? g * m * tok.dvalue : A(0));
      }
      store_pack<V>(grad + b * T_ + t, out);
    }
  }
}

// Whether x's rows take packs of kTokenPack<T, kItems> tokens (token_packs.cuh).
template <typename T, typename M>
bool takes_packs(const ValueLossTensors& x) {
  return pack_rows<kTokenPack<T, kItems>>(x.T, {{x.values, int(sizeof(T))}, {x.old_values, int(sizeof(T))},
                                                {x.returns, int(sizeof(T))}, {x.mask, int(sizeof(M))}});
}

}  // namespace

int64_t value_loss_workspace(int64_t B, int64_t T) { return forward_blocks<kChunk>(B, T) * kValueParts; }

cudaError_t value_loss_forward(DType dtype, const ValueLossTensors& x, double clip, const AggParams& agg,
                               const ValueLossOutputs& outputs, void* workspace, unsigned int* counter,
                               cudaStream_t stream) {
  const int64_t chunks = num_chunks<kChunk>(x.T);
  const unsigned int blocks = static_cast<unsigned int>(forward_blocks<kChunk>(x.B, x.T));
  RLK_CUDA_DISPATCH_FLOATING(dtype, T, {
    using A = typename Acc<T>::type;
    const LossOutputs<A> out{static_cast<A*>(outputs.loss), static_cast<A*>(outputs.clipfrac),
                             static_cast<A*>(outputs.row_weights), nullptr, outputs.ok};
    dispatch_mask<A>(x.mask_type, [&](auto m) {
      using M = decltype(m);
      const Rows<T> v = rows_of<T>(x.values), o = rows_of<T>(x.old_values), r = rows_of<T>(x.returns);
      const Rows<M> mk = rows_of<M>(x.mask);
      A* part = static_cast<A*>(workspace);
      if (takes_packs<T, M>(x)) {
        value_forward_kernel<T, M, kTokenPack<T, kItems>>
            <<<blocks, kThreads, 0, stream>>>(v, o, r, mk, x.B, x.T, chunks, A(clip), part, counter, agg, out);
      } else {
        value_forward_kernel<T, M, 1>
            <<<blocks, kThreads, 0, stream>>>(v, o, r, mk, x.B, x.T, chunks, A(clip), part, counter, agg, out);
      }
    });
  });
  return cudaGetLastError();
}

cudaError_t value_loss_backward(DType dtype, const ValueLossTensors& x, double clip, const void* grad_loss,
                                const void* row_weights, void* grad_values, cudaStream_t stream) {
  if (x.B == 0 || x.T == 0) return cudaSuccess;
  const int64_t chunks = num_chunks<kChunk>(x.T);
  const unsigned int blocks = static_cast<unsigned int>(x.B * chunks);
  RLK_CUDA_DISPATCH_FLOATING(dtype, T, {
    using A = typename Acc<T>::type;
    dispatch_mask<A>(x.mask_type, [&](auto m) {
      using M = decltype(m);
      const A* gl = static_cast<const A*>(grad_loss);
      const A* w = static_cast<const A*>(row_weights);
      const Rows<T> v = rows_of<T>(x.values), o = rows_of<T>(x.old_values), r = rows_of<T>(x.returns);
      const Rows<M> mk = rows_of<M>(x.mask);
      T* grad = static_cast<T*>(grad_values);
      if (takes_packs<T, M>(x)) {
        value_backward_kernel<T, M, kTokenPack<T, kItems>>
            <<<blocks, kThreads, 0, stream>>>(gl, w, v, o, r, mk, x.T, chunks, A(clip), grad);
      } else {
        value_backward_kernel<T, M, 1><<<blocks, kThreads, 0, stream>>>(gl, w, v, o, r, mk, x.T, chunks, A(clip), grad);
      }
    });
  });
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace rlk
