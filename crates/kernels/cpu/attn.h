//! Attention of a step's rows, shared by every kernel object: for each row r (one token of
//! one sequence) and each kv head, the row's G query heads against the keys and values of
//! positions [lo, p) of its sequence (p the row's position, lo its sliding window's start)
//! and against its own new key and value, one softmax over all. Positions before the first
//! of the sequence's rows in this call are read where they lie in its slot of layer `layer`
//! of the cache; the later ones are the new rows of the rows before r in this call (a prompt
//! chunk: a sequence's rows of one call are consecutive and in position order, and only
//! those of the rows just before r with its slot and a position in [lo, p) count, so a
//! padding row that repeats a real one computes the same bits). So a step's attention costs
//! what the context holds, not the window it was compiled for, and takes one dispatch per
//! layer where the graph form takes several (crates/models/src/graph.rs, `attend_one` and
//! `attend_chunk`, are the definitions it follows).
//!
//! Each instruction set's file defines the 16-lane primitives first (vf16_avx512.h,
//! vf16_avx2.h, vf16_neon.h); everything else is here, written one rounding at a time (the
//! objects are built with -ffp-contract=off, fused multiply-adds only where written), so
//! every object computes the same bits, and crates/kernels/src/cpu.rs's model of it
//! (`attention_model`) too:
//! - q is scaled once: qs = q * scale; a score is the 16-lane sum (`vf_sum`) of the fused
//!   products of qs and the key over head_dim / 16 chunks, chunk 0 first.
//! - softmax runs online over blocks of BLOCK positions (the cache's, then the call's rows'),
//!   starting from the row's own key (m = its score, l = 1, acc = its value): per block,
//!   m' = max(m, the block's scores),
//!   alpha = exp(m - m'), e_j = exp(s_j - m'), l = fma(l, alpha, the 16-lane sum of the
//!   block's e_j, zeros past the context), acc = acc * alpha (when alpha is not 1), then acc =
//!   fma(e_j, v_j, acc) for j in order.
//! - out = acc * (1 / l).
//! - exp is `attn_exp` below (Cephes' single-precision polynomial, fused multiply-adds), a
//!   block's 16 at once in `vf_attn_exp` (the same operations in every lane).
//! - an 8-bit cache's value is its int8 times its block's scale (one multiply); a new row's
//!   16-lane chunk is rounded through that format as `kernels::cpu::q8_block` encodes it:
//!   a = the largest magnitude, inv = a > 0 ? 127 / a : 0, s = a / 127, q = round to nearest
//!   even of x * inv, then q * s.
//!
//! Bindings: q [n, K * G * hd] f32, k_new and v_new [n, K * hd] f32 (the kernel rounds them
//! through the cache's type, as write_kv stores them, so attention sees what later steps
//! read back), the k and v caches [L, S, P, K, row] (f32 or f16 as its bits, row = hd; or
//! 8-bit as its bytes, row = hd / 16 * 20: per 16-lane chunk of the head, its scale's f32
//! bits little-endian, then its 16 values as int8), positions and slots [n] i32, out
//! [n, K * G * hd] f32. Push constants: layer, S, P, K, G, hd, W (the positions the graph
//! form would read: keys at W or after are not read), sliding (the sliding window, 0 for
//! none), the f32 bits of the scale, n. A workgroup computes units [u0, u1), unit u being
//! row u / K and kv head u % K. Slots past the cache clamp to its last (as a StableHLO
//! gather does); positions past the cache read none of it.

#include <stddef.h>
#include <stdint.h>

// Keys scored together before their softmax update.
#define ATTN_BLOCK 16
// Blocks ahead of the one being scored whose rows are prefetched (1: 7.2 ms, 2: 6.2 ms for
// one thread's half of the 1B shape's 16 layers at 2,000 positions; docs/PERFORMANCE.md).
#define ATTN_AHEAD 2
// Rows of one sequence whose cache reads one workgroup shares (kernels::cpu::ATTN_TILE_ROWS):
// a prompt chunk's rows read the same cache positions, so each block is read once for up to
// this many of them, not once per row.
#define ATTN_TILE_ROWS 8
// Floats of per-head state a workgroup keeps (qs and acc: G * hd per kv head; at most this
// for one kv head, kernels::cpu::supports_attention) and the most heads per kv head: with
// the block's scores, 17 KiB of stack, which IREE's worker threads keep small.
#define ATTN_MAX_STATE 2048
#define ATTN_MAX_G 16

static inline float attn_bits_to_f32(uint32_t u) {
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}

// An 8-bit cache's 16-lane chunk at p: the f32 scale (4-aligned only: read by bytes), then
// 16 int8, each read back as q * s.
static inline vf vf_load_q8(const int8_t* p) {
  float s;
  __builtin_memcpy(&s, p, 4);
  return vf_mul(vf_load_i8(p + 4), vf_set1(s));
}

// 16 new values rounded through the 8-bit cache, as `kernels::cpu::q8_block` encodes them
// and vf_load_q8 reads them back: the bits write_kv stores.
static inline vf vf_load_round_q8(const float* p) {
  const vf x = vf_load(p);
  const float a = vf_max_lane(vf_abs(x));
  const float inv = a > 0.0f ? 127.0f / a : 0.0f;
  // + 0 turns a rounded -0 into the 0 an int8 holds (0 * s is +0, -0 * s is not).
  const vf q = vf_add(vf_round_even(vf_mul(x, vf_set1(inv))), vf_zero());
  return vf_mul(q, vf_set1(a / 127.0f));
}

// e^x for x <= 0 (scores less their maximum), 0 below -87.
static inline float attn_exp(float x) {
  if (x < -87.0f) return 0.0f;
  // n = round(x log2 e) by the 1.5 * 2^23 trick; x - n ln 2 in two parts.
  const float t = __builtin_fmaf(x, 1.44269504088896341f, 12582912.0f);
  const float n = t - 12582912.0f;
  float r = __builtin_fmaf(n, -0.693359375f, x);
  r = __builtin_fmaf(n, 2.12194440e-4f, r);
  float p = 1.9875691500e-4f;
  p = __builtin_fmaf(p, r, 1.3981999507e-3f);
  p = __builtin_fmaf(p, r, 8.3334519073e-3f);
  p = __builtin_fmaf(p, r, 4.1665795894e-2f);
  p = __builtin_fmaf(p, r, 1.6666665459e-1f);
  p = __builtin_fmaf(p, r, 5.0000001201e-1f);
  const float y = __builtin_fmaf(p, r * r, r) + 1.0f;
  const int32_t e = (int32_t)n + 127;
  return y * attn_bits_to_f32((uint32_t)e << 23);
}

// attn_exp in every lane: the same operations, so the same bits (16 exponentials of a block
// at once; one at a time they took most of a long context's attention).
static inline vf vf_attn_exp(vf x) {
  const vf t = vf_fma(x, vf_set1(1.44269504088896341f), vf_set1(12582912.0f));
  const vf n = vf_add(t, vf_set1(-12582912.0f));
  vf r = vf_fma(n, vf_set1(-0.693359375f), x);
  r = vf_fma(n, vf_set1(2.12194440e-4f), r);
  vf p = vf_set1(1.9875691500e-4f);
  p = vf_fma(p, r, vf_set1(1.3981999507e-3f));
  p = vf_fma(p, r, vf_set1(8.3334519073e-3f));
  p = vf_fma(p, r, vf_set1(4.1665795894e-2f));
  p = vf_fma(p, r, vf_set1(1.6666665459e-1f));
  p = vf_fma(p, r, vf_set1(5.0000001201e-1f));
  const vf y = vf_add(vf_fma(p, vf_mul(r, r), r), vf_set1(1.0f));
  // Lanes below -87 would scale by 2^n for n < -126: they are 0, as attn_exp returns.
  return vf_zero_below(x, -87.0f, vf_mul(y, vf_pow2i(vf_zero_below(x, -87.0f, n))));
}

// acc[g][c] = fma(e[g][jj], v_jj[c], acc[g][c]) for jj in order, for heads g0..g0+GN and
// 16-lane chunks c..c+CN: the GN x CN chains are independent, so they overlap in the pipeline.
#define ATTN_ACCUMULATE(GN, CN, CTYPE, LOAD)                                                      \
  do {                                                                                            \
    vf a[GN][CN];                                                                                 \
    for (int i = 0; i < GN; ++i)                                                                  \
      for (int k = 0; k < CN; ++k) a[i][k] = vf_load(acc_h + (g0 + i) * HD + 16 * (c + k));         \
    for (size_t jj = 0; jj < nb; ++jj) {                                                          \
      for (int k = 0; k < CN; ++k) {                                                              \
        const vf v = LOAD((const CTYPE*)vblock + jj * vstride + vchunk * (c + k));                \
        for (int i = 0; i < GN; ++i) a[i][k] = vf_fma(vf_set1(e[g0 + i][jj]), v, a[i][k]);       \
      }                                                                                           \
    }                                                                                             \
    for (int i = 0; i < GN; ++i)                                                                  \
      for (int k = 0; k < CN; ++k) vf_store(acc_h + (g0 + i) * HD + 16 * (c + k), a[i][k]);         \
  } while (0)

// Every head's chunks c..c+CN.
#define ATTN_ACCUMULATE_HEADS(CN, CTYPE, LOAD)                                                    \
  do {                                                                                            \
    size_t g0 = 0;                                                                                \
    for (; g0 + 4 <= G; g0 += 4) ATTN_ACCUMULATE(4, CN, CTYPE, LOAD);                             \
    switch (G - g0) {                                                                             \
      case 3: ATTN_ACCUMULATE(3, CN, CTYPE, LOAD); break;                                         \
      case 2: ATTN_ACCUMULATE(2, CN, CTYPE, LOAD); break;                                         \
      case 1: ATTN_ACCUMULATE(1, CN, CTYPE, LOAD); break;                                         \
      default: break;                                                                             \
    }                                                                                             \
  } while (0)

// The softmax update of one row's heads of kv head `h` (their state at index `sh`: qs, acc,
// m and l) over the ATTN_BLOCK (nb of them real) keys at KB (KTYPE, read by KLOAD, rows
// KSTRIDE KTYPEs apart, 16-lane chunk c KCHUNK * c in) and values at VB (likewise): each
// head's scores, its running maximum, sum and accumulator.
#define ATTN_UPDATE(KTYPE, KLOAD, KB, KSTRIDE, KCHUNK, VTYPE, VLOAD, VB, VSTRIDE, VCHUNK)          \
  do {                                                                                            \
    const KTYPE* kblock = (KB);                                                                   \
    const VTYPE* vblock = (VB);                                                                   \
    const size_t kstride = (KSTRIDE), kchunk = (KCHUNK), vstride = (VSTRIDE), vchunk = (VCHUNK);  \
    float* acc_h = acc + sh * GHD;                                                                \
    float e[ATTN_MAX_G][ATTN_BLOCK] __attribute__((aligned(64)));                                 \
    for (size_t g = 0; g < G; ++g) {                                                              \
      const float* qg = qs + sh * GHD + g * HD;                                                   \
      if (nb == ATTN_BLOCK) {                                                                     \
        vf s[ATTN_BLOCK];                                                                         \
        for (size_t jj = 0; jj < ATTN_BLOCK; ++jj) s[jj] = vf_zero();                             \
        for (size_t c = 0; c < C; ++c) {                                                          \
          const vf qv = vf_load(qg + 16 * c);                                                     \
          for (size_t jj = 0; jj < ATTN_BLOCK; ++jj)                                              \
            s[jj] = vf_fma(qv, KLOAD(kblock + jj * kstride + kchunk * c), s[jj]);                 \
        }                                                                                         \
        vf_sum16(s, e[g]);                                                                        \
      } else {                                                                                    \
        for (size_t jj = 0; jj < nb; ++jj) {                                                      \
          vf s = vf_zero();                                                                       \
          for (size_t c = 0; c < C; ++c)                                                          \
            s = vf_fma(vf_load(qg + 16 * c), KLOAD(kblock + jj * kstride + kchunk * c), s);       \
          e[g][jj] = vf_sum(s);                                                                   \
        }                                                                                         \
        /* Past the context: e^-inf = 0, so a short block is a full one. */                       \
        for (size_t jj = nb; jj < ATTN_BLOCK; ++jj) e[g][jj] = -__builtin_inff();                 \
      }                                                                                           \
      float* mg = m + sh * G + g;                                                                 \
      const float block_top = vf_max_lane(vf_load(e[g]));                                         \
      const float top = block_top > *mg ? block_top : *mg;                                        \
      const float alpha = attn_exp(*mg - top);                                                    \
      vf_store(e[g], vf_attn_exp(vf_add(vf_load(e[g]), vf_set1(-top))));                          \
      l[sh * G + g] = __builtin_fmaf(l[sh * G + g], alpha, vf_sum(vf_load(e[g])));                \
      *mg = top;                                                                                  \
      if (alpha != 1.0f)                                                                          \
        for (size_t c = 0; c < C; ++c)                                                            \
          vf_store(acc_h + g * HD + 16 * c, vf_mul(vf_load(acc_h + g * HD + 16 * c), vf_set1(alpha))); \
    }                                                                                             \
    size_t c = 0;                                                                                 \
    for (; c + 2 <= C; c += 2) ATTN_ACCUMULATE_HEADS(2, VTYPE, VLOAD);                            \
    if (c < C) ATTN_ACCUMULATE_HEADS(1, VTYPE, VLOAD);                                            \
  } while (0)

// Keys of a block staged as f32 (ATTN_BLOCK rows of HD) where ELOAD does more than load: the
// scores read each key once per query head, so a dequantized or rounded block is made once
// for all G of them (the values, read once per four heads, are read where they lie). Up to
// this head dim (16 KiB of stack, beside the state's 17 KiB: a quarter of the 128 KiB IREE's
// workers have), which takes in Qwen3.5's and Gemma's 256 (up to 128 until 2026-12-07: an
// 8-bit cache's keys at 256 were dequantized once per query head, and an 8-row step over
// 2,000 positions took 15% longer in cpu/attn_bench.c); wider heads read in place.
#define ATTN_STAGE_MAX_HD 256

// The softmax update of NR rows' heads over key rows [FROM, TO) of KROWS and VROWS (ETYPE,
// read by ELOAD), in blocks of ATTN_BLOCK: the cache's positions, which a tile's rows share,
// or the call's earlier rows of one row's sequence (NR 1). A kv head's row is ROW ETYPEs, a
// position's K rows contiguous; its 16-lane chunk c starts CHUNK * c in. Row i's kv head h
// keeps its state at index SBASE + i * nh + h. Each block of each kv head is read (and, with
// STAGED, its keys go through ATTN_STAGE_MAX_HD's buffer: the same values, so the same bits)
// once for the NR rows, which take it in turn: every row sees the same blocks in the same
// order as alone.
#define ATTN_SPAN(ETYPE, ELOAD, KROWS, VROWS, FROM, TO, ROW, CHUNK, STAGED, NR, SBASE)             \
  do {                                                                                            \
    const ETYPE* krows = (KROWS);                                                                 \
    const ETYPE* vrows = (VROWS);                                                                 \
    const size_t row_w = (ROW), row_stride = K * row_w;                                           \
    const int64_t span_hi = (TO);                                                                 \
    for (int64_t j0 = (FROM); j0 < span_hi; j0 += ATTN_BLOCK) {                                   \
      const size_t nb = (size_t)(span_hi - j0 < ATTN_BLOCK ? span_hi - j0 : ATTN_BLOCK);          \
      for (size_t h = 0; h < nh; ++h) {                                                           \
        /* Head h's rows ATTN_AHEAD blocks on (the prefetchers do not follow rows stride */      \
        /* apart far enough), asked for head by head rather than all at once, which stalled */  \
        /* on the outstanding requests: each line a row touches (an 8-bit row, hd * 5 / 4 */     \
        /* bytes, need not start on one). Into L2 (locality 2: prefetcht1), not L1: one */       \
        /* thread then reads the cache at 12 GB/s, not 7 (cpu/attn_bench.c). */                   \
        if (j0 + ATTN_AHEAD * ATTN_BLOCK < span_hi)                                               \
          for (size_t jj = 0; jj < ATTN_BLOCK; ++jj) {                                            \
            const size_t row = ((size_t)j0 + ATTN_AHEAD * ATTN_BLOCK + jj) * row_stride + h * row_w; \
            const uintptr_t kr = (uintptr_t)(krows + row), vr = (uintptr_t)(vrows + row);         \
            const size_t bytes = row_w * sizeof(ETYPE);                                           \
            for (size_t b = 0; b < bytes + (kr & 63); b += 64)                                    \
              __builtin_prefetch((const char*)((kr & ~(uintptr_t)63) + b), 0, 2);                 \
            for (size_t b = 0; b < bytes + (vr & 63); b += 64)                                    \
              __builtin_prefetch((const char*)((vr & ~(uintptr_t)63) + b), 0, 2);                 \
          }                                                                                       \
        const ETYPE* kraw = krows + (size_t)j0 * row_stride + h * row_w;                          \
        const ETYPE* vraw = vrows + (size_t)j0 * row_stride + h * row_w;                          \
        if ((STAGED) && HD <= ATTN_STAGE_MAX_HD) {                                                \
          float kst[ATTN_BLOCK * ATTN_STAGE_MAX_HD] __attribute__((aligned(64)));                 \
          for (size_t jj = 0; jj < nb; ++jj)                                                      \
            for (size_t c = 0; c < C; ++c)                                                        \
              vf_store(kst + jj * HD + 16 * c, ELOAD(kraw + jj * row_stride + (CHUNK) * c));      \
          for (size_t span_i = 0; span_i < (NR); ++span_i) {                                      \
            const size_t sh = (SBASE) + span_i * nh + h;                                          \
            ATTN_UPDATE(float, vf_load, kst, HD, 16, ETYPE, ELOAD, vraw, row_stride, (CHUNK));     \
          }                                                                                       \
        } else {                                                                                  \
          for (size_t span_i = 0; span_i < (NR); ++span_i) {                                      \
            const size_t sh = (SBASE) + span_i * nh + h;                                          \
            ATTN_UPDATE(ETYPE, ELOAD, kraw, row_stride, (CHUNK), ETYPE, ELOAD, vraw, row_stride, (CHUNK)); \
          }                                                                                       \
        }                                                                                         \
      }                                                                                           \
    }                                                                                             \
  } while (0)

// What a row attends to: its slot (clamped into the cache), its position p, the cache's
// positions [lo, hi) it reads (those before its sequence's first row in this call, within its
// sliding window and the window W), and the call's rows [ja, jb) of its sequence at positions
// in [lo, p) (the rows just before it with its slot: a sequence's rows of one call are
// consecutive and in position order).
typedef struct {
  size_t slot, ja, jb;
  int64_t p, lo, hi;
} attn_row_t;

static inline attn_row_t attn_row(const int32_t* pos, const int32_t* slots, size_t r, size_t S, size_t P, size_t W,
                                  size_t sliding) {
  attn_row_t a;
  a.slot = (size_t)(uint32_t)slots[r];
  if (a.slot >= S) a.slot = S - 1;
  a.p = pos[r];
  size_t r0 = r;
  while (r0 > 0 && slots[r0 - 1] == slots[r]) --r0;
  const int64_t first = r0 < r && pos[r0] < a.p ? pos[r0] : a.p;
  a.hi = first < (int64_t)W ? first : (int64_t)W;
  if (a.hi > (int64_t)P) a.hi = (int64_t)P;
  a.lo = sliding ? a.p - (int64_t)sliding + 1 : 0;
  if (a.lo < 0) a.lo = 0;
  a.ja = a.jb = r0;
  for (size_t j = r0; j < r; ++j) {
    if (pos[j] < a.lo) a.ja = j + 1;
    if (pos[j] < a.p) a.jb = j + 1;
  }
  return a;
}

static inline vf vf_load_round_f16(const float* p) { return vf_round_f16(vf_load(p)); }

// LOAD reads a cache's 16-lane chunk as f32; NLOAD reads 16 f32 values of the call's new
// keys and values rounded through the cache's type (as the cache will hold them). A kv
// head's cache row is ROW CTYPEs (an expression in HD), its chunk c CHUNK * c in.
#define ATTN(NAME, CTYPE, LOAD, NLOAD, ROW, CHUNK, STAGED)                                        \
  void NAME(const float* q, size_t q_off, const float* kn, size_t kn_off, const float* vn,        \
            size_t vn_off, const CTYPE* kc, size_t kc_off, const CTYPE* vc, size_t vc_off,        \
            const int32_t* pos, size_t pos_off, const int32_t* slots, size_t slots_off,           \
            float* out, size_t out_off, size_t layer, size_t S, size_t P, size_t K, size_t G,     \
            size_t HD, size_t W, size_t sliding, size_t scale_bits, size_t n, size_t u0,          \
            size_t u1) {                                                                          \
    q += q_off; kn += kn_off; vn += vn_off; kc += kc_off; vc += vc_off;                           \
    pos += pos_off; slots += slots_off; out += out_off;                                           \
    const float scale = attn_bits_to_f32((uint32_t)scale_bits);                                   \
    const size_t C = HD / 16, GHD = G * HD;                                                       \
    if (GHD == 0 || GHD > ATTN_MAX_STATE || HD % 16 != 0 || G > ATTN_MAX_G || S == 0) return;                 \
    if (u1 > n * K) u1 = n * K;                                                                   \
    float qs[ATTN_MAX_STATE] __attribute__((aligned(64)));                                        \
    float acc[ATTN_MAX_STATE] __attribute__((aligned(64)));                                       \
    float m[ATTN_MAX_STATE / 16], l[ATTN_MAX_STATE / 16];                                         \
    while (u0 < u1) {                                                                             \
      /* Row r's kv heads kh0.. this workgroup has; or, where it has row r whole, a tile of */    \
      /* rows r.. of one sequence that read the same cache positions (a prompt chunk's), */      \
      /* whole, up to ATTN_TILE_ROWS and what the state holds: each cache block is then read */  \
      /* once for the tile. The kv heads go in lockstep over the positions (their rows of one */ \
      /* position are contiguous), as many at a time as the state holds for the tile's rows. */  \
      const size_t r = u0 / K, kh_first = u0 % K;                                                 \
      attn_row_t tile[ATTN_TILE_ROWS];                                                            \
      tile[0] = attn_row(pos, slots, r, S, P, W, sliding);                                        \
      const attn_row_t a0 = tile[0];                                                              \
      size_t nr = 1;                                                                              \
      if (kh_first == 0)                                                                          \
        while (nr < ATTN_TILE_ROWS && (r + nr + 1) * K <= u1 && (nr + 1) * GHD <= ATTN_MAX_STATE && \
               slots[r + nr] == slots[r]) {                                                       \
          tile[nr] = attn_row(pos, slots, r + nr, S, P, W, sliding);                              \
          if (tile[nr].lo != a0.lo || tile[nr].hi != a0.hi) break;                                \
          ++nr;                                                                                   \
        }                                                                                         \
      const size_t kh_end = nr > 1 ? K : (u1 - u0 < K - kh_first ? kh_first + (u1 - u0) : K);     \
      const size_t per_pass = ATTN_MAX_STATE / (nr * GHD);                                        \
      for (size_t kh0 = kh_first; kh0 < kh_end; kh0 += per_pass) {                               \
        const size_t nh = kh_end - kh0 < per_pass ? kh_end - kh0 : per_pass;                      \
        for (size_t i = 0; i < nr; ++i) {                                                         \
          const size_t ri = r + i;                                                                \
          for (size_t h = 0; h < nh; ++h) {                                                       \
            const size_t sh = i * nh + h;                                                         \
            const float* qr = q + ri * K * GHD + (kh0 + h) * GHD;                                 \
            const float* kr = kn + (ri * K + kh0 + h) * HD;                                       \
            const float* vr = vn + (ri * K + kh0 + h) * HD;                                       \
            for (size_t g = 0; g < G; ++g) {                                                      \
              float* qg = qs + sh * GHD + g * HD;                                                 \
              for (size_t c = 0; c < C; ++c) vf_store(qg + 16 * c, vf_mul(vf_load(qr + g * HD + 16 * c), vf_set1(scale))); \
              vf s = vf_zero();                                                                   \
              for (size_t c = 0; c < C; ++c) s = vf_fma(vf_load(qg + 16 * c), NLOAD(kr + 16 * c), s); \
              m[sh * G + g] = vf_sum(s);                                                          \
              l[sh * G + g] = 1.0f;                                                               \
              for (size_t c = 0; c < C; ++c) vf_store(acc + sh * GHD + g * HD + 16 * c, NLOAD(vr + 16 * c)); \
            }                                                                                     \
          }                                                                                       \
        }                                                                                         \
        /* Position j, kv head kh: row ((layer * S + slot) * P + j) * K + kh of the cache; the */ \
        /* call's row j: row j * K + kh of the new keys and values (hd f32 each). */             \
        const size_t at = ((layer * S + a0.slot) * P * K + kh0) * (ROW);                          \
        ATTN_SPAN(CTYPE, LOAD, kc + at, vc + at, a0.lo, a0.hi, ROW, CHUNK, STAGED, nr, 0);         \
        for (size_t i = 0; i < nr; ++i) {                                                         \
          ATTN_SPAN(float, NLOAD, kn + kh0 * HD, vn + kh0 * HD, (int64_t)tile[i].ja, (int64_t)tile[i].jb, HD, 16, STAGED, 1, i * nh); \
          for (size_t h = 0; h < nh; ++h) {                                                       \
            const size_t sh = i * nh + h;                                                         \
            float* o = out + (r + i) * K * GHD + (kh0 + h) * GHD;                                 \
            for (size_t g = 0; g < G; ++g) {                                                      \
              const vf inv = vf_set1(1.0f / l[sh * G + g]);                                       \
              for (size_t c = 0; c < C; ++c)                                                      \
                vf_store(o + g * HD + 16 * c, vf_mul(vf_load(acc + sh * GHD + g * HD + 16 * c), inv)); \
            }                                                                                     \
          }                                                                                       \
        }                                                                                         \
      }                                                                                           \
      u0 = nr > 1 ? (r + nr) * K : r * K + kh_end;                                                \
    }                                                                                             \
  }

ATTN(mlx_iree_attn_f32, float, vf_load, vf_load, HD, 16, 0)
ATTN(mlx_iree_attn_f16, uint16_t, vf_load_f16, vf_load_round_f16, HD, 16, 0)
// 8-bit: a chunk is 20 bytes (scale, then 16 int8), offsets are bytes; its keys staged.
ATTN(mlx_iree_attn_q8, int8_t, vf_load_q8, vf_load_round_q8, HD / 16 * 20, 20, 1)
