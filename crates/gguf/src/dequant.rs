//! Exact dequantization of ggml's block formats to `f32`, block by block, following ggml's
//! reference `dequantize_row_*` (ggml-quants.c) operation for operation, each product and sum
//! rounded once as in gguf-py's NumPy reference (no fused multiply-add), so the bits equal
//! gguf-py's `quants.dequantize` (tested against it on llama.cpp-quantized files). It decodes;
//! it does not quantize, and it knows nothing of tensors or models.
//!
//! Layouts (little-endian; `d`, `dmin`, `m` are f16):
//! - `Q4_0`  (32 → 18 B): `d`, 16 B nibbles; `y[j] = (lo_j − 8)·d`, `y[j+16] = (hi_j − 8)·d`.
//! - `Q4_1`  (32 → 20 B): `d`, `m`, 16 B nibbles; `y = q·d + m`.
//! - `Q5_0`  (32 → 22 B): `d`, 32 high bits, 16 B nibbles; `y = (q − 16)·d`.
//! - `Q5_1`  (32 → 24 B): `d`, `m`, 32 high bits, 16 B nibbles; `y = q·d + m`.
//! - `Q8_0`  (32 → 34 B): `d`, 32 × i8; `y = q·d`.
//! - `Q4_K`  (256 → 144 B): `d`, `dmin`, 12 B of 6-bit scales and mins for 8 sub-blocks of 32,
//!   128 B nibbles; `y = (d·sc)·q − dmin·m`.
//! - `Q5_K`  (256 → 176 B): as `Q4_K` plus 32 B of fifth bits before the nibbles.
//! - `Q6_K`  (256 → 210 B): 128 B low nibbles, 64 B high 2-bit pairs, 16 × i8 scales, `d`;
//!   `y = (d·sc)·(q − 32)` for 16 sub-blocks of 16.

use crate::types::{GgmlType, QK_K};

/// The types [`dequantize`] decodes, for error messages.
pub const SUPPORTED: &str = "F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K";

/// Decodes `bytes` (whole blocks of `ty`) into `out` (`out.len()` elements). Returns `Err(ty)`
/// for a type this module cannot decode.
///
/// # Panics
/// When `bytes` is not exactly the blocks of `out.len()` elements (callers size both from one
/// checked tensor directory entry).
pub fn dequantize(ty: GgmlType, bytes: &[u8], out: &mut [f32]) -> Result<(), GgmlType> {
    let (elems, block_bytes) = ty.block();
    assert!(
        out.len().is_multiple_of(elems) && bytes.len() == out.len() / elems * block_bytes,
        "{} bytes are not the {} blocks of {} elements",
        bytes.len(),
        ty.name(),
        out.len()
    );
    let block: fn(&[u8], &mut [f32]) = match ty {
        GgmlType::F32 => {
            for (y, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *y = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
            return Ok(());
        }
        GgmlType::F16 => {
            for (y, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *y = f16(b);
            }
            return Ok(());
        }
        GgmlType::BF16 => {
            for (y, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *y = f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16);
            }
            return Ok(());
        }
        GgmlType::Q4_0 => q4_0,
        GgmlType::Q4_1 => q4_1,
        GgmlType::Q5_0 => q5_0,
        GgmlType::Q5_1 => q5_1,
        GgmlType::Q8_0 => q8_0,
        GgmlType::Q4_K => q4_k,
        GgmlType::Q5_K => q5_k,
        GgmlType::Q6_K => q6_k,
        other => return Err(other),
    };
    for (x, y) in bytes
        .chunks_exact(block_bytes)
        .zip(out.chunks_exact_mut(elems))
    {
        block(x, y);
    }
    Ok(())
}

/// Whether [`dequantize`] decodes `ty`.
pub fn supports(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(
        ty,
        F32 | F16 | BF16 | Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q4_K | Q5_K | Q6_K
    )
}

/// A quantized block as small integers: element `i` of group `g = i / group` is
/// `(d · scale[g]) · q[i] (+ dmin · min[g])`, `d` and `dmin` the block's f32 factors and
/// `scale`, `min` its integer sub-scales (1 for types with one scale per block), evaluated in
/// f32 in that order — exactly the bits [`dequantize`] gives. Lets a kernel multiply the integers
/// by integer activations and apply the float factors once per block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IntGroups {
    /// Elements per group (32, or 16 for `Q6_K`).
    pub group: usize,
    /// Whether groups carry an offset (`dmin · min[g]`).
    pub offset: bool,
}

/// Every type with an integer form ([`int_groups`]).
pub const INTEGER_TYPES: [GgmlType; 8] = [
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

/// The integer form of `ty`'s blocks, if it has one (the quantized types [`dequantize`] decodes).
pub fn int_groups(ty: GgmlType) -> Option<IntGroups> {
    use GgmlType::*;
    let (group, offset) = match ty {
        Q8_0 | Q4_0 | Q5_0 => (32, false),
        Q4_1 | Q5_1 | Q4_K | Q5_K => (32, true),
        Q6_K => (16, false),
        _ => return None,
    };
    Some(IntGroups { group, offset })
}

/// The float factors of one block in its integer form ([`IntGroups`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlockScale {
    /// Multiplies every group's integer scale.
    pub d: f32,
    /// Multiplies every group's integer min (0 for types without offsets; negative for the
    /// k-quants, whose mins are subtracted).
    pub dmin: f32,
}

/// Splits one block of `ty` into integers `q` (one per element) and integer `scale` and `min`
/// (one per group; `min` untouched for types without offsets) and returns its float factors.
/// `ty` must have an [`int_groups`] form.
pub fn split_block(
    ty: GgmlType,
    x: &[u8],
    q: &mut [i8],
    scale: &mut [i32],
    min: &mut [i32],
) -> BlockScale {
    match ty {
        GgmlType::Q8_0 => {
            scale[0] = 1;
            for (qv, &b) in q.iter_mut().zip(&x[2..34]) {
                *qv = b as i8;
            }
            BlockScale {
                d: f16(&x[0..2]),
                dmin: 0.0,
            }
        }
        GgmlType::Q4_0 | GgmlType::Q4_1 => {
            let (out, qs) = if ty == GgmlType::Q4_0 {
                ((f16(&x[0..2]), 0.0), &x[2..18])
            } else {
                min[0] = 1;
                ((f16(&x[0..2]), f16(&x[2..4])), &x[4..20])
            };
            let bias = if ty == GgmlType::Q4_0 { 8 } else { 0 };
            scale[0] = 1;
            for j in 0..16 {
                q[j] = (qs[j] & 0x0F) as i8 - bias;
                q[j + 16] = (qs[j] >> 4) as i8 - bias;
            }
            BlockScale {
                d: out.0,
                dmin: out.1,
            }
        }
        GgmlType::Q5_0 | GgmlType::Q5_1 => {
            let (out, qh, qs, bias) = if ty == GgmlType::Q5_0 {
                ((f16(&x[0..2]), 0.0), &x[2..6], &x[6..22], 16)
            } else {
                min[0] = 1;
                ((f16(&x[0..2]), f16(&x[2..4])), &x[4..8], &x[8..24], 0)
            };
            scale[0] = 1;
            let qh = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
            for j in 0..16 {
                let (a, b) = five_bits(qh, qs, j);
                q[j] = a as i8 - bias;
                q[j + 16] = b as i8 - bias;
            }
            BlockScale {
                d: out.0,
                dmin: out.1,
            }
        }
        GgmlType::Q4_K | GgmlType::Q5_K => {
            let (d, dmin) = (f16(&x[0..2]), f16(&x[2..4]));
            let scales = &x[4..16];
            let (qh, qs) = if ty == GgmlType::Q4_K {
                (None, &x[16..144])
            } else {
                (Some(&x[16..48]), &x[48..176])
            };
            for chunk in 0..4 {
                for half in 0..2 {
                    let g = 2 * chunk + half;
                    let (sc, m) = scale_min(g, scales);
                    scale[g] = sc as i32;
                    min[g] = m as i32;
                    for l in 0..32 {
                        let b = qs[32 * chunk + l];
                        let low = if half == 0 { b & 0x0F } else { b >> 4 };
                        let high = qh.map_or(0, |h| {
                            if h[l] & (1u8 << (2 * chunk + half)) != 0 {
                                16
                            } else {
                                0
                            }
                        });
                        q[32 * g + l] = (low + high) as i8;
                    }
                }
            }
            // `d1·q − dmin·m` is `d1·q + (−dmin)·m` bit for bit.
            BlockScale { d, dmin: -dmin }
        }
        GgmlType::Q6_K => {
            let (ql, qh, sc) = (&x[0..128], &x[128..192], &x[192..208]);
            for (g, s) in scale.iter_mut().enumerate().take(16) {
                *s = sc[g] as i8 as i32;
            }
            for half in 0..2 {
                let (ql, qh) = (&ql[64 * half..], &qh[32 * half..]);
                let q = &mut q[128 * half..];
                for l in 0..32 {
                    q[l] = (((ql[l] & 0x0F) | (qh[l] & 3) << 4) as i32 - 32) as i8;
                    q[l + 32] = (((ql[l + 32] & 0x0F) | ((qh[l] >> 2) & 3) << 4) as i32 - 32) as i8;
                    q[l + 64] = (((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4) as i32 - 32) as i8;
                    q[l + 96] = (((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4) as i32 - 32) as i8;
                }
            }
            BlockScale {
                d: f16(&x[208..210]),
                dmin: 0.0,
            }
        }
        other => panic!("{} has no integer form", other.name()),
    }
}

fn f16(b: &[u8]) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32()
}

fn q4_0(x: &[u8], y: &mut [f32]) {
    let d = f16(&x[0..2]);
    let qs = &x[2..18];
    for j in 0..16 {
        y[j] = ((qs[j] & 0x0F) as i32 - 8) as f32 * d;
        y[j + 16] = ((qs[j] >> 4) as i32 - 8) as f32 * d;
    }
}

fn q4_1(x: &[u8], y: &mut [f32]) {
    let (d, m) = (f16(&x[0..2]), f16(&x[2..4]));
    let qs = &x[4..20];
    for j in 0..16 {
        y[j] = (qs[j] & 0x0F) as f32 * d + m;
        y[j + 16] = (qs[j] >> 4) as f32 * d + m;
    }
}

/// The 5-bit values of a `Q5_0`/`Q5_1` block: `(low half, high half)` of each nibble byte.
fn five_bits(qh: u32, qs: &[u8], j: usize) -> (u8, u8) {
    let h0 = (((qh >> j) << 4) & 0x10) as u8;
    let h1 = ((qh >> (j + 12)) & 0x10) as u8;
    ((qs[j] & 0x0F) | h0, (qs[j] >> 4) | h1)
}

fn q5_0(x: &[u8], y: &mut [f32]) {
    let d = f16(&x[0..2]);
    let qh = u32::from_le_bytes([x[2], x[3], x[4], x[5]]);
    let qs = &x[6..22];
    for j in 0..16 {
        let (a, b) = five_bits(qh, qs, j);
        y[j] = (a as i32 - 16) as f32 * d;
        y[j + 16] = (b as i32 - 16) as f32 * d;
    }
}

fn q5_1(x: &[u8], y: &mut [f32]) {
    let (d, m) = (f16(&x[0..2]), f16(&x[2..4]));
    let qh = u32::from_le_bytes([x[4], x[5], x[6], x[7]]);
    let qs = &x[8..24];
    for j in 0..16 {
        let (a, b) = five_bits(qh, qs, j);
        y[j] = a as f32 * d + m;
        y[j + 16] = b as f32 * d + m;
    }
}

fn q8_0(x: &[u8], y: &mut [f32]) {
    let d = f16(&x[0..2]);
    for (yv, &q) in y.iter_mut().zip(&x[2..34]) {
        *yv = q as i8 as f32 * d;
    }
}

/// Scale and min of sub-block `j` (0..8) from the 12 packed bytes of a `Q4_K`/`Q5_K` block
/// (ggml's `get_scale_min_k4`).
fn scale_min(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// Scale and min of sub-blocks `2·chunk` and `2·chunk + 1` of a Q4_K or Q5_K block.
fn chunk_scales(d: f32, dmin: f32, scales: &[u8], chunk: usize) -> [(f32, f32); 2] {
    [2 * chunk, 2 * chunk + 1].map(|j| {
        let (sc, m) = scale_min(j, scales);
        (d * sc as f32, dmin * m as f32)
    })
}

fn q4_k(x: &[u8], y: &mut [f32]) {
    let (d, dmin) = (f16(&x[0..2]), f16(&x[2..4]));
    let scales = &x[4..16];
    let qs = &x[16..144];
    for (chunk, (q, y)) in qs.chunks_exact(32).zip(y.chunks_exact_mut(64)).enumerate() {
        let [(d1, min1), (d2, min2)] = chunk_scales(d, dmin, scales, chunk);
        for l in 0..32 {
            y[l] = d1 * (q[l] & 0x0F) as f32 - min1;
            y[l + 32] = d2 * (q[l] >> 4) as f32 - min2;
        }
    }
}

fn q5_k(x: &[u8], y: &mut [f32]) {
    let (d, dmin) = (f16(&x[0..2]), f16(&x[2..4]));
    let scales = &x[4..16];
    let qh = &x[16..48];
    let qs = &x[48..176];
    for (chunk, (q, y)) in qs.chunks_exact(32).zip(y.chunks_exact_mut(64)).enumerate() {
        let [(d1, min1), (d2, min2)] = chunk_scales(d, dmin, scales, chunk);
        let (u1, u2) = (1u8 << (2 * chunk), 2u8 << (2 * chunk));
        for l in 0..32 {
            let hi1 = if qh[l] & u1 != 0 { 16 } else { 0 };
            let hi2 = if qh[l] & u2 != 0 { 16 } else { 0 };
            y[l] = d1 * ((q[l] & 0x0F) + hi1) as f32 - min1;
            y[l + 32] = d2 * ((q[l] >> 4) + hi2) as f32 - min2;
        }
    }
}

fn q6_k(x: &[u8], y: &mut [f32]) {
    let ql = &x[0..128];
    let qh = &x[128..192];
    let sc = &x[192..208];
    let d = f16(&x[208..210]);
    for half in 0..QK_K / 128 {
        let (ql, qh) = (&ql[64 * half..], &qh[32 * half..]);
        let sc = &sc[8 * half..];
        let y = &mut y[128 * half..];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0x0F) | (qh[l] & 3) << 4) as i32 - 32;
            let q2 = ((ql[l + 32] & 0x0F) | ((qh[l] >> 2) & 3) << 4) as i32 - 32;
            let q3 = ((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4) as i32 - 32;
            let s = |i: usize| d * sc[is + i] as i8 as f32;
            y[l] = s(0) * q1 as f32;
            y[l + 32] = s(2) * q2 as f32;
            y[l + 64] = s(4) * q3 as f32;
            y[l + 96] = s(6) * q4 as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f16_bytes(v: f32) -> [u8; 2] {
        half::f16::from_f32(v).to_bits().to_le_bytes()
    }

    #[test]
    fn a_q8_0_block_is_its_scale_times_its_signed_bytes() {
        let mut x = vec![0u8; 34];
        x[0..2].copy_from_slice(&f16_bytes(0.5));
        for j in 0..32 {
            x[2 + j] = (j as i8 - 16) as u8;
        }
        let mut y = [0.0f32; 32];
        dequantize(GgmlType::Q8_0, &x, &mut y).unwrap();
        for (j, &v) in y.iter().enumerate() {
            assert_eq!(v, (j as f32 - 16.0) * 0.5);
        }
    }

    #[test]
    fn a_q4_0_block_puts_low_nibbles_first_and_centres_on_8() {
        let mut x = vec![0u8; 18];
        x[0..2].copy_from_slice(&f16_bytes(2.0));
        for j in 0..16 {
            x[2 + j] = (j as u8) | ((15 - j as u8) << 4);
        }
        let mut y = [0.0f32; 32];
        dequantize(GgmlType::Q4_0, &x, &mut y).unwrap();
        for j in 0..16 {
            assert_eq!(y[j], (j as f32 - 8.0) * 2.0);
            assert_eq!(y[j + 16], (7.0 - j as f32) * 2.0);
        }
    }

    #[test]
    fn q5_0_takes_the_fifth_bit_of_element_j_from_bit_j() {
        let mut x = vec![0u8; 22];
        x[0..2].copy_from_slice(&f16_bytes(1.0));
        // High bits set for elements 0 and 16 + 1 (bit 17); every nibble 0.
        x[2..6].copy_from_slice(&(1u32 | 1 << 17).to_le_bytes());
        let mut y = [0.0f32; 32];
        dequantize(GgmlType::Q5_0, &x, &mut y).unwrap();
        assert_eq!(y[0], 0.0, "16 − 16");
        assert_eq!(y[1], -16.0);
        assert_eq!(y[17], 0.0);
        assert_eq!(y[16], -16.0);
    }

    #[test]
    fn the_k_quant_scales_unpack_as_ggml_packs_them() {
        // Sub-blocks 0..4: 6 low bits in bytes 0..4 (scales) and 4..8 (mins); 4..8: low 4 bits in
        // bytes 8..12, top 2 bits in the top bits of bytes 0..8.
        let mut q = [0u8; 12];
        q[0] = 0b11_000101; // scale 0 = 5, top bits of scale 4 = 3
        q[4] = 0b10_000111; // min 0 = 7, top bits of min 4 = 2
        q[8] = 0b1001_0110; // scale 4 low = 6, min 4 low = 9
        assert_eq!(scale_min(0, &q), (5, 7));
        assert_eq!(scale_min(4, &q), (6 | 3 << 4, 9 | 2 << 4));
    }

    /// Random blocks of every type with an integer form rebuild exactly their dequantization.
    #[test]
    fn the_integer_form_of_a_block_rebuilds_its_dequantized_bits() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut byte = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        };
        for ty in INTEGER_TYPES {
            let form = int_groups(ty).unwrap();
            let (elems, bytes) = ty.block();
            for _ in 0..200 {
                let mut x: Vec<u8> = (0..bytes).map(|_| byte()).collect();
                // Keep the f16 scales finite and modest.
                for at in [0usize, 2, bytes - 2] {
                    x[at + 1] &= 0x3B;
                }
                let mut want = vec![0.0f32; elems];
                dequantize(ty, &x, &mut want).unwrap();
                let mut q = vec![0i8; elems];
                let groups = elems / form.group;
                let (mut s, mut m) = (vec![0i32; groups], vec![0i32; groups]);
                let f = split_block(ty, &x, &mut q, &mut s, &mut m);
                for i in 0..elems {
                    let g = i / form.group;
                    let mut v = q[i] as f32 * (f.d * s[g] as f32);
                    if form.offset {
                        v += f.dmin * m[g] as f32;
                    }
                    assert_eq!(v.to_bits(), want[i].to_bits(), "{} element {i}", ty.name());
                }
            }
        }
    }

    #[test]
    fn types_it_cannot_decode_are_named_not_guessed() {
        let mut y = [0.0f32; 256];
        assert_eq!(
            dequantize(GgmlType::Q2_K, &[0u8; 84], &mut y),
            Err(GgmlType::Q2_K)
        );
        assert!(!supports(GgmlType::IQ4_XS));
        assert!(supports(GgmlType::Q6_K));
    }
}
