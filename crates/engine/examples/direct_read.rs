//! The raw O_DIRECT read bandwidth of a file, for comparing the disk tier's copy rate with what
//! the device gives: random block-aligned reads of `block` bytes, `threads` reads in flight.
//!
//! ```text
//! cargo run --release -p specfit-engine --example direct_read -- FILE [BLOCK_BYTES] [READS] [THREADS]
//! ```

use std::fs::OpenOptions;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::time::Instant;

use specfit_engine::experts::aligned::{padded, AlignedBuf};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let path = args
        .get(1)
        .expect("usage: direct_read FILE [BLOCK_BYTES] [READS] [THREADS]");
    let block = padded(args.get(2).and_then(|v| v.parse().ok()).unwrap_or(786_432));
    let reads: usize = args.get(3).and_then(|v| v.parse().ok()).unwrap_or(2000);
    let threads: usize = args.get(4).and_then(|v| v.parse().ok()).unwrap_or(1);
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .expect("open O_DIRECT");
    let blocks = (file.metadata().expect("stat").len() as usize / block).max(1);
    let start = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            let file = &file;
            s.spawn(move || {
                let mut buf = AlignedBuf::zeroed(block);
                let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ t as u64;
                for _ in 0..reads / threads {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let at = (x as usize % blocks) * block;
                    file.read_exact_at(buf.as_mut_slice(), at as u64)
                        .expect("read");
                }
            });
        }
    });
    let secs = start.elapsed().as_secs_f64();
    let bytes = (reads / threads * threads * block) as f64;
    println!(
        "{reads} random reads of {} KiB, {threads} in flight: {:.0} MiB/s ({:.1} µs per read)",
        block / 1024,
        bytes / secs / (1 << 20) as f64,
        secs * 1e6 / reads as f64
    );
}
