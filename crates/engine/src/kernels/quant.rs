//! Quantized matrices: a GGUF file's rows kept exactly as stored (its blocks, row-major, no
//! repacking), multiplied by activations quantized per row to 8-bit blocks, as llama.cpp does:
//! 256-element blocks with an f32 scale (llama.cpp's `q8_K`) for the k-quants, 32-element blocks
//! with an f16 scale (`q8_0`) for the others.
//!
//! **Order of operations** (the same for every instruction set, every batch size and every
//! thread split, so results are batch-invariant like the float kernels): for output `(r, j)`,
//! `acc = +0`, then for each block `b` of row `j` in increasing order, with the block's integers
//! `q`, integer sub-scales `sc[g]`, mins `m[g]` and float factors `d`, `dmin`
//! ([`specfit_gguf::dequant::split_block`]) and the activation block's integers `a` and scale
//! `da`:
//! - `S1 = Σ_g sc[g] · Σ_{i∈g} q[i]·a[i]` and `S2 = Σ_g m[g] · Σ_{i∈g} a[i]`, exact in i32;
//! - `acc = fma(d·da, f32(S1), acc)`, then, for types with mins, `acc = fma(dmin·da, f32(S2),
//!   acc)`.
//!
//! The integer sums are exact whatever order a SIMD kernel adds them in, and the float steps are
//! one fixed sequence per output, so the AVX-512 VNNI kernels (Q4_K, Q6_K), the AVX2 ones (Q4_K,
//! Q6_K, Q8_0) and the portable reference ([`block_reference`]) give identical bits; tests hold
//! them to it. Each row's activations are quantized from that row alone, so no row depends on
//! another.
//!
//! The results are not those of the f32 kernels on the dequantized matrix (the activations are
//! rounded to 8 bits): `--weights f32` decodes every matrix for that exact path.

use specfit_gguf::dequant::{int_groups, split_block, IntGroups};
use specfit_gguf::GgmlType;

use super::Isa;

/// Bytes of the row-major `n × k` matrix of GGUF type `ty`, if `ty` has an integer form and `k`
/// is whole blocks.
pub fn rows_len(ty: GgmlType, n: usize, k: usize) -> Option<usize> {
    int_groups(ty)?;
    let (elems, bytes) = ty.block();
    k.is_multiple_of(elems).then(|| n * (k / elems) * bytes)
}

/// A quantized `n × k` matrix (GGUF rows), owned.
#[derive(Debug, Clone, PartialEq)]
pub struct QuantMatrix {
    n: usize,
    k: usize,
    ty: GgmlType,
    data: Vec<u8>,
}

impl QuantMatrix {
    /// Keeps the row-major `n × k` matrix `bytes` of GGUF type `ty` (each row whole blocks).
    /// `None` when `ty` has no integer form (float types go to [`super::PackedMatrix`]).
    ///
    /// # Panics
    /// When `bytes` is not `n × k` of `ty`.
    pub fn from_gguf(ty: GgmlType, bytes: &[u8], n: usize, k: usize) -> Option<QuantMatrix> {
        let len = rows_len(ty, n, k)?;
        assert_eq!(
            bytes.len(),
            len,
            "{} bytes are not {n} × {k} {}",
            bytes.len(),
            ty.name()
        );
        Some(QuantMatrix {
            n,
            k,
            ty,
            data: bytes.to_vec(),
        })
    }

    /// A borrowed view.
    pub fn view(&self) -> QuantView<'_> {
        QuantView::new(self.ty, self.n, self.k, &self.data)
    }
}

/// A quantized `n × k` matrix held elsewhere (an expert slot, a mapped file).
#[derive(Debug, Clone, Copy)]
pub struct QuantView<'a> {
    ty: GgmlType,
    n: usize,
    k: usize,
    form: IntGroups,
    data: &'a [u8],
}

impl<'a> QuantView<'a> {
    /// Views [`rows_len`]`(ty, n, k)` bytes of GGUF rows.
    ///
    /// # Panics
    /// When `ty` has no integer form or `data` is not `n × k` of it.
    pub fn new(ty: GgmlType, n: usize, k: usize, data: &'a [u8]) -> QuantView<'a> {
        let len = rows_len(ty, n, k).expect("a type with an integer form, whole blocks");
        assert_eq!(data.len(), len, "quantized rows are not n × k");
        QuantView {
            ty,
            n,
            k,
            form: int_groups(ty).expect("checked"),
            data,
        }
    }

    /// The GGUF type.
    pub fn ty(&self) -> GgmlType {
        self.ty
    }

    /// The rows' bytes.
    pub fn bytes(&self) -> &'a [u8] {
        self.data
    }

    /// The matrix decoded, row-major `n × k`.
    pub fn dequantized(&self) -> Vec<f32> {
        let mut out = vec![0.0f32; self.n * self.k];
        specfit_gguf::dequant::dequantize(self.ty, self.data, &mut out).expect("an integer type");
        out
    }

    /// `out = x · Wᵀ` for `x` of `rows × k`, split by output across the worker pool when large
    /// enough (which never changes a bit).
    pub fn gemm(&self, x: &[f32], rows: usize, out: &mut [f32]) {
        self.gemm_with(Isa::detected(), x, rows, out, true);
    }

    /// [`QuantView::gemm`] on the calling thread only.
    pub fn gemm_serial(&self, x: &[f32], rows: usize, out: &mut [f32]) {
        self.gemm_with(Isa::detected(), x, rows, out, false);
    }

    /// [`QuantView::gemm`] with the kernels of `isa` (the VNNI kernels need AVX-512 and VNNI;
    /// otherwise the reference runs), on the worker pool when `parallel`.
    pub fn gemm_with(&self, isa: Isa, x: &[f32], rows: usize, out: &mut [f32], parallel: bool) {
        let acts = QuantActs::quantize(self.ty, x, rows, self.k);
        self.gemm_quantized(isa, &acts, out, parallel);
    }

    /// [`QuantView::gemm_with`] on activations already quantized for this matrix's type
    /// ([`QuantActs::quantize`]; matrices of types with the same activation blocks can share
    /// them).
    pub fn gemm_quantized(&self, isa: Isa, acts: &QuantActs, out: &mut [f32], parallel: bool) {
        let (n, rows) = (self.n, acts.rows);
        assert_eq!(acts.k, self.k, "activations are not rows × k");
        assert_eq!(
            acts.block,
            act_block(self.ty),
            "activations quantized for another type"
        );
        assert_eq!(out.len(), rows * n, "out is not rows × n");
        let pool = crate::threads::pool();
        let parts = pool.threads();
        let target = crate::threads::SharedOut(out.as_mut_ptr());
        if !parallel || parts == 1 || rows * n * self.k < super::PARALLEL_MIN_MACS || n < 2 * parts
        {
            // SAFETY: `target` holds `rows × n` floats (checked above).
            unsafe { self.gemm_cols(isa, acts, 0..n, target.get()) };
            return;
        }
        pool.run(&|part| {
            let cols = n * part / parts..n * (part + 1) / parts;
            // SAFETY: as above; the parts write disjoint columns.
            unsafe { self.gemm_cols(isa, acts, cols, target.get()) };
        });
    }

    /// Outputs `cols` of every row into `out` (`rows × n`).
    ///
    /// # Safety
    /// `out` points to `acts.rows × n` floats.
    unsafe fn gemm_cols(
        &self,
        isa: Isa,
        acts: &QuantActs,
        cols: std::ops::Range<usize>,
        out: *mut f32,
    ) {
        let (elems, block_bytes) = self.ty.block();
        let blocks = self.k / elems;
        let row_bytes = blocks * block_bytes;
        let mut acc = vec![0.0f32; acts.rows];
        let fast = fast_kernel(isa, self.ty);
        for j in cols {
            acc.fill(0.0);
            let row = &self.data[j * row_bytes..(j + 1) * row_bytes];
            match fast {
                // SAFETY: `fast_kernel` only returns a kernel the CPU can run; `row` is whole
                // blocks of the kernel's type and `acts` was quantized for it.
                Some(kernel) => unsafe { kernel(row, acts, &mut acc) },
                None => {
                    for (b, block) in row.chunks_exact(block_bytes).enumerate() {
                        block_reference(self.ty, self.form, block, acts, b, &mut acc);
                    }
                }
            }
            for (r, &v) in acc.iter().enumerate() {
                // SAFETY: `(r, j)` is inside `out` (the caller's contract).
                unsafe { *out.add(r * self.n + j) = v };
            }
        }
    }
}

/// Activation rows quantized to 8-bit blocks for one weight type's products.
#[derive(Debug, Clone, PartialEq)]
pub struct QuantActs {
    /// Elements per block: 256 (`q8_K`) or 32 (`q8_0`).
    block: usize,
    rows: usize,
    k: usize,
    /// `rows × k` integers.
    q: Vec<i8>,
    /// One scale per block, `rows × k / block`.
    d: Vec<f32>,
    /// Sums of `q` over each 16 consecutive elements, `rows × k / 16`.
    sum16: Vec<i32>,
}

/// Elements per activation block for weights of `ty`.
fn act_block(ty: GgmlType) -> usize {
    ty.block().0
}

impl QuantActs {
    /// Quantizes the `rows × k` activations `x` for products with weights of `ty` (`k` whole
    /// blocks of `ty`), each row on its own.
    pub fn quantize(ty: GgmlType, x: &[f32], rows: usize, k: usize) -> QuantActs {
        let block = act_block(ty);
        assert_eq!(x.len(), rows * k, "x is not rows × k");
        assert!(
            k.is_multiple_of(block),
            "k {k} is not whole blocks of {block}"
        );
        let mut acts = QuantActs {
            block,
            rows,
            k,
            q: vec![0; rows * k],
            d: vec![0.0; rows * k / block],
            sum16: vec![0; rows * k / 16],
        };
        for (b, (xs, qs)) in x
            .chunks_exact(block)
            .zip(acts.q.chunks_exact_mut(block))
            .enumerate()
        {
            acts.d[b] = if block == 256 {
                quantize_q8_k(xs, qs)
            } else {
                quantize_q8_0(xs, qs)
            };
        }
        for (s, qs) in acts.sum16.iter_mut().zip(acts.q.chunks_exact(16)) {
            *s = qs.iter().map(|&v| v as i32).sum();
        }
        acts
    }

    /// Row `r`'s block `b`: its integers and scale.
    fn block(&self, r: usize, b: usize) -> (&[i8], f32) {
        let blocks = self.k / self.block;
        let at = r * self.k + b * self.block;
        (&self.q[at..at + self.block], self.d[r * blocks + b])
    }
}

/// llama.cpp's `quantize_row_q8_K_ref` on one block of 256: the element of largest magnitude
/// maps to −127, `q = round_half_even(x · (−127 / max))` (at most 127); returns `1 / iscale`.
fn quantize_q8_k(x: &[f32], q: &mut [i8]) -> f32 {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax == 0.0 {
        q.fill(0);
        return 0.0;
    }
    let iscale = -127.0 / max;
    for (qv, &v) in q.iter_mut().zip(x) {
        *qv = (iscale * v).round_ties_even().min(127.0) as i8;
    }
    1.0 / iscale
}

/// llama.cpp's `quantize_row_q8_0_ref` on one block of 32: `d = amax / 127` (kept as f16, as
/// llama.cpp stores it), `q = round(x / d)` with halves away from zero; returns the f16 `d`.
fn quantize_q8_0(x: &[f32], q: &mut [i8]) -> f32 {
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    for (qv, &v) in q.iter_mut().zip(x) {
        *qv = (v * id).round() as i8;
    }
    half::f16::from_f32(d).to_f32()
}

/// One weight block `w` (block `b` of its row) against block `b` of every activation row, added
/// to `acc` (one per row) in the order the module docs give. The oracle of the fast kernels.
pub(crate) fn block_reference(
    ty: GgmlType,
    form: IntGroups,
    w: &[u8],
    acts: &QuantActs,
    b: usize,
    acc: &mut [f32],
) {
    let elems = acts.block;
    let groups = elems / form.group;
    let (mut q, mut sc, mut mn) = ([0i8; 256], [0i32; 16], [0i32; 16]);
    let f = split_block(ty, w, &mut q[..elems], &mut sc[..groups], &mut mn[..groups]);
    for (r, acc) in acc.iter_mut().enumerate() {
        let (a, da) = acts.block(r, b);
        let (mut s1, mut s2) = (0i32, 0i32);
        for g in 0..groups {
            let range = g * form.group..(g + 1) * form.group;
            let dot: i32 = q[range.clone()]
                .iter()
                .zip(&a[range.clone()])
                .map(|(&w, &a)| w as i32 * a as i32)
                .sum();
            let sum: i32 = a[range].iter().map(|&a| a as i32).sum();
            s1 += sc[g] * dot;
            s2 += mn[g] * sum;
        }
        *acc = (f.d * da).mul_add(s1 as f32, *acc);
        if form.offset {
            *acc = (f.dmin * da).mul_add(s2 as f32, *acc);
        }
    }
}

/// A whole row of weights against every activation row, added to `acc`.
type RowKernel = unsafe fn(&[u8], &QuantActs, &mut [f32]);

/// The fast kernel for `ty` on `isa`: the VNNI kernels on AVX-512 with VNNI, the AVX2 ones
/// (`vpmaddubsw`, whose 16-bit pair sums cannot saturate on these types) on AVX2 or on AVX-512
/// without VNNI; `None` (the reference) otherwise.
fn fast_kernel(isa: Isa, ty: GgmlType) -> Option<RowKernel> {
    #[cfg(target_arch = "x86_64")]
    {
        if isa == Isa::Avx512 && has_vnni() {
            match ty {
                GgmlType::Q4_K => return Some(vnni::q4_k),
                GgmlType::Q6_K => return Some(vnni::q6_k),
                // The others run the AVX2 kernels (for Q8_0 measured faster than a `vpdpbusd`
                // one: one horizontal sum per 32 weights either way).
                _ => {}
            }
        }
        if matches!(isa, Isa::Avx2 | Isa::Avx512) && std::arch::is_x86_feature_detected!("f16c") {
            return match ty {
                GgmlType::Q4_K => Some(avx2::q4_k::<false>),
                GgmlType::Q5_K => Some(avx2::q4_k::<true>),
                GgmlType::Q6_K => Some(avx2::q6_k),
                GgmlType::Q8_0 => Some(avx2::q8_0),
                GgmlType::Q4_0 => Some(avx2::legacy::<false, false>),
                GgmlType::Q4_1 => Some(avx2::legacy::<false, true>),
                GgmlType::Q5_0 => Some(avx2::legacy::<true, false>),
                GgmlType::Q5_1 => Some(avx2::legacy::<true, true>),
                _ => None,
            };
        }
    }
    let _ = (isa, ty);
    None
}

/// Whether the running CPU has AVX-512 VNNI (cached).
#[cfg(target_arch = "x86_64")]
fn has_vnni() -> bool {
    static VNNI: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *VNNI.get_or_init(|| {
        std::arch::is_x86_feature_detected!("avx512vnni")
            && std::arch::is_x86_feature_detected!("f16c")
    })
}

/// What the x86 kernels share.
#[cfg(target_arch = "x86_64")]
mod x86 {
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
}

/// The fast kernels: weights decoded to unsigned bytes in registers, `vpdpbusd` (unsigned ×
/// signed bytes, four products per 32-bit lane) against the activation bytes, integer scales
/// applied per lane, the lanes summed (exactly), then the float steps of the module docs.
#[cfg(target_arch = "x86_64")]
mod vnni {
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
    /// quantized for `Q4_K` with as many blocks per row, `acc` one per activation row.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")]
    pub(super) unsafe fn q4_k(row: &[u8], acts: &QuantActs, acc: &mut [f32]) {
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
                finish_rows(acc, (d, Some(dmin)), da, lanes);
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
                    let v1 =
                        _mm256_or_si256(_mm256_and_si256(ql1, m4), high(_mm256_srli_epi16(qh, 2)));
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
                finish_rows(acc, (d, None), da, lanes);
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
        (d, dmin): (f32, Option<f32>),
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
}

/// The AVX2 kernels: the VNNI kernels' integer sums with `vpmaddubsw` (unsigned × signed bytes,
/// adjacent products summed to 16 bits: at most 2 · 63 · 127 for these types' unsigned weights,
/// or 2 · 128 · 127 for Q8_0's through the sign trick, so never saturated) and `vpmaddwd` (the
/// integer scales, or ones, summed to 32 bits); the same exact sums, so the same bits.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::x86::{half, k4_scales};
    use super::QuantActs;
    use std::arch::x86_64::*;

    /// The sum of the 8 lanes (exact).
    #[inline]
    #[target_feature(enable = "avx2")]
    fn hsum(v: __m256i) -> i32 {
        let x = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
        let x = _mm_add_epi32(x, _mm_shuffle_epi32::<0b01_00_11_10>(x));
        let x = _mm_add_epi32(x, _mm_shuffle_epi32::<0b10_11_00_01>(x));
        _mm_cvtsi128_si32(x)
    }

    /// One activation row's 256-element block at `at` against a k-quant block decoded to 8
    /// registers of unsigned bytes (32 elements each, 16-bit scales per pair of 16): the scaled
    /// dot products, and the block's 16 activation sums times `per_sum` (8 + 8 i32 factors),
    /// each as 8 lanes to be summed.
    ///
    /// # Safety
    /// The CPU has AVX2; `at` is a block start inside `acts`.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn k_row(
        w: &[__m256i; 8],
        scale: &[__m256i; 8],
        acts: &QuantActs,
        at: usize,
        per_sum: &[__m256i; 2],
    ) -> (__m256i, __m256i) {
        // SAFETY: the caller's contract.
        unsafe {
            let a = acts.q.as_ptr().add(at);
            let mut sum = _mm256_setzero_si256();
            for v in 0..8 {
                let av = _mm256_loadu_si256(a.add(32 * v) as *const __m256i);
                let pairs = _mm256_maddubs_epi16(w[v], av);
                sum = _mm256_add_epi32(sum, _mm256_madd_epi16(pairs, scale[v]));
            }
            let sums = acts.sum16.as_ptr().add(at / 16) as *const __m256i;
            let side = _mm256_add_epi32(
                _mm256_mullo_epi32(_mm256_loadu_si256(sums), per_sum[0]),
                _mm256_mullo_epi32(_mm256_loadu_si256(sums.add(1)), per_sum[1]),
            );
            (sum, side)
        }
    }

    /// `Q4_K` blocks (see the VNNI kernel), or with `FIVE` `Q5_K` ones (176 bytes: the same
    /// header, then 32 bytes whose bit `g` of byte `l` is the fifth bit of element `l` of group
    /// `g`, then the nibbles).
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and F16C; `row` is whole blocks of the type, `acts` quantized for it
    /// with as many blocks per row, `acc` one per activation row.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn q4_k<const FIVE: bool>(row: &[u8], acts: &QuantActs, acc: &mut [f32]) {
        let block = if FIVE { 176 } else { 144 };
        let nibbles = if FIVE { 48 } else { 16 };
        let mask = _mm256_set1_epi8(0x0F);
        let stride = acts.k / 256;
        // Picks, for each 8 sums of 16, the min of their groups (mins are bytes 8–15).
        let pick_min = [
            _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 0, 0, 0, 0, 0, 0, 0, 0),
            _mm_setr_epi8(12, 12, 13, 13, 14, 14, 15, 15, 0, 0, 0, 0, 0, 0, 0, 0),
        ];
        for b in 0..row.len() / block {
            // SAFETY (whole body): every access stays inside block `b` of `row` and block `b`
            // of each activation row (the caller's contract).
            unsafe {
                let blk = row.as_ptr().add(block * b);
                let (d, dmin) = (half(blk), -half(blk.add(2)));
                let sc = k4_scales(blk.add(4));
                let packed = _mm_loadu_si128(sc.as_ptr() as *const __m128i);
                let mins = [
                    _mm256_cvtepu8_epi32(_mm_shuffle_epi8(packed, pick_min[0])),
                    _mm256_cvtepu8_epi32(_mm_shuffle_epi8(packed, pick_min[1])),
                ];
                let mut w = [_mm256_setzero_si256(); 8];
                let mut scale = [_mm256_setzero_si256(); 8];
                let qh = _mm256_loadu_si256(blk.add(16) as *const __m256i);
                let one = _mm256_set1_epi8(1);
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
                for (r, acc) in acc.iter_mut().enumerate() {
                    let (sum, m) = k_row(&w, &scale, acts, r * acts.k + 256 * b, &mins);
                    let da = *acts.d.get_unchecked(r * stride + b);
                    *acc = (d * da).mul_add(hsum(sum) as f32, *acc);
                    *acc = (dmin * da).mul_add(hsum(m) as f32, *acc);
                }
            }
        }
    }

    /// `Q6_K` blocks (see the VNNI kernel).
    ///
    /// # Safety
    /// As [`q4_k`], for `Q6_K`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn q6_k(row: &[u8], acts: &QuantActs, acc: &mut [f32]) {
        let (m4, m3) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(3));
        let stride = acts.k / 256;
        for b in 0..row.len() / 210 {
            // SAFETY (whole body): as in `q4_k`.
            unsafe {
                let p = row.as_ptr().add(210 * b);
                let d = half(p.add(208));
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
                // 32 · sc[g] per group: the +32 of the stored values comes back out.
                let bias = [
                    _mm256_slli_epi32(_mm256_cvtepi8_epi32(sc), 5),
                    _mm256_slli_epi32(_mm256_cvtepi8_epi32(_mm_srli_si128::<8>(sc)), 5),
                ];
                for (r, acc) in acc.iter_mut().enumerate() {
                    let (sum, off) = k_row(&w, &scale, acts, r * acts.k + 256 * b, &bias);
                    let s1 = hsum(_mm256_sub_epi32(sum, off));
                    let da = *acts.d.get_unchecked(r * stride + b);
                    *acc = (d * da).mul_add(s1 as f32, *acc);
                }
            }
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
        let block = 18 + if MIN { 2 } else { 0 } + if FIVE { 4 } else { 0 };
        let nibbles = block - 16;
        let bias = match (FIVE, MIN) {
            (_, true) => 0,
            (false, false) => 8,
            (true, false) => 16,
        };
        let (mask, one) = (_mm_set1_epi8(0x0F), _mm256_set1_epi16(1));
        // Byte i of the expansion takes byte i / 8 of the 32 bits and keeps bit i mod 8.
        let spread = _mm256_setr_epi8(
            0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3,
            3, 3, 3,
        );
        let bit = _mm256_set1_epi64x(i64::from_le_bytes([1, 2, 4, 8, 16, 32, 64, 128]));
        let stride = acts.k / 32;
        for b in 0..row.len() / block {
            // SAFETY (whole body): as in `q4_k`.
            unsafe {
                let blk = row.as_ptr().add(block * b);
                let d = half(blk);
                let m = if MIN { half(blk.add(2)) } else { 0.0 };
                let raw = _mm_loadu_si128(blk.add(nibbles) as *const __m128i);
                let lo = _mm_and_si128(raw, mask);
                let hi = _mm_and_si128(_mm_srli_epi16(raw, 4), mask);
                let mut w = _mm256_set_m128i(hi, lo);
                if FIVE {
                    let at = if MIN { 4 } else { 2 };
                    let qh = std::ptr::read_unaligned(blk.add(at) as *const u32);
                    let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(qh as i32), spread);
                    let set = _mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit);
                    w = _mm256_or_si256(w, _mm256_and_si256(set, _mm256_set1_epi8(16)));
                }
                for (r, acc) in acc.iter_mut().enumerate() {
                    let at = r * acts.k + 32 * b;
                    let a = _mm256_loadu_si256(acts.q.as_ptr().add(at) as *const __m256i);
                    let dot = hsum(_mm256_madd_epi16(_mm256_maddubs_epi16(w, a), one));
                    let sum =
                        *acts.sum16.get_unchecked(at / 16) + *acts.sum16.get_unchecked(at / 16 + 1);
                    let da = *acts.d.get_unchecked(r * stride + b);
                    *acc = (d * da).mul_add((dot - bias * sum) as f32, *acc);
                    if MIN {
                        *acc = (m * da).mul_add(sum as f32, *acc);
                    }
                }
            }
        }
    }

    /// `Q8_0` blocks: `|w|` times `a` with `w`'s sign, so the unsigned operand is `|w|`.
    ///
    /// # Safety
    /// As [`q4_k`], for `Q8_0`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn q8_0(row: &[u8], acts: &QuantActs, acc: &mut [f32]) {
        let ones = _mm256_set1_epi16(1);
        let stride = acts.k / 32;
        for b in 0..row.len() / 34 {
            // SAFETY (whole body): as in `q4_k`.
            unsafe {
                let blk = row.as_ptr().add(34 * b);
                let d = half(blk);
                let w = _mm256_loadu_si256(blk.add(2) as *const __m256i);
                let magnitude = _mm256_sign_epi8(w, w);
                for (r, acc) in acc.iter_mut().enumerate() {
                    let a = _mm256_loadu_si256(
                        acts.q.as_ptr().add(r * acts.k + 32 * b) as *const __m256i
                    );
                    let pairs = _mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(a, w));
                    let s1 = hsum(_mm256_madd_epi16(pairs, ones));
                    let da = *acts.d.get_unchecked(r * stride + b);
                    *acc = (d * da).mul_add(s1 as f32, *acc);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::tests::lcg;

    /// `n` rows of `k` random blocks of `ty` with modest finite scales.
    pub(crate) fn random_gguf(ty: GgmlType, n: usize, k: usize, seed: u64) -> Vec<u8> {
        let (elems, bytes) = ty.block();
        let mut state = seed;
        let mut out = Vec::new();
        for _ in 0..n * (k / elems) {
            let mut b: Vec<u8> = (0..bytes)
                .map(|_| ((lcg(&mut state) + 0.5) * 256.0) as u8)
                .collect();
            for at in [0usize, 2, bytes - 2] {
                b[at + 1] &= 0x1B; // small f16 exponents
            }
            out.extend(b);
        }
        out
    }

    const TYPES: [GgmlType; 8] = [
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
    ];

    /// The module docs' formula written out naively: dequantization-free integer sums in i64.
    fn naive(ty: GgmlType, w: &[u8], n: usize, k: usize, x: &[f32], rows: usize) -> Vec<f32> {
        let acts = QuantActs::quantize(ty, x, rows, k);
        let form = int_groups(ty).unwrap();
        let (elems, bytes) = ty.block();
        let mut out = vec![0.0f32; rows * n];
        for r in 0..rows {
            for j in 0..n {
                let mut acc = 0.0f32;
                for b in 0..k / elems {
                    let blk = &w[(j * (k / elems) + b) * bytes..][..bytes];
                    let (mut q, mut sc, mut mn) = (vec![0i8; elems], [0i32; 16], [0i32; 16]);
                    let f = split_block(ty, blk, &mut q, &mut sc, &mut mn);
                    let a = &acts.q[r * k + b * elems..][..elems];
                    let da = acts.d[r * (k / elems) + b];
                    let (mut s1, mut s2) = (0i64, 0i64);
                    for i in 0..elems {
                        let g = i / form.group;
                        s1 += sc[g] as i64 * q[i] as i64 * a[i] as i64;
                        s2 += mn[g] as i64 * a[i] as i64;
                    }
                    acc = (f.d * da).mul_add(s1 as i32 as f32, acc);
                    if form.offset {
                        acc = (f.dmin * da).mul_add(s2 as i32 as f32, acc);
                    }
                }
                out[r * n + j] = acc;
            }
        }
        out
    }

    fn same(a: &[f32], b: &[f32]) -> bool {
        a.iter().zip(b).all(|(u, v)| u.to_bits() == v.to_bits())
    }

    #[test]
    fn every_kernel_gives_the_naive_formulas_bits_at_any_batch_and_alone() {
        for ty in TYPES {
            let (elems, _) = ty.block();
            for (n, k) in [(16, elems), (37, 2 * elems), (5, 3 * elems)] {
                let bytes = random_gguf(ty, n, k, n as u64);
                let m = QuantMatrix::from_gguf(ty, &bytes, n, k).unwrap();
                let mut state = 9u64;
                for rows in [1, 2, 3, 5, 8, 17, 32] {
                    let x: Vec<f32> = (0..rows * k).map(|_| lcg(&mut state)).collect();
                    let want = naive(ty, &bytes, n, k, &x, rows);
                    for isa in Isa::available() {
                        let mut got = vec![0.0; rows * n];
                        m.view().gemm_with(isa, &x, rows, &mut got, rows % 2 == 0);
                        assert!(
                            same(&got, &want),
                            "{} {isa:?} n {n} k {k} rows {rows}",
                            ty.name()
                        );
                        for r in [0, rows - 1] {
                            let mut alone = vec![0.0; n];
                            m.view()
                                .gemm_with(isa, &x[r * k..(r + 1) * k], 1, &mut alone, false);
                            assert!(same(&alone, &want[r * n..(r + 1) * n]), "row {r} alone");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn extreme_weights_and_activations_stay_exact_in_the_integer_sums() {
        // Largest integers every type can hold, against activations that quantize to ±127.
        for ty in TYPES {
            let (elems, bytes) = ty.block();
            let (n, k) = (3, 2 * elems);
            let mut w = vec![0xFFu8; n * (k / elems) * bytes];
            for blk in w.chunks_exact_mut(bytes) {
                for at in [0usize, 2, bytes - 2] {
                    blk[at + 1] = 0x3C; // f16 scales near 1
                }
            }
            let x: Vec<f32> = (0..2 * k)
                .map(|i| if i % 3 == 0 { -1.0 } else { 1.0 })
                .collect();
            let m = QuantMatrix::from_gguf(ty, &w, n, k).unwrap();
            let want = naive(ty, &w, n, k, &x, 2);
            for isa in Isa::available() {
                let mut got = vec![0.0; 2 * n];
                m.view().gemm_with(isa, &x, 2, &mut got, false);
                assert!(same(&got, &want), "{} {isa:?}", ty.name());
            }
        }
    }

    #[test]
    fn products_stay_close_to_the_dequantized_matrixs() {
        for ty in TYPES {
            let (elems, _) = ty.block();
            let (n, k) = (24, 4 * elems);
            let bytes = random_gguf(ty, n, k, 5);
            let m = QuantMatrix::from_gguf(ty, &bytes, n, k).unwrap();
            let w = m.view().dequantized();
            let mut state = 1u64;
            let x: Vec<f32> = (0..4 * k).map(|_| lcg(&mut state)).collect();
            let mut got = vec![0.0; 4 * n];
            m.view().gemm(&x, 4, &mut got);
            for r in 0..4 {
                for j in 0..n {
                    let (row, xr) = (&w[j * k..(j + 1) * k], &x[r * k..(r + 1) * k]);
                    let want: f64 = row.iter().zip(xr).map(|(&a, &b)| a as f64 * b as f64).sum();
                    let scale: f64 = row
                        .iter()
                        .zip(xr)
                        .map(|(&a, &b)| (a * b).abs() as f64)
                        .sum();
                    let err = (got[r * n + j] as f64 - want).abs();
                    // 8-bit activations: each term off by at most half a step of its block.
                    assert!(
                        err <= 0.02 * scale + 1e-6,
                        "{} ({r},{j}): {err} of {scale}",
                        ty.name()
                    );
                }
            }
        }
    }

    #[test]
    fn activations_quantize_as_llama_cpp_does() {
        // q8_K: the largest magnitude maps to −127 (its sign flips the scale).
        let mut x = vec![0.0f32; 256];
        x[3] = -2.0;
        x[7] = 1.0;
        x[9] = 0.5;
        let a = QuantActs::quantize(GgmlType::Q4_K, &x, 1, 256);
        assert_eq!((a.q[3], a.q[7], a.q[9]), (-127, 64, 32)); // 63.5 and 31.75 round to even
        assert_eq!(a.d[0], 1.0 / 63.5);
        assert_eq!(a.sum16[0], -127 + 64 + 32);
        // q8_0: d = amax / 127 stored as f16, halves round away from zero.
        let mut x = vec![0.0f32; 32];
        x[0] = 127.0;
        x[1] = -0.5;
        x[2] = 2.5;
        let a = QuantActs::quantize(GgmlType::Q8_0, &x, 1, 32);
        assert_eq!((a.q[0], a.q[1], a.q[2]), (127, -1, 3));
        assert_eq!(a.d[0], 1.0);
        // A zero block.
        let a = QuantActs::quantize(GgmlType::Q6_K, &[0.0; 256], 1, 256);
        assert!(a.q.iter().all(|&q| q == 0) && a.d[0] == 0.0);
    }

    #[test]
    fn float_types_have_no_quantized_form() {
        assert!(QuantMatrix::from_gguf(GgmlType::F32, &[0u8; 128], 1, 32).is_none());
        assert!(QuantMatrix::from_gguf(GgmlType::BF16, &[0u8; 64], 1, 32).is_none());
    }
}
