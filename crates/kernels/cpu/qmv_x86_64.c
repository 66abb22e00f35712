//! Fused dequantize + matrix-vector product for MLX affine 4- and 8-bit weights (AVX-512).
//!
//! Linked into IREE's embedded ELF executables (freestanding: no libc, no globals). Each
//! function computes a range of 16-row blocks of y[T, O] = x[T, K] . W^T, where
//! W[o, k] = scale[o, g] * q[o, k] + bias[o, g] with g = k / group_size, in f32.
//! The layouts are written by crates/kernels/src/cpu.rs (`repack_*`); the two must agree.
//! The products run on AVX-512 VNNI (`vpdpwssd`): each group of x is quantized to i16
//! against its largest magnitude, the integer dot products are exact, and scale, bias and
//! x's scale apply in f32 once per group.
//!
//! Weights, per block of 16 rows, consecutive along k, in 32-byte tiles:
//! - 4-bit: 16 rows x 4 k; byte 2r + p holds q[r, k0 + p] in its low nibble and
//!   q[r, k0 + 2 + p] in its high nibble.
//! - 8-bit: 16 rows x 2 k; byte 2r + p holds q[r, k0 + p].
//! Scales and biases: [O / 16][K / group_size][16], f16 or f32.
//! Offsets (`*_off`) count elements of the pointer's type, as IREE passes them.

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

static inline __m512 load16_f16(const void* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p));
}
static inline __m512 load16_f32(const void* p) { return _mm512_loadu_ps((const float*)p); }

// One group of x quantized to i16 against its largest magnitude (15 bits), with the scale
// back to f32 and the exact f32 sum the biases multiply. Group sizes are multiples of 16
// and at most MAX_GROUP.
#define MAX_GROUP 128
typedef struct {
  int16_t q[MAX_GROUP] __attribute__((aligned(64)));
  float scale;
  float sum;
} xgroup_t;

static inline void quantize_group(const float* xg, size_t gs, xgroup_t* out) {
  __m512 amax = _mm512_setzero_ps(), sum = _mm512_setzero_ps();
  for (size_t k = 0; k < gs; k += 16) {
    const __m512 v = _mm512_loadu_ps(xg + k);
    amax = _mm512_max_ps(amax, _mm512_abs_ps(v));
    sum = _mm512_add_ps(sum, v);
  }
  const float m = _mm512_reduce_max_ps(amax);
  out->sum = _mm512_reduce_add_ps(sum);
  out->scale = m / 32767.0f;
  const __m512 inv = _mm512_set1_ps(m > 0.0f ? 32767.0f / m : 0.0f);
  for (size_t k = 0; k < gs; k += 16) {
    // Round to nearest even (the default MXCSR mode); |value| <= 32767 fits i16.
    const __m512i r = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xg + k), inv));
    _mm256_store_si256((__m256i*)(out->q + k), _mm512_cvtepi32_epi16(r));
  }
}

// Pair k, k+1 of the quantized group broadcast to every lane (low word = k).
static inline __m512i pair(const int16_t* q, size_t k) {
  int32_t v;
  __builtin_memcpy(&v, q + k, 4);
  return _mm512_set1_epi32(v);
}

// sum_k q[r, k] * xq[k] over one group for a block's 16 rows, exact in i32.
// 4-bit tiles: 16 rows x 4 k in 32 bytes; byte 2r + p holds q[r, k0 + p] (low nibble) and
// q[r, k0 + 2 + p] (high nibble).
static inline __m512i group_dot4(const uint8_t* wg, const xgroup_t* x, size_t gs) {
  const __m512i low = _mm512_set1_epi16(0xF);
  __m512i a0 = _mm512_setzero_si512(), a1 = _mm512_setzero_si512();
  for (size_t k = 0; k < gs; k += 4, wg += 32) {
    const __m512i v = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)wg));
    a0 = _mm512_dpwssd_epi32(a0, _mm512_and_si512(v, low), pair(x->q, k));
    a1 = _mm512_dpwssd_epi32(a1, _mm512_srli_epi16(v, 4), pair(x->q, k + 2));
  }
  return _mm512_add_epi32(a0, a1);
}

// 8-bit tiles: 16 rows x 2 k in 32 bytes; byte 2r + p holds q[r, k0 + p].
static inline __m512i group_dot8(const uint8_t* wg, const xgroup_t* x, size_t gs) {
  __m512i a0 = _mm512_setzero_si512(), a1 = _mm512_setzero_si512();
  for (size_t k = 0; k < gs; k += 4, wg += 64) {
    const __m512i v0 = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)wg));
    const __m512i v1 = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)(wg + 32)));
    a0 = _mm512_dpwssd_epi32(a0, v0, pair(x->q, k));
    a1 = _mm512_dpwssd_epi32(a1, v1, pair(x->q, k + 2));
  }
  return _mm512_add_epi32(a0, a1);
}

// One exported matvec per (bits, scale type). A workgroup computes row blocks [rb0, rb1)
// (at most BLOCKS of them) for every row t of x, quantizing each group of x once.
#define BLOCKS 4
#define QMV(NAME, DOT, BITS, LOAD, STYPE)                                                        \
  void NAME(const float* x, size_t x_off, const uint8_t* w, size_t w_off, const STYPE* sc,        \
            size_t s_off, const STYPE* bi, size_t b_off, float* y, size_t y_off, size_t T,        \
            size_t K, size_t O, size_t GS, size_t rb0, size_t rb1) {                              \
    x += x_off; w += w_off; sc += s_off; bi += b_off; y += y_off;                                 \
    const size_t G = K / GS, blocks = O / 16, block_bytes = K * BITS * 16 / 8;                    \
    const size_t group_bytes = GS * BITS * 16 / 8;                                                \
    if (rb1 > blocks) rb1 = blocks;                                                               \
    if (rb1 > rb0 + BLOCKS) rb1 = rb0 + BLOCKS;                                                   \
    xgroup_t xq;                                                                                  \
    for (size_t t = 0; t < T; ++t) {                                                              \
      __m512 acc[BLOCKS];                                                                         \
      for (size_t i = 0; i < BLOCKS; ++i) acc[i] = _mm512_setzero_ps();                           \
      for (size_t g = 0; g < G; ++g) {                                                            \
        quantize_group(x + t * K + g * GS, GS, &xq);                                              \
        const __m512 dx = _mm512_set1_ps(xq.scale), xs = _mm512_set1_ps(xq.sum);                  \
        for (size_t rb = rb0; rb < rb1; ++rb) {                                                   \
          const __m512 dot = _mm512_mul_ps(_mm512_cvtepi32_ps(                                    \
              DOT(w + rb * block_bytes + g * group_bytes, &xq, GS)), dx);                         \
          const size_t gi = (rb * G + g) * 16;                                                    \
          acc[rb - rb0] = _mm512_fmadd_ps(LOAD(sc + gi), dot, acc[rb - rb0]);                     \
          acc[rb - rb0] = _mm512_fmadd_ps(LOAD(bi + gi), xs, acc[rb - rb0]);                      \
        }                                                                                         \
      }                                                                                           \
      for (size_t rb = rb0; rb < rb1; ++rb) _mm512_storeu_ps(y + t * O + rb * 16, acc[rb - rb0]); \
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
          const uint8_t byte = wb[(k / 4) * 32 + 2 * lane + (k % 2)];                             \
          q = (k % 4) < 2 ? (byte & 0xF) : (byte >> 4);                                           \
        } else {                                                                                  \
          q = wb[(k / 2) * 32 + 2 * lane + (k % 2)];                                              \
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
