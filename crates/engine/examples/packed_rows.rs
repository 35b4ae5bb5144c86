//! Time of one large packed bf16 product at 1 to 8 activation rows, on the worker pool: the
//! paper-scale EAGLE-3 head's MLP shapes (12,288 × 2,048 and 2,048 × 12,288, 50 MB each), as
//! feeding the drafter committed tokens or a verify's rows multiply them. With `cold`, a 640 MB
//! buffer is read before each timed call so the weights come from memory, as they do after a
//! target forward; otherwise they stay in the last-level cache between calls. Prints the fastest
//! of 7 calls per row count, in ms.
//!
//! ```text
//! cargo build --release -p specfit-engine --example packed_rows
//! SPECFIT_THREADS=2 target/release/examples/packed_rows cold
//! ```

use std::time::Instant;

use specfit_engine::kernels::{Isa, PackedMatrix, WeightView};

fn main() {
    let cold = std::env::args().skip(1).any(|a| a == "cold");
    let flush: Vec<u64> = if cold {
        (0..80_000_000u64).collect()
    } else {
        Vec::new()
    };
    let isa = Isa::detected();
    println!(
        "isa {}, weights {}",
        isa.name(),
        if cold { "cold" } else { "warm" }
    );
    for (n, k) in [(12_288usize, 2_048usize), (2_048, 12_288)] {
        // bf16 bits of small values in [-0.5, 0.5).
        let w: Vec<u16> = (0..n * k)
            .map(|i| ((((i * 7919) % 1000) as f32 * 1e-3 - 0.5).to_bits() >> 16) as u16)
            .collect();
        let m = PackedMatrix::pack(WeightView::Bf16(&w), n, k);
        let mut line = format!("{n:>6} x {k:<6}");
        for rows in 1..=8usize {
            let x: Vec<f32> = (0..rows * k).map(|i| (i % 13) as f32 * 0.01).collect();
            let mut out = vec![0.0f32; rows * n];
            let mut best = f64::INFINITY;
            for _ in 0..7 {
                std::hint::black_box(flush.iter().fold(0u64, |a, &b| a ^ b));
                let t = Instant::now();
                m.view().gemm_with(isa, &x, rows, &mut out, true);
                std::hint::black_box(&out);
                best = best.min(t.elapsed().as_secs_f64());
            }
            line += &format!("  {rows}: {:6.2}", best * 1e3);
        }
        println!("{line}");
    }
}
