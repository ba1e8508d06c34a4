// policy_loss CUDA kernels over the shared per-token math of rlkernels/policy_loss.h (docs/gpu_token_ops.md).
//
// Forward: ONE launch (two with a per-row ratio: level="sequence", geo_mean, vespo). Blocks of kThreads threads own
// (row, chunk of kChunk tokens); each thread loads all its tokens' inputs first (PackQueue: in 16-byte packs where
// every input's rows start on a pack boundary, token_packs.cuh; a token a load elsewhere), then accumulates their
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
#include "token_packs.cuh"

namespace rlk {
namespace cuda {
namespace {

// Threads per block: 8 warps, a good occupancy default on A100/H100.
constexpr int kThreads = 256;
// Tokens per thread per block (a thread's tokens are kThreads apart, so loads stay coalesced): 2048 tokens a
// block, the Triton forward's tile (FORWARD_BLOCK: the fastest of the 2026-11-27 H200 sweep), and each input's
// 8 tokens in flight at once (PackQueue).
constexpr int kItems = 8;
// kNoUnroll: the token loops are not unrolled. Their bodies branch on a dozen loop-invariant options
// (objective, KL kind, level, per-token or per-row advantages, optional inputs); unrolled, the compiler
// unswitches every combination and one arch took ~250 s of cicc + ptxas (2 s without). The loads are not in
// those loops: PackQueue issues a thread's loads of an input before its first token is computed on. The loop over a
// pack's V tokens is unrolled (V <= 4: the forward's 128 registers hold them without a spill).
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

// Tokens a load where every input's rows start on a pack boundary (token_packs.cuh): 16 bytes of fp32 (4
// tokens), 8 bytes of a 16-bit type (4 tokens: with 8, the token loop's 8 unrolled tokens spill 64-124 bytes
// under 128 registers); a thread's kItems tokens in kItems / V packs kThreads · V columns apart. 1 on other rows,
// and for fp64, which gradchecks take: its packed kernels added a fifth of this file's compile time (CI's) for
// no GPU speed anyone needs.
constexpr int kMaxVec = 4;
template <typename T>
constexpr int kVec = sizeof(T) == 8 ? 1 : kTokenPack<T, kMaxVec>;

// Tokens a thread loads at once, per accumulation type: all its kItems in fp32; 4 at a time in fp64
// (gradchecks), whose values take two registers each, so that 8 of every input stay within 128 registers.
template <typename A>
constexpr int queue_depth() {
  return sizeof(A) > 4 ? kItems / 2 : kItems;
}

// The mask values a queue holds: an integer mask's narrowed to uint8_t on load (0, 1, or 2 for any other
// value, which mask_weight and bad_mask_value read as they read the value itself), so that an int64 attention
// mask's packs in flight take 2 registers where they took 16 (policy_forward_kernel<float, int64_t, 4> spilled
// 12 bytes on sm_80); other inputs as they are stored.
template <typename E>
struct Queued {
  using type = E;
  __device__ __forceinline__ static E of(E x) { return x; }
};
template <typename I>
struct NarrowedMask {
  using type = uint8_t;
  __device__ __forceinline__ static uint8_t of(I m) { return m == I(0) ? 0 : m == I(1) ? 1 : 2; }
};
template <>
struct Queued<int32_t> : NarrowedMask<int32_t> {};
template <>
struct Queued<int64_t> : NarrowedMask<int64_t> {};
template <typename E>
using QueuedT = typename Queued<E>::type;

// A thread's Q tokens of one [B, T] input in a block, in NP = Q / V packs of V, all loaded before the first is
// used, so their loads are in flight together (a loop that loads as it computes, kNoUnroll, has one in flight).
// The token loop takes them from the front a pack at a time: pop() shifts the rest forward, register moves,
// where an array indexed by the loop's counter would live in local memory. Held as QueuedT<E>.
template <typename E, int V, int NP>
struct PackQueue {
  Pack<QueuedT<E>, V> v[NP];
  // v[k] = the pack of V tokens from column t0 + k · kThreads · V for k · V < n (V <= n <= NP · V); the rest
  // load v[0]'s again and are never popped.
  __device__ __forceinline__ void load(const E* __restrict__ row, int64_t t0, int n) {
#pragma unroll
    for (int k = 0; k < NP; ++k) {
      const Pack<E, V> x = load_pack<V>(row + t0 + (k * V < n ? int64_t(k) * kThreads * V : 0));
#pragma unroll
      for (int j = 0; j < V; ++j) v[k].v[j] = Queued<E>::of(x.v[j]);
    }
  }
  __device__ __forceinline__ Pack<QueuedT<E>, V> pop() {
    const Pack<QueuedT<E>, V> front = v[0];
#pragma unroll
    for (int k = 0; k + 1 < NP; ++k) v[k] = v[k + 1];
    return front;
  }
};

// How many of a thread's kItems tokens of block chunk c lie in the row (rows of whole packs: T_ a multiple of
// V): its packs start at columns pack_column(c, k) for k = 0, V, 2V, ...
template <int V>
__device__ __forceinline__ int tokens_in_row(int64_t c, int64_t T_) {
  const int64_t left = T_ - (c * kChunk + int64_t(threadIdx.x) * V);
  constexpr int64_t kStride = int64_t(kThreads) * V;  // columns from one of a thread's packs to its next
  return left <= 0 ? 0 : left >= (kItems / V) * kStride ? kItems : int((left + kStride - 1) / kStride) * V;
}

// Column of the thread's token k (0 <= k < kItems) of a block's chunk c.
template <int V>
__device__ __forceinline__ int64_t token_column(int64_t c, int k) {
  return pack_column<kThreads, kItems, V>(c, k);
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

// One pack of V tokens of every input a token reads (per-row advantages and weights: the row's values).
template <typename T, typename M, int V>
struct TokenPacks {
  using A = typename Acc<T>::type;
  Pack<T, V> lp, old, adv, isw, ref, ent;
  Pack<QueuedT<M>, V> mask;
  A row_adv, row_isw;

  // Token j's inputs (0 <= j < V).
  __device__ __forceinline__ TokenInputs<A, QueuedT<M>> token(const Inputs<T, M>& x, int j) const {
    TokenInputs<A, QueuedT<M>> t;
    t.lp = to_acc(lp.v[j]);
    t.old = to_acc(old.v[j]);
    t.mask = mask.v[j];
    t.adv = x.adv_per_token ? to_acc(adv.v[j]) : row_adv;
    t.isw = x.isw.p && x.isw_per_token ? to_acc(isw.v[j]) : row_isw;
    t.ref = x.ref.p ? to_acc(ref.v[j]) : A(0);
    t.ent = x.ent.p ? to_acc(ent.v[j]) : A(0);
    return t;
  }
};

// The queues of every input a token reads (per-row advantages and weights: read once, not queued; absent
// inputs, null in x: never loaded nor popped).
template <typename T, typename M, int V>
struct TokenQueues {
  static constexpr int Q = queue_depth<typename Acc<T>::type>();
  static constexpr int NP = Q / V;
  PackQueue<T, V, NP> lp, old, adv, isw, ref, ent;
  PackQueue<M, V, NP> mask;
  typename Acc<T>::type row_adv, row_isw;

  // The inputs of row b's tokens from column t0 on, n of them (V <= n <= Q).
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

  __device__ __forceinline__ TokenPacks<T, M, V> pop(const Inputs<T, M>& x) {
    TokenPacks<T, M, V> p;
    p.lp = lp.pop();
    p.old = old.pop();
    p.mask = mask.pop();
    p.row_adv = row_adv;
    p.row_isw = row_isw;
    if (x.adv_per_token) p.adv = adv.pop();
    if (x.isw.p && x.isw_per_token) p.isw = isw.pop();
    if (x.ref.p) p.ref = ref.pop();
    if (x.ent.p) p.ent = ent.pop();
    return p;
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
// (sequence_token_log_ratio: GSPO's lr, geo_mean's clipped lr, vespo's clamped lr + folded IS weight). V:
// tokens a load (kVec<T> on rows that take packs, else 1).
template <typename T, typename M, int V>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    seq_partial_kernel(Inputs<T, M> x, Opts<typename Acc<T>::type> o, int64_t chunks,
                       typename Acc<T>::type* __restrict__ part) {  // [B, chunks, 2]
  using A = typename Acc<T>::type;
  __shared__ A smem[2 * kWarps];
  const int64_t b = blockIdx.x / chunks, c = blockIdx.x % chunks;
  A v[2] = {A(0), A(0)};
  const int n = tokens_in_row<V>(c, x.T_);
  if (n > 0) {
    Inputs<T, M> read = x;  // what the terms read: no ref or entropy; IS weights where vespo folds them
    read.ref.p = read.ent.p = nullptr;
    const bool folds = x.isw.p && o.objective == PGObjective::Vespo;
    if (!folds) read.isw.p = nullptr;
    TokenQueues<T, M, V> q;
    for_each_queue<q.Q>(n, [&](int first, int count) {
      q.load(read, b, token_column<V>(c, first), count);
#pragma unroll 1  // see kNoUnroll above
      for (int k = 0; k < count; k += V) {
        const TokenPacks<T, M, V> p = q.pop(read);
#pragma unroll
        for (int j = 0; j < V; ++j) {
          const TokenInputs<A, QueuedT<M>> tok = p.token(read, j);
          const A m = mask_weight<A>(tok.mask);
          const A log_isw = folds ? log_(tok.isw) : A(0);
          const A term = sequence_token_log_ratio(o.objective, tok.lp, tok.old, tok.adv, log_isw, o.pg);
          v[0] += m;
          v[1] += m != A(0) ? m * term : A(0);
        }
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

template <typename T, typename M, int V>
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
  const int n = in_batch ? tokens_in_row<V>(c, x.T_) : 0;
  if (n > 0) {
    TokenQueues<T, M, V> q;
    for_each_queue<q.Q>(n, [&](int first, int count) {
      q.load(x, b, token_column<V>(c, first), count);
#pragma unroll 1  // see kNoUnroll above
      for (int k = 0; k < count; k += V) {
        const TokenPacks<T, M, V> p = q.pop(x);
        Pack<A, V> wd;
#pragma unroll
        for (int j = 0; j < V; ++j) {
          A m;
          token_terms(p.token(x, j), o, seq_lr, seq_pass, v, wd.v[j], m);
        }
        if (saved) store_pack<V>(saved + b * x.T_ + token_column<V>(c, first + k), wd);
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

template <typename T, typename M, int V>
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
  constexpr int Q = queue_depth<A>(), NP = Q / V;
  const int n = tokens_in_row<V>(c, x.T_);
  for_each_queue<Q>(n, [&](int first, int count) {
    const int64_t t0 = token_column<V>(c, first);
    // The gradients of the pack of tokens from the queue's token k on, from their m·dL/dlogp and mask values.
    auto store = [&](int k, const Pack<A, V>& wd, const Pack<A, V>& m) {
      const int64_t i = b * x.T_ + token_column<V>(c, first + k);  // in the contiguous [B, T] outputs
      Pack<T, V> out;
      if (grad_logp) {
#pragma unroll
        for (int j = 0; j < V; ++j) out.v[j] = from_acc<T>(g * wd.v[j]);
        store_pack<V>(grad_logp + i, out);
      }
      if (grad_ent) {
#pragma unroll
        for (int j = 0; j < V; ++j) out.v[j] = from_acc<T>(-g * o.ent_coef * m.v[j]);
        store_pack<V>(grad_ent + i, out);
      }
    };
    // The mask values of a pack in the accumulation type.
    auto weights = [](const Pack<QueuedT<M>, V>& mask) {
      Pack<A, V> m;
#pragma unroll
      for (int j = 0; j < V; ++j) m.v[j] = mask_weight<A>(mask.v[j]);
      return m;
    };
    PackQueue<M, V, NP> mask;
    if (!grad_logp) {  // d entropy needs the mask only
      mask.load(x.mask.row(b), t0, count);
      Pack<A, V> zero;
#pragma unroll
      for (int j = 0; j < V; ++j) zero.v[j] = A(0);
#pragma unroll 1  // see kNoUnroll above
      for (int k = 0; k < count; k += V) store(k, zero, weights(mask.pop()));
    } else if (saved) {
      PackQueue<A, V, NP> wd;
      wd.load(saved + b * x.T_, t0, count);
      mask.load(x.mask.row(b), t0, count);
#pragma unroll 1  // see kNoUnroll above
      for (int k = 0; k < count; k += V) store(k, wd.pop(), weights(mask.pop()));
    } else {
      TokenQueues<T, M, V> q;
      q.load(x, b, t0, count);
#pragma unroll 1  // see kNoUnroll above
      for (int k = 0; k < count; k += V) {
        const TokenPacks<T, M, V> p = q.pop(x);
        Pack<A, V> wd, m;
#pragma unroll
        for (int j = 0; j < V; ++j) {
          A unused[kParts] = {};
          token_terms(p.token(x, j), o, seq_lr, seq_pass, unused, wd.v[j], m.v[j]);
        }
        store(k, wd, m);
      }
    }
  });
}

// The saved m · dL/dlogp [B, T] (of the accumulation type A, which is logp's) scaled in place into d logp,
// and d entropy [B, T] (or null). V: tokens a load (kVec<A> where the mask's rows take packs, else 1).
template <typename A, typename M, int V>
__global__ void __launch_bounds__(kThreads)
    into_saved_kernel(A* __restrict__ saved,                        // [B, T] contiguous
                      const M* __restrict__ mask, int64_t ld_mask,  // [B, T] row stride ld_mask
                      int64_t T_, int64_t chunks,
                      const A* __restrict__ grad_loss, const A* __restrict__ row_weights, A entropy_coef,
                      A* __restrict__ grad_ent) {
  const int64_t b = blockIdx.x / chunks, c = blockIdx.x % chunks;
  const A g = grad_loss[0] * row_weights[b];
#pragma unroll
  for (int k = 0; k < kItems; k += V) {
    const int64_t t = token_column<V>(c, k);
    if (t < T_) {  // packs are whole
      const int64_t i = b * T_ + t;
      Pack<A, V> s = load_pack<V>(saved + i);
#pragma unroll
      for (int j = 0; j < V; ++j) s.v[j] = g * s.v[j];
      store_pack<V>(saved + i, s);
      if (grad_ent) {
        const Pack<M, V> ms = load_pack<V>(mask + b * ld_mask + t);
        Pack<A, V> e;
#pragma unroll
        for (int j = 0; j < V; ++j) e.v[j] = -g * entropy_coef * mask_weight<A>(ms.v[j]);
        store_pack<V>(grad_ent + i, e);
      }
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

// Whether t's rows take packs of kVec<T> tokens (token_packs.cuh): every [B, T] input's.
template <typename T, typename M>
bool takes_packs(const PolicyLossTensors& t) {
  if constexpr (kVec<T> == 1) return false;  // fp64: the kernels of V = 1 either way
  const int e = int(sizeof(T));
  const RowsArg none{nullptr, 0};
  return pack_rows<kVec<T>>(t.T, {{t.logp, e}, {t.old_logp, e}, {t.adv_per_token ? t.advantages : none, e},
                                  {t.ref_logp, e}, {t.entropy, e}, {t.isw_per_token ? t.is_weights : none, e},
                                  {t.mask, int(sizeof(M))}});
}

template <typename T, typename M>
void launch_forward(const PolicyLossTensors& t, const PolicyLossConfig& c, const AggParams& agg,
                    const PolicyLossOutputs& outputs, void* workspace, unsigned int* counter, cudaStream_t stream) {
  using A = typename Acc<T>::type;
  const Inputs<T, M> x = inputs_of<T, M>(t);
  const int64_t chunks = num_chunks<kChunk>(t.T);
  const unsigned int blocks = static_cast<unsigned int>(forward_blocks<kChunk>(t.B, t.T));
  A* part = static_cast<A*>(workspace);  // [blocks, kParts]
  A* seq_part = part + blocks * kParts;  // [B, chunks, 2]
  A* saved = static_cast<A*>(outputs.saved);
  const Opts<A> o = opts_of<A>(c, t.ref_logp.data != nullptr);
  const bool packed = takes_packs<T, M>(t);
  if (c.seq_level && t.B > 0) {
    if (packed) {
      seq_partial_kernel<T, M, kVec<T>><<<blocks, kThreads, 0, stream>>>(x, o, chunks, seq_part);
    } else {
      seq_partial_kernel<T, M, 1><<<blocks, kThreads, 0, stream>>>(x, o, chunks, seq_part);
    }
  }
  const LossOutputs<A> out{static_cast<A*>(outputs.loss), static_cast<A*>(outputs.stats),
                           static_cast<A*>(outputs.row_weights), static_cast<A*>(outputs.row_stats), outputs.ok};
  if (packed) {
    policy_forward_kernel<T, M, kVec<T>>
        <<<blocks, kThreads, 0, stream>>>(x, o, chunks, seq_part, part, saved, counter, agg, out);
  } else {
    policy_forward_kernel<T, M, 1><<<blocks, kThreads, 0, stream>>>(x, o, chunks, seq_part, part, saved, counter, agg,
                                                                    out);
  }
}

template <typename T, typename M>
void launch_backward(const PolicyLossTensors& t, const PolicyLossConfig& c, const void* grad_loss,
                     const void* row_weights, const void* row_stats, const void* saved, void* grad_logp,
                     void* grad_ent, cudaStream_t stream) {
  using A = typename Acc<T>::type;
  const unsigned int blocks = static_cast<unsigned int>(t.B * num_chunks<kChunk>(t.T));
  const Inputs<T, M> x = inputs_of<T, M>(t);
  const Opts<A> o = opts_of<A>(c, t.ref_logp.data != nullptr);
  const A* gl = static_cast<const A*>(grad_loss);
  const A* w = static_cast<const A*>(row_weights);
  const A* rs = static_cast<const A*>(row_stats);
  const A* sv = static_cast<const A*>(saved);
  T* gp = static_cast<T*>(grad_logp);
  T* ge = static_cast<T*>(grad_ent);
  const int64_t chunks = num_chunks<kChunk>(t.T);
  if (takes_packs<T, M>(t)) {
    policy_backward_kernel<T, M, kVec<T>><<<blocks, kThreads, 0, stream>>>(x, o, chunks, gl, w, rs, sv, gp, ge);
  } else {
    policy_backward_kernel<T, M, 1><<<blocks, kThreads, 0, stream>>>(x, o, chunks, gl, w, rs, sv, gp, ge);
  }
}

}  // namespace

int64_t policy_loss_workspace(int64_t B, int64_t T) {
  return forward_blocks<kChunk>(B, T) * kParts + B * num_chunks<kChunk>(T) * 2;
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
  const int64_t chunks = num_chunks<kChunk>(T);
  const unsigned int blocks = static_cast<unsigned int>(B * chunks);
  auto launch = [&](auto a) {
    using A = decltype(a);
    dispatch_mask<A>(mask_type, [&](auto m) {
      using M = decltype(m);
      A* sv = static_cast<A*>(saved);
      const M* mk = static_cast<const M*>(mask.data);
      const A* gl = static_cast<const A*>(grad_loss);
      const A* w = static_cast<const A*>(row_weights);
      A* ge = static_cast<A*>(grad_entropy);
      const A coef(entropy_coef);
      if (kVec<A> > 1 && pack_rows<kVec<A>>(T, {{mask, int(sizeof(M))}})) {
        into_saved_kernel<A, M, kVec<A>><<<blocks, kThreads, 0, stream>>>(sv, mk, mask.ld, T, chunks, gl, w, coef, ge);
      } else {
        into_saved_kernel<A, M, 1><<<blocks, kThreads, 0, stream>>>(sv, mk, mask.ld, T, chunks, gl, w, coef, ge);
      }
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
