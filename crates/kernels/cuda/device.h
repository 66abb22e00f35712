//! What qmv.cu needs of CUDA, without the CUDA toolkit's headers: clang's NVPTX builtins when
//! compiling for the device, else `host_sim.h`'s host threads (for the tests).

#pragma once

#include <stddef.h>
#include <stdint.h>

#if defined(__CUDA__) && defined(__CUDA_ARCH__)
#define KDEV static __attribute__((device)) inline
#define KGLOBAL __attribute__((global))
#define KSHARED static __attribute__((shared))

KDEV uint32_t lane_id() { return __nvvm_read_ptx_sreg_tid_x() & 31; }
KDEV uint32_t warp_id() { return __nvvm_read_ptx_sreg_tid_x() >> 5; }
KDEV uint32_t block_id() { return __nvvm_read_ptx_sreg_ctaid_x(); }
// Every thread of the block takes part.
KDEV void block_sync() { __syncthreads(); }
// Every lane of the warp takes part.
KDEV float shuffle_xor(float v, int mask) { return __nvvm_shfl_sync_bfly_f32(0xffffffffu, v, mask, 0x1f); }
KDEV float f16_to_f32(uint16_t h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}
// e^x as 2^(x log2 e) by the hardware's approximation (`ex2.approx`, about 2 ulp), as
// CUDA's own `__expf`.
KDEV float fast_exp(float x) { return __nvvm_ex2_approx_f(x * 1.4426950408889634f); }
#else
#include "host_sim.h"
#endif

KDEV float bf16_to_f32(uint16_t h) {
  const uint32_t u = (uint32_t)h << 16;
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}

// One rounding, on the device and on the host alike.
#define fmaf __builtin_fmaf
