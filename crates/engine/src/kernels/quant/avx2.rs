//! The AVX2 kernels of [`super`] (x86-64): the VNNI kernels' integer sums with `vpmaddubsw`
//! (unsigned × signed bytes, adjacent products summed to 16 bits: at most 2 · 63 · 127 for these
//! types' unsigned weights, or 2 · 128 · 127 for Q8_0's through the sign trick, so never saturated)
//! and `vpmaddwd` (the integer scales, or ones, summed to 32 bits); the same exact sums, so the
//! same bits.
//!
//! The rows go [`LANES`](super::LANES) at a time through a row of weights, each weight block
//! decoded once for them. For the k-quants [`drive`] sums their integer vectors (exact) and runs
//! the float steps in the order of [`super`]'s docs: per row and lane the same two roundings as
//! the scalar `(d · da).mul_add(f32(S), acc[b mod 8])`, so the same bits as a row alone. The
//! 32-element types (one lane) sum the rows' vectors by one transposing tree per block
//! ([`hsum_rows`], exact) and run the float steps on one vector of the rows' accumulators
//! ([`fma_rows`]). For one to four activation rows the k-quants instead take eight weight rows
//! side by side ([`q4_k_cols`], [`q6_k_cols`], driven by [`drive_cols_avx2`]) with the same block
//! steps ([`q4_k_block`], [`q6_k_block`]); Q8_0 and the legacy types do so for one row.

use super::x86::{
    by_row_groups, drive, drive_cols_avx2, fma_rows, halves, halves_of, hsum_rows, k4_scales,
    prefetch_part, q4_k_block_bytes, BlockSums,
};
use super::{QuantActs, COLS};
use std::arch::x86_64::*;

/// The `N` activation rows' 256-element blocks at `at + i · acts.k` against a k-quant block
/// decoded to 8 registers of unsigned bytes (32 elements each, 16-bit scales per pair of 16):
/// each row's scaled dot products, and its block's 16 activation sums times the 16-bit factors
/// `per_sum`, each as 8 lanes to be summed. Each weight register goes through every row before
/// the next, so the weights stay in registers.
///
/// # Safety
/// The CPU has AVX2; `at` is a block start inside `acts` with `N − 1` rows after it.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn k_rows<const N: usize>(
    w: &[__m256i; 8],
    scale: &[__m256i; 8],
    acts: &QuantActs,
    at: usize,
    per_sum: __m256i,
) -> ([__m256i; N], [__m256i; N]) {
    let mut sum = [_mm256_setzero_si256(); N];
    let mut side = [_mm256_setzero_si256(); N];
    // SAFETY: the caller's contract.
    unsafe {
        let a = acts.q.as_ptr().add(at);
        for v in 0..8 {
            for (i, sum) in sum.iter_mut().enumerate() {
                let av = _mm256_loadu_si256(a.add(i * acts.k + 32 * v) as *const __m256i);
                let pairs = _mm256_maddubs_epi16(w[v], av);
                *sum = _mm256_add_epi32(*sum, _mm256_madd_epi16(pairs, scale[v]));
            }
        }
        for (i, side) in side.iter_mut().enumerate() {
            let sums = acts.sum16_i16.as_ptr().add((at + i * acts.k) / 16);
            *side = _mm256_madd_epi16(_mm256_loadu_si256(sums as *const __m256i), per_sum);
        }
    }
    (sum, side)
}

/// `Q4_K` blocks (see the VNNI kernel), or with `FIVE` `Q5_K` ones (176 bytes: the same
/// header, then 32 bytes whose bit `g` of byte `l` is the fifth bit of element `l` of group
/// `g`, then the nibbles).
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; `row` is whole blocks of the type, `acts` quantized for it
/// with as many blocks per row, `acc` holds `acts.lanes` floats (the outputs are written to the
/// first `acts.rows`).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q4_k<const FIVE: bool>(row: &[u8], acts: &QuantActs, acc: &mut [f32]) {
    // SAFETY: the caller's contract.
    unsafe { by_row_groups!(q4_k_rows<FIVE>, acts; row, acts, acc) }
}

/// [`q4_k`] for the `N` rows from `r0`.
///
/// # Safety
/// As [`q4_k`]; `r0 + N ≤ acts.rows`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_k_rows<const FIVE: bool, const N: usize>(
    row: &[u8],
    acts: &QuantActs,
    acc: &mut [f32],
    r0: usize,
) {
    let block = q4_k_block_bytes(FIVE);
    // SAFETY: the caller's contract.
    unsafe {
        drive::<N, true>(row.len() / block, acts, r0, acc, |b| {
            q4_k_block::<FIVE, N>(row.as_ptr(), b, acts, r0)
        });
    }
}

/// [`q4_k`] against the `N` activation rows of `acts` from `r0` for [`COLS`] consecutive
/// weight rows (`rows`), output `j` of activation row `r0 + i` in `out[i][j]`
/// ([`drive_cols_avx2`]): one transposing tree per block for the eight rows' integer vectors,
/// where a row alone pays a horizontal sum per block and its float steps on one lane.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; `rows` is [`COLS`] rows of whole blocks of the type, `acts`
/// quantized for them with as many blocks, with rows `r0..r0 + N`; `out` is `N` long.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q4_k_cols<const FIVE: bool, const N: usize>(
    rows: &[u8],
    ahead: &[u8],
    acts: &QuantActs,
    r0: usize,
    out: &mut [[f32; COLS]],
) {
    let row_bytes = rows.len() / COLS;
    let block = q4_k_block_bytes(FIVE);
    // SAFETY: the caller's contract.
    unsafe {
        drive_cols_avx2::<N, true>(row_bytes / block, acts, r0, ahead, out, |j, b| {
            q4_k_block::<FIVE, N>(rows.as_ptr().add(j * row_bytes), b, acts, r0)
        });
    }
}

/// Block `b` of the `Q4_K` (with `FIVE` `Q5_K`) row at `row` against the `N` activation rows
/// from `r0`.
///
/// # Safety
/// As [`q4_k`]; block `b` lies inside the row; `r0 + N ≤ acts.rows`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_k_block<const FIVE: bool, const N: usize>(
    row: *const u8,
    b: usize,
    acts: &QuantActs,
    r0: usize,
) -> BlockSums<N> {
    let block = q4_k_block_bytes(FIVE);
    let nibbles = if FIVE { 48 } else { 16 };
    let mask = _mm256_set1_epi8(0x0F);
    let one = _mm256_set1_epi8(1);
    // Each group's min (bytes 8–15) for both of its sums of 16.
    let pick_min = _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15);
    // SAFETY (whole body): every access stays inside block `b` at `row` and the rows
    // `r0..r0 + N` of `acts` (the caller's contract).
    unsafe {
        let blk = row.add(block * b);
        // d and −dmin.
        let f = _mm_xor_ps(halves(blk), _mm_setr_ps(0.0, -0.0, 0.0, 0.0));
        let sc = k4_scales(blk.add(4));
        let packed = _mm_loadu_si128(sc.as_ptr() as *const __m128i);
        let mins = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(packed, pick_min));
        let mut w = [_mm256_setzero_si256(); 8];
        let mut scale = [_mm256_setzero_si256(); 8];
        let qh = _mm256_loadu_si256(blk.add(16) as *const __m256i);
        for t in 0..4 {
            let raw = _mm256_loadu_si256(blk.add(nibbles + 32 * t) as *const __m256i);
            w[2 * t] = _mm256_and_si256(raw, mask);
            w[2 * t + 1] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), mask);
            if FIVE {
                for g in [2 * t, 2 * t + 1] {
                    let bit = _mm256_srl_epi16(qh, _mm_cvtsi32_si128(g as i32));
                    let high = _mm256_slli_epi16(_mm256_and_si256(bit, one), 4);
                    w[g] = _mm256_or_si256(w[g], high);
                }
            }
            scale[2 * t] = _mm256_set1_epi16(sc[2 * t] as i16);
            scale[2 * t + 1] = _mm256_set1_epi16(sc[2 * t + 1] as i16);
        }
        let (s1, s2) = k_rows::<N>(&w, &scale, acts, r0 * acts.k + 256 * b, mins);
        BlockSums { f, s1, s2 }
    }
}

/// `Q6_K` blocks (see the VNNI kernel).
///
/// # Safety
/// As [`q4_k`], for `Q6_K`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q6_k(row: &[u8], acts: &QuantActs, acc: &mut [f32]) {
    // SAFETY: the caller's contract.
    unsafe { by_row_groups!(q6_k_rows<>, acts; row, acts, acc) }
}

/// [`q6_k`] for the `N` rows from `r0`.
///
/// # Safety
/// As [`q6_k`]; `r0 + N ≤ acts.rows`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6_k_rows<const N: usize>(row: &[u8], acts: &QuantActs, acc: &mut [f32], r0: usize) {
    // SAFETY: the caller's contract.
    unsafe {
        drive::<N, false>(row.len() / 210, acts, r0, acc, |b| {
            q6_k_block::<N>(row.as_ptr(), b, acts, r0)
        });
    }
}

/// [`q6_k`] against the `N` activation rows of `acts` for [`COLS`] consecutive weight rows, as
/// [`q4_k_cols`].
///
/// # Safety
/// As [`q4_k_cols`], for `Q6_K`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q6_k_cols<const N: usize>(
    rows: &[u8],
    ahead: &[u8],
    acts: &QuantActs,
    r0: usize,
    out: &mut [[f32; COLS]],
) {
    let row_bytes = rows.len() / COLS;
    // SAFETY: the caller's contract.
    unsafe {
        drive_cols_avx2::<N, false>(row_bytes / 210, acts, r0, ahead, out, |j, b| {
            q6_k_block::<N>(rows.as_ptr().add(j * row_bytes), b, acts, r0)
        });
    }
}

/// Block `b` of the `Q6_K` row at `row` against the `N` activation rows from `r0`.
///
/// # Safety
/// As [`q6_k`]; block `b` lies inside the row; `r0 + N ≤ acts.rows`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6_k_block<const N: usize>(
    row: *const u8,
    b: usize,
    acts: &QuantActs,
    r0: usize,
) -> BlockSums<N> {
    let (m4, m3) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(3));
    // SAFETY (whole body): as in `q4_k_block`.
    unsafe {
        let p = row.add(210 * b);
        // d (bytes 208–209) in lane 0.
        let f = _mm_movehdup_ps(halves(p.add(206)));
        // w[v] holds elements 32v .. 32v + 32: groups 2v (first 16) and 2v + 1.
        let mut w = [_mm256_setzero_si256(); 8];
        for h in 0..2 {
            let ql0 = _mm256_loadu_si256(p.add(64 * h) as *const __m256i);
            let ql1 = _mm256_loadu_si256(p.add(64 * h + 32) as *const __m256i);
            let qh = _mm256_loadu_si256(p.add(128 + 32 * h) as *const __m256i);
            let high = |x: __m256i| _mm256_slli_epi16(_mm256_and_si256(x, m3), 4);
            w[4 * h] = _mm256_or_si256(_mm256_and_si256(ql0, m4), high(qh));
            w[4 * h + 1] =
                _mm256_or_si256(_mm256_and_si256(ql1, m4), high(_mm256_srli_epi16(qh, 2)));
            w[4 * h + 2] = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                high(_mm256_srli_epi16(qh, 4)),
            );
            w[4 * h + 3] = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                high(_mm256_srli_epi16(qh, 6)),
            );
        }
        let sc = _mm_loadu_si128(p.add(192) as *const __m128i);
        let scale: [__m256i; 8] = std::array::from_fn(|v| {
            let (a, c) = (2 * v as i8, 2 * v as i8 + 1);
            let pick = _mm_setr_epi8(a, a, a, a, a, a, a, a, c, c, c, c, c, c, c, c);
            _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc, pick))
        });
        // 32 · sc[g] per sum of 16 (group g): the +32 of the stored values comes back out.
        let bias = _mm256_slli_epi16(_mm256_cvtepi8_epi16(sc), 5);
        let (sum, off) = k_rows::<N>(&w, &scale, acts, r0 * acts.k + 256 * b, bias);
        let s1: [__m256i; N] = std::array::from_fn(|i| _mm256_sub_epi32(sum[i], off[i]));
        BlockSums { f, s1, s2: s1 }
    }
}

/// `Q4_0`, `Q4_1`, `Q5_0`, `Q5_1` blocks of 32: d (and, with `MIN`, the min m), with `FIVE`
/// 32 bits holding each element's fifth bit, then 16 bytes of nibbles (elements 0–15 low,
/// 16–31 high). Stored unsigned; types without a min are offset by 8 (16 with `FIVE`), taken
/// back out with the activation sums.
///
/// # Safety
/// As [`q4_k`], for the type.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn legacy<const FIVE: bool, const MIN: bool>(
    row: &[u8],
    acts: &QuantActs,
    acc: &mut [f32],
) {
    // SAFETY: the caller's contract.
    unsafe { by_row_groups!(legacy_rows<FIVE, MIN>, acts; row, acts, acc) }
}

/// The layout of a legacy block (`Q4_0`, `Q4_1`, `Q5_0`, `Q5_1`): its size, where its nibbles
/// start, and the offset its unsigned weights carry (taken back out with the activation sums).
const fn legacy_layout(five: bool, min: bool) -> (usize, usize, i32) {
    let block = 18 + if min { 2 } else { 0 } + if five { 4 } else { 0 };
    let bias = match (five, min) {
        (_, true) => 0,
        (false, false) => 8,
        (true, false) => 16,
    };
    (block, block - 16, bias)
}

/// A legacy block's 32 weights at `blk` as unsigned bytes (element `i` in byte `i`), the
/// fifth bits set with `FIVE`.
///
/// # Safety
/// The CPU has AVX2; `blk` is a whole block of the type.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn legacy_weights<const FIVE: bool, const MIN: bool>(blk: *const u8) -> __m256i {
    let (_, nibbles, _) = legacy_layout(FIVE, MIN);
    let mask = _mm_set1_epi8(0x0F);
    // SAFETY: the caller's contract.
    let raw = unsafe { _mm_loadu_si128(blk.add(nibbles) as *const __m128i) };
    let lo = _mm_and_si128(raw, mask);
    let hi = _mm_and_si128(_mm_srli_epi16(raw, 4), mask);
    let w = _mm256_set_m128i(hi, lo);
    if !FIVE {
        return w;
    }
    // Byte i of the expansion takes byte i / 8 of the 32 bits and keeps bit i mod 8.
    let spread = _mm256_setr_epi8(
        0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3,
        3, 3,
    );
    let bit = _mm256_set1_epi64x(i64::from_le_bytes([1, 2, 4, 8, 16, 32, 64, 128]));
    let at = if MIN { 4 } else { 2 };
    // SAFETY: the caller's contract.
    let qh = unsafe { std::ptr::read_unaligned(blk.add(at) as *const u32) };
    let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(qh as i32), spread);
    let set = _mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit);
    _mm256_or_si256(w, _mm256_and_si256(set, _mm256_set1_epi8(16)))
}

/// [`legacy`] for the `N` rows from `r0`.
///
/// # Safety
/// As [`legacy`]; `r0 + N ≤ acts.rows`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn legacy_rows<const FIVE: bool, const MIN: bool, const N: usize>(
    row: &[u8],
    acts: &QuantActs,
    acc: &mut [f32],
    r0: usize,
) {
    let (block, _, bias) = legacy_layout(FIVE, MIN);
    let one = _mm256_set1_epi16(1);
    // SAFETY (whole body): as in `q4_k_rows`.
    unsafe {
        let at = acc.as_mut_ptr().add(r0);
        let mut v = _mm256_loadu_ps(at);
        for b in 0..row.len() / block {
            let blk = row.as_ptr().add(block * b);
            // d, and with MIN m.
            let f = halves(blk);
            let w = legacy_weights::<FIVE, MIN>(blk);
            let mut dots = [_mm256_setzero_si256(); N];
            for (i, dot) in dots.iter_mut().enumerate() {
                let at = (r0 + i) * acts.k + 32 * b;
                let a = _mm256_loadu_si256(acts.q.as_ptr().add(at) as *const __m256i);
                *dot = _mm256_madd_epi16(_mm256_maddubs_epi16(w, a), one);
            }
            let by_block = b * acts.lanes + r0;
            let da = _mm256_loadu_ps(acts.d_by_block.as_ptr().add(by_block));
            let sum =
                _mm256_loadu_si256(acts.sum_by_block.as_ptr().add(by_block) as *const __m256i);
            // dot − bias · sum, exact (bias is 0, 8 or 16).
            let biased = _mm256_mullo_epi32(sum, _mm256_set1_epi32(bias));
            v = fma_rows(
                v,
                _mm256_broadcastss_ps(f),
                da,
                _mm256_sub_epi32(hsum_rows(&dots), biased),
            );
            if MIN {
                v = fma_rows(v, _mm256_broadcastss_ps(_mm_movehdup_ps(f)), da, sum);
            }
        }
        _mm256_storeu_ps(at, v);
    }
}

/// [`legacy`] against one activation row for [`COLS`] consecutive weight rows, as
/// [`q8_0_cols`] runs `Q8_0`: output `j` in lane `j`, the one-lane order of [`super`]'s docs.
///
/// # Safety
/// As [`q8_0_cols`], for the type.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn legacy_cols<const FIVE: bool, const MIN: bool>(
    rows: &[u8],
    ahead: &[u8],
    acts: &QuantActs,
    _r0: usize,
    out: &mut [[f32; COLS]],
) {
    let (block, _, bias) = legacy_layout(FIVE, MIN);
    let row_bytes = rows.len() / COLS;
    let blocks = row_bytes / block;
    let one = _mm256_set1_epi16(1);
    // SAFETY (whole body): as in `q8_0_cols`.
    unsafe {
        let mut v = _mm256_setzero_ps();
        for b in 0..blocks {
            prefetch_part::<_MM_HINT_T0>(ahead, b, blocks);
            let blk = |j: usize| rows.as_ptr().add(j * row_bytes + block * b);
            let a = _mm256_loadu_si256(acts.q.as_ptr().add(32 * b) as *const __m256i);
            let dots: [__m256i; COLS] = std::array::from_fn(|j| {
                let w = legacy_weights::<FIVE, MIN>(blk(j));
                _mm256_madd_epi16(_mm256_maddubs_epi16(w, a), one)
            });
            let da = _mm256_set1_ps(*acts.d.get_unchecked(b));
            let sum = *acts.sum_by_block.get_unchecked(b * acts.lanes);
            // dot − bias · sum, exact (bias is 0, 8 or 16).
            let biased = _mm256_set1_epi32(sum * bias);
            let d = halves_of(std::array::from_fn(blk));
            v = fma_rows(v, d, da, _mm256_sub_epi32(hsum_rows(&dots), biased));
            if MIN {
                let m = halves_of(std::array::from_fn(|j| blk(j).add(2)));
                v = fma_rows(v, m, da, _mm256_set1_epi32(sum));
            }
        }
        _mm256_storeu_ps(out[0].as_mut_ptr(), v);
    }
}

/// `Q8_0` blocks: `|w|` times `a` with `w`'s sign, so the unsigned operand is `|w|`.
///
/// # Safety
/// As [`q4_k`], for `Q8_0`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q8_0(row: &[u8], acts: &QuantActs, acc: &mut [f32]) {
    // SAFETY: the caller's contract.
    unsafe { by_row_groups!(q8_0_rows<>, acts; row, acts, acc) }
}

/// [`q8_0`] for the `N` rows from `r0`.
///
/// # Safety
/// As [`q8_0`]; `r0 + N ≤ acts.rows`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_0_rows<const N: usize>(row: &[u8], acts: &QuantActs, acc: &mut [f32], r0: usize) {
    let ones = _mm256_set1_epi16(1);
    // SAFETY (whole body): as in `q4_k_rows`.
    unsafe {
        let at = acc.as_mut_ptr().add(r0);
        let mut v = _mm256_loadu_ps(at);
        for b in 0..row.len() / 34 {
            let blk = row.as_ptr().add(34 * b);
            let w = _mm256_loadu_si256(blk.add(2) as *const __m256i);
            let magnitude = _mm256_sign_epi8(w, w);
            let mut s = [_mm256_setzero_si256(); N];
            for (i, s) in s.iter_mut().enumerate() {
                let at = (r0 + i) * acts.k + 32 * b;
                let a = _mm256_loadu_si256(acts.q.as_ptr().add(at) as *const __m256i);
                let pairs = _mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(a, w));
                *s = _mm256_madd_epi16(pairs, ones);
            }
            let da = _mm256_loadu_ps(acts.d_by_block.as_ptr().add(b * acts.lanes + r0));
            v = fma_rows(v, _mm256_broadcastss_ps(halves(blk)), da, hsum_rows(&s));
        }
        _mm256_storeu_ps(at, v);
    }
}

/// `Q8_0` against one activation row for [`COLS`] consecutive weight rows (`rows`, whole blocks
/// each): output `j` in lane `j` of one vector of accumulators, so the eight outputs' float
/// chains run side by side and one transposing tree per block sums their integer vectors
/// (exact), where a row alone pays a horizontal sum and a dependent float step per block. Each
/// lane's float steps are the one-lane order of [`super`]'s docs, so the same bits.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; `rows` is [`COLS`] rows of whole `Q8_0` blocks, `acts` one
/// row quantized for them with as many blocks (so `r0` is 0; the outputs go to `out[0]`).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q8_0_cols(
    rows: &[u8],
    ahead: &[u8],
    acts: &QuantActs,
    _r0: usize,
    out: &mut [[f32; COLS]],
) {
    let row_bytes = rows.len() / COLS;
    let blocks = row_bytes / 34;
    let ones = _mm256_set1_epi16(1);
    // SAFETY (whole body): every access stays inside `rows` and row 0 of `acts` (the caller's
    // contract).
    unsafe {
        let mut v = _mm256_setzero_ps();
        for b in 0..blocks {
            prefetch_part::<_MM_HINT_T0>(ahead, b, blocks);
            let blk = |j: usize| rows.as_ptr().add(j * row_bytes + 34 * b);
            let a = _mm256_loadu_si256(acts.q.as_ptr().add(32 * b) as *const __m256i);
            let s: [__m256i; COLS] = std::array::from_fn(|j| {
                let w = _mm256_loadu_si256(blk(j).add(2) as *const __m256i);
                let pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w));
                _mm256_madd_epi16(pairs, ones)
            });
            let d = halves_of(std::array::from_fn(blk));
            let da = _mm256_set1_ps(*acts.d.get_unchecked(b));
            v = fma_rows(v, d, da, hsum_rows(&s));
        }
        _mm256_storeu_ps(out[0].as_mut_ptr(), v);
    }
}
