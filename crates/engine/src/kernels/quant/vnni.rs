//! The AVX-512 VNNI kernels of [`super`] (x86-64): weights decoded to unsigned bytes in registers,
//! `vpdpbusd` (unsigned × signed bytes, four products per 32-bit lane) against the activation
//! bytes, integer scales applied per lane, the lanes summed (exactly), then the float steps of the
//! module docs.

use super::x86::{half, k4_scales};
use super::QuantActs;
use std::arch::x86_64::*;

/// One activation row's 256-element block at `at` against a k-quant block decoded to 4
/// registers of unsigned bytes (64 elements each, a 32-bit scale per lane of 4): the scaled
/// dot products, and the block's 16 activation sums times `per_sum`, each as 16 lanes to be
/// summed.
///
/// # Safety
/// The CPU has AVX-512 F/BW and VNNI; `at` is a block start inside `acts`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn k_row(
    w: &[__m512i; 4],
    scale: &[__m512i; 4],
    acts: &QuantActs,
    at: usize,
    per_sum: __m512i,
) -> (__m512i, __m512i) {
    // SAFETY: the caller's contract.
    unsafe {
        let a = acts.q.as_ptr().add(at);
        let mut sum = _mm512_setzero_si512();
        for t in 0..4 {
            let av = _mm512_loadu_si512(a.add(64 * t) as *const __m512i);
            let dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[t], av);
            sum = _mm512_add_epi32(sum, _mm512_mullo_epi32(dot, scale[t]));
        }
        let sums = _mm512_loadu_si512(acts.sum16.as_ptr().add(at / 16) as *const __m512i);
        (sum, _mm512_mullo_epi32(sums, per_sum))
    }
}

/// `Q4_K` blocks (144 bytes: d, dmin, 12 bytes of 6-bit scales and mins, 128 bytes of
/// nibbles; 8 groups of 32).
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL, VNNI and F16C; `row` is whole `Q4_K` blocks, `acts`
/// quantized for `Q4_K` with as many blocks per row, `acc` at least one per activation row.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")]
pub(super) unsafe fn q4_k(row: &[u8], acts: &QuantActs, acc: &mut [f32]) {
    let acc = &mut acc[..acts.rows];
    let mask = _mm256_set1_epi8(0x0F);
    // Byte patterns picking, for register t, group 2t's scale for lanes 0–7 and group
    // 2t + 1's for lanes 8–15; and each group's min for both of its sums of 16.
    let pick: [__m128i; 4] = std::array::from_fn(|t| {
        let (a, b) = (2 * t as i8, 2 * t as i8 + 1);
        _mm_setr_epi8(a, a, a, a, a, a, a, a, b, b, b, b, b, b, b, b)
    });
    let pick_min = _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15);
    let blocks = row.len() / 144;
    let stride = acts.k / 256;
    for b in 0..blocks {
        // SAFETY (whole loop body): every access stays inside block `b` of `row` and block
        // `b` of each activation row (the caller's contract).
        unsafe {
            let blk = row.as_ptr().add(144 * b);
            let (d, dmin) = (half(blk), -half(blk.add(2)));
            let sc = k4_scales(blk.add(4));
            let packed = _mm_loadu_si128(sc.as_ptr() as *const __m128i);
            let mut w = [_mm512_setzero_si512(); 4];
            let mut scale = [_mm512_setzero_si512(); 4];
            for t in 0..4 {
                let raw = _mm256_loadu_si256(blk.add(16 + 32 * t) as *const __m256i);
                let lo = _mm256_and_si256(raw, mask);
                let hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), mask);
                w[t] = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
                scale[t] = _mm512_cvtepu8_epi32(_mm_shuffle_epi8(packed, pick[t]));
            }
            let mins = _mm512_cvtepu8_epi32(_mm_shuffle_epi8(packed, pick_min));
            let lanes = |r: usize| k_row(&w, &scale, acts, r * acts.k + 256 * b, mins);
            let da = |r: usize| *acts.d.get_unchecked(r * stride + b);
            finish_rows(acc, d, Some(dmin), da, lanes);
        }
    }
}

/// `Q6_K` blocks (210 bytes: 128 bytes of low nibbles, 64 of high 2-bit pairs, 16 signed
/// scales, d; 16 groups of 16; values stored +32).
///
/// # Safety
/// As [`q4_k`], for `Q6_K`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")]
pub(super) unsafe fn q6_k(row: &[u8], acts: &QuantActs, acc: &mut [f32]) {
    let acc = &mut acc[..acts.rows];
    let (m4, m3) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(3));
    let pick: [__m128i; 4] = std::array::from_fn(|t| {
        let g = |j: i8| 4 * t as i8 + j;
        _mm_setr_epi8(
            g(0),
            g(0),
            g(0),
            g(0),
            g(1),
            g(1),
            g(1),
            g(1),
            g(2),
            g(2),
            g(2),
            g(2),
            g(3),
            g(3),
            g(3),
            g(3),
        )
    });
    let stride = acts.k / 256;
    for (b, blk) in row.chunks_exact(210).enumerate() {
        // SAFETY: two bytes inside the block; F16C is enabled.
        let d = unsafe { half(blk.as_ptr().add(208)) };
        // SAFETY (whole body): every access stays inside block `b` of `row` and block `b`
        // of each activation row (the caller's contract).
        unsafe {
            let p = blk.as_ptr();
            let mut w = [_mm512_setzero_si512(); 4];
            for half in 0..2 {
                let ql0 = _mm256_loadu_si256(p.add(64 * half) as *const __m256i);
                let ql1 = _mm256_loadu_si256(p.add(64 * half + 32) as *const __m256i);
                let qh = _mm256_loadu_si256(p.add(128 + 32 * half) as *const __m256i);
                let high = |h: __m256i| _mm256_slli_epi16(_mm256_and_si256(h, m3), 4);
                let v0 = _mm256_or_si256(_mm256_and_si256(ql0, m4), high(qh));
                let v1 = _mm256_or_si256(_mm256_and_si256(ql1, m4), high(_mm256_srli_epi16(qh, 2)));
                let v2 = _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                    high(_mm256_srli_epi16(qh, 4)),
                );
                let v3 = _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                    high(_mm256_srli_epi16(qh, 6)),
                );
                w[2 * half] = _mm512_inserti64x4(_mm512_castsi256_si512(v0), v1, 1);
                w[2 * half + 1] = _mm512_inserti64x4(_mm512_castsi256_si512(v2), v3, 1);
            }
            // Lane j of register t covers elements 64t + 4j .. +4: group 4t + j/4.
            let sc = _mm_loadu_si128(p.add(192) as *const __m128i);
            let scale: [__m512i; 4] =
                std::array::from_fn(|t| _mm512_cvtepi8_epi32(_mm_shuffle_epi8(sc, pick[t])));
            // The stored values are q + 32: 32 · sc[g] · (Σ a over group g) comes back out.
            let bias = _mm512_slli_epi32(_mm512_cvtepi8_epi32(sc), 5);
            let lanes = |r: usize| {
                let (sum, off) = k_row(&w, &scale, acts, r * acts.k + 256 * b, bias);
                (_mm512_sub_epi32(sum, off), _mm512_setzero_si512())
            };
            let da = |r: usize| *acts.d.get_unchecked(r * stride + b);
            finish_rows(acc, d, None, da, lanes);
        }
    }
}

/// Adds one block's contribution to every row's accumulator in `acc`, in the module docs'
/// order: `lanes(r)` gives row `r`'s two integer vectors whose lane sums are `S1` and `S2`,
/// `da(r)` its activation scale; `dmin` is `None` for types without mins. (Summing the lanes
/// of 16 rows at once with a transposing tree of adds was measured slower than one
/// reduction per row.)
///
/// # Safety
/// The CPU has AVX-512 F; `lanes` and `da` are safe to call for every row of `acc`.
#[inline(always)]
unsafe fn finish_rows(
    acc: &mut [f32],
    d: f32,
    dmin: Option<f32>,
    da: impl Fn(usize) -> f32,
    lanes: impl Fn(usize) -> (__m512i, __m512i),
) {
    for (r, acc) in acc.iter_mut().enumerate() {
        let (v1, v2) = lanes(r);
        let da = da(r);
        // SAFETY: the caller's contract.
        let s1 = unsafe { _mm512_reduce_add_epi32(v1) };
        *acc = (d * da).mul_add(s1 as f32, *acc);
        if let Some(dmin) = dmin {
            // SAFETY: as above.
            let s2 = unsafe { _mm512_reduce_add_epi32(v2) };
            *acc = (dmin * da).mul_add(s2 as f32, *acc);
        }
    }
}
