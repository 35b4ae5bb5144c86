//! Time of the batch-invariant kernels at the shipped target's shapes, single thread: GFLOP/s of
//! the packed panel kernel (dense layers, experts) per row count, for f32 and bf16 weights, and
//! the worker pool's round trip (`SPECFIT_THREADS` threads).
//!
//! ```text
//! cargo run --release -p specfit-engine --example kernel_speed
//! SPECFIT_ISA=avx2 cargo run --release -p specfit-engine --example kernel_speed    # another variant
//! ```

use std::time::Instant;

use specfit_engine::kernels::{Isa, PackedMatrix, WeightView};

fn main() {
    let isa = Isa::detected();
    println!("isa {}", isa.name());
    pool_overhead();
    for &(n, k) in &[(512usize, 256usize), (4096, 256), (80, 256), (256, 40)] {
        let w: Vec<f32> = (0..n * k)
            .map(|i| ((i * 7919) % 1000) as f32 * 1e-3 - 0.5)
            .collect();
        let w16: Vec<u16> = w.iter().map(|v| (v.to_bits() >> 16) as u16).collect();
        for (name, m) in [
            ("f32", PackedMatrix::pack(WeightView::F32(&w), n, k)),
            ("bf16", PackedMatrix::pack(WeightView::Bf16(&w16), n, k)),
        ] {
            let mut line = format!("{n:>5}x{k:<4} {name:>4}");
            for rows in [1usize, 2, 4, 8, 16] {
                let x: Vec<f32> = (0..rows * k).map(|i| (i % 13) as f32 * 0.01).collect();
                let mut out = vec![0.0f32; rows * n];
                let reps = (20_000_000 / (rows * n * k)).max(10);
                let mut best = f64::INFINITY;
                for _ in 0..5 {
                    let t = Instant::now();
                    for _ in 0..reps {
                        m.view().gemm_with(isa, &x, rows, &mut out, false);
                        std::hint::black_box(&out);
                    }
                    best = best.min(t.elapsed().as_secs_f64() / reps as f64);
                }
                let gflops = 2.0 * (rows * n * k) as f64 / best / 1e9;
                line += &format!("  r{rows}: {:>7.2}us {gflops:>6.1}GF", best * 1e6);
            }
            println!("{line}");
        }
    }
}

/// The worker pool's round trip: one empty job handed to every thread and waited for.
fn pool_overhead() {
    let pool = specfit_engine::threads::pool();
    let n = 100_000;
    let t = Instant::now();
    for _ in 0..n {
        pool.run(&|part| {
            std::hint::black_box(part);
        });
    }
    println!(
        "pool.run round trip: {:.2} us",
        t.elapsed().as_secs_f64() / n as f64 * 1e6
    );
}
