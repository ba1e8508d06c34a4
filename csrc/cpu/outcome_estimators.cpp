// grpo_passk and opo on CPU (rlkernels/reference/advantage_estimators.py grpo_passk_scores, opo_scores):
// one pass through the id hash map numbers each response's group densely (rlkernels/first_index_map.h), the
// group's statistics accumulate in a dense array (one cache line per group, in cache), the scores'
// finiteness is counted on the way, and a last pass writes each response's advantage (outcome_estimators.h).
// O(B), no sort.
#include <ATen/Dispatch.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/sum.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "rlkernels/first_index_map.h"
#include "token_masks.h"  // ok_flag
#include "rlkernels/outcome_estimators.h"
#include "rlkernels/outcome_estimators_host.h"

namespace rlk {
namespace {

// Group statistics in double whatever the scores' dtype: they are sums over members, and the GPU kernels
// (which add by atomics in no fixed order) keep them in double so that their rounding cannot depend on the
// order; the CPU kernel keeps the same statistics, to give the same answer.
struct PasskStats {
  double n = 0;
  double mean = 0;  // Σ (s − pivot) until the second pass turns it into the mean
  double m2 = 0;
  double best = -std::numeric_limits<double>::infinity();
  double ties = 0;
  double second = -std::numeric_limits<double>::infinity();
};

// Each response's dense group number (in order of first appearance), and each group's first member (its
// pivot): the statistics live in a dense array of G entries, which stays in cache where one of B entries
// indexed by representatives would not.
struct Groups {
  std::vector<int64_t> of;     // [B] the response's group
  std::vector<int64_t> first;  // [G] the group's first member
};

template <typename I>
Groups dense(const I* ids, int64_t b) {
  Groups g{std::vector<int64_t>(b), {}};
  const int64_t count = dense_groups(ids, b, g.of.data());
  g.first.resize(count);
  int64_t next = 0;
  for (int64_t i = 0; i < b && next < count; ++i) {
    if (g.of[i] == next) g.first[next++] = i;  // numbered in order of first appearance
  }
  return g;
}

// Returns how many scores are not finite.
template <typename T, typename I>
int64_t passk_rows(const T* s, const I* ids, T* out, int64_t b, T eps, bool norm_by_std) {
  const Groups grp = dense(ids, b);
  std::vector<PasskStats> st(grp.first.size());
  int64_t bad = 0;
  for (int64_t i = 0; i < b; ++i) {
    PasskStats& g = st[grp.of[i]];
    g.n += 1;
    // around the group's first score: a constant group has m2 exactly 0
    g.mean += double(s[i]) - double(s[grp.first[grp.of[i]]]);
    g.best = std::max(g.best, double(s[i]));
    bad += !std::isfinite(double(s[i]));
  }
  for (size_t k = 0; k < st.size(); ++k) st[k].mean = double(s[grp.first[k]]) + st[k].mean / st[k].n;
  for (int64_t i = 0; i < b; ++i) {
    PasskStats& g = st[grp.of[i]];
    const double d = double(s[i]) - g.mean;
    g.m2 += d * d;
    if (double(s[i]) == g.best) {
      g.ties += 1;
    } else {
      g.second = std::max(g.second, double(s[i]));
    }
  }
  for (int64_t i = 0; i < b; ++i) {
    const PasskStats& g = st[grp.of[i]];
    out[i] = T(passk_advantage<double>(s[i], g.n, g.best, g.ties, g.second, g.m2, eps, norm_by_std));
  }
  return bad;
}

struct OpoStats {  // in double, as PasskStats
  double n = 0;
  double weight = 0;  // Σ L
  double shift = 0;   // Σ L (s − pivot)
};

// Returns how many scores are not finite.
template <typename T, typename I>
int64_t opo_rows(const T* s, const T* lengths, const I* ids, T* out, int64_t b) {
  const Groups grp = dense(ids, b);
  std::vector<OpoStats> st(grp.first.size());
  int64_t bad = 0;
  for (int64_t i = 0; i < b; ++i) {
    OpoStats& g = st[grp.of[i]];
    g.n += 1;
    g.weight += double(lengths[i]);
    g.shift += double(lengths[i]) * (double(s[i]) - double(s[grp.first[grp.of[i]]]));
    bad += !std::isfinite(double(s[i]));
  }
  for (int64_t i = 0; i < b; ++i) {
    const int64_t k = grp.of[i];
    const OpoStats& g = st[k];
    out[i] = T(opo_advantage<double>(s[i], g.n, s[grp.first[k]], g.shift, g.weight));
  }
  return bad;
}

std::tuple<at::Tensor, at::Tensor> grpo_passk_cpu(const at::Tensor& scores, const at::Tensor& group_ids, double eps,
                                                  bool norm_by_std) {
  constexpr const char* op = "rlkernels::grpo_passk";
  check_outcome_inputs(op, scores, group_ids);
  TORCH_CHECK(eps >= 0, op, ": eps must be >= 0, got ", eps);
  const at::Tensor s = scores.contiguous();
  const at::Tensor ids = group_ids.contiguous();
  at::Tensor out = at::empty(s.sizes(), s.options());
  int64_t bad = 0;
  AT_DISPATCH_FLOATING_TYPES(s.scalar_type(), "grpo_passk_cpu", [&] {
    AT_DISPATCH_INDEX_TYPES(ids.scalar_type(), "grpo_passk_cpu_ids", [&] {
      bad = passk_rows(s.const_data_ptr<scalar_t>(), ids.const_data_ptr<index_t>(),
                       out.mutable_data_ptr<scalar_t>(), s.numel(), scalar_t(eps), norm_by_std);
    });
  });
  return {out, ok_flag(bad, s)};
}

std::tuple<at::Tensor, at::Tensor> opo_cpu(const at::Tensor& scores, const at::Tensor& mask,
                                           const at::Tensor& group_ids) {
  constexpr const char* op = "rlkernels::opo";
  check_outcome_inputs(op, scores, group_ids);
  check_kernel_mask(op, scores, "scores", mask);
  const at::Tensor s = scores.contiguous();
  // Each response's length (a mask value other than 0 / 1 in an integer mask fails the token broadcast's check).
  const at::Tensor len = at::sum(mask, {-1}, /*keepdim=*/false, s.scalar_type());
  const at::Tensor ids = group_ids.contiguous();
  at::Tensor out = at::empty(s.sizes(), s.options());
  int64_t bad = 0;
  AT_DISPATCH_FLOATING_TYPES(s.scalar_type(), "opo_cpu", [&] {
    AT_DISPATCH_INDEX_TYPES(ids.scalar_type(), "opo_cpu_ids", [&] {
      bad = opo_rows(s.const_data_ptr<scalar_t>(), len.const_data_ptr<scalar_t>(), ids.const_data_ptr<index_t>(),
                     out.mutable_data_ptr<scalar_t>(), s.numel());
    });
  });
  return {out, ok_flag(bad, s)};
}

}  // namespace

TORCH_LIBRARY_IMPL(rlkernels, CPU, m) {
  m.impl("grpo_passk", &grpo_passk_cpu);
  m.impl("opo", &opo_cpu);
}

}  // namespace rlk
