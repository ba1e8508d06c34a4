// The vectorized CPU passes over one row (or one tile of a row) of logits, used by linear_logprobs and
// logprobs_from_logits. Plain functions over raw pointers with branch-free bodies, compiled once per ISA
// (RLK_CPU_MULTIVERSION); reductions keep kLanes independent partial results so that gcc vectorizes them
// without reassociating floating-point sums (no -ffast-math).
#pragma once

#include <stdint.h>

#include <type_traits>

#include "rlkernels/logprobs.h"

namespace rlk {
namespace cpu {
// Unnamed: every .cpp that includes this header gets its own copies of the per-ISA clones (target_clones
// resolvers must not be merged across translation units).
namespace {

// Independent partial results per reduction: one AVX-512 register of fp32 (two of AVX2).
constexpr int kLanes = 16;

template <typename A>
inline A reduce_max(const A* v) {
  A m = v[0];
  for (int k = 1; k < kLanes; ++k) m = v[k] > m ? v[k] : m;
  return m;
}

template <typename A>
inline A reduce_sum(const A* v) {
  A s = A(0);
  for (int k = 0; k < kLanes; ++k) s += v[k];
  return s;
}

// z[j] = transform(x[j] (+ bias[j])) in place; returns max_j z[j].
template <typename A, bool kSoftcap, bool kBias>
RLK_CPU_MULTIVERSION A transform_max_inplace(A* __restrict__ z, const A* __restrict__ bias, int64_t n,
                                             LogitTransform<A> t) {
  A mx[kLanes];
  for (int k = 0; k < kLanes; ++k) mx[k] = A(-INFINITY);
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    for (int k = 0; k < kLanes; ++k) {
      const A v = transform_logit<A, kSoftcap>(kBias ? z[j + k] + bias[j + k] : z[j + k], t.cap, t.inv_cap,
                                               t.inv_temp);
      z[j + k] = v;
      mx[k] = v > mx[k] ? v : mx[k];
    }
  }
  for (int k = 0; j < n; ++j, ++k) {
    const A v = transform_logit<A, kSoftcap>(kBias ? z[j] + bias[j] : z[j], t.cap, t.inv_cap, t.inv_temp);
    z[j] = v;
    mx[k] = v > mx[k] ? v : mx[k];
  }
  return reduce_max(mx);
}

// z[j] = transform(x[j]) from logits of any dtype into an fp32/fp64 scratch; returns max_j z[j].
template <typename A, typename In, bool kSoftcap>
RLK_CPU_MULTIVERSION A load_transform_max(const In* __restrict__ x, A* __restrict__ z, int64_t n,
                                          LogitTransform<A> t) {
  A mx[kLanes];
  for (int k = 0; k < kLanes; ++k) mx[k] = A(-INFINITY);
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    for (int k = 0; k < kLanes; ++k) {
      const A v = transform_logit<A, kSoftcap>(A(x[j + k]), t.cap, t.inv_cap, t.inv_temp);
      z[j + k] = v;
      mx[k] = v > mx[k] ? v : mx[k];
    }
  }
  for (int k = 0; j < n; ++j, ++k) {
    const A v = transform_logit<A, kSoftcap>(A(x[j]), t.cap, t.inv_cap, t.inv_temp);
    z[j] = v;
    mx[k] = v > mx[k] ? v : mx[k];
  }
  return reduce_max(mx);
}

// (m, Σ e^{z−m}, Σ e^{z−m}(z−m)) of transformed logits z[0, n) whose max is m (the last sum only if
// kEntropy; else 0).
template <typename A, bool kEntropy>
RLK_CPU_MULTIVERSION SoftmaxStats<A> exp_stats(const A* __restrict__ z, int64_t n, A m) {
  A s[kLanes], a[kLanes];
  for (int k = 0; k < kLanes; ++k) s[k] = a[k] = A(0);
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    for (int k = 0; k < kLanes; ++k) {
      const A d = z[j + k] - m;
      const A e = exp_(d);
      s[k] += e;
      if (kEntropy) a[k] += e * d;
    }
  }
  for (int k = 0; j < n; ++j, ++k) {
    const A d = z[j] - m;
    const A e = exp_(d);
    s[k] += e;
    if (kEntropy) a[k] += e * d;
  }
  return {m, reduce_sum(s), kEntropy ? reduce_sum(a) : A(0)};
}

// Backward of one row tile in place: x (raw logits, + bias) -> d loss / d x for the non-target logits
// (the caller adds the target's g_logp term). entropy / g_ent only read when kEntropy.
template <typename A, bool kSoftcap, bool kBias, bool kEntropy>
RLK_CPU_MULTIVERSION void logit_grad_inplace(A* __restrict__ x, const A* __restrict__ bias, int64_t n,
                                             LogitTransform<A> t, A lse, A entropy, A g_logp, A g_ent) {
  for (int64_t j = 0; j < n; ++j) {
    const A z = transform_logit<A, kSoftcap>(kBias ? x[j] + bias[j] : x[j], t.cap, t.inv_cap, t.inv_temp);
    const A dz = softmax_logit_grad<A>(z, lse, kEntropy ? entropy : A(0), g_logp, kEntropy ? g_ent : A(0));
    x[j] = dz * transform_grad<A, kSoftcap>(z, t.temp_over_cap, t.inv_temp);
  }
}

// Backward of one row of logits of any dtype: grad[j] = d loss / d logits[j] for the non-target logits
// (the caller rewrites the target's element).
template <typename A, typename In, bool kSoftcap, bool kEntropy>
RLK_CPU_MULTIVERSION void logit_grad_row(const In* __restrict__ x, In* __restrict__ grad, int64_t n,
                                         LogitTransform<A> t, A lse, A entropy, A g_logp, A g_ent) {
  for (int64_t j = 0; j < n; ++j) {
    const A z = transform_logit<A, kSoftcap>(A(x[j]), t.cap, t.inv_cap, t.inv_temp);
    const A dz = softmax_logit_grad<A>(z, lse, kEntropy ? entropy : A(0), g_logp, kEntropy ? g_ent : A(0));
    grad[j] = In(dz * transform_grad<A, kSoftcap>(z, t.temp_over_cap, t.inv_temp));
  }
}

// The full gradient of one target logit x (raw, bias included): non-target term plus g_logp.
template <typename A, bool kSoftcap>
inline A target_logit_grad(A x, LogitTransform<A> t, A lse, A entropy, A g_logp, A g_ent) {
  const A z = transform_logit<A, kSoftcap>(x, t.cap, t.inv_cap, t.inv_temp);
  return (softmax_logit_grad<A>(z, lse, entropy, g_logp, g_ent) + g_logp) *
         transform_grad<A, kSoftcap>(z, t.temp_over_cap, t.inv_temp);
}

// Calls f(std::bool_constant<b>{}) so that loops are compiled once per flag value.
template <typename F>
void dispatch_bool(bool b, F&& f) {
  if (b) {
    f(std::true_type{});
  } else {
    f(std::false_type{});
  }
}

}  // namespace
}  // namespace cpu
}  // namespace rlk
