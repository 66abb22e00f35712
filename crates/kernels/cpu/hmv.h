//! The matrix product with f16 or bf16 weights, shared by every kernel object:
//! `mlx_iree_hmv_{f16,bf16}` (`y[T, O] = x[T, K] . W^T`), `mlx_iree_hmvr_{f16,bf16}` (the
//! same plus a residual `r[T, O]`), x and y f32, and the lookup `mlx_iree_hrows_{f16,bf16}`.
//! IREE's own code for the mixed f32-by-f16 product of a prompt chunk ran at about half
//! this machine's arithmetic rate (docs/PERFORMANCE.md, "f16 products in the kernel").
//!
//! Each instruction set's file defines the 16-lane primitives first (vf16_*.h; both types
//! widen exactly: `vf_load_f16`, `vf_load_bf16`) and, if it has the registers for more,
//! `HMV_ROWS` (rows of x a tile takes at once, default 2). Arithmetic, the same in every
//! object (built with -ffp-contract=off, so the only fused multiply-adds are those written)
//! and in crates/kernels/src/cpu.rs's `dense_model`: each output is one chain
//! `acc = fma(w[o, k], x[t, k], acc)` from 0 over k in order, then `y = acc`, or
//! `y = acc + r` in f32 for the residual export. No sum crosses lanes, so how many rows and
//! blocks a tile takes changes no bit.
//!
//! Layout (crates/kernels/src/cpu.rs, `repack_dense`): W as 16-row blocks `[O / 16][K][16]`
//! of 16-bit values: block b's 16 values of column k are contiguous. Bindings: x, W, (r,) y;
//! push constants T, K, O. A workgroup computes row blocks [rb0, rb1) (at most BLOCKS) for
//! every row of x: one row (decode) with the blocks side by side (one chain each, their
//! streams prefetched ahead), more rows in tiles of HMV_ROWS rows by two blocks, whose
//! weights stay in the cache while the tile walks down the rows.

#ifndef HMV_ROWS
#define HMV_ROWS 2
#endif

// Rows n (<= HMV_ROWS) of x times nb (<= BLOCKS) blocks at `w` (`bstride` elements apart),
// every k, into y (rows `O` apart). `n` and `nb` are constants at every call, so the
// accumulators stay in registers.
static inline __attribute__((always_inline)) void hmv_tile(const float* x, size_t K, const uint16_t* w,
                                                           size_t bstride, size_t n, size_t nb, float* y, size_t O,
                                                           int prefetch, int bf16) {
  vf acc[HMV_ROWS][BLOCKS];
  for (size_t i = 0; i < n; ++i)
    for (size_t b = 0; b < nb; ++b) acc[i][b] = vf_zero();
  // Each block's stream asks for its share of PREFETCH_AHEAD, every k (asked every other k,
  // clang 14 loaded the tiles one value at a time: half the speed).
  const size_t ahead = (PREFETCH_AHEAD / nb / 32 + 1) * 16;
  for (size_t k = 0; k < K; ++k) {
    vf wv[BLOCKS];
    for (size_t b = 0; b < nb; ++b) {
      const uint16_t* wk = w + b * bstride + k * 16;
      if (prefetch) __builtin_prefetch(wk + ahead, 0, 3);
      wv[b] = bf16 ? vf_load_bf16(wk) : vf_load_f16(wk);
    }
    for (size_t i = 0; i < n; ++i) {
      const vf xv = vf_set1(x[i * K + k]);
      for (size_t b = 0; b < nb; ++b) acc[i][b] = vf_fma(wv[b], xv, acc[i][b]);
    }
  }
  for (size_t i = 0; i < n; ++i)
    for (size_t b = 0; b < nb; ++b) vf_store(y + i * O + b * 16, acc[i][b]);
}

// Every row of x against nb blocks: tiles of HMV_ROWS rows, then what is left in tiles of 8,
// 4, 2 and 1 rows (those smaller than HMV_ROWS).
static inline __attribute__((always_inline)) void hmv_rows(const float* x, size_t K, const uint16_t* w,
                                                           size_t bstride, size_t nb, float* y, size_t O,
                                                           size_t T, int bf16) {
  size_t t = 0;
  for (; t + HMV_ROWS <= T; t += HMV_ROWS) hmv_tile(x + t * K, K, w, bstride, HMV_ROWS, nb, y + t * O, O, 0, bf16);
#define HMV_REST(N)                                                 \
  if (HMV_ROWS > (N) && T - t >= (N)) {                             \
    hmv_tile(x + t * K, K, w, bstride, N, nb, y + t * O, O, 0, bf16);     \
    t += (N);                                                       \
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

static inline __attribute__((always_inline)) void hmv_body(const float* x, const uint16_t* w, const float* r,
                                                           float* y, size_t T, size_t K, size_t O, size_t rb0,
                                                           size_t rb1, int bf16) {
  const size_t blocks = O / 16, bstride = K * 16;
  if (rb1 > blocks) rb1 = blocks;
  if (rb1 > rb0 + BLOCKS) rb1 = rb0 + BLOCKS;
  if (rb1 <= rb0) return;
  const uint16_t* wb = w + rb0 * bstride;
  float* yb = y + rb0 * 16;
  if (T == 1) {
    // One chain per block, the blocks side by side: four chains hide the multiply-add's
    // latency, and the weights' streams are prefetched (a decode step reads each weight once).
    switch (rb1 - rb0) {
      case 4:
        hmv_tile(x, K, wb, bstride, 1, 4, yb, O, 1, bf16);
        break;
      case 3:
        hmv_tile(x, K, wb, bstride, 1, 3, yb, O, 1, bf16);
        break;
      case 2:
        hmv_tile(x, K, wb, bstride, 1, 2, yb, O, 1, bf16);
        break;
      default:
        hmv_tile(x, K, wb, bstride, 1, 1, yb, O, 1, bf16);
    }
  } else {
    size_t b = rb0;
    for (; b + 2 <= rb1; b += 2) hmv_rows(x, K, w + b * bstride, bstride, 2, y + b * 16, O, T, bf16);
    if (b < rb1) hmv_rows(x, K, w + b * bstride, bstride, 1, y + b * 16, O, T, bf16);
  }
  if (r)
    for (size_t t = 0; t < T; ++t)
      for (size_t c = rb0 * 16; c < rb1 * 16; ++c) y[t * O + c] += r[t * O + c];
}

// The exports of one element type (BF16: 0 for f16, 1 for bf16).
#define HMV(NAME, NAME_R, BF16)                                                                                 \
  void NAME(const float* x, size_t x_off, const uint16_t* w, size_t w_off, float* y, size_t y_off, size_t T,   \
            size_t K, size_t O, size_t rb0, size_t rb1) {                                                       \
    hmv_body(x + x_off, w + w_off, 0, y + y_off, T, K, O, rb0, rb1, BF16);                                      \
  }                                                                                                             \
  void NAME_R(const float* x, size_t x_off, const uint16_t* w, size_t w_off, const float* r, size_t r_off,      \
              float* y, size_t y_off, size_t T, size_t K, size_t O, size_t rb0, size_t rb1) {                   \
    hmv_body(x + x_off, w + w_off, r + r_off, y + y_off, T, K, O, rb0, rb1, BF16);                              \
  }

HMV(mlx_iree_hmv_f16, mlx_iree_hmvr_f16, 0)
HMV(mlx_iree_hmv_bf16, mlx_iree_hmvr_bf16, 1)

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
