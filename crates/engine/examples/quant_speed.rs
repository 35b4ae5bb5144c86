//! Throughput of the quantized kernels on GGUF rows as stored, per type, for the matrices of one
//! Qwen3-30B-A3B expert (`gate`/`up` 768 × 2048, `down` 2048 × 768), one thread and the worker
//! pool, at 1 to 8 activation rows.
//!
//! ```sh
//! cargo run --release -p specfit-engine --example quant_speed
//! ```

use specfit_engine::kernels::quant::QuantMatrix;
use specfit_engine::kernels::Isa;
use specfit_gguf::GgmlType;

fn main() {
    println!("isa {}", Isa::detected().name());
    for ty in [
        GgmlType::Q4_K,
        GgmlType::Q6_K,
        GgmlType::Q8_0,
        GgmlType::Q5_0,
    ] {
        for (n, k) in [(768usize, 2048usize), (2048, 768)] {
            let (elems, bytes) = ty.block();
            if k % elems != 0 {
                continue;
            }
            let mut state = 1u64;
            let mut next = || {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1);
                (state >> 56) as u8
            };
            let src: Vec<u8> = (0..n * (k / elems) * bytes)
                .map(|i| if i % bytes < 2 { next() & 0x3B } else { next() })
                .collect();
            let m = QuantMatrix::from_gguf(ty, &src, n, k).expect("an integer type");
            for rows in [1usize, 2, 4, 8] {
                let x: Vec<f32> = (0..rows * k)
                    .map(|i| ((i * 7919) % 97) as f32 - 48.0)
                    .collect();
                let mut out = vec![0.0f32; rows * n];
                for (label, parallel) in [("1 thread", false), ("pool", true)] {
                    let run = |out: &mut [f32]| {
                        m.view().gemm_with(Isa::detected(), &x, rows, out, parallel)
                    };
                    run(&mut out);
                    let reps = 50;
                    let t = std::time::Instant::now();
                    for _ in 0..reps {
                        run(&mut out);
                    }
                    let s = t.elapsed().as_secs_f64() / reps as f64;
                    println!(
                        "{:5} {n}×{k} rows {rows} {label:8}: {:7.1} µs, {:5.2} G weights/s, {:5.2} GB/s",
                        ty.name(),
                        1e6 * s,
                        (n * k) as f64 / s / 1e9,
                        src.len() as f64 / s / 1e9
                    );
                }
            }
        }
    }
}
