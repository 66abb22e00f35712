//! Fused dequantize + matrix-vector product for MLX affine 3-, 4-, 6- and 8-bit and FP4 weights (aarch64
//! NEON with the dot-product extension, `-march=armv8.2-a+dotprod`: `sdot` and `udot`).
//!
//! The aarch64 twin of qmv_x86_64.c and qmv_x86_64_avx2.c: the same exported functions,
//! signatures, layouts and driver (qmv.h), and the same numerics, so its results are the same
//! bits: each group of x is quantized to i16 against its largest magnitude (its f32 sum in the
//! AVX-512 file's lane order), the integer dot products are exact, and scale, bias and x's
//! scale apply in f32 once per group, in the same order.
//!
//! `sdot`/`udot` multiply bytes, so each i16 value of x is split into a signed high byte and
//! an unsigned low byte (x = 256 hi + lo; `ld2` de-interleaves them) and a dot is
//! 256 * sum(q hi) + sum(q lo), both exact in i32. 4-bit values (0..15) are valid signed and
//! unsigned bytes; 8-bit ones (0..255) are not signed bytes, so their high-byte product is
//! taken with q - 128 and 128 * sum(hi) added back.
//!
//! The by-element form of the dot instructions multiplies 4 rows x 4 consecutive k (16 bytes)
//! with 4 values of x broadcast from one 32-bit lane. A tile's 8 bytes for 4 rows hold each
//! row's pair (k0, k0 + 1) and the next 8 its pair (k0 + 2, k0 + 3) (4-bit: the low and high
//! nibbles of the same bytes; 8-bit: two consecutive tiles), so zipping their 16-bit pairs
//! gives that shape.

#include <arm_neon.h>

#include "qmv.h"

// `b` (x8's bytes) is not read here: this object's products take the i16 values.
static inline void quantize_group(const float* xg, size_t gs, float levels, int16_t* q, int8_t* b, float* scale,
                                  float* sum) {
  (void)b;
  float32x4_t amax = vdupq_n_f32(0.0f);
  // Lanes 0-3, 4-7, 8-11 and 12-15 of the AVX-512 file's 16 lanes.
  float32x4_t l0 = amax, l1 = amax, l2 = amax, l3 = amax;
  for (size_t k = 0; k < gs; k += 16) {
    const float32x4_t v0 = vld1q_f32(xg + k), v1 = vld1q_f32(xg + k + 4);
    const float32x4_t v2 = vld1q_f32(xg + k + 8), v3 = vld1q_f32(xg + k + 12);
    const float32x4_t m01 = vmaxq_f32(vabsq_f32(v0), vabsq_f32(v1));
    amax = vmaxq_f32(amax, vmaxq_f32(m01, vmaxq_f32(vabsq_f32(v2), vabsq_f32(v3))));
    l0 = vaddq_f32(l0, v0);
    l1 = vaddq_f32(l1, v1);
    l2 = vaddq_f32(l2, v2);
    l3 = vaddq_f32(l3, v3);
  }
  // _mm512_reduce_add_ps's order: lane j plus lane j + 8, then j + 4, then (0 + 2) + (1 + 3).
  const float32x4_t s4 = vaddq_f32(vaddq_f32(l3, l1), vaddq_f32(l2, l0));
  const float32x2_t s2 = vadd_f32(vget_low_f32(s4), vget_high_f32(s4));
  *sum = vget_lane_f32(s2, 0) + vget_lane_f32(s2, 1);
  const float m = vmaxvq_f32(amax);
  *scale = m / levels;
  const float32x4_t inv = vdupq_n_f32(m > 0.0f ? levels / m : 0.0f);
  for (size_t k = 0; k < gs; k += 8) {
    // Round to nearest even (`fcvtns`, as the x86 files' default MXCSR mode); |value| <= 32767.
    const int32x4_t r0 = vcvtnq_s32_f32(vmulq_f32(vld1q_f32(xg + k), inv));
    const int32x4_t r1 = vcvtnq_s32_f32(vmulq_f32(vld1q_f32(xg + k + 4), inv));
    vst1q_s16(q + k, vcombine_s16(vmovn_s32(r0), vmovn_s32(r1)));
  }
}

// 4 rows x 4 consecutive k from each row's pair (k0, k0 + 1) in `lo` and (k0 + 2, k0 + 3) in
// `hi` (2 bytes a row).
static inline uint8x16_t rows4(uint8x8_t lo, uint8x8_t hi) {
  const uint16x4_t l = vreinterpret_u16_u8(lo), h = vreinterpret_u16_u8(hi);
  return vreinterpretq_u8_u16(vcombine_u16(vzip1_u16(l, h), vzip2_u16(l, h)));
}

// Rows 4v .. 4v + 3 of the block x k .. k + 3 (k a multiple of 4) from the group's tiles.
// 4-bit tiles: 16 rows x 4 k in 32 bytes; byte 2r + p holds q[r, k0 + p] (low nibble) and
// q[r, k0 + 2 + p] (high nibble); with `fp4` each nibble an E2M1 code, its q (0..24, a valid
// signed and unsigned byte) looked up in FP4_TABLE (`tbl`). 8-bit: 16 rows x 2 k; byte 2r + p
// holds q[r, k0 + p].
static inline __attribute__((always_inline)) uint8x16_t weights4x4(int bits, int fp4, const uint8_t* wg, size_t k,
                                                                  size_t v) {
  if (bits == 4) {
    const uint8x8_t b = vld1_u8(wg + k * 8 + 8 * v);
    const uint8x16_t codes = rows4(vand_u8(b, vdup_n_u8(0xF)), vshr_n_u8(b, 4));
    if (!fp4) return codes;
    const uint8x16_t table = {FP4_TABLE};
    return vqtbl1q_u8(table, codes);
  }
  const uint8_t* t = wg + k * 16 + 8 * v;
  return rows4(vld1_u8(t), vld1_u8(t + 32));
}

// One step of 4 k (lane `lane` of x's 16): the tiles' rows 4v .. 4v + 3 for v in [v0, v0 + nv)
// times n rows of x, added to the high-byte (s) and low-byte (u) sums.
#define DOT_STEP(lane)                                                                           \
  for (size_t v = v0; v < v0 + nv; ++v) {                                                        \
    const uint8x16_t w = weights4x4(bits, fp4, wg, k + 4 * (lane), v);                                \
    const int8x16_t ws = vreinterpretq_s8_u8(bits == 4 ? w : veorq_u8(w, vdupq_n_u8(0x80)));     \
    for (size_t i = 0; i < n; ++i) {                                                             \
      s[i][v - v0] = vdotq_laneq_s32(s[i][v - v0], ws, xh[i], lane);                             \
      u[i][v - v0] = vdotq_laneq_u32(u[i][v - v0], w, xl[i], lane);                              \
    }                                                                                            \
  }

// sum_k q[r, k] * xq[i][k] over one group, exact in i32, for rows 4 v0 .. 4 (v0 + nv) of the
// block and n rows of x: dot[i][v - v0].
static inline __attribute__((always_inline)) void group_dots(int bits, int fp4, const uint8_t* wg,
                                                             const int16_t (*xq)[MAX_GROUP], size_t n, size_t gs,
                                                             size_t v0, size_t nv, int32x4_t dot[4][4]) {
  int32x4_t s[4][4];
  uint32x4_t u[4][4];
  int32_t hsum[4];  // sum of the high bytes of x (the 8-bit correction)
  for (size_t i = 0; i < n; ++i) {
    hsum[i] = 0;
    for (size_t v = 0; v < nv; ++v) {
      s[i][v] = vdupq_n_s32(0);
      u[i][v] = vdupq_n_u32(0);
    }
  }
  for (size_t k = 0; k < gs; k += 16) {
    int8x16_t xh[4];
    uint8x16_t xl[4];
    for (size_t i = 0; i < n; ++i) {
      const uint8x16x2_t p = vld2q_u8((const uint8_t*)(xq[i] + k));
      xl[i] = p.val[0];
      xh[i] = vreinterpretq_s8_u8(p.val[1]);
      if (bits == 8) hsum[i] += vaddlvq_s8(xh[i]);
    }
    DOT_STEP(0)
    DOT_STEP(1)
    DOT_STEP(2)
    DOT_STEP(3)
  }
  for (size_t i = 0; i < n; ++i) {
    for (size_t v = 0; v < nv; ++v) {
      const int32x4_t hi = bits == 4 ? s[i][v] : vaddq_s32(s[i][v], vdupq_n_s32(128 * hsum[i]));
      dot[i][v] = vaddq_s32(vshlq_n_s32(hi, 8), vreinterpretq_s32_u32(u[i][v]));
    }
  }
}

// Scales 4v .. 4v + 3 of type `f16` (qmv.h: 0 f32, 1 f16, 2 E8M0 bytes, read as 2^(e - 128)).
static inline float32x4_t load4(int f16, const void* p, size_t v) {
  if (f16 == 2) {
    const uint8_t* e = (const uint8_t*)p + 4 * v;
    const uint32x4_t bits = {(uint32_t)e[0] + 64, (uint32_t)e[1] + 64, (uint32_t)e[2] + 64, (uint32_t)e[3] + 64};
    return vmulq_f32(vreinterpretq_f32_u32(vshlq_n_u32(bits, 23)), vdupq_n_f32(E8M0_HALF));
  }
  return f16 ? vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t*)p + 4 * v)))
             : vld1q_f32((const float*)p + 4 * v);
}

// Rows 4 v0 .. 4 (v0 + nv) of the block for rows i .. i + n of the panel: the group's dots,
// then y = fma(bias, x_sum, fma(scale, dot * x_scale, y)), as every object computes it.
static inline __attribute__((always_inline)) void rows_pass(int bits, int fp4, int f16, const uint8_t* wg,
                                                            const xview_t* xp, size_t i, size_t n, size_t gs,
                                                            size_t v0, size_t nv, const void* s, const void* b,
                                                            float* y, size_t stride) {
  int32x4_t dot[4][4];
  group_dots(bits, fp4, wg, xp->q + i, n, gs, v0, nv, dot);
  for (size_t v = v0; v < v0 + nv; ++v) {
    const float32x4_t sv = load4(f16, s, v);
    const float32x4_t bv = fp4 ? vmulq_n_f32(sv, FP4_BIAS) : load4(f16, b, v);
    for (size_t j = 0; j < n; ++j) {
      float* yr = y + j * stride + 4 * v;
      const float32x4_t d = vmulq_n_f32(vcvtq_f32_s32(dot[j][v - v0]), xp->scale[i + j]);
      vst1q_f32(yr, vfmaq_n_f32(vfmaq_f32(vld1q_f32(yr), sv, d), bv, xp->sum[i + j]));
    }
  }
}

// n is 8, 4, 2 or 1. Passes of m rows of x (at most 4) over nv of the block's four 4-row
// vectors, m * nv <= 4 and for 8-bit nv <= 2: the sums, the x bytes and the weights of a
// step then fit the 32 registers (more spilled, measured with clang's -Rpass-missed=regalloc).
// Only x is read again by another pass; each weight byte is read once.
static inline __attribute__((always_inline)) void group_rows(int bits, int fp4, int f16, const uint8_t* wg,
                                                             const xview_t* xp, size_t i, size_t n, size_t gs,
                                                             const void* s, const void* b, float* y, size_t stride) {
  const size_t m = n < 4 ? n : 4, nv = bits == 8 && m == 1 ? 2 : 4 / m;
  for (size_t i0 = 0; i0 < n; i0 += m) {
    for (size_t v0 = 0; v0 < 4; v0 += nv) {
      rows_pass(bits, fp4, f16, wg, xp, i + i0, m, gs, v0, nv, s, b, y + i0 * stride, stride);
    }
  }
}

#include "qrows.h"
#include "vf16_neon.h"
#include "attn.h"
// One state row of 128 floats fills the 32 q registers; two side by side, so their chains of dependent
// operations overlap (not measured on aarch64; x86-64's objects gain 1.8x from more than one).
#define DELTA_STATE_VF 16
#include "delta.h"
#include "hmv.h"
