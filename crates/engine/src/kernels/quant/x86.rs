//! What the x86 kernels of [`super`] share: an exact f16 load, the Q4_K/Q5_K scale unpacking,
//! and the several-row machinery: row groups of up to [`LANES`](super::LANES), exact transposing lane sums, the
//! float steps on a vector of the rows' accumulators.

use std::arch::x86_64::*;

/// The f16 at `p`, widened exactly (F16C).
///
/// # Safety
/// Two readable bytes at `p`; the CPU has F16C.
#[inline]
#[target_feature(enable = "f16c")]
pub(super) unsafe fn half(p: *const u8) -> f32 {
    // SAFETY: the caller's contract.
    let bits = unsafe { std::ptr::read_unaligned(p as *const u16) };
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
}

/// The 6-bit scales (bytes 0–7) and mins (bytes 8–15) of the eight groups of a Q4_K/Q5_K
/// block from its 12 packed bytes at `p` (ggml's `get_scale_min_k4`, all groups at once).
///
/// # Safety
/// 12 readable bytes at `p`.
#[inline(always)]
pub(super) unsafe fn k4_scales(p: *const u8) -> [u8; 16] {
    // SAFETY: the caller's contract.
    let u = unsafe {
        [
            std::ptr::read_unaligned(p as *const u32),
            std::ptr::read_unaligned(p.add(4) as *const u32),
            std::ptr::read_unaligned(p.add(8) as *const u32),
        ]
    };
    let (k1, k2, k3) = (0x3f3f_3f3fu32, 0x0f0f_0f0fu32, 0x0303_0303u32);
    let words = [
        u[0] & k1,
        (u[2] & k2) | (((u[0] >> 6) & k3) << 4),
        u[1] & k1,
        ((u[2] >> 4) & k2) | (((u[1] >> 6) & k3) << 4),
    ];
    let mut out = [0u8; 16];
    for (o, w) in out.chunks_exact_mut(4).zip(words) {
        o.copy_from_slice(&w.to_le_bytes());
    }
    out
}

/// [`k4_scales`] as one register, computed in its four 32-bit lanes with the same word
/// operations (so the same bytes), without the scalar round trip through memory: lanes 0 and
/// 2 are words 0 and 1 masked to 6 bits, lanes 1 and 3 the low and high nibbles of word 2
/// under the top 2 bits of words 0 and 1.
///
/// # Safety
/// 16 readable bytes at `p` (the 12 packed bytes and 4 more, unused); the CPU has AVX2.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn k4_scales_reg(p: *const u8) -> __m128i {
    // SAFETY: the caller's contract.
    let x = unsafe { _mm_loadu_si128(p as *const __m128i) };
    let (k1, k2, k3) = (
        _mm_set1_epi32(0x3f3f_3f3f),
        _mm_set1_epi32(0x0f0f_0f0f),
        _mm_set1_epi32(0x0303_0303),
    );
    let words01 = _mm_shuffle_epi32::<0b01_01_00_00>(x); // u0, u0, u1, u1
    let word2 = _mm_shuffle_epi32::<0b10_10_10_10>(x); // u2 in every lane
    let low = _mm_and_si128(words01, k1);
    let nibbles = _mm_and_si128(_mm_srlv_epi32(word2, _mm_setr_epi32(0, 0, 0, 4)), k2);
    let tops = _mm_slli_epi32::<4>(_mm_and_si128(_mm_srli_epi32::<6>(words01), k3));
    _mm_blend_epi32::<0b1010>(low, _mm_or_si128(nibbles, tops))
}

/// The sum of the 8 lanes (exact).
#[inline]
#[target_feature(enable = "avx2")]
fn hsum(v: __m256i) -> i32 {
    let x = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let x = _mm_add_epi32(x, _mm_shuffle_epi32::<0b01_00_11_10>(x));
    let x = _mm_add_epi32(x, _mm_shuffle_epi32::<0b10_11_00_01>(x));
    _mm_cvtsi128_si32(x)
}

/// The lane sums of `v[0]`, …, `v[N − 1]` as lanes `0..N` of one vector, zeros above (exact
/// integer adds: one reduction for 1 vector, a transposing tree of `vphaddd` for up to 4 or 8).
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn hsum_rows<const N: usize>(v: &[__m256i; N]) -> __m256i {
    let zero = _mm256_setzero_si256();
    let at = |i: usize| if i < N { v[i] } else { zero };
    if N == 1 {
        return _mm256_castsi128_si256(_mm_cvtsi32_si128(hsum(v[0])));
    }
    // Each hadd sums adjacent lanes of two vectors within each 128-bit half; after two levels
    // lane i < 4 holds vector i's low half summed and lane 4 + i its high half.
    let a0 = _mm256_hadd_epi32(at(0), at(1));
    let a1 = _mm256_hadd_epi32(at(2), at(3));
    let b0 = _mm256_hadd_epi32(a0, a1);
    if N <= 4 {
        let x = _mm_add_epi32(
            _mm256_castsi256_si128(b0),
            _mm256_extracti128_si256::<1>(b0),
        );
        return _mm256_castsi128_si256(x);
    }
    let a2 = _mm256_hadd_epi32(at(4), at(5));
    let a3 = _mm256_hadd_epi32(at(6), at(7));
    let b1 = _mm256_hadd_epi32(a2, a3);
    _mm256_add_epi32(
        _mm256_permute2x128_si256::<0x20>(b0, b1),
        _mm256_permute2x128_si256::<0x31>(b0, b1),
    )
}

/// One float step of the module docs for [`LANES`](super::LANES) rows' accumulators `acc`:
/// `acc = fma(d · da, f32(s), acc)` lane by lane, `da` the rows' activation scales.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) fn fma_rows(acc: __m256, d: f32, da: __m256, s: __m256i) -> __m256 {
    _mm256_fmadd_ps(
        _mm256_mul_ps(_mm256_set1_ps(d), da),
        _mm256_cvtepi32_ps(s),
        acc,
    )
}

/// Runs `$kernel::<N>($args…)` for each group of up to [`LANES`](super::LANES) rows of `$acts`, `N` the
/// group's row count, the group's first row passed last.
macro_rules! by_row_groups {
    ($kernel:ident <$($g:ident),*>, $acts:expr; $($arg:expr),*) => {{
        let rows = $acts.rows;
        for r0 in (0..rows).step_by($crate::kernels::quant::LANES) {
            match rows - r0 {
                1 => $kernel::<$($g,)* 1>($($arg,)* r0),
                2 => $kernel::<$($g,)* 2>($($arg,)* r0),
                3 => $kernel::<$($g,)* 3>($($arg,)* r0),
                4 => $kernel::<$($g,)* 4>($($arg,)* r0),
                5 => $kernel::<$($g,)* 5>($($arg,)* r0),
                6 => $kernel::<$($g,)* 6>($($arg,)* r0),
                7 => $kernel::<$($g,)* 7>($($arg,)* r0),
                _ => $kernel::<$($g,)* 8>($($arg,)* r0),
            }
        }
    }};
}
pub(super) use by_row_groups;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::tests::lcg;

    #[test]
    fn the_register_scale_unpacking_gives_the_scalar_bytes() {
        if !is_x86_feature_detected!("avx2") {
            return;
        }
        let mut state = 7u64;
        for _ in 0..4096 {
            let packed: [u8; 16] = std::array::from_fn(|_| ((lcg(&mut state) + 0.5) * 256.0) as u8);
            // SAFETY: 16 bytes; AVX2 checked above.
            let (want, got) = unsafe {
                let mut got = [0u8; 16];
                let reg = k4_scales_reg(packed.as_ptr());
                _mm_storeu_si128(got.as_mut_ptr() as *mut __m128i, reg);
                (k4_scales(packed.as_ptr()), got)
            };
            assert_eq!(got, want, "packed {packed:?}");
        }
    }
}
