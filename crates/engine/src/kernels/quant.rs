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

/// Bytes of the quantized panels of an `n × k` matrix of GGUF type `ty`, if `ty` has an integer
/// form and `k` is whole blocks.
pub fn panels_len(ty: GgmlType, n: usize, k: usize) -> Option<usize> {
    let form = int_groups(ty)?;
    k.is_multiple_of(ty.block().0)
        .then(|| n.div_ceil(PANEL) * (k / form.group) * group_bytes(form))
}

/// Repacks the row-major `n × k` matrix `bytes` of GGUF type `ty` (each row whole blocks) into
/// quantized panels in `out` (exactly [`panels_len`] bytes; padding columns are written as 0).
///
/// # Panics
/// When `ty` has no integer form or the sizes do not match.
pub fn repack(ty: GgmlType, bytes: &[u8], n: usize, k: usize, out: &mut [u8]) {
    let form = int_groups(ty).expect("a type with an integer form");
    let (elems, block_bytes) = ty.block();
    assert!(
        k.is_multiple_of(elems) && bytes.len() == n * (k / elems) * block_bytes,
        "{} bytes are not {n} rows of {k} {}",
        bytes.len(),
        ty.name()
    );
    assert_eq!(Some(out.len()), panels_len(ty, n, k), "panel buffer size");
    out.fill(0);
    let gb = group_bytes(form);
    let head = if form.offset { 128 } else { 64 };
    let panel_bytes = (k / form.group) * gb;
    let groups_per_block = elems / form.group;
    let (mut q, mut scale, mut offset) = (
        vec![0i8; elems],
        vec![0.0f32; groups_per_block],
        vec![0.0f32; groups_per_block],
    );
    let row_bytes = (k / elems) * block_bytes;
    for j in 0..n {
        let (p, c) = (j / PANEL, j % PANEL);
        let row = &bytes[j * row_bytes..(j + 1) * row_bytes];
        for (b, block) in row.chunks_exact(block_bytes).enumerate() {
            split_block(ty, block, &mut q, &mut scale, &mut offset);
            for g in 0..groups_per_block {
                let at = p * panel_bytes + (b * groups_per_block + g) * gb;
                out[at + 4 * c..at + 4 * c + 4].copy_from_slice(&scale[g].to_le_bytes());
                if form.offset {
                    out[at + 64 + 4 * c..at + 68 + 4 * c].copy_from_slice(&offset[g].to_le_bytes());
                }
                let qs = &q[g * form.group..(g + 1) * form.group];
                for (kk, &v) in qs.iter().enumerate() {
                    out[at + head + kk * PANEL + c] = v as u8;
                }
            }
        }
    }
}

/// A quantized `n × k` matrix in panels, owned.
#[derive(Debug, Clone, PartialEq)]
pub struct QuantMatrix {
    n: usize,
    k: usize,
    ty: GgmlType,
    data: Vec<u8>,
}

impl QuantMatrix {
    /// Repacks the row-major `n × k` matrix `bytes` of GGUF type `ty` (each row whole blocks).
    /// `None` when `ty` has no integer form (float types go to [`super::PackedMatrix`]).
    pub fn from_gguf(ty: GgmlType, bytes: &[u8], n: usize, k: usize) -> Option<QuantMatrix> {
        let mut data = vec![0u8; panels_len(ty, n, k)?];
        repack(ty, bytes, n, k, &mut data);
        Some(QuantMatrix { n, k, ty, data })
    }

    /// A borrowed view.
    pub fn view(&self) -> QuantView<'_> {
        QuantView::new(self.ty, self.n, self.k, &self.data)
    }
}

/// Quantized panels of an `n × k` matrix held elsewhere (e.g. in an expert slot).
#[derive(Debug, Clone, Copy)]
pub struct QuantView<'a> {
    n: usize,
    k: usize,
    form: IntGroups,
    data: &'a [u8],
}

impl<'a> QuantView<'a> {
    /// Views [`panels_len`]`(ty, n, k)` bytes of panels written by [`repack`].
    pub fn new(ty: GgmlType, n: usize, k: usize, data: &'a [u8]) -> QuantView<'a> {
        let len = panels_len(ty, n, k).expect("a type with an integer form");
        assert_eq!(data.len(), len, "quantized panels are not n × k");
        QuantView {
            n,
            k,
            form: int_groups(ty).expect("checked"),
            data,
        }
    }

    fn panel_bytes(&self) -> usize {
        (self.k / self.form.group) * group_bytes(self.form)
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

    /// `out = x · Wᵀ` for `x` of `rows × k`, split by panel across the worker pool when large
    /// enough (which never changes a bit).
    pub fn gemm(&self, x: &[f32], rows: usize, out: &mut [f32]) {
        self.gemm_with(Isa::detected(), x, rows, out, true);
    }

    /// [`QuantView::gemm`] on the calling thread only.
    pub fn gemm_serial(&self, x: &[f32], rows: usize, out: &mut [f32]) {
        self.gemm_with(Isa::detected(), x, rows, out, false);
    }

    /// [`QuantView::gemm`] compiled for `isa`, on the worker pool when `parallel`.
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
            let got = m.view().dequantized();
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
                let f = PackedMatrix::pack(WeightView::F32(&q.view().dequantized()), n, k);
                let mut state = 9u64;
                for isa in Isa::available() {
                    for rows in [1, 2, 3, 4, 5, 8, 9, 17, 32] {
                        let x: Vec<f32> = (0..rows * k).map(|_| lcg(&mut state)).collect();
                        let (mut a, mut b) = (vec![0.0; rows * n], vec![0.0; rows * n]);
                        q.view().gemm_with(isa, &x, rows, &mut a, rows % 2 == 0);
                        f.view().gemm_with(isa, &x, rows, &mut b, false);
                        let same = a.iter().zip(&b).all(|(u, v)| u.to_bits() == v.to_bits());
                        assert!(same, "{} {isa:?} n {n} k {k} rows {rows}", ty.name());
                        // Row 0 alone gets the bits it gets inside the batch.
                        let mut alone = vec![0.0; n];
                        q.view().gemm_with(isa, &x[..k], 1, &mut alone, false);
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
