//! Row order: products of row-major operands (`x[r, :] · w[j, :]`), for operands that stay in
//! the layout they were read in (RMSNorm's sum of squares, the route predictor's dot products).
//!
//! Element `i` goes to lane `i mod 16`; each lane is a chain of fused multiply-adds in
//! increasing `i`, the last partial block of 16 padded with zeros; the lanes are then added
//! pairwise (`l + 8`, `l + 4`, `l + 2`, `l + 1`). A register block computes up to 4 rows × 8
//! outputs at once (each weight row loaded once for the block's rows), but every output keeps
//! that order, so results never depend on the block or on the other rows.

// Index loops over fixed-size register blocks read (and vectorise) best as written.
#![allow(clippy::needless_range_loop)]

use super::simd::{self, tree, Elem, F32x16, LANES};
use super::{Isa, WeightView};

/// `R` rows × `J` outputs: `out[r·ldo + j] = x[r·ldx ..] · w[j·ldw ..]` over `k`.
///
/// # Safety
/// `x` must hold `R` rows of `k` at stride `ldx`, `w` `J` rows of `k` at stride `ldw`, `out`
/// `R` rows of `J` at stride `ldo`; `V`'s instruction set is available.
#[inline(always)]
unsafe fn block<const R: usize, const J: usize, V: F32x16, T: Elem>(
    x: *const f32,
    ldx: usize,
    w: *const T,
    ldw: usize,
    k: usize,
    out: *mut f32,
    ldo: usize,
) {
    // SAFETY (whole body): every access stays inside the operands the caller vouches for; the
    // last partial block is read through zero-padded copies.
    unsafe {
        let mut acc = [[V::zero(); J]; R];
        let full = k / LANES * LANES;
        let mut i = 0;
        while i < full {
            let mut wv = [V::zero(); J];
            for j in 0..J {
                wv[j] = T::load16::<V>(w.add(j * ldw + i));
            }
            for r in 0..R {
                let xv = V::load(x.add(r * ldx + i));
                for j in 0..J {
                    acc[r][j] = V::fma(xv, wv[j], acc[r][j]);
                }
            }
            i += LANES;
        }
        if full < k {
            let rem = k - full;
            let mut wv = [V::zero(); J];
            for j in 0..J {
                wv[j] = simd::load_partial::<V, T>(w.add(j * ldw + full), rem);
            }
            for r in 0..R {
                let xv = simd::load_partial::<V, f32>(x.add(r * ldx + full), rem);
                for j in 0..J {
                    acc[r][j] = V::fma(xv, wv[j], acc[r][j]);
                }
            }
        }
        for r in 0..R {
            for j in 0..J {
                *out.add(r * ldo + j) = tree(&simd::lanes(acc[r][j]));
            }
        }
    }
}

/// Outputs `cols` of every row, block by block.
///
/// # Safety
/// As [`matmul_raw`], and `V`'s instruction set is available.
#[inline(always)]
unsafe fn drive<V: F32x16, T: Elem>(
    x: *const f32,
    rows: usize,
    w: *const T,
    n: usize,
    k: usize,
    cols: std::ops::Range<usize>,
    out: *mut f32,
) {
    let mut j = cols.start;
    while j < cols.end {
        let left = cols.end - j;
        let wide = rows == 1 && left >= 8;
        let jb = if wide {
            8
        } else if left >= 4 {
            4
        } else if left >= 2 {
            2
        } else {
            1
        };
        let mut r = 0;
        while r < rows {
            let rb = match rows - r {
                1 => 1,
                2 | 3 => 2,
                _ => 4,
            };
            // SAFETY: the block lies inside `rows × k` of x, `n × k` of w, `rows × n` of out.
            unsafe {
                let (xp, wp, op) = (x.add(r * k), w.add(j * k), out.add(r * n + j));
                macro_rules! go {
                    ($r:literal, $j:literal) => {
                        block::<$r, $j, V, T>(xp, k, wp, k, k, op, n)
                    };
                }
                match (rb, jb) {
                    (1, 8) => go!(1, 8),
                    (1, 4) => go!(1, 4),
                    (1, 2) => go!(1, 2),
                    (1, _) => go!(1, 1),
                    (2, 4) => go!(2, 4),
                    (2, 2) => go!(2, 2),
                    (2, _) => go!(2, 1),
                    (_, 4) => go!(4, 4),
                    (_, 2) => go!(4, 2),
                    (_, _) => go!(4, 1),
                }
            }
            r += rb;
        }
        j += jb;
    }
}

/// The same generic code compiled for one instruction set.
macro_rules! isa_variant {
    ($m:ident, $v:ty, $($feat:literal)?) => {
        mod $m {
            use super::*;
            $(#[target_feature(enable = $feat)])?
            pub(super) unsafe fn matmul_f32(
                x: *const f32, rows: usize, w: *const f32, n: usize, k: usize,
                cols: std::ops::Range<usize>, out: *mut f32,
            ) {
                unsafe { drive::<$v, f32>(x, rows, w, n, k, cols, out) }
            }
            $(#[target_feature(enable = $feat)])?
            pub(super) unsafe fn matmul_bf16(
                x: *const f32, rows: usize, w: *const u16, n: usize, k: usize,
                cols: std::ops::Range<usize>, out: *mut f32,
            ) {
                unsafe { drive::<$v, u16>(x, rows, w, n, k, cols, out) }
            }
        }
    };
}

per_isa!(isa_variant);

/// A row-major `n × k` matrix (the `nn.Linear` layout `[out, in]`).
#[derive(Debug, Clone, Copy)]
pub struct RowMajor<'a> {
    pub w: WeightView<'a>,
    pub n: usize,
    pub k: usize,
}

/// `out[r·n + j] = x[r, :] · w[j, :]` for `j` in `cols`, compiled for `isa`.
///
/// # Safety
/// `x` holds `rows × k` floats, `w` `n × k` elements, `out` `rows × n` floats of which this call
/// writes only columns `cols` (so calls with disjoint `cols` may run concurrently); `isa` must
/// be one of [`Isa::available`].
pub unsafe fn matmul_raw(
    isa: Isa,
    x: &[f32],
    rows: usize,
    w: RowMajor<'_>,
    cols: std::ops::Range<usize>,
    out: *mut f32,
) {
    let RowMajor { w, n, k } = w;
    debug_assert!(x.len() >= rows * k && w.len() >= n * k && cols.end <= n);
    let xp = x.as_ptr();
    // SAFETY: the caller's contract.
    unsafe {
        match w {
            WeightView::F32(w) => dispatch!(isa, matmul_f32(xp, rows, w.as_ptr(), n, k, cols, out)),
            WeightView::Bf16(w) => {
                dispatch!(isa, matmul_bf16(xp, rows, w.as_ptr(), n, k, cols, out))
            }
        }
    }
}

/// Safe form of [`matmul_raw`] over all outputs (`out` is `rows × n`).
pub fn matmul_with(isa: Isa, x: &[f32], rows: usize, w: RowMajor<'_>, out: &mut [f32]) {
    assert!(isa.supported(), "{isa:?} not available");
    super::check_shapes(x, rows, w.w.len(), w.n, w.k, out);
    // SAFETY: shapes and the instruction set checked above.
    unsafe { matmul_raw(isa, x, rows, w, 0..w.n, out.as_mut_ptr()) }
}

/// `Σ a[i]·b[i]` in row order, compiled for `isa`.
pub fn dot_with(isa: Isa, a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let mut out = [0.0f32];
    let w = RowMajor {
        w: WeightView::F32(&b[..n]),
        n: 1,
        k: n,
    };
    matmul_with(isa, &a[..n], 1, w, &mut out);
    out[0]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::tests::{bf16_matrix, bits, lcg};

    /// The definition, one output at a time, with `f32::mul_add`.
    fn oracle(x: &[f32], w: &[f32]) -> f32 {
        let mut lanes = [0.0f32; LANES];
        for (i, (&a, &b)) in x.iter().zip(w).enumerate() {
            lanes[i % LANES] = a.mul_add(b, lanes[i % LANES]);
        }
        // The zero padding of the last block: fma(0, 0, acc) = acc (acc is never −0 here).
        tree(&lanes)
    }

    #[test]
    fn every_instruction_set_matches_the_one_output_oracle_for_any_rows_and_tails() {
        let mut s = 11;
        for &(n, k) in &[
            (1usize, 1usize),
            (7, 15),
            (9, 16),
            (33, 17),
            (40, 256),
            (256, 40),
        ] {
            let w: Vec<f32> = (0..n * k).map(|_| lcg(&mut s)).collect();
            for rows in [1usize, 2, 3, 4, 5, 8, 13, 32] {
                let x: Vec<f32> = (0..rows * k).map(|_| lcg(&mut s)).collect();
                let want: Vec<f32> = (0..rows * n)
                    .map(|o| {
                        oracle(
                            &x[o / n * k..(o / n + 1) * k],
                            &w[o % n * k..(o % n + 1) * k],
                        )
                    })
                    .collect();
                for isa in Isa::available() {
                    let mut got = vec![f32::NAN; rows * n];
                    matmul_with(
                        isa,
                        &x,
                        rows,
                        RowMajor {
                            w: WeightView::F32(&w),
                            n,
                            k,
                        },
                        &mut got,
                    );
                    assert_eq!(bits(&got), bits(&want), "{isa:?} n={n} k={k} rows={rows}");
                }
            }
        }
    }

    #[test]
    fn bf16_weights_give_the_bits_of_their_widening_on_every_instruction_set() {
        let mut s = 12;
        let (n, k) = (21, 67);
        let (w16, w32) = bf16_matrix(n, k, &mut s);
        let x: Vec<f32> = (0..5 * k).map(|_| lcg(&mut s)).collect();
        let mut want = vec![0.0; 5 * n];
        matmul_with(
            Isa::Portable,
            &x,
            5,
            RowMajor {
                w: WeightView::F32(&w32),
                n,
                k,
            },
            &mut want,
        );
        for isa in Isa::available() {
            let mut got = vec![0.0; 5 * n];
            matmul_with(
                isa,
                &x,
                5,
                RowMajor {
                    w: WeightView::Bf16(&w16),
                    n,
                    k,
                },
                &mut got,
            );
            assert_eq!(bits(&got), bits(&want), "{isa:?}");
        }
    }
}
