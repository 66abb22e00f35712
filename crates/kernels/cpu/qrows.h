//! Packed-row lookup (embedding rows of an MLX 4- or 8-bit table, dequantized to f32),
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

// Rows `ids` of a packed table (embedding lookup), dequantized to f32 out[T, K].
// Computes rows [t0, t1).
#define QROWS(NAME, BITS, STYPE, TOF32)                                                           \
  void NAME(const int32_t* ids, size_t ids_off, const uint8_t* w, size_t w_off, const STYPE* sc,  \
            size_t s_off, const STYPE* bi, size_t b_off, float* out, size_t out_off, size_t T,    \
            size_t K, size_t O, size_t GS, size_t t0, size_t t1) {                                \
    ids += ids_off; w += w_off; sc += s_off; bi += b_off; out += out_off;                         \
    const size_t G = K / GS, block_bytes = K * BITS * 16 / 8;                                     \
    if (t1 > T) t1 = T;                                                                           \
    for (size_t t = t0; t < t1; ++t) {                                                            \
      size_t row = (size_t)(uint32_t)ids[t];                                                      \
      if (row >= O) row = O - 1; /* as a StableHLO gather clamps */                               \
      const size_t rb = row / 16, lane = row % 16;                                                \
      const uint8_t* wb = w + rb * block_bytes;                                                   \
      for (size_t k = 0; k < K; ++k) {                                                            \
        unsigned q;                                                                               \
        if (BITS == 4) {                                                                          \
          const uint8_t byte = wb[(k / 4) * 32 + 2 * lane + (k % 2)];                             \
          q = (k % 4) < 2 ? (byte & 0xF) : (byte >> 4);                                           \
        } else {                                                                                  \
          q = wb[(k / 2) * 32 + 2 * lane + (k % 2)];                                              \
        }                                                                                         \
        const size_t gi = (rb * G + k / GS) * 16 + lane;                                          \
        out[t * K + k] = __builtin_fmaf(TOF32(sc[gi]), (float)q, TOF32(bi[gi]));                  \
      }                                                                                           \
    }                                                                                             \
  }

static inline float f32_id(float v) { return v; }

QROWS(mlx_iree_qrows4_f16, 4, uint16_t, f16_to_f32)
QROWS(mlx_iree_qrows4_f32, 4, float, f32_id)
QROWS(mlx_iree_qrows8_f16, 8, uint16_t, f16_to_f32)
QROWS(mlx_iree_qrows8_f32, 8, float, f32_id)
