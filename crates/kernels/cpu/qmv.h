//! The matvec driver shared by every kernel object (x86-64 and aarch64): the exported
//! `mlx_iree_qmv*` functions, which walk panels of rows of x, groups and row blocks, and leave
//! the arithmetic to the two functions each instruction set's file defines after including
//! this header:
//!
//! - `quantize_group(xg, gs, levels, q, b, scale, sum)`: one group of x to integers of at most
//!   `levels` (32767, or 127 for the `_x8` exports) against its largest magnitude (`scale` =
//!   that / levels), held as i16 at `q`, and its f32 sum; with `b` (x8 only, may be ignored by
//!   an instruction set whose `group_rows` does not read it) the same values as bytes in
//!   `X8_ORDER`;
//! - `group_rows(bits, fp4, f16, wg, xp, i, n, gs, s, b, y, stride)`: for panel rows i..i+n
//!   and one 16-row block, the group's exact integer dots against the tiles at `wg`, then
//!   `y = fma(bias, sum, fma(scale, dot * x_scale, y))` in f32 for each of the 16 outputs at
//!   `y + j * stride`. `bits`, `fp4`, `f16` and `n` are constants at every call, so each call
//!   is compiled for them with its accumulators in registers.
//!
//! An instruction set that computes whole panels at once (AMX tiles) also defines, before
//! including this header, `WHOLE_PANEL_ROWS` (the fewest rows of a panel worth it; smaller
//! panels go through the functions above) and, after, `whole_rows(bits, fp4, f16, x, K, w,
//! block_bytes, s, b, T, gs, y, stride, nb, levels)`: T rows of x (K apart; T not a
//! constant), in panels of PANEL and a last one of at least WHOLE_PANEL_ROWS, times nb
//! consecutive blocks (weights block_bytes apart, scales and biases from their first
//! block's), every group, x quantized to `levels`, added to y (rows `stride` apart, zero on
//! entry); each output sees its groups in order, as `group_rows` gives them.
//!
//! The `_x8` exports (`kernels::cpu::Entry::x8`) quantize each group of x to 8 bits (127
//! levels) instead of 16: llama.cpp's int8 activations, so that an instruction set with a
//! byte dot product (AVX-512 VNNI's `vpdpbusd`) takes 4 k a lane per instruction, twice the
//! i16 products'. The dots stay exact integers and the epilogue the same, so every object
//! still computes the same bits, whatever instructions it uses for them.
//!
//! Layouts (written by crates/kernels/src/cpu.rs, `repack_*`), per block of 16 rows,
//! consecutive along k, in 32-byte tiles:
//! - 4-bit: 16 rows x 4 k; byte 2r + p holds q[r, k0 + p] in its low nibble and
//!   q[r, k0 + 2 + p] in its high nibble.
//! - 8-bit: 16 rows x 2 k; byte 2r + p holds q[r, k0 + p].
//! Scales and biases: [O / 16][K / group_size][16], f16 or f32. y[T, O] = x[T, K] . W^T with
//! W[o, k] = scale[o, g] * q[o, k] + bias[o, g], g = k / group_size. Offsets (`*_off`) count
//! elements of the pointer's type, as IREE passes them.
//!
//! - 3-bit: 16 rows x 32 k in 192 bytes, three planes of 32 little-endian 16-bit words. Word
//!   lane L = 2r + p of planes 0, 1 and 2 (bits 0-15, 16-31, 32-47) is one 48-bit stream of
//!   the 16 values q[r, k0 + p + 2s], s = 0..15, value s at bits 3s..3s+2 (two of them, s = 5
//!   and 10, straddle two words). Each value is a shift and a mask within its 16-bit lane, no
//!   operation across lanes, in the pairs of k (lane 2r + p: k + p) the products take. Group
//!   sizes are multiples of 32 (kernels::cpu::supports).
//! - 6-bit: 16 rows x 8 k in 96 bytes, the four 8-bit tiles of those k split into planes: 32
//!   bytes of low nibbles of q[r, k0 + p] and q[r, k0 + 2 + p] (low, high), 32 of q[r, k0 + 4 + p]
//!   and q[r, k0 + 6 + p], then 32 bytes of the four values' top 2 bits (at bits 0, 2, 4, 6).
//!   Both read MLX's values as stored (3/4 of the 4-bit and 8-bit tiles' bytes). `widen_group`
//!   turns a group of them into the 4-bit (8-bit) tiles with a few vector operations, once per
//!   group and block, in a stack buffer (L1), and the 4-bit (8-bit) arithmetic takes it from
//!   there: the same integer dots, so the same bits as the exact 4-bit (8-bit) copy. An
//!   instruction set may read them as stored in `group_rows` instead (GROUP_ROWS_3,
//!   GROUP_ROWS_6).
//! The scales' type (`f16` in the functions below): 0 f32, 1 f16, 2 E8M0 (FP4 only: mxfp4's
//! own scale bytes, read as `s / 2` = 2^(e - 128), computed exactly as the f32 with the bits
//! (e + 64) << 23 times 2^-65; the `*fp4_e8m0` exports). E8M0's 255 (NaN in MLX) is not a
//! scale any checkpoint holds and reads as garbage.
//! FP4 (`fp4`, the `*fp4_*` exports; 4-bit tiles): each nibble is an E2M1 code (MLX's mxfp4
//! and nvfp4), read through FP4_TABLE as q = 2v + 12 (v its value, so 0..24), with the scale
//! stored as s/2 and no biases: the bias is -12 * scale (= -6s), computed, not read. These are
//! the values of the exact 8-bit affine copy (`weights::AffineCopy`), so an FP4 export gives
//! the bits of the 8-bit export on that copy, from half its bytes.

#include <stddef.h>
#include <stdint.h>

// E2M1 code -> 2v + 12 (codes 8..15 are the negatives of 0..7), and the bias per unit of scale.
#define FP4_TABLE 12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0
#define FP4_BIAS (-12.0f)

// Largest group size (kernels::cpu::supports); group sizes are multiples of 16.
#define MAX_GROUP 128
// The integer range x is quantized to: the exact exports' 15 bits, the `_x8` exports' 7.
#define LEVELS_I16 32767.0f
#define LEVELS_I8 127.0f
// Row blocks per workgroup (kernels::cpu::BLOCKS_PER_WORKGROUP).
#define BLOCKS 4
// Rows of x quantized together (2 KB of i16 on the stack, which IREE's worker threads keep
// small): a workgroup reads its weights from memory once per panel, not once per row.
#define PANEL 8
// Largest K whose whole row of x the one-row path quantizes up front (32 KB of i16 and 8 KB
// of scales and sums on the stack, beside the AMX object's 13 KB; IREE's worker threads have
// 128 KB). Longer rows take the panel path.
#define ROW_MAX_K 16384

// Bytes of the weight stream a one-row matvec asks for ahead of the group it reads
// (software prefetch). One row of x does little arithmetic per byte, so the kernel waits on
// memory unless requests run ahead of it; the hardware's own prefetch did not (on a Xeon
// with AMX, weights beyond the last-level cache: 4 KB ahead took one thread from 12.5 to
// about 25 GMAC/s and two at once from 12.5 to 21 each; docs/PERFORMANCE.md, "Prefetch").
// Scales and biases are asked for the same number of groups ahead.
#define PREFETCH_AHEAD 4096
#define CACHE_LINE 64

typedef struct {
  int16_t q[PANEL][MAX_GROUP] __attribute__((aligned(64)));
  // The x8 exports' values again as bytes, each 4 k in X8_ORDER (for `vpdpbusd`).
  int8_t b[PANEL][MAX_GROUP] __attribute__((aligned(64)));
  float scale[PANEL];
  float sum[PANEL];
} xpanel_t;

// The order of each 4 k in the byte copy of x (k0, k0 + 2, k0 + 1, k0 + 3): the order a 4-bit
// tile's lane holds a row's values in once its nibbles are spread to bytes (and two 8-bit
// tiles' once interleaved).
#define X8_ORDER 0, 2, 1, 3, 4, 6, 5, 7, 8, 10, 9, 11, 12, 14, 13, 15

// The rows of x `group_rows` reads: row j's group values at q[j] (MAX_GROUP apart), its scale
// and sum at scale[j] and sum[j]; `b`: the same values as bytes (b[j], in X8_ORDER) where x
// is quantized to 8 bits and the panel path has them written, else NULL. A view of a panel,
// or of one row's whole quantized x.
typedef struct {
  const int16_t (*q)[MAX_GROUP];
  const int8_t (*b)[MAX_GROUP];
  const float* scale;
  const float* sum;
} xview_t;

// The width of the tiles a packing is multiplied in: 3-bit and 6-bit groups are widened into
// 4-bit and 8-bit tiles first (`widen_group`).
static inline __attribute__((always_inline)) int tile_bits(int bits) { return bits == 3 ? 4 : bits == 6 ? 8 : bits; }

typedef uint8_t u8x32 __attribute__((vector_size(32)));
static inline __attribute__((always_inline)) u8x32 load32(const uint8_t* p) {
  u8x32 v;
  __builtin_memcpy(&v, p, 32);
  return v;
}
static inline __attribute__((always_inline)) void store32(uint8_t* p, u8x32 v) { __builtin_memcpy(p, &v, 32); }
typedef uint16_t u16x32 __attribute__((vector_size(64)));
static inline __attribute__((always_inline)) u16x32 load_words(const uint8_t* p) {
  u16x32 v;
  __builtin_memcpy(&v, p, 64);
  return v;
}

// Value s (0..15, a constant) of every word lane of a 3-bit unit's planes w0, w1, w2: bits
// 3s..3s+2 of each lane's 48-bit stream, in the low bits of its word.
static inline __attribute__((always_inline)) u16x32 unit3_value(u16x32 w0, u16x32 w1, u16x32 w2, int s) {
  const int at = 3 * s;
  u16x32 v;
  if (at + 3 <= 16) {
    v = w0 >> at;
  } else if (at < 16) {
    v = (w0 >> at) | (w1 << (16 - at));
  } else if (at + 3 <= 32) {
    v = w1 >> (at - 16);
  } else if (at < 32) {
    v = (w1 >> (at - 16)) | (w2 << (32 - at));
  } else {
    v = w2 >> (at - 32);
  }
  return v & 7;
}

// A group (gs k of one block) of 3-bit or 6-bit values as the 4-bit or 8-bit tiles of the same
// values, at `buf` (gs * 8 or gs * 16 bytes); returns where the tiles are: `wg` itself for the
// other widths. Each tile is written by one 32-byte store, the size the products load it at
// (a load spanning two stores would wait for both to reach the cache: twice the time).
static inline __attribute__((always_inline)) const uint8_t* widen_group(int bits, const uint8_t* wg, size_t gs,
                                                                        uint8_t* buf) {
  if (bits == 3) {
    for (size_t k = 0; k < gs; k += 32, wg += 192) {
      const u16x32 w0 = load_words(wg), w1 = load_words(wg + 64), w2 = load_words(wg + 128);
      // Tile t (k + 4t): lane L's values s = 2t (low nibble) and 2t + 1 (high).
#pragma GCC unroll 8  // unit3_value's shifts and branches are constants only when unrolled
      for (int t = 0; t < 8; ++t) {
        const u16x32 pair = unit3_value(w0, w1, w2, 2 * t) | unit3_value(w0, w1, w2, 2 * t + 1) << 4;
        store32(buf + k * 8 + t * 32, __builtin_convertvector(pair, u8x32));
      }
    }
    return buf;
  }
  if (bits == 6) {
    for (size_t k = 0; k < gs; k += 8, wg += 96) {
      const u8x32 a = load32(wg), b = load32(wg + 32), c = load32(wg + 64);
      uint8_t* t = buf + k * 16;
      store32(t, (a & 0xF) | ((c << 4) & 0x30));
      store32(t + 32, (a >> 4) | ((c << 2) & 0x30));
      store32(t + 64, (b & 0xF) | (c & 0x30));
      store32(t + 96, (b >> 4) | ((c >> 2) & 0x30));
    }
    return buf;
  }
  return wg;
}

// Whether the instruction set's `group_rows` reads 3-bit (6-bit) groups as stored: its file
// defines GROUP_ROWS_3 (GROUP_ROWS_6) as 1 before including this header; else they are
// widened first and it is given the 4-bit (8-bit) tiles.
#ifndef GROUP_ROWS_3
#define GROUP_ROWS_3 0
#endif
#ifndef GROUP_ROWS_6
#define GROUP_ROWS_6 0
#endif
static inline __attribute__((always_inline)) int reads_stored(int bits) {
  return bits == 3 ? GROUP_ROWS_3 : bits == 6 ? GROUP_ROWS_6 : 1;
}
static inline __attribute__((always_inline)) int rows_bits(int bits) { return reads_stored(bits) ? bits : tile_bits(bits); }
static inline __attribute__((always_inline)) const uint8_t* rows_widen(int bits, const uint8_t* wg, size_t gs,
                                                                       uint8_t* buf) {
  return reads_stored(bits) ? wg : widen_group(bits, wg, gs, buf);
}

// Bytes a scale (or bias) takes, for the scales' type `f16` (0 f32, 1 f16, 2 E8M0).
static inline __attribute__((always_inline)) size_t scale_bytes(int f16) { return f16 == 2 ? 1 : f16 ? 2 : 4; }
// 2^-65, the factor that takes (e + 64) << 23 to an E8M0 scale's s / 2.
#define E8M0_HALF 0x1p-65f

// Pair k, k+1 of a quantized group as one 32-bit value (low word = k), to broadcast.
static inline int32_t pair_of(const int16_t* q, size_t k) {
  int32_t v;
  __builtin_memcpy(&v, q + k, 4);
  return v;
}

static inline void quantize_group(const float* xg, size_t gs, float levels, int16_t* q, int8_t* b, float* scale,
                                  float* sum);
static inline __attribute__((always_inline)) void group_rows(int bits, int fp4, int f16, const uint8_t* wg,
                                                             const xview_t* xp, size_t i, size_t n, size_t gs,
                                                             const void* s, const void* b, float* y, size_t stride);
#ifdef WHOLE_PANEL_ROWS
static inline void whole_rows(int bits, int fp4, int f16, const float* x, size_t K, const uint8_t* w, size_t block_bytes,
                              const void* s, const void* b, size_t T, size_t gs, float* y, size_t stride, size_t nb,
                              float levels);
#endif

// Asks for [p, p + bytes) to be brought into the cache; no effect on any result (a
// prefetch never faults, so addresses past a buffer's end are harmless).
static inline __attribute__((always_inline)) void prefetch_span(const void* p, size_t bytes) {
  for (size_t o = 0; o < bytes; o += CACHE_LINE) __builtin_prefetch((const char*)p + o, 0, 3);
}

// One group of one block's three streams: its tiles (`group_bytes` at `wg`) and its 16
// scales and 16 biases (`sgroup` bytes each at `s` and `b`).
static inline __attribute__((always_inline)) void prefetch_group(const uint8_t* wg, const char* s, const char* b,
                                                                 size_t group_bytes, size_t sgroup) {
  prefetch_span(wg, group_bytes);
  prefetch_span(s, sgroup);
  prefetch_span(b, sgroup);
}

// Rows [t0, t1) of y (O apart) in columns [c0, c1): set to zero, or with `r` (same shape) added.
static inline __attribute__((always_inline)) void zero_rows(float* y, size_t O, size_t t0, size_t t1, size_t c0,
                                                            size_t c1) {
  for (size_t t = t0; t < t1; ++t)
    for (size_t c = c0; c < c1; ++c) y[t * O + c] = 0.0f;
}

static inline __attribute__((always_inline)) void add_rows(float* y, const float* r, size_t O, size_t t0, size_t t1,
                                                           size_t c0, size_t c1) {
  for (size_t t = t0; t < t1; ++t)
    for (size_t c = c0; c < c1; ++c) y[t * O + c] += r[t * O + c];
}

// The matvec of every export: a workgroup computes row blocks [rb0, rb1) (at most BLOCKS) for
// every row of x, accumulating in y itself. One row of x (K <= ROW_MAX_K) goes block by block,
// group by group. Otherwise, per panel of rows and per group, each row's group
// is quantized once, and each block's tiles are read for 8, then 4, 2 and 1 rows at a time
// (what is left of the panel); with `whole_rows`, every whole panel (and a last one of at
// least WHOLE_PANEL_ROWS) goes there first, the rest of the rows here. With a residual
// `r` (same shape as y), each finished row block becomes y + r: the same f32 add as the
// graph's residual connection after the product, so the fused export gives its bits.
// `sc`, `bi` point at elements of `f16 ? 2 : 4` bytes (with `fp4`, `bi` is `sc`: no biases).
// `x8`: x quantized to 8 bits (the `_x8` exports), else 16.
static inline __attribute__((always_inline)) void qmv_body(int bits, int fp4, int f16, int x8, const float* x,
                                                           const uint8_t* w,
                                                           const char* sc, const char* bi, const float* r,
                                                           float* y, size_t T, size_t K, size_t O, size_t GS,
                                                           size_t rb0, size_t rb1) {
  const size_t G = K / GS, blocks = O / 16, block_bytes = K * bits * 16 / 8;
  const size_t group_bytes = GS * bits * 16 / 8, sbytes = scale_bytes(f16);
  const float levels = x8 ? LEVELS_I8 : LEVELS_I16;
  if (rb1 > blocks) rb1 = blocks;
  if (rb1 > rb0 + BLOCKS) rb1 = rb0 + BLOCKS;
  if (rb1 <= rb0) return;
  xpanel_t xp;
  size_t t_whole = 0;  // rows [0, t_whole) done by whole_rows
#ifdef WHOLE_PANEL_ROWS
  t_whole = T / PANEL * PANEL;
  if (T - t_whole >= WHOLE_PANEL_ROWS) t_whole = T;
  if (t_whole > 0) {
    zero_rows(y, O, 0, t_whole, rb0 * 16, rb1 * 16);
    whole_rows(bits, fp4, f16, x, K, w + rb0 * block_bytes, block_bytes, sc + rb0 * G * 16 * sbytes,
               bi + rb0 * G * 16 * sbytes, t_whole, GS, y + rb0 * 16, O, rb1 - rb0, levels);
    if (r) add_rows(y, r, O, 0, t_whole, rb0 * 16, rb1 * 16);
  }
#endif
  for (size_t t0 = t_whole; t0 < T; t0 += PANEL) {
    const size_t np = T - t0 < PANEL ? T - t0 : PANEL;
    zero_rows(y, O, t0, t0 + np, rb0 * 16, rb1 * 16);
    if (T == 1 && K <= ROW_MAX_K) {
      // One row of x (decode): every group of x quantized first, then each block's tiles
      // read front to back, one stream at a time, where the group loop below walks the
      // workgroup's blocks side by side, group by group (four streams a core). Each output
      // sees the same operations in the same order, so the same bits; decode is about
      // 1.15-1.3x as fast (docs/PERFORMANCE.md, "One stream per block").
      int16_t xq[ROW_MAX_K] __attribute__((aligned(64)));
      uint8_t wide[MAX_GROUP * 16] __attribute__((aligned(64)));  // a 3/6-bit group widened
      float xscale[ROW_MAX_K / 16], xsum[ROW_MAX_K / 16];
      // The workgroup's blocks, scales and biases are three contiguous streams, read one
      // group at a time; each group asks for the one `ahead` groups on (the first `ahead`
      // asked for at once here).
      const size_t ahead = PREFETCH_AHEAD / group_bytes, sgroup = 16 * sbytes;
      prefetch_span(w + rb0 * block_bytes, ahead * group_bytes);
      prefetch_span(sc + rb0 * G * sgroup, ahead * sgroup);
      prefetch_span(bi + rb0 * G * sgroup, ahead * sgroup);
      for (size_t g = 0; g < G; ++g) quantize_group(x + g * GS, GS, levels, xq + g * GS, 0, &xscale[g], &xsum[g]);
      for (size_t rb = rb0; rb < rb1; ++rb) {
        for (size_t g = 0; g < G; ++g) {
          const size_t next = rb * G + g + ahead;
          prefetch_group(w + next * group_bytes, sc + next * sgroup, bi + next * sgroup, group_bytes, sgroup);
          // The group's values where they lie (only row 0 is read; copying them into a panel
          // first cost 4-10% of a decode matvec, measured with cpu/qmv_bench.c).
          const xview_t row = {(const int16_t (*)[MAX_GROUP])(xq + g * GS), 0, &xscale[g], &xsum[g]};
          const size_t gi = (rb * G + g) * 16 * sbytes;
          const uint8_t* wg = rows_widen(bits, w + rb * block_bytes + g * group_bytes, GS, wide);
          group_rows(rows_bits(bits), fp4, f16, wg, &row, 0, 1, GS, sc + gi, bi + gi, y + rb * 16, O);
        }
      }
    } else {
      // The blocks are read side by side here, group by group, so each block's stream asks
      // for its share of PREFETCH_AHEAD; later panels find the workgroup's weights cached.
      const size_t ahead = PREFETCH_AHEAD / (group_bytes * (rb1 - rb0)) + 1, sgroup = 16 * sbytes;
      const xview_t panel = {xp.q, x8 ? xp.b : 0, xp.scale, xp.sum};
      uint8_t wide[MAX_GROUP * 16] __attribute__((aligned(64)));
      for (size_t g = 0; g < G; ++g) {
        for (size_t i = 0; i < np; ++i)
          quantize_group(x + (t0 + i) * K + g * GS, GS, levels, xp.q[i], x8 ? xp.b[i] : 0, &xp.scale[i], &xp.sum[i]);
        for (size_t rb = rb0; rb < rb1; ++rb) {
          const size_t gi = (rb * G + g) * 16 * sbytes;
          const uint8_t* wp = w + rb * block_bytes + g * group_bytes;
          if (t0 == 0)
            prefetch_group(wp + ahead * group_bytes, sc + gi + ahead * sgroup, bi + gi + ahead * sgroup, group_bytes,
                           sgroup);
          // Widened once for every row of the panel.
          const uint8_t* wg = rows_widen(bits, wp, GS, wide);
          float* yb = y + t0 * O + rb * 16;
          size_t i = 0;
          if (np - i >= 8) {
            group_rows(rows_bits(bits), fp4, f16, wg, &panel, i, 8, GS, sc + gi, bi + gi, yb + i * O, O);
            i += 8;
          }
          if (np - i >= 4) {
            group_rows(rows_bits(bits), fp4, f16, wg, &panel, i, 4, GS, sc + gi, bi + gi, yb + i * O, O);
            i += 4;
          }
          if (np - i >= 2) {
            group_rows(rows_bits(bits), fp4, f16, wg, &panel, i, 2, GS, sc + gi, bi + gi, yb + i * O, O);
            i += 2;
          }
          if (np - i >= 1) group_rows(rows_bits(bits), fp4, f16, wg, &panel, i, 1, GS, sc + gi, bi + gi, yb + i * O, O);
        }
      }
    }
    if (r) add_rows(y, r, O, t0, t0 + np, rb0 * 16, rb1 * 16);
  }
}

// One exported matvec per (bits, scale type): `y = x . W^T`; and its residual twin
// (`mlx_iree_qmvr*`): `y = x . W^T + r`. Offsets count elements of the pointer's type. Each
// macro defines the exact export NAME and its 8-bit-activation twin NAME_x8.
#define QMV(NAME, BITS, F16, STYPE) QMV_X(NAME, BITS, F16, STYPE, 0) QMV_X(NAME##_x8, BITS, F16, STYPE, 1)
#define QMV_X(NAME, BITS, F16, STYPE, X8)                                                                \
  void NAME(const float* x, size_t x_off, const uint8_t* w, size_t w_off, const STYPE* sc, size_t s_off, \
            const STYPE* bi, size_t b_off, float* y, size_t y_off, size_t T, size_t K, size_t O, size_t GS, \
            size_t rb0, size_t rb1) {                                                                    \
    qmv_body(BITS, 0, F16, X8, x + x_off, w + w_off, (const char*)(sc + s_off), (const char*)(bi + b_off), \
             0, y + y_off, T, K, O, GS, rb0, rb1);                                                       \
  }
// The FP4 twins: no biases.
#define QMV_FP4(NAME, F16, STYPE) QMV_FP4_X(NAME, F16, STYPE, 0) QMV_FP4_X(NAME##_x8, F16, STYPE, 1)
#define QMV_FP4_X(NAME, F16, STYPE, X8)                                                               \
  void NAME(const float* x, size_t x_off, const uint8_t* w, size_t w_off, const STYPE* sc, size_t s_off, \
            float* y, size_t y_off, size_t T, size_t K, size_t O, size_t GS, size_t rb0, size_t rb1) {     \
    qmv_body(4, 1, F16, X8, x + x_off, w + w_off, (const char*)(sc + s_off), (const char*)(sc + s_off), 0, \
             y + y_off, T, K, O, GS, rb0, rb1);                                                          \
  }
#define QMVR(NAME, BITS, F16, STYPE) QMVR_X(NAME, BITS, F16, STYPE, 0) QMVR_X(NAME##_x8, BITS, F16, STYPE, 1)
#define QMVR_X(NAME, BITS, F16, STYPE, X8)                                                               \
  void NAME(const float* x, size_t x_off, const uint8_t* w, size_t w_off, const STYPE* sc, size_t s_off, \
            const STYPE* bi, size_t b_off, const float* r, size_t r_off, float* y, size_t y_off, size_t T, \
            size_t K, size_t O, size_t GS, size_t rb0, size_t rb1) {                                     \
    qmv_body(BITS, 0, F16, X8, x + x_off, w + w_off, (const char*)(sc + s_off), (const char*)(bi + b_off), \
             r + r_off, y + y_off, T, K, O, GS, rb0, rb1);                                               \
  }
#define QMVR_FP4(NAME, F16, STYPE) QMVR_FP4_X(NAME, F16, STYPE, 0) QMVR_FP4_X(NAME##_x8, F16, STYPE, 1)
#define QMVR_FP4_X(NAME, F16, STYPE, X8)                                                              \
  void NAME(const float* x, size_t x_off, const uint8_t* w, size_t w_off, const STYPE* sc, size_t s_off, \
            const float* r, size_t r_off, float* y, size_t y_off, size_t T, size_t K, size_t O, size_t GS, \
            size_t rb0, size_t rb1) {                                                                    \
    qmv_body(4, 1, F16, X8, x + x_off, w + w_off, (const char*)(sc + s_off), (const char*)(sc + s_off),   \
             r + r_off, y + y_off, T, K, O, GS, rb0, rb1);                                               \
  }

QMV(mlx_iree_qmv4_f16, 4, 1, uint16_t)
QMV(mlx_iree_qmv4_f32, 4, 0, float)
QMV(mlx_iree_qmv8_f16, 8, 1, uint16_t)
QMV(mlx_iree_qmv8_f32, 8, 0, float)
QMV(mlx_iree_qmv3_f16, 3, 1, uint16_t)
QMV(mlx_iree_qmv3_f32, 3, 0, float)
QMV(mlx_iree_qmv6_f16, 6, 1, uint16_t)
QMV(mlx_iree_qmv6_f32, 6, 0, float)
QMVR(mlx_iree_qmvr4_f16, 4, 1, uint16_t)
QMVR(mlx_iree_qmvr4_f32, 4, 0, float)
QMVR(mlx_iree_qmvr8_f16, 8, 1, uint16_t)
QMVR(mlx_iree_qmvr8_f32, 8, 0, float)
QMVR(mlx_iree_qmvr3_f16, 3, 1, uint16_t)
QMVR(mlx_iree_qmvr3_f32, 3, 0, float)
QMVR(mlx_iree_qmvr6_f16, 6, 1, uint16_t)
QMVR(mlx_iree_qmvr6_f32, 6, 0, float)
QMV_FP4(mlx_iree_qmvfp4_f16, 1, uint16_t)
QMV_FP4(mlx_iree_qmvfp4_f32, 0, float)
QMV_FP4(mlx_iree_qmvfp4_e8m0, 2, uint8_t)
QMVR_FP4(mlx_iree_qmvrfp4_f16, 1, uint16_t)
QMVR_FP4(mlx_iree_qmvrfp4_f32, 0, float)
QMVR_FP4(mlx_iree_qmvrfp4_e8m0, 2, uint8_t)

// Mixture-of-experts matvec: y[n, O] = x[n, K] . W[ids[n]]^T for each of N (row, choice)
// pairs, the experts' matrices stacked (weights [E][blocks][block_bytes], scales and biases
// [E][blocks][G][16]); ids past the experts (or negative) are clamped into them. Units are
// row blocks, numbered `n * blocks + rb` when `by_expert` is 0 (a few pairs: each unit one
// pair's block, so only the chosen experts are read) or `e * blocks + rb` when it is 1
// (many pairs: a workgroup runs expert e's blocks for every pair that chose e, so each
// expert's blocks come from memory once, then from cache). Each pair goes through the
// one-row path of `qmv_body`, with its bits.
static inline __attribute__((always_inline)) void qmve_body(int bits, int fp4, int f16, const float* x, const int32_t* ids,
                                                            const uint8_t* w, const char* sc, const char* bi,
                                                            float* y, size_t N, size_t K, size_t O, size_t GS,
                                                            size_t E, size_t by_expert, size_t u0, size_t u1) {
  const size_t blocks = O / 16, G = K / GS, sbytes = scale_bytes(f16);
  const size_t expert_bytes = blocks * (K * bits * 16 / 8), expert_groups = blocks * G * 16 * sbytes;
  const size_t units = (by_expert ? E : N) * blocks;
  if (E == 0 || blocks == 0) return;
  if (u1 > units) u1 = units;
  for (size_t u = u0; u < u1;) {
    const size_t major = u / blocks, rb0 = u % blocks;
    size_t rb1 = rb0 + (u1 - u);
    if (rb1 > blocks) rb1 = blocks;
    for (size_t n = by_expert ? 0 : major; n < (by_expert ? N : major + 1); ++n) {
      const int32_t id = ids[n];
      const size_t e = id < 0 ? 0 : ((size_t)id >= E ? E - 1 : (size_t)id);
      if (by_expert && e != major) continue;
      qmv_body(bits, fp4, f16, 0, x + n * K, w + e * expert_bytes, sc + e * expert_groups, bi + e * expert_groups, 0,
               y + n * O, 1, K, O, GS, rb0, rb1);
    }
    u += rb1 - rb0;
  }
}

#define QMVE(NAME, BITS, F16, STYPE)                                                                       \
  void NAME(const float* x, size_t x_off, const int32_t* ids, size_t i_off, const uint8_t* w, size_t w_off, \
            const STYPE* sc, size_t s_off, const STYPE* bi, size_t b_off, float* y, size_t y_off, size_t N,  \
            size_t K, size_t O, size_t GS, size_t E, size_t by_expert, size_t u0, size_t u1) {             \
    qmve_body(BITS, 0, F16, x + x_off, ids + i_off, w + w_off, (const char*)(sc + s_off),                      \
              (const char*)(bi + b_off), y + y_off, N, K, O, GS, E, by_expert, u0, u1);                     \
  }

QMVE(mlx_iree_qmve4_f16, 4, 1, uint16_t)
QMVE(mlx_iree_qmve4_f32, 4, 0, float)
QMVE(mlx_iree_qmve8_f16, 8, 1, uint16_t)
QMVE(mlx_iree_qmve8_f32, 8, 0, float)
QMVE(mlx_iree_qmve3_f16, 3, 1, uint16_t)
QMVE(mlx_iree_qmve3_f32, 3, 0, float)
QMVE(mlx_iree_qmve6_f16, 6, 1, uint16_t)
QMVE(mlx_iree_qmve6_f32, 6, 0, float)
#define QMVE_FP4(NAME, F16, STYPE)                                                                          \
  void NAME(const float* x, size_t x_off, const int32_t* ids, size_t i_off, const uint8_t* w, size_t w_off, \
            const STYPE* sc, size_t s_off, float* y, size_t y_off, size_t N, size_t K, size_t O, size_t GS,  \
            size_t E, size_t by_expert, size_t u0, size_t u1) {                                             \
    qmve_body(4, 1, F16, x + x_off, ids + i_off, w + w_off, (const char*)(sc + s_off),                       \
              (const char*)(sc + s_off), y + y_off, N, K, O, GS, E, by_expert, u0, u1);                     \
  }
QMVE_FP4(mlx_iree_qmvefp4_f16, 1, uint16_t)
QMVE_FP4(mlx_iree_qmvefp4_f32, 0, float)
QMVE_FP4(mlx_iree_qmvefp4_e8m0, 2, uint8_t)
