//! One inflated matrix, row by row: each row is zeros, random weights (cost without effect), or
//! a small model's row placed at given columns and scaled — written in a ggml block type as it
//! streams, each distinct small row quantized once. It decides nothing about where rows go
//! ([`super::plan`] does).

use std::collections::HashMap;
use std::io::Write;

use specfit_gguf::quant::{quantize_row, random_block, Rng};
use specfit_gguf::GgmlType;

/// Standard deviation of random rows (about a trained weight's).
const RANDOM_STD: f32 = 0.02;

/// Where one row of an inflated matrix comes from.
#[derive(Debug, Clone, Copy)]
pub enum Row<'a> {
    Zero,
    /// Random weights: the row costs what a real one does and its output is never used.
    Random,
    /// A small model's row, times a scale, at the matrix's column placement.
    Small(&'a [f32], f32),
}

/// An inflated matrix: `rows` rows of `cols` values; small column `c` lands on every large
/// column in `place[c]`.
pub struct Matrix<'a> {
    pub rows: usize,
    pub cols: usize,
    pub place: Vec<Vec<usize>>,
    pub row: Box<dyn Fn(usize) -> Row<'a> + 'a>,
}

/// Row `r` of a row-major small matrix with `cols` columns.
pub fn row(m: &[f32], cols: usize, r: usize) -> &[f32] {
    &m[r * cols..(r + 1) * cols]
}

/// Small columns `0..n` on large columns `0..n` (the first copy).
pub fn first_copy(n: usize) -> Vec<Vec<usize>> {
    (0..n).map(|c| vec![c]).collect()
}

/// Small columns `0..n` on every copy: `c`, `c + n`, … (`copies` of them).
pub fn every_copy(n: usize, copies: usize) -> Vec<Vec<usize>> {
    (0..n)
        .map(|c| (0..copies).map(|k| c + k * n).collect())
        .collect()
}

impl<'a> Matrix<'a> {
    /// A vector (one row) of explicit values.
    pub fn vector(values: &'a [f32]) -> Matrix<'a> {
        Matrix {
            rows: 1,
            cols: values.len(),
            place: first_copy(values.len()),
            row: Box::new(move |_| Row::Small(values, 1.0)),
        }
    }

    /// The large row of small row `small` scaled by `scale`, as f32.
    fn placed(&self, small: &[f32], scale: f32) -> Vec<f32> {
        let mut out = vec![0.0f32; self.cols];
        for (&v, cols) in small.iter().zip(&self.place) {
            for &c in cols {
                out[c] = v * scale;
            }
        }
        out
    }

    /// Bytes of the whole matrix in `ty`.
    pub fn bytes(&self, ty: GgmlType) -> u64 {
        ty.row_bytes(self.cols as u64).expect("whole blocks") * self.rows as u64
    }

    /// Streams the matrix in `ty` to `w` (random rows drawn from `rng`).
    pub fn write(&self, ty: GgmlType, rng: &mut Rng, w: &mut dyn Write) -> std::io::Result<()> {
        let unsupported =
            |t: GgmlType| std::io::Error::other(format!("cannot write {} blocks", t.name()));
        let row_bytes = ty.row_bytes(self.cols as u64).ok_or_else(|| {
            std::io::Error::other(format!(
                "rows of {} are not whole {} blocks",
                self.cols,
                ty.name()
            ))
        })? as usize;
        let zero = vec![0u8; row_bytes];
        let blocks = self.cols / ty.block().0;
        let mut cache: HashMap<(usize, usize, u32), Vec<u8>> = HashMap::new();
        let mut buf = Vec::with_capacity(1 << 22);
        for r in 0..self.rows {
            match (self.row)(r) {
                Row::Zero => buf.extend_from_slice(&zero),
                Row::Random => {
                    for _ in 0..blocks {
                        random_block(ty, RANDOM_STD, rng, &mut buf).map_err(unsupported)?;
                    }
                }
                Row::Small(values, scale) => {
                    let key = (values.as_ptr() as usize, values.len(), scale.to_bits());
                    let bytes = match cache.entry(key) {
                        std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                        std::collections::hash_map::Entry::Vacant(e) => {
                            let mut bytes = Vec::with_capacity(row_bytes);
                            quantize_row(ty, &self.placed(values, scale), &mut bytes)
                                .map_err(unsupported)?;
                            e.insert(bytes)
                        }
                    };
                    buf.extend_from_slice(bytes);
                }
            }
            if buf.len() >= 1 << 22 {
                w.write_all(&buf)?;
                buf.clear();
            }
        }
        w.write_all(&buf)
    }

    /// The whole matrix in `ty` as bytes (small matrices: the drafter's).
    pub fn to_bytes(&self, ty: GgmlType) -> std::io::Result<Vec<u8>> {
        let mut out = Vec::with_capacity(self.bytes(ty) as usize);
        self.write(ty, &mut Rng::new(1), &mut out)?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_land_on_their_columns_and_the_rest_is_zero() {
        let small = [1.0f32, 2.0, 3.0, 4.0];
        let m = Matrix {
            rows: 3,
            cols: 8,
            place: every_copy(2, 2),
            row: Box::new(|r| match r {
                0 => Row::Small(&small[0..2], 1.0),
                1 => Row::Zero,
                _ => Row::Small(&small[2..4], 0.5),
            }),
        };
        let bytes = m.to_bytes(GgmlType::F32).unwrap();
        let v: Vec<f32> = bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(
            v,
            [
                1.0, 2.0, 1.0, 2.0, 0.0, 0.0, 0.0, 0.0, //
                0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, //
                1.5, 2.0, 1.5, 2.0, 0.0, 0.0, 0.0, 0.0
            ]
        );
        assert_eq!(m.bytes(GgmlType::F32), bytes.len() as u64);
    }

    #[test]
    fn random_rows_are_not_zero_and_quantized_rows_have_the_block_size() {
        let m = Matrix {
            rows: 2,
            cols: 256,
            place: first_copy(0),
            row: Box::new(|r| if r == 0 { Row::Random } else { Row::Zero }),
        };
        for ty in [GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K] {
            let bytes = m.to_bytes(ty).unwrap();
            assert_eq!(bytes.len() as u64, m.bytes(ty));
            let half = bytes.len() / 2;
            assert!(bytes[..half].iter().any(|&b| b != 0));
            assert!(bytes[half..].iter().all(|&b| b == 0));
        }
    }
}
