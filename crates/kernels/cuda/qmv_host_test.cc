//! qmv.cu run on the host (host_sim.h) against a reference in double, for
//! tests/tests/kernels_cuda.rs: every export (qmv, qmvr, glu, rows, and qmvn and glun with
//! RMSNorm's weight) for every (bits, scale type), several group sizes, rows of x from 1 to 9, output counts that are not multiples
//! of a block's 16 rows, weight pointers off 32-bit alignment, and ids past the table.
//! Prints one line per case and exits 1 if a product is off by more than 1e-5 of the sum of
//! its terms' magnitudes, or a looked-up row is not exactly `s * v + b`.
//!
//!   c++ -std=c++20 -O1 -pthread -ffp-contract=off -Icrates/kernels/cuda \
//!       crates/kernels/cuda/qmv_host_test.cc -o /tmp/qmv_host_test && /tmp/qmv_host_test

#include <cstdio>
#include <cstring>

#include "qmv.cu"

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint32_t next() {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return (uint32_t)(rng >> 16);
}
static float uniform() { return (float)(next() & 0xFFFFFF) / 16777216.0f * 2.0f - 1.0f; }

// Round to nearest even f16 / bf16 bits (values here are normal and in range).
static uint16_t to_f16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  const uint32_t sign = (u >> 16) & 0x8000;
  int exp = (int)((u >> 23) & 0xff) - 127 + 15;
  uint32_t man = u & 0x7fffff;
  if (exp <= 0) return (uint16_t)sign;  // not produced by the cases
  uint32_t h = ((uint32_t)exp << 10) | (man >> 13);
  const uint32_t rest = man & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) ++h;
  return (uint16_t)(sign | h);
}
static uint16_t to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  const uint32_t rest = u & 0xffff;
  uint32_t h = u >> 16;
  if (rest > 0x8000 || (rest == 0x8000 && (h & 1))) ++h;
  return (uint16_t)h;
}

typedef void (*Qmv)(const float*, const uint8_t*, const void*, const void*, float*, uint32_t, uint32_t, uint32_t,
                    uint32_t);
typedef void (*Qmvr)(const float*, const uint8_t*, const void*, const void*, const float*, float*, uint32_t,
                     uint32_t, uint32_t, uint32_t);
typedef void (*Rows)(const int32_t*, const uint8_t*, const void*, const void*, float*, uint32_t, uint32_t, uint32_t,
                     uint32_t);
typedef void (*Glu)(const float*, const uint8_t*, const void*, const void*, const uint8_t*, const void*,
                    const void*, float*, uint32_t, uint32_t, uint32_t, uint32_t);
typedef void (*Qmvn)(const float*, const float*, const uint8_t*, const void*, const void*, float*, uint32_t,
                     uint32_t, uint32_t, uint32_t, uint32_t);
typedef void (*Glun)(const float*, const float*, const uint8_t*, const void*, const void*, const uint8_t*,
                     const void*, const void*, float*, uint32_t, uint32_t, uint32_t, uint32_t, uint32_t);

#define TABLE(OP, TYPE)                                                                          \
  static const TYPE OP##_kernels[2][3] = {                                                       \
      {mlx_iree_cuda_##OP##4_f32, mlx_iree_cuda_##OP##4_f16, mlx_iree_cuda_##OP##4_bf16},        \
      {mlx_iree_cuda_##OP##8_f32, mlx_iree_cuda_##OP##8_f16, mlx_iree_cuda_##OP##8_bf16}};
TABLE(qmv, Qmv)
TABLE(qmvr, Qmvr)
TABLE(glu, Glu)
TABLE(rows, Rows)
TABLE(qmvn, Qmvn)
TABLE(glun, Glun)

// A random packed matrix [O, K] in the kernel's layout (`misalign` bytes into its buffer),
// with its values, scales and biases as the kernel reads them.
struct Matrix {
  std::vector<int> v;
  std::vector<uint8_t> buf;
  uint8_t* w;
  std::vector<float> s, b;
  std::vector<uint16_t> s16, b16;
  const void* sp;
  const void* bp;

  Matrix(int bits, int scale, uint32_t K, uint32_t O, uint32_t GS, uint32_t misalign)
      : v((size_t)O * K), buf((size_t)O * K * bits / 8 + 4, 0), s((size_t)O * (K / GS)), b(s.size()),
        s16(s.size()), b16(s.size()) {
    const uint32_t row_bytes = K * bits / 8;
    w = buf.data() + misalign;
    for (size_t i = 0; i < v.size(); ++i) v[i] = (int)(next() % (1u << bits)) - (1 << (bits - 1));
    for (uint32_t o = 0; o < O; ++o)
      for (uint32_t k = 0; k < K; ++k) {
        const uint32_t u = (uint32_t)v[(size_t)o * K + k] & ((1u << bits) - 1);
        if (bits == 4) {
          w[(size_t)o * row_bytes + k / 2] |= (uint8_t)(u << (4 * (k % 2)));
        } else {
          w[(size_t)o * row_bytes + k] = (uint8_t)u;
        }
      }
    for (size_t i = 0; i < s.size(); ++i) {
      s[i] = 0.01f + 0.05f * (uniform() + 1.0f);
      b[i] = 0.3f * uniform();
      if (scale == SCALE_F16) {
        s16[i] = to_f16(s[i]);
        b16[i] = to_f16(b[i]);
        s[i] = f16_to_f32(s16[i]);
        b[i] = f16_to_f32(b16[i]);
      } else if (scale == SCALE_BF16) {
        s16[i] = to_bf16(s[i]);
        s[i] = bf16_to_f32(s16[i]);
      }
    }
    sp = scale == SCALE_F32 ? (const void*)s.data() : (const void*)s16.data();
    bp = scale == SCALE_F16 ? (const void*)b16.data() : (const void*)b.data();
  }

  // Row o of W times row t of x in double, and the sum of its terms' magnitudes.
  void dot(const std::vector<float>& x, uint32_t t, uint32_t o, uint32_t K, uint32_t GS, double* ref,
           double* mag) const {
    const uint32_t G = K / GS;
    *ref = *mag = 0.0;
    for (uint32_t k = 0; k < K; ++k) {
      const double wk = (double)s[(size_t)o * G + k / GS] * v[(size_t)o * K + k] + b[(size_t)o * G + k / GS];
      *ref += wk * x[(size_t)t * K + k];
      *mag += fabs(wk * x[(size_t)t * K + k]);
    }
  }
};

enum { QMV, QMVR, GLU_OP, QMVN, GLUN };

// Rows `ids` (an id past O and a negative one among them, clamped) of a packed matrix
// [O, K], against s * v + b in float, which they must equal exactly.
static int rows_case(int bits, int scale, uint32_t K, uint32_t O, uint32_t GS) {
  const Matrix a(bits, scale, K, O, GS, 0);
  const std::vector<int32_t> ids = {3, 0, (int32_t)O - 1, (int32_t)O + 5, -2, 7};
  const uint32_t T = (uint32_t)ids.size(), G = K / GS;
  std::vector<float> out((size_t)T * K, -1.0f);
  sim_launch(T, WARPS * 32, [&] { rows_kernels[bits == 8][scale](ids.data(), a.w, a.sp, a.bp, out.data(), T, K, O, GS); });
  int wrong = 0;
  for (uint32_t t = 0; t < T; ++t) {
    const uint32_t row = ids[t] < 0 ? 0 : ((uint32_t)ids[t] >= O ? O - 1 : (uint32_t)ids[t]);
    for (uint32_t k = 0; k < K; ++k) {
      const float scaled = a.s[(size_t)row * G + k / GS] * (float)a.v[(size_t)row * K + k];
      wrong += out[(size_t)t * K + k] != scaled + a.b[(size_t)row * G + k / GS];
    }
  }
  const char* names[3] = {"f32", "f16", "bf16"};
  printf("%s rows bits=%d scale=%s K=%u O=%u GS=%u wrong=%d\n", wrong ? "FAIL" : "ok  ", bits, names[scale], K, O, GS,
         wrong);
  return wrong ? 1 : 0;
}

// `xscale`: x's magnitude (a small one makes RMSNorm's epsilon count).
static int run_case(int op, int bits, int scale, uint32_t T, uint32_t K, uint32_t O, uint32_t GS,
                    uint32_t misalign, float xscale = 1.0f) {
  std::vector<float> x((size_t)T * K), r((size_t)T * O), y((size_t)T * O, -1.0f);
  for (auto& e : x) e = xscale * uniform();
  for (auto& e : r) e = uniform();
  const Matrix a(bits, scale, K, O, GS, misalign), b(bits, scale, K, O, GS, misalign);
  const int i = bits == 8;
  // For the `n` exports: RMSNorm's weight and epsilon, and the normed x the reference reads
  // (in double, rounded once to float).
  const bool norm = op == QMVN || op == GLUN;
  const float eps = 1e-5f;
  uint32_t eps_bits;
  memcpy(&eps_bits, &eps, 4);
  std::vector<float> g(K), xn = x;
  for (auto& e : g) e = 1.0f + 0.5f * uniform();
  if (norm)
    for (uint32_t t = 0; t < T; ++t) {
      double sq = 0.0;
      for (uint32_t k = 0; k < K; ++k) sq += (double)x[(size_t)t * K + k] * x[(size_t)t * K + k];
      const double inv = 1.0 / sqrt(sq / K + eps);
      for (uint32_t k = 0; k < K; ++k) xn[(size_t)t * K + k] = (float)(x[(size_t)t * K + k] * (double)g[k] * inv);
    }
  sim_launch((O + BLOCK_ROWS - 1) / BLOCK_ROWS, WARPS * 32, [&] {
    if (op == QMV) qmv_kernels[i][scale](x.data(), a.w, a.sp, a.bp, y.data(), T, K, O, GS);
    if (op == QMVR) qmvr_kernels[i][scale](x.data(), a.w, a.sp, a.bp, r.data(), y.data(), T, K, O, GS);
    if (op == GLU_OP) glu_kernels[i][scale](x.data(), a.w, a.sp, a.bp, b.w, b.sp, b.bp, y.data(), T, K, O, GS);
    if (op == QMVN) qmvn_kernels[i][scale](x.data(), g.data(), a.w, a.sp, a.bp, y.data(), T, K, O, GS, eps_bits);
    if (op == GLUN)
      glun_kernels[i][scale](x.data(), g.data(), a.w, a.sp, a.bp, b.w, b.sp, b.bp, y.data(), T, K, O, GS, eps_bits);
  });
  double worst = 0.0;
  for (uint32_t t = 0; t < T; ++t)
    for (uint32_t o = 0; o < O; ++o) {
      double ref, mag;
      a.dot(xn, t, o, K, GS, &ref, &mag);
      double want = ref, allowed = mag;
      if (op == QMVR) {
        want = ref + r[(size_t)t * O + o];
        allowed = mag + fabs(r[(size_t)t * O + o]);
      }
      if (op == GLU_OP || op == GLUN) {
        double up, up_mag;
        b.dot(xn, t, o, K, GS, &up, &up_mag);
        const double act = ref / (1.0 + exp(-ref));
        want = act * up;
        // Each factor's error carries through the product (the sigmoid's slope is below 1.1).
        allowed = 1.1 * mag * fabs(up) + up_mag * fabs(act) + fabs(want);
      }
      const double err = fabs(y[(size_t)t * O + o] - want) / (allowed > 0 ? allowed : 1.0);
      if (!(err <= worst)) worst = err;  // NaN counts as worst
    }
  const bool ok = worst <= 1e-5;
  const char* ops[5] = {"qmv", "qmvr", "glu", "qmvn", "glun"};
  const char* names[3] = {"f32", "f16", "bf16"};
  printf("%s %s bits=%d scale=%s T=%u K=%u O=%u GS=%u misalign=%u worst=%.3g\n", ok ? "ok  " : "FAIL", ops[op], bits,
         names[scale], T, K, O, GS, misalign, worst);
  return ok ? 0 : 1;
}

int main() {
  int failed = 0;
  for (int op : {QMV, QMVR, GLU_OP, QMVN, GLUN})
    for (int bits : {4, 8})
      for (int scale : {SCALE_F32, SCALE_F16, SCALE_BF16}) {
        // The normed exports share everything but their prologue and last factor: one shape.
        if (op != QMVN && op != GLUN) failed += run_case(op, bits, scale, 1, 512, 12, 64, 0);
        failed += run_case(op, bits, scale, 6, 384, 10, 32, 0);
      }
  for (int bits : {4, 8})
    for (int scale : {SCALE_F32, SCALE_F16, SCALE_BF16}) failed += rows_case(bits, scale, 320, 24, 64);
  failed += run_case(QMV, 4, SCALE_F16, 9, 1024, 17, 128, 0);
  failed += run_case(GLU_OP, 4, SCALE_BF16, 3, 256, 20, 64, 0);
  failed += run_case(QMV, 4, SCALE_F16, 2, 320, 16, 64, 1);
  failed += run_case(QMVR, 8, SCALE_BF16, 3, 256, 48, 64, 3);
  failed += run_case(QMV, 4, SCALE_F32, 1, 2048, 64, 64, 0);
  failed += run_case(GLU_OP, 8, SCALE_F16, 5, 2304, 12, 128, 0);
  failed += run_case(QMVN, 4, SCALE_F16, 1, 2048, 20, 64, 0);
  failed += run_case(GLUN, 4, SCALE_BF16, 9, 1024, 12, 64, 1);
  failed += run_case(QMVN, 8, SCALE_F32, 2, 512, 8, 64, 0, 0.004f);
  printf("%d failed\n", failed);
  return failed ? 1 : 0;
}
