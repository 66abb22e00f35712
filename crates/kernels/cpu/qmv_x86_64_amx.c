//! Fused dequantize + matrix-vector product for MLX affine 3-, 4-, 6- and 8-bit and FP4 weights (AMX-INT8).
//!
//! The AMX twin of qmv_x86_64.c: the same exported functions, layouts, driver (qmv.h) and
//! numerics, so its results are the same bits. Rows of x in panels of PANEL (and a last one of
//! at least WHOLE_PANEL_ROWS) run on AMX tiles. A panel's i16 group values are split into
//! bytes, x = 256 * hi + lo, and both
//! halves go into one tile of unsigned bytes (hi + 128 in the first np rows, lo in the next
//! np), so one `tdpbuud` (u8 x u8 -> i32) per block and chunk of k gives every row's
//! (hi + 128) . q and lo . q; with the block's sums of q (from the unpacked weights),
//! dot = 256 * C[j] + C[np + j] - 32768 * sum(q) is exact in i32 (|x| <= 32767, q <= 255,
//! group <= 128, so it fits; the wrapping intermediate sums do not matter). Then the same
//! f32 epilogue as the AVX-512 object, in the same order. Fewer rows (decode of one
//! sequence, bound by memory rather than arithmetic) run the AVX-512 VNNI arithmetic
//! (qmv_avx512.h), so this object is never slower than that one.
//!
//! Weights stay packed in memory: each block's group is unpacked into the tile-B layout in a
//! stack buffer (L1) and loaded into the B tiles once for up to PASS_PANELS panels of x (64
//! rows of a prompt chunk), which then go through them one after another (issue 39; before,
//! every panel of 8 rows unpacked every group again). The tiles are configured and released
//! within one exported call (IREE's worker threads run other code in between). The process
//! must have been granted AMX tile data (Linux `arch_prctl(ARCH_REQ_XCOMP_PERM,
//! XFEATURE_XTILEDATA)`), which the host side asks for before it chooses this object
//! (kernels::cpu::Isa::host_has). Stack: the largest export's frame is about 45 KB, qmv.h's
//! one-row path's 40 KB and the panels' 21 KB sharing it (IREE's worker threads have 128 KB).
//!
//! This host has no AMX: tests/tests/kernels_amx.rs runs this file with its tile
//! instructions emulated (below), so its bits are checked everywhere; its speed only on a CPU
//! with AMX.

// Panels of 4 rows or more go to the tiles (fewer do not pay for them).
#define WHOLE_PANEL_ROWS 4

#include <immintrin.h>

// qmv_avx512.h reads 3-bit and 6-bit groups as stored.
#define GROUP_ROWS_3 1
#define GROUP_ROWS_6 1
#include "qmv.h"
#include "qmv_avx512.h"

_Static_assert(PANEL == 8, "quantize_panel reduces 8 rows; the A tile holds 2 * PANEL <= 16 rows");

// One group of a panel, as the A tile loads it: rows MAX_GROUP apart, hi + 128 of the np rows
// of x, then their lo; with each row's scale and sum.
typedef struct {
  uint8_t a[2 * PANEL][MAX_GROUP] __attribute__((aligned(64)));
  float scale[PANEL], sum[PANEL];
} tpanel_t;

// The horizontal sums (or maxima) of 8 vectors, in the order of _mm512_reduce_add_ps (lane j
// plus lane j + 8, then + 4, + 2, + 1), as 8 floats in row order: the same bits as reducing
// each one alone, in about a quarter of the instructions. (No arrays: gcc keeps those in
// memory.)
#define REDUCE8(OP, v0, v1, v2, v3, v4, v5, v6, v7, out)                                               \
  do {                                                                                                 \
    /* Lanes 0-7 of both plus lanes 8-15 of both. */                                                   \
    const __m512 h0 = OP(_mm512_shuffle_f32x4(v0, v1, 0x44), _mm512_shuffle_f32x4(v0, v1, 0xEE));       \
    const __m512 h1 = OP(_mm512_shuffle_f32x4(v2, v3, 0x44), _mm512_shuffle_f32x4(v2, v3, 0xEE));       \
    const __m512 h2 = OP(_mm512_shuffle_f32x4(v4, v5, 0x44), _mm512_shuffle_f32x4(v4, v5, 0xEE));       \
    const __m512 h3 = OP(_mm512_shuffle_f32x4(v6, v7, 0x44), _mm512_shuffle_f32x4(v6, v7, 0xEE));       \
    /* Quarters 0 and 2 plus quarters 1 and 3: 128-bit lane l holds row l's four values (q0) and */  \
    /* row 4 + l's (q1). */                                                                            \
    const __m512 q0 = OP(_mm512_shuffle_f32x4(h0, h1, 0x88), _mm512_shuffle_f32x4(h0, h1, 0xDD));       \
    const __m512 q1 = OP(_mm512_shuffle_f32x4(h2, h3, 0x88), _mm512_shuffle_f32x4(h2, h3, 0xDD));       \
    const __m512 e = OP(_mm512_shuffle_ps(q0, q1, 0x44), _mm512_shuffle_ps(q0, q1, 0xEE));             \
    const __m512 f = OP(e, _mm512_shuffle_ps(e, e, 0xB1)); /* lane l: row l twice, row 4 + l twice */   \
    out = _mm512_castps512_ps256(                                                                      \
        _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 2, 6, 10, 14, 0, 0, 0, 0, 0, 0, 0, 0), f));   \
  } while (0)

// One group of the panel's np rows (K apart) as bytes: the i16 values quantize_group gives
// each row for `levels`, as hi + 128 and lo, with the same scales and sums (the x8 exports'
// values too: their hi is 0 or -1). One pass for every row's maximum and sum (reduced
// together), then one for the values.
static inline void quantize_panel(const float* xg, size_t K, size_t gs, float levels, tpanel_t* tp, size_t np) {
  // Rows past the panel repeat its last (unused); rows inner: 16 independent chains.
  const float* row[PANEL];
  for (size_t i = 0; i < PANEL; ++i) row[i] = xg + (i < np ? i : np - 1) * K;
#define ROW_PASS(i)                                \
  const __m512 v##i = _mm512_loadu_ps(row[i] + k); \
  m##i = _mm512_max_ps(m##i, _mm512_abs_ps(v##i)); \
  s##i = _mm512_add_ps(s##i, v##i)
  __m512 m0, m1, m2, m3, m4, m5, m6, m7, s0, s1, s2, s3, s4, s5, s6, s7;
  m0 = m1 = m2 = m3 = m4 = m5 = m6 = m7 = s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = _mm512_setzero_ps();
  for (size_t k = 0; k < gs; k += 16) {
    ROW_PASS(0); ROW_PASS(1); ROW_PASS(2); ROW_PASS(3); ROW_PASS(4); ROW_PASS(5); ROW_PASS(6); ROW_PASS(7);
  }
#undef ROW_PASS
  __m256 m, sum;
  REDUCE8(_mm512_max_ps, m0, m1, m2, m3, m4, m5, m6, m7, m);
  REDUCE8(_mm512_add_ps, s0, s1, s2, s3, s4, s5, s6, s7, sum);
  _mm256_store_ps(tp->sum, sum);
  _mm256_store_ps(tp->scale, _mm256_div_ps(m, _mm256_set1_ps(levels)));
  float inv[PANEL] __attribute__((aligned(32)));
  _mm256_store_ps(inv, _mm256_maskz_div_ps(_mm256_cmp_ps_mask(m, _mm256_setzero_ps(), _CMP_GT_OQ),
                                           _mm256_set1_ps(levels), m));
  // Byte 0 (lo) of each of the 32 i32 values of k..k+31 in k order, then byte 1 (hi; exact:
  // |value| <= 32767).
  const __m512i order = _mm512_set_epi8(  // byte 63 first
      125, 121, 117, 113, 109, 105, 101, 97, 93, 89, 85, 81, 77, 73, 69, 65, 61, 57, 53, 49, 45, 41, 37, 33, 29, 25,
      21, 17, 13, 9, 5, 1, 124, 120, 116, 112, 108, 104, 100, 96, 92, 88, 84, 80, 76, 72, 68, 64, 60, 56, 52, 48, 44,
      40, 36, 32, 28, 24, 20, 16, 12, 8, 4, 0);
  // hi + 128 flips the top bit of the high bytes.
  const __m512i bias = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi8((char)0x80), 1);
  for (size_t i = 0; i < np; ++i) {
    const __m512 f = _mm512_set1_ps(inv[i]);
    for (size_t k = 0; k < gs; k += 32) {
      const __m512i r0 = quantize16(row[i] + k, f);
      // Groups are multiples of 16: a last half step has no second 16 (and must not read it).
      const __m512i r1 = k + 16 < gs ? quantize16(row[i] + k + 16, f) : _mm512_setzero_si512();
      const __m512i v = _mm512_xor_si512(_mm512_permutex2var_epi8(r0, order, r1), bias);
      _mm256_store_si256((__m256i*)(tp->a[np + i] + k), _mm512_castsi512_si256(v));
      _mm256_store_si256((__m256i*)(tp->a[i] + k), _mm512_extracti64x4_epi64(v, 1));
    }
  }
}

// Tiles (numbers are literals: gcc's tile intrinsics paste them into the register name). A
// group of up to 64 k is one chunk, a larger one (up to 128) two chunks of half of it, each
// with an A tile (a panel's x) and a B tile (a block's weights). Two C tiles alternate
// between panels, so one panel's products run while the previous panel's results are stored
// and finished.
#define A_0 0
#define A_1 1
#define B_0 2
#define B_1 3
#define C_0 4
#define C_1 5

typedef struct {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} tilecfg_t;

#ifndef MLX_IREE_AMX_EMULATE
// gcc's tile intrinsics do not tell the compiler which memory `ldtilecfg` and `tileloadd` read
// (it may then drop or sink the stores that fill it); these do. `tilestored` (gcc's, with a
// memory clobber) is right as it is.
static inline void load_tile_config(const tilecfg_t* cfg) { __asm__ volatile("ldtilecfg %0" ::"m"(*cfg)); }
#define TILE_LOAD(t, base, stride) TILE_LOAD_(t, base, stride) /* expands t to its number */
#define TILE_LOAD_(t, base, stride) \
  __asm__ volatile("tileloadd (%0,%1,1), %%tmm" #t ::"r"((const void*)(base)), "r"((long)(stride)) : "memory")
#else
// The tile instructions this object uses, in plain C, as the Intel SDM defines them (palette
// 1: 8 tiles of up to 16 rows of 64 bytes), for a test build (`-DMLX_IREE_AMX_EMULATE`, no
// AMX flags) that runs this object's arithmetic on any AVX-512 VBMI host: tests/tests/
// kernels_amx.rs links it with the freestanding driver (qmv_qemu_driver.c), one thread. Its
// tiles are one static set, so never in IREE's executables (several worker threads).
// Shapes the hardware refuses (#UD, #GP) trap here too. `mlx_iree_amx_emulated_dots`
// counts `tdpbuud`s, so the test knows the tiles ran. Not inlined: inlined at every tile
// operation, clang took twice as long over the object (35 s against 19).
static struct {
  uint8_t rows[8];
  uint16_t colsb[8];
  uint8_t t[8][16][64];
} amx_emu;
uint64_t mlx_iree_amx_emulated_dots;

static inline void amx_emu_check(int ok) {
  if (!ok) __builtin_trap();
}

static __attribute__((noinline)) void load_tile_config(const tilecfg_t* cfg) {
  amx_emu_check(cfg->palette == 1);
  for (int t = 0; t < 8; ++t) {
    amx_emu_check(cfg->rows[t] <= 16 && cfg->colsb[t] <= 64 && (cfg->rows[t] == 0) == (cfg->colsb[t] == 0));
    amx_emu.rows[t] = cfg->rows[t];
    amx_emu.colsb[t] = cfg->colsb[t];
    for (int r = 0; r < 16; ++r)
      for (int c = 0; c < 64; ++c) amx_emu.t[t][r][c] = 0;
  }
}

// tileloadd: the configured rows and bytes; the rest of the tile zero.
#define TILE_LOAD(t, base, stride) amx_emu_load(t, (const uint8_t*)(base), (size_t)(stride))
static __attribute__((noinline)) void amx_emu_load(int t, const uint8_t* base, size_t stride) {
  amx_emu_check(amx_emu.rows[t] > 0);
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 64; ++c)
      amx_emu.t[t][r][c] = r < amx_emu.rows[t] && c < amx_emu.colsb[t] ? base[r * stride + c] : 0;
}

#undef _tile_zero
#undef _tile_dpbuud
#undef _tile_stored
#undef _tile_release
#define _tile_zero(t) amx_emu_zero(t)
#define _tile_dpbuud(c, a, b) amx_emu_dpbuud(c, a, b)
#define _tile_stored(t, base, stride) amx_emu_store(t, (uint8_t*)(base), (size_t)(stride))
#define _tile_release() amx_emu_release()

static __attribute__((noinline)) void amx_emu_zero(int t) {
  amx_emu_check(amx_emu.rows[t] > 0);
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 64; ++c) amx_emu.t[t][r][c] = 0;
}

// C[m].dword[n] += sum over k < A's colsb / 4 and i < 4 of A[m].byte[4k + i] * B[k].byte[4n
// + i], unsigned, wrapping in 32 bits; C's rows and A's must agree, A's dwords and B's rows,
// C's bytes and B's.
static __attribute__((noinline)) void amx_emu_dpbuud(int c, int a, int b) {
  amx_emu_check(amx_emu.rows[c] > 0 && amx_emu.rows[c] == amx_emu.rows[a]);
  amx_emu_check(amx_emu.colsb[a] % 4 == 0 && amx_emu.colsb[a] / 4 == amx_emu.rows[b]);
  amx_emu_check(amx_emu.colsb[c] == amx_emu.colsb[b] && c != a && c != b && a != b);
  for (int m = 0; m < amx_emu.rows[c]; ++m)
    for (int n = 0; n < amx_emu.colsb[c] / 4; ++n) {
      uint32_t acc;
      __builtin_memcpy(&acc, &amx_emu.t[c][m][4 * n], 4);
      for (int k = 0; k < amx_emu.rows[b]; ++k)
        for (int i = 0; i < 4; ++i)
          acc += (uint32_t)amx_emu.t[a][m][4 * k + i] * (uint32_t)amx_emu.t[b][k][4 * n + i];
      __builtin_memcpy(&amx_emu.t[c][m][4 * n], &acc, 4);
    }
  ++mlx_iree_amx_emulated_dots;
}

static __attribute__((noinline)) void amx_emu_store(int t, uint8_t* base, size_t stride) {
  amx_emu_check(amx_emu.rows[t] > 0);
  for (int r = 0; r < amx_emu.rows[t]; ++r)
    for (int c = 0; c < amx_emu.colsb[t]; ++c) base[r * stride + c] = amx_emu.t[t][r][c];
}

// The tiles back in their initial state: unconfigured, so using one traps.
static __attribute__((noinline)) void amx_emu_release(void) {
  for (int t = 0; t < 8; ++t) amx_emu.rows[t] = (uint8_t)(amx_emu.colsb[t] = 0);
}
#endif

static inline size_t chunk_of(size_t gs) { return gs <= 64 ? gs : gs / 2; }

// Tiles for np rows of x and groups of gs.
static inline void configure_tiles(size_t np, size_t gs) {
  tilecfg_t cfg __attribute__((aligned(64)));
  _mm512_store_si512(&cfg, _mm512_setzero_si512());  // no memset: freestanding
  cfg.palette = 1;
  const size_t kc = chunk_of(gs);
  for (int t = 0; t <= C_1; ++t) {
    const int a = t <= A_1, b = t >= B_0 && t <= B_1;
    cfg.rows[t] = (uint8_t)(b ? kc / 4 : 2 * np);
    cfg.colsb[t] = (uint16_t)(a ? kc : 64);
  }
  load_tile_config(&cfg);
}

// A 4-bit tile (byte 2r + p: q[r, k + p] low nibble, q[r, k + 2 + p] high) as rows of the
// tile-B layout: q[r, k..k+3] in the 4 bytes of dword r. Zero-extending row r's word to a
// dword and or-ing it with itself shifted by 12 puts the four nibbles in the bytes' low
// halves. (Splitting two tiles' nibbles and permuting bytes, as 8-bit does, measured 5%
// slower.)
static inline __attribute__((always_inline)) __m512i nibble_bytes(__m256i tile) {
  const __m512i v = _mm512_cvtepu16_epi32(tile);
  return _mm512_ternarylogic_epi32(v, _mm512_slli_epi32(v, 12), _mm512_set1_epi8(0x0F), 0xA8);  // (a | b) & c
}

// kc k of a block's group (16 rows) in the tile-B layout: row k/4 holds, for each of the 16
// rows r, q[r, k..k+3] in 4 bytes. Returns each row's sum of q (i32 lanes). 4-bit tiles
// through nibble_bytes; byte sums of up to 16 of their values fit a byte. With `fp4` each
// nibble is an E2M1 code, its q (up to 24, so byte sums could overflow: summed in i32 as it
// goes) looked up in FP4_TABLE (`vpshufb`).
static inline __attribute__((always_inline)) __m512i unpack4(int fp4, const uint8_t* wg, size_t kc, uint8_t* bt) {
  const __m512i ones = _mm512_set1_epi8(1);
  const __m512i table = _mm512_broadcast_i32x4(_mm_setr_epi8(FP4_TABLE));
  __m512i sum = _mm512_setzero_si512(), sum32 = _mm512_setzero_si512();
  for (size_t k = 0; k < kc; k += 4, wg += 32, bt += 64) {
    __m512i u = nibble_bytes(_mm256_loadu_si256((const __m256i*)wg));
    if (fp4) {
      u = _mm512_shuffle_epi8(table, u);
      sum32 = _mm512_dpbusd_epi32(sum32, u, ones);
    } else {
      sum = _mm512_add_epi8(sum, u);
    }
    _mm512_store_si512(bt, u);
  }
  return fp4 ? sum32 : _mm512_dpbusd_epi32(_mm512_setzero_si512(), sum, ones);
}

// 8-bit tiles (byte 2r + p: q[r, k + p]), two per row of B: one byte permutation interleaves
// their words.
static inline __attribute__((always_inline)) __m512i tile_pair8(__m512i two_tiles) {
  const __m512i order = _mm512_set_epi32(0x3F3E1F1E, 0x3D3C1D1C, 0x3B3A1B1A, 0x39381918, 0x37361716, 0x35341514,
                                         0x33321312, 0x31301110, 0x2F2E0F0E, 0x2D2C0D0C, 0x2B2A0B0A, 0x29280908,
                                         0x27260706, 0x25240504, 0x23220302, 0x21200100);
  return _mm512_permutexvar_epi8(order, two_tiles);
}

static inline __attribute__((always_inline)) __m512i unpack8(const uint8_t* wg, size_t kc, uint8_t* bt) {
  __m512i sum = _mm512_setzero_si512();
  for (size_t k = 0; k < kc; k += 4, wg += 64, bt += 64) {
    const __m512i u = tile_pair8(_mm512_loadu_si512(wg));
    _mm512_store_si512(bt, u);
    sum = _mm512_dpbusd_epi32(sum, u, _mm512_set1_epi8(1));
  }
  return sum;
}

// 3-bit units (qmv.h's layout: 32 k, each word lane a 48-bit stream) as unpack4's rows of B:
// qmv.h's widen_group makes the chunk's 4-bit tiles (the code the AVX2 and aarch64 objects
// run), then unpack4.
static inline __attribute__((always_inline)) __m512i unpack3(const uint8_t* wg, size_t kc, uint8_t* bt) {
  uint8_t tiles[64 * 8] __attribute__((aligned(64)));  // kc <= 64 k: 8 bytes a k
  return unpack4(0, widen_group(3, wg, kc, tiles), kc, bt);
}

// 6-bit units (8 k: the 8-bit tiles' low nibbles, then their top 2 bits) as unpack8's rows of
// B: each pair of 8-bit tiles built in one register (the tiles of qmv.h's widen_group, whose
// portable byte operations took 1.15-1.2x the time here), then interleaved.
static inline __attribute__((always_inline)) __m512i unpack6(const uint8_t* wg, size_t kc, uint8_t* bt) {
  const __m512i ones = _mm512_set1_epi8(1), nib = _mm512_set1_epi8(0x0F), top = _mm512_set1_epi8(0x30);
  __m512i sum = _mm512_setzero_si512();
  for (size_t k = 0; k < kc; k += 8, wg += 96, bt += 128) {
    // Planes a (tiles 0, 1), b (tiles 2, 3), c (the top bits), each twice in a register.
    const __m512i a = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i*)wg));
    const __m512i b = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i*)(wg + 32)));
    const __m512i c = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i*)(wg + 64)));
    // Tiles 0 | 1: a's low nibbles | high nibbles, with c's bits 0-1 | 2-3 moved to 4-5.
    const __m512i a_n = _mm512_mask_srli_epi16(a, 0xFFFF0000, a, 4);
    const __m512i c01 = _mm512_mask_slli_epi16(_mm512_slli_epi16(c, 4), 0xFFFF0000, c, 2);
    const __m512i t01 = _mm512_ternarylogic_epi32(a_n, _mm512_and_si512(c01, top), nib, SELECT);
    // Tiles 2 | 3: b's low | high nibbles, with c's bits 4-5 | 6-7.
    const __m512i b_n = _mm512_mask_srli_epi16(b, 0xFFFF0000, b, 4);
    const __m512i c23 = _mm512_mask_srli_epi16(c, 0xFFFF0000, c, 2);
    const __m512i t23 = _mm512_ternarylogic_epi32(b_n, _mm512_and_si512(c23, top), nib, SELECT);
    const __m512i u0 = tile_pair8(t01), u1 = tile_pair8(t23);
    _mm512_store_si512(bt, u0);
    _mm512_store_si512(bt + 64, u1);
    sum = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(sum, u0, ones), u1, ones);
  }
  return sum;
}

// A block's group (one or two chunks) into bt[0], bt[1]; returns 32768 * its rows' sums of
// q, the correction for hi + 128.
static inline __attribute__((always_inline)) __m512i unpack_chunk(int bits, int fp4, const uint8_t* wg, size_t kc,
                                                                 uint8_t* bt) {
  return bits == 4 ? unpack4(fp4, wg, kc, bt) : bits == 3 ? unpack3(wg, kc, bt) : bits == 6 ? unpack6(wg, kc, bt)
                                                                                           : unpack8(wg, kc, bt);
}

static inline __attribute__((always_inline)) __m512i unpack(int bits, int fp4, const uint8_t* wg, size_t gs,
                                                           uint8_t (*bt)[16 * 64]) {
  const size_t kc = chunk_of(gs);
  __m512i sum = unpack_chunk(bits, fp4, wg, kc, bt[0]);
  if (kc < gs) sum = _mm512_add_epi32(sum, unpack_chunk(bits, fp4, wg + kc * bits * 16 / 8, kc, bt[1]));
  return _mm512_slli_epi32(sum, 15);
}

// One block's stored C tile (np rows of (hi + 128) dots, then np rows of lo dots, 16 outputs
// each) through the epilogue: the exact dots, then what group_rows does with its own.
static inline __attribute__((always_inline)) void finish(int fp4, int f16, const int32_t (*c)[16], __m512i corr,
                                                         const void* s, const void* b, const tpanel_t* tp,
                                                         size_t np, float* y, size_t stride) {
  const __m512 sv = load16_scale(f16, s);
  const __m512 bv = fp4 ? _mm512_mul_ps(sv, _mm512_set1_ps(FP4_BIAS)) : load16_scale(f16, b);
  for (size_t j = 0; j < np; ++j) {
    const __m512i hl = _mm512_add_epi32(_mm512_slli_epi32(_mm512_load_si512(c[j]), 8), _mm512_load_si512(c[np + j]));
    epilogue16(_mm512_sub_epi32(hl, corr), sv, bv, tp->scale[j], tp->sum[j], y + j * stride);
  }
}

// Panels of x one pass holds (about 2 KB each, on the stack): a block's group is unpacked and
// loaded into its B tiles once for all of them.
#define PASS_PANELS 8

// Panel p's products into C tile P (0 or 1; a literal, as the tile intrinsics need) from the
// A tiles just loaded and the block's B tiles.
#define TILE_DOTS(P, two)               \
  do {                                  \
    _tile_zero(C_##P);                  \
    _tile_dpbuud(C_##P, A_0, B_0);      \
    if (two) _tile_dpbuud(C_##P, A_1, B_1); \
  } while (0)

// qmv.h's whole rows: per pass of up to PASS_PANELS panels and per group, every panel's group
// quantized, then per block the group unpacked into the B tiles once, and the panels through
// them in turn, two C tiles alternating, so one panel's products run while the previous
// panel's results are stored and finished. Each output still sees its groups in order.
static inline void whole_rows(int bits, int fp4, int f16, const float* x, size_t K, const uint8_t* w, size_t block_bytes,
                              const void* s, const void* b, size_t T, size_t gs, float* y, size_t stride, size_t nb,
                              float levels) {
  tpanel_t tp[PASS_PANELS];
  uint8_t bt[2][16 * 64] __attribute__((aligned(64)));
  int32_t c[2][2 * PANEL][16] __attribute__((aligned(64)));
  const size_t G = K / gs, group_bytes = gs * bits * 16 / 8, elem = scale_bytes(f16), kc = chunk_of(gs);
  const int two = kc < gs;
  // A and C tiles of 2 * PANEL rows: a last panel of fewer rows leaves the rest of its A tile
  // as an earlier panel left it, and its C tile's rows past 2 * np unread.
  configure_tiles(PANEL, gs);
  // The blocks are read side by side, group by group: each block's stream asks for its share
  // of qmv.h's PREFETCH_AHEAD.
  const size_t ahead = PREFETCH_AHEAD / (group_bytes * nb) + 1;
  for (size_t t0 = 0; t0 < T; t0 += PASS_PANELS * PANEL) {
    const size_t rows = T - t0 < PASS_PANELS * PANEL ? T - t0 : PASS_PANELS * PANEL;
    const size_t panels = (rows + PANEL - 1) / PANEL;
#define PANEL_ROWS(p) (rows - (p) * PANEL < PANEL ? rows - (p) * PANEL : PANEL)
    for (size_t g = 0; g < G; ++g) {
      for (size_t j = 0; j < nb; ++j) {
        const size_t at = (j * G + g + ahead) * 16 * elem;
        prefetch_group(w + j * block_bytes + (g + ahead) * group_bytes, (const char*)s + at, (const char*)b + at,
                       group_bytes, 16 * elem);
      }
      for (size_t p = 0; p < panels; ++p)
        quantize_panel(x + (t0 + p * PANEL) * K + g * gs, K, gs, levels, &tp[p], PANEL_ROWS(p));
      for (size_t j = 0; j < nb; ++j) {
        const __m512i corr = unpack(bits, fp4, w + j * block_bytes + g * group_bytes, gs, bt);
        TILE_LOAD(B_0, bt[0], 64);
        if (two) TILE_LOAD(B_1, bt[1], 64);
        const size_t sg = (j * G + g) * 16 * elem;
        for (size_t p = 0; p <= panels; ++p) {
          if (p < panels) {
            TILE_LOAD(A_0, tp[p].a[0], MAX_GROUP);
            if (two) TILE_LOAD(A_1, tp[p].a[0] + kc, MAX_GROUP);
            if (p & 1) {
              TILE_DOTS(1, two);
            } else {
              TILE_DOTS(0, two);
            }
          }
          if (p > 0) {
            const size_t q = p - 1;
            if (q & 1) {
              _tile_stored(C_1, c[1], 64);
            } else {
              _tile_stored(C_0, c[0], 64);
            }
            finish(fp4, f16, c[q & 1], corr, (const char*)s + sg, (const char*)b + sg, &tp[q], PANEL_ROWS(q),
                   y + (t0 + q * PANEL) * stride + j * 16, stride);
          }
        }
      }
    }
#undef PANEL_ROWS
  }
  _tile_release();
}

#include "qrows.h"
#include "vf16_avx512.h"
#include "attn.h"
// Three state rows of 128 floats (24 of the 32 zmm registers) side by side: 1.8x one row's speed over a
// prompt chunk (their chains of dependent operations overlap).
#define DELTA_STATE_VF 24
#include "delta.h"
// 24 of the 32 zmm registers accumulate a tile of 12 rows x 2 blocks.
#define HMV_ROWS 12
#include "hmv.h"
