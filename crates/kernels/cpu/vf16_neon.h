//! 16 f32 lanes as four NEON registers (lanes 0-3, 4-7, 8-11, 12-15): the vector primitives
//! attn.h is written in, for the aarch64 object. `vf_sum` adds in vf16_avx512.h's order (lane
//! i + lane i + 8, then i + 4, i + 2, i + 1), so the objects compute the same bits.

#include <arm_neon.h>

typedef struct {
  float32x4_t v[4];
} vf;

static inline vf vf_zero(void) {
  const float32x4_t z = vdupq_n_f32(0.0f);
  return (vf){{z, z, z, z}};
}
static inline vf vf_set1(float x) {
  const float32x4_t s = vdupq_n_f32(x);
  return (vf){{s, s, s, s}};
}
static inline vf vf_load(const float* p) {
  return (vf){{vld1q_f32(p), vld1q_f32(p + 4), vld1q_f32(p + 8), vld1q_f32(p + 12)}};
}
static inline vf vf_load_f16(const uint16_t* p) {
  vf r;
  for (int i = 0; i < 4; ++i) r.v[i] = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p + 4 * i)));
  return r;
}
// bf16 is the top half of an f32: widened exactly by a shift.
static inline vf vf_load_bf16(const uint16_t* p) {
  vf r;
  for (int i = 0; i < 4; ++i) r.v[i] = vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p + 4 * i), 16));
  return r;
}
// 16 int8 widened to f32 (exact).
static inline vf vf_load_i8(const int8_t* p) {
  const int8x16_t b = vld1q_s8(p);
  const int16x8_t lo = vmovl_s8(vget_low_s8(b)), hi = vmovl_high_s8(b);
  return (vf){{vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo))), vcvtq_f32_s32(vmovl_high_s16(lo)),
               vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi))), vcvtq_f32_s32(vmovl_high_s16(hi))}};
}
// 16 FP8 E4M3 codes (mxfp8's values) as f32, each its value v times 2^-8, exactly (as
// vf16_avx512.h's).
static inline vf vf_load_e4m3(const uint8_t* p) {
  const int8x16_t b = vld1q_s8((const int8_t*)p);
  const uint16x8_t mask = vdupq_n_u16(0xBF80);
  const uint16x8_t lo = vandq_u16(vreinterpretq_u16_s16(vshlq_n_s16(vmovl_s8(vget_low_s8(b)), 7)), mask);
  const uint16x8_t hi = vandq_u16(vreinterpretq_u16_s16(vshlq_n_s16(vmovl_high_s8(b), 7)), mask);
  return (vf){{vcvt_f32_f16(vreinterpret_f16_u16(vget_low_u16(lo))), vcvt_f32_f16(vreinterpret_f16_u16(vget_high_u16(lo))),
               vcvt_f32_f16(vreinterpret_f16_u16(vget_low_u16(hi))), vcvt_f32_f16(vreinterpret_f16_u16(vget_high_u16(hi)))}};
}
// 16 E8M0 scale bytes e as 2^(e - 119) (e <= 246).
static inline vf vf_load_e8m0(const uint8_t* p) {
  const uint8x16_t b = vld1q_u8(p);
  const uint16x8_t lo = vmovl_u8(vget_low_u8(b)), hi = vmovl_high_u8(b);
  const uint32x4_t e[4] = {vmovl_u16(vget_low_u16(lo)), vmovl_high_u16(lo), vmovl_u16(vget_low_u16(hi)), vmovl_high_u16(hi)};
  vf r;
  for (int i = 0; i < 4; ++i) r.v[i] = vreinterpretq_f32_u32(vshlq_n_u32(vaddq_u32(e[i], vdupq_n_u32(8)), 23));
  return r;
}
// Each lane rounded to f16 (nearest, ties to even: FPCR's default mode) and back.
static inline vf vf_round_f16(vf a) {
  vf r;
  for (int i = 0; i < 4; ++i) r.v[i] = vcvt_f32_f16(vcvt_f16_f32(a.v[i]));
  return r;
}
static inline void vf_store(float* p, vf a) {
  for (int i = 0; i < 4; ++i) vst1q_f32(p + 4 * i, a.v[i]);
}
// Each lane to the nearest integer, ties to even whatever FPCR says (-0 stays -0).
static inline vf vf_round_even(vf a) {
  vf r;
  for (int i = 0; i < 4; ++i) r.v[i] = vrndnq_f32(a.v[i]);
  return r;
}
// Each lane's magnitude (its sign bit cleared).
static inline vf vf_abs(vf a) {
  vf r;
  for (int i = 0; i < 4; ++i) r.v[i] = vabsq_f32(a.v[i]);
  return r;
}
static inline vf vf_mul(vf a, vf b) {
  vf r;
  for (int i = 0; i < 4; ++i) r.v[i] = vmulq_f32(a.v[i], b.v[i]);
  return r;
}
// a * b + c, one rounding.
static inline vf vf_fma(vf a, vf b, vf c) {
  vf r;
  for (int i = 0; i < 4; ++i) r.v[i] = vfmaq_f32(c.v[i], a.v[i], b.v[i]);
  return r;
}
static inline vf vf_add(vf a, vf b) {
  vf r;
  for (int i = 0; i < 4; ++i) r.v[i] = vaddq_f32(a.v[i], b.v[i]);
  return r;
}
// 2^n in each lane, for integral n in [-126, 127].
static inline vf vf_pow2i(vf n) {
  vf r;
  for (int i = 0; i < 4; ++i)
    r.v[i] = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n.v[i]), vdupq_n_s32(127)), 23));
  return r;
}
// y where x is not below lim (NaN included), else 0.
static inline vf vf_zero_below(vf x, float lim, vf y) {
  vf r;
  for (int i = 0; i < 4; ++i) {
    const uint32x4_t below = vcltq_f32(x.v[i], vdupq_n_f32(lim));
    r.v[i] = vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(y.v[i]), below));
  }
  return r;
}
static inline float vf_sum(vf a) {
  const float32x4_t s4 = vaddq_f32(vaddq_f32(a.v[0], a.v[2]), vaddq_f32(a.v[1], a.v[3]));
  const float32x2_t s2 = vadd_f32(vget_low_f32(s4), vget_high_f32(s4));
  return vget_lane_f32(s2, 0) + vget_lane_f32(s2, 1);
}

// out[j] = vf_sum(v[j]) for 16 vectors.
static inline void vf_sum16(const vf v[16], float out[16]) {
  for (int j = 0; j < 16; ++j) out[j] = vf_sum(v[j]);
}

// The largest lane (exact, so any order).
static inline float vf_max_lane(vf a) {
  return vmaxvq_f32(vmaxq_f32(vmaxq_f32(a.v[0], a.v[1]), vmaxq_f32(a.v[2], a.v[3])));
}
