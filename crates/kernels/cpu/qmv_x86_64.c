//! Fused dequantize + matrix-vector product for MLX affine 4- and 8-bit weights (AVX-512).
//!
//! Linked into IREE's embedded ELF executables (freestanding: no libc, no globals). Each
//! function computes a range of 16-row blocks of y[T, O] = x[T, K] . W^T, where
//! W[o, k] = scale[o, g] * q[o, k] + bias[o, g] with g = k / group_size, in f32.
//! The layouts are written by crates/kernels/src/lib.rs (`repack`); the two must agree.
//!
//! Weights, per block of 16 rows, consecutive along k:
//! - 4-bit: tiles of 16 rows x 8 k in 64 bytes; byte r + 16 j (j < 4) holds q[r, k0 + j]
//!   in its low nibble and q[r, k0 + 4 + j] in its high nibble.
//! - 8-bit: tiles of 16 rows x 4 k in 64 bytes; byte r + 16 j holds q[r, k0 + j].
//! Scales and biases: [O / 16][K / group_size][16], f16 or f32.
//! Offsets (`*_off`) count elements of the pointer's type, as IREE passes them.

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

static inline __m512 load16_f16(const void* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p));
}
static inline __m512 load16_f32(const void* p) { return _mm512_loadu_ps((const float*)p); }

// Sum of one group of x (group sizes are multiples of 16).
static inline float group_sum(const float* xg, size_t gs) {
  __m512 s = _mm512_setzero_ps();
  for (size_t k = 0; k < gs; k += 16) s = _mm512_add_ps(s, _mm512_loadu_ps(xg + k));
  return _mm512_reduce_add_ps(s);
}

// sum_k q[r, k] * x[k] over one group for the block's 16 rows.
static inline __m512 group_dot4(const uint8_t* wg, const float* xg, size_t gs) {
  const __m512i low = _mm512_set1_epi32(0xF);
  __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
  for (size_t k = 0; k < gs; k += 8, wg += 64) {
    for (int j = 0; j < 4; ++j) {
      __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(wg + 16 * j)));
      a0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_and_si512(v, low)), _mm512_set1_ps(xg[k + j]), a0);
      a1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4)), _mm512_set1_ps(xg[k + 4 + j]), a1);
    }
  }
  return _mm512_add_ps(a0, a1);
}

static inline __m512 group_dot8(const uint8_t* wg, const float* xg, size_t gs) {
  __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
  for (size_t k = 0; k < gs; k += 4, wg += 64) {
    __m512i v0 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(wg + 0)));
    __m512i v1 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(wg + 16)));
    __m512i v2 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(wg + 32)));
    __m512i v3 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(wg + 48)));
    a0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(v0), _mm512_set1_ps(xg[k + 0]), a0);
    a1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(v1), _mm512_set1_ps(xg[k + 1]), a1);
    a0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(v2), _mm512_set1_ps(xg[k + 2]), a0);
    a1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(v3), _mm512_set1_ps(xg[k + 3]), a1);
  }
  return _mm512_add_ps(a0, a1);
}

// One exported matvec per (bits, scale type). `sbytes` is the scale element size.
#define QMV(NAME, DOT, BITS, LOAD, STYPE)                                                        \
  void NAME(const float* x, size_t x_off, const uint8_t* w, size_t w_off, const STYPE* sc,        \
            size_t s_off, const STYPE* bi, size_t b_off, float* y, size_t y_off, size_t T,        \
            size_t K, size_t O, size_t GS, size_t rb0, size_t rb1) {                              \
    x += x_off; w += w_off; sc += s_off; bi += b_off; y += y_off;                                 \
    const size_t G = K / GS, blocks = O / 16, block_bytes = K * BITS * 16 / 8;                    \
    const size_t group_bytes = GS * BITS * 16 / 8;                                                \
    if (rb1 > blocks) rb1 = blocks;                                                               \
    for (size_t rb = rb0; rb < rb1; ++rb) {                                                       \
      const uint8_t* wb = w + rb * block_bytes;                                                   \
      const STYPE* sb = sc + rb * G * 16;                                                         \
      const STYPE* bb = bi + rb * G * 16;                                                         \
      for (size_t t = 0; t < T; ++t) {                                                            \
        const float* xt = x + t * K;                                                              \
        __m512 acc = _mm512_setzero_ps();                                                         \
        for (size_t g = 0; g < G; ++g) {                                                          \
          const float* xg = xt + g * GS;                                                          \
          __m512 dot = DOT(wb + g * group_bytes, xg, GS);                                         \
          acc = _mm512_fmadd_ps(LOAD(sb + g * 16), dot, acc);                                     \
          acc = _mm512_fmadd_ps(LOAD(bb + g * 16), _mm512_set1_ps(group_sum(xg, GS)), acc);       \
        }                                                                                         \
        _mm512_storeu_ps(y + t * O + rb * 16, acc);                                               \
      }                                                                                           \
    }                                                                                             \
  }

QMV(mlx_iree_qmv4_f16, group_dot4, 4, load16_f16, uint16_t)
QMV(mlx_iree_qmv4_f32, group_dot4, 4, load16_f32, float)
QMV(mlx_iree_qmv8_f16, group_dot8, 8, load16_f16, uint16_t)
QMV(mlx_iree_qmv8_f32, group_dot8, 8, load16_f32, float)

static inline float f16_to_f32(uint16_t h) {
  return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
}

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
          const uint8_t byte = wb[(k / 8) * 64 + ((k % 8) % 4) * 16 + lane];                      \
          q = (k % 8) < 4 ? (byte & 0xF) : (byte >> 4);                                           \
        } else {                                                                                  \
          q = wb[(k / 4) * 64 + (k % 4) * 16 + lane];                                             \
        }                                                                                         \
        const size_t gi = (rb * G + k / GS) * 16 + lane;                                          \
        out[t * K + k] = TOF32(sc[gi]) * (float)q + TOF32(bi[gi]);                                \
      }                                                                                           \
    }                                                                                             \
  }

static inline float f32_id(float v) { return v; }

QROWS(mlx_iree_qrows4_f16, 4, uint16_t, f16_to_f32)
QROWS(mlx_iree_qrows4_f32, 4, float, f32_id)
QROWS(mlx_iree_qrows8_f16, 8, uint16_t, f16_to_f32)
QROWS(mlx_iree_qrows8_f32, 8, float, f32_id)
