//! Quantized products with the weights streamed from memory, as a decode or verify forward meets
//! them (`quant_speed` measures them in cache, on one thread): 48 random 4096 × 2048 matrices of
//! one type (226 MB of Q4_K, more than any L3), each multiplied in turn by the same 1 to 16
//! activation rows on the worker pool (`SPECFIT_THREADS`); the median of 7 passes, as time per
//! matrix and the weights' bytes per second.
//!
//! ```sh
//! cargo build --release -p specfit-engine --example quant_stream
//! SPECFIT_THREADS=2 target/release/examples/quant_stream [TYPE…]   # default Q4_K Q6_K
//! ```

use specfit_engine::kernels::quant::QuantMatrix;
use specfit_gguf::GgmlType;
use std::time::Instant;

/// Matrices per pass: enough bytes that no cache holds them.
const MATRICES: usize = 48;

fn main() {
    let wanted: Vec<String> = std::env::args().skip(1).collect();
    let types = [
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::Q8_0,
    ];
    let chosen: Vec<GgmlType> = if wanted.is_empty() {
        vec![GgmlType::Q4_K, GgmlType::Q6_K]
    } else {
        types
            .into_iter()
            .filter(|ty| wanted.iter().any(|w| w.eq_ignore_ascii_case(ty.name())))
            .collect()
    };
    let (n, k) = (4096usize, 2048usize);
    for ty in chosen {
        let mats = random_matrices(ty, n, k);
        let bytes = mats[0].view().bytes().len() as f64;
        // One untimed pass: every page touched once.
        let mut warm = vec![0.0f32; n];
        for m in &mats {
            m.view().gemm(&vec![0.5f32; k], 1, &mut warm);
        }
        for rows in [1usize, 2, 3, 4, 8, 16] {
            let x: Vec<f32> = (0..rows * k)
                .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
                .collect();
            let mut out = vec![0.0f32; rows * n];
            let mut times: Vec<f64> = (0..7)
                .map(|_| {
                    let t = Instant::now();
                    for m in &mats {
                        m.view().gemm(&x, rows, &mut out);
                    }
                    t.elapsed().as_secs_f64() / MATRICES as f64
                })
                .collect();
            times.sort_by(f64::total_cmp);
            let median = times[3];
            println!(
                "{} {n}×{k} rows {rows:2}: {:7.1} µs per matrix ({:4.1}–{:4.1}), {:5.1} GB/s",
                ty.name(),
                median * 1e6,
                times[0] * 1e6,
                times[6] * 1e6,
                bytes / median / 1e9
            );
        }
    }
}

/// `MATRICES` matrices of random blocks (their f16 scales kept small and finite).
fn random_matrices(ty: GgmlType, n: usize, k: usize) -> Vec<QuantMatrix> {
    let (elems, bytes) = ty.block();
    let mut state = 1u64;
    (0..MATRICES)
        .map(|_| {
            let src: Vec<u8> = (0..n * (k / elems) * bytes)
                .map(|i| {
                    state = state
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let b = (state >> 33) as u8;
                    // The high byte of every f16 (the scales sit in the first 4 or last 2 bytes).
                    let at = i % bytes;
                    if (at < 4 || at >= bytes - 2) && at % 2 == 1 {
                        b & 0x1B
                    } else {
                        b
                    }
                })
                .collect();
            QuantMatrix::from_gguf(ty, &src, n, k).expect("an integer type")
        })
        .collect()
}
