// exp, tanh and log that gcc can vectorize on the host (branch-free, inlined, no libm call), and the CUDA
// intrinsics on the device. fp32 accuracy: exp within 1.3 ulp, tanh and log within 2 ulp over the whole
// range, NaN/inf and subnormal arguments and results handled. fp64 always uses libm (fp64 paths are for gradchecks, not speed).
#pragma once

#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define RLK_MATH_FN __host__ __device__ __forceinline__
#else
#define RLK_MATH_FN inline
#endif

namespace rlk {
namespace detail {

inline float float_from_bits(int32_t bits) {
  float f;
  memcpy(&f, &bits, sizeof(f));
  return f;
}

inline int32_t bits_from_float(float f) {
  int32_t bits;
  memcpy(&bits, &f, sizeof(bits));
  return bits;
}

// 2^k for k in [-126, 127], built from its exponent bits.
inline float pow2_int(int32_t k) { return float_from_bits((k + 127) << 23); }

// exp(x) = 2^k * exp(r), k = round(x / ln2), r = x - k ln2 (Cody-Waite, two-part ln2), exp(r) by a
// degree-7 polynomial on [-ln2/2, ln2/2] (Cephes expf coefficients). 2^k is applied as two factors so
// that results down to the subnormals and up to FLT_MAX need no special case.
inline float host_expf(float x) {
  const float kLog2e = 1.44269504088896341f;
  const float kLn2Hi = 0.693145751953125f;
  const float kLn2Lo = 1.428606765330187045e-06f;
  const float kRoundMagic = 12582912.0f;  // 1.5 * 2^23: (v + magic) - magic rounds v to an integer
  const float kMax = 88.8f;               // past log(FLT_MAX): the product overflows to inf by itself
  const float kMin = -104.0f;             // below log(smallest subnormal / 2): the result is 0
  float xc = x > kMax ? kMax : x;
  xc = xc < kMin ? kMin : xc;
  const float k = (xc * kLog2e + kRoundMagic) - kRoundMagic;
  float r = xc - k * kLn2Hi;
  r = r - k * kLn2Lo;
  float p = 1.9875691500E-4f;
  p = p * r + 1.3981999507E-3f;
  p = p * r + 8.3334519073E-3f;
  p = p * r + 4.1665795894E-2f;
  p = p * r + 1.6666665459E-1f;
  p = p * r + 5.0000001201E-1f;
  p = p * r * r + r + 1.0f;
  const int32_t ki = int32_t(k);
  const int32_t half = ki >> 1;
  float y = p * pow2_int(half) * pow2_int(ki - half);
  y = x < kMin ? 0.0f : y;
  return x != x ? x : y;
}

// tanh: odd polynomial for |x| < 0.625 (Cephes tanhf), else sign(x) (1 - 2 / (e^{2|x|} + 1)).
inline float host_tanhf(float x) {
  const float ax = x < 0.0f ? -x : x;
  const float z = x * x;
  float small = -5.70498872745E-3f;
  small = small * z + 2.06390887954E-2f;
  small = small * z - 5.37397155531E-2f;
  small = small * z + 1.33314422036E-1f;
  small = small * z - 3.33332819422E-1f;
  small = small * z * x + x;
  const float e = host_expf(2.0f * (ax > 44.0f ? 44.0f : ax));  // tanh(44) == 1 in fp32; keeps e finite
  float large = 1.0f - 2.0f / (e + 1.0f);
  large = x < 0.0f ? -large : large;
  const float y = ax < 0.625f ? small : large;
  return x != x ? x : y;
}

// log(x) = e·ln2 + log(m), x = m·2^e with m in [sqrt(1/2), sqrt(2)) read from the bits (subnormals scaled
// by 2^23 first), log(m) by Cephes logf's degree-9 polynomial in m - 1; ln2 in two parts.
inline float host_logf(float x) {
  const float kSqrtHalf = 0.707106781186547524f;
  const bool tiny = x < 1.17549435e-38f;  // subnormal (or zero / negative: handled at the end)
  const float xs = tiny ? x * 8388608.0f : x;
  const int32_t bits = bits_from_float(xs);
  int32_t e = ((bits >> 23) & 0xff) - 126 - (tiny ? 23 : 0);
  float m = float_from_bits((bits & 0x007fffff) | 0x3f000000);  // [0.5, 1)
  const bool low = m < kSqrtHalf;
  e = low ? e - 1 : e;
  m = low ? m + m - 1.0f : m - 1.0f;
  const float z = m * m;
  float y = 7.0376836292E-2f;
  y = y * m - 1.1514610310E-1f;
  y = y * m + 1.1676998740E-1f;
  y = y * m - 1.2420140846E-1f;
  y = y * m + 1.4249322787E-1f;
  y = y * m - 1.6668057665E-1f;
  y = y * m + 2.0000714765E-1f;
  y = y * m - 2.4999993993E-1f;
  y = y * m + 3.3333331174E-1f;
  y = y * m * z;
  const float fe = float(e);
  y += -2.12194440E-4f * fe;
  y += -0.5f * z;
  float r = m + y + 0.693359375f * fe;
  r = x == 0.0f ? -INFINITY : r;
  r = x < 0.0f ? NAN : r;
  r = x == INFINITY ? x : r;
  return x != x ? x : r;
}

}  // namespace detail

RLK_MATH_FN float exp_(float x) {
#if defined(__CUDA_ARCH__)
  return expf(x);
#else
  return detail::host_expf(x);
#endif
}
RLK_MATH_FN double exp_(double x) { return exp(x); }

RLK_MATH_FN float tanh_(float x) {
#if defined(__CUDA_ARCH__)
  return tanhf(x);
#else
  return detail::host_tanhf(x);
#endif
}
RLK_MATH_FN double tanh_(double x) { return tanh(x); }

// The vectorizable log for per-token CPU loops (log_ in common.h stays libm's, for per-row finishes).
RLK_MATH_FN float vlog_(float x) {
#if defined(__CUDA_ARCH__)
  return logf(x);
#else
  return detail::host_logf(x);
#endif
}
RLK_MATH_FN double vlog_(double x) { return log(x); }

}  // namespace rlk

// Hot CPU loops: gcc compiles one clone per instruction set and picks one at load time, so the
// extension stays portable while the loops run with AVX-512/AVX2 where available. Put it on plain
// functions over raw pointers (not lambdas); compile with -fno-trapping-math so that branch-free
// ternaries vectorize.
#if defined(__x86_64__) && defined(__linux__) && defined(__GNUC__) && !defined(__CUDACC__) && \
    !defined(__clang__)
#define RLK_CPU_MULTIVERSION __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define RLK_CPU_MULTIVERSION
#endif
