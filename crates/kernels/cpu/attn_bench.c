//! Single-thread speed of one kernel object's decode attention over an f32 cache, outside
//! IREE (not built by the crate). For docs/PERFORMANCE.md: the bytes a second one core reads
//! of the cache, which bounds a long context's decode. Build and run from the repo root:
//!
//!   cc -O3 -ffp-contract=off -mavx512f -mavx512bw -mavx512vnni -mavx512vl -mfma -mf16c \
//!      -DKERNEL='"cpu/qmv_x86_64.c"' -Icrates/kernels crates/kernels/cpu/attn_bench.c -o /tmp/attn_bench
//!   /tmp/attn_bench B CTX MODE [CACHE [HD]]     (e.g. 8 2000 dram q8)
//!
//! B rows (one sequence each, slots 0..B-1) at CTX positions, the 1B shape's heads (8 kv heads,
//! 4 query heads each, head dim 64; or, with HD 128 or 256, 4 or 2 kv heads of that head dim:
//! 256 is Qwen3.5's and Gemma 3's), a cache of 16 layers x 8 slots x 2100 positions: f32 (the
//! default; 2.2 GB, keys and values) or q8 (`--kv-cache q8`'s 20-byte chunks, 5/16 of that).
//! MODE dram: the 16 layers in turn (the cache from memory); hot: layer 0 sixteen times (one
//! sequence's 8 MB, from the L3 cache where it fits). All of a row's kv heads in one call, on
//! this thread. Prints the best of 3 (thread CPU time) and the cache
//! bytes read a second.

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include KERNEL
static double now(void) { struct timespec t; clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
int main(int argc, char** argv) {
  if (argc < 4 || argc > 6 || atoi(argv[1]) < 1 || atoi(argv[1]) > 64 || atoi(argv[2]) < 1 ||
      atoi(argv[2]) > 2084 || (strcmp(argv[3], "dram") && strcmp(argv[3], "hot")) ||
      (argc >= 5 && strcmp(argv[4], "f32") && strcmp(argv[4], "q8")) ||
      (argc == 6 && strcmp(argv[5], "64") && strcmp(argv[5], "128") && strcmp(argv[5], "256"))) {
    fprintf(stderr, "usage: attn_bench B CTX dram|hot [f32|q8 [64|128|256]]   (B 1..64 rows, CTX 1..2084 positions)\n");
    return 2;
  }
  const int q8 = argc >= 5 && !strcmp(argv[4], "q8");
  const size_t B = atoi(argv[1]), CTX = atoi(argv[2]); const int hot = !strcmp(argv[3], "hot");
  const size_t HD = argc == 6 ? (size_t)atoi(argv[5]) : 64;
  const size_t L = 16, S = 8, P = 2100, K = 512 / HD, G = 4;
  const size_t per = L * S * P * K * HD;
  // An element's bytes in the cache: 4, or 20 per 16 (an f32 scale, then 16 int8).
  const double elem = q8 ? 20.0 / 16.0 : 4.0;
  float* kc = NULL; float* vc = NULL; int8_t* kq = NULL; int8_t* vq = NULL;
  if (q8) {
    const size_t chunks = per / 16;
    kq = aligned_alloc(64, chunks * 20); vq = aligned_alloc(64, chunks * 20);
    for (size_t i = 0; i < chunks; ++i) {
      const float ks = 0.5f / 127, vs = 1.0f / 127;
      memcpy(kq + i * 20, &ks, 4); memcpy(vq + i * 20, &vs, 4);
      for (size_t j = 0; j < 16; ++j) { kq[i * 20 + 4 + j] = (int8_t)(((i * 16 + j) * 2654435761u) % 255 - 127); vq[i * 20 + 4 + j] = (int8_t)(((i * 16 + j) * 40503u) % 255 - 127); }
    }
  } else {
    kc = aligned_alloc(64, per * 4); vc = aligned_alloc(64, per * 4);
    for (size_t i = 0; i < per; ++i) { kc[i] = (float)((i * 2654435761u) % 1000) * 1e-3f - 0.5f; vc[i] = (float)((i * 40503u) % 997) * 1e-3f; }
  }
  float* q = aligned_alloc(64, B * K * G * HD * 4); float* kn = aligned_alloc(64, B * K * HD * 4);
  float* vn = aligned_alloc(64, B * K * HD * 4); float* out = aligned_alloc(64, B * K * G * HD * 4);
  for (size_t i = 0; i < B * K * G * HD; ++i) q[i] = (float)(i % 13) * 0.1f;
  for (size_t i = 0; i < B * K * HD; ++i) { kn[i] = 0.1f; vn[i] = 0.2f; }
  int32_t pos[64], slots[64];
  for (size_t r = 0; r < B; ++r) { pos[r] = (int32_t)CTX; slots[r] = (int32_t)r; }
  float scale = 0.125f; uint32_t sb; memcpy(&sb, &scale, 4);
  double best = 1e9;
  for (int rep = 0; rep < 3; ++rep) {
    double t0 = now();
    for (size_t l = 0; l < L; ++l)
      if (q8)
        mlx_iree_attn_q8(q, 0, kn, 0, vn, 0, kq, 0, vq, 0, pos, 0, slots, 0, out, 0, hot ? 0 : l, S, P, K, G, HD, P, 0, sb, B, 0, B * K);
      else
        mlx_iree_attn_f32(q, 0, kn, 0, vn, 0, kc, 0, vc, 0, pos, 0, slots, 0, out, 0, hot ? 0 : l, S, P, K, G, HD, P, 0, sb, B, 0, B * K);
    double t = now() - t0; if (t < best) best = t;
  }
  double bytes = 2.0 * B * CTX * K * HD * elem * L;
  printf("B=%zu ctx=%zu hd=%zu %s %s: %.2f ms for 16 layers (one thread), %.1f GB/s\n", B, CTX, HD, argv[3], q8 ? "q8" : "f32", best * 1e3, bytes / best / 1e9);
  return 0;
}
