//! Runs a kernel object's entry points on inputs read from stdin and writes their results to
//! stdout, for the tests of objects IREE cannot run here (tests/tests/kernel_driver): linked
//! with qmv_aarch64.c's object into a static aarch64 Linux executable run under qemu-user
//! (kernels_aarch64.rs), or with qmv_x86_64_amx.c's built with its tiles emulated
//! (MLX_IREE_AMX_EMULATE) into a static x86-64 one run natively, which also reports on stderr
//! how many tile products ran (kernels_amx.rs). Not built by the crate. No libc: its own
//! `_start` and Linux system calls (aarch64 and x86-64), so no cross C library is needed,
//! only clang and lld.
//!
//! stdin: cases one after the other until its end. A case is 9 little-endian u32 (op: 0 for
//! `qmv`, 1 for `qrows`, 3 for `qmvr`, 4 for `qmve` with one expert that every row chose;
//! bits; 1 for f16 scales, 0 for f32, 2 for E8M0 bytes (FP4); T; K; O; group size; 1 for FP4 codes, whose entries
//! take no biases (the case still carries them), 0 for affine; 1 for `qmv` and `qmvr`'s
//! `_x8` twins, x quantized to 8 bits), then its input (T x K f32 for
//! `qmv`, `qmvr` and `qmve`, T i32 ids for `qrows`), for `qmvr` the residual (T x O f32),
//! weights (kernel layout), scales and biases ([O / 16][K / group size][16]), each part
//! padded with zeros to a multiple of 64 bytes (the alignment IREE gives its bindings); or an attention case (`attn`,
//! attn.h): 14 u32 (2; 0 for an f32 cache, 1 for f16, 2 for 8-bit; L; S; P; K; G; hd; W;
//! sliding; the scale's f32 bits; n; kv heads per workgroup; layer), then q, k_new, v_new,
//! the k and v caches (as attn.h lays them out), positions and slots, each padded the same
//! way; or a dense case (hmv.h): 5 u32 (5
//! for `hmv`, 6 for `hmvr`, 7 for `hrows`; T; K; O; 1 for bf16, 0 for f16, 2 for mxfp8), then
//! x (T x K f32, or T i32 ids), for `hmvr` the residual, and the weights in hmv.h's blocks (O
//! x K 16-bit values, or mxfp8's bytes, then its O x K / 32 scale bytes), padded the same way; or a delta case (delta.h): 7 u32 (8; n; m; H; dk;
//! dv; S), then q, k, v, g, beta, positions, slots, last and the state, padded the same way.
//! stdout: each case's output (T x O
//! or T x K f32; n x K x G x hd f32; for a delta case y, n * m x H x dv f32, then the state
//! after the step, S x H x dv x dk f32), in order. The work is split into workgroups as
//! IREE splits it (4 row blocks per `qmv` call, one id per `qrows` call), and the output
//! starts as NaNs, so a kernel must write every value it owns.

#include <stddef.h>
#include <stdint.h>

typedef void qmv_fn(const float*, size_t, const uint8_t*, size_t, const void*, size_t, const void*, size_t, float*,
                    size_t, size_t, size_t, size_t, size_t, size_t, size_t);
typedef void qrows_fn(const int32_t*, size_t, const uint8_t*, size_t, const void*, size_t, const void*, size_t,
                      float*, size_t, size_t, size_t, size_t, size_t, size_t, size_t);
qmv_fn mlx_iree_qmv4_f16, mlx_iree_qmv4_f32, mlx_iree_qmv8_f16, mlx_iree_qmv8_f32, mlx_iree_qmv3_f16, mlx_iree_qmv3_f32,
    mlx_iree_qmv6_f16, mlx_iree_qmv6_f32;
qmv_fn mlx_iree_qmv4_f16_x8, mlx_iree_qmv4_f32_x8, mlx_iree_qmv8_f16_x8, mlx_iree_qmv8_f32_x8, mlx_iree_qmv3_f16_x8,
    mlx_iree_qmv3_f32_x8, mlx_iree_qmv6_f16_x8, mlx_iree_qmv6_f32_x8;
typedef void qmvr_fn(const float*, size_t, const uint8_t*, size_t, const void*, size_t, const void*, size_t,
                     const float*, size_t, float*, size_t, size_t, size_t, size_t, size_t, size_t, size_t);
qmvr_fn mlx_iree_qmvr4_f16, mlx_iree_qmvr4_f32, mlx_iree_qmvr8_f16, mlx_iree_qmvr8_f32, mlx_iree_qmvr3_f16,
    mlx_iree_qmvr3_f32, mlx_iree_qmvr6_f16, mlx_iree_qmvr6_f32;
qmvr_fn mlx_iree_qmvr4_f16_x8, mlx_iree_qmvr4_f32_x8, mlx_iree_qmvr8_f16_x8, mlx_iree_qmvr8_f32_x8,
    mlx_iree_qmvr3_f16_x8, mlx_iree_qmvr3_f32_x8, mlx_iree_qmvr6_f16_x8, mlx_iree_qmvr6_f32_x8;
qrows_fn mlx_iree_qrows4_f16, mlx_iree_qrows4_f32, mlx_iree_qrows8_f16, mlx_iree_qrows8_f32, mlx_iree_qrows3_f16,
    mlx_iree_qrows3_f32, mlx_iree_qrows6_f16, mlx_iree_qrows6_f32;
typedef void qmve_fn(const float*, size_t, const int32_t*, size_t, const uint8_t*, size_t, const void*, size_t,
                     const void*, size_t, float*, size_t, size_t, size_t, size_t, size_t, size_t, size_t, size_t,
                     size_t);
qmve_fn mlx_iree_qmve4_f16, mlx_iree_qmve4_f32, mlx_iree_qmve8_f16, mlx_iree_qmve8_f32, mlx_iree_qmve3_f16,
    mlx_iree_qmve3_f32, mlx_iree_qmve6_f16, mlx_iree_qmve6_f32;
// The affine entry `op` for the case's bits (3, 4, 6 or 8) and scale type, its name ending
// in `sfx` (nothing, or `_x8`).
#define BY_BITS_SFX(op, sfx)                                                                     \
  (bits == 3   ? (f16 ? mlx_iree_##op##3_f16##sfx : mlx_iree_##op##3_f32##sfx)                   \
   : bits == 4 ? (f16 ? mlx_iree_##op##4_f16##sfx : mlx_iree_##op##4_f32##sfx)                   \
   : bits == 6 ? (f16 ? mlx_iree_##op##6_f16##sfx : mlx_iree_##op##6_f32##sfx)                   \
               : (f16 ? mlx_iree_##op##8_f16##sfx : mlx_iree_##op##8_f32##sfx))
#define BY_BITS(op) BY_BITS_SFX(op, )
// `qmv` and `qmvr` with x at 8 bits or 16 (x8).
#define BY_BITS_X8(op) (x8 ? BY_BITS_SFX(op, _x8) : BY_BITS(op))
// The FP4 entries: no biases.
typedef void qmv_fp4_fn(const float*, size_t, const uint8_t*, size_t, const void*, size_t, float*, size_t, size_t,
                        size_t, size_t, size_t, size_t, size_t);
typedef void qrows_fp4_fn(const int32_t*, size_t, const uint8_t*, size_t, const void*, size_t, float*, size_t,
                          size_t, size_t, size_t, size_t, size_t, size_t);
typedef void qmvr_fp4_fn(const float*, size_t, const uint8_t*, size_t, const void*, size_t, const float*, size_t,
                         float*, size_t, size_t, size_t, size_t, size_t, size_t, size_t);
typedef void qmve_fp4_fn(const float*, size_t, const int32_t*, size_t, const uint8_t*, size_t, const void*, size_t,
                         float*, size_t, size_t, size_t, size_t, size_t, size_t, size_t, size_t, size_t);
qmv_fp4_fn mlx_iree_qmvfp4_f16, mlx_iree_qmvfp4_f32, mlx_iree_qmvfp4_e8m0;
qrows_fp4_fn mlx_iree_qrowsfp4_f16, mlx_iree_qrowsfp4_f32, mlx_iree_qrowsfp4_e8m0;
qmvr_fp4_fn mlx_iree_qmvrfp4_f16, mlx_iree_qmvrfp4_f32, mlx_iree_qmvrfp4_e8m0;
qmv_fp4_fn mlx_iree_qmvfp4_f16_x8, mlx_iree_qmvfp4_f32_x8, mlx_iree_qmvfp4_e8m0_x8;
qmvr_fp4_fn mlx_iree_qmvrfp4_f16_x8, mlx_iree_qmvrfp4_f32_x8, mlx_iree_qmvrfp4_e8m0_x8;
qmve_fp4_fn mlx_iree_qmvefp4_f16, mlx_iree_qmvefp4_f32, mlx_iree_qmvefp4_e8m0;
// The FP4 entry `op` for the case's scale type (0 f32, 1 f16, 2 E8M0).
#define BY_SCALE_SFX(op, sfx) \
  (f16 == 2 ? mlx_iree_##op##fp4_e8m0##sfx : f16 ? mlx_iree_##op##fp4_f16##sfx : mlx_iree_##op##fp4_f32##sfx)
#define BY_SCALE(op) BY_SCALE_SFX(op, )
#define BY_SCALE_X8(op) (x8 ? BY_SCALE_SFX(op, _x8) : BY_SCALE(op))
// Each row's expert in a `qmve` case: the one expert there is.
static const int32_t expert_ids[128];
typedef void attn_fn(const float*, size_t, const float*, size_t, const float*, size_t, const void*, size_t,
                     const void*, size_t, const int32_t*, size_t, const int32_t*, size_t, float*, size_t, size_t,
                     size_t, size_t, size_t, size_t, size_t, size_t, size_t, size_t, size_t, size_t, size_t);
attn_fn mlx_iree_attn_f16, mlx_iree_attn_f32, mlx_iree_attn_q8;
typedef void hmv_fn(const float*, size_t, const uint16_t*, size_t, float*, size_t, size_t, size_t, size_t, size_t,
                    size_t);
typedef void hmvr_fn(const float*, size_t, const uint16_t*, size_t, const float*, size_t, float*, size_t, size_t,
                     size_t, size_t, size_t, size_t);
typedef void hrows_fn(const int32_t*, size_t, const uint16_t*, size_t, float*, size_t, size_t, size_t, size_t, size_t,
                      size_t);
hmv_fn mlx_iree_hmv_f16, mlx_iree_hmv_bf16;
hmvr_fn mlx_iree_hmvr_f16, mlx_iree_hmvr_bf16;
hrows_fn mlx_iree_hrows_f16, mlx_iree_hrows_bf16;
void mlx_iree_hmv_mxfp8(const float*, size_t, const uint8_t*, size_t, const uint8_t*, size_t, float*, size_t, size_t,
                        size_t, size_t, size_t, size_t);
void mlx_iree_hmvr_mxfp8(const float*, size_t, const uint8_t*, size_t, const uint8_t*, size_t, const float*, size_t,
                         float*, size_t, size_t, size_t, size_t, size_t, size_t);
void mlx_iree_hrows_mxfp8(const int32_t*, size_t, const uint8_t*, size_t, const uint8_t*, size_t, float*, size_t,
                          size_t, size_t, size_t, size_t, size_t);
typedef void delta_fn(const float*, size_t, const float*, size_t, const float*, size_t, const float*, size_t,
                      const float*, size_t, const int32_t*, size_t, const int32_t*, size_t, const int32_t*, size_t,
                      float*, size_t, float*, size_t, size_t, size_t, size_t, size_t, size_t, size_t, size_t, size_t);
delta_fn mlx_iree_delta;

#if defined(__aarch64__)
static long syscall3(long nr, long a, long b, long c) {
  register long x8 __asm__("x8") = nr;
  register long x0 __asm__("x0") = a;
  register long x1 __asm__("x1") = b;
  register long x2 __asm__("x2") = c;
  __asm__ volatile("svc #0" : "+r"(x0) : "r"(x8), "r"(x1), "r"(x2) : "memory");
  return x0;
}

enum { SYS_READ = 63, SYS_WRITE = 64, SYS_EXIT_GROUP = 94 };
#elif defined(__x86_64__)
static long syscall3(long nr, long a, long b, long c) {
  long ret;
  __asm__ volatile("syscall" : "=a"(ret) : "a"(nr), "D"(a), "S"(b), "d"(c) : "rcx", "r11", "memory");
  return ret;
}

enum { SYS_READ = 0, SYS_WRITE = 1, SYS_EXIT_GROUP = 231 };
#else
#error "qmv_qemu_driver.c: Linux system calls for aarch64 and x86-64 only"
#endif

static __attribute__((noreturn)) void quit(int code) {
  syscall3(SYS_EXIT_GROUP, code, 0, 0);
  __builtin_unreachable();
}

static void fail(const char* why) {
  size_t n = 0;
  while (why[n]) ++n;
  syscall3(SYS_WRITE, 2, (long)why, (long)n);
  quit(1);
}

static void write_all(const uint8_t* p, size_t n) {
  while (n > 0) {
    const long w = syscall3(SYS_WRITE, 1, (long)p, (long)n);
    if (w <= 0) fail("qmv_qemu_driver: write failed\n");
    p += w;
    n -= (size_t)w;
  }
}

static uint8_t input[128 << 20] __attribute__((aligned(64)));
static float output[1 << 20] __attribute__((aligned(64)));

static size_t padded(size_t bytes) { return (bytes + 63) / 64 * 64; }

// Runs the attention case at p (header h) and returns its size.
static size_t run_attention(const uint8_t* p, size_t len, const uint32_t* h) {
  const size_t elem = h[1], L = h[2], S = h[3], P = h[4], K = h[5], G = h[6], HD = h[7], W = h[8];
  const size_t sliding = h[9], scale_bits = h[10], n = h[11], units = h[12];
  const size_t q_bytes = n * K * G * HD * 4, new_bytes = n * K * HD * 4;
  // An 8-bit row: per 16 values, a 4-byte scale and 16 bytes.
  const size_t row_bytes = elem == 2 ? HD / 16 * 20 : HD * (elem ? 2 : 4);
  const size_t cache_bytes = L * S * P * K * row_bytes, rows_bytes = n * 4;
  const size_t size = 64 + padded(q_bytes) + 2 * padded(new_bytes) + 2 * padded(cache_bytes) + 2 * padded(rows_bytes);
  if (size > len) fail("qmv_qemu_driver: truncated case\n");
  if (n * K * G * HD > sizeof output / sizeof output[0]) fail("qmv_qemu_driver: output too large\n");
  if (units == 0) fail("qmv_qemu_driver: zero units per workgroup\n");
  const uint8_t* q = p + 64;
  const uint8_t* kn = q + padded(q_bytes);
  const uint8_t* vn = kn + padded(new_bytes);
  const uint8_t* kc = vn + padded(new_bytes);
  const uint8_t* vc = kc + padded(cache_bytes);
  const uint8_t* pos = vc + padded(cache_bytes);
  const uint8_t* slots = pos + padded(rows_bytes);
  for (size_t i = 0; i < n * K * G * HD; ++i) output[i] = __builtin_nanf("");
  attn_fn* fn = elem == 2 ? mlx_iree_attn_q8 : elem ? mlx_iree_attn_f16 : mlx_iree_attn_f32;
  for (size_t u = 0; u < n * K; u += units)
    fn((const float*)q, 0, (const float*)kn, 0, (const float*)vn, 0, kc, 0, vc, 0, (const int32_t*)pos, 0,
       (const int32_t*)slots, 0, output, 0, h[13], S, P, K, G, HD, W, sliding, scale_bits, n, u, u + units);
  write_all((const uint8_t*)output, n * K * G * HD * 4);
  return size;
}

// Runs the delta case at p (header h), its state updated where it lies (the input is
// writable), and returns its size.
static size_t run_delta(const uint8_t* p, size_t len, const uint32_t* h) {
  const size_t n = h[1], m = h[2], H = h[3], DK = h[4], DV = h[5], S = h[6], R = n * m;
  const size_t qk_bytes = R * H * DK * 4, v_bytes = R * H * DV * 4, gb_bytes = R * H * 4;
  const size_t state_bytes = S * H * DV * DK * 4, out_len = R * H * DV;
  const size_t size = 64 + 2 * padded(qk_bytes) + padded(v_bytes) + 2 * padded(gb_bytes) + padded(R * 4) +
                      padded(n * 4) + padded(4) + padded(state_bytes);
  if (size > len) fail("qmv_qemu_driver: truncated case\n");
  if (out_len > sizeof output / sizeof output[0]) fail("qmv_qemu_driver: output too large\n");
  const uint8_t* q = p + 64;
  const uint8_t* k = q + padded(qk_bytes);
  const uint8_t* v = k + padded(qk_bytes);
  const uint8_t* g = v + padded(v_bytes);
  const uint8_t* beta = g + padded(gb_bytes);
  const uint8_t* pos = beta + padded(gb_bytes);
  const uint8_t* slots = pos + padded(R * 4);
  const uint8_t* last = slots + padded(n * 4);
  float* state = (float*)(uintptr_t)(last + padded(4));
  for (size_t i = 0; i < out_len; ++i) output[i] = __builtin_nanf("");
  // One (sequence, head) a workgroup, as IREE splits it.
  for (size_t u = 0; u < n * H; ++u)
    mlx_iree_delta((const float*)q, 0, (const float*)k, 0, (const float*)v, 0, (const float*)g, 0,
                   (const float*)beta, 0, (const int32_t*)pos, 0, (const int32_t*)slots, 0, (const int32_t*)last, 0,
                   state, 0, output, 0, n, m, H, DK, DV, S, u, u + 1);
  write_all((const uint8_t*)output, out_len * 4);
  write_all((const uint8_t*)state, state_bytes);
  return size;
}

// Runs the dense case at p (header h) and returns its size.
static size_t run_dense(const uint8_t* p, size_t len, const uint32_t* h) {
  const uint32_t op = h[0], bf16 = h[4] == 1, mxfp8 = h[4] == 2;
  const size_t T = h[1], K = h[2], O = h[3];
  const size_t in_bytes = op == 7 ? T * 4 : T * K * 4, r_bytes = op == 6 ? T * O * 4 : 0;
  const size_t w_bytes = O * K * (mxfp8 ? 1 : 2), s_bytes = mxfp8 ? O * K / 32 : 0;
  const size_t out_len = T * (op == 7 ? K : O);
  const size_t size = 64 + padded(in_bytes) + padded(r_bytes) + padded(w_bytes) + padded(s_bytes);
  if (size > len) fail("qmv_qemu_driver: truncated case\n");
  if (out_len > sizeof output / sizeof output[0]) fail("qmv_qemu_driver: output too large\n");
  const uint8_t* x = p + 64;
  const float* r = (const float*)(x + padded(in_bytes));
  const uint16_t* w = (const uint16_t*)(x + padded(in_bytes) + padded(r_bytes));
  const uint8_t* w8 = (const uint8_t*)w;
  const uint8_t* sc = w8 + padded(w_bytes);
  for (size_t i = 0; i < out_len; ++i) output[i] = __builtin_nanf("");
  if (mxfp8) {
    if (op == 7)
      for (size_t t = 0; t < T; ++t) mlx_iree_hrows_mxfp8((const int32_t*)x, 0, w8, 0, sc, 0, output, 0, T, K, O, t, t + 1);
    for (size_t rb = 0; op != 7 && rb < O / 16; rb += 4) {
      if (op == 6)
        mlx_iree_hmvr_mxfp8((const float*)x, 0, w8, 0, sc, 0, r, 0, output, 0, T, K, O, rb, rb + 4);
      else
        mlx_iree_hmv_mxfp8((const float*)x, 0, w8, 0, sc, 0, output, 0, T, K, O, rb, rb + 4);
    }
  } else if (op == 7) {
    hrows_fn* fn = bf16 ? mlx_iree_hrows_bf16 : mlx_iree_hrows_f16;
    for (size_t t = 0; t < T; ++t) fn((const int32_t*)x, 0, w, 0, output, 0, T, K, O, t, t + 1);
  } else {
    for (size_t rb = 0; rb < O / 16; rb += 4) {
      if (op == 6) {
        hmvr_fn* fn = bf16 ? mlx_iree_hmvr_bf16 : mlx_iree_hmvr_f16;
        fn((const float*)x, 0, w, 0, r, 0, output, 0, T, K, O, rb, rb + 4);
      } else {
        hmv_fn* fn = bf16 ? mlx_iree_hmv_bf16 : mlx_iree_hmv_f16;
        fn((const float*)x, 0, w, 0, output, 0, T, K, O, rb, rb + 4);
      }
    }
  }
  write_all((const uint8_t*)output, out_len * 4);
  return size;
}

// Runs the case at p (len bytes left) and returns its size.
static size_t run_case(const uint8_t* p, size_t len) {
  if (len < 64) fail("qmv_qemu_driver: truncated header\n");
  const uint32_t* h = (const uint32_t*)p;
  if (h[0] == 2) return run_attention(p, len, h);
  if (h[0] == 8) return run_delta(p, len, h);
  if (h[0] >= 5) return run_dense(p, len, h);
  const uint32_t op = h[0], bits = h[1], f16 = h[2], fp4 = h[7], x8 = h[8];
  const size_t T = h[3], K = h[4], O = h[5], GS = h[6];
  const size_t in_bytes = op == 1 ? T * 4 : T * K * 4, r_bytes = op == 3 ? T * O * 4 : 0;
  const size_t w_bytes = O * K * bits / 8;
  const size_t s_bytes = O * (K / GS) * (f16 == 2 ? 1 : f16 ? 2 : 4), out_len = T * (op == 1 ? K : O);
  const size_t size = 64 + padded(in_bytes) + padded(r_bytes) + padded(w_bytes) + 2 * padded(s_bytes);
  if (size > len) fail("qmv_qemu_driver: truncated case\n");
  if (out_len > sizeof output / sizeof output[0]) fail("qmv_qemu_driver: output too large\n");
  const uint8_t* x = p + 64;
  const uint8_t* r = x + padded(in_bytes);
  const uint8_t* w = r + padded(r_bytes);
  const uint8_t* s = w + padded(w_bytes);
  const uint8_t* b = s + padded(s_bytes);
  for (size_t i = 0; i < out_len; ++i) output[i] = __builtin_nanf("");
  if (fp4 && op == 0) {
    qmv_fp4_fn* fn = BY_SCALE_X8(qmv);
    for (size_t rb = 0; rb < O / 16; rb += 4) fn((const float*)x, 0, w, 0, s, 0, output, 0, T, K, O, GS, rb, rb + 4);
  } else if (fp4 && op == 3) {
    qmvr_fp4_fn* fn = BY_SCALE_X8(qmvr);
    for (size_t rb = 0; rb < O / 16; rb += 4)
      fn((const float*)x, 0, w, 0, s, 0, (const float*)r, 0, output, 0, T, K, O, GS, rb, rb + 4);
  } else if (fp4 && op == 4) {
    if (T > sizeof expert_ids / sizeof expert_ids[0]) fail("qmv_qemu_driver: too many rows for qmve\n");
    qmve_fp4_fn* fn = BY_SCALE(qmve);
    const size_t by_expert = T >= 8, units = (by_expert ? 1 : T) * (O / 16);
    for (size_t u = 0; u < units; u += 4)
      fn((const float*)x, 0, expert_ids, 0, w, 0, s, 0, output, 0, T, K, O, GS, 1, by_expert, u, u + 4);
  } else if (fp4) {
    qrows_fp4_fn* fn = BY_SCALE(qrows);
    for (size_t t = 0; t < T; ++t) fn((const int32_t*)x, 0, w, 0, s, 0, output, 0, T, K, O, GS, t, t + 1);
  } else if (op == 0) {
    qmv_fn* fn = BY_BITS_X8(qmv);
    for (size_t rb = 0; rb < O / 16; rb += 4) fn((const float*)x, 0, w, 0, s, 0, b, 0, output, 0, T, K, O, GS, rb, rb + 4);
  } else if (op == 3) {
    qmvr_fn* fn = BY_BITS_X8(qmvr);
    for (size_t rb = 0; rb < O / 16; rb += 4)
      fn((const float*)x, 0, w, 0, s, 0, b, 0, (const float*)r, 0, output, 0, T, K, O, GS, rb, rb + 4);
  } else if (op == 4) {
    // One expert, every row's: the rows by row (fewer than 8) or by expert.
    if (T > sizeof expert_ids / sizeof expert_ids[0]) fail("qmv_qemu_driver: too many rows for qmve\n");
    qmve_fn* fn = BY_BITS(qmve);
    const size_t by_expert = T >= 8, units = (by_expert ? 1 : T) * (O / 16);
    for (size_t u = 0; u < units; u += 4)
      fn((const float*)x, 0, expert_ids, 0, w, 0, s, 0, b, 0, output, 0, T, K, O, GS, 1, by_expert, u, u + 4);
  } else {
    qrows_fn* fn = BY_BITS(qrows);
    for (size_t t = 0; t < T; ++t) fn((const int32_t*)x, 0, w, 0, s, 0, b, 0, output, 0, T, K, O, GS, t, t + 1);
  }
  write_all((const uint8_t*)output, out_len * 4);
  return size;
}

// The tile products of the emulated AMX object (qmv_x86_64_amx.c built with
// MLX_IREE_AMX_EMULATE). Every other object lacks the symbol: a weak reference, null there.
extern uint64_t mlx_iree_amx_emulated_dots __attribute__((weak));

// At the end, the emulated AMX object's tile products on stderr ("tile products: N"), so its
// test knows the tiles ran.
static void report_tile_products(void) {
  if (&mlx_iree_amx_emulated_dots == 0) return;
  char line[40] = "tile products: ";
  size_t n = 15;
  char digits[20];
  size_t d = 0;
  uint64_t v = mlx_iree_amx_emulated_dots;
  do digits[d++] = (char)('0' + v % 10);
  while ((v /= 10) != 0);
  while (d > 0) line[n++] = digits[--d];
  line[n++] = '\n';
  syscall3(SYS_WRITE, 2, (long)line, (long)n);
}

// Entered with the stack 16-byte aligned but no return address pushed: on x86-64 that is
// not a function's entry alignment, so realigned.
#if defined(__x86_64__)
__attribute__((force_align_arg_pointer))
#endif
void _start(void) {
  size_t len = 0;
  for (;;) {
    if (len == sizeof input) fail("qmv_qemu_driver: input too large\n");
    const long r = syscall3(SYS_READ, 0, (long)(input + len), (long)(sizeof input - len));
    if (r < 0) fail("qmv_qemu_driver: read failed\n");
    if (r == 0) break;
    len += (size_t)r;
  }
  for (size_t at = 0; at < len;) at += run_case(input + at, len - at);
  report_tile_products();
  quit(0);
}
