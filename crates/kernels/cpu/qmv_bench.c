//! Single-thread speed of one kernel object's packed matvec, outside IREE (not built by the crate).
//!
//! For docs/PERFORMANCE.md: how many multiply-adds a second one core gets through at T rows
//! of x, which bounds batched decode on the packed path. Build and run from the repo root:
//!
//!   cc -O3 -mavx512f -mavx512bw -mavx512vnni -mfma -mf16c \
//!      -DKERNEL='"cpu/qmv_x86_64.c"' -Icrates/kernels crates/kernels/cpu/qmv_bench.c -o /tmp/qmv_bench
//!   /tmp/qmv_bench T BITS        (e.g. 8 4: eight rows of x, 4-bit weights)
//!
//! (`-mavx2 -mfma -mf16c -DKERNEL='"cpu/qmv_x86_64_avx2.c"'` for the AVX2 object; the AVX-512
//! flags plus `-mavx512vbmi -mavx512vl -mamx-tile -mamx-int8
//! -DKERNEL='"cpu/qmv_x86_64_amx.c"'` for the AMX one.) The weights are K=2048 x O=8192 (8 or
//! 16 MiB, beyond L2), group size 64, f16 scales and biases; the work is split into IREE's
//! workgroups (BLOCKS row blocks each) and run on this thread.
//! Prints the best of 5 timings (thread CPU time): ms per matvec, GMAC/s, and weight GB/s.

#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include KERNEL

// This thread's CPU time: time the scheduler gives to other processes on a shared machine does
// not count (time its host gives to other machines still does).
static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s ROWS BITS (BITS 4 or 8)\n", argv[0]);
    return 2;
  }
#if defined(__AMX_TILE__) || defined(__AMXTILE__)  // gcc, clang
  // Linux hands out AMX tile state only on request (ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA).
  if (syscall(SYS_arch_prctl, 0x1023, 18) != 0) {
    perror("arch_prctl(ARCH_REQ_XCOMP_PERM)");
    return 1;
  }
#endif
  const size_t K = 2048, O = 8192, GS = 64, T = (size_t)atoi(argv[1]);
  const int bits = atoi(argv[2]);
  if (T < 1 || (bits != 4 && bits != 8)) {
    fprintf(stderr, "ROWS must be at least 1 and BITS 4 or 8\n");
    return 2;
  }
  float* x = aligned_alloc(64, T * K * sizeof(float));
  uint8_t* w = aligned_alloc(64, O * K * bits / 8);
  uint16_t* s = aligned_alloc(64, O * K / GS * 2);
  uint16_t* b = aligned_alloc(64, O * K / GS * 2);
  float* y = aligned_alloc(64, T * O * sizeof(float));
  srand(1);
  for (size_t i = 0; i < T * K; i++) x[i] = (float)(rand() % 2001 - 1000) / 1000.0f;
  for (size_t i = 0; i < O * K * bits / 8; i++) w[i] = (uint8_t)rand();
  for (size_t i = 0; i < O * K / GS; i++) {
    s[i] = 0x2c00;  // 0.0625 in f16
    b[i] = 0xa400;  // -0.015625
  }
  const int reps = T >= 8 ? 20 : 80;
  double best = 1e30;
  for (int r = 0; r < 5; r++) {
    const double t0 = now();
    for (int k = 0; k < reps; k++)
      for (size_t rb = 0; rb < O / 16; rb += BLOCKS) {
        if (bits == 4)
          mlx_iree_qmv4_f16(x, 0, w, 0, s, 0, b, 0, y, 0, T, K, O, GS, rb, rb + BLOCKS);
        else
          mlx_iree_qmv8_f16(x, 0, w, 0, s, 0, b, 0, y, 0, T, K, O, GS, rb, rb + BLOCKS);
      }
    const double dt = (now() - t0) / reps;
    if (dt < best) best = dt;
  }
  printf("T=%zu bits=%d: %.3f ms, %.1f GMAC/s, %.1f GB/s of weights (y[7] = %g)\n", T, bits, best * 1e3,
         (double)T * K * O / best / 1e9, (double)O * K * bits / 8 / best / 1e9, y[7]);
  return 0;
}
