//! One step of the gated delta rule (the linear attention of Qwen3.5 and Qwen3-Next; mlx-lm's
//! `_gated_delta_step_ops`) for each of a call's sequences, over its m rows, updating the
//! recurrent state where it lies, shared by every kernel object: `mlx_iree_delta`. The graph
//! form makes about seven passes over a sequence's state per layer and row (1 MiB at the
//! 0.8B shape's 16 heads of 128 x 128); this reads each state row once, keeps it in registers
//! across the sequence's rows (a prompt chunk), and writes it once.
//!
//! Each instruction set's file defines the 16-lane primitives first (vf16_avx512.h,
//! vf16_avx2.h, vf16_neon.h) and, if it has the registers for more, `DELTA_STATE_VF` (vf
//! registers the state rows of one pass may take, default 8: rows side by side, for
//! independent chains). Everything else is here, one rounding at a time (the objects are
//! built with -ffp-contract=off, fused multiply-adds only where written), so every object
//! computes the same bits, and crates/kernels/src/cpu.rs's model of it (`delta_model`) too.
//! For sequence i, head h, state row a (a row of dk floats s), rows t < count in order (r =
//! i * m + t; g, beta, v scalars of row r and head h; k, q its dk floats):
//!   s = s * g;  kv = dot(s, k);  delta = (v[a] - kv) * beta;  s = fma(k, delta, s);
//!   y[r, h * dv + a] = dot(s, q)
//! where dot(a, b) is the 16-lane sum (`vf_sum`) of the fused products over dk / 16 chunks,
//! chunk 0 first (as attn.h's scores). Rows are independent, so how many a pass takes
//! changes no bit.
//! - A sequence at position 0 (positions[i * m] == 0) starts from a zero state: a reused
//!   slot's old state is not read.
//! - count = clamp(last[0], 0, m - 1) + 1: rows [count, m) are padding; their y is 0 and
//!   they leave the state alone. The state rows are stored back after the real rows.
//! - A sequence whose (clamped) slot an earlier one of the call has computes nothing: decode
//!   pads its rows by repeating a real one exactly, so the first sequence with the slot
//!   updates the state once and copies its y rows to every later one with that slot. So no
//!   two workgroups write one state row.
//!
//! Bindings: q, k [n * m, H, dk] f32 (normalised and scaled), v [n * m, H, dv] f32, g (the
//! decay) and beta (the write strength) [n * m, H] f32, positions [n * m] i32, slots [n]
//! i32, last [1] i32, the state [S, H, dv, dk] f32 (read and written), y [n * m, H * dv]
//! f32. Push constants: n, m, H, dk, dv, S. A workgroup computes units [u0, u1), unit u
//! being sequence u / H and head u % H. Slots past the state clamp to its last (as a
//! StableHLO gather does). dk must be a multiple of 16 from 16 to 256 and dv at least 1
//! (kernels::cpu::supports_delta); otherwise nothing is written.

#include <stddef.h>
#include <stdint.h>

// The most 16-lane chunks of a state row (dk <= 256) and the most rows a pass takes.
#define DELTA_MAX_C 16
#define DELTA_MAX_ROWS 4
#ifndef DELTA_STATE_VF
#define DELTA_STATE_VF 8
#endif
// Rows a pass takes for C chunks a row: as many as DELTA_STATE_VF holds, 1 to 4.
#define DELTA_ROWS(C)                                                                             \
  (DELTA_STATE_VF / (C) >= DELTA_MAX_ROWS ? DELTA_MAX_ROWS : DELTA_STATE_VF / (C) >= 1 ? DELTA_STATE_VF / (C) : 1)

static inline size_t delta_slot(int32_t slot, size_t S) {
  const size_t s = (size_t)(uint32_t)slot;
  return s < S ? s : S - 1;
}

// State rows st[0..NR) (DK floats each, contiguous) through `count` rows (t-th at q, k + t *
// qk_stride, v + t * v_stride + row, g and beta + t * gb_stride), their outputs at y + t *
// y_stride + row. C and NR are constants at every call, so the rows stay in registers.
static inline __attribute__((always_inline)) void delta_rows(const size_t C, const size_t NR, float* st,
                                                             const size_t DK, const int fresh, const float* q,
                                                             const float* k, const size_t qk_stride,
                                                             const float* v, const size_t v_stride, const float* g,
                                                             const float* beta, const size_t gb_stride, float* y,
                                                             const size_t y_stride, const size_t count) {
  vf s[DELTA_MAX_ROWS][DELTA_MAX_C];
  for (size_t i = 0; i < NR; ++i)
    for (size_t c = 0; c < C; ++c) s[i][c] = fresh ? vf_zero() : vf_load(st + i * DK + 16 * c);
  for (size_t t = 0; t < count; ++t) {
    const vf gv = vf_set1(g[t * gb_stride]);
    const float br = beta[t * gb_stride];
    const float* kr = k + t * qk_stride;
    const float* qr = q + t * qk_stride;
    vf kv[DELTA_MAX_ROWS], yv[DELTA_MAX_ROWS], dv[DELTA_MAX_ROWS];
    for (size_t i = 0; i < NR; ++i) kv[i] = vf_zero();
    for (size_t c = 0; c < C; ++c) {
      const vf kc = vf_load(kr + 16 * c);
      for (size_t i = 0; i < NR; ++i) {
        s[i][c] = vf_mul(s[i][c], gv);
        kv[i] = vf_fma(s[i][c], kc, kv[i]);
      }
    }
    for (size_t i = 0; i < NR; ++i) {
      const float delta = (v[t * v_stride + i] - vf_sum(kv[i])) * br;
      dv[i] = vf_set1(delta);
      yv[i] = vf_zero();
    }
    for (size_t c = 0; c < C; ++c) {
      const vf kc = vf_load(kr + 16 * c), qc = vf_load(qr + 16 * c);
      for (size_t i = 0; i < NR; ++i) {
        s[i][c] = vf_fma(kc, dv[i], s[i][c]);
        yv[i] = vf_fma(s[i][c], qc, yv[i]);
      }
    }
    for (size_t i = 0; i < NR; ++i) y[t * y_stride + i] = vf_sum(yv[i]);
  }
  for (size_t i = 0; i < NR; ++i)
    for (size_t c = 0; c < C; ++c) vf_store(st + i * DK + 16 * c, s[i][c]);
}

// Every state row of one (sequence, head) at st (DV rows of C chunks): passes of
// DELTA_ROWS(C) rows, then the rest one at a time; the next pass's rows prefetched.
static inline __attribute__((always_inline)) void delta_head(const size_t C, float* st, const size_t DV,
                                                             const int fresh, const float* q, const float* k,
                                                             const size_t qk_stride, const float* v,
                                                             const size_t v_stride, const float* g,
                                                             const float* beta, const size_t gb_stride, float* y,
                                                             const size_t y_stride, const size_t count) {
  const size_t NR = DELTA_ROWS(C), DK = 16 * C;
  size_t a = 0;
  for (; a + NR <= DV; a += NR) {
    if (!fresh && a + 2 * NR <= DV) {
      const char* next = (const char*)(st + (a + NR) * DK);
      for (size_t b = 0; b < NR * DK * sizeof(float); b += 64) __builtin_prefetch(next + b);
    }
    delta_rows(C, NR, st + a * DK, DK, fresh, q, k, qk_stride, v + a, v_stride, g, beta, gb_stride, y + a, y_stride,
               count);
  }
  for (; a < DV; ++a)
    delta_rows(C, 1, st + a * DK, DK, fresh, q, k, qk_stride, v + a, v_stride, g, beta, gb_stride, y + a, y_stride,
               count);
}

void mlx_iree_delta(const float* q, size_t q_off, const float* k, size_t k_off, const float* v, size_t v_off,
                    const float* g, size_t g_off, const float* beta, size_t beta_off, const int32_t* pos,
                    size_t pos_off, const int32_t* slots, size_t slots_off, const int32_t* last, size_t last_off,
                    float* state, size_t state_off, float* y, size_t y_off, size_t n, size_t m, size_t H, size_t DK,
                    size_t DV, size_t S, size_t u0, size_t u1) {
  q += q_off; k += k_off; v += v_off; g += g_off; beta += beta_off;
  pos += pos_off; slots += slots_off; last += last_off; state += state_off; y += y_off;
  if (DK % 16 != 0 || DK < 16 || DK > 16 * DELTA_MAX_C || DV == 0 || S == 0 || m == 0) return;
  if (u1 > n * H) u1 = n * H;
  const int32_t l = last[0];
  const size_t count = l < 0 ? 1 : (size_t)l >= m ? m : (size_t)l + 1;
  const size_t C = DK / 16, qk_stride = H * DK, v_stride = H * DV, y_stride = H * DV;
  for (size_t u = u0; u < u1; ++u) {
    const size_t i = u / H, h = u % H;
    const size_t slot = delta_slot(slots[i], S);
    int repeat = 0;
    for (size_t j = 0; j < i; ++j) repeat |= delta_slot(slots[j], S) == slot;
    if (repeat) continue;
    const int fresh = pos[i * m] == 0;
    const size_t r0 = i * m;
    float* st = state + (slot * H + h) * DV * DK;
    const float* qh = q + (r0 * H + h) * DK;
    const float* kh = k + (r0 * H + h) * DK;
    const float* vh = v + (r0 * H + h) * DV;
    const float* gh = g + r0 * H + h;
    const float* bh = beta + r0 * H + h;
    float* yh = y + r0 * y_stride + h * DV;
#define DELTA_CASE(CC)                                                                            \
  case CC:                                                                                        \
    delta_head(CC, st, DV, fresh, qh, kh, qk_stride, vh, v_stride, gh, bh, H, yh, y_stride, count); \
    break;
    switch (C) {
      DELTA_CASE(1) DELTA_CASE(2) DELTA_CASE(3) DELTA_CASE(4) DELTA_CASE(5) DELTA_CASE(6) DELTA_CASE(7)
      DELTA_CASE(8) DELTA_CASE(9) DELTA_CASE(10) DELTA_CASE(11) DELTA_CASE(12) DELTA_CASE(13) DELTA_CASE(14)
      DELTA_CASE(15) DELTA_CASE(16)
      default: break;
    }
#undef DELTA_CASE
    for (size_t t = count; t < m; ++t)
      for (size_t a = 0; a < DV; ++a) yh[t * y_stride + a] = 0.0f;
    // The later sequences with this slot repeat this one: its rows' outputs.
    for (size_t j = i + 1; j < n; ++j) {
      if (delta_slot(slots[j], S) != slot) continue;
      float* yj = y + j * m * y_stride + h * DV;
      for (size_t t = 0; t < m; ++t)
        for (size_t a = 0; a < DV; ++a) yj[t * y_stride + a] = yh[t * y_stride + a];
    }
  }
}
