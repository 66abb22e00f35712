//! The 8-bit KV cache's rows in the graph (`--kv-cache q8`): `kernels::cpu::q8_encode`'s
//! format and arithmetic, op for op, so the graph form, `write_kv` and the CPU kernel
//! (`cpu/attn.h`) agree bit for bit. A row of `w` values is `w / 16` blocks; a block is its
//! scale `s = a / 127` (`a` its largest magnitude) as 4 bytes of f32 bits, little-endian,
//! then its 16 values `round_ties_even(x * (127 / a))` as i8 (0 where `a` is 0), read back
//! as `q * s`. The bytes live in the cache's i8 buffer: IREE 3.13's StableHLO lowering
//! bitcasts only between types of one width, so the scale's bytes are taken apart and put
//! together with shifts.

use super::{R, V};
use hlo_emit::{Cmp, ElementType::*, Func};
use kernels::cpu::{Q8_BLOCK, Q8_BLOCK_BYTES};

const BLOCK: i64 = Q8_BLOCK as i64;
const BYTES: i64 = Q8_BLOCK_BYTES as i64;

/// `x` (`[.., w]` f32) in blocks `[.., w / 16, 16]`: each block's scale `[.., w / 16]` and its
/// values rounded to whole numbers (f32), with the blocks' dims.
fn quantize<'c, 'b>(f: &Func<'c, 'b>, x: V<'c, 'b>) -> R<(V<'c, 'b>, V<'c, 'b>, Vec<i64>)> {
    let dims = x.shape();
    let (&w, lead) = dims.split_last().expect("a cache row has a width");
    let blocks: Vec<i64> = lead.iter().copied().chain([w / BLOCK, BLOCK]).collect();
    let last = blocks.len() as i64 - 1;
    let xb = f.reshape(x, &blocks)?;
    let a = f.reduce_max(f.abs(xb)?, &[last])?;
    let zero = f.splat_like(a, 0.0)?;
    let top = f.splat_like(a, 127.0)?;
    let inv = f.select(f.compare(a, zero, Cmp::Gt)?, f.div(top, a)?, zero)?;
    let s = f.div(a, top)?;
    let per_block: Vec<i64> = (0..last).collect();
    let q = f.round_nearest_even(f.mul(xb, f.broadcast_in_dim(inv, &blocks, &per_block)?)?)?;
    Ok((s, q, blocks))
}

/// `x` (`[.., w]` f32) rounded through the 8-bit cache: what a later step reads back (the
/// values through i8 and back, so a -0 is the +0 the cache holds).
pub(super) fn round<'c, 'b>(f: &Func<'c, 'b>, x: V<'c, 'b>) -> R<V<'c, 'b>> {
    let (s, q, blocks) = quantize(f, x)?;
    let q = f.convert(f.convert(q, I8)?, F32)?;
    let per_block: Vec<i64> = (0..blocks.len() as i64 - 1).collect();
    f.reshape(f.mul(q, f.broadcast_in_dim(s, &blocks, &per_block)?)?, &x.shape())
}

/// `x` (`[.., w]` f32) as the 8-bit cache stores it: `[.., w / 16 * 20]` i8.
pub(super) fn encode<'c, 'b>(f: &Func<'c, 'b>, x: V<'c, 'b>) -> R<V<'c, 'b>> {
    let (s, q, blocks) = quantize(f, x)?;
    let last = blocks.len() as i64 - 1;
    let bits = f.bitcast_convert(s, I32)?;
    let column: Vec<i64> = blocks[..last as usize].iter().copied().chain([1]).collect();
    // Byte j of the scale, sign-extended into i8's range: bits << (24 - 8j) >> 24.
    let byte = |j: i64| -> R<V<'c, 'b>> {
        let up = f.shift_left(bits, f.splat_like(bits, (24 - 8 * j) as f64)?)?;
        f.reshape(f.shift_right_arithmetic(up, f.splat_like(bits, 24.0)?)?, &column)
    };
    let scale = f.convert(f.concatenate(&[byte(0)?, byte(1)?, byte(2)?, byte(3)?], last)?, I8)?;
    let rows = f.concatenate(&[scale, f.convert(q, I8)?], last)?;
    let out: Vec<i64> =
        blocks[..last as usize - 1].iter().copied().chain([blocks[last as usize - 1] * BYTES]).collect();
    f.reshape(rows, &out)
}

/// The 8-bit cache's rows `[.., w / 16 * 20]` (i8) as their values `[.., w]` (f32, exact).
pub(super) fn decode<'c, 'b>(f: &Func<'c, 'b>, x: V<'c, 'b>) -> R<V<'c, 'b>> {
    let dims = x.shape();
    let (&stored, lead) = dims.split_last().expect("a cache row has a width");
    let nb = stored / BYTES;
    let blocks: Vec<i64> = lead.iter().copied().chain([nb, BYTES]).collect();
    let last = blocks.len() as i64 - 1;
    let xb = f.reshape(x, &blocks)?;
    let scale = f.convert(f.slice_dim(xb, last, 0, 4)?, I32)?;
    let per_block: Vec<i64> = lead.iter().copied().chain([nb]).collect();
    // Byte j, unsigned, in its place: (b & 255) << 8j.
    let byte = |j: i64| -> R<V<'c, 'b>> {
        let b = f.reshape(f.slice_dim(scale, last, j, j + 1)?, &per_block)?;
        let b = f.and(b, f.splat_like(b, 255.0)?)?;
        if j == 0 { Ok(b) } else { f.shift_left(b, f.splat_like(b, (8 * j) as f64)?) }
    };
    let bits = f.or(f.or(byte(0)?, byte(1)?)?, f.or(byte(2)?, byte(3)?)?)?;
    let s = f.bitcast_convert(bits, F32)?;
    let q = f.convert(f.slice_dim(xb, last, 4, BYTES)?, F32)?;
    let keep: Vec<i64> = (0..last).collect();
    let values: Vec<i64> = blocks[..last as usize].iter().copied().chain([BLOCK]).collect();
    let out: Vec<i64> = lead.iter().copied().chain([nb * BLOCK]).collect();
    f.reshape(f.mul(q, f.broadcast_in_dim(s, &values, &keep)?)?, &out)
}
