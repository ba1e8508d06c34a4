// GAE and discounted returns as a right-to-left scan, shared by the CPU and CUDA kernels.
//
// Each position t maps the carried state of the position to its right, x = (x1, x2), to its own:
//   x_t = M_t x_{t+1} + b_t,   M_t = [[p, 0], [q, s]]   (lower triangular 2x2 affine map)
// GAE:      x = (nextV, A):  nextV_t = (1-m) nextV + m V;  A_t = m gamma nextV + (1 - m + m gamma lam) A + m (r - V)
// returns:  x = (C, G):      G_t = m (r + gamma C);  C_t = m r + (1 - m + m gamma) C  (verl 0.9.1: a masked
//                            position returns 0 and carries the running return C through)
// so one scan of these maps gives both of verl's carried quantities. Maps compose associatively (a
// block-parallel scan composes them; the sequential loops apply the verl step directly).
// Whitening statistics are merged with Chan's parallel formula (count, mean, centered sum of squares).
#pragma once

#include <type_traits>

#include "rlkernels/common.h"

namespace rlk {

// Codes shared with rlkernels/triton/gae.py.
enum class ScanKind : int { GAE = 0, Returns = 1 };

// verl masked_whiten: (x - mean) * rsqrt(var + 1e-8).
constexpr double kWhitenEps = 1e-8;

RLK_HOST_DEVICE float sqrt_acc(float x) { return sqrtf(x); }
RLK_HOST_DEVICE double sqrt_acc(double x) { return sqrt(x); }

template <typename T>
struct Affine2 {
  T p, q, s, b1, b2;
};

template <typename T>
RLK_HOST_DEVICE Affine2<T> affine2_identity() {
  return {T(1), T(0), T(1), T(0), T(0)};
}

// outer o inner: inner applies first (inner is the part to the right in a right-to-left scan).
template <typename T>
RLK_HOST_DEVICE Affine2<T> affine2_compose(const Affine2<T>& outer, const Affine2<T>& inner) {
  return {outer.p * inner.p, outer.q * inner.p + outer.s * inner.q, outer.s * inner.s,
          outer.p * inner.b1 + outer.b1, outer.q * inner.b1 + outer.s * inner.b2 + outer.b2};
}

template <typename T>
RLK_HOST_DEVICE void affine2_apply(const Affine2<T>& f, T& x1, T& x2) {
  const T y1 = f.p * x1 + f.b1;
  const T y2 = f.q * x1 + f.s * x2 + f.b2;
  x1 = y1;
  x2 = y2;
}

// The map of one position (m: the mask as 0/1 or a weight; gl = gamma * lam).
template <typename T>
RLK_HOST_DEVICE Affine2<T> scan_map(ScanKind kind, T r, T v, T m, T gamma, T gl) {
  if (kind == ScanKind::GAE) return {T(1) - m, m * gamma, T(1) - m + m * gl, m * v, m * (r - v)};
  return {T(1) - m + m * gamma, m * gamma, T(0), m * r, m * r};
}

// One step of verl's loop, in verl's order of operations: updates the state (x1, x2) from the
// position to the right to this position. The output at t is x2 (GAE: A, returns: G).
template <typename T>
RLK_HOST_DEVICE void scan_step(ScanKind kind, T r, T v, T m, T gamma, T gl, T& x1, T& x2) {
  if (kind == ScanKind::GAE) {
    const T delta = r + gamma * x1 - v;
    const T a = delta + gl * x2;
    x1 = v * m + (T(1) - m) * x1;
    x2 = a * m + (T(1) - m) * x2;
  } else {
    const T g = r + gamma * x1;
    x2 = g * m;
    x1 = g * m + (T(1) - m) * x1;
  }
}

// The same step for a binary mask, with selects: identical results for finite inputs (v*1 + 0*x == v),
// and a shorter dependency chain for the sequential loops.
template <typename T>
RLK_HOST_DEVICE void scan_step(ScanKind kind, T r, T v, bool m, T gamma, T gl, T& x1, T& x2) {
  if (kind == ScanKind::GAE) {
    const T delta = r + gamma * x1 - v;
    const T a = delta + gl * x2;
    x1 = m ? v : x1;
    x2 = m ? a : x2;
  } else {
    const T g = r + gamma * x1;
    x2 = m ? g : T(0);
    x1 = m ? g : x1;
  }
}

// Weighted count, mean and centered sum of squares of a set of values.
template <typename T>
struct Moments {
  T w, mean, m2;
};

// verl masked_whiten's coefficients (mean, 1 / sqrt(var + 1e-8)) from the total weight `w`, weighted mean and
// centered sum of squares `m2` of every row together: var unbiased, 0 with a total weight <= 1 (no NaN).
template <typename T>
RLK_HOST_DEVICE void whiten_coefficients(T w, T mean, T m2, T& out_mean, T& rstd) {
  const T var = w > T(1) ? m2 / (w - T(1)) : T(0);
  out_mean = w > T(0) ? mean : T(0);
  rstd = T(1) / sqrt_acc(var + T(kWhitenEps));
}

// A mask value as the scans read it: bool, an integer 0 / 1 (nonzero counts as 1), or a float weight. The
// conversions, not a select: gcc compiles `m ? 1 : 0` times a value into a branch per element, which a random
// mask mispredicts (the CPU token loops ran 17x slower on a bool mask than on a float one).
template <typename T, typename M>
RLK_HOST_DEVICE T mask_weight(M m) {
  if constexpr (std::is_same_v<M, bool>) {
    return T(m);
  } else if constexpr (std::is_integral_v<M>) {
    return T(m != 0);
  } else {
    return T(m);
  }
}

// Whether the scans reject a mask value: an integer other than 0 and 1, a negative or non-finite weight.
template <typename T, typename M>
RLK_HOST_DEVICE bool mask_value_bad(M m) {
  if constexpr (std::is_same_v<M, bool>) {
    return false;
  } else if constexpr (std::is_integral_v<M>) {
    return m != 0 && m != 1;
  } else {
    const T w = T(m);
    return !(w >= T(0) && w < T(INFINITY));
  }
}

// Chan et al.'s pairwise merge; exact for empty parts (w == 0).
template <typename T>
RLK_HOST_DEVICE Moments<T> moments_merge(const Moments<T>& a, const Moments<T>& b) {
  const T w = a.w + b.w;
  if (!(w > T(0))) return {T(0), T(0), T(0)};
  const T delta = b.mean - a.mean;
  const T fb = b.w / w;
  return {w, a.mean + delta * fb, a.m2 + b.m2 + delta * delta * a.w * fb};
}

}  // namespace rlk
