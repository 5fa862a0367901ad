// Vector arithmetic for the kernels, for the instruction set -march=native allows (AVX-512, else AVX2;
// with neither, a one-lane Vec and the scalar exp_inplace): a lane-width-neutral Vec, the sums of kLanes vectors at
// once, exp over an array (Cephes' expf, as cpu_kernels.cpp's exp_inplace, with an AVX2 path), and the
// largest of an array.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

namespace llmopt_simd {

#if defined(__AVX512F__) || defined(__AVX2__)
#if defined(__AVX512F__)
using Vec = __m512;
constexpr int kLanes = 16;
inline Vec vset(float x) { return _mm512_set1_ps(x); }
inline Vec vload(const float* p) { return _mm512_loadu_ps(p); }
inline void vstore(float* p, Vec v) { _mm512_storeu_ps(p, v); }
inline Vec vfma(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
inline Vec vfnma(Vec a, Vec b, Vec c) { return _mm512_fnmadd_ps(a, b, c); }
inline Vec vmul(Vec a, Vec b) { return _mm512_mul_ps(a, b); }
inline Vec vzero() { return _mm512_setzero_ps(); }
inline Vec vadd(Vec a, Vec b) { return _mm512_add_ps(a, b); }
inline Vec vsub(Vec a, Vec b) { return _mm512_sub_ps(a, b); }
inline Vec vmin(Vec a, Vec b) { return _mm512_min_ps(a, b); }
inline Vec vmax(Vec a, Vec b) { return _mm512_max_ps(a, b); }
inline Vec vround(Vec a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
inline Vec vpow2(Vec p, Vec k) { return _mm512_scalef_ps(p, k); }
inline float vsum(Vec v) { return _mm512_reduce_add_ps(v); }
// a <= b ? x : y, lane by lane.
inline Vec vwhere_le(Vec a, Vec b, Vec x, Vec y) { return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, b, _CMP_LE_OQ), y, x); }
// kLanes int8 values as floats.
// out[t] = the sum of v[t]'s lanes, for 16 vectors: a transposing tree of shuffles and adds, instead of
// 16 separate horizontal sums (cpu_kernels.cpp's block_scores and the int8 kernel use it).
inline Vec sum_lanes(const Vec* v) {
  __m512 w[8], x[4];
  for (int i = 0; i < 8; ++i)
    w[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  for (int i = 0; i < 4; ++i)
    x[i] = _mm512_add_ps(_mm512_shuffle_ps(w[2 * i], w[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(w[2 * i], w[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 x01 = _mm512_add_ps(_mm512_shuffle_f32x4(x[0], x[1], _MM_SHUFFLE(1, 0, 1, 0)),
                                   _mm512_shuffle_f32x4(x[0], x[1], _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 x23 = _mm512_add_ps(_mm512_shuffle_f32x4(x[2], x[3], _MM_SHUFFLE(1, 0, 1, 0)),
                                   _mm512_shuffle_f32x4(x[2], x[3], _MM_SHUFFLE(3, 2, 3, 2)));
  return _mm512_add_ps(_mm512_shuffle_f32x4(x01, x23, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(x01, x23, _MM_SHUFFLE(3, 1, 3, 1)));
}
inline Vec vload_i8(const int8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
#else
using Vec = __m256;
constexpr int kLanes = 8;
inline Vec vset(float x) { return _mm256_set1_ps(x); }
inline Vec vload(const float* p) { return _mm256_loadu_ps(p); }
inline void vstore(float* p, Vec v) { _mm256_storeu_ps(p, v); }
inline Vec vfma(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
inline Vec vfnma(Vec a, Vec b, Vec c) { return _mm256_fnmadd_ps(a, b, c); }
inline Vec vmul(Vec a, Vec b) { return _mm256_mul_ps(a, b); }
inline Vec vzero() { return _mm256_setzero_ps(); }
inline Vec vadd(Vec a, Vec b) { return _mm256_add_ps(a, b); }
inline Vec vsub(Vec a, Vec b) { return _mm256_sub_ps(a, b); }
inline Vec vmin(Vec a, Vec b) { return _mm256_min_ps(a, b); }
inline Vec vmax(Vec a, Vec b) { return _mm256_max_ps(a, b); }
inline Vec vround(Vec a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
// p * 2^k for integral k in [-126, 127] (the clamp in exp_inplace keeps k there): k into the exponent bits.
inline Vec vpow2(Vec p, Vec k) {
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}
inline Vec vwhere_le(Vec a, Vec b, Vec x, Vec y) { return _mm256_blendv_ps(y, x, _mm256_cmp_ps(a, b, _CMP_LE_OQ)); }
inline float vsum(Vec v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}
// out[t] = the sum of v[t]'s lanes, for 8 vectors: pairwise adds within 128-bit halves, then the halves.
inline Vec sum_lanes(const Vec* v) {
  const __m256 ab = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
  const __m256 cd = _mm256_hadd_ps(_mm256_hadd_ps(v[4], v[5]), _mm256_hadd_ps(v[6], v[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(ab, cd, 0x20), _mm256_permute2f128_ps(ab, cd, 0x31));
}
inline Vec vload_i8(const int8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
#endif

// exp of each lane: Cephes' expf, exp(x) = 2^k * p(x - k ln 2), about 1 ulp. Below -87.3 it gives
// exp(-87.3) (~1e-38), not 0: a masked score must be zeroed by its mask, not by exp.
inline Vec vexp(Vec x) {
  // [-87.3, 88.3] rather than Cephes' +-88.38: keeps 2^k a normal float for the AVX2 exponent-bits path.
  const Vec v = vmax(vmin(x, vset(88.3f)), vset(-87.3f));
  const Vec k = vround(vmul(v, vset(1.44269504088896341f)));
  Vec r = vfnma(k, vset(0.693359375f), v);
  r = vfnma(k, vset(-2.12194440e-4f), r);
  Vec p = vset(1.9875691500e-4f);
  p = vfma(p, r, vset(1.3981999507e-3f));
  p = vfma(p, r, vset(8.3334519073e-3f));
  p = vfma(p, r, vset(4.1665795894e-2f));
  p = vfma(p, r, vset(1.6666665459e-1f));
  p = vfma(p, r, vset(5.0000001201e-1f));
  p = vfma(p, vmul(r, r), vadd(r, vset(1.f)));
  return vpow2(p, k);
}

inline void exp_inplace(float* x, int64_t n) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) vstore(x + i, vexp(vload(x + i)));
  for (; i < n; ++i) x[i] = std::exp(x[i]);
}
#else
// No vector extension: one lane, so that kernels written with Vec (prefill_attention.cpp) still build.
using Vec = float;
constexpr int kLanes = 1;
inline Vec vset(float x) { return x; }
inline Vec vload(const float* p) { return *p; }
inline void vstore(float* p, Vec v) { *p = v; }
inline Vec vfma(Vec a, Vec b, Vec c) { return a * b + c; }
inline Vec vmul(Vec a, Vec b) { return a * b; }
inline Vec vzero() { return 0.f; }
inline Vec vadd(Vec a, Vec b) { return a + b; }
inline Vec vsub(Vec a, Vec b) { return a - b; }
inline Vec vmax(Vec a, Vec b) { return std::max(a, b); }
inline Vec vwhere_le(Vec a, Vec b, Vec x, Vec y) { return a <= b ? x : y; }
inline Vec vexp(Vec x) { return std::exp(std::max(x, -87.3f)); }
inline void exp_inplace(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = std::exp(x[i]);
}
#endif

// The largest of n (>= 1) floats; std::max in a loop is a serial chain (it does not vectorize without
// -ffast-math).
inline float max_of(const float* x, int64_t n) {
#ifdef __AVX512F__
  __m512 m = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 mask = n - i >= 16 ? 0xFFFF : (1u << (n - i)) - 1;
    m = _mm512_mask_max_ps(m, mask, m, _mm512_maskz_loadu_ps(mask, x + i));
  }
  return _mm512_reduce_max_ps(m);
#else
  float m = x[0];
  for (int64_t i = 1; i < n; ++i) m = std::max(m, x[i]);
  return m;
#endif
}

}  // namespace llmopt_simd
