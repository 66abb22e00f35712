//! 16 f32 lanes as one AVX-512 register: the vector primitives attn.h is written in (the
//! AVX-512 and AMX objects). Lane i is element i of the 16 loaded; `vf_sum` adds lane i to
//! lane i + 8, then i + 4, i + 2 and i + 1, as every object's twin does, so sums are the
//! same bits everywhere.

#include <immintrin.h>

typedef __m512 vf;

static inline vf vf_zero(void) { return _mm512_setzero_ps(); }
static inline vf vf_set1(float v) { return _mm512_set1_ps(v); }
static inline vf vf_load(const float* p) { return _mm512_loadu_ps(p); }
static inline vf vf_load_f16(const uint16_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p)); }
// bf16 is the top half of an f32: widened exactly by a shift.
static inline vf vf_load_bf16(const uint16_t* p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
}
// 16 int8 widened to f32 (exact).
static inline vf vf_load_i8(const int8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)p)));
}
static inline void vf_store(float* p, vf v) { _mm512_storeu_ps(p, v); }
// 16 FP8 E4M3 codes (mxfp8's values) as f32, each its value v times 2^-8, exactly: the
// code's sign-extended bits shifted into an f16's sign, exponent and mantissa (E4M3's bias
// is 7, f16's 15; E4M3's subnormals land on f16's).
static inline vf vf_load_e4m3(const uint8_t* p) {
  const __m256i s = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)p));
  return _mm512_cvtph_ps(_mm256_and_si256(_mm256_slli_epi16(s, 7), _mm256_set1_epi16((short)0xBF80)));
}
// 16 E8M0 scale bytes e as 2^(e - 119) (e <= 246): the scale 2^(e - 127) times the 2^8
// vf_load_e4m3 leaves out.
static inline vf vf_load_e8m0(const uint8_t* p) {
  const __m512i e = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(e, _mm512_set1_epi32(8)), 23));
}
// Each lane rounded to f16 (nearest, ties to even) and back.
static inline vf vf_round_f16(vf v) {
  return _mm512_cvtph_ps(_mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
// Each lane to the nearest integer, ties to even (-0 stays -0).
static inline vf vf_round_even(vf v) { return _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
// Each lane's magnitude (its sign bit cleared).
static inline vf vf_abs(vf v) { return _mm512_abs_ps(v); }
static inline vf vf_mul(vf a, vf b) { return _mm512_mul_ps(a, b); }
// a * b + c, one rounding.
static inline vf vf_fma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
static inline vf vf_add(vf a, vf b) { return _mm512_add_ps(a, b); }
// 2^n in each lane, for integral n in [-126, 127].
static inline vf vf_pow2i(vf n) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(n), _mm512_set1_epi32(127)), 23));
}
// y where x is not below lim (NaN included), else 0.
static inline vf vf_zero_below(vf x, float lim, vf y) {
  return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(lim), _CMP_NLT_UQ), y);
}
static inline float vf_sum(vf v) {
  const __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

// out[j] = vf_sum(v[j]) for 16 vectors at once: the same additions, pairs of vectors
// sharing each instruction (lanes end up in the order lane 4q + s = sum of v[4s + q]).
static inline void vf_sum16(const vf v[16], float out[16]) {
  __m512 w[8], z[4], u[2];
  for (int k = 0; k < 8; ++k)  // lane i + lane i + 8 of v[2k] (lanes 0-7) and v[2k + 1] (8-15)
    w[k] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * k], v[2 * k + 1], 0x44),
                         _mm512_shuffle_f32x4(v[2 * k], v[2 * k + 1], 0xEE));
  for (int m = 0; m < 4; ++m)  // + i + 4: quarter t holds v[4m + t]
    z[m] = _mm512_add_ps(_mm512_shuffle_f32x4(w[2 * m], w[2 * m + 1], 0x88),
                         _mm512_shuffle_f32x4(w[2 * m], w[2 * m + 1], 0xDD));
  for (int p = 0; p < 2; ++p)  // + i + 2: quarter q holds v[8p + q] (lanes 0-1), v[8p + 4 + q]
    u[p] = _mm512_add_ps(_mm512_shuffle_ps(z[2 * p], z[2 * p + 1], 0x44),
                         _mm512_shuffle_ps(z[2 * p], z[2 * p + 1], 0xEE));
  // + i + 1: lane 4q + s holds the sum of v[4s + q].
  const __m512 r = _mm512_add_ps(_mm512_shuffle_ps(u[0], u[1], 0x88), _mm512_shuffle_ps(u[0], u[1], 0xDD));
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  _mm512_storeu_ps(out, _mm512_permutexvar_ps(order, r));
}

// The largest lane (exact, so any order).
static inline float vf_max_lane(vf v) { return _mm512_reduce_max_ps(v); }
