//! Single-thread speed of one kernel object's packed matvec, outside IREE (not built by the crate).
//!
//! For docs/PERFORMANCE.md: how many multiply-adds a second one core gets through at T rows
//! of x, which bounds batched decode on the packed path. Build and run from the repo root:
//!
//!   cc -O3 -mavx512f -mavx512bw -mavx512vnni -mfma -mf16c \
//!      -DKERNEL='"cpu/qmv_x86_64.c"' -Icrates/kernels crates/kernels/cpu/qmv_bench.c -o /tmp/qmv_bench
//!   /tmp/qmv_bench T BITS        (e.g. 8 4: eight rows of x, 4-bit weights; BITS 3, 4, 6 or 8)
//!
//! (`-mavx2 -mfma -mf16c -DKERNEL='"cpu/qmv_x86_64_avx2.c"'` for the AVX2 object; the AVX-512
//! flags plus `-mavx512vbmi -mavx512vl -mamx-tile -mamx-int8
//! -DKERNEL='"cpu/qmv_x86_64_amx.c"'` for the AMX one.) The weights are K=2048 x O=8192 (8 or
//! 16 MiB, beyond L2), group size 64, f16 scales and biases; the work is split into IREE's
//! workgroups (BLOCKS row blocks each) and run on this thread.
//! Prints the best of 5 timings (thread CPU time): ms per matvec, GMAC/s, and weight GB/s.

#include <sys/syscall.h>
#include <unistd.h>

#include "cpu/qmv_bench_data.h"
#include KERNEL

int main(int argc, char** argv) {
#if defined(__AMX_TILE__) || defined(__AMXTILE__)  // gcc, clang
  // Linux hands out AMX tile state only on request (ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA).
  if (syscall(SYS_arch_prctl, 0x1023, 18) != 0) {
    perror("arch_prctl(ARCH_REQ_XCOMP_PERM)");
    return 1;
  }
#endif
  bench_data d;
  const int rc = bench_setup(argc, argv, &d);
  if (rc != 0) return rc;
  const int reps = d.T >= 8 ? 20 : 80;
  double best = 1e30;
  for (int r = 0; r < 5; r++) {
    const double t0 = now();
    for (int k = 0; k < reps; k++)
      for (size_t rb = 0; rb < d.O / 16; rb += BLOCKS) {
        (d.bits == 3   ? mlx_iree_qmv3_f16
         : d.bits == 4 ? mlx_iree_qmv4_f16
         : d.bits == 6 ? mlx_iree_qmv6_f16
                       : mlx_iree_qmv8_f16)(d.x, 0, d.w, 0, d.s, 0, d.b, 0, d.y, 0, d.T, d.K, d.O, d.GS, rb, rb + BLOCKS);
      }
    const double dt = (now() - t0) / reps;
    if (dt < best) best = dt;
  }
  printf("T=%zu bits=%d: %.3f ms, %.1f GMAC/s, %.1f GB/s of weights (y[7] = %g)\n", d.T, d.bits, best * 1e3,
         (double)d.T * d.K * d.O / best / 1e9, (double)d.O * d.K * d.bits / 8 / best / 1e9, d.y[7]);
  return 0;
}
