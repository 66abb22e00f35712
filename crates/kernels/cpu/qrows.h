//! Packed-row lookup (embedding rows of an MLX 3-, 4-, 6- or 8-bit or FP4 table, dequantized to f32),
//! shared by every kernel object: it is scalar apart from the f16 conversion (F16C on x86-64,
//! `fcvt` on aarch64), so each ISA's file includes the one copy. Layout as in those files
//! (16-row blocks, 32-byte tiles; scales and biases [O / 16][K / group_size][16]). Each value
//! is fma(scale, q, bias), one rounding, on every object.

#include <stddef.h>
#include <stdint.h>

#if defined(__aarch64__)
static inline float f16_to_f32(uint16_t h) {
  __fp16 v;
  __builtin_memcpy(&v, &h, 2);
  return (float)v;
}
#else
#include <immintrin.h>
static inline float f16_to_f32(uint16_t h) {
  return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
}
#endif

// An E8M0 scale byte as qmv.h reads it: s / 2 = 2^(e - 128).
static inline float e8m0_half(uint8_t e) {
  const uint32_t bits = ((uint32_t)e + 64) << 23;
  float wide;
  __builtin_memcpy(&wide, &bits, 4);
  return wide * E8M0_HALF;
}

// Value k of row `lane` of a block's tiles at `wb` (qmv.h's layouts): the code as stored.
static inline unsigned packed_value(int bits, const uint8_t* wb, size_t lane, size_t k) {
  if (bits == 4) {
    const uint8_t byte = wb[(k / 4) * 32 + 2 * lane + (k % 2)];
    return (k % 4) < 2 ? (byte & 0xF) : (byte >> 4);
  }
  if (bits == 8) return wb[(k / 2) * 32 + 2 * lane + (k % 2)];
  const size_t p = k % 2, l = 2 * lane + p;
  if (bits == 3) {
    // 32 k a unit: word lane l of its three planes is one 48-bit stream, value (k % 32) / 2
    // at bits 3 * that.
    const uint8_t* u = wb + (k / 32) * 192 + 2 * l;
    uint64_t stream = 0;
    for (int m = 0; m < 3; ++m) stream |= (uint64_t)(u[64 * m] | u[64 * m + 1] << 8) << (16 * m);
    return (unsigned)(stream >> (3 * ((k % 32) / 2))) & 7u;
  }
  // 6 bits: 8 k a unit; s picks the value among the unit's four of (lane, p).
  const size_t s = (k % 8) / 2;
  const uint8_t* u = wb + (k / 8) * 96;
  const uint8_t nib = u[(s / 2) * 32 + l];
  return ((s % 2) ? (nib >> 4) : (nib & 0xFu)) | (((u[64 + l] >> (2 * s)) & 3u) << 4);
}

// Rows [t0, t1) of `ids` of a packed table (embedding lookup), dequantized to f32 out[T, K]:
// each value fma(scale, q, bias), with `fp4` q an E2M1 code's 2v + 12 and bias -12 * scale
// (qmv.h's FP4 values).
static inline __attribute__((always_inline)) void qrows_body(int bits, int fp4, int f16, const int32_t* ids,
                                                            const uint8_t* w, const void* sc, const void* bi,
                                                            float* out, size_t T, size_t K, size_t O, size_t GS,
                                                            size_t t0, size_t t1) {
  static const uint8_t fp4_table[16] = {FP4_TABLE};
  const size_t G = K / GS, block_bytes = K * bits * 16 / 8;
  if (t1 > T) t1 = T;
  for (size_t t = t0; t < t1; ++t) {
    size_t row = (size_t)(uint32_t)ids[t];
    if (row >= O) row = O - 1; /* as a StableHLO gather clamps */
    const size_t rb = row / 16, lane = row % 16;
    const uint8_t* wb = w + rb * block_bytes;
    for (size_t k = 0; k < K; ++k) {
      unsigned q = packed_value(bits, wb, lane, k);
      if (fp4) q = fp4_table[q];
      const size_t gi = (rb * G + k / GS) * 16 + lane;
      const float s = f16 == 2 ? e8m0_half(((const uint8_t*)sc)[gi])
                      : f16    ? f16_to_f32(((const uint16_t*)sc)[gi])
                               : ((const float*)sc)[gi];
      const float b = fp4 ? s * FP4_BIAS : f16 ? f16_to_f32(((const uint16_t*)bi)[gi]) : ((const float*)bi)[gi];
      out[t * K + k] = __builtin_fmaf(s, (float)q, b);
    }
  }
}

#define QROWS(NAME, BITS, F16, STYPE)                                                                  \
  void NAME(const int32_t* ids, size_t ids_off, const uint8_t* w, size_t w_off, const STYPE* sc,       \
            size_t s_off, const STYPE* bi, size_t b_off, float* out, size_t out_off, size_t T, size_t K, \
            size_t O, size_t GS, size_t t0, size_t t1) {                                               \
    qrows_body(BITS, 0, F16, ids + ids_off, w + w_off, sc + s_off, bi + b_off, out + out_off, T, K, O, GS, \
               t0, t1);                                                                                \
  }
#define QROWS_FP4(NAME, F16, STYPE)                                                                    \
  void NAME(const int32_t* ids, size_t ids_off, const uint8_t* w, size_t w_off, const STYPE* sc,       \
            size_t s_off, float* out, size_t out_off, size_t T, size_t K, size_t O, size_t GS, size_t t0, \
            size_t t1) {                                                                               \
    qrows_body(4, 1, F16, ids + ids_off, w + w_off, sc + s_off, sc + s_off, out + out_off, T, K, O, GS, t0, \
               t1);                                                                                    \
  }

QROWS(mlx_iree_qrows4_f16, 4, 1, uint16_t)
QROWS(mlx_iree_qrows4_f32, 4, 0, float)
QROWS(mlx_iree_qrows8_f16, 8, 1, uint16_t)
QROWS(mlx_iree_qrows8_f32, 8, 0, float)
QROWS(mlx_iree_qrows3_f16, 3, 1, uint16_t)
QROWS(mlx_iree_qrows3_f32, 3, 0, float)
QROWS(mlx_iree_qrows6_f16, 6, 1, uint16_t)
QROWS(mlx_iree_qrows6_f32, 6, 0, float)
QROWS_FP4(mlx_iree_qrowsfp4_f16, 1, uint16_t)
QROWS_FP4(mlx_iree_qrowsfp4_f32, 0, float)
QROWS_FP4(mlx_iree_qrowsfp4_e8m0, 2, uint8_t)
