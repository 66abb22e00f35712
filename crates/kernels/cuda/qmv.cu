//! Packed matrix-vector product for CUDA: MLX affine 4- and 8-bit weights in the graph-level
//! layout that `models` already keeps on GPU targets, read by one hand-written kernel per
//! (bits, scale type) instead of the several dispatches IREE makes of the graph form.
//!
//! Compiled by clang to PTX (`--cuda-device-only`, no CUDA toolkit: `device.h` declares the
//! few builtins used) and linked into IREE's executables as an external CUDA variant
//! (`kernels::cuda`). The same file compiles for the host against `host_sim.h`, which runs
//! each block's threads as host threads, so the tests check its results without a GPU.
//!
//! Layout (models::layout, `Packing` with `kernel` unset; a `wide` 4-bit matrix, one signed
//! value a byte, is read as 8-bit):
//! - w: [O, K] values of `bits` bits, two's complement (MLX's unsigned q with its top bit
//!   flipped, i.e. q - 2^(bits-1)), packed from the low bits up: 4-bit, two a byte, k even in
//!   the low nibble; 8-bit, one a byte.
//! - scales: [O, K / GS] f16, bf16 or f32; biases: [O, K / GS], f16 beside f16 scales, else
//!   f32, with the offset folded in (b + 2^(bits-1) s), so W[o, k] = s * v + b.
//! - x: [T, K] f32, y: [T, O] f32; for `rows`, ids: [T] i32, out: [T, K] f32.
//!
//! IREE's CUDA ABI: the bindings' device pointers in order, then the push constants (T, K, O,
//! GS), each a 32-bit value. Threads: a block of WARPS warps computes ROWS output rows; its
//! threads split k, each reading 8 consecutive values at a time (one 32-bit word at 4-bit,
//! two at 8-bit; 8 divides every group size MLX uses), 1024 values a block a step, and
//! accumulating `s * dot + b * sum(x)` per 8 values in f32 for every row, so each load of x
//! serves ROWS rows. Each warp sums its lanes (a butterfly of shuffles), then one warp sums
//! the warps' partial sums (shared memory) and writes. One block a few rows and the whole
//! block on k keeps many blocks in flight and each thread's loop short (a decode step is
//! bound by load latency, not arithmetic). The rows of x go TC at a time (one alone when
//! only one is left, as in a decode step), each pass reading the rows' weights again (from
//! cache). The `n` exports (`qmvn`, `glun`) take x before its RMSNorm and the norm's weight
//! g: each thread scales its x values by g and sums their squares beside the dot products,
//! and the block's sums come out times `1 / sqrt(sum(x^2) / K + eps)` (the product is linear
//! in x, so the norm's one factor a row applies once, at the end).

#include "device.h"

#define WARPS 4
#define ROWS 4
#define TC 4
#define THREADS (WARPS * 32)
#define BLOCK_ROWS ROWS

enum { SCALE_F32 = 0, SCALE_F16 = 1, SCALE_BF16 = 2 };

template <int S>
KDEV float scale_at(const void* p, uint32_t i) {
  if (S == SCALE_F32) return ((const float*)p)[i];
  if (S == SCALE_F16) return f16_to_f32(((const uint16_t*)p)[i]);
  return bf16_to_f32(((const uint16_t*)p)[i]);
}

// The biases are f16 beside f16 scales, else f32.
template <int S>
KDEV float bias_at(const void* p, uint32_t i) {
  return S == SCALE_F16 ? f16_to_f32(((const uint16_t*)p)[i]) : ((const float*)p)[i];
}

// The little-endian 32-bit word at p: one load where `aligned` (IREE aligns buffers; a
// subrange might not be), else byte by byte.
KDEV uint32_t word_at(const uint8_t* p, bool aligned) {
  if (aligned) return *(const uint32_t*)p;
  return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

// The 8 signed values of row o at k0..k0+7 (k0 a multiple of 8). `aligned`: the weight
// pointer allows 32-bit loads.
template <int BITS>
KDEV void values8(const uint8_t* w, uint32_t K, uint32_t o, uint32_t k0, bool aligned, float v[8]) {
  const uint8_t* p = w + (size_t)o * (K * BITS / 8) + k0 * BITS / 8;
  if (BITS == 4) {
    const uint32_t word = word_at(p, aligned);
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = (float)((int32_t)(word << (28 - 4 * j)) >> 28);
  } else {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t word = word_at(p + 4 * h, aligned);
#pragma unroll
      for (int j = 0; j < 4; ++j) v[4 * h + j] = (float)((int32_t)(word << (24 - 8 * j)) >> 24);
    }
  }
}

// What a kernel does with its rows' dot products.
enum { PLAIN = 0, RESIDUAL = 1, GLU = 2 };

// One packed matrix's pointers.
struct Mat {
  const uint8_t* w;
  const void* sc;
  const void* bi;
};

// silu(g) * u as the graph writes it: g * logistic(g), then times u. exp by `fast_exp`.
KDEV float silu_mul(float g, float u) { return g * (1.0f / (1.0f + fast_exp(-g))) * u; }

// Rows t0..t0+N-1 of x against this block's ROWS rows from o0: of `a` (PLAIN, RESIDUAL, where
// y = dot + r), or of `a` (gate) and `b` (up) for GLU (y = silu(gate) * up).
// With NORM, x is RMSNorm's input and `gn` its weight (see the top of the file).
template <int BITS, int S, int N, int KIND, bool NORM>
KDEV void pass(const float* x, const float* gn, float eps, Mat a, Mat b, const float* r, float* y, uint32_t T,
               uint32_t K, uint32_t O, uint32_t GS, uint32_t o0, uint32_t t0, bool aligned) {
  const uint32_t lane = lane_id(), warp = warp_id(), G = K / GS;
  constexpr int M = KIND == GLU ? 2 : 1;
  // Each warp's partial sums, for the block's sum; with NORM, its sums of x^2 too.
  KSHARED float partial[WARPS][M][ROWS][N];
  KSHARED float partial_sq[WARPS][N];
  float sq[N];
#pragma unroll
  for (int t = 0; t < N; ++t) sq[t] = 0.0f;
  float acc[M][ROWS][N];
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int i = 0; i < ROWS; ++i)
#pragma unroll
      for (int t = 0; t < N; ++t) acc[m][i][t] = 0.0f;
  for (uint32_t k0 = (warp * 32 + lane) * 8; k0 < K; k0 += THREADS * 8) {
    float xv[N][8], xs[N];
#pragma unroll
    for (int t = 0; t < N; ++t) {
      // Rows past T (the last pass of N) read zeros and write nothing.
      const bool in = t0 + t < T;
      const float* xr = x + (size_t)(in ? t0 + t : t0) * K + k0;
      xs[t] = 0.0f;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        xv[t][j] = in ? xr[j] : 0.0f;
        if (NORM) {
          sq[t] = fmaf(xv[t][j], xv[t][j], sq[t]);
          xv[t][j] *= gn[k0 + j];
        }
        xs[t] += xv[t][j];
      }
    }
    const uint32_t g = k0 / GS;
#pragma unroll
    for (int i = 0; i < ROWS; ++i) {
      const uint32_t o = o0 + i;
      if (o >= O) continue;  // the same for every thread of the block
#pragma unroll
      for (int m = 0; m < M; ++m) {
        const Mat mat = m == 0 ? a : b;
        float v[8];
        values8<BITS>(mat.w, K, o, k0, aligned, v);
        const float s = scale_at<S>(mat.sc, o * G + g), bias = bias_at<S>(mat.bi, o * G + g);
#pragma unroll
        for (int t = 0; t < N; ++t) {
          float dot = 0.0f;
#pragma unroll
          for (int j = 0; j < 8; ++j) dot = fmaf(v[j], xv[t][j], dot);
          acc[m][i][t] = fmaf(s, dot, fmaf(bias, xs[t], acc[m][i][t]));
        }
      }
    }
  }
  // Every lane takes part in its warp's sums (rows past O and threads past K hold zeros).
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int i = 0; i < ROWS; ++i)
#pragma unroll
      for (int t = 0; t < N; ++t) {
        float v = acc[m][i][t];
#pragma unroll
        for (int mask = 16; mask > 0; mask >>= 1) v += shuffle_xor(v, mask);
        if (lane == 0) partial[warp][m][i][t] = v;
      }
  if (NORM) {
#pragma unroll
    for (int t = 0; t < N; ++t) {
      float v = sq[t];
#pragma unroll
      for (int mask = 16; mask > 0; mask >>= 1) v += shuffle_xor(v, mask);
      if (lane == 0) partial_sq[warp][t] = v;
    }
  }
  block_sync();
  // Warp 0's lanes take one (row, row of x) each and sum the warps in order.
  if (warp == 0 && lane < ROWS * N) {
    const uint32_t i = lane / N, t = lane % N, o = o0 + i;
    float sum[M];
#pragma unroll
    for (int m = 0; m < M; ++m) {
      sum[m] = partial[0][m][i][t];
#pragma unroll
      for (int w = 1; w < WARPS; ++w) sum[m] += partial[w][m][i][t];
    }
    if (NORM) {
      float total = partial_sq[0][t];
#pragma unroll
      for (int w = 1; w < WARPS; ++w) total += partial_sq[w][t];
      const float inv = 1.0f / __builtin_sqrtf(total / (float)K + eps);
#pragma unroll
      for (int m = 0; m < M; ++m) sum[m] *= inv;
    }
    if (o < O && t0 + t < T) {
      const size_t at = (size_t)(t0 + t) * O + o;
      if (KIND == PLAIN) y[at] = sum[0];
      if (KIND == RESIDUAL) y[at] = sum[0] + r[at];
      if (KIND == GLU) y[at] = silu_mul(sum[0], sum[M - 1]);
    }
  }
  // The next pass writes `partial` again.
  block_sync();
}

template <int BITS, int S, int KIND, bool NORM = false>
KDEV void qmv(const float* x, Mat a, Mat b, const float* r, float* y, uint32_t T, uint32_t K, uint32_t O,
              uint32_t GS, const float* gn = 0, float eps = 0.0f) {
  const uint32_t o0 = block_id() * ROWS;
  // 32-bit loads of the weights where their pointers allow (IREE aligns buffers; a subrange
  // might not be).
  const bool aligned = (((uintptr_t)a.w | (uintptr_t)b.w) & 3) == 0;
  for (uint32_t t0 = 0; t0 < T; t0 += TC) {
    if (T - t0 == 1) {
      pass<BITS, S, 1, KIND, NORM>(x, gn, eps, a, b, r, y, T, K, O, GS, o0, t0, aligned);
    } else {
      pass<BITS, S, TC, KIND, NORM>(x, gn, eps, a, b, r, y, T, K, O, GS, o0, t0, aligned);
    }
  }
}

// Embedding rows: out[t, :] = the dequantized row ids[t] (clamped into [0, O), as a
// StableHLO gather clamps), each value s * v + b in two roundings, as the graph form's
// dequantization. One block a row of x, its threads across k.
template <int BITS, int S>
KDEV void rows(const int32_t* ids, const uint8_t* w, const void* sc, const void* bi, float* out, uint32_t T,
               uint32_t K, uint32_t O, uint32_t GS) {
  const uint32_t t = block_id(), G = K / GS;
  if (t >= T) return;
  const int32_t id = ids[t];
  const uint32_t row = id < 0 ? 0 : ((uint32_t)id >= O ? O - 1 : (uint32_t)id);
  for (uint32_t k = warp_id() * 32 + lane_id(); k < K; k += THREADS) {
    int32_t v;
    if (BITS == 4) {
      const uint32_t byte = w[(size_t)row * (K / 2) + k / 2];
      v = (int32_t)(((k & 1) ? byte >> 4 : byte & 15) << 28) >> 28;
    } else {
      v = (int8_t)w[(size_t)row * K + k];
    }
    const float scaled = scale_at<S>(sc, row * G + k / GS) * (float)v;
    out[(size_t)t * K + k] = scaled + bias_at<S>(bi, row * G + k / GS);
  }
}

// The bits of an f32 push constant.
KDEV float f32_from_bits(uint32_t u) {
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}

// The exports, per (bits, scale type): `qmv` (x, w, scales, biases, y), `qmvr` (x, w, scales,
// biases, r, y), `glu` (x, gate's w, scales, biases, up's w, scales, biases, y) and `rows`
// (ids, w, scales, biases, out); push constants T, K, O, GS. `qmvn` and `glun` are `qmv` and
// `glu` with RMSNorm's weight g after x and its epsilon's bits as a fifth constant.
#define EXPORTS(BITS, SN, S)                                                                               \
  extern "C" KGLOBAL void mlx_iree_cuda_qmv##BITS##_##SN(const float* __restrict__ x, const uint8_t* __restrict__ w, \
                                                      const void* __restrict__ sc, const void* __restrict__ bi,    \
                                                      float* __restrict__ y, uint32_t T, uint32_t K, uint32_t O,   \
                                                      uint32_t GS) {                                               \
    const Mat m = {w, sc, bi};                                                                             \
    qmv<BITS, S, PLAIN>(x, m, m, 0, y, T, K, O, GS);                                                       \
  }                                                                                                        \
  extern "C" KGLOBAL void mlx_iree_cuda_qmvr##BITS##_##SN(                                                 \
      const float* __restrict__ x, const uint8_t* __restrict__ w, const void* __restrict__ sc,             \
      const void* __restrict__ bi, const float* __restrict__ r, float* __restrict__ y, uint32_t T, uint32_t K, \
      uint32_t O, uint32_t GS) {                                                                           \
    const Mat m = {w, sc, bi};                                                                             \
    qmv<BITS, S, RESIDUAL>(x, m, m, r, y, T, K, O, GS);                                                    \
  }                                                                                                        \
  extern "C" KGLOBAL void mlx_iree_cuda_glu##BITS##_##SN(                                                  \
      const float* __restrict__ x, const uint8_t* __restrict__ wg, const void* __restrict__ sg,            \
      const void* __restrict__ bg, const uint8_t* __restrict__ wu, const void* __restrict__ su,            \
      const void* __restrict__ bu, float* __restrict__ y, uint32_t T, uint32_t K, uint32_t O, uint32_t GS) { \
    qmv<BITS, S, GLU>(x, Mat{wg, sg, bg}, Mat{wu, su, bu}, 0, y, T, K, O, GS);                             \
  }                                                                                                        \
  extern "C" KGLOBAL void mlx_iree_cuda_qmvn##BITS##_##SN(                                                 \
      const float* __restrict__ x, const float* __restrict__ gn, const uint8_t* __restrict__ w,            \
      const void* __restrict__ sc, const void* __restrict__ bi, float* __restrict__ y, uint32_t T, uint32_t K, \
      uint32_t O, uint32_t GS, uint32_t EPS) {                                                             \
    const Mat m = {w, sc, bi};                                                                             \
    qmv<BITS, S, PLAIN, true>(x, m, m, 0, y, T, K, O, GS, gn, f32_from_bits(EPS));                         \
  }                                                                                                        \
  extern "C" KGLOBAL void mlx_iree_cuda_glun##BITS##_##SN(                                                 \
      const float* __restrict__ x, const float* __restrict__ gn, const uint8_t* __restrict__ wg,           \
      const void* __restrict__ sg, const void* __restrict__ bg, const uint8_t* __restrict__ wu,            \
      const void* __restrict__ su, const void* __restrict__ bu, float* __restrict__ y, uint32_t T, uint32_t K, \
      uint32_t O, uint32_t GS, uint32_t EPS) {                                                             \
    qmv<BITS, S, GLU, true>(x, Mat{wg, sg, bg}, Mat{wu, su, bu}, 0, y, T, K, O, GS, gn, f32_from_bits(EPS)); \
  }                                                                                                        \
  extern "C" KGLOBAL void mlx_iree_cuda_rows##BITS##_##SN(                                                 \
      const int32_t* __restrict__ ids, const uint8_t* __restrict__ w, const void* __restrict__ sc,         \
      const void* __restrict__ bi, float* __restrict__ out, uint32_t T, uint32_t K, uint32_t O, uint32_t GS) { \
    rows<BITS, S>(ids, w, sc, bi, out, T, K, O, GS);                                                       \
  }

EXPORTS(4, f32, SCALE_F32)
EXPORTS(4, f16, SCALE_F16)
EXPORTS(4, bf16, SCALE_BF16)
EXPORTS(8, f32, SCALE_F32)
EXPORTS(8, f16, SCALE_F16)
EXPORTS(8, bf16, SCALE_BF16)
