// policy_loss CUDA kernels over the shared per-token math of rlkernels/policy_loss.h (docs/gpu_token_ops.md).
//
// Forward: ONE launch (two with a per-row ratio: level="sequence", geo_mean, vespo). Blocks of kThreads threads own
// (row, chunk of kChunk tokens); each thread loads all its tokens' inputs first (TokenQueue), then accumulates their
// kParts partial sums in registers (and, with save_grad, writes m · dL/dlogp), checking the input values it reads; the
// block reduces them with warp shuffles (block_reduce.cuh) and publishes one partial per block, and the launch's last
// block reduces all of them in a fixed order into the loss, the stat means, the row weights c_b, the row sums and the
// `ok` flag (loss_finish.cuh, aggregation.h): deterministic, no float atomics, no ATen op after the launch. The per-row
// ratio's pass reduces each (row, chunk)'s masked log-ratio terms the same way; the forward blocks sum their row's
// chunks in order. Backward: one elementwise pass over the same grid, g_b = grad_loss · c_b read in the kernel; the
// eager backward's last read of the saved gradients scales them in place (policy_loss_backward_into_saved, one launch).
#include "block_reduce.cuh"
#include "common.cuh"
#include "loss_finish.cuh"
#include "policy_loss.h"
#include "rlkernels/aggregation.h"
#include "rlkernels/policy_loss.h"

namespace rlk {
namespace cuda {
namespace {

// Threads per block: 8 warps, a good occupancy default on A100/H100.
constexpr int kThreads = 256;
// Tokens per thread per block (a thread's tokens are kThreads apart, so loads stay coalesced): 2048 tokens a
// block, the Triton forward's tile (FORWARD_BLOCK: the fastest of the 2026-11-27 H200 sweep), and each input's
// 8 loads in flight at once (TokenQueue).
constexpr int kItems = 8;
// kNoUnroll: the token loops are not unrolled. Their bodies branch on a dozen loop-invariant options
// (objective, KL kind, level, per-token or per-row advantages, optional inputs); unrolled, the compiler
// unswitches every combination and one arch took ~250 s of cicc + ptxas (2 s without). The loads are not in
// those loops: TokenQueue issues a thread's kItems loads of an input before its first token is computed on.
constexpr int kChunk = kThreads * kItems;
// Blocks per SM the token kernels are compiled for: 2 caps them at 128 registers, the compile check's budget.
constexpr int kMinBlocks = 2;
constexpr int kWarps = kThreads / 32;
// Columns of the blocks' partials: Σ m·L, the RowStat columns (kSeqLogRatio: the row's statistic, from its
// chunk 0), the count of rejected input values.
constexpr int kLossPart = 0;
constexpr int kBadPart = 1 + kRowStats;
constexpr int kParts = 2 + kRowStats;
using PolicyLayout = PartLayout<kParts, kLossPart, 1 + kCount, 1, kRowStats, 1 + kFirstStat, kRowStats - kFirstStat,
                                kBadPart>;

// The inputs at their row strides (common.cuh Rows; ref / ent / isw: p null where the op has none).
template <typename T, typename M>
struct Inputs {
  Rows<T> logp, old, adv, ref, ent, isw;
  Rows<M> mask;
  bool adv_per_token, isw_per_token;
  int64_t B, T_;  // the outputs' ([B, T] contiguous) row stride is T_
};

// Tokens a thread loads at once, per accumulation type: all its kItems in fp32; 4 at a time in fp64
// (gradchecks), whose values take two registers each, so that 8 of every input stay within 128 registers.
template <typename A>
constexpr int queue_depth() {
  return sizeof(A) > 4 ? kItems / 2 : kItems;
}

// Q of a thread's values of one [B, T] input in a block, all loaded before the first is used, so their
// loads are in flight together (a loop that loads as it computes, kNoUnroll, has one in flight). The token
// loop takes them from the front: pop() shifts the rest forward, register moves, where an array indexed by
// the loop's counter would live in local memory.
template <typename E, int Q>
struct TokenQueue {
  E v[Q];
  // v[k] = p[i0 + k * kThreads] for k < n (1 <= n <= Q); the rest copy v[0] and are never popped.
  __device__ __forceinline__ void load(const E* __restrict__ p, int64_t i0, int n) {
#pragma unroll
    for (int k = 0; k < Q; ++k) v[k] = k < n ? p[i0 + int64_t(k) * kThreads] : p[i0];
  }
  __device__ __forceinline__ E pop() {
    const E front = v[0];
#pragma unroll
    for (int k = 0; k + 1 < Q; ++k) v[k] = v[k + 1];
    return front;
  }
};

// How many of a thread's kItems tokens of block chunk c lie in the row: tokens c * kChunk + k * kThreads + tid.
__device__ __forceinline__ int tokens_in_row(int64_t c, int64_t T_) {
  const int64_t left = T_ - (c * kChunk + threadIdx.x);
  return left <= 0 ? 0 : left >= int64_t(kItems) * kThreads ? kItems : int((left + kThreads - 1) / kThreads);
}

// Column of the thread's token k (0 <= k < kItems) of a block's chunk c.
__device__ __forceinline__ int64_t token_column(int64_t c, int k) {
  return c * kChunk + int64_t(k) * kThreads + threadIdx.x;
}

// f(first, count) over the thread's n tokens of its block, a queue's depth Q of tokens at a time (one call
// unless Q < n).
template <int Q, typename F>
__device__ __forceinline__ void for_each_queue(int n, F&& f) {
  if constexpr (Q >= kItems) {
    if (n > 0) f(0, n);
  } else {
#pragma unroll 1
    for (int first = 0; first < n; first += Q) f(first, n - first < Q ? n - first : Q);
  }
}

// One token's inputs, in the accumulation type (adv and isw: the token's or the row's; isw 1 without
// weights; ref and ent 0 where the op has none), and its mask value as it is stored.
template <typename A, typename M>
struct TokenInputs {
  A lp, old, adv, isw, ref, ent;
  M mask;
};

// The queues of every input a token reads (per-row advantages and weights: read once, not queued; absent
// inputs, null in x: never loaded).
template <typename T, typename M>
struct TokenQueues {
  static constexpr int Q = queue_depth<typename Acc<T>::type>();
  TokenQueue<T, Q> lp, old, adv, isw, ref, ent;
  TokenQueue<M, Q> mask;
  typename Acc<T>::type row_adv, row_isw;

  // The inputs of row b's tokens from column t0 on, n of them (1 <= n <= Q).
  __device__ __forceinline__ void load(const Inputs<T, M>& x, int64_t b, int64_t t0, int n) {
    lp.load(x.logp.row(b), t0, n);
    old.load(x.old.row(b), t0, n);
    mask.load(x.mask.row(b), t0, n);
    using A = typename Acc<T>::type;
    row_adv = x.adv_per_token ? A(0) : to_acc(*x.adv.row(b));
    row_isw = x.isw.p && !x.isw_per_token ? to_acc(*x.isw.row(b)) : A(1);
    if (x.adv_per_token) adv.load(x.adv.row(b), t0, n);
    if (x.isw.p && x.isw_per_token) isw.load(x.isw.row(b), t0, n);
    if (x.ref.p) ref.load(x.ref.row(b), t0, n);
    if (x.ent.p) ent.load(x.ent.row(b), t0, n);
  }

  __device__ __forceinline__ TokenInputs<typename Acc<T>::type, M> pop(const Inputs<T, M>& x) {
    using A = typename Acc<T>::type;
    TokenInputs<A, M> t;
    t.lp = to_acc(lp.pop());
    t.old = to_acc(old.pop());
    t.mask = mask.pop();
    t.adv = x.adv_per_token ? to_acc(adv.pop()) : row_adv;
    t.isw = x.isw.p && x.isw_per_token ? to_acc(isw.pop()) : row_isw;
    t.ref = x.ref.p ? to_acc(ref.pop()) : A(0);
    t.ent = x.ent.p ? to_acc(ent.pop()) : A(0);
    return t;
  }
};

template <typename A>
struct Opts {
  PGParams<A> pg;
  A kl_coef, kl_clamp, ent_coef;
  PGObjective objective;
  int kl_kind;  // < 0: no KL term
  bool seq_level;
};

// Adds a token to the partial sums v; returns m·dL/dlogp in wd and the mask value in m. Masked tokens
// contribute exact zeros whatever their inputs hold. The values the op rejects (aggregation.h) add 1 to
// v[kBadPart].
template <typename M, typename A>
__device__ __forceinline__ void token_terms(const TokenInputs<A, M>& x, const Opts<A>& o, A seq_lr, A seq_pass,
                                            A (&v)[kParts], A& wd, A& m) {
  const A bound = log_ratio_bound<A>();
  const A lp = x.lp;
  const A old = x.old;
  const A raw = lp - old;
  const A lr = clamp_value(raw, -bound, bound);
  const A passes = o.seq_level ? seq_pass : A(raw >= -bound && raw <= bound);
  const A r = exp_(o.seq_level ? seq_lr : lr);
  const A adv = x.adv;
  const PGToken<A> t = pg_token<A>(o.objective, lp, old, r, passes, adv, o.pg);
  // vespo folds its IS weights into the row's weight (seq_partial_kernel) instead of multiplying the term.
  const A isw = x.isw;
  const A w = o.objective != PGObjective::Vespo ? isw : A(1);
  const M mask = x.mask;
  m = mask_weight<A>(mask);
  const bool on = m != A(0);
  bool bad = bad_mask_value(mask) | (on & ((lp != lp) | (old != old))) | !finite_value(adv) | bad_weight(isw);
  A kl = A(0), dkl = A(0);
  if (o.kl_kind >= 0) {
    const A ref = x.ref;
    bad = bad | (on & (ref != ref));
    kl = kl_value<A>(KLKind(o.kl_kind), lp, ref, o.kl_clamp);
    dkl = kl_grad<A>(KLKind(o.kl_kind), lp, ref, o.kl_clamp);
  }
  const A ent = x.ent;
  const A loss = w * t.loss + o.kl_coef * kl - o.ent_coef * ent;
  wd = on ? m * (w * t.dlogp + o.kl_coef * dkl) : A(0);
  v[kLossPart] += on ? m * loss : A(0);
  v[1 + kCount] += m;
  v[1 + kClipfrac] += on ? m * t.clipped : A(0);
  v[1 + kClipfracLow] += on ? m * t.low : A(0);
  v[1 + kClipfracHigh] += on ? m * t.high : A(0);
  v[1 + kClipfracDual] += on ? m * t.dual : A(0);
  v[1 + kApproxKl] += on ? -m * lr : A(0);
  v[1 + kKl] += on ? m * kl : A(0);
  v[1 + kEntropy] += on ? m * ent : A(0);
  v[kBadPart] += bad ? A(1) : A(0);
}

// Per (row, chunk): Σ m and Σ m·(the token's term of the row's log-ratio statistic) -> part[block, 0..1]
// (sequence_token_log_ratio: GSPO's lr, geo_mean's clipped lr, vespo's clamped lr + folded IS weight).
template <typename T, typename M>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    seq_partial_kernel(Inputs<T, M> x, Opts<typename Acc<T>::type> o, int64_t chunks,
                       typename Acc<T>::type* __restrict__ part) {  // [B, chunks, 2]
  using A = typename Acc<T>::type;
  __shared__ A smem[2 * kWarps];
  const int64_t b = blockIdx.x / chunks, c = blockIdx.x % chunks;
  A v[2] = {A(0), A(0)};
  const int n = tokens_in_row(c, x.T_);
  if (n > 0) {
    Inputs<T, M> read = x;  // what the terms read: no ref or entropy; IS weights where vespo folds them
    read.ref.p = read.ent.p = nullptr;
    const bool folds = x.isw.p && o.objective == PGObjective::Vespo;
    if (!folds) read.isw.p = nullptr;
    TokenQueues<T, M> q;
    for_each_queue<q.Q>(n, [&](int first, int count) {
      q.load(read, b, token_column(c, first), count);
#pragma unroll 1  // see kNoUnroll above
      for (int it = 0; it < count; ++it) {
        const TokenInputs<A, M> tok = q.pop(read);
        const A m = mask_weight<A>(tok.mask);
        const A log_isw = folds ? log_(tok.isw) : A(0);
        const A term = sequence_token_log_ratio(o.objective, tok.lp, tok.old, tok.adv, log_isw, o.pg);
        v[0] += m;
        v[1] += m != A(0) ? m * term : A(0);
      }
    });
  }
  block_sum<kThreads>(v, smem);
  if (threadIdx.x == 0) {
    part[2 * blockIdx.x] = v[0];
    part[2 * blockIdx.x + 1] = v[1];
  }
}

// Row b's log-ratio statistic from seq_partial_kernel's partials [B, chunks, 2], chunks summed in order:
// the masked mean of the terms (0 for a row without tokens), or their sum (vespo).
template <typename A>
__device__ __forceinline__ A row_seq_statistic(const A* part, int64_t b, int64_t chunks, PGObjective objective) {
  A count = A(0), sum = A(0);
  for (int64_t c = 0; c < chunks; ++c) {
    count += part[2 * (b * chunks + c)];
    sum += part[2 * (b * chunks + c) + 1];
  }
  return !sequence_statistic_is_mean(objective) ? sum : count > A(0) ? sum / count : A(0);
}

template <typename T, typename M>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    policy_forward_kernel(Inputs<T, M> x, Opts<typename Acc<T>::type> o, int64_t chunks,
                          const typename Acc<T>::type* __restrict__ seq_part,  // [B, chunks, 2] (seq_level)
                          typename Acc<T>::type* __restrict__ part,            // [grid, kParts]
                          typename Acc<T>::type* __restrict__ saved,           // [B, T] or null
                          unsigned int* __restrict__ counter,                  // [1], zero
                          AggParams agg, LossOutputs<typename Acc<T>::type> out) {
  using A = typename Acc<T>::type;
  __shared__ A smem[kParts * kWarps];
  __shared__ A shared_stat;
  const int64_t b = blockIdx.x / chunks, c = blockIdx.x % chunks;
  const bool in_batch = b < x.B;  // an empty batch launches one block of no row, which finishes
  A seq_stat = A(0), seq_lr = A(0), seq_pass = A(1);
  if (o.seq_level && in_batch) {
    if (threadIdx.x == 0) shared_stat = row_seq_statistic(seq_part, b, chunks, o.objective);
    __syncthreads();
    seq_stat = shared_stat;
    sequence_log_ratio(o.objective, seq_stat, seq_lr, seq_pass);
  }
  A v[kParts];
#pragma unroll
  for (int k = 0; k < kParts; ++k) v[k] = A(0);
  const int n = in_batch ? tokens_in_row(c, x.T_) : 0;
  if (n > 0) {
    TokenQueues<T, M> q;
    for_each_queue<q.Q>(n, [&](int first, int count) {
      const int64_t t0 = token_column(c, first);
      q.load(x, b, t0, count);
#pragma unroll 1  // see kNoUnroll above
      for (int it = 0; it < count; ++it) {
        A wd, m;
        token_terms(q.pop(x), o, seq_lr, seq_pass, v, wd, m);
        if (saved) saved[b * x.T_ + t0 + int64_t(it) * kThreads] = wd;
      }
    });
  }
  block_sum<kThreads>(v, smem);
  v[1 + kSeqLogRatio] = c == 0 ? seq_stat : A(0);  // once per row: its chunks' sum is the statistic
  if (publish_partials(v, part, counter)) {
    finish_loss<kThreads, PolicyLayout>(part, x.B, chunks, agg, out,
                                        "rlkernels policy_loss: NaN or inf advantages, is_weights or mask weights "
                                        "negative or not finite, an integer mask value other than 0 and 1, or NaN "
                                        "logp / old_logp / ref_logp at a kept token");
  }
}

template <typename T, typename M>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    policy_backward_kernel(Inputs<T, M> x, Opts<typename Acc<T>::type> o, int64_t chunks,
                           const typename Acc<T>::type* __restrict__ grad_loss,    // [1]
                           const typename Acc<T>::type* __restrict__ row_weights,  // [B]
                           const typename Acc<T>::type* __restrict__ row_stats,    // [B, kRowStats]
                           const typename Acc<T>::type* __restrict__ saved,        // [B, T] or null
                           T* __restrict__ grad_logp,                              // [B, T] or null
                           T* __restrict__ grad_ent) {                             // [B, T] or null
  using A = typename Acc<T>::type;
  const int64_t b = blockIdx.x / chunks, c = blockIdx.x % chunks;
  const A g = grad_loss[0] * row_weights[b];  // d output / d row sum
  A seq_lr = A(0), seq_pass = A(1);
  if (o.seq_level) sequence_log_ratio(o.objective, row_stats[b * kRowStats + kSeqLogRatio], seq_lr, seq_pass);
  constexpr int Q = queue_depth<A>();
  const int n = tokens_in_row(c, x.T_);
  for_each_queue<Q>(n, [&](int first, int count) {
    const int64_t t0 = token_column(c, first), i0 = b * x.T_ + t0;  // i0: in the contiguous [B, T] buffers
    // Token it's gradients from its m·dL/dlogp and mask value.
    auto store = [&](int it, A wd, A m) {
      const int64_t i = i0 + int64_t(it) * kThreads;
      if (grad_logp) grad_logp[i] = from_acc<T>(g * wd);
      if (grad_ent) grad_ent[i] = from_acc<T>(-g * o.ent_coef * m);
    };
    TokenQueue<M, Q> mask;
    if (!grad_logp) {  // d entropy needs the mask only
      mask.load(x.mask.row(b), t0, count);
#pragma unroll 1  // see kNoUnroll above
      for (int it = 0; it < count; ++it) store(it, A(0), mask_weight<A>(mask.pop()));
    } else if (saved) {
      TokenQueue<A, Q> wd;
      wd.load(saved, i0, count);
      mask.load(x.mask.row(b), t0, count);
#pragma unroll 1  // see kNoUnroll above
      for (int it = 0; it < count; ++it) store(it, wd.pop(), mask_weight<A>(mask.pop()));
    } else {
      TokenQueues<T, M> q;
      q.load(x, b, t0, count);
#pragma unroll 1  // see kNoUnroll above
      for (int it = 0; it < count; ++it) {
        A unused[kParts] = {}, wd, m;
        token_terms(q.pop(x), o, seq_lr, seq_pass, unused, wd, m);
        store(it, wd, m);
      }
    }
  });
}

// The saved m · dL/dlogp [B, T] (of the accumulation type A, which is logp's) scaled in place into d logp,
// and d entropy [B, T] (or null).
template <typename A, typename M>
__global__ void __launch_bounds__(kThreads)
    into_saved_kernel(A* __restrict__ saved,  // [B, T] contiguous
                      const M* __restrict__ mask, int64_t ld_mask,  // [B, T] row stride ld_mask
                      int64_t T_, int64_t chunks,
                      const A* __restrict__ grad_loss, const A* __restrict__ row_weights, A entropy_coef,
                      A* __restrict__ grad_ent) {
  const int64_t b = blockIdx.x / chunks, c = blockIdx.x % chunks;
  const A g = grad_loss[0] * row_weights[b];
#pragma unroll
  for (int it = 0; it < kItems; ++it) {
    const int64_t t = c * kChunk + it * kThreads + threadIdx.x;
    if (t < T_) {
      const int64_t i = b * T_ + t;
      saved[i] = g * saved[i];
      if (grad_ent) grad_ent[i] = -g * entropy_coef * mask_weight<A>(mask[b * ld_mask + t]);
    }
  }
}

template <typename T, typename M>
Inputs<T, M> inputs_of(const PolicyLossTensors& x) {
  return Inputs<T, M>{rows_of<T>(x.logp),    rows_of<T>(x.old_logp), rows_of<T>(x.advantages),
                      rows_of<T>(x.ref_logp), rows_of<T>(x.entropy), rows_of<T>(x.is_weights),
                      rows_of<M>(x.mask),     x.adv_per_token,        x.isw_per_token,
                      x.B,                    x.T};
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

// Chunks per row; at least one, so that a batch without tokens still launches (and finishes).
int64_t num_chunks(int64_t T) { return T > kChunk ? (T + kChunk - 1) / kChunk : 1; }

// Blocks of the forward launch: one per (row, chunk), at least one (an empty batch).
int64_t forward_blocks(int64_t B, int64_t T) { return B > 0 ? B * num_chunks(T) : 1; }

template <typename T, typename M>
void launch_forward(const PolicyLossTensors& t, const PolicyLossConfig& c, const AggParams& agg,
                    const PolicyLossOutputs& outputs, void* workspace, unsigned int* counter, cudaStream_t stream) {
  using A = typename Acc<T>::type;
  const Inputs<T, M> x = inputs_of<T, M>(t);
  const int64_t chunks = num_chunks(t.T), blocks = forward_blocks(t.B, t.T);
  A* part = static_cast<A*>(workspace);  // [blocks, kParts]
  A* seq_part = part + blocks * kParts;  // [B, chunks, 2]
  const Opts<A> o = opts_of<A>(c, t.ref_logp.data != nullptr);
  if (c.seq_level && t.B > 0) {
    seq_partial_kernel<T, M><<<static_cast<unsigned int>(blocks), kThreads, 0, stream>>>(x, o, chunks, seq_part);
  }
  const LossOutputs<A> out{static_cast<A*>(outputs.loss), static_cast<A*>(outputs.stats),
                           static_cast<A*>(outputs.row_weights), static_cast<A*>(outputs.row_stats), outputs.ok};
  policy_forward_kernel<T, M><<<static_cast<unsigned int>(blocks), kThreads, 0, stream>>>(
      x, o, chunks, seq_part, part, static_cast<A*>(outputs.saved), counter, agg, out);
}

template <typename T, typename M>
void launch_backward(const PolicyLossTensors& t, const PolicyLossConfig& c, const void* grad_loss,
                     const void* row_weights, const void* row_stats, const void* saved, void* grad_logp,
                     void* grad_ent, cudaStream_t stream) {
  using A = typename Acc<T>::type;
  const int64_t chunks = num_chunks(t.T);
  policy_backward_kernel<T, M><<<static_cast<unsigned int>(t.B * chunks), kThreads, 0, stream>>>(
      inputs_of<T, M>(t), opts_of<A>(c, t.ref_logp.data != nullptr), chunks, static_cast<const A*>(grad_loss),
      static_cast<const A*>(row_weights), static_cast<const A*>(row_stats), static_cast<const A*>(saved),
      static_cast<T*>(grad_logp), static_cast<T*>(grad_ent));
}

}  // namespace

int64_t policy_loss_workspace(int64_t B, int64_t T) {
  return forward_blocks(B, T) * kParts + B * num_chunks(T) * 2;
}

cudaError_t policy_loss_forward(DType dtype, const PolicyLossTensors& x, const PolicyLossConfig& c,
                                const AggParams& agg, const PolicyLossOutputs& out, void* workspace,
                                unsigned int* counter, cudaStream_t stream) {
  RLK_CUDA_DISPATCH_FLOATING(dtype, T, {
    using A = typename Acc<T>::type;
    dispatch_mask<A>(x.mask_type, [&](auto m) {
      launch_forward<T, decltype(m)>(x, c, agg, out, workspace, counter, stream);
    });
  });
  return cudaGetLastError();
}

cudaError_t policy_loss_backward(DType dtype, const PolicyLossTensors& x, const PolicyLossConfig& c,
                                 const void* grad_loss, const void* row_weights, const void* row_stats,
                                 const void* saved, void* grad_logp, void* grad_entropy, cudaStream_t stream) {
  if (x.B == 0 || x.T == 0) return cudaSuccess;
  RLK_CUDA_DISPATCH_FLOATING(dtype, T, {
    using A = typename Acc<T>::type;
    dispatch_mask<A>(x.mask_type, [&](auto m) {
      launch_backward<T, decltype(m)>(x, c, grad_loss, row_weights, row_stats, saved, grad_logp, grad_entropy,
                                      stream);
    });
  });
  return cudaGetLastError();
}

cudaError_t policy_loss_backward_into_saved(DType dtype, MaskType mask_type, int64_t B, int64_t T, void* saved,
                                            RowsArg mask, const void* grad_loss, const void* row_weights,
                                            double entropy_coef, void* grad_entropy, cudaStream_t stream) {
  if (B == 0 || T == 0) return cudaSuccess;
  const int64_t chunks = num_chunks(T);
  const unsigned int blocks = static_cast<unsigned int>(B * chunks);
  auto launch = [&](auto a) {
    using A = decltype(a);
    dispatch_mask<A>(mask_type, [&](auto m) {
      using M = decltype(m);
      into_saved_kernel<A, M><<<blocks, kThreads, 0, stream>>>(
          static_cast<A*>(saved), static_cast<const M*>(mask.data), mask.ld, T, chunks,
          static_cast<const A*>(grad_loss),
          static_cast<const A*>(row_weights), A(entropy_coef), static_cast<A*>(grad_entropy));
    });
  };
  switch (dtype) {
    case DType::Float32:
      launch(float{});
      break;
    case DType::Float64:
      launch(double{});
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace rlk
