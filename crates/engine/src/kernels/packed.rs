//! Panel order: `out[r, c] = Σ_kk x[r, kk] · B[kk, c]` as one chain of fused multiply-adds over
//! `kk = 0, 1, …, k−1` starting from `+0`, for `B` stored K-major in panels of 16 columns. The
//! dense layers repack their `nn.Linear` weights into such panels at load ([`PackedMatrix`]);
//! attention reads its key tiles and value rows as panels in place ([`PanelSrc`]).
//!
//! A register block holds `R` rows × `P` panels of accumulators (up to 8 × 2, 4 × 4 or 1 × 8):
//! each panel row is loaded once for the block's rows and each `x` element broadcast once for
//! its panels. The block shape only decides which chains run side by side; each output's chain
//! is the same whatever the number of rows, so results never depend on the batch.

// Index loops over fixed-size register blocks read (and vectorise) best as written.
#![allow(clippy::needless_range_loop)]

use super::simd::{Elem, F32x16};
use super::{Isa, WeightBuf, WeightView};

/// Columns per panel.
pub const PANEL: usize = 16;

/// Where a call's panels are: panel `p` row `kk` starts at `base + p·pstride + kk·ldb` and holds
/// 16 consecutive elements.
#[derive(Debug, Clone, Copy)]
pub enum PanelSrc {
    F32 {
        base: *const f32,
        ldb: usize,
        pstride: usize,
    },
    Bf16 {
        base: *const u16,
        ldb: usize,
        pstride: usize,
    },
}

/// Activation rows: `rows` rows of `k` floats, row `r` at `ptr + r·ld`.
#[derive(Debug, Clone, Copy)]
pub struct RowsIn {
    pub ptr: *const f32,
    pub ld: usize,
    pub rows: usize,
    pub k: usize,
}

impl RowsIn {
    /// `rows` rows of `k` floats in `x`, row `r` at `r·ld`.
    pub fn of(x: &[f32], ld: usize, rows: usize, k: usize) -> RowsIn {
        debug_assert!(rows == 0 || (rows - 1) * ld + k <= x.len());
        RowsIn {
            ptr: x.as_ptr(),
            ld,
            rows,
            k,
        }
    }

    /// The rows from row `r` on.
    ///
    /// # Safety
    /// Row `r` lies inside the rows.
    unsafe fn from(self, r: usize) -> RowsIn {
        RowsIn {
            // SAFETY: the caller's contract.
            ptr: unsafe { self.ptr.add(r * self.ld) },
            rows: self.rows - r,
            ..self
        }
    }
}

/// Output rows: row `r` at `ptr + r·ld`.
#[derive(Debug, Clone, Copy)]
pub struct RowsOut {
    pub ptr: *mut f32,
    pub ld: usize,
}

impl RowsOut {
    /// Output rows in `out`, row `r` at `r·ld`.
    pub fn of(out: &mut [f32], ld: usize) -> RowsOut {
        RowsOut {
            ptr: out.as_mut_ptr(),
            ld,
        }
    }
}

/// `R` rows × `P` panels.
///
/// # Safety
/// `x` holds `R` rows of `x.k`; `b` `P` panels of `x.k` rows of 16 from `b.base`; `out` `R`
/// rows of `16·P`; `V`'s instruction set is available.
#[inline(always)]
unsafe fn block<const R: usize, const P: usize, V: F32x16, T: Elem>(
    x: RowsIn,
    b: Float<T>,
    out: RowsOut,
) {
    let (ldx, k, ldo) = (x.ld, x.k, out.ld);
    let (x, out) = (x.ptr, out.ptr);
    let Float {
        base: b,
        ldb,
        pstride,
        ahead,
    } = b;
    // Panel rows per 64-byte line: each panel's stream is asked for once per line.
    let per_line = (64 / (PANEL * std::mem::size_of::<T>())).max(1);
    // SAFETY (whole body): every access stays inside the operands the caller vouches for.
    unsafe {
        let mut acc = [[V::zero(); P]; R];
        for kk in 0..k {
            if ahead != 0 && kk % per_line == 0 {
                for p in 0..P {
                    prefetch(b.wrapping_add(p * pstride + (kk + ahead) * ldb));
                }
            }
            let mut bv = [V::zero(); P];
            for p in 0..P {
                bv[p] = T::load16::<V>(b.add(p * pstride + kk * ldb));
            }
            for r in 0..R {
                let xv = V::splat(*x.add(r * ldx + kk));
                for p in 0..P {
                    acc[r][p] = V::fma(xv, bv[p], acc[r][p]);
                }
            }
        }
        for r in 0..R {
            for p in 0..P {
                acc[r][p].store(out.add(r * ldo + p * PANEL));
            }
        }
    }
}

/// Panel rows read ahead of the one being multiplied in a product over more than
/// [`PREFETCH_MIN_BYTES`] of panels: each panel is a stream of its own, and a matrix that large
/// comes from memory, where the hardware's prefetchers alone leave the core waiting (a drafted
/// level of the paper-scale EAGLE-3 head, 218 MB of bf16, took 15–20% less time with it).
const AHEAD: usize = 32;

/// Products over fewer bytes of panels than this are not read ahead: they come from the caches,
/// where the hints only cost instructions (the shipped target's matrices, 0.1–4 MB).
const PREFETCH_MIN_BYTES: usize = 4 << 20;

/// Asks for the line at `p` (a hint: no effect on results; any address, never faults).
#[inline(always)]
pub(crate) fn prefetch<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: prefetching is a hint and never faults, whatever the address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p as *const i8)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// What the driver's register blocks run on: float panels of `T`.
trait Kind: Copy {
    /// Registers one panel needs besides its accumulators (its loaded row).
    const PER_PANEL: usize;
    /// [`block`] on panels `p0..p0 + P`.
    ///
    /// # Safety
    /// As [`block`].
    unsafe fn run<const R: usize, const P: usize, V: F32x16>(
        self,
        x: RowsIn,
        p0: usize,
        out: RowsOut,
    );
}

/// Float panels of `T`: panel `p` row `kk` at `base + p·pstride + kk·ldb`, read `ahead` rows
/// ahead (0: not).
#[derive(Clone, Copy)]
struct Float<T> {
    base: *const T,
    ldb: usize,
    pstride: usize,
    ahead: usize,
}

impl<T: Elem> Kind for Float<T> {
    const PER_PANEL: usize = 1;
    #[inline(always)]
    unsafe fn run<const R: usize, const P: usize, V: F32x16>(
        self,
        x: RowsIn,
        p0: usize,
        out: RowsOut,
    ) {
        let from_p0 = Float {
            // SAFETY: the caller's contract.
            base: unsafe { self.base.add(p0 * self.pstride) },
            ..self
        };
        // SAFETY: the caller's contract.
        unsafe { block::<R, P, V, T>(x, from_p0, out) }
    }
}

/// The widest panel block for a row block of `r` rows when `V` has `regs` registers and each
/// panel needs `per_panel` registers besides its accumulators: the accumulators (`r × p`), the
/// panels' registers and one broadcast must fit, and the block must be one of the compiled
/// shapes (up to 8 panels for 1 row, 6 for 2 and 3, 4 for 4 to 6, 3 for 7 and 8).
const fn max_panels(r: usize, regs: usize, per_panel: usize) -> usize {
    let mut p = match r {
        1 => 8,
        2 | 3 => 6,
        4..=6 => 4,
        _ => 3,
    };
    while p > 1 && r * p + per_panel * p + 1 > regs {
        p -= 1;
    }
    p
}

/// Panels in chunks of [`CHUNK_PANELS`] outer (all at once when the rows make one row block),
/// then row blocks (up to 8 rows, as registers allow: any count up to 8 is one block, so its
/// weights are read once), then the chunk's panels in balanced blocks as wide as registers
/// allow (≥ 4 independent chains hide the FMA latency): each chunk's weights come from memory
/// once for every row block. Each output is still one block's sequential sum over `k`, so
/// neither the loop order nor the block shapes change bits.
///
/// # Safety
/// As [`gemm_raw`], and `V`'s instruction set is available.
#[inline(always)]
unsafe fn drive<V: F32x16, K: Kind>(
    x: RowsIn,
    kind: K,
    panels: std::ops::Range<usize>,
    out: RowsOut,
) {
    let rows = x.rows;
    let row_block = |left: usize| {
        (1..=8)
            .rev()
            .find(|&rb| rb <= left && rb + 2 <= V::REGS)
            .unwrap_or(1)
    };
    let chunk = if row_block(rows) == rows {
        panels.len().max(1)
    } else {
        CHUNK_PANELS
    };
    let mut c = panels.start;
    while c < panels.end {
        let chunk_end = (c + chunk).min(panels.end);
        let mut r = 0;
        while r < rows {
            let rb = row_block(rows - r);
            let most = max_panels(rb, V::REGS, K::PER_PANEL);
            let mut p = c;
            while p < chunk_end {
                let remaining = chunk_end - p;
                let blocks = remaining.div_ceil(most);
                let pb = remaining.div_ceil(blocks);
                // SAFETY: the block lies inside the caller's operands.
                unsafe {
                    let xr = x.from(r);
                    let or = RowsOut {
                        ptr: out.ptr.add(r * out.ld + p * PANEL),
                        ..out
                    };
                    macro_rules! go {
                        ($r:literal, $p:literal) => {
                            kind.run::<$r, $p, V>(xr, p, or)
                        };
                    }
                    match (rb, pb) {
                        (1, 1) => go!(1, 1),
                        (1, 2) => go!(1, 2),
                        (1, 3) => go!(1, 3),
                        (1, 4) => go!(1, 4),
                        (1, 5) => go!(1, 5),
                        (1, 6) => go!(1, 6),
                        (1, 7) => go!(1, 7),
                        (1, _) => go!(1, 8),
                        (2, 1) => go!(2, 1),
                        (2, 2) => go!(2, 2),
                        (2, 3) => go!(2, 3),
                        (2, 4) => go!(2, 4),
                        (2, 5) => go!(2, 5),
                        (2, _) => go!(2, 6),
                        (3, 1) => go!(3, 1),
                        (3, 2) => go!(3, 2),
                        (3, 3) => go!(3, 3),
                        (3, 4) => go!(3, 4),
                        (3, 5) => go!(3, 5),
                        (3, _) => go!(3, 6),
                        (4, 1) => go!(4, 1),
                        (4, 2) => go!(4, 2),
                        (4, 3) => go!(4, 3),
                        (4, _) => go!(4, 4),
                        (5, 1) => go!(5, 1),
                        (5, 2) => go!(5, 2),
                        (5, 3) => go!(5, 3),
                        (5, _) => go!(5, 4),
                        (6, 1) => go!(6, 1),
                        (6, 2) => go!(6, 2),
                        (6, 3) => go!(6, 3),
                        (6, _) => go!(6, 4),
                        (7, 1) => go!(7, 1),
                        (7, 2) => go!(7, 2),
                        (7, _) => go!(7, 3),
                        (_, 1) => go!(8, 1),
                        (_, 2) => go!(8, 2),
                        (_, _) => go!(8, 3),
                    }
                }
                p += pb;
            }
            r += rb;
        }
        c = chunk_end;
    }
}

/// Panels the driver takes at once when the rows make several row blocks: a multiple of every
/// block width (8, 6, 4, 3), small enough (1.5 MB of bf16 at k = 2048) to be read from memory
/// once and from the caches by the other row blocks.
const CHUNK_PANELS: usize = 24;

/// The same generic code compiled for one instruction set.
macro_rules! isa_variant {
    ($m:ident, $v:ty, $($feat:literal)?) => {
        mod $m {
            use super::*;
            $(#[target_feature(enable = $feat)])?
            pub(super) unsafe fn gemm_f32(
                x: RowsIn, b: Float<f32>, panels: std::ops::Range<usize>, out: RowsOut,
            ) {
                unsafe { drive::<$v, _>(x, b, panels, out) }
            }
            $(#[target_feature(enable = $feat)])?
            pub(super) unsafe fn gemm_bf16(
                x: RowsIn, b: Float<u16>, panels: std::ops::Range<usize>, out: RowsOut,
            ) {
                unsafe { drive::<$v, _>(x, b, panels, out) }
            }
        }
    };
}

per_isa!(isa_variant);

/// `out[r·out.ld + 16·p + c] = Σ_kk x[r·x.ld + kk] · panel_p[kk, c]` for every row `r < x.rows`
/// and panel `p` in `panels`, compiled for `isa`.
///
/// # Safety
/// `x` holds its rows; `b` holds the panels it names (`x.k` rows each); `out` has room for 16
/// columns per panel in each row, of which this call writes only its panels' (so calls over
/// disjoint panels may run concurrently); `isa` is one of [`Isa::available`].
pub unsafe fn gemm_raw(
    isa: Isa,
    x: RowsIn,
    b: PanelSrc,
    panels: std::ops::Range<usize>,
    out: RowsOut,
) {
    let ahead = |size: usize| {
        if panels.len() * x.k * PANEL * size > PREFETCH_MIN_BYTES {
            AHEAD
        } else {
            0
        }
    };
    // SAFETY: the caller's contract.
    unsafe {
        match b {
            PanelSrc::F32 { base, ldb, pstride } => {
                let ahead = ahead(4);
                let b = Float {
                    base,
                    ldb,
                    pstride,
                    ahead,
                };
                dispatch!(isa, gemm_f32(x, b, panels, out))
            }
            PanelSrc::Bf16 { base, ldb, pstride } => {
                let ahead = ahead(2);
                let b = Float {
                    base,
                    ldb,
                    pstride,
                    ahead,
                };
                dispatch!(isa, gemm_bf16(x, b, panels, out))
            }
        }
    }
}

/// Elements of an `n × k` matrix packed into panels (the last panel padded to 16 columns).
pub fn packed_len(n: usize, k: usize) -> usize {
    n.div_ceil(PANEL) * PANEL * k
}

/// Repacks a row-major `n × k` matrix (`nn.Linear` layout `[out, in]`) into `⌈n/16⌉` K-major
/// panels of 16 output features: element `(j, kk)` goes to `(j / 16)·16k + kk·16 + j mod 16`;
/// the columns past `n` in the last panel are zeros. Keeps the dtype it was given.
pub fn pack(w: WeightView<'_>, n: usize, k: usize) -> WeightBuf {
    assert_eq!(w.len(), n * k, "pack: w is not n × k");
    let index = |j: usize, kk: usize| (j / PANEL) * PANEL * k + kk * PANEL + j % PANEL;
    match w {
        WeightView::F32(v) => {
            let mut out = vec![0.0f32; packed_len(n, k)];
            for j in 0..n {
                for kk in 0..k {
                    out[index(j, kk)] = v[j * k + kk];
                }
            }
            WeightBuf::F32(out)
        }
        WeightView::Bf16(v) => {
            let mut out = vec![0u16; packed_len(n, k)];
            for j in 0..n {
                for kk in 0..k {
                    out[index(j, kk)] = v[j * k + kk];
                }
            }
            WeightBuf::Bf16(out)
        }
    }
}

/// An owned packed matrix (see [`pack`]).
#[derive(Debug, Clone, PartialEq)]
pub struct PackedMatrix {
    n: usize,
    k: usize,
    data: WeightBuf,
}

impl PackedMatrix {
    /// Repacks a row-major `n × k` matrix.
    pub fn pack(w: WeightView<'_>, n: usize, k: usize) -> PackedMatrix {
        PackedMatrix {
            n,
            k,
            data: pack(w, n, k),
        }
    }

    /// A borrowed view.
    pub fn view(&self) -> PackedView<'_> {
        PackedView {
            n: self.n,
            k: self.k,
            data: self.data.view(),
        }
    }

    /// `out = x · Wᵀ` (see [`PackedView::gemm`]).
    pub fn gemm(&self, x: &[f32], rows: usize, out: &mut [f32]) {
        self.view().gemm(x, rows, out);
    }
}

/// A borrowed packed matrix: `n × k` in panels (see [`pack`]), e.g. part of an expert block.
#[derive(Debug, Clone, Copy)]
pub struct PackedView<'a> {
    n: usize,
    k: usize,
    data: WeightView<'a>,
}

impl<'a> PackedView<'a> {
    /// Views packed data of an `n × k` matrix.
    pub fn new(data: WeightView<'a>, n: usize, k: usize) -> PackedView<'a> {
        assert_eq!(
            data.len(),
            packed_len(n, k),
            "packed data is not n × k in panels"
        );
        PackedView { n, k, data }
    }

    /// Element `(j, kk)` of the original matrix.
    pub fn get(&self, j: usize, kk: usize) -> f32 {
        self.data
            .get((j / PANEL) * PANEL * self.k + kk * PANEL + j % PANEL)
    }

    /// The panels' bytes.
    pub fn bytes(&self) -> &'a [u8] {
        self.data.bytes()
    }

    fn src(&self) -> PanelSrc {
        let pstride = PANEL * self.k;
        match self.data {
            WeightView::F32(v) => PanelSrc::F32 {
                base: v.as_ptr(),
                ldb: PANEL,
                pstride,
            },
            WeightView::Bf16(v) => PanelSrc::Bf16 {
                base: v.as_ptr(),
                ldb: PANEL,
                pstride,
            },
        }
    }

    /// `out = x · Wᵀ` for `x` of `rows × k`, `out` of `rows × n`, in panel order; split by panel
    /// across the worker pool when large enough (which never changes a bit).
    pub fn gemm(&self, x: &[f32], rows: usize, out: &mut [f32]) {
        self.gemm_with(Isa::detected(), x, rows, out, true);
    }

    /// [`PackedView::gemm`] on the calling thread only.
    pub fn gemm_serial(&self, x: &[f32], rows: usize, out: &mut [f32]) {
        self.gemm_with(Isa::detected(), x, rows, out, false);
    }

    /// [`PackedView::gemm`] compiled for `isa`.
    pub fn gemm_with(&self, isa: Isa, x: &[f32], rows: usize, out: &mut [f32], parallel: bool) {
        gemm_panels(isa, self, x, rows, out, parallel);
    }
}

/// `out = x · Wᵀ` over the panels of `w`, split by panel across the worker pool when `parallel`
/// and large enough (which never changes a bit).
fn gemm_panels(
    isa: Isa,
    w: &PackedView<'_>,
    x: &[f32],
    rows: usize,
    out: &mut [f32],
    parallel: bool,
) {
    let (src, n, k) = (w.src(), w.n, w.k);
    assert!(isa.supported(), "{isa:?} not available");
    assert_eq!(x.len(), rows * k, "gemm: x is not rows × k");
    assert_eq!(out.len(), rows * n, "gemm: out is not rows × n");
    if rows == 0 || n == 0 {
        return;
    }
    let panels = n.div_ceil(PANEL);
    // Outputs go straight to `out` when whole panels fit its rows, else through a padded
    // buffer.
    let mut padded = Vec::new();
    let (dst, ldo) = if n % PANEL == 0 {
        (out.as_mut_ptr(), n)
    } else {
        padded = vec![0.0f32; rows * panels * PANEL];
        (padded.as_mut_ptr(), panels * PANEL)
    };
    let target = crate::threads::SharedOut(dst);
    let src = SendSrc(src);
    let pool = crate::threads::pool();
    let parts = pool.threads();
    let run = |range: std::ops::Range<usize>| {
        // SAFETY: `x` is rows × k, the panels exist, `dst` has `ldo ≥ 16·panels` columns per
        // row, and concurrent parts own disjoint panel ranges.
        unsafe {
            let x = RowsIn::of(x, k, rows, k);
            let out = RowsOut {
                ptr: target.get(),
                ld: ldo,
            };
            gemm_raw(isa, x, src.get(), range, out)
        }
    };
    if !parallel || parts == 1 || rows * n * k < super::PARALLEL_MIN_MACS || panels < 2 * parts {
        run(0..panels);
    } else {
        pool.run(&|part| run(panels * part / parts..panels * (part + 1) / parts));
    }
    if n % PANEL != 0 {
        for (o, p) in out
            .chunks_exact_mut(n)
            .zip(padded.chunks_exact(panels * PANEL))
        {
            o.copy_from_slice(&p[..n]);
        }
    }
}

/// A panel source shared by the parts of one pool job (read only).
#[derive(Clone, Copy)]
struct SendSrc(PanelSrc);
// SAFETY: the pointers are only read, and the matrix outlives the job.
unsafe impl Sync for SendSrc {}
unsafe impl Send for SendSrc {}

impl SendSrc {
    /// The source (a method, so closures capture the whole `Sync` wrapper).
    fn get(self) -> PanelSrc {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::tests::{bf16_matrix, bits, lcg};

    /// The definition, one output at a time.
    fn oracle(x: &[f32], w: &[f32], n: usize, k: usize, rows: usize) -> Vec<f32> {
        let mut out = vec![0.0f32; rows * n];
        for r in 0..rows {
            for j in 0..n {
                let mut acc = 0.0f32;
                for kk in 0..k {
                    acc = x[r * k + kk].mul_add(w[j * k + kk], acc);
                }
                out[r * n + j] = acc;
            }
        }
        out
    }

    #[test]
    fn every_instruction_set_matches_the_one_chain_oracle_for_rows_up_to_32_and_odd_shapes() {
        let mut s = 21;
        for &(n, k) in &[
            (1usize, 1usize),
            (16, 7),
            (17, 33),
            (40, 256),
            (100, 31),
            (260, 40),
            (400, 24), // 25 panels: two chunks when the rows make several row blocks
        ] {
            let w: Vec<f32> = (0..n * k).map(|_| lcg(&mut s)).collect();
            let packed = PackedMatrix::pack(WeightView::F32(&w), n, k);
            for rows in [1usize, 2, 3, 4, 5, 6, 7, 8, 9, 16, 31, 32] {
                let x: Vec<f32> = (0..rows * k).map(|_| lcg(&mut s)).collect();
                let want = oracle(&x, &w, n, k, rows);
                for isa in Isa::available() {
                    for parallel in [false, true] {
                        let mut got = vec![f32::NAN; rows * n];
                        packed.view().gemm_with(isa, &x, rows, &mut got, parallel);
                        assert_eq!(bits(&got), bits(&want), "{isa:?} n={n} k={k} rows={rows}");
                    }
                }
            }
        }
    }

    #[test]
    fn products_large_enough_to_read_ahead_keep_the_oracles_bits() {
        // 2 064 × 1 040 bf16 is 4.3 MB of panels: read ahead serially, and each half of a
        // parallel product (2.1 MB) not; f32 twice that, read ahead either way.
        let mut s = 24;
        let (n, k) = (2064, 1040);
        let (w16, w32) = bf16_matrix(n, k, &mut s);
        assert!(n * k * 2 > PREFETCH_MIN_BYTES);
        let bf16 = PackedMatrix::pack(WeightView::Bf16(&w16), n, k);
        let f32s = PackedMatrix::pack(WeightView::F32(&w32), n, k);
        for rows in [1usize, 2, 5] {
            let x: Vec<f32> = (0..rows * k).map(|_| lcg(&mut s)).collect();
            let want = oracle(&x, &w32, n, k, rows);
            for isa in Isa::available() {
                for (name, m) in [("bf16", &bf16), ("f32", &f32s)] {
                    for parallel in [false, true] {
                        let mut got = vec![f32::NAN; rows * n];
                        m.view().gemm_with(isa, &x, rows, &mut got, parallel);
                        assert_eq!(bits(&got), bits(&want), "{isa:?} {name} rows={rows}");
                    }
                }
            }
        }
    }

    #[test]
    fn a_row_gets_the_same_bits_alone_and_inside_any_batch() {
        let mut s = 22;
        let (n, k) = (512, 256);
        let w16: Vec<u16> = (0..n * k)
            .map(|_| half::bf16::from_f32(lcg(&mut s)).to_bits())
            .collect();
        let packed = PackedMatrix::pack(WeightView::Bf16(&w16), n, k);
        let x: Vec<f32> = (0..32 * k).map(|_| lcg(&mut s)).collect();
        let mut alone = vec![0.0; n];
        packed.gemm(&x[..k], 1, &mut alone);
        for rows in 1..=32 {
            let mut all = vec![0.0; rows * n];
            packed.gemm(&x[..rows * k], rows, &mut all);
            assert_eq!(bits(&all[..n]), bits(&alone), "rows={rows}");
        }
    }

    #[test]
    fn bf16_panels_give_the_bits_of_their_f32_widening() {
        let mut s = 23;
        let (n, k) = (48, 65);
        let (w16, w32) = bf16_matrix(n, k, &mut s);
        let a = PackedMatrix::pack(WeightView::Bf16(&w16), n, k);
        let b = PackedMatrix::pack(WeightView::F32(&w32), n, k);
        let x: Vec<f32> = (0..6 * k).map(|_| lcg(&mut s)).collect();
        for isa in Isa::available() {
            let (mut ya, mut yb) = (vec![0.0; 6 * n], vec![0.0; 6 * n]);
            a.view().gemm_with(isa, &x, 6, &mut ya, false);
            b.view().gemm_with(Isa::Portable, &x, 6, &mut yb, false);
            assert_eq!(bits(&ya), bits(&yb), "{isa:?}");
        }
        assert_eq!(a.view().get(47, 64), w32[47 * k + 64]);
    }
}
