// Helpers of the CPU loss kernels that reduce per-row sums over [B, T] tokens (policy_loss.cpp,
// value_loss.cpp): the (row, chunk) task split and vectorizable span loops.
//
// Everything here has internal linkage on purpose: the loops carry RLK_CPU_MULTIVERSION (gcc target_clones),
// whose resolvers must not be shared between translation units.
#pragma once

#include <ATen/Parallel.h>
#include <stdint.h>

#include <algorithm>
#include <vector>

#include "rlkernels/common.h"

namespace rlk {
namespace {

// Tokens per scratch block: a loop's ~20 block arrays (20 KiB in fp32) stay in the 48 KiB L1.
constexpr int64_t kBlock = 256;
// Tokens per parallel task along a row: long rows (packed batches) still spread over the threads, and
// the fixed split makes every sum independent of the thread count.
constexpr int64_t kChunk = 8192;
// Minimum tokens per parallel task: below it a second thread costs more than it saves once 1 parallel region
// in 100 waits out a busy neighbor's scheduler tick (value_loss's cheaper tokens set it; parallel_grain.py).
constexpr int64_t kMinTaskTokens = 131072;
// Lanes of the block reductions: one AVX-512 register of fp32.
constexpr int kLanes = 16;

template <typename S, typename A>
RLK_CPU_MULTIVERSION void convert_span(const S* __restrict__ src, A* __restrict__ dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = A(src[i]);
}

template <typename A>
RLK_CPU_MULTIVERSION void fill_span(A* __restrict__ dst, A value, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = value;
}

// out[i] = g · x[i], converted to the output type.
template <typename T, typename A>
RLK_CPU_MULTIVERSION void scale_span(const A* __restrict__ x, A g, T* __restrict__ out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = T(g * x[i]);
}

// x[i] *= g.
template <typename A>
RLK_CPU_MULTIVERSION void scale_in_place(A* __restrict__ x, A g, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] *= g;
}

// Σ x[0..n) with kLanes independent lanes (vectorizable without reassociation), finished in fp64.
template <typename A>
RLK_CPU_MULTIVERSION double block_sum(const A* __restrict__ x, int64_t n) {
  A lanes[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) lanes[l] += x[i + l];
  }
  double total = 0;
  for (; i < n; ++i) total += double(x[i]);
  for (int l = 0; l < kLanes; ++l) total += double(lanes[l]);
  return total;
}

// (row, chunk) task decomposition of a [B, T] batch.
struct RowTasks {
  int64_t chunk, chunks_per_row, count, grain;
  RowTasks(int64_t B, int64_t T) {
    chunk = std::min(T, kChunk);
    chunks_per_row = chunk > 0 ? (T + chunk - 1) / chunk : 0;
    count = B * chunks_per_row;
    grain = chunk > 0 ? (kMinTaskTokens + chunk - 1) / chunk : 1;
  }
  int64_t row(int64_t task) const { return task / chunks_per_row; }
  int64_t begin(int64_t task) const { return (task % chunks_per_row) * chunk; }
  int64_t end(int64_t task, int64_t T) const { return std::min(begin(task) + chunk, T); }

  // The rows' sums [B, cols] (fp64) of the tasks' partials part [count, cols], each row's chunks added in order.
  std::vector<double> row_sums(const std::vector<double>& part, int64_t B, int cols) const {
    std::vector<double> rows(B * cols, 0.0);
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t c = 0; c < chunks_per_row; ++c) {
        const double* q = &part[cols * (b * chunks_per_row + c)];
        for (int k = 0; k < cols; ++k) rows[b * cols + k] += q[k];
      }
    }
    return rows;
  }

  // f(task) for every task, in parallel.
  template <typename F>
  void for_each(F&& f) const {
    at::parallel_for(0, count, grain, [&](int64_t lo, int64_t hi) {
      for (int64_t task = lo; task < hi; ++task) f(task);
    });
  }
};

}  // namespace
}  // namespace rlk
