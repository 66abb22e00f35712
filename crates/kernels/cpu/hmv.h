//! The matrix product with f16, bf16 or mxfp8 weights, shared by every kernel object:
//! `mlx_iree_hmv_{f16,bf16,mxfp8}` (`y[T, O] = x[T, K] . W^T`), `mlx_iree_hmvr_*` (the
//! same plus a residual `r[T, O]`), x and y f32, and the lookup `mlx_iree_hrows_*`.
//! IREE's own code for the mixed f32-by-f16 product of a prompt chunk ran at about half
//! this machine's arithmetic rate (docs/PERFORMANCE.md, "f16 products in the kernel").
//!
//! Each instruction set's file defines the 16-lane primitives first (vf16_*.h; every type
//! widens exactly: `vf_load_f16`, `vf_load_bf16`, `vf_load_e4m3` times `vf_load_e8m0`) and,
//! if it has the registers for more, `HMV_ROWS` (rows of x a tile takes at once, default 2).
//! Arithmetic, the same in every object (built with -ffp-contract=off, so the only fused
//! multiply-adds are those written) and in crates/kernels/src/cpu.rs's `dense_model`: each
//! output is one chain `acc = fma(w[o, k], x[t, k], acc)` from 0 over k in order, then
//! `y = acc`, or `y = acc + r` in f32 for the residual export; an mxfp8 weight `w[o, k]` is
//! MLX's dequantized f32 value (`mxfp8_value`). No sum crosses lanes, so how many rows and
//! blocks a tile takes changes no bit.
//!
//! Layout (crates/kernels/src/cpu.rs, `repack_dense`): W as 16-row blocks `[O / 16][K][16]`
//! of 16-bit values (mxfp8: bytes): block b's 16 values of column k are contiguous; mxfp8's
//! scales `[O / 16][K / 32][16]` bytes. Bindings: x, W, (mxfp8: scales,) (r,) y; push
//! constants T, K, O. A workgroup computes row blocks [rb0, rb1) (at most BLOCKS) for
//! every row of x: one row (decode) with the blocks side by side (one chain each, their
//! streams prefetched ahead), more rows in tiles of HMV_ROWS rows by two blocks, whose
//! weights stay in the cache while the tile walks down the rows.

#ifndef HMV_ROWS
#define HMV_ROWS 2
#endif

// The element types (`elem` below): f16 and bf16 as 16-bit values, mxfp8 as bytes (FP8 E4M3
// codes) with an E8M0 scale byte per HMV_MXFP8_GROUP of k and 16 rows, `[O / 16][K / 32][16]`.
#define HMV_F16 0
#define HMV_BF16 1
#define HMV_MXFP8 2
#define HMV_MXFP8_GROUP 32

// Rows n (<= HMV_ROWS) of x times nb (<= BLOCKS) blocks at `w` (`bstride` elements apart;
// mxfp8's scales at `sc`, `sstride` bytes apart), every k, into y (rows `O` apart). `n`,
// `nb` and `elem` are constants at every call, so the accumulators stay in registers. An
// mxfp8 weight is its code's value times its group's scale, one exact product
// (`vf_load_e4m3` times `vf_load_e8m0`), so the chain is the same as over the f32 values
// MLX dequantizes to.
static inline __attribute__((always_inline)) void hmv_tile(const float* x, size_t K, const void* w, size_t bstride,
                                                           const uint8_t* sc, size_t sstride, size_t n, size_t nb,
                                                           float* y, size_t O, int prefetch, int elem) {
  vf acc[HMV_ROWS][BLOCKS];
  for (size_t i = 0; i < n; ++i)
    for (size_t b = 0; b < nb; ++b) acc[i][b] = vf_zero();
  // Each block's stream asks for its share of PREFETCH_AHEAD, every k (asked every other k,
  // clang 14 loaded the tiles one value at a time: half the speed), in its own elements.
  const size_t esize = elem == HMV_MXFP8 ? 1 : 2;
  const size_t ahead = (PREFETCH_AHEAD / nb / (16 * esize) + 1) * 16;
  const size_t group = elem == HMV_MXFP8 ? HMV_MXFP8_GROUP : K;
  vf sv[BLOCKS];
  for (size_t k0 = 0; k0 < K; k0 += group) {
    if (elem == HMV_MXFP8)
      for (size_t b = 0; b < nb; ++b) sv[b] = vf_load_e8m0(sc + b * sstride + k0 / HMV_MXFP8_GROUP * 16);
    for (size_t k = k0; k < k0 + group; ++k) {
      vf wv[BLOCKS];
      for (size_t b = 0; b < nb; ++b) {
        if (elem == HMV_MXFP8) {
          const uint8_t* wk = (const uint8_t*)w + b * bstride + k * 16;
          if (prefetch) __builtin_prefetch(wk + ahead, 0, 3);
          wv[b] = vf_mul(vf_load_e4m3(wk), sv[b]);
        } else {
          const uint16_t* wk = (const uint16_t*)w + b * bstride + k * 16;
          if (prefetch) __builtin_prefetch(wk + ahead, 0, 3);
          wv[b] = elem == HMV_BF16 ? vf_load_bf16(wk) : vf_load_f16(wk);
        }
      }
      for (size_t i = 0; i < n; ++i) {
        const vf xv = vf_set1(x[i * K + k]);
        for (size_t b = 0; b < nb; ++b) acc[i][b] = vf_fma(wv[b], xv, acc[i][b]);
      }
    }
  }
  for (size_t i = 0; i < n; ++i)
    for (size_t b = 0; b < nb; ++b) vf_store(y + i * O + b * 16, acc[i][b]);
}

// Every row of x against nb blocks: tiles of HMV_ROWS rows, then what is left in tiles of 8,
// 4, 2 and 1 rows (those smaller than HMV_ROWS).
static inline __attribute__((always_inline)) void hmv_rows(const float* x, size_t K, const void* w, size_t bstride,
                                                           const uint8_t* sc, size_t sstride, size_t nb, float* y,
                                                           size_t O, size_t T, int elem) {
  size_t t = 0;
  for (; t + HMV_ROWS <= T; t += HMV_ROWS)
    hmv_tile(x + t * K, K, w, bstride, sc, sstride, HMV_ROWS, nb, y + t * O, O, 0, elem);
#define HMV_REST(N)                                                                \
  if (HMV_ROWS > (N) && T - t >= (N)) {                                            \
    hmv_tile(x + t * K, K, w, bstride, sc, sstride, N, nb, y + t * O, O, 0, elem); \
    t += (N);                                                                      \
  }
#if HMV_ROWS > 8
  HMV_REST(8)
#endif
#if HMV_ROWS > 4
  HMV_REST(4)
#endif
#if HMV_ROWS > 2
  HMV_REST(2)
#endif
  HMV_REST(1)
#undef HMV_REST
}

static inline __attribute__((always_inline)) void hmv_body(const float* x, const void* w, const uint8_t* sc,
                                                           const float* r, float* y, size_t T, size_t K, size_t O,
                                                           size_t rb0, size_t rb1, int elem) {
  const size_t blocks = O / 16, bstride = K * 16, sstride = K / HMV_MXFP8_GROUP * 16;
  if (rb1 > blocks) rb1 = blocks;
  if (rb1 > rb0 + BLOCKS) rb1 = rb0 + BLOCKS;
  if (rb1 <= rb0) return;
  const size_t esize = elem == HMV_MXFP8 ? 1 : 2;
  // Block b's weights and scales.
#define HMV_W(b) ((const void*)((const uint8_t*)w + (b) * bstride * esize))
#define HMV_S(b) (sc ? sc + (b) * sstride : sc)
  const void* wb = HMV_W(rb0);
  const uint8_t* sb = HMV_S(rb0);
  float* yb = y + rb0 * 16;
  if (T == 1) {
    // One chain per block, the blocks side by side: four chains hide the multiply-add's
    // latency, and the weights' streams are prefetched (a decode step reads each weight once).
    switch (rb1 - rb0) {
      case 4:
        hmv_tile(x, K, wb, bstride, sb, sstride, 1, 4, yb, O, 1, elem);
        break;
      case 3:
        hmv_tile(x, K, wb, bstride, sb, sstride, 1, 3, yb, O, 1, elem);
        break;
      case 2:
        hmv_tile(x, K, wb, bstride, sb, sstride, 1, 2, yb, O, 1, elem);
        break;
      default:
        hmv_tile(x, K, wb, bstride, sb, sstride, 1, 1, yb, O, 1, elem);
    }
  } else {
    size_t b = rb0;
    for (; b + 2 <= rb1; b += 2) hmv_rows(x, K, HMV_W(b), bstride, HMV_S(b), sstride, 2, y + b * 16, O, T, elem);
    if (b < rb1) hmv_rows(x, K, HMV_W(b), bstride, HMV_S(b), sstride, 1, y + b * 16, O, T, elem);
  }
#undef HMV_W
#undef HMV_S
  if (r)
    for (size_t t = 0; t < T; ++t)
      for (size_t c = rb0 * 16; c < rb1 * 16; ++c) y[t * O + c] += r[t * O + c];
}

// The exports of one 16-bit element type (HMV_F16 or HMV_BF16).
#define HMV(NAME, NAME_R, ELEM)                                                                                 \
  void NAME(const float* x, size_t x_off, const uint16_t* w, size_t w_off, float* y, size_t y_off, size_t T,   \
            size_t K, size_t O, size_t rb0, size_t rb1) {                                                       \
    hmv_body(x + x_off, w + w_off, 0, 0, y + y_off, T, K, O, rb0, rb1, ELEM);                                   \
  }                                                                                                             \
  void NAME_R(const float* x, size_t x_off, const uint16_t* w, size_t w_off, const float* r, size_t r_off,      \
              float* y, size_t y_off, size_t T, size_t K, size_t O, size_t rb0, size_t rb1) {                   \
    hmv_body(x + x_off, w + w_off, 0, r + r_off, y + y_off, T, K, O, rb0, rb1, ELEM);                           \
  }

HMV(mlx_iree_hmv_f16, mlx_iree_hmvr_f16, HMV_F16)
HMV(mlx_iree_hmv_bf16, mlx_iree_hmvr_bf16, HMV_BF16)

// mxfp8's: the codes, then their scales (`[O / 16][K / 32][16]` bytes), before the
// residual. K is a multiple of 32.
void mlx_iree_hmv_mxfp8(const float* x, size_t x_off, const uint8_t* w, size_t w_off, const uint8_t* s, size_t s_off,
                        float* y, size_t y_off, size_t T, size_t K, size_t O, size_t rb0, size_t rb1) {
  hmv_body(x + x_off, w + w_off, s + s_off, 0, y + y_off, T, K, O, rb0, rb1, HMV_MXFP8);
}
void mlx_iree_hmvr_mxfp8(const float* x, size_t x_off, const uint8_t* w, size_t w_off, const uint8_t* s,
                         size_t s_off, const float* r, size_t r_off, float* y, size_t y_off, size_t T, size_t K,
                         size_t O, size_t rb0, size_t rb1) {
  hmv_body(x + x_off, w + w_off, s + s_off, r + r_off, y + y_off, T, K, O, rb0, rb1, HMV_MXFP8);
}

// A bf16 value's bits as f32 (exact).
static inline float bf16_to_f32(uint16_t h) {
  const uint32_t u = (uint32_t)h << 16;
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}

// Rows `ids` of a table in the blocks above (embedding lookup, the table a tied head also
// reads), as f32 out[T, K]: rows [t0, t1). Ids past the table clamp to its last row, as
// qrows.h's do. Each value is widened exactly (f16_to_f32 of qrows.h, or bf16_to_f32).
#define HROWS(NAME, TOF32)                                                                               \
  void NAME(const int32_t* ids, size_t ids_off, const uint16_t* w, size_t w_off, float* out, size_t out_off, \
            size_t T, size_t K, size_t O, size_t t0, size_t t1) {                                        \
    ids += ids_off;                                                                                      \
    w += w_off;                                                                                          \
    out += out_off;                                                                                      \
    if (t1 > T) t1 = T;                                                                                  \
    for (size_t t = t0; t < t1; ++t) {                                                                   \
      size_t row = (size_t)(uint32_t)ids[t];                                                             \
      if (row >= O) row = O - 1;                                                                         \
      const uint16_t* wb = w + (row / 16) * K * 16 + row % 16;                                           \
      for (size_t k = 0; k < K; ++k) out[t * K + k] = TOF32(wb[k * 16]);                                 \
    }                                                                                                    \
  }

HROWS(mlx_iree_hrows_f16, f16_to_f32)
HROWS(mlx_iree_hrows_bf16, bf16_to_f32)

// One mxfp8 weight as the products read it (vf_load_e4m3 times vf_load_e8m0, one lane).
static inline float mxfp8_value(uint8_t code, uint8_t e) {
  const uint16_t h = (uint16_t)((uint16_t)(int16_t)(int8_t)code << 7) & 0xBF80;
  const uint32_t bits = ((uint32_t)e + 8) << 23;
  float scale;
  __builtin_memcpy(&scale, &bits, 4);
  return f16_to_f32(h) * scale;
}

// Rows of an mxfp8 table (the blocks above and their scales), as HROWS's.
void mlx_iree_hrows_mxfp8(const int32_t* ids, size_t ids_off, const uint8_t* w, size_t w_off, const uint8_t* s,
                          size_t s_off, float* out, size_t out_off, size_t T, size_t K, size_t O, size_t t0,
                          size_t t1) {
  ids += ids_off;
  w += w_off;
  s += s_off;
  out += out_off;
  if (t1 > T) t1 = T;
  for (size_t t = t0; t < t1; ++t) {
    size_t row = (size_t)(uint32_t)ids[t];
    if (row >= O) row = O - 1;
    const uint8_t* wb = w + (row / 16) * K * 16 + row % 16;
    const uint8_t* sb = s + (row / 16) * (K / HMV_MXFP8_GROUP) * 16 + row % 16;
    for (size_t k = 0; k < K; ++k) out[t * K + k] = mxfp8_value(wb[k * 16], sb[k / HMV_MXFP8_GROUP * 16]);
  }
}
