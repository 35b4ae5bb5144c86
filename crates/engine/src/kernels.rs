//! Batch-invariant CPU kernels: every output row is computed by the same sequence of floating
//! point operations whatever the other rows of the batch are, so a token verified inside a draft
//! tree gets bit-for-bit the hidden states, routes and logits it gets when decoded alone.
//!
//! Why not candle's matmul: measured on candle-core 0.11.1 (gemm 0.19), `x[8, k] · Wᵀ` and the
//! same rows computed one at a time differ in the last bits for 78–94% of the outputs
//! (k = 32…2048), because the library picks another blocking and summation order for other
//! batch sizes. At a near-tie that flips an expert choice or a greedy token.
//!
//! The reduction order of [`dot`] is fixed: element `i` goes to lane `i mod 16` of accumulator
//! `(i / 16) mod 4`; the four accumulators are added lane-wise, the 16 lanes pairwise
//! (`l + 8`, `l + 4`, …), and the tail (`len mod 64` elements beyond the last full block of 64
//! handled as 16-lane blocks, then single elements) in a fixed order. No fused multiply-add is
//! used, so the AVX-512, AVX2 and portable builds of the same code give identical bits.
//! Weights may be stored as bf16 ([`WeightView::Bf16`]): they are widened exactly in registers
//! inside the same loop, so bf16 storage halves the bytes read without changing any result.
//! This module owns arithmetic only; it knows nothing of layers or tokens.

/// Lanes per accumulator.
const LANES: usize = 16;
/// Independent accumulators (hides add latency).
const ACCS: usize = 4;

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

#[inline(always)]
fn dot_body<T: Copy>(a: &[f32], b: &[T], load: impl Fn(T) -> f32) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [[0.0f32; LANES]; ACCS];
    let block = LANES * ACCS;
    let full = n / block * block;
    for (ca, cb) in a[..full]
        .chunks_exact(block)
        .zip(b[..full].chunks_exact(block))
    {
        for (q, accq) in acc.iter_mut().enumerate() {
            let (xa, xb) = (
                &ca[q * LANES..(q + 1) * LANES],
                &cb[q * LANES..(q + 1) * LANES],
            );
            for l in 0..LANES {
                accq[l] += xa[l] * load(xb[l]);
            }
        }
    }
    // Remaining whole 16-lane blocks go to accumulators 0, 1, 2 in turn.
    let mut i = full;
    let mut q = 0;
    while i + LANES <= n {
        for l in 0..LANES {
            acc[q][l] += a[i + l] * load(b[i + l]);
        }
        i += LANES;
        q += 1;
    }
    let mut lanes = [0.0f32; LANES];
    for l in 0..LANES {
        lanes[l] = (acc[0][l] + acc[1][l]) + (acc[2][l] + acc[3][l]);
    }
    let mut width = LANES / 2;
    while width > 0 {
        for l in 0..width {
            lanes[l] += lanes[l + width];
        }
        width /= 2;
    }
    let mut tail = 0.0f32;
    while i < n {
        tail += a[i] * load(b[i]);
        i += 1;
    }
    lanes[0] + tail
}

macro_rules! dot_variants {
    ($f32:ident, $bf16:ident, $($feat:literal)?) => {
        $(#[target_feature(enable = $feat)])?
        unsafe fn $f32(a: &[f32], b: &[f32]) -> f32 {
            dot_body(a, b, |v| v)
        }
        $(#[target_feature(enable = $feat)])?
        unsafe fn $bf16(a: &[f32], b: &[u16]) -> f32 {
            dot_body(a, b, bf16_to_f32)
        }
    };
}

dot_variants!(dot_portable_f32, dot_portable_bf16,);
#[cfg(target_arch = "x86_64")]
dot_variants!(dot_avx512_f32, dot_avx512_bf16, "avx512f,avx512bw");
#[cfg(target_arch = "x86_64")]
dot_variants!(dot_avx2_f32, dot_avx2_bf16, "avx2");

#[cfg(test)]
fn dot_portable(a: &[f32], b: &[f32]) -> f32 {
    // SAFETY: the portable variant has no target-feature requirements.
    unsafe { dot_portable_f32(a, b) }
}

type DotF32 = unsafe fn(&[f32], &[f32]) -> f32;
type DotBf16 = unsafe fn(&[f32], &[u16]) -> f32;

fn pick_dot() -> (DotF32, DotBf16) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
        {
            return (dot_avx512_f32, dot_avx512_bf16);
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            return (dot_avx2_f32, dot_avx2_bf16);
        }
    }
    (dot_portable_f32, dot_portable_bf16)
}

static DOT: std::sync::OnceLock<(DotF32, DotBf16)> = std::sync::OnceLock::new();

/// `Σ a[i]·b[i]` in the fixed order described in the module docs.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let f = DOT.get_or_init(pick_dot).0;
    // SAFETY: `pick_dot` only returns a target-feature variant the running CPU supports.
    unsafe { f(a, b) }
}

/// `Σ a[i]·w[i]` for a stored weight row, in the same fixed order as [`dot`].
#[inline]
pub fn dot_w(a: &[f32], w: WeightView<'_>) -> f32 {
    match w {
        WeightView::F32(b) => dot(a, b),
        WeightView::Bf16(b) => {
            let f = DOT.get_or_init(pick_dot).1;
            // SAFETY: as in `dot`.
            unsafe { f(a, b) }
        }
    }
}

/// `out[r, j] = x[r, :] · w[j, :]` for `x` of `rows × k` and `w` of `n × k` (the `nn.Linear`
/// layout), `out` of `rows × n`. Each output is one [`dot`], so rows are independent.
///
/// Large calls are split by output feature across the worker pool ([`crate::threads`]); each
/// output is still one `dot` computed by one thread, so the split never changes a bit.
pub fn matmul(x: &[f32], rows: usize, w: WeightView<'_>, n: usize, k: usize, out: &mut [f32]) {
    assert_eq!(x.len(), rows * k, "matmul: x is not rows × k");
    assert_eq!(w.len(), n * k, "matmul: w is not n × k");
    assert_eq!(out.len(), rows * n, "matmul: out is not rows × n");
    let pool = crate::threads::pool();
    let parts = pool.threads();
    if parts == 1 || rows * n * k < PARALLEL_MIN_MACS || n < 2 * parts {
        matmul_columns(
            x,
            rows,
            w,
            n,
            k,
            0..n,
            crate::threads::SharedOut(out.as_mut_ptr()),
        );
        return;
    }
    let target = crate::threads::SharedOut(out.as_mut_ptr());
    pool.run(&|part| {
        let cols = n * part / parts..n * (part + 1) / parts;
        matmul_columns(x, rows, w, n, k, cols, target);
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
    assert_eq!(x.len(), rows * k, "matmul: x is not rows × k");
    assert_eq!(w.len(), n * k, "matmul: w is not n × k");
    assert_eq!(out.len(), rows * n, "matmul: out is not rows × n");
    matmul_columns(
        x,
        rows,
        w,
        n,
        k,
        0..n,
        crate::threads::SharedOut(out.as_mut_ptr()),
    );
}

/// Smallest matmul (in multiply-adds) worth splitting across threads.
const PARALLEL_MIN_MACS: usize = 1 << 15;

/// Outputs `out[r, j]` for `j` in `cols`. Weight rows outer, token rows inner: a weight row is
/// read once per call and reused from L1 for every token (the tree-verify case).
fn matmul_columns(
    x: &[f32],
    rows: usize,
    w: WeightView<'_>,
    n: usize,
    k: usize,
    cols: std::ops::Range<usize>,
    out: crate::threads::SharedOut,
) {
    for j in cols {
        let wj = w.slice(j * k..(j + 1) * k);
        for r in 0..rows {
            let v = dot_w(&x[r * k..(r + 1) * k], wj);
            // SAFETY: `out` points to `rows × n` floats (asserted by `matmul`), and concurrent
            // callers own disjoint column ranges, so no element is written twice.
            unsafe { *out.0.add(r * n + j) = v };
        }
    }
}

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
mod tests {
    use super::*;

    fn lcg(seed: &mut u64) -> f32 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) - 0.5
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
    fn every_dot_variant_gives_the_same_bits() {
        let mut s = 2;
        for n in [7usize, 64, 130, 768, 2051] {
            let a: Vec<f32> = (0..n).map(|_| lcg(&mut s)).collect();
            let b: Vec<f32> = (0..n).map(|_| lcg(&mut s)).collect();
            assert_eq!(
                dot(&a, &b).to_bits(),
                dot_portable(&a, &b).to_bits(),
                "n={n}"
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
            let same = one
                .iter()
                .zip(&all[r * n..(r + 1) * n])
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "row {r}");
        }
    }

    #[test]
    fn a_bf16_matrix_gives_the_bits_of_its_f32_widening() {
        let mut s = 4;
        let (n, k) = (19, 777);
        let w16: Vec<u16> = (0..n * k)
            .map(|_| half::bf16::from_f32(lcg(&mut s)).to_bits())
            .collect();
        let w32: Vec<f32> = w16.iter().map(|&b| bf16_to_f32(b)).collect();
        let x: Vec<f32> = (0..3 * k).map(|_| lcg(&mut s)).collect();
        let (mut a, mut b) = (vec![0.0; 3 * n], vec![0.0; 3 * n]);
        matmul(&x, 3, WeightView::Bf16(&w16), n, k, &mut a);
        matmul(&x, 3, WeightView::F32(&w32), n, k, &mut b);
        assert_eq!(
            a.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            b.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
        let portable: Vec<u32> = (0..n)
            .map(|j| unsafe { dot_portable_bf16(&x[..k], &w16[j * k..(j + 1) * k]) }.to_bits())
            .collect();
        assert_eq!(
            portable,
            a[..n].iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
    }

    #[test]
    fn softmax_sums_to_one_and_keeps_order() {
        let mut x = vec![1.0, 3.0, 2.0, -1.0];
        softmax_in_place(&mut x);
        assert!((x.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert!(x[1] > x[2] && x[2] > x[0] && x[0] > x[3]);
    }
}
