// The vectorized CPU passes over one row (or one tile of a row) of logits, used by linear_logprobs and
// logprobs_from_logits. Plain functions over raw pointers with branch-free bodies, compiled once per ISA
// (RLK_CPU_MULTIVERSION). gcc vectorizes the maps and the lane-array sums (kLanes independent partial sums,
// no reassociation, no -ffast-math) but not a lane-array max, so the max uses a GCC vector type.
#pragma once

#include <stdint.h>
#include <string.h>

#include <algorithm>
#include <type_traits>

#include "rlkernels/logprobs.h"

namespace rlk {
namespace cpu {
// Unnamed: every .cpp that includes this header gets its own copies of the per-ISA clones (target_clones
// resolvers must not be merged across translation units).
namespace {

// Independent partial results per reduction: one AVX-512 register of fp32 (two of AVX2).
constexpr int kLanes = 16;
// Logits per block of a row: an 8 KiB fp32 scratch, so that a block is still in L1 for its second pass.
constexpr int64_t kBlock = 2048;

template <typename A>
struct LaneVector;  // kLanes elements as one GCC vector: one zmm of fp32 in the AVX-512 clone
template <>
struct LaneVector<float> {
  typedef float type __attribute__((vector_size(kLanes * sizeof(float))));
};
template <>
struct LaneVector<double> {
  typedef double type __attribute__((vector_size(kLanes * sizeof(double))));
};

template <typename A>
inline A reduce_sum(const A* v) {
  A s = A(0);
  for (int k = 0; k < kLanes; ++k) s += v[k];
  return s;
}

// z[j] = transform(x[j] (+ bias[j])) for logits of any dtype into an fp32/fp64 scratch.
template <typename A, typename In, bool kSoftcap, bool kBias>
RLK_CPU_MULTIVERSION void transform_into(const In* __restrict__ x, const A* __restrict__ bias, A* __restrict__ z,
                                         int64_t n, LogitTransform<A> t) {
  const A cap = t.cap, inv_cap = t.inv_cap, inv_temp = t.inv_temp;  // locals: the stores cannot alias them
  for (int64_t j = 0; j < n; ++j) {
    const A v = kBias ? A(x[j]) + bias[j] : A(x[j]);
    z[j] = transform_logit<A, kSoftcap>(v, cap, inv_cap, inv_temp);
  }
}

// max_j z[j] (NaN-blind like any max; a NaN logit still reaches the sums).
template <typename A>
RLK_CPU_MULTIVERSION A max_of(const A* __restrict__ z, int64_t n) {
  using V = typename LaneVector<A>::type;
  V mx;
  for (int k = 0; k < kLanes; ++k) mx[k] = A(-INFINITY);
  const int64_t full = n - n % kLanes;
  for (int64_t j = 0; j < full; j += kLanes) {
    V v;
    memcpy(&v, z + j, sizeof(V));
    mx = v > mx ? v : mx;
  }
  A m = A(-INFINITY);
  for (int k = 0; k < kLanes; ++k) m = mx[k] > m ? mx[k] : m;
  for (int64_t j = full; j < n; ++j) m = z[j] > m ? z[j] : m;
  return m;
}

// Σ e^{z−ref}(z−ref) over z[0, n) with a −inf logit's term 0 (entropy_term): exp_stats' sum where its own
// formula met 0·(−inf), a block with masked logits.
template <typename A>
RLK_CPU_MULTIVERSION A masked_entropy_sum(const A* __restrict__ z, int64_t n, A ref) {
  A a[kLanes];
  for (int k = 0; k < kLanes; ++k) a[k] = A(0);
  const int64_t full = n - n % kLanes;
  for (int64_t j = 0; j < full; j += kLanes) {
    for (int k = 0; k < kLanes; ++k) {
      const A d = z[j + k] - ref;
      a[k] += entropy_term(exp_(d), d);
    }
  }
  A a_sum = reduce_sum(a);
  for (int64_t j = full; j < n; ++j) a_sum += entropy_term(exp_(z[j] - ref), z[j] - ref);
  return a_sum;
}

// (m, Σ e^{z−m}, Σ e^{z−m}(z−m), Σ e^{2(z−m)}) of transformed logits z[0, n) whose max is m (the third sum
// only if kEntropy, the fourth only if kSumSq; else 0). −inf logits add nothing (exp_reference; the entropy
// sum of a block that holds some is taken again by masked_entropy_sum, off the loop every block runs).
template <typename A, bool kEntropy, bool kSumSq>
RLK_CPU_MULTIVERSION SoftmaxStats<A> exp_stats(const A* __restrict__ z, int64_t n, A m) {
  const A ref = exp_reference(m);
  A s[kLanes], a[kLanes], q[kLanes];
  for (int k = 0; k < kLanes; ++k) s[k] = a[k] = q[k] = A(0);
  const int64_t full = n - n % kLanes;
  for (int64_t j = 0; j < full; j += kLanes) {
    for (int k = 0; k < kLanes; ++k) {
      const A d = z[j + k] - ref;
      const A e = exp_(d);
      s[k] += e;
      if (kEntropy) a[k] += e * d;
      if (kSumSq) q[k] += e * e;
    }
  }
  A s_sum = reduce_sum(s), a_sum = kEntropy ? reduce_sum(a) : A(0), q_sum = kSumSq ? reduce_sum(q) : A(0);
  for (int64_t j = full; j < n; ++j) {
    const A d = z[j] - ref;
    const A e = exp_(d);
    s_sum += e;
    if (kEntropy) a_sum += e * d;
    if (kSumSq) q_sum += e * e;
  }
  // NaN in a alone: a masked logit's 0·(−inf) (a NaN logit makes s NaN too, and stays).
  if (kEntropy && a_sum != a_sum && s_sum == s_sum) a_sum = masked_entropy_sum(z, n, ref);
  return {m, s_sum, a_sum, q_sum};
}

// Softmax statistics of one row x[0, n) (+ bias), read once, in blocks that stay in L1 between their
// passes (transform into the scratch, max, exp sums). *z_target receives the transformed logit of column
// `target` when 0 <= target < n.
template <typename A, typename In, bool kSoftcap, bool kBias, bool kEntropy, bool kSumSq>
SoftmaxStats<A> row_stats(const In* x, const A* bias, int64_t n, LogitTransform<A> t, int64_t target, A* z_target) {
  A scratch[kBlock];
  SoftmaxStats<A> st = empty_softmax_stats<A>();
  for (int64_t j = 0; j < n; j += kBlock) {
    const int64_t nb = std::min(kBlock, n - j);
    transform_into<A, In, kSoftcap, kBias>(x + j, kBias ? bias + j : nullptr, scratch, nb, t);
    st = merge_softmax_stats(st, exp_stats<A, kEntropy, kSumSq>(scratch, nb, max_of(scratch, nb)));
    if (target >= j && target < j + nb) *z_target = scratch[target - j];
  }
  return st;
}

// Backward of one row tile in place: x (raw logits of storage type S, + bias) -> d loss / d x for the
// non-target logits (the caller adds the target's g_logp term). entropy / g_ent only read when kEntropy.
template <typename A, typename S, bool kSoftcap, bool kBias, bool kEntropy>
RLK_CPU_MULTIVERSION void logit_grad_inplace(S* __restrict__ x, const A* __restrict__ bias, int64_t n,
                                             LogitTransform<A> t, RowLse<A> lse, A entropy, A g_logp, A g_ent) {
  const A cap = t.cap, inv_cap = t.inv_cap, inv_temp = t.inv_temp, temp_over_cap = t.temp_over_cap;
  for (int64_t j = 0; j < n; ++j) {
    const A v = kBias ? A(x[j]) + bias[j] : A(x[j]);
    const A z = as_stored(transform_logit<A, kSoftcap>(v, cap, inv_cap, inv_temp));
    const A dz = softmax_logit_grad<A, kEntropy>(z, lse, entropy, g_logp, g_ent);
    x[j] = S(dz * transform_grad<A, kSoftcap>(z, temp_over_cap, inv_temp));
  }
}

// Backward of one row of logits of any dtype: grad[j] = d loss / d logits[j] for the non-target logits
// (the caller rewrites the target's element).
template <typename A, typename In, bool kSoftcap, bool kEntropy>
RLK_CPU_MULTIVERSION void logit_grad_row(const In* __restrict__ x, In* __restrict__ grad, int64_t n,
                                         LogitTransform<A> t, RowLse<A> lse, A entropy, A g_logp, A g_ent) {
  const A cap = t.cap, inv_cap = t.inv_cap, inv_temp = t.inv_temp, temp_over_cap = t.temp_over_cap;
  for (int64_t j = 0; j < n; ++j) {
    const A z = as_stored(transform_logit<A, kSoftcap>(A(x[j]), cap, inv_cap, inv_temp));
    const A dz = softmax_logit_grad<A, kEntropy>(z, lse, entropy, g_logp, g_ent);
    grad[j] = In(dz * transform_grad<A, kSoftcap>(z, temp_over_cap, inv_temp));
  }
}

// The full gradient of one target logit x (raw, bias included): non-target term plus g_logp (entropy and
// g_ent 0 without the entropy).
template <typename A, bool kSoftcap>
inline A target_logit_grad(A x, LogitTransform<A> t, RowLse<A> lse, A entropy, A g_logp, A g_ent) {
  const A z = as_stored(transform_logit<A, kSoftcap>(x, t.cap, t.inv_cap, t.inv_temp));
  return (softmax_logit_grad<A, true>(z, lse, entropy, g_logp, g_ent) + g_logp) *
         transform_grad<A, kSoftcap>(z, t.temp_over_cap, t.inv_temp);
}

}  // namespace
}  // namespace cpu
}  // namespace rlk
