// policy_loss CUDA kernels over the shared per-token math of rlkernels/policy_loss.h.
//
// Forward: blocks of kThreads threads own (row, chunk of kChunk tokens); each thread accumulates its tokens'
// kParts partial sums in registers, the block reduces them with warp shuffles (block_reduce.cuh) and writes one
// partial per block; a second tiny kernel sums each row's partials in chunk order. The reduction is
// deterministic (fixed trees and orders, no atomics) and costs one extra launch over B x kParts values, which
// is cheap next to the pass over B x T tokens. level="sequence" first reduces each row's masked
// log-ratio the same way. Backward: one elementwise pass over the same (row, chunk) grid.
#include "block_reduce.cuh"
#include "common.cuh"
#include "policy_loss.h"
#include "rlkernels/policy_loss.h"

namespace rlk {
namespace cuda {
namespace {

// Threads per block: 8 warps, a good occupancy default on A100/H100.
constexpr int kThreads = 256;
// Tokens per thread per block (a thread's tokens are kThreads apart, so loads stay coalesced).
constexpr int kItems = 4;
// kNoUnroll: the token loops are not unrolled. Their bodies branch on a dozen loop-invariant options
// (objective, KL kind, level, per-token or per-row advantages, optional inputs); unrolled, the compiler
// unswitches every combination and one arch took ~250 s of cicc + ptxas (2 s without). Occupancy (8 warps
// per block, many blocks per SM) hides the load latency instead.
constexpr int kChunk = kThreads * kItems;
constexpr int kWarps = kThreads / 32;
constexpr int kParts = 1 + kRowStats;  // Σ m·L, then the RowStat columns

template <typename T, typename M>
struct Inputs {
  const T* logp;
  const T* old;
  const T* adv;
  const M* mask;
  const T* ref;
  const T* ent;
  const T* isw;
  bool adv_per_token, isw_per_token;
  int64_t B, T_;
};

template <typename A>
struct Opts {
  PGParams<A> pg;
  A kl_coef, kl_clamp, ent_coef;
  PGObjective objective;
  int kl_kind;  // < 0: no KL term
  bool seq_level;
};

template <typename A>
__device__ __forceinline__ A mask_value(bool m) {
  return m ? A(1) : A(0);
}
template <typename A>
__device__ __forceinline__ A mask_value(A m) {
  return m;
}

// The clamped row log-ratio and whether its clamp passes the gradient (1) or not (0).
template <typename A>
__device__ __forceinline__ void sequence_ratio(const Opts<A>& o, const A* seq_mean, int64_t b, A& lr, A& pass) {
  lr = A(0);
  pass = A(1);
  if (o.seq_level) sequence_log_ratio(o.objective, seq_mean[b], lr, pass);
}

// Adds token i of row b to the partial sums v; returns m·dL/dlogp in wd and the mask value in m. Masked
// tokens contribute exact zeros whatever their inputs hold.
template <typename T, typename M, typename A>
__device__ __forceinline__ void token_terms(const Inputs<T, M>& x, const Opts<A>& o, int64_t b, int64_t i, A seq_lr,
                                            A seq_pass, A (&v)[kParts], A& wd, A& m) {
  const A bound = log_ratio_bound<A>();
  const A lp = to_acc(x.logp[i]);
  const A old = to_acc(x.old[i]);
  const A raw = lp - old;
  const A lr = clamp_value(raw, -bound, bound);
  const A passes = o.seq_level ? seq_pass : A(raw >= -bound && raw <= bound);
  const A r = exp_(o.seq_level ? seq_lr : lr);
  const A adv = to_acc(x.adv_per_token ? x.adv[i] : x.adv[b]);
  const PGToken<A> t = pg_token<A>(o.objective, lp, old, r, passes, adv, o.pg);
  // vespo folds its IS weights into the row's weight (seq_partial_kernel) instead of multiplying the term.
  const bool weighted = x.isw && o.objective != PGObjective::Vespo;
  const A w = weighted ? to_acc(x.isw_per_token ? x.isw[i] : x.isw[b]) : A(1);
  A kl = A(0), dkl = A(0);
  if (o.kl_kind >= 0) {
    const A ref = to_acc(x.ref[i]);
    kl = kl_value<A>(KLKind(o.kl_kind), lp, ref, o.kl_clamp);
    dkl = kl_grad<A>(KLKind(o.kl_kind), lp, ref, o.kl_clamp);
  }
  const A ent = x.ent ? to_acc(x.ent[i]) : A(0);
  m = mask_value<A>(x.mask[i]);
  const bool on = m != A(0);
  const A loss = w * t.loss + o.kl_coef * kl - o.ent_coef * ent;
  wd = on ? m * (w * t.dlogp + o.kl_coef * dkl) : A(0);
  v[0] += on ? m * loss : A(0);
  v[1 + kCount] += m;
  v[1 + kClipfrac] += on ? m * t.clipped : A(0);
  v[1 + kClipfracLow] += on ? m * t.low : A(0);
  v[1 + kClipfracHigh] += on ? m * t.high : A(0);
  v[1 + kClipfracDual] += on ? m * t.dual : A(0);
  v[1 + kApproxKl] += on ? -m * lr : A(0);
  v[1 + kKl] += on ? m * kl : A(0);
  v[1 + kEntropy] += on ? m * ent : A(0);
}

// Per (row, chunk): Σ m and Σ m·(the token's term of the row's log-ratio statistic) -> part[block, 0..1]
// (sequence_token_log_ratio: GSPO's lr, geo_mean's clipped lr, vespo's clamped lr + folded IS weight).
template <typename T, typename M>
__global__ void __launch_bounds__(kThreads)
    seq_partial_kernel(Inputs<T, M> x, Opts<typename Acc<T>::type> o, int64_t chunks,
                       typename Acc<T>::type* __restrict__ part) {
  using A = typename Acc<T>::type;
  __shared__ A smem[2 * kWarps];
  const int64_t b = blockIdx.x / chunks, c = blockIdx.x % chunks;
  A v[2] = {A(0), A(0)};
#pragma unroll 1  // see kNoUnroll above
  for (int it = 0; it < kItems; ++it) {
    const int64_t t = c * kChunk + it * kThreads + threadIdx.x;
    if (t < x.T_) {
      const int64_t i = b * x.T_ + t;
      const A m = mask_value<A>(x.mask[i]);
      const A adv = to_acc(x.adv_per_token ? x.adv[i] : x.adv[b]);
      const bool folds = x.isw && o.objective == PGObjective::Vespo;
      const A log_isw = folds ? log_(to_acc(x.isw_per_token ? x.isw[i] : x.isw[b])) : A(0);
      const A term = sequence_token_log_ratio(o.objective, to_acc(x.logp[i]), to_acc(x.old[i]), adv, log_isw, o.pg);
      v[0] += m;
      v[1] += m != A(0) ? m * term : A(0);
    }
  }
  block_sum<kThreads>(v, smem);
  if (threadIdx.x == 0) {
    part[2 * blockIdx.x] = v[0];
    part[2 * blockIdx.x + 1] = v[1];
  }
}

// seq_mean[b] = Σ_c part[b, c, 1] / Σ_c part[b, c, 0] (0 for an empty row), or the sum alone when !is_mean
// (vespo), chunks summed in order.
template <typename A>
__global__ void seq_mean_kernel(const A* __restrict__ part, int64_t B, int64_t chunks, bool is_mean,
                                A* __restrict__ seq_mean) {
  const int64_t b = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= B) return;
  A count = A(0), sum = A(0);
  for (int64_t c = 0; c < chunks; ++c) {
    count += part[2 * (b * chunks + c)];
    sum += part[2 * (b * chunks + c) + 1];
  }
  seq_mean[b] = !is_mean ? sum : count > A(0) ? sum / count : A(0);
}

template <typename T, typename M>
__global__ void __launch_bounds__(kThreads)
    policy_forward_kernel(Inputs<T, M> x, Opts<typename Acc<T>::type> o, int64_t chunks,
                          const typename Acc<T>::type* __restrict__ seq_mean,  // [B] (level="sequence")
                          typename Acc<T>::type* __restrict__ part,            // [B, chunks, kParts]
                          typename Acc<T>::type* __restrict__ saved) {         // [B, T] or null
  using A = typename Acc<T>::type;
  __shared__ A smem[kParts * kWarps];
  const int64_t b = blockIdx.x / chunks, c = blockIdx.x % chunks;
  A seq_lr, seq_pass;
  sequence_ratio(o, seq_mean, b, seq_lr, seq_pass);
  A v[kParts];
#pragma unroll
  for (int k = 0; k < kParts; ++k) v[k] = A(0);
#pragma unroll 1  // see kNoUnroll above
  for (int it = 0; it < kItems; ++it) {
    const int64_t t = c * kChunk + it * kThreads + threadIdx.x;
    if (t < x.T_) {
      const int64_t i = b * x.T_ + t;
      A wd, m;
      token_terms(x, o, b, i, seq_lr, seq_pass, v, wd, m);
      if (saved) saved[i] = wd;
    }
  }
  block_sum<kThreads>(v, smem);
  if (threadIdx.x == 0) {
#pragma unroll
    for (int k = 0; k < kParts; ++k) part[blockIdx.x * kParts + k] = v[k];
  }
}

// One thread per (row, column): the chunk partials summed in order.
template <typename A>
__global__ void combine_kernel(const A* __restrict__ part, int64_t B, int64_t chunks,
                               const A* __restrict__ seq_mean,  // [B] or null
                               A* __restrict__ row_loss, A* __restrict__ row_stats) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= B * kParts) return;
  const int64_t b = idx / kParts;
  const int k = int(idx % kParts);
  A s = A(0);
  for (int64_t c = 0; c < chunks; ++c) s += part[(b * chunks + c) * kParts + k];
  if (k == 0) {
    row_loss[b] = s;
  } else if (k - 1 == kSeqLogRatio) {
    row_stats[b * kRowStats + kSeqLogRatio] = seq_mean ? seq_mean[b] : A(0);
  } else {
    row_stats[b * kRowStats + k - 1] = s;
  }
}

template <typename T, typename M>
__global__ void __launch_bounds__(kThreads)
    policy_backward_kernel(Inputs<T, M> x, Opts<typename Acc<T>::type> o, int64_t chunks,
                           const typename Acc<T>::type* __restrict__ grad_rows,  // [B]
                           const typename Acc<T>::type* __restrict__ row_stats,  // [B, kRowStats]
                           const typename Acc<T>::type* __restrict__ saved,      // [B, T] or null
                           T* __restrict__ grad_logp,                            // [B, T] or null
                           T* __restrict__ grad_ent) {                           // [B, T] or null
  using A = typename Acc<T>::type;
  const int64_t b = blockIdx.x / chunks, c = blockIdx.x % chunks;
  const A g = grad_rows[b];
  A seq_lr = A(0), seq_pass = A(1);
  if (o.seq_level) sequence_log_ratio(o.objective, row_stats[b * kRowStats + kSeqLogRatio], seq_lr, seq_pass);
#pragma unroll 1  // see kNoUnroll above
  for (int it = 0; it < kItems; ++it) {
    const int64_t t = c * kChunk + it * kThreads + threadIdx.x;
    if (t < x.T_) {
      const int64_t i = b * x.T_ + t;
      A wd = A(0), m;
      if (!grad_logp) {  // d entropy needs the mask only
        m = mask_value<A>(x.mask[i]);
      } else if (saved) {
        wd = saved[i];
        m = mask_value<A>(x.mask[i]);
      } else {
        A unused[kParts] = {};
        token_terms(x, o, b, i, seq_lr, seq_pass, unused, wd, m);
      }
      if (grad_logp) grad_logp[i] = from_acc<T>(g * wd);
      if (grad_ent) grad_ent[i] = from_acc<T>(-g * o.ent_coef * m);
    }
  }
}

template <typename T, typename M>
Inputs<T, M> inputs_of(const PolicyLossTensors& x) {
  return Inputs<T, M>{static_cast<const T*>(x.logp),     static_cast<const T*>(x.old_logp),
                      static_cast<const T*>(x.advantages), static_cast<const M*>(x.mask),
                      static_cast<const T*>(x.ref_logp), static_cast<const T*>(x.entropy),
                      static_cast<const T*>(x.is_weights), x.adv_per_token,
                      x.isw_per_token,                    x.B,
                      x.T};
}

template <typename A>
Opts<A> opts_of(const PolicyLossConfig& c, bool has_kl) {
  return Opts<A>{pg_params<A>(c),
                 A(c.kl_coef),
                 value_or_inf<A>(c.kl_clamp),
                 A(c.entropy_coef),
                 c.objective,
                 has_kl ? int(c.kl_kind) : -1,
                 c.seq_level};
}

int64_t num_chunks(int64_t T) { return (T + kChunk - 1) / kChunk; }

unsigned int blocks_for(int64_t n, int threads) { return static_cast<unsigned int>((n + threads - 1) / threads); }

template <typename T, typename M>
void launch_forward(const PolicyLossTensors& t, const PolicyLossConfig& c, void* row_loss, void* row_stats,
                    void* saved, void* workspace, cudaStream_t stream) {
  using A = typename Acc<T>::type;
  const Inputs<T, M> x = inputs_of<T, M>(t);
  const int64_t chunks = num_chunks(t.T);
  const unsigned int grid = static_cast<unsigned int>(t.B * chunks);
  A* part = static_cast<A*>(workspace);              // [B, chunks, kParts]
  A* seq_part = part + t.B * chunks * kParts;        // [B, chunks, 2]
  A* seq_mean = seq_part + t.B * chunks * 2;         // [B]
  const Opts<A> o = opts_of<A>(c, t.ref_logp != nullptr);
  if (c.seq_level) {
    seq_partial_kernel<T, M><<<grid, kThreads, 0, stream>>>(x, o, chunks, seq_part);
    seq_mean_kernel<A><<<blocks_for(t.B, kThreads), kThreads, 0, stream>>>(
        seq_part, t.B, chunks, sequence_statistic_is_mean(c.objective), seq_mean);
  }
  policy_forward_kernel<T, M><<<grid, kThreads, 0, stream>>>(x, o, chunks, seq_mean, part, static_cast<A*>(saved));
  combine_kernel<A><<<blocks_for(t.B * kParts, kThreads), kThreads, 0, stream>>>(
      part, t.B, chunks, c.seq_level ? seq_mean : nullptr, static_cast<A*>(row_loss), static_cast<A*>(row_stats));
}

template <typename T, typename M>
void launch_backward(const PolicyLossTensors& t, const PolicyLossConfig& c, const void* grad_rows,
                     const void* row_stats, const void* saved, void* grad_logp, void* grad_ent, cudaStream_t stream) {
  using A = typename Acc<T>::type;
  const int64_t chunks = num_chunks(t.T);
  policy_backward_kernel<T, M><<<static_cast<unsigned int>(t.B * chunks), kThreads, 0, stream>>>(
      inputs_of<T, M>(t), opts_of<A>(c, t.ref_logp != nullptr), chunks, static_cast<const A*>(grad_rows),
      static_cast<const A*>(row_stats), static_cast<const A*>(saved), static_cast<T*>(grad_logp),
      static_cast<T*>(grad_ent));
}

}  // namespace

int64_t policy_loss_workspace(int64_t B, int64_t T) { return B * num_chunks(T) * (kParts + 2) + B; }

cudaError_t policy_loss_forward(DType dtype, const PolicyLossTensors& x, const PolicyLossConfig& c, void* row_loss,
                                void* row_stats, void* saved, void* workspace, cudaStream_t stream) {
  if (x.B == 0 || x.T == 0) return cudaSuccess;  // the binding returns zeros
  RLK_CUDA_DISPATCH_FLOATING(dtype, T, {
    using A = typename Acc<T>::type;
    if (x.mask_is_bool) {
      launch_forward<T, bool>(x, c, row_loss, row_stats, saved, workspace, stream);
    } else {
      launch_forward<T, A>(x, c, row_loss, row_stats, saved, workspace, stream);
    }
  });
  return cudaGetLastError();
}

cudaError_t policy_loss_backward(DType dtype, const PolicyLossTensors& x, const PolicyLossConfig& c,
                                 const void* grad_rows, const void* row_stats, const void* saved, void* grad_logp,
                                 void* grad_entropy, cudaStream_t stream) {
  if (x.B == 0 || x.T == 0) return cudaSuccess;
  RLK_CUDA_DISPATCH_FLOATING(dtype, T, {
    using A = typename Acc<T>::type;
    if (x.mask_is_bool) {
      launch_backward<T, bool>(x, c, grad_rows, row_stats, saved, grad_logp, grad_entropy, stream);
    } else {
      launch_backward<T, A>(x, c, grad_rows, row_stats, saved, grad_logp, grad_entropy, stream);
    }
  });
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace rlk
