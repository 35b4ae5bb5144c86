//! The AVX-512 VNNI kernels of [`super`] (x86-64) for the k-quants Q4_K, Q5_K and Q6_K: each
//! weight block decoded once to four registers of unsigned bytes for up to [`LANES`] activation
//! rows, `vpdpbusd` (unsigned × signed bytes, four products per 32-bit lane) against each row's
//! activation bytes in [`VNNI_ORDER`], the integer scales applied by `vpmaddwd` on the lane sums
//! narrowed to 16 bits (exact: each kernel bounds them), then [`drive`] sums the lanes (exact)
//! and runs the float steps in the order of [`super`]'s docs: per row and lane the same exact
//! integers and the same two roundings as the reference, so the same bits. And Q8_0: eight
//! weight rows side by side against one activation row ([`q8_0_cols`]), sixteen in the lanes
//! against several ([`q8_0_wide`]), and the other 32-element types in the lanes
//! ([`legacy_wide`]). For several activation rows the k-quants run sixteen weight rows in the
//! lanes too ([`q4_k_wide`], [`q6_k_wide`]): their blocks decoded once for all the rows, no sum
//! across lanes.
//!
//! [`LANES`]: super::LANES

use super::x86::{
    by_row_groups, by_wide_row_groups, drive, drive_cols, fma_rows, halves, halves_of,
    k4_scales_reg, prefetch_part, q4_k_block_bytes, BlockSums,
};
use super::{QuantActs, COLS, WIDE};
use std::arch::x86_64::*;

/// Where each 16-element chunk of a 256-element block sits in [`QuantActs`]' VNNI copy of the
/// activations: the kernels' register `t` holds chunks `VNNI_ORDER[4t..4t + 4]` (one per
/// 128-bit lane), so that in Q4_K's registers 0 and 1 (and 2 and 3) every lane belongs to the
/// same group of 32 and one accumulator serves both.
pub(super) const VNNI_ORDER: [usize; 16] = [0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15];

/// `acts`' activation bytes of row block `at` (a block start) in [`VNNI_ORDER`]: 4 registers.
///
/// # Safety
/// The CPU has AVX-512 F; `at` is a block start inside `acts.q_vnni`.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn act_regs(acts: &QuantActs, at: usize) -> [__m512i; 4] {
    // SAFETY: the caller's contract (256 bytes from `at`).
    unsafe {
        let a = acts.q_vnni.as_ptr().add(at);
        std::array::from_fn(|t| _mm512_loadu_si512(a.add(64 * t) as *const __m512i))
    }
}

/// The 8 lanes of `v`'s two halves added (exact).
#[inline]
#[target_feature(enable = "avx512f,avx2")]
fn fold(v: __m512i) -> __m256i {
    _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64::<1>(v))
}

/// `Q4_K` blocks (144 bytes: d, dmin, 12 bytes of 6-bit scales and mins, 128 bytes of
/// nibbles; 8 groups of 32), or with `FIVE` `Q5_K` ones (176 bytes: the same header, then 32
/// bytes whose bit `g` of byte `l` is the fifth bit of element `l` of group `g`, then the
/// nibbles).
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL, VNNI, FMA and F16C; `row` is whole blocks of the type, `acts`
/// quantized for it with as many blocks per row, `acc` holds `acts.lanes` floats (the outputs are
/// written to the first `acts.rows`).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn q4_k<const FIVE: bool>(row: &[u8], acts: &QuantActs, acc: &mut [f32]) {
    // SAFETY: the caller's contract.
    unsafe { by_row_groups!(q4_k_rows<FIVE>, acts; row, acts, acc) }
}

/// [`q4_k`] for the `N` rows from `r0`.
///
/// # Safety
/// As [`q4_k`]; `r0 + N ≤ acts.rows`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
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
/// weight rows (`rows`), output `j` of activation row `r0 + i` in `out[i][j]` ([`drive_cols`]).
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL, VNNI, FMA and F16C; `rows` is [`COLS`] rows of whole blocks of
/// the type, `acts` quantized for them with as many blocks, with rows `r0..r0 + N`; `out` is
/// `N` long.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
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
        drive_cols::<N, true>(row_bytes / block, acts, r0, ahead, out, |j, b| {
            q4_k_block::<FIVE, N>(rows.as_ptr().add(j * row_bytes), b, acts, r0)
        });
    }
}

/// Block `b` of the row at `row` against the `N` activation rows from `r0`.
///
/// Per block, the nibbles of elements `64t .. 64t + 64` (bytes `32t ..`, low nibbles the first
/// 32 elements) load as one register for `t` = 0, 1 and one for 2, 3; masking gives chunks
/// `(0, 1, 4, 5)` (low) and `(2, 3, 6, 7)` (high), which `vpermt2q` deals into [`VNNI_ORDER`]:
/// register 0 holds chunks 0, 2, 4, 6 (groups 0–3) and register 1 chunks 1, 3, 5, 7 (the same
/// groups). A lane of `vpdpbusd` over registers 0 and 1 sums 8 products of at most 31 · 127
/// (Q5_K), so at most 31,496 and `vpackssdw` narrows it exactly.
///
/// # Safety
/// As [`q4_k`]; block `b` lies inside the row; `r0 + N ≤ acts.rows`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q4_k_block<const FIVE: bool, const N: usize>(
    row: *const u8,
    b: usize,
    acts: &QuantActs,
    r0: usize,
) -> BlockSums<N> {
    let block = q4_k_block_bytes(FIVE);
    let nibbles = if FIVE { 48 } else { 16 };
    let mask = _mm512_set1_epi8(0x0F);
    let one = _mm512_set1_epi8(1);
    let even = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13);
    let odd = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
    // Register pair p's lane c (of 4) covers group 4p + c. After `vpackssdw` of the pairs' sums,
    // lane c holds 4 sums of group c, then 4 of group 4 + c: their scales, as bytes.
    let pick_scale = _mm256_setr_epi8(
        0, 0, 0, 0, 4, 4, 4, 4, 1, 1, 1, 1, 5, 5, 5, 5, 2, 2, 2, 2, 6, 6, 6, 6, 3, 3, 3, 3, 7, 7,
        7, 7,
    );
    // Each group's min (bytes 8–15) for both of its sums of 16.
    let pick_min = _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15);
    // The fifth bits of the low and high registers of pair p sit in bits (4p, 4p + 2) and
    // (4p + 1, 4p + 3) of the 32 bytes, one shift count per 256-bit half.
    let shifts =
        |a: i16, b: i16| _mm512_inserti64x4::<1>(_mm512_set1_epi16(a), _mm256_set1_epi16(b));
    let fifth = [[shifts(0, 2), shifts(1, 3)], [shifts(4, 6), shifts(5, 7)]];
    // SAFETY (whole body): every access stays inside block `b` at `row` and the rows
    // `r0..r0 + N` of `acts` (the caller's contract).
    unsafe {
        let qh_none = _mm512_setzero_si512();
        let blk = row.add(block * b);
        // d and −dmin.
        let f = _mm_xor_ps(halves(blk), _mm_setr_ps(0.0, -0.0, 0.0, 0.0));
        let packed = k4_scales_reg(blk.add(4));
        let scale = _mm512_cvtepu8_epi16(_mm256_shuffle_epi8(
            _mm256_broadcastsi128_si256(packed),
            pick_scale,
        ));
        let mins = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(packed, pick_min));
        let qh = if FIVE {
            _mm512_broadcast_i64x4(_mm256_loadu_si256(blk.add(16) as *const __m256i))
        } else {
            qh_none
        };
        let mut w = [_mm512_setzero_si512(); 4];
        for p in 0..2 {
            let raw = _mm512_loadu_si512(blk.add(nibbles + 64 * p) as *const __m512i);
            let mut lo = _mm512_and_si512(raw, mask);
            let mut hi = _mm512_and_si512(_mm512_srli_epi16::<4>(raw), mask);
            if FIVE {
                let bit = |s: __m512i| {
                    let b = _mm512_and_si512(_mm512_srlv_epi16(qh, s), one);
                    _mm512_slli_epi16::<4>(b)
                };
                lo = _mm512_or_si512(lo, bit(fifth[p][0]));
                hi = _mm512_or_si512(hi, bit(fifth[p][1]));
            }
            w[2 * p] = _mm512_permutex2var_epi64(lo, even, hi);
            w[2 * p + 1] = _mm512_permutex2var_epi64(lo, odd, hi);
        }
        let mut s1 = [_mm256_setzero_si256(); N];
        let mut s2 = [_mm256_setzero_si256(); N];
        for i in 0..N {
            let a = act_regs(acts, (r0 + i) * acts.k + 256 * b);
            let pair = |p: usize| {
                let x = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[2 * p], a[2 * p]);
                _mm512_dpbusd_epi32(x, w[2 * p + 1], a[2 * p + 1])
            };
            let narrow = _mm512_packs_epi32(pair(0), pair(1));
            s1[i] = fold(_mm512_madd_epi16(narrow, scale));
            let sums = acts
                .sum16_i16
                .as_ptr()
                .add(((r0 + i) * acts.k + 256 * b) / 16);
            s2[i] = _mm256_madd_epi16(_mm256_loadu_si256(sums as *const __m256i), mins);
        }
        BlockSums { f, s1, s2 }
    }
}

/// `Q6_K` blocks (210 bytes: 128 bytes of low nibbles, 64 of high 2-bit pairs, 16 signed
/// scales, d; 16 groups of 16; values stored +32).
///
/// # Safety
/// As [`q4_k`], for `Q6_K`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn q6_k(row: &[u8], acts: &QuantActs, acc: &mut [f32]) {
    // SAFETY: the caller's contract.
    unsafe { by_row_groups!(q6_k_rows<>, acts; row, acts, acc) }
}

/// [`q6_k`] for the `N` rows from `r0`.
///
/// # Safety
/// As [`q6_k`]; `r0 + N ≤ acts.rows`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
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
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
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
        drive_cols::<N, false>(row_bytes / 210, acts, r0, ahead, out, |j, b| {
            q6_k_block::<N>(rows.as_ptr().add(j * row_bytes), b, acts, r0)
        });
    }
}

/// Block `b` of the `Q6_K` row at `row` against the `N` activation rows from `r0`.
///
/// Per half `h` of the block, the 64 low-nibble bytes and 32 high-pair bytes give chunks
/// `8h + (0, 1, 2, 3)` and `8h + (4, 5, 6, 7)`, which `vshufi32x4` deals into [`VNNI_ORDER`].
/// Every chunk is its own group, so each register has its own accumulator: a lane sums 4
/// products of at most 63 · 127 (8,001 · 4 = 32,004), narrowed exactly by `vpackssdw`.
///
/// # Safety
/// As [`q6_k`]; block `b` lies inside the row; `r0 + N ≤ acts.rows`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q6_k_block<const N: usize>(
    row: *const u8,
    b: usize,
    acts: &QuantActs,
    r0: usize,
) -> BlockSums<N> {
    let (m4, m3) = (_mm512_set1_epi8(0x0F), _mm512_set1_epi8(3));
    // The high pairs of chunks 8h + (0, 1) / (2, 3) sit at bits 0 / 2 of the 32 bytes, those
    // of (4, 5) / (6, 7) at bits 4 / 6: one shift count per 256-bit half.
    let shifts =
        |a: i16, b: i16| _mm512_inserti64x4::<1>(_mm512_set1_epi16(a), _mm256_set1_epi16(b));
    let (low_shift, high_shift) = (shifts(0, 2), shifts(4, 6));
    // After `vpackssdw` of registers (2q, 2q + 1), lane c holds 4 sums of chunk 8q + 2c, then
    // 4 of chunk 8q + 2c + 1: the scales in natural order, each 4 times.
    let pick_scale: [__m256i; 2] = std::array::from_fn(|q| {
        let pick: [i8; 32] = std::array::from_fn(|i| (8 * q + i / 4) as i8);
        // SAFETY: 32 bytes.
        unsafe { _mm256_loadu_si256(pick.as_ptr() as *const __m256i) }
    });
    // SAFETY (whole body): as in `q4_k_block`.
    unsafe {
        let p = row.add(210 * b);
        // d (bytes 208–209) in lane 0.
        let f = _mm_movehdup_ps(halves(p.add(206)));
        let mut w = [_mm512_setzero_si512(); 4];
        for h in 0..2 {
            let ql = _mm512_loadu_si512(p.add(64 * h) as *const __m512i);
            let qh =
                _mm512_broadcast_i64x4(_mm256_loadu_si256(p.add(128 + 32 * h) as *const __m256i));
            let high =
                |s: __m512i| _mm512_slli_epi16::<4>(_mm512_and_si512(_mm512_srlv_epi16(qh, s), m3));
            let first = _mm512_or_si512(_mm512_and_si512(ql, m4), high(low_shift));
            let second = _mm512_or_si512(
                _mm512_and_si512(_mm512_srli_epi16::<4>(ql), m4),
                high(high_shift),
            );
            w[2 * h] = _mm512_shuffle_i32x4::<0b10_00_10_00>(first, second);
            w[2 * h + 1] = _mm512_shuffle_i32x4::<0b11_01_11_01>(first, second);
        }
        let sc = _mm256_broadcastsi128_si256(_mm_loadu_si128(p.add(192) as *const __m128i));
        let scale: [__m512i; 2] =
            std::array::from_fn(|q| _mm512_cvtepi8_epi16(_mm256_shuffle_epi8(sc, pick_scale[q])));
        // 32 · sc[g] per sum of 16 (chunk g): the +32 of the stored values comes back out.
        let bias = _mm256_slli_epi16::<5>(_mm256_cvtepi8_epi16(_mm256_castsi256_si128(sc)));
        let mut s = [_mm256_setzero_si256(); N];
        for (i, s) in s.iter_mut().enumerate() {
            let a = act_regs(acts, (r0 + i) * acts.k + 256 * b);
            let dot = |t: usize| _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[t], a[t]);
            let q0 = _mm512_madd_epi16(_mm512_packs_epi32(dot(0), dot(1)), scale[0]);
            let q1 = _mm512_madd_epi16(_mm512_packs_epi32(dot(2), dot(3)), scale[1]);
            let sums = acts
                .sum16_i16
                .as_ptr()
                .add(((r0 + i) * acts.k + 256 * b) / 16);
            let off = _mm256_madd_epi16(_mm256_loadu_si256(sums as *const __m256i), bias);
            *s = _mm256_sub_epi32(fold(_mm512_add_epi32(q0, q1)), off);
        }
        BlockSums { f, s1: s, s2: s }
    }
}

/// `Q8_0` (34-byte blocks: an f16 scale, 32 signed bytes) against one activation row for
/// [`COLS`] consecutive weight rows (`rows`, whole blocks each), output `j` in lane `j`. Per
/// block, weight rows `i` and `4 + i` share a register; the activation block is made unsigned
/// (`a ⊕ 0x80 = a + 128`) and each weight register's accumulator starts at `−128 · Σ w` of its
/// 4-byte groups (a `vpdpbusd` against 128s), so one `vpdpbusd` per two weight rows gives
/// `Σ a·w` per group exactly (a group's terms stay below 2^17), and [`half_sums`] adds the
/// groups of each weight row (exact). Each lane's float step is [`fma_rows`]'s, the one-lane
/// order of [`super`]'s docs, so the same bits.
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL, VNNI, FMA and F16C; `rows` is [`COLS`] rows of whole `Q8_0`
/// blocks, `acts` one row quantized for them with as many blocks (so `r0` is 0; the outputs go
/// to `out[0]`).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn q8_0_cols(
    rows: &[u8],
    ahead: &[u8],
    acts: &QuantActs,
    _r0: usize,
    out: &mut [[f32; COLS]],
) {
    let row_bytes = rows.len() / COLS;
    let blocks = row_bytes / 34;
    let bias = _mm512_set1_epi8(-128);
    let zero = _mm512_setzero_si512();
    // SAFETY (whole body): every access stays inside `rows` and row 0 of `acts` (the caller's
    // contract).
    unsafe {
        let mut v = _mm256_setzero_ps();
        for b in 0..blocks {
            prefetch_part::<_MM_HINT_T0>(ahead, b, blocks);
            let blk = |j: usize| rows.as_ptr().add(j * row_bytes + 34 * b);
            let a = acts.q.as_ptr().add(32 * b) as *const __m256i;
            let a = _mm512_xor_si512(_mm512_broadcast_i64x4(_mm256_loadu_si256(a)), bias);
            let p = std::array::from_fn(|i| {
                let lo = _mm256_loadu_si256(blk(i).add(2) as *const __m256i);
                let hi = _mm256_loadu_si256(blk(4 + i).add(2) as *const __m256i);
                let w = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi);
                let start = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, bias, w));
                _mm512_dpbusd_epi32(start, a, w)
            });
            let d = halves_of(std::array::from_fn(blk));
            let da = _mm256_set1_ps(*acts.d.get_unchecked(b));
            v = fma_rows(v, d, da, half_sums(p));
        }
        _mm256_storeu_ps(out[0].as_mut_ptr(), v);
    }
}

/// The sums of the eight 32-bit lanes of each half of `p`: half 0 of `p[i]` in lane `i`, half 1
/// in lane `4 + i` (exact).
#[inline]
#[target_feature(enable = "avx512f,avx2")]
fn half_sums(p: [__m512i; 4]) -> __m256i {
    // Per 128-bit chunk: [x0 + x2, y0 + y2, x1 + x3, y1 + y3].
    let pair = |x, y| _mm512_add_epi32(_mm512_unpacklo_epi32(x, y), _mm512_unpackhi_epi32(x, y));
    let (x01, x23) = (pair(p[0], p[1]), pair(p[2], p[3]));
    // Per chunk c: [chunk c of p[0] summed, of p[1], of p[2], of p[3]].
    let y = _mm512_add_epi32(
        _mm512_unpacklo_epi64(x01, x23),
        _mm512_unpackhi_epi64(x01, x23),
    );
    let (lo, hi) = (_mm512_castsi512_si256(y), _mm512_extracti64x4_epi64::<1>(y));
    _mm256_add_epi32(
        _mm256_permute2x128_si256::<0x20>(lo, hi),
        _mm256_permute2x128_si256::<0x31>(lo, hi),
    )
}

/// `Q8_0` for [`WIDE`] consecutive weight rows (`rows`, whole blocks each) against every
/// activation row: output `j` of row `r` in `out[r][j]`. Per block the sixteen rows' bytes are
/// transposed ([`transposed`]) and made unsigned (`w ⊕ 0x80 = w + 128`), and each row's
/// accumulators start at `−128 · Σ a` of the block ([`drive_wide`]).
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL, VNNI, FMA and F16C; `rows` is [`WIDE`] rows of whole `Q8_0`
/// blocks, `acts` quantized for them with as many blocks per row (its `bias32` laid out), `out`
/// holds `acts.rows` rows.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn q8_0_wide(
    rows: &[u8],
    ahead: &[u8],
    acts: &QuantActs,
    out: &mut [[f32; WIDE]],
) {
    // SAFETY: the caller's contract.
    unsafe { by_row_groups!(q8_0_wide_rows<>, acts; rows, ahead, acts, out) }
}

/// [`q8_0_wide`] for the `N` rows from `r0`.
///
/// # Safety
/// As [`q8_0_wide`]; `r0 + N ≤ acts.rows`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q8_0_wide_rows<const N: usize>(
    rows: &[u8],
    ahead: &[u8],
    acts: &QuantActs,
    out: &mut [[f32; WIDE]],
    r0: usize,
) {
    let row_bytes = rows.len() / WIDE;
    let bias = _mm512_set1_epi8(-128);
    // SAFETY: every access stays inside `rows` (the caller's contract).
    unsafe {
        drive_wide::<N, false, 0>(row_bytes / 34, ahead, acts, r0, out, |b| {
            let blk = |j: usize| rows.as_ptr().add(j * row_bytes + 34 * b);
            let w = transposed(std::array::from_fn(|j| blk(j).add(2)));
            WideBlock {
                w: std::array::from_fn(|t| _mm512_xor_si512(w[t], bias)),
                d: wide_halves(blk),
                m: _mm512_setzero_ps(),
            }
        });
    }
}

/// One block of [`WIDE`] weight rows in the lanes: register `t` holds elements `4t .. 4t + 4`
/// of each row as unsigned bytes, `d` (and `m`, for the types with a min) each row's scales.
struct WideBlock {
    w: [__m512i; 8],
    d: __m512,
    m: __m512,
}

/// Runs a wide kernel's block step (`block`, blocks `0 .. blocks` in order) against the `N`
/// activation rows from `r0`, reading `ahead` a part per block. Per row and block, each register
/// meets its 4 activation bytes broadcast to every lane in a `vpdpbusd`, the accumulator starting
/// at `bias32 >> SHIFT` (the unsigned values' offset times `Σ a`, exact: `bias32` is
/// `−128 · Σ a`) or, with `MIN`, at 0, so lane `j` ends holding row `j`'s exact integer sum
/// (below 2^21 in magnitude on the way) with no sum across lanes; then the float steps of
/// [`super`]'s docs per lane: `fma(d·da, S1)`, and with `MIN` `fma(m·da, Σ a)` (`Σ a` exact in
/// f32). Output `j` of row `r0 + i` in `out[r0 + i][j]`.
///
/// # Safety
/// The CPU has AVX-512 F and VNNI and FMA; `acts` has `blocks` 32-element blocks per row and its
/// `bias32` laid out, `r0 + N ≤ acts.rows ≤ out.len()`.
#[inline(always)]
unsafe fn drive_wide<const N: usize, const MIN: bool, const SHIFT: u32>(
    blocks: usize,
    ahead: &[u8],
    acts: &QuantActs,
    r0: usize,
    out: &mut [[f32; WIDE]],
    block: impl Fn(usize) -> WideBlock,
) {
    // SAFETY (whole body): every access stays inside rows `r0 .. r0 + N` of `acts` and `out`
    // (the caller's contract).
    unsafe {
        let zero = _mm512_setzero_si512();
        let mut v = [_mm512_setzero_ps(); N];
        for b in 0..blocks {
            prefetch_part::<_MM_HINT_T0>(ahead, b, blocks);
            let WideBlock { w, d, m } = block(b);
            for (i, v) in v.iter_mut().enumerate() {
                let at = (r0 + i) * blocks + b;
                let a = acts.q.as_ptr().add(32 * at) as *const i32;
                let bias = _mm512_set1_epi32(*acts.bias32.get_unchecked(at));
                let mut s = if MIN {
                    zero
                } else {
                    _mm512_srai_epi32::<SHIFT>(bias)
                };
                for (t, w) in w.iter().enumerate() {
                    let quad = _mm512_set1_epi32(std::ptr::read_unaligned(a.add(t)));
                    s = _mm512_dpbusd_epi32(s, *w, quad);
                }
                let da = _mm512_set1_ps(*acts.d.get_unchecked(at));
                *v = _mm512_fmadd_ps(_mm512_mul_ps(d, da), _mm512_cvtepi32_ps(s), *v);
                if MIN {
                    // Σ a = −bias32 / 128, exactly.
                    let sum = _mm512_sub_epi32(zero, _mm512_srai_epi32::<7>(bias));
                    *v = _mm512_fmadd_ps(_mm512_mul_ps(m, da), _mm512_cvtepi32_ps(sum), *v);
                }
            }
        }
        for (i, v) in v.into_iter().enumerate() {
            _mm512_storeu_ps(out[r0 + i].as_mut_ptr(), v);
        }
    }
}

/// The f16 at `at(j)` for each of the [`WIDE`] rows `j`, widened exactly, in lane `j`.
///
/// # Safety
/// Two readable bytes at each address; the CPU has AVX-512 F and F16C.
#[inline]
#[target_feature(enable = "avx512f,avx2,f16c")]
unsafe fn wide_halves(at: impl Fn(usize) -> *const u8) -> __m512 {
    // SAFETY: the caller's contract.
    unsafe {
        let lo = _mm512_castps_pd(_mm512_castps256_ps512(halves_of(std::array::from_fn(&at))));
        let hi = _mm256_castps_pd(halves_of(std::array::from_fn(|j| at(8 + j))));
        // `vinsertf64x4` (AVX-512 F) moves the eight floats' bits as four doubles, unchanged.
        _mm512_castpd_ps(_mm512_insertf64x4::<1>(lo, hi))
    }
}

/// The 32 bytes at each of sixteen addresses as eight registers: lane `j` of register `t`
/// holds bytes `4t .. 4t + 4` from address `j` (a transpose of 32-bit words: row `j` and row
/// `8 + j` share a register, then three rounds of shuffles within each 256-bit half).
///
/// # Safety
/// 32 readable bytes at each address; the CPU has AVX-512 F.
#[inline]
#[target_feature(enable = "avx512f,avx2")]
unsafe fn transposed(at: [*const u8; 16]) -> [__m512i; 8] {
    // SAFETY: the caller's contract.
    let z: [__m512i; 8] = std::array::from_fn(|i| unsafe {
        let lo = _mm256_loadu_si256(at[i] as *const __m256i);
        let hi = _mm256_loadu_si256(at[8 + i] as *const __m256i);
        _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
    });
    // Per 128-bit chunk of each half (rows i, i + 1; words c, c + 1 of the chunk).
    let t: [__m512i; 8] = std::array::from_fn(|i| {
        let (x, y) = (z[i & !1], z[i | 1]);
        if i % 2 == 0 {
            _mm512_unpacklo_epi32(x, y)
        } else {
            _mm512_unpackhi_epi32(x, y)
        }
    });
    // u[4g + c]: word c of each chunk (chunk A: word c, chunk B: word 4 + c) for rows 4g .. 4g + 4.
    let u: [__m512i; 8] = std::array::from_fn(|m| {
        let (g, c) = (m / 4, m % 4);
        let (x, y) = (t[4 * g + c / 2], t[4 * g + 2 + c / 2]);
        if c % 2 == 0 {
            _mm512_unpacklo_epi64(x, y)
        } else {
            _mm512_unpackhi_epi64(x, y)
        }
    });
    let lo = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13);
    let hi = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
    std::array::from_fn(|w| {
        let c = w % 4;
        let index = if w < 4 { lo } else { hi };
        _mm512_permutex2var_epi64(u[c], index, u[4 + c])
    })
}

/// The legacy 32-element types for [`WIDE`] consecutive weight rows against every activation
/// row, as [`q8_0_wide`]: `Q4_0` (18-byte blocks: d, 16 bytes of nibbles, values `q − 8`), with
/// `MIN` `Q4_1` (20: d, m, nibbles; `d·q + m`), with `FIVE` `Q5_0` (22: d, 32 fifth bits,
/// nibbles; `q − 16`) and both `Q5_1` (24: d, m, fifth bits, nibbles).
///
/// # Safety
/// As [`q8_0_wide`], for the type.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn legacy_wide<const FIVE: bool, const MIN: bool>(
    rows: &[u8],
    ahead: &[u8],
    acts: &QuantActs,
    out: &mut [[f32; WIDE]],
) {
    // SAFETY: the caller's contract.
    unsafe { by_row_groups!(legacy_wide_rows<FIVE, MIN>, acts; rows, ahead, acts, out) }
}

/// [`legacy_wide`] for the `N` rows from `r0`. Per block the sixteen rows' nibble bytes are
/// transposed ([`transposed_quarter`]), split into low nibbles (elements `4t .. 4t + 4` in
/// register `t`) and high ones (elements `16 + 4t ..` in register `4 + t`, so again elements
/// `4t ..`), and with `FIVE` each element's fifth bit (bit `e` of the row's 32 bits) is spread
/// into bit 4 of its byte (`(bits · 0x00204081) & 0x01010101`, no carries). The values stay
/// unsigned: the accumulators start at `−8 · Σ a` (`Q4_0`) or `−16 · Σ a` (`Q5_0`), or at 0 for
/// the types with a min ([`drive_wide`]).
///
/// # Safety
/// As [`legacy_wide`]; `r0 + N ≤ acts.rows`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn legacy_wide_rows<const FIVE: bool, const MIN: bool, const N: usize>(
    rows: &[u8],
    ahead: &[u8],
    acts: &QuantActs,
    out: &mut [[f32; WIDE]],
    r0: usize,
) {
    let head = if MIN { 4 } else { 2 };
    let block = head + if FIVE { 4 } else { 0 } + 16;
    let row_bytes = rows.len() / WIDE;
    let nibble = _mm512_set1_epi8(0x0F);
    let row_at = _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
        _mm512_set1_epi32(row_bytes as i32),
    );
    let step = |b: usize| {
        // SAFETY: every access stays inside `rows` (the caller's contract).
        unsafe {
            let blk = |j: usize| rows.as_ptr().add(j * row_bytes + block * b);
            let packed = transposed_quarter(std::array::from_fn(|j| blk(j).add(block - 16)));
            let mut w: [__m512i; 8] = std::array::from_fn(|t| {
                let p = packed[t % 4];
                _mm512_and_si512(if t < 4 { p } else { _mm512_srli_epi16::<4>(p) }, nibble)
            });
            if FIVE {
                let base = rows.as_ptr().add(block * b + head) as *const i32;
                let qh = _mm512_i32gather_epi32::<1>(row_at, base);
                for (t, w) in w.iter_mut().enumerate() {
                    let bits = _mm512_and_si512(
                        _mm512_srlv_epi32(qh, _mm512_set1_epi32(4 * t as i32)),
                        _mm512_set1_epi32(0xF),
                    );
                    let spread = _mm512_and_si512(
                        _mm512_mullo_epi32(bits, _mm512_set1_epi32(0x0020_4081)),
                        _mm512_set1_epi32(0x0101_0101),
                    );
                    *w = _mm512_or_si512(*w, _mm512_slli_epi32::<4>(spread));
                }
            }
            WideBlock {
                w,
                d: wide_halves(blk),
                m: if MIN {
                    wide_halves(|j| blk(j).add(2))
                } else {
                    _mm512_setzero_ps()
                },
            }
        }
    };
    // SAFETY: the caller's contract.
    unsafe {
        match (MIN, FIVE) {
            (true, _) => drive_wide::<N, true, 0>(row_bytes / block, ahead, acts, r0, out, step),
            (false, false) => {
                drive_wide::<N, false, 4>(row_bytes / block, ahead, acts, r0, out, step)
            }
            (false, true) => {
                drive_wide::<N, false, 3>(row_bytes / block, ahead, acts, r0, out, step)
            }
        }
    }
}

/// The 16 bytes at each of sixteen addresses as four registers: lane `j` of register `t` holds
/// bytes `4t .. 4t + 4` from address `j` (rows `i`, `4 + i`, `8 + i`, `12 + i` share a register
/// by 128-bit chunk, then a 4 × 4 transpose of 32-bit words within each chunk).
///
/// # Safety
/// 16 readable bytes at each address; the CPU has AVX-512 F.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn transposed_quarter(at: [*const u8; 16]) -> [__m512i; 4] {
    // SAFETY: the caller's contract.
    let z: [__m512i; 4] = std::array::from_fn(|i| unsafe {
        let chunk = |c: usize| _mm_loadu_si128(at[4 * c + i] as *const __m128i);
        let z = _mm512_castsi128_si512(chunk(0));
        let z = _mm512_inserti32x4::<1>(z, chunk(1));
        let z = _mm512_inserti32x4::<2>(z, chunk(2));
        _mm512_inserti32x4::<3>(z, chunk(3))
    });
    // Per chunk: [z0 w0, z1 w0, z0 w1, z1 w1] and [z0 w2, z1 w2, z0 w3, z1 w3], likewise z2, z3.
    let (t0, t1) = (
        _mm512_unpacklo_epi32(z[0], z[1]),
        _mm512_unpackhi_epi32(z[0], z[1]),
    );
    let (t2, t3) = (
        _mm512_unpacklo_epi32(z[2], z[3]),
        _mm512_unpackhi_epi32(z[2], z[3]),
    );
    [
        _mm512_unpacklo_epi64(t0, t2),
        _mm512_unpackhi_epi64(t0, t2),
        _mm512_unpacklo_epi64(t1, t3),
        _mm512_unpackhi_epi64(t1, t3),
    ]
}

/// `Q4_K` (with `FIVE` `Q5_K`) for [`WIDE`] consecutive weight rows against every activation
/// row, sixteen outputs in the lanes as [`q8_0_wide`]: output `j` of row `r` in `out[r][j]`.
/// The weights are decoded once per block for all the rows, and no sum crosses lanes.
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL, VNNI, FMA and F16C; `rows` is [`WIDE`] rows of whole blocks of
/// the type, `acts` quantized for them with as many blocks per row, `out` holds `acts.rows`
/// rows.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn q4_k_wide<const FIVE: bool>(
    rows: &[u8],
    ahead: &[u8],
    acts: &QuantActs,
    out: &mut [[f32; WIDE]],
) {
    // SAFETY: the caller's contract.
    unsafe { by_wide_row_groups!(q4_k_wide_rows<FIVE>, acts; rows, ahead, acts, out) }
}

/// [`q4_k_wide`] for the `N` rows from `r0`. Per block: the sixteen rows' d and −dmin in the
/// lanes ([`wide_halves`]); their packed 6-bit scales and mins transposed
/// ([`transposed_quarter`]) and unpacked in 32-bit lanes as [`k4_scales_reg`] does in one row;
/// then per 32 bytes of nibbles (groups `2c` and `2c + 1`) the rows' bytes transposed
/// ([`transposed`]) and split into low nibbles (elements `4t .. 4t + 4` of group `2c` in
/// register `t`) and high ones (group `2c + 1`), with `FIVE` each element's fifth bit (bit `g`
/// of its `qh` byte) moved into bit 4. Per activation row, eight `vpdpbusd` against broadcast
/// activation quads give each lane its row's exact dot product over a group (at most
/// 32 · 31 · 128 in magnitude), `vpmulld` by the group's scale and a sum give `S1`, and
/// `vpdpwssd` of each group's min (both 16-bit halves) against the activations' two sums of 16
/// gives `S2` (exact). Then the float steps of [`super`]'s docs into the row's accumulator of
/// lane `b mod 8`, and at the end the lanes' fixed tree ([`super::lanes_total`]).
///
/// # Safety
/// As [`q4_k_wide`]; `r0 + N ≤ acts.rows`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q4_k_wide_rows<const FIVE: bool, const N: usize>(
    rows: &[u8],
    ahead: &[u8],
    acts: &QuantActs,
    out: &mut [[f32; WIDE]],
    r0: usize,
) {
    let block = q4_k_block_bytes(FIVE);
    let nibbles = if FIVE { 48 } else { 16 };
    let row_bytes = rows.len() / WIDE;
    let blocks = row_bytes / block;
    let k = acts.k;
    let (low4, low6, low2) = (
        _mm512_set1_epi8(0x0F),
        _mm512_set1_epi8(0x3F),
        _mm512_set1_epi8(0x03),
    );
    let (ones, byte, zero) = (
        _mm512_set1_epi8(1),
        _mm512_set1_epi32(0xFF),
        _mm512_setzero_si512(),
    );
    // Byte `i` of each lane of `v`, widened to the lane.
    let pick = |v: __m512i, i: usize| {
        _mm512_and_si512(_mm512_srlv_epi32(v, _mm512_set1_epi32(8 * i as i32)), byte)
    };
    // Bit `s` of each byte of `qh` moved to bit 4.
    let fifth = |qh: __m512i, s: usize| {
        let bit = _mm512_and_si512(_mm512_srlv_epi32(qh, _mm512_set1_epi32(s as i32)), ones);
        _mm512_slli_epi32::<4>(bit)
    };
    // SAFETY (whole body): every access stays inside `rows` and rows `r0 .. r0 + N` of `acts`
    // and `out` (the caller's contract).
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); 8]; N];
        for b in 0..blocks {
            // Into L2, not L1: sixteen rows of 2,048 elements (18 KiB) and the next sixteen
            // overflow a 32 KiB L1, and with `_MM_HINT_T0` streamed products of 2–4 rows ran
            // 1.4–1.7× slower than the side-by-side kernels (BENCHMARKS "The k-quants in the
            // lanes").
            prefetch_part::<_MM_HINT_T1>(ahead, b, blocks);
            let blk = |j: usize| rows.as_ptr().add(j * row_bytes + block * b);
            let d = wide_halves(blk);
            // −dmin: the sign bit flipped (an integer xor: `vxorps` on 512 bits needs AVX-512 DQ).
            let dmin = _mm512_castsi512_ps(_mm512_xor_si512(
                _mm512_castps_si512(wide_halves(|j| blk(j).add(2))),
                _mm512_set1_epi32(i32::MIN),
            ));
            let [u0, u1, u2, _] = transposed_quarter(std::array::from_fn(|j| blk(j).add(4)));
            let tops = |u: __m512i| {
                _mm512_slli_epi32::<4>(_mm512_and_si512(_mm512_srli_epi32::<6>(u), low2))
            };
            // Bytes 0–3 of each lane: groups 0–3's scales (mins); `hi`: groups 4–7's.
            let sc_lo = _mm512_and_si512(u0, low6);
            let m_lo = _mm512_and_si512(u1, low6);
            let sc_hi = _mm512_or_si512(_mm512_and_si512(u2, low4), tops(u0));
            let m_hi =
                _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32::<4>(u2), low4), tops(u1));
            let scale = |g: usize| pick(if g < 4 { sc_lo } else { sc_hi }, g % 4);
            let qh = if FIVE {
                transposed(std::array::from_fn(|j| blk(j).add(16)))
            } else {
                [zero; 8]
            };
            let mut s1 = [zero; N];
            for c in 0..4 {
                let t = transposed(std::array::from_fn(|j| blk(j).add(nibbles + 32 * c)));
                let lo: [__m512i; 8] = std::array::from_fn(|i| {
                    let w = _mm512_and_si512(t[i], low4);
                    if FIVE {
                        _mm512_or_si512(w, fifth(qh[i], 2 * c))
                    } else {
                        w
                    }
                });
                let hi: [__m512i; 8] = std::array::from_fn(|i| {
                    let w = _mm512_and_si512(_mm512_srli_epi16::<4>(t[i]), low4);
                    if FIVE {
                        _mm512_or_si512(w, fifth(qh[i], 2 * c + 1))
                    } else {
                        w
                    }
                });
                let (sa, sb) = (scale(2 * c), scale(2 * c + 1));
                for (i, s1) in s1.iter_mut().enumerate() {
                    let a = acts.q.as_ptr().add((r0 + i) * k + 256 * b + 64 * c) as *const i32;
                    *s1 = _mm512_add_epi32(*s1, scaled_groups(&lo, &hi, a, sa, sb));
                }
            }
            // Each group's min in both 16-bit halves of the lane.
            let mins: [__m512i; 8] = std::array::from_fn(|g| {
                let m = pick(if g < 4 { m_lo } else { m_hi }, g % 4);
                _mm512_or_si512(m, _mm512_slli_epi32::<16>(m))
            });
            for (i, acc) in acc.iter_mut().enumerate() {
                let sums = acts.sum16_i16.as_ptr().add(((r0 + i) * k + 256 * b) / 16) as *const i32;
                let mut s2 = zero;
                for (g, m) in mins.iter().enumerate() {
                    let pair = _mm512_set1_epi32(std::ptr::read_unaligned(sums.add(g)));
                    s2 = _mm512_dpwssd_epi32(s2, *m, pair);
                }
                let da = _mm512_set1_ps(*acts.d.get_unchecked((r0 + i) * blocks + b));
                let l = &mut acc[b % 8];
                *l = _mm512_fmadd_ps(_mm512_mul_ps(d, da), _mm512_cvtepi32_ps(s1[i]), *l);
                *l = _mm512_fmadd_ps(_mm512_mul_ps(dmin, da), _mm512_cvtepi32_ps(s2), *l);
            }
        }
        wide_totals(&acc, out, r0);
    }
}

/// `Q6_K` for [`WIDE`] consecutive weight rows against every activation row, sixteen outputs
/// in the lanes as [`q4_k_wide`]: output `j` of row `r` in `out[r][j]`.
///
/// # Safety
/// As [`q4_k_wide`], for `Q6_K`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn q6_k_wide(
    rows: &[u8],
    ahead: &[u8],
    acts: &QuantActs,
    out: &mut [[f32; WIDE]],
) {
    // SAFETY: the caller's contract.
    unsafe { by_wide_row_groups!(q6_k_wide_rows<>, acts; rows, ahead, acts, out) }
}

/// [`q6_k_wide`] for the `N` rows from `r0`. Per block: the sixteen rows' d in the lanes
/// ([`wide_halves`]) and their signed scales transposed ([`transposed_quarter`]); per half of
/// 128 elements the rows' `ql` bytes (two runs of 32, each byte the low 4 bits of two
/// elements) and `qh` bytes (32, each the high 2 bits of four) transposed ([`transposed`]), and per quarter `u` of the half the unsigned 6-bit values (`q + 32`) of
/// elements `32u + 4t .. 32u + 4t + 4` in register `t`: groups `2u` and `2u + 1` of the half.
/// Per activation row, four `vpdpbusd` per group against broadcast activation quads give each
/// lane its row's exact dot product of the unsigned values over the group (at most
/// 16 · 63 · 128), `vpmulld` by the group's scale and a sum give `Σ_g sc[g] · Σ (q + 32)·a`,
/// and `vpdpwssd` of the scales (as 16-bit pairs) against the activations' sums of 16 gives
/// `Σ_g sc[g] · Σ a`, 32 times which is taken off: `S1` exactly. Then the float step of
/// [`super`]'s docs into the row's accumulator of lane `b mod 8`, and at the end the lanes'
/// fixed tree ([`super::lanes_total`]).
///
/// # Safety
/// As [`q6_k_wide`]; `r0 + N ≤ acts.rows`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q6_k_wide_rows<const N: usize>(
    rows: &[u8],
    ahead: &[u8],
    acts: &QuantActs,
    out: &mut [[f32; WIDE]],
    r0: usize,
) {
    let row_bytes = rows.len() / WIDE;
    let blocks = row_bytes / 210;
    let k = acts.k;
    let (low4, low2, zero) = (
        _mm512_set1_epi8(0x0F),
        _mm512_set1_epi8(0x03),
        _mm512_setzero_si512(),
    );
    // Within each 32-bit lane, bytes (s0, s1, s2, s3) to (s0, s2, s1, s3), so that the 16-bit
    // halves' low bytes are s0, s1 and their high bytes s2, s3.
    let deal = _mm512_set4_epi32(0x0F0D_0E0C, 0x0B09_0A08, 0x0705_0604, 0x0301_0200);
    // SAFETY (whole body): every access stays inside `rows` and rows `r0 .. r0 + N` of `acts`
    // and `out` (the caller's contract).
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); 8]; N];
        for b in 0..blocks {
            // Into L2, as in `q4_k_wide_rows`.
            prefetch_part::<_MM_HINT_T1>(ahead, b, blocks);
            let blk = |j: usize| rows.as_ptr().add(j * row_bytes + 210 * b);
            let d = wide_halves(|j| blk(j).add(208));
            // Lane j of `sc[r]`: the signed scales 4r .. 4r + 4 of row j.
            let sc = transposed_quarter(std::array::from_fn(|j| blk(j).add(192)));
            // Group g's scale, sign-extended to the lane.
            let scale = |g: usize| {
                let shifted =
                    _mm512_sllv_epi32(sc[g / 4], _mm512_set1_epi32(24 - 8 * (g % 4) as i32));
                _mm512_srai_epi32::<24>(shifted)
            };
            let mut s1 = [zero; N];
            for half in 0..2 {
                let ql = |run: usize| {
                    transposed(std::array::from_fn(|j| blk(j).add(64 * half + 32 * run)))
                };
                let (lo, hi) = (ql(0), ql(1));
                let qh = transposed(std::array::from_fn(|j| blk(j).add(128 + 32 * half)));
                for quarter in 0..4 {
                    // Bits 2u, 2u + 1 of each high-bit byte moved to bits 4, 5.
                    let top = |qh: __m512i| match quarter {
                        0 => _mm512_slli_epi16::<4>(_mm512_and_si512(qh, low2)),
                        1 => _mm512_slli_epi16::<2>(_mm512_and_si512(qh, _mm512_set1_epi8(0x0C))),
                        2 => _mm512_and_si512(qh, _mm512_set1_epi8(0x30)),
                        _ => _mm512_srli_epi16::<2>(_mm512_and_si512(
                            qh,
                            _mm512_set1_epi8(0xC0u8 as i8),
                        )),
                    };
                    let w: [__m512i; 8] = std::array::from_fn(|t| {
                        let run = if quarter % 2 == 0 { lo[t] } else { hi[t] };
                        let nibble = if quarter < 2 {
                            run
                        } else {
                            _mm512_srli_epi16::<4>(run)
                        };
                        // (nibble & 0x0F) | top
                        _mm512_ternarylogic_epi32::<0xEA>(nibble, low4, top(qh[t]))
                    });
                    // Groups 2u and 2u + 1: elements 4t .. 4t + 4 of each in register t.
                    let (x, y) = ([w[0], w[1], w[2], w[3]], [w[4], w[5], w[6], w[7]]);
                    let g = 8 * half + 2 * quarter;
                    let (sa, sb) = (scale(g), scale(g + 1));
                    for (i, s1) in s1.iter_mut().enumerate() {
                        let a = acts
                            .q
                            .as_ptr()
                            .add((r0 + i) * k + 256 * b + 128 * half + 32 * quarter)
                            as *const i32;
                        *s1 = _mm512_add_epi32(*s1, scaled_groups(&x, &y, a, sa, sb));
                    }
                }
            }
            // Scales 2p, 2p + 1 as the 16-bit halves of `pairs[p]`.
            let pairs: [__m512i; 8] = std::array::from_fn(|p| {
                let dealt = _mm512_shuffle_epi8(sc[p / 2], deal);
                if p % 2 == 0 {
                    _mm512_srai_epi16::<8>(_mm512_slli_epi16::<8>(dealt))
                } else {
                    _mm512_srai_epi16::<8>(dealt)
                }
            });
            for (i, acc) in acc.iter_mut().enumerate() {
                let sums = acts.sum16_i16.as_ptr().add(((r0 + i) * k + 256 * b) / 16) as *const i32;
                let mut offset = zero;
                for (p, pair) in pairs.iter().enumerate() {
                    let two = _mm512_set1_epi32(std::ptr::read_unaligned(sums.add(p)));
                    offset = _mm512_dpwssd_epi32(offset, *pair, two);
                }
                let s1 = _mm512_sub_epi32(s1[i], _mm512_slli_epi32::<5>(offset));
                let da = _mm512_set1_ps(*acts.d.get_unchecked((r0 + i) * blocks + b));
                let l = &mut acc[b % 8];
                *l = _mm512_fmadd_ps(_mm512_mul_ps(d, da), _mm512_cvtepi32_ps(s1), *l);
            }
        }
        wide_totals(&acc, out, r0);
    }
}

/// Each of `N` activation rows' eight lane accumulators (sixteen outputs each) summed by the fixed
/// tree of [`super::lanes_total`], into `out[r0 + i]`.
#[inline]
#[target_feature(enable = "avx512f")]
fn wide_totals<const N: usize>(acc: &[[__m512; 8]; N], out: &mut [[f32; WIDE]], r0: usize) {
    for (l, out) in acc.iter().zip(&mut out[r0..r0 + N]) {
        let pair = |a: usize, b: usize| _mm512_add_ps(l[a], l[b]);
        let total = _mm512_add_ps(
            _mm512_add_ps(pair(0, 4), pair(2, 6)),
            _mm512_add_ps(pair(1, 5), pair(3, 7)),
        );
        // SAFETY: `out` holds sixteen floats.
        unsafe { _mm512_storeu_ps(out.as_mut_ptr(), total) };
    }
}

/// Two groups of `4 · G` elements of sixteen weight rows in the lanes against one activation row:
/// `sx · Σ x·a + sy · Σ y·a` in each lane, register `t` of `x` holding elements `4t .. 4t + 4`
/// of the first group (unsigned bytes) against the activation quad at `a + t`, `y` the second
/// group's against `a + G + t`, each group's dot product exact in 32 bits before its lane's scale
/// (`vpmulld`).
///
/// # Safety
/// `2 · G` readable 32-bit quads at `a`; the CPU has AVX-512 F and VNNI.
#[inline]
#[target_feature(enable = "avx512f,avx512vnni")]
unsafe fn scaled_groups<const G: usize>(
    x: &[__m512i; G],
    y: &[__m512i; G],
    a: *const i32,
    sx: __m512i,
    sy: __m512i,
) -> __m512i {
    // SAFETY: the caller's contract.
    let quad = |at: usize| unsafe { _mm512_set1_epi32(std::ptr::read_unaligned(a.add(at))) };
    let (mut dx, mut dy) = (_mm512_setzero_si512(), _mm512_setzero_si512());
    for t in 0..G {
        dx = _mm512_dpbusd_epi32(dx, x[t], quad(t));
        dy = _mm512_dpbusd_epi32(dy, y[t], quad(G + t));
    }
    _mm512_add_epi32(_mm512_mullo_epi32(dx, sx), _mm512_mullo_epi32(dy, sy))
}
