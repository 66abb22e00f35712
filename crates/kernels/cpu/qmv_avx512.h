//! The AVX-512 VNNI arithmetic of the packed matvec (`vpdpwssd`): qmv.h's `quantize_group` and
//! `group_rows`, shared by the AVX-512 object (qmv_x86_64.c) and the AMX one
//! (qmv_x86_64_amx.c), which runs it for panels with too few rows of x to pay for its tiles.
//! Include after qmv.h, with GROUP_ROWS_3 and GROUP_ROWS_6 defined as 1 before it:
//! `group_rows` reads 3-bit and 6-bit groups as stored.
//!
//! Each group of x is quantized to i16 against its largest magnitude (to 8 bits for the x8
//! exports, whose 4-bit and 8-bit panels take `vpdpbusd` on x's bytes), the integer dot
//! products are exact, and scale, bias and x's scale apply in f32 once per group. One zmm
//! register holds a block's 16 rows; each tile is unpacked once for up to 8 rows of x.

static inline __m512 load16_f16(const void* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p));
}
static inline __m512 load16_f32(const void* p) { return _mm512_loadu_ps((const float*)p); }
// 16 scales of type `f16` (qmv.h: 0 f32, 1 f16, 2 E8M0 bytes, read as 2^(e - 128)).
static inline __m512 load16_scale(int f16, const void* p) {
  if (f16 == 2) {
    const __m512i e = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)p));
    const __m512 wide = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(e, _mm512_set1_epi32(64)), 23));
    return _mm512_mul_ps(wide, _mm512_set1_ps(E8M0_HALF));
  }
  return f16 ? load16_f16(p) : load16_f32(p);
}

// 16 values of x times `inv`, rounded to nearest even (the default MXCSR mode); |value| <=
// 32767 fits i16.
static inline __m512i quantize16(const float* x, __m512 inv) {
  return _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x), inv));
}

static inline void quantize_group(const float* xg, size_t gs, float levels, int16_t* q, int8_t* b, float* scale,
                                  float* sum) {
  __m512 amax = _mm512_setzero_ps(), s = _mm512_setzero_ps();
  for (size_t k = 0; k < gs; k += 16) {
    const __m512 v = _mm512_loadu_ps(xg + k);
    amax = _mm512_max_ps(amax, _mm512_abs_ps(v));
    s = _mm512_add_ps(s, v);
  }
  const float m = _mm512_reduce_max_ps(amax);
  *sum = _mm512_reduce_add_ps(s);
  *scale = m / levels;
  const __m512 inv = _mm512_set1_ps(m > 0.0f ? levels / m : 0.0f);
  const __m128i order = _mm_setr_epi8(X8_ORDER);
  for (size_t k = 0; k < gs; k += 16) {
    const __m512i v = quantize16(xg + k, inv);
    _mm256_store_si256((__m256i*)(q + k), _mm512_cvtepi32_epi16(v));
    // |value| <= 127 where bytes are asked for: exact.
    if (b) _mm_store_si128((__m128i*)(b + k), _mm_shuffle_epi8(_mm512_cvtepi32_epi8(v), order));
  }
}

// The x8 products (`vpdpbusd`, unsigned weight bytes times signed bytes of x, 4 k a lane):
// sum_k q[r, k] * xb[i][k] over one group for a block's 16 rows and n rows of x, exact in i32
// (|x| <= 127, q <= 255, k <= 128), for 4-bit or 8-bit tiles (`bits`). Each 32-bit lane r of
// the weights holds row r's values of 4 k in X8_ORDER, the order of x's bytes: a 4-bit
// tile's bytes zero-extended to 16 bits with each lane's high nibble moved to its high byte
// (lane 2r + p: q[r, k0 + p], q[r, k0 + 2 + p]); two 8-bit tiles (k0, k0 + 1 and k0 + 2,
// k0 + 3) interleaved by the bytes of their 16-bit lanes. Two accumulators per row of x (even
// and odd steps of 4 k), 8 k an iteration.
static inline __attribute__((always_inline)) void group_dot_x8(int bits, const uint8_t* wg,
                                                               const int8_t (*xb)[MAX_GROUP], size_t n, size_t gs,
                                                               __m512i acc[PANEL]) {
  const __m512i nibbles = _mm512_set1_epi16(0x0F0F);
  __m512i a0[PANEL], a1[PANEL];
  for (size_t i = 0; i < n; ++i) a0[i] = a1[i] = _mm512_setzero_si512();
  for (size_t k = 0; k < gs; k += 8, wg += 16 * bits) {
#define X8_WIDEN(p) _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)(p)))
    __m512i w0, w1;
    if (bits == 4) {
      // (v | v << 4) & 0x0F0F: (a | b) & c is vpternlog's 0xA8.
      const __m512i v0 = X8_WIDEN(wg), v1 = X8_WIDEN(wg + 32);
      w0 = _mm512_ternarylogic_epi32(v0, _mm512_slli_epi16(v0, 4), nibbles, 0xA8);
      w1 = _mm512_ternarylogic_epi32(v1, _mm512_slli_epi16(v1, 4), nibbles, 0xA8);
    } else {
      w0 = _mm512_or_si512(X8_WIDEN(wg), _mm512_slli_epi16(X8_WIDEN(wg + 32), 8));
      w1 = _mm512_or_si512(X8_WIDEN(wg + 64), _mm512_slli_epi16(X8_WIDEN(wg + 96), 8));
    }
#undef X8_WIDEN
    for (size_t i = 0; i < n; ++i) {
      int32_t x0, x1;
      __builtin_memcpy(&x0, xb[i] + k, 4);
      __builtin_memcpy(&x1, xb[i] + k + 4, 4);
      a0[i] = _mm512_dpbusd_epi32(a0[i], w0, _mm512_set1_epi32(x0));
      a1[i] = _mm512_dpbusd_epi32(a1[i], w1, _mm512_set1_epi32(x1));
    }
  }
  for (size_t i = 0; i < n; ++i) acc[i] = _mm512_add_epi32(a0[i], a1[i]);
}

// sum_k q[r, k] * xq[i][k] over one group for a block's 16 rows and n rows of x, exact in
// i32. Two accumulators per row of x (low and high k pairs) hide vpdpwssd's latency when n
// is small. 4-bit tiles: 16 rows x 4 k in 32 bytes; byte 2r + p holds q[r, k0 + p] (low
// nibble) and q[r, k0 + 2 + p] (high nibble); with `fp4`, each nibble is an E2M1 code, its q
// looked up in FP4_TABLE (`vpermw`, the code as the index).
static inline __attribute__((always_inline)) void group_dot4(int fp4, const uint8_t* wg,
                                                             const int16_t (*xq)[MAX_GROUP], size_t n, size_t gs,
                                                             __m512i acc[PANEL]) {
  const __m512i low = _mm512_set1_epi16(0xF);
  const __m512i table = _mm512_set_epi16(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 4, 6, 8, 9, 10, 11, 12,
                                         24, 20, 18, 16, 15, 14, 13, 12);  // FP4_TABLE, last first
  __m512i a0[PANEL], a1[PANEL];
  for (size_t i = 0; i < n; ++i) a0[i] = a1[i] = _mm512_setzero_si512();
  for (size_t k = 0; k < gs; k += 4, wg += 32) {
    const __m512i v = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)wg));
    __m512i l = _mm512_and_si512(v, low), h = _mm512_srli_epi16(v, 4);
    if (fp4) {
      l = _mm512_permutexvar_epi16(l, table);
      h = _mm512_permutexvar_epi16(h, table);
    }
    for (size_t i = 0; i < n; ++i) {
      a0[i] = _mm512_dpwssd_epi32(a0[i], l, _mm512_set1_epi32(pair_of(xq[i], k)));
      a1[i] = _mm512_dpwssd_epi32(a1[i], h, _mm512_set1_epi32(pair_of(xq[i], k + 2)));
    }
  }
  for (size_t i = 0; i < n; ++i) acc[i] = _mm512_add_epi32(a0[i], a1[i]);
}

// 8-bit tiles: 16 rows x 2 k in 32 bytes; byte 2r + p holds q[r, k0 + p]. Two tiles per step.
static inline __attribute__((always_inline)) void group_dot8(const uint8_t* wg, const int16_t (*xq)[MAX_GROUP],
                                                             size_t n, size_t gs, __m512i acc[PANEL]) {
  __m512i a0[PANEL], a1[PANEL];
  for (size_t i = 0; i < n; ++i) a0[i] = a1[i] = _mm512_setzero_si512();
  for (size_t k = 0; k < gs; k += 4, wg += 64) {
    const __m512i v0 = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)wg));
    const __m512i v1 = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)(wg + 32)));
    for (size_t i = 0; i < n; ++i) {
      a0[i] = _mm512_dpwssd_epi32(a0[i], v0, _mm512_set1_epi32(pair_of(xq[i], k)));
      a1[i] = _mm512_dpwssd_epi32(a1[i], v1, _mm512_set1_epi32(pair_of(xq[i], k + 2)));
    }
  }
  for (size_t i = 0; i < n; ++i) acc[i] = _mm512_add_epi32(a0[i], a1[i]);
}

// `c ? a : b` bit by bit (vpternlog's table for it).
#define SELECT 0xE4

// Four value vectors of a 3/6-bit unit (lane 2r + p: k + p + 2s for q_s) times n rows of x,
// added to a0 (s = 0, 2) and a1 (s = 1, 3).
static inline __attribute__((always_inline)) void unit_dots(__m512i q0, __m512i q1, __m512i q2, __m512i q3,
                                                            const int16_t (*xq)[MAX_GROUP], size_t n, size_t k,
                                                            __m512i a0[PANEL], __m512i a1[PANEL]) {
  for (size_t i = 0; i < n; ++i) {
    a0[i] = _mm512_dpwssd_epi32(a0[i], q0, _mm512_set1_epi32(pair_of(xq[i], k)));
    a1[i] = _mm512_dpwssd_epi32(a1[i], q1, _mm512_set1_epi32(pair_of(xq[i], k + 2)));
    a0[i] = _mm512_dpwssd_epi32(a0[i], q2, _mm512_set1_epi32(pair_of(xq[i], k + 4)));
    a1[i] = _mm512_dpwssd_epi32(a1[i], q3, _mm512_set1_epi32(pair_of(xq[i], k + 6)));
  }
}

// 3-bit units (qmv.h: 16 rows x 32 k in three planes of 16-bit words, each word lane one
// 48-bit stream of its 16 values) read as stored: value s of every lane is a shift and a mask
// of its word (two straddle two words: one more shift and a ternary OR-and), in-lane
// operations only, 8 per 128 values where the earlier layout of planes of low and top bits
// took 13 with two cross-lane widenings (docs/PERFORMANCE.md, 2026-12-07). The values
// `widen_group` would give, so the same dots.
static inline __attribute__((always_inline)) void group_dot3(const uint8_t* wg, const int16_t (*xq)[MAX_GROUP],
                                                             size_t n, size_t gs, __m512i acc[PANEL]) {
  const __m512i seven = _mm512_set1_epi16(7);
  __m512i a0[PANEL], a1[PANEL];
  for (size_t i = 0; i < n; ++i) a0[i] = a1[i] = _mm512_setzero_si512();
  for (size_t k = 0; k < gs; k += 32, wg += 192) {
    const __m512i w0 = _mm512_loadu_si512(wg), w1 = _mm512_loadu_si512(wg + 64), w2 = _mm512_loadu_si512(wg + 128);
// Bits at..at+2 of a word; of the words a (from bit at) and b (the rest) joined: (a | b) & 7
// is vpternlog's 0xA8.
#define VALUE3(w, at) _mm512_and_si512(_mm512_srli_epi16(w, at), seven)
#define JOINED3(a, b, at) _mm512_ternarylogic_epi32(_mm512_srli_epi16(a, at), _mm512_slli_epi16(b, 16 - (at)), seven, 0xA8)
    unit_dots(_mm512_and_si512(w0, seven), VALUE3(w0, 3), VALUE3(w0, 6), VALUE3(w0, 9), xq, n, k, a0, a1);
    unit_dots(VALUE3(w0, 12), JOINED3(w0, w1, 15), VALUE3(w1, 2), VALUE3(w1, 5), xq, n, k + 8, a0, a1);
    unit_dots(VALUE3(w1, 8), VALUE3(w1, 11), JOINED3(w1, w2, 14), VALUE3(w2, 1), xq, n, k + 16, a0, a1);
    unit_dots(VALUE3(w2, 4), VALUE3(w2, 7), VALUE3(w2, 10), _mm512_srli_epi16(w2, 13), xq, n, k + 24, a0, a1);
#undef VALUE3
#undef JOINED3
  }
  for (size_t i = 0; i < n; ++i) acc[i] = _mm512_add_epi32(a0[i], a1[i]);
}

// 6-bit units (16 rows x 8 k in 96 bytes: two planes of low nibbles, one of top 2 bits) read
// as stored: each value's nibble selected into bits 0-3 (`SELECT` against 15) with its top
// bits moved to 4-5, the 8-bit tiles' values.
static inline __attribute__((always_inline)) void group_dot6(const uint8_t* wg, const int16_t (*xq)[MAX_GROUP],
                                                             size_t n, size_t gs, __m512i acc[PANEL]) {
  const __m512i fifteen = _mm512_set1_epi16(15), top = _mm512_set1_epi16(0x30);
  __m512i a0[PANEL], a1[PANEL];
  for (size_t i = 0; i < n; ++i) a0[i] = a1[i] = _mm512_setzero_si512();
  for (size_t k = 0; k < gs; k += 8, wg += 96) {
    const __m512i a = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)wg));
    const __m512i b = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)(wg + 32)));
    const __m512i c = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)(wg + 64)));
    const __m512i q0 = _mm512_ternarylogic_epi32(a, _mm512_and_si512(_mm512_slli_epi16(c, 4), top), fifteen, SELECT);
    const __m512i q1 = _mm512_ternarylogic_epi32(_mm512_srli_epi16(a, 4),
                                                 _mm512_and_si512(_mm512_slli_epi16(c, 2), top), fifteen, SELECT);
    const __m512i q2 = _mm512_ternarylogic_epi32(b, _mm512_and_si512(c, top), fifteen, SELECT);
    const __m512i q3 = _mm512_ternarylogic_epi32(_mm512_srli_epi16(b, 4),
                                                 _mm512_and_si512(_mm512_srli_epi16(c, 2), top), fifteen, SELECT);
    unit_dots(q0, q1, q2, q3, xq, n, k, a0, a1);
  }
  for (size_t i = 0; i < n; ++i) acc[i] = _mm512_add_epi32(a0[i], a1[i]);
}

// y[j] = fma(bias, sum, fma(scale, dot * x_scale, y[j])) for one block's 16 outputs of row j
// of x (the epilogue every object computes in this order).
static inline __attribute__((always_inline)) void epilogue16(__m512i dot_i32, __m512 sv, __m512 bv, float dx,
                                                             float xsum, float* yr) {
  const __m512 dot = _mm512_mul_ps(_mm512_cvtepi32_ps(dot_i32), _mm512_set1_ps(dx));
  _mm512_storeu_ps(yr, _mm512_fmadd_ps(bv, _mm512_set1_ps(xsum), _mm512_fmadd_ps(sv, dot, _mm512_loadu_ps(yr))));
}

static inline __attribute__((always_inline)) void group_rows(int bits, int fp4, int f16, const uint8_t* wg,
                                                             const xview_t* xp, size_t i, size_t n, size_t gs,
                                                             const void* s, const void* b, float* y, size_t stride) {
  __m512i a[PANEL];
  if (xp->b && !fp4 && (bits == 4 || bits == 8)) {
    group_dot_x8(bits, wg, xp->b + i, n, gs, a);
  } else if (bits == 4) {
    group_dot4(fp4, wg, xp->q + i, n, gs, a);
  } else if (bits == 3) {
    group_dot3(wg, xp->q + i, n, gs, a);
  } else if (bits == 6) {
    group_dot6(wg, xp->q + i, n, gs, a);
  } else {
    group_dot8(wg, xp->q + i, n, gs, a);
  }
  const __m512 sv = load16_scale(f16, s);
  const __m512 bv = fp4 ? _mm512_mul_ps(sv, _mm512_set1_ps(FP4_BIAS)) : load16_scale(f16, b);
  for (size_t j = 0; j < n; ++j) epilogue16(a[j], sv, bv, xp->scale[i + j], xp->sum[i + j], y + j * stride);
}
