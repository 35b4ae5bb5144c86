//! Quantized matrices: a GGUF file's rows kept exactly as stored (its blocks, row-major, no
//! repacking), multiplied by activations quantized per row to 8-bit blocks, as llama.cpp does:
//! 256-element blocks with an f32 scale (llama.cpp's `q8_K`) for the k-quants, 32-element blocks
//! with an f16 scale (`q8_0`) for the others.
//!
//! **Order of operations** (the same for every instruction set, every batch size and every
//! thread split, so results are batch-invariant like the float kernels): for output `(r, j)`,
//! `L` accumulators `acc[0..L] = +0` ([`block_lanes`]: 8 for the k-quants' 256-element blocks,
//! 1 for the 32-element types); for each block `b` of row `j` in increasing order, with the
//! block's integers `q`, integer sub-scales `sc[g]`, mins `m[g]` and float factors `d`, `dmin`
//! ([`specfit_gguf::dequant::split_block`]), the activation block's integers `a` and scale `da`,
//! and `l = b mod L`:
//! - `S1 = Σ_g sc[g] · Σ_{i∈g} q[i]·a[i]` and `S2 = Σ_g m[g] · Σ_{i∈g} a[i]`, exact in i32;
//! - `acc[l] = fma(d·da, f32(S1), acc[l])`, then, for types with mins,
//!   `acc[l] = fma(dmin·da, f32(S2), acc[l])`;
//!
//! and the output is `((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] +
//! acc[7]))` ([`lanes_total`], the lanes past `L` zero: with one lane, `acc[0]` itself, as no
//! accumulator is ever −0). A k-quant block `b` sits in lane `b mod 8` so that a SIMD kernel
//! sums eight blocks' integer vectors in one transposing tree and runs their float steps as one
//! vector operation, instead of a horizontal sum and two dependent scalar steps per block. The
//! 32-element types keep one lane: on them this order agrees with llama.cpp's to 1e-7
//! (crates/engine/tests/gguf.rs), while eight lanes move an activation's 8-bit rounding there.
//!
//! The integer sums are exact whatever order a SIMD kernel adds them in, and the float steps are
//! one fixed sequence per output, so the AMX kernel (Q4_K from 8 rows, Q5_K from 12), the
//! AVX-512 VNNI kernels (Q4_K, Q5_K, Q6_K, and for several rows every type with sixteen outputs
//! in the lanes), the AVX2 ones and the portable reference
//! ([`block_reference`]) give identical bits; tests hold them to it. Each row's activations are
//! quantized from that row alone, so no row depends on another.
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
        // Padded to `acts.lanes`, as the fast kernels' contract asks.
        let mut acc = vec![0.0f32; acts.lanes];
        let fast = fast_kernel(isa, self.ty);
        // The reference's lanes (no allocation when a fast kernel runs: this is every product's
        // path).
        let mut lanes = match fast {
            Some(_) => Vec::new(),
            None => vec![[0.0f32; BLOCK_LANES]; acts.rows],
        };
        let weights = |j: usize| &self.data[j * row_bytes..(j + 1) * row_bytes];
        #[cfg(target_arch = "x86_64")]
        let cols = {
            let mut cols = cols;
            let five = match self.ty {
                GgmlType::Q4_K => Some(false),
                GgmlType::Q5_K if acts.rows >= AMX_MIN_ROWS_Q5_K => Some(true),
                _ => None,
            };
            if let (Some(five), Isa::Avx512, false, true) =
                (five, isa, acts.q_amx.is_empty(), cols.len() >= 16)
            {
                let groups = acts.amx_groups();
                let plane = 16 * 16 * groups;
                let mut acc = vec![0.0f32; BLOCK_LANES * plane];
                // SAFETY: `q_amx` is only laid out when `amx::amx_ready` said yes.
                let mut scratch = unsafe { amx::Scratch::new() };
                while cols.len() >= 16 {
                    let j0 = cols.start;
                    let rows: [&[u8]; 16] = std::array::from_fn(|i| weights(j0 + i));
                    let next = (j0 + 16).min(cols.end)..cols.end.min(j0 + 32);
                    let ahead = &self.data[next.start * row_bytes..next.end * row_bytes];
                    acc.fill(0.0);
                    // SAFETY: `q_amx` is only laid out when `amx::amx_ready` said yes (which
                    // checks AVX-512 BW); the rows are whole blocks of the type.
                    unsafe {
                        if five {
                            amx::q4_k::<true>(&rows, ahead, acts, &mut acc, &mut scratch)
                        } else {
                            amx::q4_k::<false>(&rows, ahead, acts, &mut acc, &mut scratch)
                        }
                    };
                    for r in 0..acts.rows {
                        let (group, m) = (r / amx::AMX_ROWS, r % amx::AMX_ROWS);
                        for i in 0..16 {
                            let at = (16 * group + i) * 16 + m;
                            let total = lanes_total(&std::array::from_fn(|l| acc[l * plane + at]));
                            // SAFETY: `(r, j0 + i)` is inside `out`.
                            unsafe { *out.add(r * self.n + j0 + i) = total };
                        }
                    }
                    cols.start += 16;
                }
            }
            cols
        };
        #[cfg(target_arch = "x86_64")]
        let cols = match fast_wide_kernel(isa, self.ty, acts.rows) {
            // SAFETY: the caller's contract; `bias32` is laid out wherever VNNI is.
            Some(kernel) => unsafe { self.wide_cols(kernel, acts, cols, out) },
            None => cols,
        };
        let cols = match side_by_side_kernels(isa, self.ty, acts.rows) {
            // SAFETY: the caller's contract.
            Some(groups) => unsafe { self.side_by_side(&groups, acts, cols, out) },
            None => cols,
        };
        for j in cols.start..cols.end.min(cols.start + PREFETCH_ROWS) {
            prefetch(weights(j));
        }
        for j in cols.clone() {
            acc.fill(0.0);
            if j + PREFETCH_ROWS < cols.end {
                prefetch(weights(j + PREFETCH_ROWS));
            }
            let row = weights(j);
            match fast {
                // SAFETY: `fast_kernel` only returns a kernel the CPU can run; `row` is whole
                // blocks of the kernel's type, `acts` was quantized for it and `acc` holds
                // `acts.lanes` floats.
                Some(kernel) => unsafe { kernel(row, acts, &mut acc) },
                None => {
                    lanes.fill([0.0; BLOCK_LANES]);
                    for (b, block) in row.chunks_exact(block_bytes).enumerate() {
                        block_reference(self.ty, self.form, block, acts, b, &mut lanes);
                    }
                    for (a, l) in acc.iter_mut().zip(&lanes) {
                        *a = lanes_total(l);
                    }
                }
            }
            for (r, &v) in acc[..acts.rows].iter().enumerate() {
                // SAFETY: `(r, j)` is inside `out` (the caller's contract).
                unsafe { *out.add(r * self.n + j) = v };
            }
        }
    }

    /// Runs `each(j, group, ahead)` for each group of `W` consecutive weight rows from
    /// `cols.start` (`group`: rows `j .. j + W`; `ahead`: the next group's, empty for the last,
    /// for the kernel to read ahead while it multiplies), the first group read ahead here;
    /// returns the columns left (fewer than `W`).
    fn by_groups<const W: usize>(
        &self,
        cols: std::ops::Range<usize>,
        mut each: impl FnMut(usize, &[u8], &[u8]),
    ) -> std::ops::Range<usize> {
        let row_bytes = self.data.len() / self.n;
        let group = |j: usize| &self.data[j * row_bytes..(j + W) * row_bytes];
        let mut j = cols.start;
        if cols.len() >= W {
            prefetch(group(j));
        }
        while cols.end - j >= W {
            let ahead = if cols.end - j >= 2 * W {
                group(j + W)
            } else {
                &[]
            };
            each(j, group(j), ahead);
            j += W;
        }
        j..cols.end
    }

    /// Outputs `cols` of every activation row into `out` (`rows × n`), [`COLS`] weight rows
    /// side by side at a time ([`QuantView::by_groups`]) against each group of activation rows
    /// by its kernel ([`side_by_side_kernels`]); returns the columns left (fewer than [`COLS`]).
    ///
    /// # Safety
    /// `out` points to `acts.rows × n` floats; `groups` are [`side_by_side_kernels`]' for this
    /// matrix's type and `acts.rows`, on this CPU.
    unsafe fn side_by_side(
        &self,
        groups: &[(std::ops::Range<usize>, ColsKernel)],
        acts: &QuantActs,
        cols: std::ops::Range<usize>,
        out: *mut f32,
    ) -> std::ops::Range<usize> {
        let mut got = vec![[0.0f32; COLS]; acts.rows];
        self.by_groups::<COLS>(cols, |j, group, ahead| {
            for (rows, kernel) in groups {
                // SAFETY: the caller's contract; the group is `COLS` whole rows of the type and
                // `acts` quantized for them, with the rows `rows`.
                unsafe { kernel(group, ahead, acts, rows.start, &mut got[rows.clone()]) };
            }
            for (r, row) in got.iter().enumerate() {
                for (i, &v) in row.iter().enumerate() {
                    // SAFETY: `(r, j + i)` is inside `out` (the caller's contract).
                    unsafe { *out.add(r * self.n + j + i) = v };
                }
            }
        })
    }

    /// Outputs `cols` of every activation row into `out` (`rows × n`) by `kernel`, [`WIDE`]
    /// columns at a time ([`QuantView::by_groups`]); returns the columns left (fewer than
    /// [`WIDE`]).
    ///
    /// # Safety
    /// `out` points to `acts.rows × n` floats; `kernel` runs on this CPU, for this matrix's type.
    #[cfg(target_arch = "x86_64")]
    unsafe fn wide_cols(
        &self,
        kernel: WideKernel,
        acts: &QuantActs,
        cols: std::ops::Range<usize>,
        out: *mut f32,
    ) -> std::ops::Range<usize> {
        let mut got = vec![[0.0f32; WIDE]; acts.rows];
        self.by_groups::<WIDE>(cols, |j, group, ahead| {
            // SAFETY: the caller's contract; the group is `WIDE` whole rows of the type.
            unsafe { kernel(group, ahead, acts, &mut got) };
            for (r, row) in got.iter().enumerate() {
                for (c, &v) in row.iter().enumerate() {
                    // SAFETY: `(r, j + c)` is inside `out` (the caller's contract).
                    unsafe { *out.add(r * self.n + j + c) = v };
                }
            }
        })
    }
}

/// Weight rows read ahead of the one being multiplied: without it the hardware prefetchers,
/// which stop at each 4 KiB page, left plain decoding of a mapped paper-scale Q4_K_M file at
/// half the rate (Intel Xeon, 2 threads: 5.3 against 10.3–11.1 tok/s at 1–8 rows ahead,
/// BENCHMARKS "Paper scale").
const PREFETCH_ROWS: usize = 4;

/// Asks the processor to start loading `bytes` into the first-level cache (a hint; no effect on
/// results).
fn prefetch(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    for line in bytes.chunks(64) {
        // SAFETY: prefetching is a hint on a valid address and never faults.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                line.as_ptr() as *const i8
            )
        };
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
    /// `sum16` narrowed (each at most 16 · 128 in magnitude, so exact), for `vpmaddwd`.
    sum16_i16: Vec<i16>,
    /// `q` with each 256-element block's chunks of 16 in the VNNI kernels' order
    /// (`vnni::VNNI_ORDER`); empty unless the CPU has them and the blocks are 256 long.
    q_vnni: Vec<i8>,
    /// The AMX kernel's `B` tiles (empty unless it runs): per group of `amx::AMX_ROWS` rows
    /// (zeros past `rows`), block and 64-element chunk, 16 quads × 16 rows × 4 bytes.
    q_amx: Vec<i8>,
    /// `d` per group and block, one lane per row of the group (zeros past `rows`).
    d_amx: Vec<f32>,
    /// Per group and block, the sums of `q` over each group of 32 as 16-bit pairs: pair `p`
    /// (groups `2p`, `2p + 1`) of every row of the group, 4 × 16 × 2 (zeros past `rows`).
    bsum_amx: Vec<i16>,
    /// `rows` rounded up to a multiple of [`LANES`]: the padded accumulators' count.
    lanes: usize,
    /// `d` by block: block `b`'s scales of every row at `b × lanes`, zeros past `rows`.
    d_by_block: Vec<f32>,
    /// Each block's sum of `q`, laid out as `d_by_block`.
    sum_by_block: Vec<i32>,
    /// `−128 ×` each block's sum of `q`, `rows × k / block` (empty unless the VNNI kernels of
    /// the 32-element types can run: 32-element blocks on a CPU with VNNI).
    bias32: Vec<i32>,
}

/// The most float accumulators per output ([`block_lanes`]).
pub(crate) const BLOCK_LANES: usize = 8;

/// Float accumulators per output for weights of `ty`: block `b` of a row adds into lane
/// `b mod block_lanes(ty)` (module docs).
pub(crate) fn block_lanes(ty: GgmlType) -> usize {
    if ty.block().0 == 256 {
        BLOCK_LANES
    } else {
        1
    }
}

/// An output's lane accumulators summed in the fixed order of the module docs.
pub(crate) fn lanes_total(acc: &[f32; BLOCK_LANES]) -> f32 {
    ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]))
}

/// Outputs of one activation row that a [`ColsKernel`] finishes together (one 8-lane vector of
/// accumulators, one output per lane).
pub(crate) const COLS: usize = 8;

/// Outputs of the activation rows that the widest kernels finish together (one 16-lane vector
/// of accumulators per row).
#[cfg(target_arch = "x86_64")]
pub(crate) const WIDE: usize = 16;

/// Rows whose products the AVX2 kernels finish together (one 8-lane vector of accumulators).
pub(crate) const LANES: usize = 8;

/// Activation rows from which Q4_K products run on AMX tiles where the CPU has them (and the
/// activations get the tiles' layout); Q5_K's, whose tile preparation costs more, from
/// [`AMX_MIN_ROWS_Q5_K`]. Measured against the VNNI kernels (BENCHMARKS "AMX"): at 8 rows Q4_K
/// 0.8–1.0× their time, Q5_K 0.95–1.1×; at 16 rows both about half.
#[cfg(target_arch = "x86_64")]
const AMX_MIN_ROWS: usize = 8;

/// Activation rows from which Q5_K products run on AMX tiles.
#[cfg(target_arch = "x86_64")]
const AMX_MIN_ROWS_Q5_K: usize = 12;

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
            sum16_i16: Vec::new(),
            q_vnni: Vec::new(),
            q_amx: Vec::new(),
            d_amx: Vec::new(),
            bsum_amx: Vec::new(),
            lanes: rows.div_ceil(LANES) * LANES,
            d_by_block: Vec::new(),
            sum_by_block: Vec::new(),
            bias32: Vec::new(),
        };
        for (b, (xs, qs)) in x
            .chunks_exact(block)
            .zip(acts.q.chunks_exact_mut(block))
            .enumerate()
        {
            acts.d[b] = quantize_block(xs, qs);
        }
        for (s, qs) in acts.sum16.iter_mut().zip(acts.q.chunks_exact(16)) {
            *s = qs.iter().map(|&v| v as i32).sum();
        }
        acts.sum16_i16 = acts.sum16.iter().map(|&s| s as i16).collect();
        acts.lay_out_by_block();
        #[cfg(target_arch = "x86_64")]
        if block == 256 && has_vnni() {
            acts.q_vnni = Self::vnni_order(&acts.q);
            if rows >= AMX_MIN_ROWS && amx::amx_ready() {
                acts.lay_out_amx();
            }
        }
        #[cfg(target_arch = "x86_64")]
        if block == 32 && has_vnni() {
            acts.bias32 = acts
                .sum16
                .chunks_exact(2)
                .map(|s| -128 * (s[0] + s[1]))
                .collect();
        }
        acts
    }

    /// Fills `d_by_block` and `sum_by_block` from `d` and `sum16`.
    fn lay_out_by_block(&mut self) {
        let blocks = self.k / self.block;
        let per_block = self.block / 16;
        self.d_by_block = vec![0.0; blocks * self.lanes];
        self.sum_by_block = vec![0; blocks * self.lanes];
        for r in 0..self.rows {
            for b in 0..blocks {
                let at = r * blocks + b;
                self.d_by_block[b * self.lanes + r] = self.d[at];
                self.sum_by_block[b * self.lanes + r] = self.sum16
                    [at * per_block..(at + 1) * per_block]
                    .iter()
                    .sum();
            }
        }
    }

    /// `q` (whole 256-element blocks) with each block's 16-element chunks in
    /// `vnni::VNNI_ORDER`.
    #[cfg(target_arch = "x86_64")]
    fn vnni_order(q: &[i8]) -> Vec<i8> {
        let mut out = Vec::with_capacity(q.len());
        for block in q.chunks_exact(256) {
            for c in vnni::VNNI_ORDER {
                out.extend_from_slice(&block[16 * c..16 * (c + 1)]);
            }
        }
        out
    }

    /// Fills `q_amx` and `d_amx` from `q` and `d`.
    #[cfg(target_arch = "x86_64")]
    fn lay_out_amx(&mut self) {
        let (blocks, rows) = (self.k / 256, amx::AMX_ROWS);
        let groups = self.rows.div_ceil(rows);
        self.q_amx = vec![0; groups * blocks * 4 * 1024];
        self.d_amx = vec![0.0; groups * blocks * rows];
        self.bsum_amx = vec![0; groups * blocks * 128];
        for r in 0..self.rows {
            let (group, m) = (r / rows, r % rows);
            for (b, q) in self.q[r * self.k..(r + 1) * self.k]
                .chunks_exact(256)
                .enumerate()
            {
                let at = group * blocks + b;
                for (quad, bytes) in q.chunks_exact(4).enumerate() {
                    // Chunk quad / 16, tile row quad % 16, column m.
                    let to = (at * 4 + quad / 16) * 1024 + (quad % 16) * 64 + 4 * m;
                    self.q_amx[to..to + 4].copy_from_slice(bytes);
                }
                self.d_amx[at * rows + m] = self.d[r * blocks + b];
                let sum16 = &self.sum16[(r * blocks + b) * 16..][..16];
                for g in 0..8 {
                    // At most 32 · 128 in magnitude: exact in 16 bits.
                    self.bsum_amx[at * 128 + (g / 2) * 32 + 2 * m + g % 2] =
                        (sum16[2 * g] + sum16[2 * g + 1]) as i16;
                }
            }
        }
    }

    /// Row groups of the AMX layout.
    #[cfg(target_arch = "x86_64")]
    fn amx_groups(&self) -> usize {
        self.q_amx.len() / (self.k / 256 * 4 * 1024).max(1)
    }

    /// The `B` tile of group `group`, block `b`, chunk `c` (16 rows of 64 bytes).
    #[cfg(target_arch = "x86_64")]
    fn amx_block(&self, group: usize, b: usize, c: usize) -> *const i8 {
        let at = (group * (self.k / 256) + b) * 4 + c;
        self.q_amx[at * 1024..(at + 1) * 1024].as_ptr()
    }

    /// The group sums of group `group`, block `b` (4 × 16 pairs of 16 bits).
    #[cfg(target_arch = "x86_64")]
    fn amx_bsums(&self, group: usize, b: usize) -> *const i16 {
        let at = group * (self.k / 256) + b;
        self.bsum_amx[at * 128..(at + 1) * 128].as_ptr()
    }

    /// The activation scales of group `group`, block `b` (16 floats).
    #[cfg(target_arch = "x86_64")]
    fn amx_d(&self, group: usize, b: usize) -> *const f32 {
        let at = group * (self.k / 256) + b;
        self.d_amx[at * amx::AMX_ROWS..(at + 1) * amx::AMX_ROWS].as_ptr()
    }

    /// Row `r`'s block `b`: its integers and scale.
    fn block(&self, r: usize, b: usize) -> (&[i8], f32) {
        let blocks = self.k / self.block;
        let at = r * self.k + b * self.block;
        (&self.q[at..at + self.block], self.d[r * blocks + b])
    }
}

/// One activation block (256 elements: `q8_K`, 32: `q8_0`) into `q`; returns its scale. With
/// AVX-512 on whole vectors (`quantize512`: the same bits), else by the functions below.
fn quantize_block(x: &[f32], q: &mut [i8]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if quantize512::available() {
        // SAFETY: `available` said yes.
        if let Some(d) = unsafe { quantize512::block(x, q) } {
            return d;
        }
    }
    quantize_scalar(x, q)
}

/// [`quantize_q8_k`] for a block of 256, [`quantize_q8_0`] otherwise (32).
fn quantize_scalar(x: &[f32], q: &mut [i8]) -> f32 {
    if x.len() == 256 {
        quantize_q8_k(x, q)
    } else {
        quantize_q8_0(x, q)
    }
}

/// llama.cpp's `quantize_row_q8_K_ref` on one block of 256: the element of largest magnitude
/// maps to −127, `q = round_half_even(x · (−127 / max))` (at most 127); returns `1 / iscale`.
fn quantize_q8_k(x: &[f32], q: &mut [i8]) -> f32 {
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    if amax == 0.0 {
        q.fill(0);
        return 0.0;
    }
    // The first element of that magnitude, as llama.cpp's loop finds it.
    let max = *x
        .iter()
        .find(|v| v.abs() == amax)
        .expect("amax is an element's magnitude");
    let iscale = -127.0 / max;
    for (qv, &v) in q.iter_mut().zip(x) {
        *qv = round_ties_even_small(iscale * v).min(127.0) as i8;
    }
    1.0 / iscale
}

/// `y.round_ties_even()` for `|y| < 2^22`: adding `1.5 · 2^23` leaves a sum whose unit in the
/// last place is 1, so the addition itself rounds to the nearest integer, ties to even, and
/// taking it back out is exact. Unlike the library call (without SSE4.1 in the target), it
/// vectorizes.
#[inline(always)]
fn round_ties_even_small(y: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0;
    (y + MAGIC) - MAGIC
}

/// llama.cpp's `quantize_row_q8_0_ref` on one block of 32: `d = amax / 127` (kept as f16, as
/// llama.cpp stores it), `q = round(x / d)` with halves away from zero; returns the f16 `d`.
fn quantize_q8_0(x: &[f32], q: &mut [i8]) -> f32 {
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    for (qv, &v) in q.iter_mut().zip(x) {
        *qv = round_half_away_small(v * id) as i8;
    }
    half::f16::from_f32(d).to_f32()
}

/// `y.round()` (halves away from zero) for `|y| < 2^22`: the nearest integer, ties to even
/// ([`round_ties_even_small`]), moved away from zero where `y` was a half. Unlike the library
/// call, it vectorizes.
#[inline(always)]
fn round_half_away_small(y: f32) -> f32 {
    let t = round_ties_even_small(y);
    // `y - t` is exact (both within one unit of each other); a half means `y` was a tie, and
    // then `y ± 0.5` is an integer, exact too.
    if (y - t).abs() == 0.5 {
        y + 0.5f32.copysign(y)
    } else {
        t
    }
}

/// One weight block `w` (block `b` of its row) against block `b` of every activation row, added
/// to lane `b mod block_lanes(ty)` of `acc` (one set of lanes per row) in the order the module
/// docs give. The oracle of the fast kernels.
pub(crate) fn block_reference(
    ty: GgmlType,
    form: IntGroups,
    w: &[u8],
    acts: &QuantActs,
    b: usize,
    acc: &mut [[f32; BLOCK_LANES]],
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
        let acc = &mut acc[b % block_lanes(ty)];
        *acc = (f.d * da).mul_add(s1 as f32, *acc);
        if form.offset {
            *acc = (f.dmin * da).mul_add(s2 as f32, *acc);
        }
    }
}

/// A whole row of weights against every activation row, its outputs written to `acc`
/// (`acts.lanes` floats, one per activation row, then padding the kernel may write).
type RowKernel = unsafe fn(&[u8], &QuantActs, &mut [f32]);

/// [`COLS`] consecutive weight rows side by side (and the next group's bytes to read ahead)
/// against the activation rows from `r0` it was chosen for: output `j` of row `r0 + i`
/// written to `out[i][j]`.
type ColsKernel = unsafe fn(&[u8], &[u8], &QuantActs, usize, &mut [[f32; COLS]]);

/// [`WIDE`] consecutive weight rows (and the next group's bytes to read ahead) against every
/// activation row: output `j` of row `r` written to `out[r][j]`.
#[cfg(target_arch = "x86_64")]
type WideKernel = unsafe fn(&[u8], &[u8], &QuantActs, &mut [[f32; WIDE]]);

/// The kernel for `ty` on `isa` that runs [`WIDE`] outputs of `rows` activation rows in the
/// lanes, where one beats the others: on VNNI the 32-element types (Q8_0 from
/// [`Q8_0_WIDE_MIN_ROWS`] rows), Q4_K and Q5_K from [`K_WIDE_MIN_ROWS`], Q6_K from
/// [`Q6_K_WIDE_MIN_ROWS`].
#[cfg(target_arch = "x86_64")]
fn fast_wide_kernel(isa: Isa, ty: GgmlType, rows: usize) -> Option<WideKernel> {
    if isa != Isa::Avx512 || !has_vnni() {
        return None;
    }
    match ty {
        GgmlType::Q8_0 if rows >= Q8_0_WIDE_MIN_ROWS => Some(vnni::q8_0_wide),
        GgmlType::Q4_K if rows >= K_WIDE_MIN_ROWS => Some(vnni::q4_k_wide::<false>),
        GgmlType::Q5_K if rows >= K_WIDE_MIN_ROWS => Some(vnni::q4_k_wide::<true>),
        GgmlType::Q6_K if rows >= Q6_K_WIDE_MIN_ROWS => Some(vnni::q6_k_wide),
        GgmlType::Q4_0 => Some(vnni::legacy_wide::<false, false>),
        GgmlType::Q4_1 => Some(vnni::legacy_wide::<false, true>),
        GgmlType::Q5_0 => Some(vnni::legacy_wide::<true, false>),
        GgmlType::Q5_1 => Some(vnni::legacy_wide::<true, true>),
        _ => None,
    }
}

/// Activation rows from which Q8_0 on VNNI runs [`vnni::q8_0_wide`] (one row runs eight
/// outputs side by side, measured faster there: BENCHMARKS "Q8_0, sixteen outputs in the
/// lanes"; the other 32-element types, whose transposes are a third as many, run in the lanes
/// from one row).
#[cfg(target_arch = "x86_64")]
const Q8_0_WIDE_MIN_ROWS: usize = 2;

/// Activation rows from which Q4_K and Q5_K on VNNI run [`vnni::q4_k_wide`] instead of eight
/// weight rows side by side (BENCHMARKS "The k-quants in the lanes": one thread, 768 × 2048,
/// Q4_K 2 / 4 / 8 / 16 rows 0.80 / 0.82 / 0.52 / 0.47 of the side-by-side time; one row 1.03).
#[cfg(target_arch = "x86_64")]
const K_WIDE_MIN_ROWS: usize = 2;

/// Activation rows from which Q6_K on VNNI runs [`vnni::q6_k_wide`] (its blocks cost about twice
/// Q4_K's to lay out in the lanes: 2 rows 1.18 of the side-by-side time, 4 / 8 / 16 rows 0.92 /
/// 0.77 / 0.59 at 768 × 2048).
#[cfg(target_arch = "x86_64")]
const Q6_K_WIDE_MIN_ROWS: usize = 4;

/// The kernel for `ty` on `isa` that runs [`COLS`] weight rows side by side against `rows`
/// activation rows, where one beats [`fast_kernel`] a weight row at a time (measured:
/// BENCHMARKS "One activation row, eight outputs side by side", "The one-row k-quant kernels
/// inlined" and "The k-quants side by side on AVX2"): the k-quants with VNNI up to
/// [`SIDE_BY_SIDE_ROWS`] rows (more run in groups of as many), on AVX2 (16 registers, so the
/// eight weight rows' block sums spill) up to [`AVX2_SIDE_BY_SIDE_ROWS`], the 32-element types
/// for one row.
fn fast_cols_kernel(isa: Isa, ty: GgmlType, rows: usize) -> Option<ColsKernel> {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512 && has_vnni() {
        // One instance per group size, 1 to `SIDE_BY_SIDE_ROWS`.
        macro_rules! by_rows {
            ($kernel:ident $(, $g:literal)*) => {
                match rows {
                    1 => Some(vnni::$kernel::<$($g,)* 1> as ColsKernel),
                    2 => Some(vnni::$kernel::<$($g,)* 2>),
                    3 => Some(vnni::$kernel::<$($g,)* 3>),
                    4 => Some(vnni::$kernel::<$($g,)* 4>),
                    5 => Some(vnni::$kernel::<$($g,)* 5>),
                    6 => Some(vnni::$kernel::<$($g,)* 6>),
                    7 => Some(vnni::$kernel::<$($g,)* 7>),
                    8 => Some(vnni::$kernel::<$($g,)* 8>),
                    _ => None,
                }
            };
        }
        match ty {
            GgmlType::Q8_0 if rows == 1 => return Some(vnni::q8_0_cols),
            GgmlType::Q4_K => return by_rows!(q4_k_cols, false),
            GgmlType::Q5_K => return by_rows!(q4_k_cols, true),
            GgmlType::Q6_K => return by_rows!(q6_k_cols),
            _ => {}
        }
    }
    #[cfg(target_arch = "x86_64")]
    if matches!(isa, Isa::Avx2 | Isa::Avx512) && std::arch::is_x86_feature_detected!("f16c") {
        macro_rules! by_rows {
            ($kernel:ident $(, $g:literal)*) => {
                match rows {
                    1 => Some(avx2::$kernel::<$($g,)* 1> as ColsKernel),
                    2 => Some(avx2::$kernel::<$($g,)* 2>),
                    3 => Some(avx2::$kernel::<$($g,)* 3>),
                    4 => Some(avx2::$kernel::<$($g,)* 4>),
                    _ => None,
                }
            };
        }
        const _: () = assert!(AVX2_SIDE_BY_SIDE_ROWS == 4);
        return match ty {
            GgmlType::Q4_K => by_rows!(q4_k_cols, false),
            GgmlType::Q5_K => by_rows!(q4_k_cols, true),
            GgmlType::Q6_K => by_rows!(q6_k_cols),
            GgmlType::Q8_0 if rows == 1 => Some(avx2::q8_0_cols),
            GgmlType::Q4_0 if rows == 1 => Some(avx2::legacy_cols::<false, false>),
            GgmlType::Q4_1 if rows == 1 => Some(avx2::legacy_cols::<false, true>),
            GgmlType::Q5_0 if rows == 1 => Some(avx2::legacy_cols::<true, false>),
            GgmlType::Q5_1 if rows == 1 => Some(avx2::legacy_cols::<true, true>),
            _ => None,
        };
    }
    let _ = (isa, ty, rows);
    None
}

/// The side-by-side kernel for each group of up to [`SIDE_BY_SIDE_ROWS`] of `rows` activation
/// rows ([`fast_cols_kernel`]), or `None` when some group size has none for `ty` on `isa`.
fn side_by_side_kernels(
    isa: Isa,
    ty: GgmlType,
    rows: usize,
) -> Option<Vec<(std::ops::Range<usize>, ColsKernel)>> {
    (0..rows)
        .step_by(SIDE_BY_SIDE_ROWS)
        .map(|r0| {
            let group = r0..rows.min(r0 + SIDE_BY_SIDE_ROWS);
            fast_cols_kernel(isa, ty, group.len()).map(|kernel| (group, kernel))
        })
        .collect()
}

/// Activation rows up to which the k-quants run side by side on AVX2 (one group; more activation
/// rows run a row of weights at a time). Measured on an AMD EPYC (Zen 3, one thread,
/// `quant_speed`, the fastest of 5 alternating rounds): side by side, 2 and 4 rows take
/// 0.78–0.96 of the row kernels' time, 8 rows 0.90–1.31 (Q4_K 1.09–1.31).
const AVX2_SIDE_BY_SIDE_ROWS: usize = 4;

/// Activation rows the k-quants run side by side at once on VNNI (more run in groups; the
/// kernels are instantiated for each group size up to it in [`fast_cols_kernel`]).
const SIDE_BY_SIDE_ROWS: usize = 8;

/// The fast kernel for `ty` on `isa`: the VNNI kernels on AVX-512 with VNNI, the AVX2 ones
/// (`vpmaddubsw`, whose 16-bit pair sums cannot saturate on these types) on AVX2 or on AVX-512
/// without VNNI; `None` (the reference) otherwise.
fn fast_kernel(isa: Isa, ty: GgmlType) -> Option<RowKernel> {
    #[cfg(target_arch = "x86_64")]
    {
        if isa == Isa::Avx512 && has_vnni() {
            match ty {
                GgmlType::Q4_K => return Some(vnni::q4_k::<false>),
                GgmlType::Q5_K => return Some(vnni::q4_k::<true>),
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

#[cfg(target_arch = "x86_64")]
mod x86;

#[cfg(target_arch = "x86_64")]
mod vnni;

#[cfg(target_arch = "x86_64")]
mod amx;

#[cfg(target_arch = "x86_64")]
mod avx2;

#[cfg(target_arch = "x86_64")]
mod quantize512;

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

    const TYPES: [GgmlType; 8] = specfit_gguf::dequant::INTEGER_TYPES;

    /// The module docs' formula written out naively: dequantization-free integer sums in i64.
    fn naive(ty: GgmlType, w: &[u8], n: usize, k: usize, x: &[f32], rows: usize) -> Vec<f32> {
        let acts = QuantActs::quantize(ty, x, rows, k);
        let form = int_groups(ty).unwrap();
        let (elems, bytes) = ty.block();
        let mut out = vec![0.0f32; rows * n];
        for r in 0..rows {
            for j in 0..n {
                let mut lanes = [0.0f32; BLOCK_LANES];
                for b in 0..k / elems {
                    let acc = &mut lanes[b % block_lanes(ty)];
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
                    *acc = (f.d * da).mul_add(s1 as i32 as f32, *acc);
                    if form.offset {
                        *acc = (f.dmin * da).mul_add(s2 as i32 as f32, *acc);
                    }
                }
                let [l0, l1, l2, l3, l4, l5, l6, l7] = lanes;
                out[r * n + j] = ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7));
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
            for (n, k) in [
                (16, elems),
                (37, 2 * elems),
                (5, 3 * elems),
                (48, 8 * elems),
                (7, 11 * elems),
            ] {
                let bytes = random_gguf(ty, n, k, n as u64);
                let m = QuantMatrix::from_gguf(ty, &bytes, n, k).unwrap();
                let mut state = 9u64;
                for rows in [1, 2, 3, 4, 5, 6, 7, 8, 9, 15, 17, 32] {
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
        // Largest integers every type can hold, against activations that quantize to ±127:
        // 7 rows of 3 outputs (every row group size the kernels special-case up to 8 but one),
        // 16 rows of 16 outputs (one whole AMX tile where the CPU has it), and 1 and 7 rows of 9
        // outputs (a group of eight side by side, then one alone); every byte all ones, then
        // (Q8_0's most negative weight) 0x80.
        for (ty, fill) in TYPES.into_iter().flat_map(|ty| [(ty, 0xFFu8), (ty, 0x80)]) {
            for (n, rows) in [(3, 7), (16, 16), (9, 1), (9, 7)] {
                let (elems, bytes) = ty.block();
                let k = 2 * elems;
                let mut w = vec![fill; n * (k / elems) * bytes];
                for blk in w.chunks_exact_mut(bytes) {
                    for at in [0usize, 2, bytes - 2] {
                        blk[at + 1] = 0x3C; // f16 scales near 1
                    }
                }
                let x: Vec<f32> = (0..rows * k)
                    .map(|i| if i % 3 == 0 { -1.0 } else { 1.0 })
                    .collect();
                let m = QuantMatrix::from_gguf(ty, &w, n, k).unwrap();
                let want = naive(ty, &w, n, k, &x, rows);
                for isa in Isa::available() {
                    let mut got = vec![0.0; rows * n];
                    m.view().gemm_with(isa, &x, rows, &mut got, false);
                    assert!(
                        same(&got, &want),
                        "{} {isa:?} rows {rows} fill {fill:#x}",
                        ty.name()
                    );
                }
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
        // Two elements of the largest magnitude: the first one's sign sets the scale's.
        let mut x = vec![0.0f32; 256];
        x[2] = 2.0;
        x[5] = -2.0;
        let a = QuantActs::quantize(GgmlType::Q4_K, &x, 1, 256);
        assert_eq!((a.q[2], a.q[5]), (-127, 127));
    }

    #[test]
    fn the_vectorizable_roundings_equal_the_library_ones_below_2_pow_22() {
        let mut state = 3u64;
        let halves = (-300..=300).map(|i| i as f32 / 2.0);
        let near_halves = (-300..=300).flat_map(|i| {
            let h = i as f32 / 2.0;
            [h.next_down(), h.next_up()]
        });
        let random = (0..100_000).map(|_| 300.0 * lcg(&mut state));
        let wide = [
            4_194_303.5f32,
            -4_194_303.5,
            4_194_302.5,
            0.0,
            -0.0,
            127.49999,
        ];
        for y in halves.chain(near_halves).chain(random).chain(wide) {
            let (got, want) = (round_ties_even_small(y), y.round_ties_even());
            // −0.0 and +0.0 both convert to the integer 0, which is all the kernels use.
            assert!(got == want, "{y}: {got} vs {want}");
            let (got, want) = (round_half_away_small(y), y.round());
            assert!(got == want, "{y}: {got} vs {want} (halves away from zero)");
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_avx512_quantizers_give_the_scalar_ones_bits() {
        if !quantize512::available() {
            return;
        }
        let mut state = 5u64;
        for len in [32usize, 256] {
            let mut blocks: Vec<Vec<f32>> = Vec::new();
            for scale in [1.0f32, 1e-3, 1e3, 1e30, 1e-36, 1e-40, 0.0] {
                blocks.push((0..len).map(|_| scale * lcg(&mut state)).collect());
            }
            // Ties: with a largest magnitude of 127 the scale is 1, so halves stay halves.
            for top in [127.0f32, -127.0] {
                let mut b: Vec<f32> = (0..len).map(|i| (i as f32 - 40.0) / 2.0 % 63.0).collect();
                b[7] = top;
                blocks.push(b);
            }
            // Two elements of the largest magnitude with opposite signs: the first one counts.
            let mut b: Vec<f32> = (0..len).map(|_| lcg(&mut state)).collect();
            (b[3], b[9]) = (-5.0, 5.0);
            blocks.push(b);
            for b in &blocks {
                let (mut fast, mut slow) = (vec![0i8; len], vec![0i8; len]);
                // SAFETY: `available` said yes.
                let got = unsafe { quantize512::block(b, &mut fast) };
                let want = quantize_scalar(b, &mut slow);
                if got.is_none() && b.iter().all(|v| v.abs() < 1e-37) {
                    continue; // so small that the inverse scale overflows: the scalar path's
                }
                assert_eq!(got.map(f32::to_bits), Some(want.to_bits()), "{b:?}");
                assert_eq!(fast, slow, "{b:?}");
            }
            for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
                let mut b = vec![1.0f32; len];
                b[len - 1] = bad;
                let mut q = vec![0i8; len];
                // SAFETY: as above.
                let got = unsafe { quantize512::block(&b, &mut q) };
                assert_eq!(got, None, "{bad} is left to the scalar function");
            }
        }
    }

    #[test]
    fn float_types_have_no_quantized_form() {
        assert!(QuantMatrix::from_gguf(GgmlType::F32, &[0u8; 128], 1, 32).is_none());
        assert!(QuantMatrix::from_gguf(GgmlType::BF16, &[0u8; 64], 1, 32).is_none());
    }
}
