// Sixteen floats at a time, for the layer stack (decoder.cpp): one AVX-512 register with a
// 16-bit lane mask, or two AVX2 registers with the same mask taken apart. Each function is the
// AVX-512 intrinsic of the same name; the AVX2 forms compute the same values lane by lane (the
// horizontal sums add in another order, which is fixed, so results stay batch invariant).
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace v16 {

#if defined(__AVX512F__) && !defined(SPECCHAT_VNNI256)

using Vec = __m512;
using Mask = __mmask16;

inline Vec set1(float x) { return _mm512_set1_ps(x); }
inline Vec zero() { return _mm512_setzero_ps(); }
inline Vec load(Mask m, const float* p) { return _mm512_maskz_loadu_ps(m, p); }
inline void store(float* p, Mask m, Vec v) { _mm512_mask_storeu_ps(p, m, v); }
inline Vec add(Vec a, Vec b) { return _mm512_add_ps(a, b); }
inline Vec sub(Vec a, Vec b) { return _mm512_sub_ps(a, b); }
inline Vec mul(Vec a, Vec b) { return _mm512_mul_ps(a, b); }
inline Vec div(Vec a, Vec b) { return _mm512_div_ps(a, b); }
inline Vec fmadd(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
inline Vec max(Vec a, Vec b) { return _mm512_max_ps(a, b); }
inline Vec abs(Vec a) { return _mm512_abs_ps(a); }
inline Vec round(Vec a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
inline Vec scalef(Vec a, Vec whole) { return _mm512_scalef_ps(a, whole); }  // a * 2^whole
inline Vec maskz_mov(Mask m, Vec a) { return _mm512_maskz_mov_ps(m, a); }
inline Vec mask_mul(Vec src, Mask m, Vec a, Vec b) { return _mm512_mask_mul_ps(src, m, a, b); }
inline Vec mask_max(Vec src, Mask m, Vec a, Vec b) { return _mm512_mask_max_ps(src, m, a, b); }
inline Mask less_than(Vec a, Vec b) { return _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ); }
// 16 float16 values widened to float (lanes outside m read as zero, and are not read)
inline Vec load_half(Mask m, const uint16_t* p) { return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p)); }
inline float reduce_max(Vec a) { return _mm512_reduce_max_ps(a); }
inline float reduce_add(Vec a) { return _mm512_reduce_add_ps(a); }

#else  // AVX2

struct Vec {
  __m256 lo, hi;  // lanes 0-7, 8-15
};
using Mask = uint16_t;

// Lanes 8 * half .. 8 * half + 7 of a mask as an all-ones/zero vector per lane.
inline __m256i half_mask(Mask m, int half) {
  const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  return _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32((m >> (8 * half)) & 0xFF), bit), bit);
}
template <typename F>
inline Vec each(Vec a, Vec b, F f) { return {f(a.lo, b.lo), f(a.hi, b.hi)}; }

inline Vec set1(float x) { return {_mm256_set1_ps(x), _mm256_set1_ps(x)}; }
inline Vec zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
inline Vec load(Mask m, const float* p) { return {_mm256_maskload_ps(p, half_mask(m, 0)), _mm256_maskload_ps(p + 8, half_mask(m, 1))}; }
inline void store(float* p, Mask m, Vec v) {
  _mm256_maskstore_ps(p, half_mask(m, 0), v.lo);
  _mm256_maskstore_ps(p + 8, half_mask(m, 1), v.hi);
}
inline Vec add(Vec a, Vec b) { return each(a, b, [](__m256 x, __m256 y) { return _mm256_add_ps(x, y); }); }
inline Vec sub(Vec a, Vec b) { return each(a, b, [](__m256 x, __m256 y) { return _mm256_sub_ps(x, y); }); }
inline Vec mul(Vec a, Vec b) { return each(a, b, [](__m256 x, __m256 y) { return _mm256_mul_ps(x, y); }); }
inline Vec div(Vec a, Vec b) { return each(a, b, [](__m256 x, __m256 y) { return _mm256_div_ps(x, y); }); }
inline Vec max(Vec a, Vec b) { return each(a, b, [](__m256 x, __m256 y) { return _mm256_max_ps(x, y); }); }
inline Vec fmadd(Vec a, Vec b, Vec c) { return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)}; }
inline Vec abs(Vec a) { return each(a, set1(-0.f), [](__m256 x, __m256 sign) { return _mm256_andnot_ps(sign, x); }); }
inline Vec round(Vec a) {
  return each(a, a, [](__m256 x, __m256) { return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); });
}
// a * 2^whole for integral whole in [-126, 127] (the exponent field built directly)
inline Vec scalef(Vec a, Vec whole) {
  return each(a, whole, [](__m256 x, __m256 w) {
    const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(w), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(x, _mm256_castsi256_ps(bits));
  });
}
inline Vec maskz_mov(Mask m, Vec a) {
  return {_mm256_and_ps(a.lo, _mm256_castsi256_ps(half_mask(m, 0))), _mm256_and_ps(a.hi, _mm256_castsi256_ps(half_mask(m, 1)))};
}
inline Vec blend(Vec src, Mask m, Vec a) {
  return {_mm256_blendv_ps(src.lo, a.lo, _mm256_castsi256_ps(half_mask(m, 0))),
          _mm256_blendv_ps(src.hi, a.hi, _mm256_castsi256_ps(half_mask(m, 1)))};
}
inline Vec mask_mul(Vec src, Mask m, Vec a, Vec b) { return blend(src, m, mul(a, b)); }
inline Vec mask_max(Vec src, Mask m, Vec a, Vec b) { return blend(src, m, max(a, b)); }
inline Mask less_than(Vec a, Vec b) {
  const int lo = _mm256_movemask_ps(_mm256_cmp_ps(a.lo, b.lo, _CMP_LT_OQ));
  const int hi = _mm256_movemask_ps(_mm256_cmp_ps(a.hi, b.hi, _CMP_LT_OQ));
  return static_cast<Mask>(lo | (hi << 8));
}
inline Vec load_half(Mask m, const uint16_t* p) {
  if (m != 0xFFFF) {  // the lanes in m through a buffer, no read past them
    alignas(32) uint16_t lanes[16] = {};
    for (int i = 0; i < 16; ++i) lanes[i] = (m >> i & 1) ? p[i] : 0;
    return load_half(0xFFFF, lanes);
  }
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return {_mm256_cvtph_ps(_mm256_castsi256_si128(h)), _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1))};
}
inline float horizontal(__m256 v, __m128 (*op)(__m128, __m128)) {
  __m128 x = op(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = op(x, _mm_movehl_ps(x, x));
  return _mm_cvtss_f32(op(x, _mm_movehdup_ps(x)));
}
inline float reduce_max(Vec a) { return horizontal(_mm256_max_ps(a.lo, a.hi), [](__m128 x, __m128 y) { return _mm_max_ps(x, y); }); }
inline float reduce_add(Vec a) { return horizontal(_mm256_add_ps(a.lo, a.hi), [](__m128 x, __m128 y) { return _mm_add_ps(x, y); }); }

#endif

}  // namespace v16
