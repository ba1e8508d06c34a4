// __half and __nv_bfloat16 for the cuda-on-cpu harness: 16-bit storage and the explicit conversions, with
// the rounding of the GPU's cvt instructions (round to nearest, ties to even; overflow to inf; subnormals
// kept; NaN to the canonical 0x7fff). No arithmetic and no implicit conversions: torch compiles its CUDA
// sources with __CUDA_NO_HALF_OPERATORS__ / __CUDA_NO_HALF_CONVERSIONS__ / __CUDA_NO_BFLOAT16_CONVERSIONS__,
// so code that leans on them would not compile there either.
#pragma once

#include <stdint.h>
#include <string.h>

#include "rlk_sim/qualifiers.h"

struct __half_raw {
  unsigned short x;
};
struct __nv_bfloat16_raw {
  unsigned short x;
};

struct __half {
  unsigned short __x;
  __half() = default;
  constexpr __half(__half_raw r) : __x(r.x) {}
  constexpr operator __half_raw() const { return __half_raw{__x}; }
};

struct __nv_bfloat16 {
  unsigned short __x;
  __nv_bfloat16() = default;
  constexpr __nv_bfloat16(__nv_bfloat16_raw r) : __x(r.x) {}
  constexpr operator __nv_bfloat16_raw() const { return __nv_bfloat16_raw{__x}; }
};

namespace rlk_sim {

inline uint32_t float_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof(u));
  return u;
}

inline float bits_float(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof(f));
  return f;
}

// Round-to-nearest-even of m >> shift (shift >= 1).
inline uint32_t shift_rne(uint32_t m, int shift) {
  const uint32_t r = m >> shift, rem = m & ((uint32_t(1) << shift) - 1), half = uint32_t(1) << (shift - 1);
  return r + ((rem > half || (rem == half && (r & 1))) ? 1 : 0);
}

inline unsigned short float_to_half_bits(float f) {
  const uint32_t u = float_bits(f);
  const uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7fffu;            // NaN
  if (a >= 0x477ff000u) return sign | 0x7c00u;    // >= 65520 (max half + half an ulp): inf
  if (a >= 0x38800000u) {                         // >= 2^-14: a normal half
    const uint32_t v = a - 0x38000000u;           // rebias the exponent (127 -> 15) in place
    return static_cast<unsigned short>(sign | shift_rne(v, 13));  // a carry rounds into the exponent
  }
  if (a <= 0x33000000u) return sign;              // <= 2^-25 (half the smallest subnormal): 0 (ties to even)
  const int e = int(a >> 23);                     // subnormal half: value = m * 2^(e - 150), unit 2^-24
  const uint32_t m = (a & 0x7fffffu) | 0x800000u;
  return static_cast<unsigned short>(sign | shift_rne(m, 126 - e));
}

inline float half_bits_to_float(unsigned short h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  int e = (h >> 10) & 0x1f;
  uint32_t m = h & 0x3ffu;
  if (e == 0x1f) return bits_float(sign | 0x7f800000u | (m << 13));  // inf, NaN (payload kept)
  if (e == 0) {
    if (m == 0) return bits_float(sign);
    e = 1;
    while (!(m & 0x400u)) {  // normalize the subnormal
      m <<= 1;
      --e;
    }
    m &= 0x3ffu;
  }
  return bits_float(sign | (uint32_t(e + 112) << 23) | (m << 13));
}

inline unsigned short float_to_bfloat16_bits(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fffu;  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);                      // ties to even; a carry rounds up to inf
  return static_cast<unsigned short>(u >> 16);
}

inline float bfloat16_bits_to_float(unsigned short b) { return bits_float(uint32_t(b) << 16); }

}  // namespace rlk_sim

__host__ __device__ inline __half __float2half_rn(float f) { return __half_raw{rlk_sim::float_to_half_bits(f)}; }
__host__ __device__ inline __half __float2half(float f) { return __float2half_rn(f); }
__host__ __device__ inline float __half2float(__half h) { return rlk_sim::half_bits_to_float(h.__x); }
__host__ __device__ inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  return __nv_bfloat16_raw{rlk_sim::float_to_bfloat16_bits(f)};
}
__host__ __device__ inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }
__host__ __device__ inline float __bfloat162float(__nv_bfloat16 b) { return rlk_sim::bfloat16_bits_to_float(b.__x); }
