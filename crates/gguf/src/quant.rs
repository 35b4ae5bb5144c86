//! Quantizing `f32` rows into ggml's block formats (`F32`, `F16`, `BF16`, `Q8_0`, `Q4_K`,
//! `Q6_K` — what Q8_0 and Q4_K_M files hold), and drawing random blocks for synthetic weights.
//! The byte layouts are [`crate::dequant`]'s; scales are chosen by a small search with a
//! least-squares refit per block, in the spirit of ggml's reference quantizers (not their bits).
//! A block of zeros always quantizes to exact zeros. It knows nothing of tensors or models.

use crate::types::{GgmlType, QK_K};

/// The types [`quantize_row`] writes, for error messages.
pub const QUANTIZES: &str = "F32, F16, BF16, Q8_0, Q4_K, Q6_K";

/// Appends the blocks of `ty` for `row` (whole blocks) to `out`. Returns `Err(ty)` for a type
/// this module cannot write.
///
/// # Panics
/// When `row.len()` is not a whole number of `ty`'s blocks (callers size rows from a tensor
/// shape checked by [`GgmlType::row_bytes`]).
pub fn quantize_row(ty: GgmlType, row: &[f32], out: &mut Vec<u8>) -> Result<(), GgmlType> {
    let (elems, _) = ty.block();
    assert!(
        row.len().is_multiple_of(elems),
        "a row of {} elements is not whole {} blocks",
        row.len(),
        ty.name()
    );
    match ty {
        GgmlType::F32 => row.iter().for_each(|v| out.extend(v.to_le_bytes())),
        GgmlType::F16 => row
            .iter()
            .for_each(|&v| out.extend(half::f16::from_f32(v).to_bits().to_le_bytes())),
        GgmlType::BF16 => row
            .iter()
            .for_each(|&v| out.extend(half::bf16::from_f32(v).to_bits().to_le_bytes())),
        GgmlType::Q8_0 => row.chunks_exact(32).for_each(|b| q8_0(b, out)),
        GgmlType::Q4_K => row.chunks_exact(QK_K).for_each(|b| q4_k(b, out)),
        GgmlType::Q6_K => row.chunks_exact(QK_K).for_each(|b| q6_k(b, out)),
        other => return Err(other),
    }
    Ok(())
}

fn f16_bits(v: f32) -> [u8; 2] {
    half::f16::from_f32(v).to_bits().to_le_bytes()
}

/// `v` as stored in f16 and read back.
fn via_f16(v: f32) -> f32 {
    half::f16::from_f32(v).to_f32()
}

fn all_zero(x: &[f32]) -> bool {
    x.iter().all(|&v| v == 0.0)
}

/// `Q8_0`: `d = max|x| / 127`, `q = round(x / d)`.
fn q8_0(x: &[f32], out: &mut Vec<u8>) {
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let d = via_f16(amax / 127.0);
    out.extend(f16_bits(d));
    let id = if d > 0.0 { 1.0 / d } else { 0.0 };
    out.extend(
        x.iter()
            .map(|&v| (v * id).round().clamp(-127.0, 127.0) as i8 as u8),
    );
}

/// The best `(scale, offset)` with `x ≈ scale·q − offset`, `q ∈ 0..=nmax`, `offset ≥ 0`, over a
/// grid of candidate scales each refitted by least squares on its rounding.
fn affine_fit(x: &[f32], nmax: u8) -> (f32, f32) {
    let lo = x.iter().fold(0.0f32, |m, &v| m.min(v));
    let hi = x.iter().fold(f32::MIN, |m, &v| m.max(v));
    if hi <= lo {
        return (0.0, -lo);
    }
    let n = nmax as f32;
    let error = |scale: f32, offset: f32| -> f32 {
        x.iter()
            .map(|&v| {
                let q = ((v + offset) / scale).round().clamp(0.0, n);
                (scale * q - offset - v).powi(2)
            })
            .sum()
    };
    let mut best = ((hi - lo) / n, -lo);
    let mut best_err = error(best.0, best.1);
    for step in 0..=20 {
        let iscale = (n - 1.0 + 0.1 * step as f32) / (hi - lo);
        let q: Vec<f32> = x
            .iter()
            .map(|&v| ((v - lo) * iscale).round().clamp(0.0, n))
            .collect();
        // Least squares of x = s·q + b over this rounding.
        let m = x.len() as f32;
        let (sq, sqq) = (q.iter().sum::<f32>(), q.iter().map(|v| v * v).sum::<f32>());
        let sx: f32 = x.iter().sum();
        let sqx: f32 = q.iter().zip(x).map(|(a, b)| a * b).sum();
        let det = m * sqq - sq * sq;
        if det <= 0.0 {
            continue;
        }
        let mut s = (m * sqx - sq * sx) / det;
        let mut b = (sqq * sx - sq * sqx) / det;
        if b > 0.0 {
            // The offset must not be negative: refit the scale alone with b = 0.
            b = 0.0;
            s = if sqq > 0.0 { sqx / sqq } else { 0.0 };
        }
        if s <= 0.0 {
            continue;
        }
        let err = error(s, -b);
        if err < best_err {
            best = (s, -b);
            best_err = err;
        }
    }
    best
}

/// `Q4_K`: 8 sub-blocks of 32, `x ≈ (d·sc)·q − dmin·m` with 6-bit `sc`, `m` and 4-bit `q`.
fn q4_k(x: &[f32], out: &mut Vec<u8>) {
    if all_zero(x) {
        out.extend([0u8; 144]);
        return;
    }
    let fits: Vec<(f32, f32)> = x.chunks_exact(32).map(|s| affine_fit(s, 15)).collect();
    let max_scale = fits.iter().fold(0.0f32, |m, f| m.max(f.0));
    let max_min = fits.iter().fold(0.0f32, |m, f| m.max(f.1));
    let d = via_f16(max_scale / 63.0);
    let dmin = via_f16(max_min / 63.0);
    let six = |v: f32, unit: f32| -> u8 {
        if unit > 0.0 {
            (v / unit).round().clamp(0.0, 63.0) as u8
        } else {
            0
        }
    };
    let sc: Vec<u8> = fits.iter().map(|f| six(f.0, d)).collect();
    let mn: Vec<u8> = fits.iter().map(|f| six(f.1, dmin)).collect();
    out.extend(f16_bits(d));
    out.extend(f16_bits(dmin));
    let mut scales = [0u8; 12];
    for j in 0..4 {
        scales[j] = sc[j] | ((sc[j + 4] >> 4) << 6);
        scales[j + 4] = mn[j] | ((mn[j + 4] >> 4) << 6);
        scales[j + 8] = (sc[j + 4] & 0x0F) | ((mn[j + 4] & 0x0F) << 4);
    }
    out.extend(scales);
    let q: Vec<u8> = x
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            let j = i / 32;
            let (step, offset) = (d * sc[j] as f32, dmin * mn[j] as f32);
            if step > 0.0 {
                ((v + offset) / step).round().clamp(0.0, 15.0) as u8
            } else {
                0
            }
        })
        .collect();
    for chunk in 0..4 {
        for l in 0..32 {
            out.push(q[64 * chunk + l] | (q[64 * chunk + 32 + l] << 4));
        }
    }
}

/// The best scale `s` with `x ≈ s·q`, `q ∈ -32..=31`: the value of largest magnitude mapped to
/// −32, then a least-squares refit of the scale on that rounding when it lowers the error.
fn symmetric_fit(x: &[f32]) -> f32 {
    let peak = x
        .iter()
        .fold(0.0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
    if peak == 0.0 {
        return 0.0;
    }
    let error = |s: f32| -> f32 {
        x.iter()
            .map(|&v| (s * (v / s).round().clamp(-32.0, 31.0) - v).powi(2))
            .sum()
    };
    let s0 = peak / -32.0;
    let q: Vec<f32> = x
        .iter()
        .map(|&v| (v / s0).round().clamp(-32.0, 31.0))
        .collect();
    let qq: f32 = q.iter().map(|v| v * v).sum();
    let s1 = q.iter().zip(x).map(|(a, b)| a * b).sum::<f32>() / qq;
    if s1 != 0.0 && s1.is_finite() && error(s1) < error(s0) {
        s1
    } else {
        s0
    }
}

/// `Q6_K`: 16 sub-blocks of 16, `x ≈ (d·sc)·(q − 32)` with 8-bit signed `sc` and 6-bit `q`.
fn q6_k(x: &[f32], out: &mut Vec<u8>) {
    if all_zero(x) {
        out.extend([0u8; 210]);
        return;
    }
    let scales: Vec<f32> = x.chunks_exact(16).map(symmetric_fit).collect();
    let peak = scales
        .iter()
        .fold(0.0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
    let d = via_f16(peak / -128.0);
    let sc: Vec<i8> = scales
        .iter()
        .map(|&s| {
            if d != 0.0 {
                (s / d).round().clamp(-128.0, 127.0) as i8
            } else {
                0
            }
        })
        .collect();
    let q: Vec<u8> = x
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            let step = d * sc[i / 16] as f32;
            let l = if step != 0.0 {
                (v / step).round().clamp(-32.0, 31.0)
            } else {
                0.0
            };
            (l as i32 + 32) as u8
        })
        .collect();
    let mut ql = [0u8; 128];
    let mut qh = [0u8; 64];
    for half in 0..2 {
        let (q, ql, qh) = (&q[128 * half..], &mut ql[64 * half..], &mut qh[32 * half..]);
        for l in 0..32 {
            let (q1, q2, q3, q4) = (q[l], q[l + 32], q[l + 64], q[l + 96]);
            ql[l] = (q1 & 0x0F) | ((q3 & 0x0F) << 4);
            ql[l + 32] = (q2 & 0x0F) | ((q4 & 0x0F) << 4);
            qh[l] = (q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6);
        }
    }
    out.extend(ql);
    out.extend(qh);
    out.extend(sc.iter().map(|&s| s as u8));
    out.extend(f16_bits(d));
}

/// The type llama.cpp's `Q4_K_M` gives tensor `name` (GGUF names: `output.weight`,
/// `blk.N.attn_v.weight`, …) of a model with `layers` blocks (llama-quant.cpp's rules for this
/// file type): `Q6_K` for the output matrix and for `attn_v` and `ffn_down` (dense or expert
/// stack) on the layers `use_more_bits` picks (the first and last eighth, and every third
/// between), `Q4_K` for every other matrix. Norms and routers are not quantized; callers keep
/// them `F32`.
pub fn q4_k_m_type(name: &str, layers: usize) -> GgmlType {
    if name == "output.weight" {
        return GgmlType::Q6_K;
    }
    let layer = name
        .strip_prefix("blk.")
        .and_then(|rest| rest.split_once('.'))
        .and_then(|(i, suffix)| Some((i.parse::<usize>().ok()?, suffix)));
    let more_bits = |i: usize| i < layers / 8 || i >= 7 * layers / 8 || (i - layers / 8) % 3 == 2;
    match layer {
        Some((i, "attn_v.weight" | "ffn_down.weight" | "ffn_down_exps.weight")) if more_bits(i) => {
            GgmlType::Q6_K
        }
        _ => GgmlType::Q4_K,
    }
}

/// xorshift64*: the seeded generator of [`random_block`].
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed` (0 is replaced by a fixed non-zero state).
    pub fn new(seed: u64) -> Rng {
        Rng(if seed == 0 {
            0x9E37_79B9_7F4A_7C15
        } else {
            seed
        })
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }
    /// Approximately standard normal (sum of 4 uniforms).
    pub fn normal(&mut self) -> f32 {
        ((0..4).map(|_| self.unit()).sum::<f32>() - 2.0) * 1.732
    }
    fn fill(&mut self, bytes: &mut [u8]) {
        for chunk in bytes.chunks_mut(8) {
            let r = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&r[..chunk.len()]);
        }
    }
}

/// Appends one random block of `ty` whose weights have standard deviation about `std`, drawn
/// directly in the block format (random integers, fixed scales): synthetic weights of full-size
/// shapes without the cost of quantizing. `F32`, `Q8_0`, `Q4_K` and `Q6_K`; `Err(ty)` otherwise.
pub fn random_block(
    ty: GgmlType,
    std: f32,
    rng: &mut Rng,
    out: &mut Vec<u8>,
) -> Result<(), GgmlType> {
    let start = out.len();
    match ty {
        GgmlType::F32 => {
            out.extend((std * rng.normal()).to_le_bytes());
            return Ok(());
        }
        GgmlType::Q8_0 | GgmlType::Q4_K | GgmlType::Q6_K => {}
        other => return Err(other),
    }
    out.resize(start + ty.block().1, 0);
    let b = &mut out[start..];
    rng.fill(b);
    match ty {
        GgmlType::Q8_0 => b[0..2].copy_from_slice(&f16_bits(std / 73.0)), // int8 uniform: std 73.6
        GgmlType::Q4_K => {
            // w = d·sc·q − dmin·m, q uniform 0..15 (std 4.6), 6-bit sc around 32.
            b[0..2].copy_from_slice(&f16_bits(std / (4.6 * 32.0)));
            b[2..4].copy_from_slice(&f16_bits(std / (4.6 * 32.0) * 7.5));
            // Every sub-block's 6-bit scale and min 32 (bytes 0–7: low 6 bits 32, top bits 0b10
            // for sub-blocks 4–7; bytes 8–11: their low 4 bits 0), so the weights are centred.
            b[4..12].fill(0xA0);
            b[12..16].fill(0);
        }
        _ => {
            b[208..210].copy_from_slice(&f16_bits(std / (18.5 * 32.0))); // q − 32 uniform: std 18.5
            b[192..208].fill(32);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dequant::dequantize;

    fn round_trip(ty: GgmlType, x: &[f32]) -> Vec<f32> {
        let mut bytes = Vec::new();
        quantize_row(ty, x, &mut bytes).unwrap();
        assert_eq!(bytes.len() as u64, ty.row_bytes(x.len() as u64).unwrap());
        let mut y = vec![0.0f32; x.len()];
        dequantize(ty, &bytes, &mut y).unwrap();
        y
    }

    fn weights(n: usize, seed: u64) -> Vec<f32> {
        let mut rng = Rng::new(seed);
        // Rows with a few large entries, as trained weights have.
        (0..n)
            .map(|i| rng.normal() * 0.02 * if i % 37 == 0 { 4.0 } else { 1.0 })
            .collect()
    }

    /// Root mean square of `y − x` relative to that of `x`.
    fn relative_rms(x: &[f32], y: &[f32]) -> f64 {
        let e: f64 = x.iter().zip(y).map(|(a, b)| ((a - b) as f64).powi(2)).sum();
        let s: f64 = x.iter().map(|a| (*a as f64).powi(2)).sum();
        (e / s).sqrt()
    }

    #[test]
    fn each_type_round_trips_within_its_precision() {
        let x = weights(4 * QK_K, 7);
        // 8-bit ≈ 0.4%, 6-bit ≈ 2%, 4-bit (with an offset) ≈ 8% of the weights' rms.
        for (ty, bound) in [
            (GgmlType::Q8_0, 0.01),
            (GgmlType::Q6_K, 0.03),
            (GgmlType::Q4_K, 0.10),
            (GgmlType::BF16, 0.004),
            (GgmlType::F16, 0.001),
        ] {
            let e = relative_rms(&x, &round_trip(ty, &x));
            assert!(e < bound, "{}: relative rms error {e}", ty.name());
            assert!(e > 0.0, "{}: no rounding at all is suspicious", ty.name());
        }
        assert_eq!(round_trip(GgmlType::F32, &x), x);
    }

    #[test]
    fn the_search_beats_plain_max_scaling_for_q4_k() {
        // Plain max scaling: sc = (max − min)/15 per sub-block, without the search.
        let x = weights(8 * QK_K, 11);
        let searched = relative_rms(&x, &round_trip(GgmlType::Q4_K, &x));
        let plain: Vec<f32> = x
            .chunks_exact(32)
            .flat_map(|s| {
                let lo = s.iter().fold(0.0f32, |m, &v| m.min(v));
                let hi = s.iter().fold(f32::MIN, |m, &v| m.max(v));
                let step = (hi - lo) / 15.0;
                s.iter()
                    .map(move |&v| ((v - lo) / step).round() * step + lo)
                    .collect::<Vec<_>>()
            })
            .collect();
        assert!(searched < relative_rms(&x, &plain), "{searched}");
    }

    #[test]
    fn zero_blocks_stay_exact_zeros_and_zero_sub_blocks_too() {
        for ty in [GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K] {
            assert!(round_trip(ty, &[0.0; 2 * QK_K]).iter().all(|&v| v == 0.0));
            // Real values in the first 40 elements only (a zero-padded row): every element from
            // the first all-zero sub-block on decodes to exactly zero.
            let mut x = vec![0.0f32; QK_K];
            x[..40].copy_from_slice(&weights(40, 3));
            let y = round_trip(ty, &x);
            assert!(y[64..].iter().all(|&v| v == 0.0), "{}", ty.name());
            assert!(y[..40].iter().any(|&v| v != 0.0), "{}", ty.name());
        }
    }

    #[test]
    fn extreme_values_keep_their_sign_and_size() {
        let mut x = vec![0.001f32; QK_K];
        x[5] = -3.0;
        x[200] = 2.5;
        for ty in [GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K] {
            let y = round_trip(ty, &x);
            assert!((y[5] + 3.0).abs() < 0.05, "{}: {}", ty.name(), y[5]);
            assert!((y[200] - 2.5).abs() < 0.2, "{}: {}", ty.name(), y[200]);
        }
    }

    #[test]
    fn types_it_cannot_write_are_named_not_guessed() {
        let mut out = Vec::new();
        assert_eq!(
            quantize_row(GgmlType::Q5_K, &[0.0; QK_K], &mut out),
            Err(GgmlType::Q5_K)
        );
        assert!(out.is_empty());
    }

    #[test]
    fn q4_k_m_gives_six_bits_to_the_output_and_to_v_and_down_on_use_more_bits_layers() {
        // 48 layers: the first 6, the last 6, and 6 + 2, 6 + 5, … between.
        let v = |i: usize| q4_k_m_type(&format!("blk.{i}.attn_v.weight"), 48);
        let six: Vec<usize> = (0..48).filter(|&i| v(i) == GgmlType::Q6_K).collect();
        assert_eq!(
            six,
            [
                0, 1, 2, 3, 4, 5, 8, 11, 14, 17, 20, 23, 26, 29, 32, 35, 38, 41, 42, 43, 44, 45,
                46, 47
            ]
        );
        assert_eq!(
            q4_k_m_type("blk.8.ffn_down_exps.weight", 48),
            GgmlType::Q6_K
        );
        assert_eq!(q4_k_m_type("blk.8.ffn_up_exps.weight", 48), GgmlType::Q4_K);
        assert_eq!(q4_k_m_type("blk.9.attn_v.weight", 48), GgmlType::Q4_K);
        assert_eq!(q4_k_m_type("output.weight", 48), GgmlType::Q6_K);
        assert_eq!(q4_k_m_type("token_embd.weight", 48), GgmlType::Q4_K);
    }

    #[test]
    fn random_blocks_have_the_asked_spread_and_are_seeded() {
        for ty in [GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K] {
            let draw = |seed| {
                let mut rng = Rng::new(seed);
                let mut bytes = Vec::new();
                for _ in 0..64 {
                    random_block(ty, 0.002, &mut rng, &mut bytes).unwrap();
                }
                bytes
            };
            let bytes = draw(5);
            assert_eq!(bytes, draw(5));
            assert_ne!(bytes, draw(6));
            let n = 64 * ty.block().0;
            let mut y = vec![0.0f32; n];
            dequantize(ty, &bytes, &mut y).unwrap();
            let mean = y.iter().map(|&v| v as f64).sum::<f64>() / n as f64;
            let std = (y.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n as f64).sqrt();
            assert!((std - 0.002).abs() < 0.0006, "{}: std {std}", ty.name());
            assert!(mean.abs() < 0.0005, "{}: mean {mean}", ty.name());
        }
    }
}
