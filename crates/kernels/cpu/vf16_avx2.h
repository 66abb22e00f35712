//! 16 f32 lanes as two AVX2 registers (lanes 0-7, 8-15): the vector primitives attn.h is
//! written in, for the AVX2 object. `vf_sum` adds in vf16_avx512.h's order (lane i + lane
//! i + 8, then i + 4, i + 2, i + 1), so the objects compute the same bits.

#include <immintrin.h>

typedef struct {
  __m256 lo, hi;
} vf;

static inline vf vf_zero(void) { return (vf){_mm256_setzero_ps(), _mm256_setzero_ps()}; }
static inline vf vf_set1(float v) { return (vf){_mm256_set1_ps(v), _mm256_set1_ps(v)}; }
static inline vf vf_load(const float* p) { return (vf){_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
static inline vf vf_load_f16(const uint16_t* p) {
  return (vf){_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p)),
              _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(p + 8)))};
}
// bf16 is the top half of an f32: widened exactly by a shift.
static inline __m256 load8_bf16(const uint16_t* p) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p)), 16));
}
static inline vf vf_load_bf16(const uint16_t* p) { return (vf){load8_bf16(p), load8_bf16(p + 8)}; }
// 16 int8 widened to f32 (exact).
static inline __m256 load8_i8(const int8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)p)));
}
static inline vf vf_load_i8(const int8_t* p) { return (vf){load8_i8(p), load8_i8(p + 8)}; }
// 16 FP8 E4M3 codes (mxfp8's values) as f32, each its value v times 2^-8, exactly (as
// vf16_avx512.h's).
static inline __m256 load8_e4m3(const uint8_t* p) {
  const __m128i s = _mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i*)p));
  return _mm256_cvtph_ps(_mm_and_si128(_mm_slli_epi16(s, 7), _mm_set1_epi16((short)0xBF80)));
}
static inline vf vf_load_e4m3(const uint8_t* p) { return (vf){load8_e4m3(p), load8_e4m3(p + 8)}; }
// 16 E8M0 scale bytes e as 2^(e - 119) (e <= 246).
static inline __m256 load8_e8m0(const uint8_t* p) {
  const __m256i e = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(e, _mm256_set1_epi32(8)), 23));
}
static inline vf vf_load_e8m0(const uint8_t* p) { return (vf){load8_e8m0(p), load8_e8m0(p + 8)}; }
// Round to nearest, ties to even, whatever MXCSR says.
// (The mode is a literal: clang takes only a constant expression as the immediate.)
#define VF_NEAREST (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
// Each lane rounded to f16 and back.
static inline vf vf_round_f16(vf v) {
  return (vf){_mm256_cvtph_ps(_mm256_cvtps_ph(v.lo, VF_NEAREST)), _mm256_cvtph_ps(_mm256_cvtps_ph(v.hi, VF_NEAREST))};
}
// Each lane to the nearest integer, ties to even (-0 stays -0).
static inline vf vf_round_even(vf v) {
  return (vf){_mm256_round_ps(v.lo, VF_NEAREST), _mm256_round_ps(v.hi, VF_NEAREST)};
}
// Each lane's magnitude (its sign bit cleared).
static inline vf vf_abs(vf v) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  return (vf){_mm256_andnot_ps(sign, v.lo), _mm256_andnot_ps(sign, v.hi)};
}
static inline void vf_store(float* p, vf v) {
  _mm256_storeu_ps(p, v.lo);
  _mm256_storeu_ps(p + 8, v.hi);
}
static inline vf vf_mul(vf a, vf b) { return (vf){_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
// a * b + c, one rounding.
static inline vf vf_fma(vf a, vf b, vf c) {
  return (vf){_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
}
static inline vf vf_add(vf a, vf b) { return (vf){_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
// 2^n in each lane, for integral n in [-126, 127].
static inline __m256 pow2i8(__m256 n) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23));
}
static inline vf vf_pow2i(vf n) { return (vf){pow2i8(n.lo), pow2i8(n.hi)}; }
// y where x is not below lim (NaN included), else 0.
static inline vf vf_zero_below(vf x, float lim, vf y) {
  const __m256 l = _mm256_set1_ps(lim);
  return (vf){_mm256_and_ps(_mm256_cmp_ps(x.lo, l, _CMP_NLT_UQ), y.lo),
              _mm256_and_ps(_mm256_cmp_ps(x.hi, l, _CMP_NLT_UQ), y.hi)};
}
static inline float vf_sum(vf v) {
  const __m256 s8 = _mm256_add_ps(v.lo, v.hi);
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

// out[j] = vf_sum(v[j]) for 16 vectors at once: the same additions, pairs of vectors sharing
// each instruction after the first step.
static inline void vf_sum16(const vf v[16], float out[16]) {
  __m256 a[16], b[8], c[4];
  for (int j = 0; j < 16; ++j) a[j] = _mm256_add_ps(v[j].lo, v[j].hi);  // lane i + lane i + 8
  for (int m = 0; m < 8; ++m)  // + i + 4: v[2m] in lanes 0-3, v[2m + 1] in 4-7
    b[m] = _mm256_add_ps(_mm256_permute2f128_ps(a[2 * m], a[2 * m + 1], 0x20),
                         _mm256_permute2f128_ps(a[2 * m], a[2 * m + 1], 0x31));
  for (int p = 0; p < 4; ++p)  // + i + 2: half h holds v[4p + h] (lanes 0-1), v[4p + 2 + h]
    c[p] = _mm256_add_ps(_mm256_shuffle_ps(b[2 * p], b[2 * p + 1], 0x44),
                         _mm256_shuffle_ps(b[2 * p], b[2 * p + 1], 0xEE));
  // + i + 1: lane 4h + s holds the sum of v[8q + 2s + h].
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int q = 0; q < 2; ++q) {
    const __m256 d = _mm256_add_ps(_mm256_shuffle_ps(c[2 * q], c[2 * q + 1], 0x88),
                                   _mm256_shuffle_ps(c[2 * q], c[2 * q + 1], 0xDD));
    _mm256_storeu_ps(out + 8 * q, _mm256_permutevar8x32_ps(d, order));
  }
}

// The largest lane (exact, so any order).
static inline float vf_max_lane(vf v) {
  const __m256 m8 = _mm256_max_ps(v.lo, v.hi);
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m8), _mm256_extractf128_ps(m8, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  return _mm_cvtss_f32(_mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1)));
}
