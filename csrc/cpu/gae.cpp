// gae and discounted_returns on CPU: verl's right-to-left recurrence per row, rows in parallel; padded
// rows are scanned four at a time so that four independent dependency chains keep the FPU busy.
// Whitening: per-row moments (two vectorized passes over the row while it is in cache), merged in row order,
// then one normalizing pass. The scans count the input values they reject (the op's validity flag).
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/scalar_tensor.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <type_traits>
#include <utility>
#include <vector>

#include "rlkernels/gae_host.h"
#include "token_masks.h"

namespace rlk {
namespace {

// Positions per parallel task: below it a second thread costs more than it saves once 1 parallel region in
// 100 waits out a busy neighbor's scheduler tick (benchmarks/parallel_grain.py, results/parallel_grain.md).
constexpr int64_t kPositionsPerTask = 131072;
// Padded rows scanned together: 4 independent recurrences hide the ~4-cycle FMA latency of each.
constexpr int kInterleave = 4;

template <typename T>
using acc_t = at::opmath_type<T>;

// Scans R rows of length n (row k starts at k * stride) right to left. out2 gets x2 (GAE advantages or
// returns); out_ret, for GAE, the returns x2 + V, and for returns with baselines `base` (one per row, else
// nullptr), x2 - b·m (ReMax). Returns how many of the values read the op rejects (non-finite rewards or
// values, bad mask values: mask_value_bad).
template <ScanKind K, int R, typename T, typename M>
int64_t scan_rows(const T* __restrict__ r, const T* __restrict__ v, const M* __restrict__ m, T* __restrict__ out2,
                  T* __restrict__ out_ret, const T* __restrict__ base, int64_t n, int64_t stride, acc_t<T> gamma,
                  acc_t<T> gl) {
  using A = acc_t<T>;
  A x1[R], x2[R], finite[R], b[R];
  int64_t bad = 0;
  for (int k = 0; k < R; ++k) {
    x1[k] = x2[k] = finite[k] = A(0);
    b[k] = base != nullptr ? A(base[k]) : A(0);
    finite[k] = b[k] - b[k];  // NaN for a non-finite baseline
  }
  for (int64_t t = n - 1; t >= 0; --t) {
#pragma GCC unroll 4
    for (int k = 0; k < R; ++k) {
      const int64_t i = k * stride + t;
      const A ri = A(r[i]);
      const A vi = K == ScanKind::GAE ? A(v[i]) : A(0);
      finite[k] += (ri - ri) + (vi - vi);  // stays 0 while every value is finite, NaN after
      bad += mask_value_bad<A>(m[i]);
      if constexpr (!std::is_integral_v<M>) {  // float weights blend; bool and 0 / 1 select
        scan_step<A>(K, ri, vi, A(m[i]), gamma, gl, x1[k], x2[k]);
      } else {
        scan_step<A>(K, ri, vi, bool(m[i] != 0), gamma, gl, x1[k], x2[k]);
      }
      out2[i] = T(x2[k]);
      if constexpr (K == ScanKind::GAE) {
        out_ret[i] = T(x2[k] + vi);
      } else if (base != nullptr) {
        out_ret[i] = T(x2[k] - b[k] * mask_weight<A>(m[i]));
      }
    }
  }
  for (int k = 0; k < R; ++k) bad += finite[k] != A(0);
  return bad;
}

// Partial sums per reduction: 8 independent accumulators (one AVX vector of fp32) instead of one
// serial chain of dependent adds.
constexpr int kLanes = 8;

// A mask byte as a float through int32 (uint8 -> int32 -> float conversions vectorize).
template <typename A, typename M>
inline A weight(M m) {
  if constexpr (std::is_same_v<M, uint8_t>) {
    return A(int32_t(m));
  } else {
    return A(m);
  }
}

// Weighted moments of x over one row (two passes; the row is in cache after its scan).
template <typename T, typename M>
RLK_CPU_MULTIVERSION Moments<acc_t<T>> row_moments(const T* __restrict__ x, const M* __restrict__ m, int64_t n) {
  using A = acc_t<T>;
  A w[kLanes] = {}, s[kLanes] = {}, q[kLanes] = {};
  const int64_t body = n / kLanes * kLanes;
  for (int64_t t = 0; t < body; t += kLanes) {
    for (int k = 0; k < kLanes; ++k) {
      const A mt = weight<A>(m[t + k]);
      w[k] += mt;
      s[k] += mt * A(x[t + k]);
    }
  }
  for (int64_t t = body; t < n; ++t) {
    w[0] += weight<A>(m[t]);
    s[0] += weight<A>(m[t]) * A(x[t]);
  }
  A wt = 0, st = 0;
  for (int k = 0; k < kLanes; ++k) {
    wt += w[k];
    st += s[k];
  }
  const A mean = wt > A(0) ? st / wt : A(0);
  for (int64_t t = 0; t < body; t += kLanes) {
    for (int k = 0; k < kLanes; ++k) {
      const A d = A(x[t + k]) - mean;
      q[k] += weight<A>(m[t + k]) * d * d;
    }
  }
  for (int64_t t = body; t < n; ++t) {
    const A d = A(x[t]) - mean;
    q[0] += weight<A>(m[t]) * d * d;
  }
  A m2 = 0;
  for (int k = 0; k < kLanes; ++k) m2 += q[k];
  return {wt, mean, m2};
}

// x = (x - mean) * rstd, written to out (x itself for GAE); times the mask weights m when given
// (REINFORCE++: masked_whiten(G) * m).
template <typename T, typename M>
RLK_CPU_MULTIVERSION void normalize_span(const T* __restrict__ x, T* out, const M* __restrict__ m, int64_t n,
                                         acc_t<T> mean, acc_t<T> rstd) {
  using A = acc_t<T>;
  if (m == nullptr) {
    for (int64_t i = 0; i < n; ++i) out[i] = T((A(x[i]) - mean) * rstd);
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = T((A(x[i]) - mean) * rstd * weight<A>(m[i]));
  }
}

// The whitening coefficients (mean, rstd) of every row together from the rows' moments: two passes in row
// order (the total weight and mean, then the centered sum of squares), as the GPU kernels' last block.
template <typename A>
std::pair<A, A> merged_coefficients(const std::vector<Moments<A>>& rows) {
  A w = 0, s = 0;
  for (const auto& r : rows) {
    w += r.w;
    s += r.w * r.mean;
  }
  const A mean = w > A(0) ? s / w : A(0);
  A m2 = 0;
  for (const auto& r : rows) m2 += r.m2 + r.w * (r.mean - mean) * (r.mean - mean);
  A out_mean, rstd;
  whiten_coefficients(w, mean, m2, out_mean, rstd);
  return {out_mean, rstd};
}

// The mask as whitening weights: a bool mask read as bytes (uint8 -> float conversions vectorize, bool
// ones do not).
inline const uint8_t* weights(const bool* m) { return reinterpret_cast<const uint8_t*>(m); }
template <typename T>
const T* weights(const T* m) {
  return m;
}

// Row bounds as int64 offsets (packed: validated cu_seqlens; padded: none).
std::vector<int64_t> row_offsets(const char* op, const std::optional<at::Tensor>& cu_seqlens, int64_t numel) {
  std::vector<int64_t> offsets;
  if (!cu_seqlens.has_value()) return offsets;
  const at::Tensor cu = cu_seqlens->to(at::kLong).contiguous();
  const int64_t* c = cu.const_data_ptr<int64_t>();
  offsets.assign(c, c + cu.numel());
  TORCH_CHECK(offsets.front() == 0, op, ": cu_seqlens must start at 0, got ", offsets.front());
  for (size_t i = 1; i < offsets.size(); ++i) {
    TORCH_CHECK(offsets[i] >= offsets[i - 1], op, ": cu_seqlens must be non-decreasing, got ", offsets[i - 1],
                " then ", offsets[i], " at index ", i);
  }
  TORCH_CHECK(offsets.back() == numel, op, ": cu_seqlens must end at the number of tokens ", numel, ", got ",
              offsets.back());
  return offsets;
}

// Scans every row; returns the count of rejected input values (scan_rows). moments: nullptr, or one record per
// row of the outputs x2's whitening moments.
template <ScanKind K, typename T, typename M>
int64_t scan_all(const ScanLayout& layout, const std::vector<int64_t>& offsets, const T* r, const T* v, const M* m,
                 T* out2, T* out_ret, const T* base, acc_t<T> gamma, acc_t<T> gl, Moments<acc_t<T>>* moments) {
  std::atomic<int64_t> bad{0};
  const auto at_row = [&](int64_t row) { return base != nullptr ? base + row : nullptr; };
  if (layout.packed) {
    const int64_t avg_len = layout.rows > 0 ? offsets.back() / layout.rows : 1;
    const int64_t grain = std::max<int64_t>(1, kPositionsPerTask / std::max<int64_t>(1, avg_len));
    at::parallel_for(0, layout.rows, grain, [&](int64_t begin, int64_t end) {
      int64_t task_bad = 0;
      for (int64_t row = begin; row < end; ++row) {
        const int64_t s = offsets[row], n = offsets[row + 1] - s;
        task_bad += scan_rows<K, 1>(r + s, v + s, m + s, out2 + s, out_ret + s, at_row(row), n, 0, gamma, gl);
        if (moments != nullptr) moments[row] = row_moments(out2 + s, weights(m) + s, n);
      }
      bad += task_bad;
    });
    return bad.load();
  }
  const int64_t T_ = layout.row_len;
  const int64_t blocks = (layout.rows + kInterleave - 1) / kInterleave;
  const int64_t grain = std::max<int64_t>(1, kPositionsPerTask / std::max<int64_t>(1, kInterleave * T_));
  at::parallel_for(0, blocks, grain, [&](int64_t begin, int64_t end) {
    int64_t task_bad = 0;
    for (int64_t blk = begin; blk < end; ++blk) {
      const int64_t row0 = blk * kInterleave, s = row0 * T_;
      if (row0 + kInterleave <= layout.rows) {
        task_bad +=
            scan_rows<K, kInterleave>(r + s, v + s, m + s, out2 + s, out_ret + s, at_row(row0), T_, T_, gamma, gl);
      } else {
        for (int64_t row = row0; row < layout.rows; ++row) {
          const int64_t o = row * T_;
          task_bad += scan_rows<K, 1>(r + o, v + o, m + o, out2 + o, out_ret + o, at_row(row), T_, 0, gamma, gl);
        }
      }
      if (moments != nullptr) {
        for (int64_t row = row0; row < std::min(row0 + kInterleave, layout.rows); ++row) {
          moments[row] = row_moments(out2 + row * T_, weights(m) + row * T_, T_);
        }
      }
    }
    bad += task_bad;
  });
  return bad.load();
}

// Whitens the n values x (every row's moments given) into out, in parallel; times the mask when m is given.
template <typename T, typename M>
void whiten_into(const T* x, T* out, const M* m, int64_t n, const std::vector<Moments<acc_t<T>>>& moments) {
  const auto [mean, rstd] = merged_coefficients(moments);
  at::parallel_for(0, n, kPositionsPerTask, [&](int64_t begin, int64_t end) {
    normalize_span<T>(x + begin, out + begin, m != nullptr ? weights(m) + begin : nullptr, end - begin, mean,
                      rstd);
  });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> gae_cpu(const at::Tensor& rewards, const at::Tensor& values,
                                                       const at::Tensor& mask,
                                                       const std::optional<at::Tensor>& cu_seqlens, double gamma,
                                                       double lam, bool whiten) {
  constexpr const char* op = "rlkernels::gae";
  const ScanLayout layout = check_scan_inputs(op, rewards, &values, mask, cu_seqlens);
  const std::vector<int64_t> offsets = row_offsets(op, cu_seqlens, rewards.numel());
  const at::Tensor r = rewards.contiguous(), v = values.contiguous(), m = mask.contiguous();
  at::Tensor adv = at::empty(r.sizes(), r.options()), ret = at::empty(r.sizes(), r.options());
  int64_t bad = 0;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, r.scalar_type(), "gae_cpu", [&] {
    using A = acc_t<scalar_t>;
    std::vector<Moments<A>> moments(whiten ? layout.rows : 0);
    scalar_t* a = adv.mutable_data_ptr<scalar_t>();
    with_mask<A>(m, [&](auto mp) {
      bad = scan_all<ScanKind::GAE>(layout, offsets, r.const_data_ptr<scalar_t>(), v.const_data_ptr<scalar_t>(), mp,
                                    a, ret.mutable_data_ptr<scalar_t>(), static_cast<const scalar_t*>(nullptr),
                                    A(gamma), A(gamma * lam), whiten ? moments.data() : nullptr);
      if (whiten) whiten_into<scalar_t>(a, a, static_cast<decltype(mp)>(nullptr), adv.numel(), moments);
    });
  });
  return {adv, ret, ok_flag(bad, r)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> discounted_returns_cpu(const at::Tensor& rewards,
                                                                      const at::Tensor& mask,
                                                                      const std::optional<at::Tensor>& cu_seqlens,
                                                                      double gamma,
                                                                      const std::optional<at::Tensor>& baseline,
                                                                      bool whiten) {
  constexpr const char* op = "rlkernels::discounted_returns";
  const ScanLayout layout = check_scan_inputs(op, rewards, nullptr, mask, cu_seqlens, baseline);
  TORCH_CHECK(!(whiten && baseline.has_value()), op, ": whiten and baseline are exclusive");
  const std::vector<int64_t> offsets = row_offsets(op, cu_seqlens, rewards.numel());
  const at::Tensor r = rewards.contiguous(), m = mask.contiguous();
  const at::Tensor b = baseline.has_value() ? baseline->contiguous() : at::Tensor();
  at::Tensor out = at::empty(r.sizes(), r.options());
  at::Tensor second = whiten || b.defined() ? at::empty(r.sizes(), r.options()) : at::empty({0}, r.options());
  int64_t bad = 0;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, r.scalar_type(), "discounted_returns_cpu", [&] {
    using A = acc_t<scalar_t>;
    std::vector<Moments<A>> moments(whiten ? layout.rows : 0);
    with_mask<A>(m, [&](auto mp) {
      // Returns read no values: rewards stand in for them.
      const scalar_t* rp = r.const_data_ptr<scalar_t>();
      scalar_t* o = out.mutable_data_ptr<scalar_t>();
      scalar_t* minus_baseline = b.defined() ? second.mutable_data_ptr<scalar_t>() : o;
      bad = scan_all<ScanKind::Returns>(layout, offsets, rp, rp, mp, o, minus_baseline,
                                        b.defined() ? b.const_data_ptr<scalar_t>() : nullptr, A(gamma), A(0),
                                        whiten ? moments.data() : nullptr);
      if (whiten) whiten_into<scalar_t>(o, second.mutable_data_ptr<scalar_t>(), mp, out.numel(), moments);
    });
  });
  return {out, second, ok_flag(bad, r)};
}

}  // namespace

TORCH_LIBRARY_IMPL(rlkernels, CPU, m) {
  m.impl("gae", &gae_cpu);
  m.impl("discounted_returns", &discounted_returns_cpu);
}

}  // namespace rlk
