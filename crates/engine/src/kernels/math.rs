//! Elementwise and reducing helpers with fixed bits on every instruction set: a vectorisable
//! `exp` built only from correctly rounded operations (fused multiply-add, add, multiply,
//! integer exponent arithmetic), a sum in row order (lane `i mod 16`, pairwise lanes), and the
//! attention softmax built from them. Each result depends only on its own inputs and their
//! order, never on how much else is computed alongside.

// Index loops over fixed-size register blocks read (and vectorise) best as written.
#![allow(clippy::needless_range_loop)]

use super::simd::{self, tree, F32x16, LANES};
use super::Isa;

/// `e^x` with Cephes' `expf` reduction and polynomial, evaluated with fused multiply-adds
/// (within 2 ulp of the exact value); 0 below −87.3 (where `e^x` leaves the normal range) and
/// capped at `e^88`. Written with selects and bit operations only, so loops over it vectorise.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // 1.5 · 2^23: adding it rounds to the nearest integer (held in the low mantissa bits),
    // subtracting it is exact.
    const ROUND: f32 = 12_582_912.0;
    let xc = x.clamp(-87.3, 88.0);
    let t = xc.mul_add(LOG2E, ROUND);
    let n = t - ROUND;
    let r = n.mul_add(-LN2_HI, xc);
    let r = n.mul_add(-LN2_LO, r);
    let z = r * r;
    let mut p = 1.987_569_1e-4f32;
    p = p.mul_add(r, 1.398_199_9e-3);
    p = p.mul_add(r, 8.333_452e-3);
    p = p.mul_add(r, 4.166_579_6e-2);
    p = p.mul_add(r, 1.666_666_5e-1);
    p = p.mul_add(r, 0.5);
    let y = p.mul_add(z, r) + 1.0;
    // 2^n from the integer in `t`'s mantissa (n ∈ [−126, 127]).
    let ni = t.to_bits().wrapping_sub(ROUND.to_bits());
    let scale = f32::from_bits(ni.wrapping_add(127) << 23);
    if x < -87.3 {
        0.0
    } else {
        y * scale
    }
}

/// Softmax of `scale · x` in place: `m = max`, `e_i = exp(scale·x_i − m)`, `Σ` in row order,
/// `p_i = e_i / Σ`. The order of `x` is the only order that matters (the max is exact in any
/// order).
///
/// # Safety
/// `V`'s instruction set is available.
#[inline(always)]
unsafe fn softmax_body<V: F32x16>(x: &mut [f32], scale: f32) {
    // SAFETY (whole body): whole chunks of 16 are read and written in place.
    unsafe {
        let s = V::splat(scale);
        let mut most = V::splat(f32::NEG_INFINITY);
        let mut chunks = x.chunks_exact_mut(LANES);
        for c in &mut chunks {
            let v = V::mul(V::load(c.as_ptr()), s);
            v.store(c.as_mut_ptr());
            most = V::max(v, most);
        }
        let mut m = simd::lanes(most)
            .iter()
            .fold(f32::NEG_INFINITY, |a, &b| if b > a { b } else { a });
        for v in chunks.into_remainder() {
            *v *= scale;
            m = if *v > m { *v } else { m };
        }
        let mut chunks = x.chunks_exact_mut(LANES);
        for c in &mut chunks {
            let c: &mut [f32; LANES] = c.try_into().expect("a whole chunk");
            for l in 0..LANES {
                c[l] = exp(c[l] - m);
            }
        }
        for v in chunks.into_remainder() {
            *v = exp(*v - m);
        }
        let mut acc = [0.0f32; LANES];
        let mut chunks = x.chunks_exact(LANES);
        for c in &mut chunks {
            for l in 0..LANES {
                acc[l] += c[l];
            }
        }
        for (l, &v) in chunks.remainder().iter().enumerate() {
            acc[l] += v;
        }
        let sum = tree(&acc);
        for v in x.iter_mut() {
            *v /= sum;
        }
    }
}

/// The `k` largest values, descending, ties to the lower index (what a stable sort by
/// descending value gives), as (index, value); one pass, no sort of the whole row.
pub fn top_k(values: &[f32], k: usize) -> Vec<(u32, f32)> {
    let mut top: Vec<(u32, f32)> = Vec::with_capacity(k + 1);
    if k == 0 {
        return top;
    }
    for (id, &v) in values.iter().enumerate() {
        if top.len() == k && top[k - 1].1.total_cmp(&v).is_ge() {
            continue;
        }
        // After every kept entry that is ≥ v (lower indices win ties).
        let at = top.partition_point(|&(_, q)| q.total_cmp(&v).is_ge());
        top.insert(at, (id as u32, v));
        top.truncate(k);
    }
    top
}

macro_rules! isa_variant {
    ($m:ident, $v:ty, $($feat:literal)?) => {
        mod $m {
            $(#[target_feature(enable = $feat)])?
            pub(super) unsafe fn softmax(x: &mut [f32], scale: f32) {
                unsafe { super::softmax_body::<$v>(x, scale) }
            }
            $(#[target_feature(enable = $feat)])?
            pub(super) unsafe fn exp_slice(x: &mut [f32]) {
                for v in x.iter_mut() {
                    *v = super::exp(*v);
                }
            }
        }
    };
}

per_isa!(isa_variant);

/// The attention softmax of `scale · x`, in place (see `softmax_body`), compiled for `isa`.
pub fn softmax_scaled_with(isa: Isa, x: &mut [f32], scale: f32) {
    assert!(isa.supported(), "{isa:?} not available");
    // SAFETY: the instruction set was checked above.
    unsafe { dispatch!(isa, softmax(x, scale)) }
}

/// [`softmax_scaled_with`] on the detected instruction set.
pub fn softmax_scaled(x: &mut [f32], scale: f32) {
    softmax_scaled_with(Isa::detected(), x, scale);
}

/// `x_i ← exp(x_i)` ([`exp`]), compiled for `isa`.
pub fn exp_in_place_with(isa: Isa, x: &mut [f32]) {
    assert!(isa.supported(), "{isa:?} not available");
    // SAFETY: the instruction set was checked above.
    unsafe { dispatch!(isa, exp_slice(x)) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::tests::{bits, lcg};

    #[test]
    fn top_k_matches_a_stable_sort_by_descending_value() {
        let mut s = 32;
        for n in [1usize, 5, 64, 2048] {
            // Few distinct values, so ties are common.
            let v: Vec<f32> = (0..n).map(|_| (lcg(&mut s) * 8.0).round()).collect();
            let mut ids: Vec<usize> = (0..n).collect();
            ids.sort_by(|&a, &b| v[b].total_cmp(&v[a]).then(a.cmp(&b)));
            for k in [0usize, 1, 2, 4, 8] {
                let want: Vec<(u32, f32)> = ids.iter().take(k).map(|&i| (i as u32, v[i])).collect();
                assert_eq!(top_k(&v, k), want, "n={n} k={k}");
            }
        }
    }

    #[test]
    fn exp_is_within_two_ulp_of_the_exact_value() {
        let mut x = -87.0f32;
        while x < 88.0 {
            let got = exp(x) as f64;
            let want = (x as f64).exp();
            let ulp = f32::EPSILON as f64 * want;
            assert!((got - want).abs() <= 2.0 * ulp, "x={x}: {got} vs {want}");
            x += 0.0137;
        }
        assert_eq!(exp(-100.0), 0.0);
        assert_eq!(exp(0.0), 1.0);
        assert!(exp(100.0).is_finite());
    }

    #[test]
    fn exp_and_softmax_give_the_same_bits_on_every_instruction_set() {
        let mut s = 31;
        for n in [1usize, 15, 16, 17, 100, 1001] {
            let x: Vec<f32> = (0..n).map(|_| 40.0 * lcg(&mut s)).collect();
            let mut want = x.clone();
            exp_in_place_with(Isa::Portable, &mut want);
            let mut soft_want = x.clone();
            softmax_scaled_with(Isa::Portable, &mut soft_want, 0.125);
            for isa in Isa::available() {
                let mut got = x.clone();
                exp_in_place_with(isa, &mut got);
                assert_eq!(bits(&got), bits(&want), "{isa:?} exp n={n}");
                let mut soft = x.clone();
                softmax_scaled_with(isa, &mut soft, 0.125);
                assert_eq!(bits(&soft), bits(&soft_want), "{isa:?} softmax n={n}");
            }
            let total: f32 = soft_want.iter().sum();
            assert!((total - 1.0).abs() < 1e-5, "n={n}: Σ = {total}");
        }
    }
}
