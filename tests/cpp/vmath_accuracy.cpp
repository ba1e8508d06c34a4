// Sweeps rlk::exp_ / rlk::tanh_ / rlk::vlog_ (csrc/include/rlkernels/vmath.h) over their fp32 range, in a loop that
// gcc vectorizes with the same clones the kernels use, and prints the worst error against fp64 libm.
// Built and checked by tests/test_vmath.py.
#include <math.h>
#include <stdio.h>

#include <vector>

#include "rlkernels/vmath.h"

RLK_CPU_MULTIVERSION void exp_span(const float* __restrict__ x, float* __restrict__ y, long n) {
  for (long i = 0; i < n; ++i) y[i] = rlk::exp_(x[i]);
}

RLK_CPU_MULTIVERSION void tanh_span(const float* __restrict__ x, float* __restrict__ y, long n) {
  for (long i = 0; i < n; ++i) y[i] = rlk::tanh_(x[i]);
}

RLK_CPU_MULTIVERSION void log_span(const float* __restrict__ x, float* __restrict__ y, long n) {
  for (long i = 0; i < n; ++i) y[i] = rlk::vlog_(x[i]);
}

// Error in units of the fp32 spacing at the true value (subnormals: the smallest spacing).
static double ulps(float got, double want) {
  if (isnan(want)) return isnan(got) ? 0.0 : INFINITY;
  if (isinf(want) || fabs(want) > 3.4028234663852886e38) return (isinf(got) && (got > 0) == (want > 0)) ? 0.0 : INFINITY;
  int e;
  frexp(want, &e);
  double spacing = ldexp(1.0, (e - 24 < -149 ? -149 : e - 24));
  return fabs(double(got) - want) / spacing;
}

int main() {
  std::vector<float> x;
  for (double v = -110.0; v <= 95.0; v += 0.0009765625 * 0.37) x.push_back(float(v));
  const float specials[] = {0.0f, -0.0f, 1e-30f, -1e-30f, 88.72283f, 88.7229f, -87.33655f, -103.9f, -104.5f,
                            NAN, INFINITY, -INFINITY};
  for (float s : specials) x.push_back(s);
  std::vector<float> y(x.size());
  double worst_exp = 0.0, worst_tanh = 0.0;
  exp_span(x.data(), y.data(), long(x.size()));
  for (size_t i = 0; i < x.size(); ++i) worst_exp = fmax(worst_exp, ulps(y[i], exp(double(x[i]))));
  tanh_span(x.data(), y.data(), long(x.size()));
  for (size_t i = 0; i < x.size(); ++i) worst_tanh = fmax(worst_tanh, ulps(y[i], tanh(double(x[i]))));
  // log over every binade of positive floats (subnormals included), and its special arguments.
  std::vector<float> lx;
  for (double v = 1.4e-45; v < 3.4e38; v *= 1.0000371) lx.push_back(float(v));
  const float log_specials[] = {0.0f, -0.0f, -1.0f, 1.0f, 1.17549435e-38f, 1.1754942e-38f, 3.4028235e38f,
                                NAN, INFINITY, -INFINITY};
  for (float s : log_specials) lx.push_back(s);
  std::vector<float> ly(lx.size());
  log_span(lx.data(), ly.data(), long(lx.size()));
  double worst_log = 0.0;
  for (size_t i = 0; i < lx.size(); ++i) worst_log = fmax(worst_log, ulps(ly[i], log(double(lx[i]))));
  printf("exp_max_ulp %.3f\ntanh_max_ulp %.3f\nlog_max_ulp %.3f\npoints %zu\nlog_points %zu\n", worst_exp,
         worst_tanh, worst_log, x.size(), lx.size());
  return 0;
}
