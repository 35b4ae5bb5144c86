//! This machine's memory read bandwidth, the floor under every expert a forward reads from RAM:
//! `--bytes` (default 2 GiB) summed as 64-bit words by one thread and by every thread of the
//! worker pool (`SPECFIT_THREADS`), each part contiguous, from anonymous memory on 4 KiB pages,
//! on transparent huge pages, and (with `--file`) from a file mapped as the RAM tier maps a GGUF
//! file (read once first, so it sits in the page cache). Median and spread of `--reps` passes.
//!
//! ```sh
//! cargo build --release -p specfit-engine --example mem_bandwidth
//! SPECFIT_THREADS=2 target/release/examples/mem_bandwidth --file bench-models/paper/target-q4_k_m.gguf
//! ```

use std::hint::black_box;
use std::path::PathBuf;
use std::time::Instant;

use specfit_engine::experts::aligned::AlignedBuf;

struct Args {
    bytes: usize,
    reps: usize,
    file: Option<PathBuf>,
}

fn parse() -> Args {
    let mut a = Args {
        bytes: 2 << 30,
        reps: 7,
        file: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--bytes" => a.bytes = value.parse().expect("--bytes: a number of bytes"),
            "--reps" => a.reps = value.parse().expect("--reps: a count"),
            "--file" => a.file = Some(PathBuf::from(value)),
            other => panic!("unknown argument {other}"),
        }
    }
    assert!(
        a.bytes >= 1 << 20 && a.bytes <= 64 << 30,
        "--bytes 1 MiB to 64 GiB"
    );
    assert!((1..=1000).contains(&a.reps), "--reps 1 to 1000");
    a
}

/// The sum of `bytes` as little-endian 64-bit words, eight running sums (so the loop is bound
/// by loads, not by one chain of adds).
fn sum_words(bytes: &[u8]) -> u64 {
    let mut s = [0u64; 8];
    let mut chunks = bytes.chunks_exact(64);
    for chunk in &mut chunks {
        for (acc, w) in s.iter_mut().zip(chunk.chunks_exact(8)) {
            *acc = acc.wrapping_add(u64::from_le_bytes(w.try_into().expect("8 bytes")));
        }
    }
    let tail: u64 = chunks.remainder().iter().map(|&b| b as u64).sum();
    s.iter().fold(tail, |a, &b| a.wrapping_add(b))
}

/// GB/s of reading `bytes` once with `parts` threads (1: the calling thread), median and
/// min–max over `reps` passes.
fn bandwidth(bytes: &[u8], parallel: bool, reps: usize) -> (f64, f64, f64) {
    let pool = specfit_engine::threads::pool();
    let parts = if parallel { pool.threads() } else { 1 };
    let mut rates: Vec<f64> = (0..reps)
        .map(|_| {
            let start = Instant::now();
            if parts == 1 {
                black_box(sum_words(bytes));
            } else {
                pool.run(&|part| {
                    let n = bytes.len();
                    black_box(sum_words(&bytes[n * part / parts..n * (part + 1) / parts]));
                });
            }
            bytes.len() as f64 / start.elapsed().as_secs_f64() / 1e9
        })
        .collect();
    rates.sort_by(f64::total_cmp);
    (rates[reps / 2], rates[0], rates[reps - 1])
}

fn report(what: &str, bytes: &[u8], reps: usize) {
    let threads = specfit_engine::threads::pool().threads();
    for (parallel, label) in [(false, 1), (true, threads)] {
        let (median, lo, hi) = bandwidth(bytes, parallel, reps);
        println!(
            "{what:<34} {label} thread(s): {median:6.2} GB/s ({lo:.2}–{hi:.2}) over {:.2} GiB",
            bytes.len() as f64 / (1u64 << 30) as f64
        );
    }
}

fn main() {
    let a = parse();
    let mut small = vec![0u8; a.bytes];
    // Touch every page so the pass measures reads, not faults.
    for (i, b) in small.iter_mut().enumerate().step_by(4096) {
        *b = i as u8;
    }
    report("anonymous, 4 KiB pages", &small, a.reps);
    drop(small);
    let mut huge = AlignedBuf::huge_zeroed(a.bytes);
    for (i, b) in huge.as_mut_slice().iter_mut().enumerate().step_by(4096) {
        *b = i as u8;
    }
    report("anonymous, transparent huge pages", huge.as_slice(), a.reps);
    drop(huge);
    if let Some(path) = &a.file {
        let file = std::fs::File::open(path).expect("open --file");
        // SAFETY: the file is only read, and nothing truncates it while this runs.
        let map = unsafe { memmap2::Mmap::map(&file) }.expect("map --file");
        let len = a.bytes.min(map.len());
        let bytes = &map[map.len() - len..];
        black_box(sum_words(bytes));
        report("file mapped (page cache)", bytes, a.reps);
    }
}
