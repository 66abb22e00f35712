//! The CUDA builtins qmv.cu uses, for the host: a launch runs each block's threads as host
//! threads (one block after another), and a warp's shuffle meets its 32 threads at a
//! barrier (and a block's `__syncthreads` at another), so the kernel's own code computes its
//! own bits here (tests/tests/kernels_cuda.rs).
//! Not for speed.

#pragma once

#include <barrier>
#include <cmath>
#include <memory>
#include <thread>
#include <vector>

#define KDEV static inline
#define KGLOBAL
// One copy a kernel function: blocks run one after another, so a block's threads share it.
#define KSHARED static

struct SimWarp {
  std::barrier<> meet{32};
  float slot[32];
};

inline thread_local uint32_t sim_thread, sim_block;
inline thread_local SimWarp* sim_warp;
inline thread_local std::barrier<>* sim_block_meet;

KDEV uint32_t lane_id() { return sim_thread & 31; }
KDEV uint32_t warp_id() { return sim_thread >> 5; }
KDEV uint32_t block_id() { return sim_block; }

KDEV void block_sync() { sim_block_meet->arrive_and_wait(); }

KDEV float shuffle_xor(float v, int mask) {
  const uint32_t lane = lane_id();
  sim_warp->slot[lane] = v;
  sim_warp->meet.arrive_and_wait();
  const float r = sim_warp->slot[lane ^ (uint32_t)mask];
  sim_warp->meet.arrive_and_wait();
  return r;
}

// IEEE half to float, exactly (subnormals, infinities and NaNs included).
KDEV float f16_to_f32(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  float mag;
  if (exp == 0) {
    mag = std::ldexp((float)man, -24);
  } else if (exp == 31) {
    mag = man ? NAN : INFINITY;
  } else {
    mag = std::ldexp((float)(man | 0x400), (int)exp - 25);
  }
  uint32_t bits;
  __builtin_memcpy(&bits, &mag, 4);
  bits |= sign;
  __builtin_memcpy(&mag, &bits, 4);
  return mag;
}

// The device's approximation, to within its error.
KDEV float fast_exp(float x) { return std::exp(x); }

// `blocks` blocks of `threads` threads (a multiple of 32), each running `kernel()`: one host
// thread per thread of a block, which runs every block in turn, meeting the others between
// blocks (a block's shared memory is then free for the next).
template <class F>
void sim_launch(uint32_t blocks, uint32_t threads, F kernel) {
  std::unique_ptr<SimWarp[]> warps(new SimWarp[threads / 32]);
  std::barrier<> block_meet((std::ptrdiff_t)threads);
  std::vector<std::thread> pool;
  for (uint32_t t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      sim_thread = t;
      sim_warp = &warps[t / 32];
      sim_block_meet = &block_meet;
      for (uint32_t b = 0; b < blocks; ++b) {
        sim_block = b;
        kernel();
        block_meet.arrive_and_wait();
      }
    });
  for (auto& th : pool) th.join();
}
