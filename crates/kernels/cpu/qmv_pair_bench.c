//! Two kernel objects' packed matvec timed against each other in one process (not built by
//! the crate): for docs/PERFORMANCE.md on a shared machine, where separate runs minutes apart
//! do not compare. The same shape as qmv_bench.c (K=2048 x O=8192, group size 64, f16 scales
//! and biases, IREE's workgroups of BLOCKS row blocks on this thread); the two alternate 41
//! times, each round timed in thread CPU time, and the medians are printed with B's speed
//! over A's. Build from the repo root (each side with its object's flags, see qmv_bench.c):
//!
//!   F="-O3 -mavx512f -mavx512bw -mavx512vnni -mfma -mf16c"
//!   AMX="$F -mavx512vbmi -mavx512vl -mamx-tile -mamx-int8"; P=crates/kernels/cpu/qmv_pair_bench.c
//!   cc $F -DSIDE=a -DKERNEL='"cpu/qmv_x86_64.c"' -Icrates/kernels -c $P -o /tmp/a.o
//!   cc $AMX -DSIDE=b -DKERNEL='"cpu/qmv_x86_64_amx.c"' -Icrates/kernels -c $P -o /tmp/b.o
//!   for o in /tmp/a.o /tmp/b.o; do objcopy -w --localize-symbol='mlx_iree_*' $o; done
//!   cc -O2 -Icrates/kernels $P /tmp/a.o /tmp/b.o -o /tmp/qmv_pair
//!
//! (The objcopy hides the exports the sides do not rename: attention, residual and expert
//! matvecs.) For GCC against clang, build side a with `gcc $F -fno-tree-loop-distribute-patterns`
//! and side b with `clang $F`, both on the same KERNEL.
//!   /tmp/qmv_pair T BITS         (e.g. 8 4: eight rows of x, 4-bit weights)

#ifdef SIDE
// One side: the kernel object with its exports renamed SIDE_qmv*.
#define PASTE_(a, b) a##_##b
#define PASTE(a, b) PASTE_(a, b)
#define mlx_iree_qmv4_f16 PASTE(SIDE, qmv4_f16)
#define mlx_iree_qmv4_f32 PASTE(SIDE, qmv4_f32)
#define mlx_iree_qmv8_f16 PASTE(SIDE, qmv8_f16)
#define mlx_iree_qmv8_f32 PASTE(SIDE, qmv8_f32)
#define mlx_iree_qrows4_f16 PASTE(SIDE, qrows4_f16)
#define mlx_iree_qrows4_f32 PASTE(SIDE, qrows4_f32)
#define mlx_iree_qrows8_f16 PASTE(SIDE, qrows8_f16)
#define mlx_iree_qrows8_f32 PASTE(SIDE, qrows8_f32)
#include KERNEL
#else

#include <sys/syscall.h>
#include <unistd.h>

#include "cpu/qmv_bench_data.h"

typedef void qmv_fn(const float*, size_t, const uint8_t*, size_t, const uint16_t*, size_t, const uint16_t*, size_t,
                    float*, size_t, size_t, size_t, size_t, size_t, size_t, size_t);
extern qmv_fn a_qmv4_f16, a_qmv8_f16, b_qmv4_f16, b_qmv8_f16;

#define BLOCKS 4
#define ROUNDS 41

static int by_value(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char** argv) {
  bench_data d;
  const int rc = bench_setup(argc, argv, &d);
  if (rc != 0) return rc;
  // Either side may be an AMX object: ask Linux for the tile state (harmless otherwise).
  if (syscall(SYS_arch_prctl, 0x1023, 18) != 0) fprintf(stderr, "note: no AMX tile state granted\n");
  qmv_fn* f[2] = {d.bits == 4 ? a_qmv4_f16 : a_qmv8_f16, d.bits == 4 ? b_qmv4_f16 : b_qmv8_f16};
  const int reps = d.T >= 8 ? 4 : 16;
  double t[2][ROUNDS];
  for (int r = 0; r < ROUNDS; r++)
    for (int v = 0; v < 2; v++) {
      const double t0 = now();
      for (int k = 0; k < reps; k++)
        for (size_t rb = 0; rb < d.O / 16; rb += BLOCKS)
          f[v](d.x, 0, d.w, 0, d.s, 0, d.b, 0, d.y, 0, d.T, d.K, d.O, d.GS, rb, rb + BLOCKS);
      t[v][r] = (now() - t0) / reps;
    }
  double med[2];
  for (int v = 0; v < 2; v++) {
    qsort(t[v], ROUNDS, sizeof(double), by_value);
    med[v] = t[v][ROUNDS / 2];
  }
  const double macs = (double)d.T * d.K * d.O;
  printf("T=%zu bits=%d: A %.1f GMAC/s, B %.1f GMAC/s (medians of %d alternated rounds): B/A %.2f\n", d.T, d.bits,
         macs / med[0] / 1e9, macs / med[1] / 1e9, ROUNDS, med[0] / med[1]);
  return 0;
}
#endif
