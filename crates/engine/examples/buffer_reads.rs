//! Whether O_DIRECT reads land faster in some slot buffers than in others: allocates 24
//! buffers shaped like one layer's slots (16 × 64 KiB, as the bench's per-configuration caches
//! are), then, in 4 passes, times 200 random 64 KiB reads into each, one at a time, and prints
//! each buffer's mean. Written to chase a per-cache slowdown seen in `specfit bench`
//! (BENCHMARKS.md); on this VM every buffer measured 95–105 µs per read.
//!
//! ```text
//! cargo run --release -p specfit-engine --example buffer_reads -- models/target/experts.specfit
//! ```

use std::fs::OpenOptions;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::time::Instant;

use specfit_engine::experts::aligned::AlignedBuf;

const BLOCK: usize = 64 * 1024;
const SLOTS: usize = 16;
const BUFFERS: usize = 24;
const PASSES: usize = 4;
const READS: usize = 200;

fn main() {
    let path = std::env::args()
        .nth(1)
        .expect("usage: buffer_reads EXPERT_FILE");
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(&path)
        .expect("open O_DIRECT");
    let blocks = (file.metadata().expect("stat").len() as usize / BLOCK).max(1);
    let mut buffers: Vec<AlignedBuf> = (0..BUFFERS)
        .map(|_| AlignedBuf::zeroed(SLOTS * BLOCK))
        .collect();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut micros = vec![0.0f64; BUFFERS];
    for _ in 0..PASSES {
        for (buffer, total) in buffers.iter_mut().zip(micros.iter_mut()) {
            let start = Instant::now();
            for r in 0..READS {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let at = (x as usize % blocks) * BLOCK;
                let slot = (r % SLOTS) * BLOCK;
                file.read_exact_at(&mut buffer.as_mut_slice()[slot..slot + BLOCK], at as u64)
                    .expect("read");
            }
            *total += start.elapsed().as_secs_f64() * 1e6 / READS as f64;
        }
    }
    for (i, (buffer, total)) in buffers.iter().zip(&micros).enumerate() {
        println!(
            "buffer {i:2} at {:p}: {:.1} µs per read",
            buffer.as_slice().as_ptr(),
            total / PASSES as f64
        );
    }
}
