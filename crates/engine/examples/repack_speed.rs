//! Throughput of repacking GGUF rows into quantized panels (what every expert read from a GGUF
//! costs), per type, for one Qwen3-30B-A3B expert matrix (768 × 2048).
//!
//! ```sh
//! cargo run --release -p specfit-engine --example repack_speed
//! ```

use specfit_engine::kernels::quant::{panels_len, repack};
use specfit_gguf::GgmlType;

fn main() {
    let (n, k) = (768usize, 2048usize);
    for ty in [
        GgmlType::Q8_0,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
        GgmlType::Q5_0,
    ] {
        let (elems, bytes) = ty.block();
        let mut state = 1u64;
        let src: Vec<u8> = (0..n * (k / elems) * bytes)
            .map(|_| {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1);
                (state >> 56) as u8 & 0x3B
            })
            .collect();
        let mut out = vec![0u8; panels_len(ty, n, k).unwrap()];
        repack(ty, &src, n, k, &mut out); // warm
        let reps = 10;
        let t = std::time::Instant::now();
        for _ in 0..reps {
            repack(ty, &src, n, k, &mut out);
        }
        let s = t.elapsed().as_secs_f64() / reps as f64;
        println!(
            "{:5} {n}×{k}: {:.2} ms, {:.0} M weights/s",
            ty.name(),
            1e3 * s,
            (n * k) as f64 / s / 1e6
        );
    }
}
