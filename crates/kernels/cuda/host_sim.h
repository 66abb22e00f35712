//! The CUDA builtins qmv.cu uses, for the host: a launch runs each block's threads as host
//! threads (one block after another), and a warp's shuffle meets its 32 threads at a
//! barrier, so the kernel's own code computes its own bits here (tests/tests/kernels_cuda.rs).
//! Not for speed.

#pragma once

#include <barrier>
#include <cmath>
#include <memory>
#include <thread>
#include <vector>

#define KDEV static inline
#define KGLOBAL

struct SimWarp {
  std::barrier<> meet{32};
  float slot[32];
};

inline thread_local uint32_t sim_thread, sim_block;
inline thread_local SimWarp* sim_warp;

KDEV uint32_t lane_id() { return sim_thread & 31; }
KDEV uint32_t warp_id() { return sim_thread >> 5; }
KDEV uint32_t block_id() { return sim_block; }

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

// `blocks` blocks of `threads` threads (a multiple of 32), each running `kernel()`.
template <class F>
void sim_launch(uint32_t blocks, uint32_t threads, F kernel) {
  for (uint32_t b = 0; b < blocks; ++b) {
    std::unique_ptr<SimWarp[]> warps(new SimWarp[threads / 32]);
    std::vector<std::thread> pool;
    for (uint32_t t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        sim_thread = t;
        sim_block = b;
        sim_warp = &warps[t / 32];
        kernel();
      });
    for (auto& th : pool) th.join();
  }
}
