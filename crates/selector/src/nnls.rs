//! Non-negative least squares, `min ‖Ax − b‖₂ subject to x ≥ 0`, by Lawson and Hanson's active-set
//! method (Solving Least Squares Problems, 1974, ch. 23), with a Householder-QR solve of each
//! passive subproblem. Dense, `f64`, meant for the handful of columns of a cost calibration
//! (`O(iterations · m · p²)`). It knows nothing of probes or cost models.

use crate::error::Error;

/// A dense row-major matrix view: `rows × cols`.
#[derive(Debug, Clone, Copy)]
pub struct Matrix<'a> {
    pub data: &'a [f64],
    pub rows: usize,
    pub cols: usize,
}

impl Matrix<'_> {
    fn at(&self, r: usize, c: usize) -> f64 {
        self.data[r * self.cols + c]
    }
}

/// [`nnls`] with every column first scaled to unit maximum |value| (columns of counts in the
/// hundreds beside one-hot columns are then balanced for the solver) and the solution scaled
/// back. A positive scaling keeps the non-negativity constraint intact.
pub fn nnls_scaled(a: Matrix<'_>, b: &[f64]) -> Result<Vec<f64>, Error> {
    assert_eq!(a.data.len(), a.rows * a.cols, "matrix shape");
    let scales: Vec<f64> = (0..a.cols)
        .map(|c| (0..a.rows).map(|r| a.at(r, c).abs()).fold(0.0, f64::max))
        .map(|m| if m > 0.0 { m } else { 1.0 })
        .collect();
    let data: Vec<f64> = a
        .data
        .iter()
        .enumerate()
        .map(|(i, v)| v / scales[i % a.cols])
        .collect();
    let x = nnls(
        Matrix {
            data: &data,
            rows: a.rows,
            cols: a.cols,
        },
        b,
    )?;
    Ok(x.iter().zip(&scales).map(|(v, s)| v / s).collect())
}

/// Solves `min ‖Ax − b‖ s.t. x ≥ 0`. Columns that are entirely zero get 0.
pub fn nnls(a: Matrix<'_>, b: &[f64]) -> Result<Vec<f64>, Error> {
    assert_eq!(a.data.len(), a.rows * a.cols, "matrix shape");
    assert_eq!(b.len(), a.rows, "right-hand side length");
    let p = a.cols;
    let scale = a.data.iter().map(|v| v.abs()).fold(0.0, f64::max).max(1.0)
        * b.iter().map(|v| v.abs()).fold(0.0, f64::max).max(1.0);
    let tol = 1e-12 * scale * (a.rows.max(p) as f64);
    let mut x = vec![0.0; p];
    let mut passive = vec![false; p];
    let max_iterations = 30 * p.max(1);
    let mut iterations = 0;
    loop {
        let w = gradient(a, b, &x);
        let entering = (0..p)
            .filter(|&j| !passive[j] && w[j] > tol)
            .max_by(|&i, &j| w[i].total_cmp(&w[j]));
        let Some(t) = entering else { return Ok(x) };
        passive[t] = true;
        // Inner loop: move towards the unconstrained solution on the passive set, dropping
        // variables that would turn negative.
        loop {
            iterations += 1;
            if iterations > max_iterations {
                return Err(Error::NnlsNoConvergence {
                    iterations: max_iterations,
                });
            }
            let cols: Vec<usize> = (0..p).filter(|&j| passive[j]).collect();
            let z = lstsq(a, &cols, b);
            if cols.iter().zip(&z).all(|(_, &v)| v > 0.0) {
                x = vec![0.0; p];
                for (&j, &v) in cols.iter().zip(&z) {
                    x[j] = v;
                }
                break;
            }
            let alpha = cols
                .iter()
                .zip(&z)
                .filter(|(_, &v)| v <= 0.0)
                .map(|(&j, &v)| x[j] / (x[j] - v))
                .fold(f64::INFINITY, f64::min);
            for (&j, &v) in cols.iter().zip(&z) {
                x[j] += alpha * (v - x[j]);
            }
            // The variable(s) that set alpha land on zero up to rounding: leave the passive set.
            let drop_below = 1e-14 * x.iter().fold(0.0f64, |m, v| m.max(v.abs()));
            for &j in &cols {
                if x[j] <= drop_below {
                    x[j] = 0.0;
                    passive[j] = false;
                }
            }
            if cols.iter().all(|&j| !passive[j]) {
                break;
            }
        }
    }
}

/// `Aᵀ(b − Ax)`: the negative gradient of the squared residual.
fn gradient(a: Matrix<'_>, b: &[f64], x: &[f64]) -> Vec<f64> {
    let mut w = vec![0.0; a.cols];
    for (r, br) in b.iter().enumerate() {
        let resid = br - (0..a.cols).map(|c| a.at(r, c) * x[c]).sum::<f64>();
        for (c, wc) in w.iter_mut().enumerate() {
            *wc += a.at(r, c) * resid;
        }
    }
    w
}

/// Unconstrained least squares on the columns `cols` of `A` by Householder QR. A column that is
/// numerically dependent on earlier ones gets coefficient 0.
pub fn lstsq(a: Matrix<'_>, cols: &[usize], b: &[f64]) -> Vec<f64> {
    let (m, k) = (a.rows, cols.len());
    // Column-major copy of the selected columns, and the right-hand side.
    let mut q: Vec<Vec<f64>> = cols
        .iter()
        .map(|&c| (0..m).map(|r| a.at(r, c)).collect())
        .collect();
    let mut y = b.to_vec();
    let norm0 = q.iter().map(|col| norm(col)).fold(0.0, f64::max);
    let mut diag = vec![0usize; k];
    let mut independent = vec![true; k];
    let mut row = 0;
    for j in 0..k {
        if row >= m {
            independent[j] = false;
            continue;
        }
        let alpha = norm(&q[j][row..]);
        if alpha <= 1e-12 * norm0.max(f64::MIN_POSITIVE) {
            independent[j] = false;
            continue;
        }
        // Householder vector v = x + sign(x0)·‖x‖·e0 on rows row..m.
        let sign = if q[j][row] >= 0.0 { 1.0 } else { -1.0 };
        let mut v: Vec<f64> = q[j][row..].to_vec();
        v[0] += sign * alpha;
        let vnorm2: f64 = v.iter().map(|t| t * t).sum();
        let reflect = |col: &mut [f64]| {
            let dot: f64 = v.iter().zip(col.iter()).map(|(s, t)| s * t).sum();
            let f = 2.0 * dot / vnorm2;
            for (t, s) in col.iter_mut().zip(&v) {
                *t -= f * s;
            }
        };
        for col in q.iter_mut().skip(j) {
            reflect(&mut col[row..]);
        }
        reflect(&mut y[row..]);
        diag[j] = row;
        row += 1;
    }
    // Back substitution over the independent columns: R z = (Qᵀ b)[..rank].
    let mut z = vec![0.0; k];
    for j in (0..k).rev() {
        if !independent[j] {
            continue;
        }
        let r = diag[j];
        let mut s = y[r];
        for t in (j + 1)..k {
            if independent[t] {
                s -= q[t][r] * z[t];
            }
        }
        z[j] = s / q[j][r];
    }
    z
}

fn norm(v: &[f64]) -> f64 {
    v.iter().map(|t| t * t).sum::<f64>().sqrt()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn residual(a: Matrix<'_>, b: &[f64], x: &[f64]) -> f64 {
        (0..a.rows)
            .map(|r| {
                let e = b[r] - (0..a.cols).map(|c| a.at(r, c) * x[c]).sum::<f64>();
                e * e
            })
            .sum()
    }

    /// Oracle: the NNLS optimum is the best of the unconstrained solutions on every column
    /// subset whose coefficients are all non-negative.
    fn brute_force(a: Matrix<'_>, b: &[f64]) -> (Vec<f64>, f64) {
        let mut best = (vec![0.0; a.cols], residual(a, b, &vec![0.0; a.cols]));
        for subset in 1u32..(1 << a.cols) {
            let cols: Vec<usize> = (0..a.cols).filter(|c| subset >> c & 1 == 1).collect();
            let z = lstsq(a, &cols, b);
            if z.iter().any(|&v| v < 0.0) {
                continue;
            }
            let mut x = vec![0.0; a.cols];
            for (&c, &v) in cols.iter().zip(&z) {
                x[c] = v;
            }
            let r = residual(a, b, &x);
            if r < best.1 {
                best = (x, r);
            }
        }
        best
    }

    fn lcg(seed: &mut u64) -> f64 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (*seed >> 11) as f64 / (1u64 << 53) as f64
    }

    #[test]
    fn nnls_reaches_the_brute_force_optimum_on_random_problems() {
        let mut seed = 42;
        for case in 0..300 {
            let (rows, cols) = (3 + case % 9, 1 + case % 6);
            let data: Vec<f64> = (0..rows * cols)
                .map(|_| lcg(&mut seed) * 2.0 - 0.5)
                .collect();
            let b: Vec<f64> = (0..rows).map(|_| lcg(&mut seed) * 4.0 - 1.0).collect();
            let a = Matrix {
                data: &data,
                rows,
                cols,
            };
            let x = nnls(a, &b).unwrap();
            assert!(x.iter().all(|&v| v >= 0.0), "case {case}: {x:?}");
            let (_, best) = brute_force(a, &b);
            let got = residual(a, &b, &x);
            assert!(
                got <= best * (1.0 + 1e-9) + 1e-12,
                "case {case}: {got} vs oracle {best}"
            );
        }
    }

    #[test]
    fn exact_non_negative_data_is_recovered_with_exact_zeros() {
        // b = 2·col0 + 0·col1 + 3·col2.
        let data = [1.0, 0.0, 0.0, 1.0, 1.0, 2.0, 0.0, 1.0, 5.0, 1.0, 0.0, 1.0];
        let a = Matrix {
            data: &data,
            rows: 4,
            cols: 3,
        };
        let b: Vec<f64> = (0..4)
            .map(|r| 2.0 * a.at(r, 0) + 3.0 * a.at(r, 2))
            .collect();
        let x = nnls(a, &b).unwrap();
        assert!(
            (x[0] - 2.0).abs() < 1e-9 && x[1] == 0.0 && (x[2] - 3.0).abs() < 1e-9,
            "{x:?}"
        );
    }

    #[test]
    fn dependent_columns_do_not_break_the_solve() {
        let data = [1.0, 2.0, 2.0, 4.0, 3.0, 6.0];
        let a = Matrix {
            data: &data,
            rows: 3,
            cols: 2,
        };
        let x = nnls(a, &[1.0, 2.0, 3.0]).unwrap();
        assert!(residual(a, &[1.0, 2.0, 3.0], &x) < 1e-18, "{x:?}");
    }
}
