//! Throughput of the quantized kernels on GGUF rows as stored, per type, for the matrices of one
//! Qwen3-30B-A3B expert (`gate`/`up` 768 × 2048, `down` 2048 × 768) and an attention projection
//! (4096 × 2048), on one thread, at 1 to 16 activation rows: the median of 7 timings of 20 calls,
//! the spread, and the cost of `rows` rows over one row's; then the product alone on activations
//! quantized beforehand (as a forward shares them between matrices with the same input), and
//! the quantizing alone.
//!
//! ```sh
//! cargo run --release -p specfit-engine --example quant_speed [TYPE…]
//! ```

use specfit_engine::kernels::quant::{QuantActs, QuantMatrix};
use specfit_engine::kernels::Isa;
use specfit_gguf::GgmlType;

fn main() {
    let wanted: Vec<String> = std::env::args().skip(1).collect();
    println!("isa {}", Isa::detected().name());
    #[cfg(target_arch = "x86_64")]
    if Isa::detected() != Isa::Portable {
        let rate = peak::madd_rate();
        println!(
            "integer peak (vpmaddubsw + vpmaddwd + vpaddd on registers, one thread): {:.1} G products/s, \
             so 8 rows of a 768×2048 matrix take at least {:.0} µs",
            rate / 1e9,
            8.0 * 768.0 * 2048.0 / rate * 1e6
        );
        if std::arch::is_x86_feature_detected!("avx512vnni")
            && std::arch::is_x86_feature_detected!("avx512bw")
        {
            let rate = peak::dpbusd_rate();
            println!(
                "integer peak (vpdpbusd on 512-bit registers, one thread): {:.1} G products/s, \
                 so 8 rows of a 768×2048 matrix take at least {:.0} µs",
                rate / 1e9,
                8.0 * 768.0 * 2048.0 / rate * 1e6
            );
        }
    }
    for ty in [
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
    ] {
        if !wanted.is_empty() && !wanted.iter().any(|w| w.eq_ignore_ascii_case(ty.name())) {
            continue;
        }
        for (n, k) in [(768usize, 2048usize), (2048, 768), (4096, 2048)] {
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
            let mut one_row = (0.0, 0.0);
            for rows in [1usize, 2, 4, 8, 16] {
                let x: Vec<f32> = (0..rows * k)
                    .map(|i| ((i * 7919) % 97) as f32 - 48.0)
                    .collect();
                let mut out = vec![0.0f32; rows * n];
                let isa = Isa::detected();
                let s = median(|| m.view().gemm_with(isa, &x, rows, &mut out, false));
                let acts = QuantActs::quantize(ty, &x, rows, k);
                let kernel = median(|| m.view().gemm_quantized(isa, &acts, &mut out, false));
                let quantize = median(|| {
                    std::hint::black_box(QuantActs::quantize(ty, &x, rows, k));
                });
                if rows == 1 {
                    one_row = (s.0, kernel.0);
                }
                println!(
                    "{:5} {n}×{k} rows {rows:2}: {:7.1} µs ({:5.1}–{:5.1}), {:5.2} G weights/s, {:4.2}× one row; \
                     product alone {:7.1} µs ({:4.2}× one row), quantizing {:5.1} µs",
                    ty.name(),
                    1e6 * s.0,
                    1e6 * s.1,
                    1e6 * s.2,
                    (n * k) as f64 / s.0 / 1e9,
                    s.0 / one_row.0,
                    1e6 * kernel.0,
                    kernel.0 / one_row.1,
                    1e6 * quantize.0,
                );
            }
        }
    }
}

/// The median, fastest and slowest of 7 timings of 20 calls of `run`, in seconds per call.
fn median(mut run: impl FnMut()) -> (f64, f64, f64) {
    run();
    let reps = 20;
    let mut times: Vec<f64> = (0..7)
        .map(|_| {
            let t = std::time::Instant::now();
            for _ in 0..reps {
                run();
            }
            t.elapsed().as_secs_f64() / reps as f64
        })
        .collect();
    times.sort_by(f64::total_cmp);
    (times[3], times[0], times[6])
}

/// The machine's rate of the AVX2 kernels' inner step with no memory traffic: the floor under
/// any kernel that multiplies every weight by every row's activation once.
#[cfg(target_arch = "x86_64")]
mod peak {
    use std::arch::x86_64::*;

    /// Byte products per second of `vpmaddubsw` → `vpmaddwd` → `vpaddd` chains (8 independent
    /// accumulators, as the kernels keep), one thread.
    pub fn madd_rate() -> f64 {
        // SAFETY: only called when the detected instruction set includes AVX2.
        let run = |iters: u64| unsafe { chains(iters) };
        run(1 << 16);
        let iters = 1u64 << 22;
        let mut best = f64::MAX;
        for _ in 0..5 {
            let t = std::time::Instant::now();
            std::hint::black_box(run(iters));
            best = best.min(t.elapsed().as_secs_f64());
        }
        (iters * 8 * 32) as f64 / best
    }

    /// Byte products per second of `vpdpbusd` on 512-bit registers (8 independent accumulators),
    /// one thread: the floor under the VNNI kernels.
    pub fn dpbusd_rate() -> f64 {
        // SAFETY: only called when the CPU has AVX-512 VNNI.
        let run = |iters: u64| unsafe { dpbusd_chains(iters) };
        run(1 << 16);
        let iters = 1u64 << 22;
        let mut best = f64::MAX;
        for _ in 0..5 {
            let t = std::time::Instant::now();
            std::hint::black_box(run(iters));
            best = best.min(t.elapsed().as_secs_f64());
        }
        (iters * 8 * 64) as f64 / best
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    fn dpbusd_chains(iters: u64) -> i32 {
        let w: [__m512i; 8] =
            std::hint::black_box(std::array::from_fn(|i| _mm512_set1_epi8(i as i8 + 1)));
        let step = std::hint::black_box(_mm512_set1_epi8(1));
        let mut a = std::hint::black_box(_mm512_set1_epi8(-3));
        let mut acc = [_mm512_setzero_si512(); 8];
        for _ in 0..iters {
            for (acc, &w) in acc.iter_mut().zip(&w) {
                *acc = _mm512_dpbusd_epi32(*acc, w, a);
            }
            a = _mm512_add_epi8(a, step);
        }
        let total = acc
            .iter()
            .fold(_mm512_setzero_si512(), |s, &v| _mm512_add_epi32(s, v));
        _mm512_reduce_add_epi32(total)
    }

    #[target_feature(enable = "avx2")]
    fn chains(iters: u64) -> i32 {
        // Eight weight registers, activations changing every round (nothing to hoist).
        let w: [__m256i; 8] =
            std::hint::black_box(std::array::from_fn(|i| _mm256_set1_epi8(i as i8 + 1)));
        let (step, scale) = std::hint::black_box((_mm256_set1_epi8(1), _mm256_set1_epi16(5)));
        let mut a = std::hint::black_box(_mm256_set1_epi8(-3));
        let mut acc = [_mm256_setzero_si256(); 8];
        for _ in 0..iters {
            for (acc, &w) in acc.iter_mut().zip(&w) {
                let pairs = _mm256_maddubs_epi16(w, a);
                *acc = _mm256_add_epi32(*acc, _mm256_madd_epi16(pairs, scale));
            }
            a = _mm256_add_epi8(a, step);
        }
        let total = acc
            .iter()
            .fold(_mm256_setzero_si256(), |s, &v| _mm256_add_epi32(s, v));
        _mm256_extract_epi32::<0>(total)
    }
}
