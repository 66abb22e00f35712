//! Fused dequantize + matrix-vector product for MLX affine 3-, 4-, 6- and 8-bit and FP4 weights (AVX2).
//!
//! The AVX2 + FMA + F16C twin of qmv_x86_64.c: the same exported functions, signatures,
//! layouts and driver (qmv.h), and the same numerics, so one MLIR declaration serves both
//! objects and their results are bit-identical: each group of x is quantized to i16 against
//! its largest magnitude, the integer dot products are exact (`vpmaddwd` + `vpaddd` where
//! the AVX-512 file has `vpdpwssd`), and scale, bias and x's scale apply in f32 once per
//! group, in the same order. Zero-extending one 16-byte half of a 32-byte tile to i16 gives 8
//! rows x one pair of k, which `vpmaddwd` multiplies with the broadcast pair of x; a block's
//! two halves are computed one after the other, so the accumulators of 8 rows of x fit the
//! 16 ymm registers. One row of x (decode) takes both halves in one pass instead, a sixth
//! fewer instructions per tile (20 against 24 at 4-bit, GCC 12).

#include <immintrin.h>

// 3-bit groups are read as stored (half_dot3, tile_dot3_1); 6-bit ones widened to 8-bit tiles.
#define GROUP_ROWS_3 1
#include "qmv.h"

static inline __m256 load8_f16(const void* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p));
}
static inline __m256 load8_f32(const void* p) { return _mm256_loadu_ps((const float*)p); }
// Scales 8h .. 8h + 7 of type `f16` (qmv.h: 0 f32, 1 f16, 2 E8M0 bytes, read as 2^(e - 128)).
static inline __m256 load8_scale(int f16, const void* p, size_t h) {
  if (f16 == 2) {
    const __m256i e = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)((const uint8_t*)p + 8 * h)));
    const __m256 wide = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(e, _mm256_set1_epi32(64)), 23));
    return _mm256_mul_ps(wide, _mm256_set1_ps(E8M0_HALF));
  }
  return f16 ? load8_f16((const uint16_t*)p + 8 * h) : load8_f32((const float*)p + 8 * h);
}

// `b` (x8's bytes) is not read here: this object's products take the i16 values.
static inline void quantize_group(const float* xg, size_t gs, float levels, int16_t* q, int8_t* b, float* scale,
                                  float* sum) {
  (void)b;
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 amax = _mm256_setzero_ps(), lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
  for (size_t k = 0; k < gs; k += 16) {
    const __m256 v0 = _mm256_loadu_ps(xg + k), v1 = _mm256_loadu_ps(xg + k + 8);
    amax = _mm256_max_ps(amax, _mm256_max_ps(_mm256_andnot_ps(sign, v0), _mm256_andnot_ps(sign, v1)));
    lo = _mm256_add_ps(lo, v0);
    hi = _mm256_add_ps(hi, v1);
  }
  // Summed in the order of the AVX-512 file's 16 lanes and _mm512_reduce_add_ps (lane j
  // plus lane j + 8, then halves), so both objects compute the same bits.
  const __m256 s8 = _mm256_add_ps(hi, lo);
  const __m128 s4 = _mm_add_ps(_mm256_extractf128_ps(s8, 1), _mm256_castps256_ps128(s8));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  *sum = _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
  __m128 m4 = _mm_max_ps(_mm256_extractf128_ps(amax, 1), _mm256_castps256_ps128(amax));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  const float m = _mm_cvtss_f32(_mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1)));
  *scale = m / levels;
  const __m256 inv = _mm256_set1_ps(m > 0.0f ? levels / m : 0.0f);
  for (size_t k = 0; k < gs; k += 16) {
    // Round to nearest even (the default MXCSR mode); |value| <= 32767, so the saturating
    // pack is exact. packs interleaves 128-bit lanes; the permute puts k back in order.
    const __m256i r0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xg + k), inv));
    const __m256i r1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xg + k + 8), inv));
    _mm256_store_si256((__m256i*)(q + k), _mm256_permute4x64_epi64(_mm256_packs_epi32(r0, r1), 0xD8));
  }
}

// The 16 bytes of 8 rows' 4-bit tile half at `p` as i16 values: q[r, k0 + p] in `*l` and
// q[r, k0 + 2 + p] in `*h`; with `fp4`, each nibble an E2M1 code looked up in FP4_TABLE
// (`vpshufb`, before widening).
static inline __attribute__((always_inline)) void nibbles(int fp4, const uint8_t* p, __m256i* l, __m256i* h) {
  const __m128i b = _mm_loadu_si128((const __m128i*)p);
  if (fp4) {
    const __m128i table = _mm_setr_epi8(FP4_TABLE), low = _mm_set1_epi8(0xF);
    *l = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(table, _mm_and_si128(b, low)));
    *h = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16(b, 4), low)));
  } else {
    const __m256i v = _mm256_cvtepu8_epi16(b);
    *l = _mm256_and_si256(v, _mm256_set1_epi16(0xF));
    *h = _mm256_srli_epi16(v, 4);
  }
}

// sum_k q[r, k] * xq[i][k] over one group, for one half of a block (8 rows; `wg` points at
// that half of the group's first tile) and n rows of x.
// 4-bit tiles: byte 2r + p holds q[r, k0 + p] (low nibble) and q[r, k0 + 2 + p] (high).
static inline __attribute__((always_inline)) void half_dot4(int fp4, const uint8_t* wg,
                                                            const int16_t (*xq)[MAX_GROUP], size_t n, size_t gs,
                                                            __m256i acc[PANEL]) {
  for (size_t i = 0; i < n; ++i) acc[i] = _mm256_setzero_si256();
  for (size_t k = 0; k < gs; k += 4, wg += 32) {
    __m256i l, h;
    nibbles(fp4, wg, &l, &h);
    for (size_t i = 0; i < n; ++i) {
      const __m256i p0 = _mm256_set1_epi32(pair_of(xq[i], k)), p2 = _mm256_set1_epi32(pair_of(xq[i], k + 2));
      acc[i] = _mm256_add_epi32(acc[i], _mm256_add_epi32(_mm256_madd_epi16(l, p0), _mm256_madd_epi16(h, p2)));
    }
  }
}

// 8-bit tiles: 16 rows x 2 k; byte 2r + p holds q[r, k0 + p]. Two tiles per step.
static inline __attribute__((always_inline)) void half_dot8(const uint8_t* wg, const int16_t (*xq)[MAX_GROUP],
                                                            size_t n, size_t gs, __m256i acc[PANEL]) {
  for (size_t i = 0; i < n; ++i) acc[i] = _mm256_setzero_si256();
  for (size_t k = 0; k < gs; k += 4, wg += 64) {
    const __m256i v0 = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i*)wg));
    const __m256i v1 = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i*)(wg + 32)));
    for (size_t i = 0; i < n; ++i) {
      const __m256i p0 = _mm256_set1_epi32(pair_of(xq[i], k)), p2 = _mm256_set1_epi32(pair_of(xq[i], k + 2));
      acc[i] = _mm256_add_epi32(acc[i], _mm256_add_epi32(_mm256_madd_epi16(v0, p0), _mm256_madd_epi16(v1, p2)));
    }
  }
}

// Value s of each word lane of a 3-bit unit half's planes w0, w1, w2 (qmv.h: bits 3s..3s+2 of
// the lane's 48-bit stream; s = 5 and 10 straddle two words). In-lane shifts and masks only.
static inline __attribute__((always_inline)) __m256i value3(__m256i w0, __m256i w1, __m256i w2, int s) {
  const __m256i seven = _mm256_set1_epi16(7);
  const int at = 3 * s;
  if (at + 3 <= 16) return _mm256_and_si256(_mm256_srli_epi16(w0, at), seven);
  if (at < 16) return _mm256_and_si256(_mm256_or_si256(_mm256_srli_epi16(w0, at), _mm256_slli_epi16(w1, 16 - at)), seven);
  if (at + 3 <= 32) return _mm256_and_si256(_mm256_srli_epi16(w1, at - 16), seven);
  if (at < 32) {
    return _mm256_and_si256(_mm256_or_si256(_mm256_srli_epi16(w1, at - 16), _mm256_slli_epi16(w2, 32 - at)), seven);
  }
  if (at + 3 < 48) return _mm256_and_si256(_mm256_srli_epi16(w2, at - 32), seven);
  return _mm256_srli_epi16(w2, at - 32);  // the top 3 bits: nothing above to mask
}

// 3-bit units (qmv.h: 16 rows x 32 k, three planes of 32 words) read as stored, for one half
// of a block (8 rows; `wg` points at that half's 32 bytes of the group's first unit's first
// plane): its 16 word lanes of each plane are one ymm, and value s is the pair of k + 2s its
// lanes' rows take, as the 4-bit tiles' halves give them (the same exact sums).
static inline __attribute__((always_inline)) void half_dot3(const uint8_t* wg, const int16_t (*xq)[MAX_GROUP],
                                                            size_t n, size_t gs, __m256i acc[PANEL]) {
  for (size_t i = 0; i < n; ++i) acc[i] = _mm256_setzero_si256();
  for (size_t k = 0; k < gs; k += 32, wg += 192) {
    const __m256i w0 = _mm256_loadu_si256((const __m256i*)wg), w1 = _mm256_loadu_si256((const __m256i*)(wg + 64)),
                  w2 = _mm256_loadu_si256((const __m256i*)(wg + 128));
#pragma GCC unroll 8  // value3's shifts and branches are constants only when unrolled
    for (int s = 0; s < 16; s += 2) {
      const __m256i v0 = value3(w0, w1, w2, s), v1 = value3(w0, w1, w2, s + 1);
      for (size_t i = 0; i < n; ++i) {
        const __m256i p0 = _mm256_set1_epi32(pair_of(xq[i], k + 2 * s));
        const __m256i p1 = _mm256_set1_epi32(pair_of(xq[i], k + 2 * s + 2));
        acc[i] = _mm256_add_epi32(acc[i], _mm256_add_epi32(_mm256_madd_epi16(v0, p0), _mm256_madd_epi16(v1, p1)));
      }
    }
  }
}

// One row of x and 3-bit units, both halves in one pass (as tile_dot_1).
static inline __attribute__((always_inline)) void tile_dot3_1(const uint8_t* wg, const int16_t* xq, size_t gs,
                                                              __m256i acc[2]) {
  __m256i a0 = _mm256_setzero_si256(), a1 = _mm256_setzero_si256();
  for (size_t k = 0; k < gs; k += 32, wg += 192) {
#define PLANE(m, h) _mm256_loadu_si256((const __m256i*)(wg + 64 * (m) + 32 * (h)))
    const __m256i l0 = PLANE(0, 0), l1 = PLANE(1, 0), l2 = PLANE(2, 0);
    const __m256i h0 = PLANE(0, 1), h1 = PLANE(1, 1), h2 = PLANE(2, 1);
#undef PLANE
#pragma GCC unroll 16
    for (int s = 0; s < 16; ++s) {
      const __m256i p = _mm256_set1_epi32(pair_of(xq, k + 2 * s));
      a0 = _mm256_add_epi32(a0, _mm256_madd_epi16(value3(l0, l1, l2, s), p));
      a1 = _mm256_add_epi32(a1, _mm256_madd_epi16(value3(h0, h1, h2, s), p));
    }
  }
  acc[0] = a0;
  acc[1] = a1;
}

// One row of x (decode), both halves of each tile in one pass: the pair of x is broadcast
// once for the block's 16 rows, and the loop runs once per tile, not twice. `acc[h]` gets
// half h's rows (the same exact sums as half_dot4 and half_dot8 with n = 1).
static inline __attribute__((always_inline)) void tile_dot_1(int bits, int fp4, const uint8_t* wg,
                                                             const int16_t* xq, size_t gs, __m256i acc[2]) {
  __m256i a0 = _mm256_setzero_si256(), a1 = _mm256_setzero_si256();
  for (size_t k = 0; k < gs; k += 4) {
    const __m256i p0 = _mm256_set1_epi32(pair_of(xq, k)), p2 = _mm256_set1_epi32(pair_of(xq, k + 2));
    if (bits == 4) {
      __m256i l0, h0, l1, h1;
      nibbles(fp4, wg, &l0, &h0);
      nibbles(fp4, wg + 16, &l1, &h1);
      a0 = _mm256_add_epi32(a0, _mm256_add_epi32(_mm256_madd_epi16(l0, p0), _mm256_madd_epi16(h0, p2)));
      a1 = _mm256_add_epi32(a1, _mm256_add_epi32(_mm256_madd_epi16(l1, p0), _mm256_madd_epi16(h1, p2)));
      wg += 32;
    } else {
      const __m256i v0 = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i*)wg));
      const __m256i v1 = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i*)(wg + 16)));
      const __m256i v2 = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i*)(wg + 32)));
      const __m256i v3 = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i*)(wg + 48)));
      a0 = _mm256_add_epi32(a0, _mm256_add_epi32(_mm256_madd_epi16(v0, p0), _mm256_madd_epi16(v2, p2)));
      a1 = _mm256_add_epi32(a1, _mm256_add_epi32(_mm256_madd_epi16(v1, p0), _mm256_madd_epi16(v3, p2)));
      wg += 64;
    }
  }
  acc[0] = a0;
  acc[1] = a1;
}

static inline __attribute__((always_inline)) void group_rows(int bits, int fp4, int f16, const uint8_t* wg,
                                                             const xview_t* xp, size_t i, size_t n, size_t gs,
                                                             const void* s, const void* b, float* y, size_t stride) {
  __m256i one[2];
  if (n == 1 && bits == 3) {
    tile_dot3_1(wg, xp->q[i], gs, one);
  } else if (n == 1) {
    tile_dot_1(bits, fp4, wg, xp->q[i], gs, one);
  }
  for (size_t h = 0; h < 2; ++h) {
    __m256i a[PANEL];
    if (n == 1) {
      a[0] = one[h];
    } else if (bits == 3) {
      half_dot3(wg + 32 * h, xp->q + i, n, gs, a);
    } else if (bits == 4) {
      half_dot4(fp4, wg + 16 * h, xp->q + i, n, gs, a);
    } else {
      half_dot8(wg + 16 * h, xp->q + i, n, gs, a);
    }
    // Loaded after the dot loop, which wants every register.
    const __m256 sh = load8_scale(f16, s, h);
    const __m256 bh = fp4 ? _mm256_mul_ps(sh, _mm256_set1_ps(FP4_BIAS)) : load8_scale(f16, b, h);
    for (size_t j = 0; j < n; ++j) {
      const __m256 dx = _mm256_set1_ps(xp->scale[i + j]), xs = _mm256_set1_ps(xp->sum[i + j]);
      float* yr = y + j * stride + 8 * h;
      const __m256 dot = _mm256_mul_ps(_mm256_cvtepi32_ps(a[j]), dx);
      _mm256_storeu_ps(yr, _mm256_fmadd_ps(bh, xs, _mm256_fmadd_ps(sh, dot, _mm256_loadu_ps(yr))));
    }
  }
}

#include "qrows.h"
#include "vf16_avx2.h"
#include "attn.h"
// One state row of 128 floats fills the 16 ymm registers; four side by side, partly on the stack, still ran
// 1.8x as fast as one over a prompt chunk, and decode 2x (their chains of dependent operations overlap).
#define DELTA_STATE_VF 32
#include "delta.h"
#include "hmv.h"
