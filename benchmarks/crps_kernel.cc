// The Normal closed-form CRPS estimate of PredictiveELBO("crps") (AutoNormal,
// one stratum, scales of shape (M, 1)) and its partial derivatives in one pass
// over the (M, N) locations: an experiment of benchmarks/crps_kernel.py, not
// part of the package. Per observation n, with particle j paired with j - 1:
//
//   value[n] = (1/M) sum_j [ -A(y_n - mu_jn, s_j) + A(mu_jn - mu_{j-1,n}, s_pair) / 2 ]
//
// A(d, s) = d erf(d / (s sqrt 2)) + s sqrt(2/pi) exp(-d^2 / 2 s^2), whose
// derivatives in d and s are the same erf and exp. erf is Eigen's float
// rational approximation (XLA's too), exp a Cody-Waite reduction with a
// degree-6 polynomial; both written so that the compiler vectorises the loop.
#include <cmath>
#include <cstdint>
#include <bit>
#include <cstring>
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

static inline float erf_f(float x) {
  // Eigen's generic_fast_erf_float (rational approximation on [-4, 4]).
  x = x < -4.0f ? -4.0f : (x > 4.0f ? 4.0f : x);
  const float x2 = x * x;
  float p = -2.72614225801306e-10f;
  p = p * x2 + 2.77068142495902e-08f;
  p = p * x2 + -2.10102402082508e-06f;
  p = p * x2 + -5.69250639462346e-05f;
  p = p * x2 + -7.34990630326855e-04f;
  p = p * x2 + -2.95459980854025e-03f;
  p = p * x2 + -1.60960333262415e-02f;
  p = p * x;
  float q = -1.45660718464996e-05f;
  q = q * x2 + -2.13374055278905e-04f;
  q = q * x2 + -1.68282697438203e-03f;
  q = q * x2 + -7.37332916720468e-03f;
  q = q * x2 + -1.42647390514189e-02f;
  return p / q;
}

static inline float exp_neg(float a) {
  // exp(a) for a <= 0: Cody-Waite reduction, degree-6 polynomial, 2^k by bits.
  a = a < -87.0f ? -87.0f : a;
  const float shifter = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float kf = (a * 1.4426950408889634f + shifter) - shifter;
  float r = a - kf * 0.693145751953125f;
  r = r - kf * 1.428606765330187045e-06f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t k = static_cast<int32_t>(kf);
  return std::bit_cast<float>(std::bit_cast<int32_t>(p) + (k << 23));
}

static constexpr float kInvSqrt2 = 0.70710678118654752f;
static constexpr float kSqrt2OverPi = 0.79788456080286536f;

static void row(const float* __restrict yv, const float* __restrict l,
                const float* __restrict lp, float* __restrict v,
                float* __restrict dyv, float* __restrict dl, float* __restrict ds,
                float* __restrict dlp, float* __restrict dsp, int64_t n_,
                float s, float sp, float c1, float c2, float ws, float wsp,
                float inv_m) {
  for (int64_t n = 0; n < n_; ++n) {
    const float d1 = yv[n] - l[n];
    const float v1 = d1 * c1;
    const float e1 = erf_f(v1);
    const float g1 = kSqrt2OverPi * exp_neg(-v1 * v1);
    const float dp = l[n] - lp[n];
    const float v2 = dp * c2;
    const float e2 = erf_f(v2);
    const float g2 = kSqrt2OverPi * exp_neg(-v2 * v2);
    v[n] += inv_m * (-(d1 * e1 + s * g1) + 0.5f * (dp * e2 + sp * g2));
    dyv[n] -= inv_m * e1;
    dl[n] = inv_m * (e1 + 0.5f * e2);
    ds[n] = -inv_m * g1 + ws * g2;
    dlp[n] -= 0.5f * inv_m * e2;
    dsp[n] += wsp * g2;
  }
}

static ffi::Error CrpsImpl(ffi::Buffer<ffi::F32> loc, ffi::Buffer<ffi::F32> scale,
                           ffi::Buffer<ffi::F32> y,
                           ffi::ResultBuffer<ffi::F32> value,
                           ffi::ResultBuffer<ffi::F32> dloc,
                           ffi::ResultBuffer<ffi::F32> dscale,
                           ffi::ResultBuffer<ffi::F32> dy) {
  const auto dims = loc.dimensions();
  const int64_t m_ = dims[0], n_ = dims[1];
  const float* L = loc.typed_data();
  const float* S = scale.typed_data();  // (M, 1)
  const float* Y = y.typed_data();
  float* V = value->typed_data();
  float* DL = dloc->typed_data();
  float* DS = dscale->typed_data();
  float* DY = dy->typed_data();
  const float inv_m = 1.0f / static_cast<float>(m_);
  // Blocks of observations: a block's rows of every particle stay in cache
  // while the pair (j, j - 1) adds into row j - 1.
  constexpr int64_t kBlock = 512;
  float scratch_l[kBlock], scratch_s[kBlock];
  for (int64_t start = 0; start < n_; start += kBlock) {
    const int64_t len = n_ - start < kBlock ? n_ - start : kBlock;
    for (int64_t n = 0; n < len; ++n) {
      V[start + n] = 0.0f;
      DY[start + n] = 0.0f;
      scratch_l[n] = 0.0f;
      scratch_s[n] = 0.0f;
    }
    for (int64_t j = 0; j < m_; ++j) {
      const int64_t prev = (j + m_ - 1) % m_;
      const float s = S[j], sp_ = S[prev];
      const float sp = std::sqrt(s * s + sp_ * sp_);
      // the pair (j, prev) as prev's: row prev, or (j = 0) scratch, added below
      const int64_t at = j * n_ + start, at_prev = prev * n_ + start;
      row(Y + start, L + at, L + at_prev, V + start, DY + start, DL + at, DS + at,
          j ? DL + at_prev : scratch_l, j ? DS + at_prev : scratch_s, len, s, sp,
          kInvSqrt2 / s, kInvSqrt2 / sp, 0.5f * inv_m * s / sp,
          0.5f * inv_m * sp_ / sp, inv_m);
    }
    float* dl = DL + (m_ - 1) * n_ + start;
    float* ds = DS + (m_ - 1) * n_ + start;
    for (int64_t n = 0; n < len; ++n) {
      dl[n] += scratch_l[n];
      ds[n] += scratch_s[n];
    }
  }
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(NormalNextPairCrps, CrpsImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
