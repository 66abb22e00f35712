//! Fused dequantize + matrix-vector product for MLX affine 3-, 4-, 6- and 8-bit and FP4 weights (AVX-512).
//!
//! Linked into IREE's embedded ELF executables (freestanding: no libc, no globals). The
//! exported functions, layouts and the loop over panels of rows, groups and blocks are in
//! qmv.h (shared with the AVX2 and AMX twins, whose results are the same bits); the
//! arithmetic, AVX-512 VNNI (`vpdpwssd`), is in qmv_avx512.h (shared with the AMX object).

#include <immintrin.h>

// qmv_avx512.h reads 3-bit and 6-bit groups as stored.
#define GROUP_ROWS_3 1
#define GROUP_ROWS_6 1
#include "qmv.h"
#include "qmv_avx512.h"
#include "qrows.h"
#include "vf16_avx512.h"
#include "attn.h"
// Three state rows of 128 floats (24 of the 32 zmm registers) side by side: 1.8x one row's speed over a
// prompt chunk (their chains of dependent operations overlap).
#define DELTA_STATE_VF 24
#include "delta.h"
// 24 of the 32 zmm registers accumulate a tile of 12 rows x 2 blocks.
#define HMV_ROWS 12
#include "hmv.h"
