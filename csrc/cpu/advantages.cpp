// group_advantages on CPU. Contiguous groups: one task per run of groups, each group's statistics in
// two passes over its (cached) rewards. Arbitrary ids: one pass through an open-addressing hash map
// sends every id to its group's representative (the index of the group's first member), then
// statistics accumulate at the representative (sort-free, O(B)).
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <vector>

#include "rlkernels/advantages_host.h"

namespace rlk {
namespace {

// Rewards per parallel task: enough work to amortize the thread-pool hand-off.
constexpr int64_t kGrain = 32768;

template <typename T>
using acc_t = at::opmath_type<T>;

// id -> index of its first occurrence. Open addressing with linear probing at load <= 1/2.
class FirstIndexMap {
 public:
  explicit FirstIndexMap(int64_t n) {
    size_t cap = 16;
    while (cap < size_t(2 * n)) cap <<= 1;
    mask_ = cap - 1;
    keys_.resize(cap);
    firsts_.assign(cap, -1);
  }

  int64_t first_index(int64_t key, int64_t index) {
    size_t h = mix(uint64_t(key)) & mask_;
    while (true) {
      if (firsts_[h] < 0) {
        keys_[h] = key;
        firsts_[h] = index;
        return index;
      }
      if (keys_[h] == key) return firsts_[h];
      h = (h + 1) & mask_;
    }
  }

 private:
  // splitmix64's finalizer: consecutive ids spread over the whole table.
  static uint64_t mix(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
  }

  size_t mask_ = 0;
  std::vector<int64_t> keys_;
  std::vector<int64_t> firsts_;
};

// Mean (around the pivot, so a constant set has exactly its value as mean) and centered sum of squares.
template <typename T>
void span_stats(const T* __restrict__ r, int64_t n, acc_t<T>& mean, acc_t<T>& m2) {
  using A = acc_t<T>;
  const A pivot = A(r[0]);
  A s = 0;
  for (int64_t i = 0; i < n; ++i) s += A(r[i]) - pivot;
  mean = pivot + s / A(n);
  A q = 0;
  for (int64_t i = 0; i < n; ++i) {
    const A d = A(r[i]) - mean;
    q += d * d;
  }
  m2 = q;
}

template <typename T>
void contiguous_groups(const T* r, T* out, int64_t b, int64_t g, GroupMode mode, acc_t<T> eps, acc_t<T> bstd) {
  using A = acc_t<T>;
  const int64_t grain = std::max<int64_t>(1, kGrain / g);
  at::parallel_for(0, b / g, grain, [&](int64_t begin, int64_t end) {
    for (int64_t grp = begin; grp < end; ++grp) {
      const T* rg = r + grp * g;
      A mean, m2;
      span_stats(rg, g, mean, m2);
      for (int64_t i = 0; i < g; ++i) {
        out[grp * g + i] = T(group_advantage<A>(mode, A(rg[i]), A(g), mean, m2, eps, bstd));
      }
    }
  });
}

template <typename T, typename I>
void arbitrary_groups(const T* r, const I* ids, T* out, int64_t b, GroupMode mode, acc_t<T> eps, acc_t<T> bstd) {
  using A = acc_t<T>;
  std::vector<int64_t> rep(b);
  {
    FirstIndexMap map(b);
    for (int64_t i = 0; i < b; ++i) rep[i] = map.first_index(int64_t(ids[i]), i);
  }
  // Statistics live at each group's representative: count, then mean (via the sum around the pivot
  // r[rep]), then the centered sum of squares.
  std::vector<A> count(b, A(0)), mean(b, A(0)), m2(b, A(0));
  for (int64_t i = 0; i < b; ++i) {
    count[rep[i]] += A(1);
    mean[rep[i]] += A(r[i]) - A(r[rep[i]]);
  }
  for (int64_t i = 0; i < b; ++i) {
    if (rep[i] == i) mean[i] = A(r[i]) + mean[i] / count[i];
  }
  for (int64_t i = 0; i < b; ++i) {
    const A d = A(r[i]) - mean[rep[i]];
    m2[rep[i]] += d * d;
  }
  at::parallel_for(0, b, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t g = rep[i];
      out[i] = T(group_advantage<A>(mode, A(r[i]), count[g], mean[g], m2[g], eps, bstd));
    }
  });
}

at::Tensor group_advantages_cpu(const at::Tensor& rewards, const std::optional<at::Tensor>& group_ids,
                                int64_t group_size, c10::string_view mode, double eps) {
  check_group_inputs(rewards, group_ids, group_size, eps);
  const GroupMode md = checked_group_mode(mode);
  const at::Tensor r = rewards.contiguous();
  at::Tensor out = at::empty(r.sizes(), r.options());
  const int64_t b = r.numel();
  if (b == 0) return out;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, r.scalar_type(), "group_advantages_cpu", [&] {
    using A = acc_t<scalar_t>;
    const scalar_t* rp = r.const_data_ptr<scalar_t>();
    scalar_t* o = out.mutable_data_ptr<scalar_t>();
    A bstd = A(1);
    if (md == GroupMode::Batch) {
      A mean, m2;
      span_stats(rp, b, mean, m2);
      bstd = unbiased_std(A(b), m2, A(1));
    }
    if (!group_ids.has_value()) {
      contiguous_groups(rp, o, b, group_size, md, A(eps), bstd);
    } else {
      const at::Tensor ids = group_ids->contiguous();
      AT_DISPATCH_INDEX_TYPES(ids.scalar_type(), "group_advantages_cpu_ids", [&] {
        arbitrary_groups(rp, ids.const_data_ptr<index_t>(), o, b, md, A(eps), bstd);
      });
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(rlkernels, CPU, m) { m.impl("group_advantages", &group_advantages_cpu); }

}  // namespace rlk
