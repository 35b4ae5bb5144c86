//! Quantized panels: a matrix from a GGUF file kept at one byte per weight, in the panel order
//! of [`crate::kernels::packed`]. Panel `p` (16 output columns) holds, for each group of `G`
//! consecutive `k` (G = 32, or 16 for Q6_K): 16 f32 scales, 16 f32 offsets (types that have
//! them), then `G` rows of 16 signed bytes. The kernel rebuilds each weight as `q · scale
//! (+ offset)` — exactly the value [`specfit_gguf::dequant`] decodes (`split_block`) — and runs
//! the float panel kernel's chain on it, so a product with a quantized matrix equals, bit for
//! bit, the product with its dequantized f32 matrix, at any batch size, on every instruction
//! set. It reads a quarter of the f32 bytes (Q8_0) to a half of bf16's.

use specfit_gguf::dequant::{int_groups, split_block, IntGroups};
use specfit_gguf::GgmlType;

use super::packed::{gemm_panels, PanelSrc, PANEL};
use super::Isa;

/// A quantized `n × k` matrix in panels.
#[derive(Debug, Clone, PartialEq)]
pub struct QuantMatrix {
    n: usize,
    k: usize,
    form: IntGroups,
    /// The GGUF type it came from (for reports).
    ty: GgmlType,
    data: Vec<u8>,
}

impl QuantMatrix {
    /// Repacks the row-major `n × k` matrix `bytes` of GGUF type `ty` (each row whole blocks).
    /// `None` when `ty` has no integer form (float types go to [`super::PackedMatrix`]).
    pub fn from_gguf(ty: GgmlType, bytes: &[u8], n: usize, k: usize) -> Option<QuantMatrix> {
        let form = int_groups(ty)?;
        let (elems, block_bytes) = ty.block();
        assert!(
            k.is_multiple_of(elems) && bytes.len() == n * (k / elems) * block_bytes,
            "{} bytes are not {n} rows of {k} {}",
            bytes.len(),
            ty.name()
        );
        let mut m = QuantMatrix::zeroed(n, k, form, ty);
        let groups_per_block = elems / form.group;
        let (mut q, mut scale, mut offset) = (
            vec![0i8; elems],
            vec![0.0f32; groups_per_block],
            vec![0.0f32; groups_per_block],
        );
        let row_bytes = (k / elems) * block_bytes;
        for j in 0..n {
            let row = &bytes[j * row_bytes..(j + 1) * row_bytes];
            for (b, block) in row.chunks_exact(block_bytes).enumerate() {
                split_block(ty, block, &mut q, &mut scale, &mut offset);
                for g in 0..groups_per_block {
                    let group = b * groups_per_block + g;
                    let qs = &q[g * form.group..(g + 1) * form.group];
                    m.set(j, group, scale[g], offset[g], qs);
                }
            }
        }
        Some(m)
    }

    fn zeroed(n: usize, k: usize, form: IntGroups, ty: GgmlType) -> QuantMatrix {
        let panels = n.div_ceil(PANEL);
        let len = panels * (k / form.group) * group_bytes(form);
        QuantMatrix {
            n,
            k,
            form,
            ty,
            data: vec![0u8; len],
        }
    }

    /// Writes column `j`'s group `g`: its scale, offset and `G` integers.
    fn set(&mut self, j: usize, g: usize, scale: f32, offset: f32, q: &[i8]) {
        let (p, c) = (j / PANEL, j % PANEL);
        let gb = group_bytes(self.form);
        let at = p * self.panel_bytes() + g * gb;
        self.data[at + 4 * c..at + 4 * c + 4].copy_from_slice(&scale.to_le_bytes());
        let head = if self.form.offset {
            let o = at + 64 + 4 * c;
            self.data[o..o + 4].copy_from_slice(&offset.to_le_bytes());
            128
        } else {
            64
        };
        for (kk, &v) in q.iter().enumerate() {
            self.data[at + head + kk * PANEL + c] = v as u8;
        }
    }

    fn panel_bytes(&self) -> usize {
        (self.k / self.form.group) * group_bytes(self.form)
    }

    /// Output features.
    pub fn n(&self) -> usize {
        self.n
    }

    /// Input features.
    pub fn k(&self) -> usize {
        self.k
    }

    /// The GGUF type the matrix came from.
    pub fn ggml_type(&self) -> GgmlType {
        self.ty
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.data.len()
    }

    /// Element `(j, kk)`, as the kernel rebuilds it.
    pub fn get(&self, j: usize, kk: usize) -> f32 {
        let (p, c) = (j / PANEL, j % PANEL);
        let (g, r) = (kk / self.form.group, kk % self.form.group);
        let at = p * self.panel_bytes() + g * group_bytes(self.form);
        let f = |o: usize| f32::from_le_bytes(self.data[o..o + 4].try_into().expect("4 bytes"));
        let head = if self.form.offset { 128 } else { 64 };
        let q = self.data[at + head + r * PANEL + c] as i8 as f32;
        let v = q * f(at + 4 * c);
        if self.form.offset {
            v + f(at + 64 + 4 * c)
        } else {
            v
        }
    }

    /// The matrix decoded, row-major `n × k`.
    pub fn dequantized(&self) -> Vec<f32> {
        (0..self.n)
            .flat_map(|j| (0..self.k).map(move |kk| (j, kk)))
            .map(|(j, kk)| self.get(j, kk))
            .collect()
    }

    fn src(&self) -> PanelSrc {
        PanelSrc::Quant {
            base: self.data.as_ptr(),
            pstride: self.panel_bytes(),
            group: self.form.group,
            offset: self.form.offset,
        }
    }

    /// `out = x · Wᵀ` for `x` of `rows × k` (see [`super::PackedView::gemm`]).
    pub fn gemm(&self, x: &[f32], rows: usize, out: &mut [f32]) {
        self.gemm_with(Isa::detected(), x, rows, out, true);
    }

    /// [`QuantMatrix::gemm`] compiled for `isa`, on the worker pool when `parallel`.
    pub fn gemm_with(&self, isa: Isa, x: &[f32], rows: usize, out: &mut [f32], parallel: bool) {
        gemm_panels(isa, self.src(), (self.n, self.k), (x, rows), out, parallel);
    }
}

/// Bytes of one group of one panel.
fn group_bytes(form: IntGroups) -> usize {
    (if form.offset { 128 } else { 64 }) + PANEL * form.group
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::tests::lcg;
    use crate::kernels::{PackedMatrix, WeightView};

    /// `n` rows of `k` random blocks of `ty` with modest finite scales.
    fn random_gguf(ty: GgmlType, n: usize, k: usize, seed: u64) -> Vec<u8> {
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

    #[test]
    fn every_weight_is_rebuilt_as_the_gguf_dequantizer_decodes_it() {
        for ty in TYPES {
            let (n, k) = (21, 512);
            let bytes = random_gguf(ty, n, k, 3);
            let m = QuantMatrix::from_gguf(ty, &bytes, n, k).unwrap();
            let mut want = vec![0.0f32; n * k];
            specfit_gguf::dequant::dequantize(ty, &bytes, &mut want).unwrap();
            let got = m.dequantized();
            assert!(
                got.iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{}",
                ty.name()
            );
        }
    }

    #[test]
    fn products_equal_the_float_kernels_on_the_dequantized_matrix_bit_for_bit_at_any_batch() {
        for ty in TYPES {
            let (elems, _) = ty.block();
            for (n, k) in [(16, elems), (37, 2 * elems), (5, elems)] {
                let bytes = random_gguf(ty, n, k, n as u64);
                let q = QuantMatrix::from_gguf(ty, &bytes, n, k).unwrap();
                let f = PackedMatrix::pack(WeightView::F32(&q.dequantized()), n, k);
                let mut state = 9u64;
                for isa in Isa::available() {
                    for rows in [1, 2, 3, 4, 5, 8, 9, 17, 32] {
                        let x: Vec<f32> = (0..rows * k).map(|_| lcg(&mut state)).collect();
                        let (mut a, mut b) = (vec![0.0; rows * n], vec![0.0; rows * n]);
                        q.gemm_with(isa, &x, rows, &mut a, rows % 2 == 0);
                        f.view().gemm_with(isa, &x, rows, &mut b, false);
                        let same = a.iter().zip(&b).all(|(u, v)| u.to_bits() == v.to_bits());
                        assert!(same, "{} {isa:?} n {n} k {k} rows {rows}", ty.name());
                        // Row 0 alone gets the bits it gets inside the batch.
                        let mut alone = vec![0.0; n];
                        q.gemm_with(isa, &x[..k], 1, &mut alone, false);
                        assert!(alone
                            .iter()
                            .zip(&a[..n])
                            .all(|(u, v)| u.to_bits() == v.to_bits()));
                    }
                }
            }
        }
    }

    #[test]
    fn float_types_have_no_quantized_panels() {
        assert!(QuantMatrix::from_gguf(GgmlType::F32, &[0u8; 128], 1, 32).is_none());
        assert!(QuantMatrix::from_gguf(GgmlType::BF16, &[0u8; 64], 1, 32).is_none());
    }
}
