//! What qmv_bench.c and qmv_pair_bench.c share (not built by the crate): the command line
//! (ROWS BITS), the timer, and the problem: K=2048 x O=8192 weights (8 or 16 MiB, beyond L2)
//! of random bytes, group size 64, f16 scales and biases, T rows of x in [-1, 1].

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef struct {
  size_t K, O, GS, T;
  int bits;
  float* x;
  uint8_t* w;
  uint16_t* s;
  uint16_t* b;
  float* y;
} bench_data;

// This thread's CPU time: time the scheduler gives to other processes on a shared machine does
// not count (time its host gives to other machines still does).
static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

// Parses ROWS BITS into `d` and fills its buffers; 0, or the exit status after a usage line.
static int bench_setup(int argc, char** argv, bench_data* d) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s ROWS BITS (BITS 3, 4, 6 or 8)\n", argv[0]);
    return 2;
  }
  d->K = 2048, d->O = 8192, d->GS = 64, d->T = (size_t)atoi(argv[1]);
  d->bits = atoi(argv[2]);
  if (d->T < 1 || (d->bits != 3 && d->bits != 4 && d->bits != 6 && d->bits != 8)) {
    fprintf(stderr, "ROWS must be at least 1 and BITS 3, 4, 6 or 8\n");
    return 2;
  }
  const size_t K = d->K, O = d->O, GS = d->GS, T = d->T, wbytes = O * K * d->bits / 8;
  d->x = aligned_alloc(64, T * K * sizeof(float));
  d->w = aligned_alloc(64, wbytes);
  d->s = aligned_alloc(64, O * K / GS * 2);
  d->b = aligned_alloc(64, O * K / GS * 2);
  d->y = aligned_alloc(64, T * O * sizeof(float));
  srand(1);
  for (size_t i = 0; i < T * K; i++) d->x[i] = (float)(rand() % 2001 - 1000) / 1000.0f;
  for (size_t i = 0; i < wbytes; i++) d->w[i] = (uint8_t)rand();
  for (size_t i = 0; i < O * K / GS; i++) {
    d->s[i] = 0x2c00;  // 0.0625 in f16
    d->b[i] = 0xa400;  // -0.015625
  }
  return 0;
}
