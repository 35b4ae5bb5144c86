//! What the x86 kernels of [`super`] share: an exact f16 load, the Q4_K/Q5_K scale unpacking,
//! row groups of up to [`LANES`](super::LANES), and [`drive`], which runs a kernel's block step
//! over a row and the float steps in the module docs' order: exact transposing lane sums, then
//! the float steps as vector operations on the lanes.

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

/// The f16 at `p` and the one after it, widened exactly (F16C), in lanes 0 and 1. One 32-bit
/// load that writes its whole register: loading a single f16 let the compiler merge it into a
/// register the float steps had just written (`vpinsrw`), which chained every block's float
/// steps to the previous block's.
///
/// # Safety
/// Four readable bytes at `p`; the CPU has F16C.
#[inline]
#[target_feature(enable = "f16c")]
pub(super) unsafe fn halves(p: *const u8) -> __m128 {
    // SAFETY: the caller's contract.
    let bits = unsafe { std::ptr::read_unaligned(p as *const i32) };
    _mm_cvtph_ps(_mm_cvtsi32_si128(bits))
}

/// The f16 at each of eight addresses, widened exactly (F16C), in lanes 0–7: scalar loads
/// combined into one register.
///
/// # Safety
/// Two readable bytes at each address; the CPU has AVX2 and F16C.
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn halves_of(at: [*const u8; 8]) -> __m256 {
    // SAFETY: the caller's contract.
    let h = |j: usize| u64::from(unsafe { std::ptr::read_unaligned(at[j] as *const u16) });
    let word = |j: usize| (h(j) | h(j + 1) << 16 | h(j + 2) << 32 | h(j + 3) << 48) as i64;
    _mm256_cvtph_ps(_mm_set_epi64x(word(4), word(0)))
}

/// Asks for part `b` of `parts` equal parts of `ahead` (the next call's weights, one contiguous
/// range) to be loaded into the cache level `HINT` names (a hint; no effect on results).
#[inline]
pub(super) fn prefetch_part<const HINT: i32>(ahead: &[u8], b: usize, parts: usize) {
    let part = ahead.len().div_ceil(parts);
    let bytes = ahead
        .get(part * b..ahead.len().min(part * (b + 1)))
        .unwrap_or(&[]);
    for line in bytes.chunks(64) {
        // SAFETY: prefetching is a hint on a valid address and never faults.
        unsafe { _mm_prefetch::<HINT>(line.as_ptr() as *const i8) };
    }
}

/// Bytes of a `Q4_K` block, or with `five` of a `Q5_K` one (the same header, then 32 bytes of
/// fifth bits, then the nibbles): ggml's `block_q4_K` and `block_q5_K`.
pub(super) const fn q4_k_block_bytes(five: bool) -> usize {
    if five {
        176
    } else {
        144
    }
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

/// `v`'s two 128-bit halves added lane by lane (exact).
#[inline]
#[target_feature(enable = "avx2")]
fn halves_added(v: __m256i) -> __m128i {
    _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v))
}

/// The last step of an 8-vector transposing tree: `lo`'s halves added in lanes 0–3, `hi`'s in
/// lanes 4–7 (exact).
#[inline]
#[target_feature(enable = "avx2")]
fn halves_joined(lo: __m256i, hi: __m256i) -> __m256i {
    _mm256_add_epi32(
        _mm256_permute2x128_si256::<0x20>(lo, hi),
        _mm256_permute2x128_si256::<0x31>(lo, hi),
    )
}

/// The sum of the 8 lanes (exact).
#[inline]
#[target_feature(enable = "avx2")]
fn hsum(v: __m256i) -> i32 {
    let x = halves_added(v);
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
        return _mm256_castsi128_si256(halves_added(b0));
    }
    let a2 = _mm256_hadd_epi32(at(4), at(5));
    let a3 = _mm256_hadd_epi32(at(6), at(7));
    halves_joined(b0, _mm256_hadd_epi32(a2, a3))
}

/// The lane sums of eight consecutive blocks' integer vectors, built as the blocks come (a
/// transposing tree of `vphaddd`, exact): after block 7, lane `c` holds block `c`'s sum (after
/// block 3, [`Tree::four`] gives blocks 0–3's). Three registers; [`tree_rows`] keeps one per
/// row and kind of sum.
#[derive(Clone, Copy)]
pub(super) struct Tree {
    /// The latest even block's vector.
    last: __m256i,
    /// Blocks 0–1 (or 4–5) summed pairwise.
    pair: __m256i,
    /// Blocks 0–3 summed by 128-bit half; after block 7, the result.
    quad: __m256i,
}

impl Tree {
    #[inline]
    #[target_feature(enable = "avx2")]
    fn new() -> Tree {
        let zero = _mm256_setzero_si256();
        Tree {
            last: zero,
            pair: zero,
            quad: zero,
        }
    }

    /// Adds block `c`'s vector (`c` counts 0 to 7 across calls; a constant where it is called,
    /// so the branches fold).
    #[inline]
    #[target_feature(enable = "avx2")]
    fn push(&mut self, c: usize, v: __m256i) {
        if c & 1 == 0 {
            self.last = v;
            return;
        }
        // The latest two blocks' adjacent lanes summed, by 128-bit half.
        let p = _mm256_hadd_epi32(self.last, v);
        if c & 2 == 0 {
            self.pair = p;
            return;
        }
        // Lane j < 4 of each half: block 4 · (c / 4) + j's half summed.
        let q = _mm256_hadd_epi32(self.pair, p);
        self.quad = if c & 4 == 0 {
            q
        } else {
            halves_joined(self.quad, q)
        };
    }

    /// Blocks 0–3's sums in lanes 0–3, zeros above, once blocks 0–3 were pushed.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn four(self) -> __m256i {
        _mm256_zextsi128_si256(halves_added(self.quad))
    }
}

/// One weight block against `N` activation rows, as a kernel's block step gives it to
/// [`drive`]: the block's float factors and, per row, vectors whose lane sums are `S1` and `S2`
/// (exact).
pub(super) struct BlockSums<const N: usize> {
    /// `d` in lane 0, `dmin` in lane 1.
    pub f: __m128,
    pub s1: [__m256i; N],
    pub s2: [__m256i; N],
}

/// Runs a kernel's block step over a row of `blocks` weight blocks against activation rows
/// `r0..r0 + N` and writes their outputs to `acc[r0..r0 + N]` in the module docs' order (the
/// second float step only with `MINS`): [`tree_rows`] for up to [`TREE_ROWS`] rows,
/// [`several_rows`] for more.
///
/// # Safety
/// The CPU has AVX2 and FMA; rows `r0..r0 + N` of `acts` have `blocks` blocks each; `acc` has
/// `acts.lanes` floats and `r0` is a multiple of [`LANES`](super::LANES) (several rows write
/// all eight of theirs); `block` is safe to call for every block of the row.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn drive<const N: usize, const MINS: bool>(
    blocks: usize,
    acts: &super::QuantActs,
    r0: usize,
    acc: &mut [f32],
    block: impl FnMut(usize) -> BlockSums<N>,
) {
    // SAFETY: the caller's contract.
    unsafe {
        if N <= TREE_ROWS {
            tree_rows::<N, MINS>(blocks, acts, r0, acc, block);
        } else {
            several_rows::<N, MINS>(blocks, acts, r0, acc, block);
        }
    }
}

/// Row groups up to this size run [`tree_rows`] (each row its own trees: one tree step per
/// block and row); larger ones [`several_rows`] (one transposing tree per block, shared by the
/// rows). Per-row trees for 4 rows measured slower than the shared tree (Zen 4: 768 × 2048
/// Q4_K 106 against 99–110 µs, 2048 × 768 133 against 104–127), their registers overflowing.
const TREE_ROWS: usize = 2;

/// [`drive`] for a few rows: eight blocks at a time, each row's sums by its own [`Tree`] and its
/// float steps as one vector operation on its lanes.
///
/// # Safety
/// As [`drive`].
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn tree_rows<const N: usize, const MINS: bool>(
    blocks: usize,
    acts: &super::QuantActs,
    r0: usize,
    acc: &mut [f32],
    mut block: impl FnMut(usize) -> BlockSums<N>,
) {
    let zero = _mm256_setzero_si256();
    let mut lanes = [_mm256_setzero_ps(); N];
    for b0 in (0..blocks).step_by(8) {
        let n = (blocks - b0).min(8);
        let (mut t1, mut t2) = ([Tree::new(); N], [Tree::new(); N]);
        let (mut d, mut dmin) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        // Blocks b0 + c written out for each c, so that the tree steps and lanes are constants.
        macro_rules! at {
            ($($c:literal)*) => {$(
                if $c < n {
                    let o = block(b0 + $c);
                    d = _mm256_blend_ps::<{ 1 << $c }>(d, _mm256_broadcastss_ps(o.f));
                    for i in 0..N {
                        t1[i].push($c, o.s1[i]);
                    }
                    if MINS {
                        let fmin = _mm256_broadcastss_ps(_mm_movehdup_ps(o.f));
                        dmin = _mm256_blend_ps::<{ 1 << $c }>(dmin, fmin);
                        for i in 0..N {
                            t2[i].push($c, o.s2[i]);
                        }
                    }
                } else {
                    for i in 0..N {
                        t1[i].push($c, zero);
                        if MINS {
                            t2[i].push($c, zero);
                        }
                    }
                }
            )*};
        }
        at!(0 1 2 3);
        let wide = n > 4;
        if wide {
            at!(4 5 6 7);
        }
        let sums = |t: Tree| if wide { t.quad } else { t.four() };
        for i in 0..N {
            // SAFETY: blocks b0..b0 + n of row r0 + i (the caller's contract).
            let da = unsafe { load_lanes(acts.d.as_ptr().add((r0 + i) * blocks + b0), n) };
            let s1 = _mm256_cvtepi32_ps(sums(t1[i]));
            lanes[i] = _mm256_fmadd_ps(_mm256_mul_ps(d, da), s1, lanes[i]);
            if MINS {
                let s2 = _mm256_cvtepi32_ps(sums(t2[i]));
                lanes[i] = _mm256_fmadd_ps(_mm256_mul_ps(dmin, da), s2, lanes[i]);
            }
        }
    }
    for (i, &v) in lanes.iter().enumerate() {
        acc[r0 + i] = lanes_total(v);
    }
}

/// [`drive`] for more than [`TREE_ROWS`] rows.
///
/// # Safety
/// As [`drive`].
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn several_rows<const N: usize, const MINS: bool>(
    blocks: usize,
    acts: &super::QuantActs,
    r0: usize,
    acc: &mut [f32],
    mut block: impl FnMut(usize) -> BlockSums<N>,
) {
    // Lane i of accumulator l (floats 8l..8l + 8): row r0 + i's, which sums blocks l, l + 8, …
    // in turn. In memory, each written once: an array of registers indexed by `l` compiles to
    // blends, and one written out for each `l` overflows the registers.
    let mut lanes = [0.0f32; 64];
    for l in 0..8 {
        let mut v = _mm256_setzero_ps();
        for b in (l..blocks).step_by(8) {
            let o = block(b);
            // SAFETY: block b of rows r0..r0 + N (the caller's contract; the layout pads to
            // LANES rows).
            let da = unsafe { _mm256_loadu_ps(acts.d_by_block.as_ptr().add(b * acts.lanes + r0)) };
            v = fma_rows(v, _mm256_broadcastss_ps(o.f), da, hsum_rows(&o.s1));
            if MINS {
                let dmin = _mm256_broadcastss_ps(_mm_movehdup_ps(o.f));
                v = fma_rows(v, dmin, da, hsum_rows(&o.s2));
            }
        }
        // SAFETY: floats 8l..8l + 8 of `lanes`.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr().add(8 * l), v) };
    }
    // SAFETY: 8 floats each.
    let total = lanes_tree(std::array::from_fn(|l| unsafe {
        _mm256_loadu_ps(lanes.as_ptr().add(8 * l))
    }));
    // SAFETY: `acc` holds `acts.lanes` floats and r0 + 8 ≤ `acts.lanes` (r0 is a multiple of
    // LANES); lanes past N are written and never read.
    unsafe { _mm256_storeu_ps(acc.as_mut_ptr().add(r0), total) };
}

/// Defines `$name`, the side-by-side driver for kernels with the target features `$features`
/// (its block step inlines only into a function with at least its kernel's features).
macro_rules! drive_cols_for {
    ($(#[$doc:meta])* $name:ident, $features:literal) => {
        $(#[$doc])*
        #[inline]
        #[target_feature(enable = $features)]
        pub(super) unsafe fn $name<const N: usize, const MINS: bool>(
            blocks: usize,
            acts: &super::QuantActs,
            r0: usize,
            ahead: &[u8],
            out: &mut [[f32; super::COLS]],
            mut block: impl FnMut(usize, usize) -> BlockSums<N>,
        ) {
            let mut lanes = [[_mm256_setzero_ps(); 8]; N];
            for b in 0..blocks {
                prefetch_part::<_MM_HINT_T0>(ahead, b, blocks);
                // Plain loops, not `array::from_fn`: a closure handed to a function without this
                // function's target features is not inlined into it (a call per row and block).
                let zero = _mm256_setzero_si256();
                let mut f = [_mm_setzero_ps(); 8];
                let (mut s1, mut s2) = ([[zero; 8]; N], [[zero; 8]; N]);
                for j in 0..8 {
                    let o = block(j, b);
                    f[j] = o.f;
                    for i in 0..N {
                        (s1[i][j], s2[i][j]) = (o.s1[i], o.s2[i]);
                    }
                }
                let (d, dmin) = factors(f);
                let l = b % 8;
                for i in 0..N {
                    // SAFETY: block b of activation row r0 + i (the caller's contract).
                    let da = unsafe { *acts.d.get_unchecked((r0 + i) * blocks + b) };
                    let da = _mm256_set1_ps(da);
                    lanes[i][l] = fma_rows(lanes[i][l], d, da, hsum_rows::<8>(&s1[i]));
                    if MINS {
                        lanes[i][l] = fma_rows(lanes[i][l], dmin, da, hsum_rows::<8>(&s2[i]));
                    }
                }
            }
            for (o, l) in out.iter_mut().zip(lanes) {
                // SAFETY: 8 floats.
                unsafe { _mm256_storeu_ps(o.as_mut_ptr(), lanes_tree(l)) };
            }
        }
    };
}

drive_cols_for! {
    /// Runs a kernel's block step (`block(j, b)`: block `b` of weight row `j` against the `N`
    /// activation rows from `r0`) over [`COLS`](super::COLS) weight rows of `blocks` blocks and
    /// writes their outputs to `out`, output `j` of activation row `r0 + i` in lane `j` of
    /// `out[i]`: per block and activation row the weight rows' integer vectors summed by one
    /// transposing tree (exact) and their float steps as one vector operation into that row's
    /// accumulator `b mod 8`, then the module docs' tree of the eight accumulators (the lanes
    /// past the row's blocks +0, as in the reference). `ahead` (the next call's rows) is read
    /// ahead a part per block.
    ///
    /// # Safety
    /// The CPU has AVX-512 F/BW/VL, VNNI, FMA and F16C (the VNNI kernels' features, so that
    /// their block step inlines here); `acts` has rows `r0..r0 + N` of `blocks` blocks; `out` is
    /// `N` long; `block` is safe to call for every weight row `j < COLS` and block `b < blocks`.
    drive_cols, "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c"
}

drive_cols_for! {
    /// [`drive_cols`] for the AVX2 kernels.
    ///
    /// # Safety
    /// As [`drive_cols`], on a CPU with AVX2, FMA and F16C.
    drive_cols_avx2, "avx2,fma,f16c"
}

/// Eight vectors of accumulators (accumulator `l` of eight outputs in vector `l`) summed lane
/// by lane in the module docs' order: `((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7))`.
#[inline]
#[target_feature(enable = "avx2")]
fn lanes_tree(l: [__m256; 8]) -> __m256 {
    let add = _mm256_add_ps;
    add(
        add(add(l[0], l[4]), add(l[2], l[6])),
        add(add(l[1], l[5]), add(l[3], l[7])),
    )
}

/// Eight weight rows' float factors of one block ([`BlockSums::f`]: `d` in lane 0, `dmin` in
/// lane 1) as one vector of the `d`s and one of the `dmin`s, row `j` in lane `j`.
#[inline]
#[target_feature(enable = "avx2")]
fn factors(f: [__m128; 8]) -> (__m256, __m256) {
    // [d_a, d_b, dmin_a, dmin_b] for the pairs (0, 1), (2, 3), (4, 5), (6, 7).
    let p: [__m128; 4] = std::array::from_fn(|i| _mm_unpacklo_ps(f[2 * i], f[2 * i + 1]));
    let d = _mm256_set_m128(_mm_movelh_ps(p[2], p[3]), _mm_movelh_ps(p[0], p[1]));
    let dmin = _mm256_set_m128(_mm_movehl_ps(p[3], p[2]), _mm_movehl_ps(p[1], p[0]));
    (d, dmin)
}

/// One float step of the module docs for [`LANES`](super::LANES) rows' accumulators `acc`:
/// `acc = fma(d · da, f32(s), acc)` lane by lane, `d` broadcast, `da` the rows' activation
/// scales.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) fn fma_rows(acc: __m256, d: __m256, da: __m256, s: __m256i) -> __m256 {
    _mm256_fmadd_ps(_mm256_mul_ps(d, da), _mm256_cvtepi32_ps(s), acc)
}

/// The first `n` (at most 8) floats at `p` in lanes `0..n`, zeros above.
///
/// # Safety
/// `n` readable floats at `p`; the CPU has AVX2.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn load_lanes(p: *const f32, n: usize) -> __m256 {
    let lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    let mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(n as i32), lane);
    // SAFETY: the caller's contract; masked-off lanes are not read.
    unsafe { _mm256_maskload_ps(p, mask) }
}

/// An output's eight lane accumulators summed in the module docs' order (as
/// [`super::lanes_total`]): `((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7))`.
#[inline]
#[target_feature(enable = "avx2")]
fn lanes_total(v: __m256) -> f32 {
    // [l0 + l4, l1 + l5, l2 + l6, l3 + l7]
    let x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    // [x0 + x2, x1 + x3, …]
    let y = _mm_add_ps(x, _mm_movehl_ps(x, x));
    _mm_cvtss_f32(_mm_add_ss(y, _mm_movehdup_ps(y)))
}

/// Runs `$kernel::<N>($args…)` for each group of up to [`LANES`](super::LANES) rows of `$acts`, `N` the
/// group's row count, the group's first row passed last.
macro_rules! by_row_groups {
    ($kernel:ident <$($g:ident),*>, $acts:expr; $($arg:expr),*) => {
        $crate::kernels::quant::x86::by_row_groups!(@from 0, $kernel<$($g),*>, $acts; $($arg),*)
    };
    // The same for the rows from `$start`.
    (@from $start:expr, $kernel:ident <$($g:ident),*>, $acts:expr; $($arg:expr),*) => {{
        let rows = $acts.rows;
        for r0 in ($start..rows).step_by($crate::kernels::quant::LANES) {
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

/// [`by_row_groups`] for a kernel whose per-block preparation is dear (the k-quants in the
/// lanes): whole groups of 16 rows first (`N` = 16: the preparation shared by twice the rows),
/// then the rest by [`by_row_groups`].
macro_rules! by_wide_row_groups {
    ($kernel:ident <$($g:ident),*>, $acts:expr; $($arg:expr),*) => {{
        let whole = $acts.rows / 16 * 16;
        for r0 in (0..whole).step_by(16) {
            $kernel::<$($g,)* 16>($($arg,)* r0);
        }
        $crate::kernels::quant::x86::by_row_groups!(@from whole, $kernel<$($g),*>, $acts; $($arg),*)
    }};
}
pub(super) use by_wide_row_groups;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::tests::lcg;

    #[test]
    fn the_q4_k_and_q5_k_block_sizes_are_the_types_own() {
        use specfit_gguf::GgmlType;
        assert_eq!(q4_k_block_bytes(false), GgmlType::Q4_K.block().1);
        assert_eq!(q4_k_block_bytes(true), GgmlType::Q5_K.block().1);
    }

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
