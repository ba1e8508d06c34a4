// Shared by the C++ CPU kernels and the CUDA kernels: no torch headers, host and device.
#pragma once

#include <math.h>
#include <stdint.h>

#include <limits>
#include <optional>
#include <type_traits>

#include "rlkernels/vmath.h"

#if defined(__CUDACC__)
#define RLK_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define RLK_HOST_DEVICE inline
#endif

namespace rlk {

// torch.clamp semantics: NaN stays NaN (both comparisons are false).
template <typename T>
RLK_HOST_DEVICE T clamp_value(T x, T lo, T hi) {
  return x < lo ? lo : (x > hi ? hi : x);
}

// Gradient mask of torch.clamp: the gradient passes where lo <= x <= hi (bounds inclusive).
template <typename T>
RLK_HOST_DEVICE bool clamp_passes(T x, T lo, T hi) {
  return x >= lo && x <= hi;
}

// Overloads so that templates on float/double pick the right libm / CUDA math function
// (exp_ and tanh_ are in vmath.h: vectorizable on the host).
RLK_HOST_DEVICE float log_(float x) { return logf(x); }
RLK_HOST_DEVICE double log_(double x) { return log(x); }
RLK_HOST_DEVICE float abs_(float x) { return fabsf(x); }
RLK_HOST_DEVICE double abs_(double x) { return fabs(x); }

// An optional bound from an op's schema (`float?`), +inf when absent (host code).
template <typename T = double>
T value_or_inf(std::optional<double> v) {
  return v.has_value() ? T(*v) : std::numeric_limits<T>::infinity();
}

// sign with sign(0) = 0, the gradient of |x| in torch.
template <typename T>
RLK_HOST_DEVICE T sign_(T x) {
  return T(x > T(0)) - T(x < T(0));
}

// Calls f(std::bool_constant<b>{}) so that a kernel's loops are compiled once per flag value (host code).
template <typename F>
void dispatch_bool(bool b, F&& f) {
  if (b) {
    f(std::true_type{});
  } else {
    f(std::false_type{});
  }
}

}  // namespace rlk
