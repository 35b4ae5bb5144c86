//! Batch-invariant CPU kernels: every output is computed by the same sequence of floating point
//! operations whatever the other rows of the batch are, so a token verified inside a draft tree
//! gets bit-for-bit the hidden states, routes and logits it gets when decoded alone.
//!
//! Two reduction orders, each a fixed function of one output's own inputs:
//! - **Row order** ([`dot`], [`matmul`], for operands that stay row-major: RMSNorm's sum of
//!   squares, the route predictor): element `i` of a length-`k` dot product goes to lane
//!   `i mod 16`, each lane is a chain of fused multiply-adds over its elements in increasing `i`
//!   (the last partial block padded with zeros), then the 16 lanes are added pairwise
//!   (`l + 8`, `l + 4`, `l + 2`, `l + 1`). See [`rowdot`].
//! - **Panel order** ([`packed::PackedMatrix`], [`packed::PackedView`]: the dense layers, the
//!   routed experts in their slots, attention): each output is one
//!   chain of fused multiply-adds over `k` in increasing order, starting from `+0`. Weights are
//!   repacked at load into K-major panels of 16 output features, so a register block of several
//!   rows × several panels loads each weight once for all rows. See [`packed`].
//!
//! How many rows share a call only changes which outputs are computed together, never the
//! operations of one output. Fused multiply-add is correctly rounded (IEEE 754), so the AVX-512,
//! AVX2+FMA and portable (`f32::mul_add`) builds of the same code give identical bits: one
//! generic body is compiled once per instruction set ([`Isa`]) and picked at run time.
//!
//! Why not candle's matmul: measured on candle-core 0.11.1 (gemm 0.19), `x[8, k] · Wᵀ` and the
//! same rows computed one at a time differ in the last bits for 78–94% of the outputs, because
//! the library picks another blocking and summation order for other batch sizes.
//!
//! Weights may be stored as bf16: they are widened exactly in registers inside the same loops,
//! so bf16 storage halves the bytes read without changing any result. This module owns
//! arithmetic only; it knows nothing of layers or tokens.

/// Invokes `$m!(module, 16-lane type, target features)` once per instruction set: the same
/// generic kernel body compiled for each.
macro_rules! per_isa {
    ($m:ident) => {
        $m!(portable, $crate::kernels::simd::Portable,);
        #[cfg(target_arch = "x86_64")]
        $m!(avx2, $crate::kernels::simd::Avx2, "avx2,fma");
        #[cfg(target_arch = "x86_64")]
        $m!(
            avx512,
            $crate::kernels::simd::Avx512,
            "avx512f,avx512bw,avx512vl,avx512dq,fma"
        );
    };
}

/// Calls `$f(args)` in the module `per_isa!` compiled for `$isa` (unsafe: the caller checks
/// that the running CPU has that instruction set).
macro_rules! dispatch {
    ($isa:expr, $f:ident ( $($arg:expr),* $(,)? )) => {
        match $isa {
            #[cfg(target_arch = "x86_64")]
            $crate::kernels::Isa::Avx512 => avx512::$f($($arg),*),
            #[cfg(target_arch = "x86_64")]
            $crate::kernels::Isa::Avx2 => avx2::$f($($arg),*),
            _ => portable::$f($($arg),*),
        }
    };
}

pub mod attention;
pub(crate) mod experts;
pub mod math;
pub mod packed;
pub mod quant;
pub mod rowdot;
pub(crate) mod simd;

pub use packed::{PackedMatrix, PackedView};

/// How matrices are stored. bf16 values are widened to f32 exactly, in registers, so a bf16
/// matrix gives bit-for-bit the results of its f32 widening while reading half the bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightDtype {
    F32,
    Bf16,
}

impl WeightDtype {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            WeightDtype::F32 => 4,
            WeightDtype::Bf16 => 2,
        }
    }

    /// The name used in files and flags.
    pub fn name(self) -> &'static str {
        match self {
            WeightDtype::F32 => "f32",
            WeightDtype::Bf16 => "bf16",
        }
    }
}

/// An owned matrix (row-major).
#[derive(Debug, Clone, PartialEq)]
pub enum WeightBuf {
    F32(Vec<f32>),
    /// bf16 bit patterns.
    Bf16(Vec<u16>),
}

impl WeightBuf {
    /// A borrowed view.
    pub fn view(&self) -> WeightView<'_> {
        match self {
            WeightBuf::F32(v) => WeightView::F32(v),
            WeightBuf::Bf16(v) => WeightView::Bf16(v),
        }
    }
}

/// A borrowed matrix (row-major).
#[derive(Debug, Clone, Copy)]
pub enum WeightView<'a> {
    F32(&'a [f32]),
    Bf16(&'a [u16]),
}

impl<'a> WeightView<'a> {
    /// Elements.
    pub fn len(&self) -> usize {
        match self {
            WeightView::F32(v) => v.len(),
            WeightView::Bf16(v) => v.len(),
        }
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Elements `range` as a view.
    pub fn slice(&self, range: std::ops::Range<usize>) -> WeightView<'a> {
        match *self {
            WeightView::F32(v) => WeightView::F32(&v[range]),
            WeightView::Bf16(v) => WeightView::Bf16(&v[range]),
        }
    }

    /// The elements' bytes.
    pub fn bytes(&self) -> &'a [u8] {
        match *self {
            // SAFETY: any initialised memory may be viewed as bytes; the length is in bytes.
            WeightView::F32(v) => unsafe {
                std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v))
            },
            // SAFETY: as above.
            WeightView::Bf16(v) => unsafe {
                std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v))
            },
        }
    }

    /// Element `i` as f32.
    pub fn get(&self, i: usize) -> f32 {
        match self {
            WeightView::F32(v) => v[i],
            WeightView::Bf16(v) => bf16_to_f32(v[i]),
        }
    }
}

/// Exact widening of a bf16 bit pattern.
#[inline(always)]
pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// The instruction sets the kernels are compiled for. Every variant gives the same bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    /// `f32::mul_add` and plain loops, for any CPU.
    Portable,
    /// x86-64 AVX2 with FMA.
    Avx2,
    /// x86-64 AVX-512 (F, BW, VL, DQ) with FMA.
    Avx512,
}

impl Isa {
    /// The best variant the running CPU supports (`SPECFIT_ISA=portable|avx2|avx512` lowers it).
    pub fn detected() -> Isa {
        static ISA: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
        *ISA.get_or_init(|| {
            let best = Isa::available().into_iter().last().unwrap_or(Isa::Portable);
            match std::env::var("SPECFIT_ISA").ok().as_deref() {
                Some("portable") => Isa::Portable,
                Some("avx2") if Isa::available().contains(&Isa::Avx2) => Isa::Avx2,
                _ => best,
            }
        })
    }

    /// Every variant the running CPU can execute, from the most portable up.
    pub fn available() -> Vec<Isa> {
        let mut out = vec![Isa::Portable];
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            if has!("avx2") && has!("fma") {
                out.push(Isa::Avx2);
            }
            if has!("avx512f") && has!("avx512bw") && has!("avx512vl") && has!("avx512dq") {
                out.push(Isa::Avx512);
            }
        }
        out
    }

    /// Whether the running CPU can execute this variant (cached).
    pub fn supported(self) -> bool {
        static AVAILABLE: std::sync::OnceLock<Vec<Isa>> = std::sync::OnceLock::new();
        AVAILABLE.get_or_init(Isa::available).contains(&self)
    }

    /// The name used in logs and docs.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Portable => "portable",
            Isa::Avx2 => "avx2+fma",
            Isa::Avx512 => "avx512",
        }
    }
}

/// `Σ a[i]·b[i]` in row order (see the module docs).
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    rowdot::dot_with(Isa::detected(), a, b)
}

/// `out[r, j] = x[r, :] · w[j, :]` for `x` of `rows × k` and row-major `w` of `n × k` (the
/// `nn.Linear` layout), `out` of `rows × n`, in row order. Each output depends only on its own
/// row of `x` and of `w`.
///
/// Large calls are split by output feature across the worker pool ([`crate::threads`]); each
/// output is still computed by one thread in the same order, so the split never changes a bit.
pub fn matmul(x: &[f32], rows: usize, w: WeightView<'_>, n: usize, k: usize, out: &mut [f32]) {
    let pool = crate::threads::pool();
    let parts = pool.threads();
    if parts == 1 || rows * n * k < PARALLEL_MIN_MACS || n < 2 * parts {
        matmul_serial(x, rows, w, n, k, out);
        return;
    }
    check_shapes(x, rows, w.len(), n, k, out);
    let target = crate::threads::SharedOut(out.as_mut_ptr());
    pool.run(&|part| {
        let cols = n * part / parts..n * (part + 1) / parts;
        // SAFETY: `target` points to `rows × n` floats (checked above) and the parts write
        // disjoint columns.
        let w = rowdot::RowMajor { w, n, k };
        unsafe { rowdot::matmul_raw(Isa::detected(), x, rows, w, cols, target.get()) };
    });
}

/// [`matmul`] on the calling thread only (for work already spread over threads).
pub fn matmul_serial(
    x: &[f32],
    rows: usize,
    w: WeightView<'_>,
    n: usize,
    k: usize,
    out: &mut [f32],
) {
    rowdot::matmul_with(Isa::detected(), x, rows, rowdot::RowMajor { w, n, k }, out);
}

/// Panics unless `x` is `rows × k`, `w` (`w` elements) is `n × k` and `out` is `rows × n`.
pub(crate) fn check_shapes(x: &[f32], rows: usize, w: usize, n: usize, k: usize, out: &[f32]) {
    assert_eq!(x.len(), rows * k, "matmul: x is not rows × k");
    assert_eq!(w, n * k, "matmul: w is not n × k");
    assert_eq!(out.len(), rows * n, "matmul: out is not rows × n");
}

/// Smallest matmul (in multiply-adds) worth splitting across threads.
pub(crate) const PARALLEL_MIN_MACS: usize = 1 << 15;

/// HF `Qwen3MoeRMSNorm` on each row of `x` (`rows × dim`): `w · x / sqrt(mean(x²) + eps)`.
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let dim = w.len();
    for (xr, or) in x.chunks_exact(dim).zip(out.chunks_exact_mut(dim)) {
        let mean = dot(xr, xr) / dim as f32;
        let inv = 1.0 / (mean + eps).sqrt();
        for ((o, &v), &g) in or.iter_mut().zip(xr).zip(w) {
            *o = g * (v * inv);
        }
    }
}

/// In-place RMSNorm of one row.
pub fn rms_norm_in_place(x: &mut [f32], w: &[f32], eps: f32) {
    let mean = dot(x, x) / x.len() as f32;
    let inv = 1.0 / (mean + eps).sqrt();
    for (v, &g) in x.iter_mut().zip(w) {
        *v = g * (*v * inv);
    }
}

/// `x · sigmoid(x)`, as torch computes `silu` in f32.
#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// Softmax over a row, in place: `exp(x − max) / Σ`, summed left to right.
pub fn softmax_in_place(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f32;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    for v in x.iter_mut() {
        *v /= sum;
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn lcg(seed: &mut u64) -> f32 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) - 0.5
    }

    pub(crate) fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// A random `n × k` bf16 matrix and its exact f32 widening.
    pub(crate) fn bf16_matrix(n: usize, k: usize, seed: &mut u64) -> (Vec<u16>, Vec<f32>) {
        let w16: Vec<u16> = (0..n * k)
            .map(|_| half::bf16::from_f32(lcg(seed)).to_bits())
            .collect();
        let w32 = w16.iter().map(|&b| bf16_to_f32(b)).collect();
        (w16, w32)
    }

    #[test]
    fn dot_matches_a_wide_reference_sum_closely() {
        let mut s = 1;
        for n in [0usize, 1, 15, 16, 17, 63, 64, 65, 100, 2048, 2049] {
            let a: Vec<f32> = (0..n).map(|_| lcg(&mut s)).collect();
            let b: Vec<f32> = (0..n).map(|_| lcg(&mut s)).collect();
            let want: f64 = a.iter().zip(&b).map(|(x, y)| *x as f64 * *y as f64).sum();
            let got = dot(&a, &b) as f64;
            assert!(
                (got - want).abs() <= 1e-5 * (1.0 + want.abs()),
                "n={n}: {got} vs {want}"
            );
        }
    }

    #[test]
    fn matmul_rows_do_not_depend_on_the_other_rows_of_the_batch() {
        let mut s = 3;
        let (n, k) = (37, 300);
        let w: Vec<f32> = (0..n * k).map(|_| lcg(&mut s)).collect();
        let x: Vec<f32> = (0..8 * k).map(|_| lcg(&mut s)).collect();
        let mut all = vec![0.0; 8 * n];
        matmul(&x, 8, WeightView::F32(&w), n, k, &mut all);
        for r in 0..8 {
            let mut one = vec![0.0; n];
            matmul(
                &x[r * k..(r + 1) * k],
                1,
                WeightView::F32(&w),
                n,
                k,
                &mut one,
            );
            assert_eq!(bits(&one), bits(&all[r * n..(r + 1) * n]), "row {r}");
        }
    }

    #[test]
    fn softmax_sums_to_one_and_keeps_order() {
        let mut x = vec![1.0, 3.0, 2.0, -1.0];
        softmax_in_place(&mut x);
        assert!((x.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert!(x[1] > x[2] && x[2] > x[0] && x[0] > x[3]);
    }
}
