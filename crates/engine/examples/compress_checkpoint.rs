//! Compresses a checkpoint directory's `model.safetensors` into `model.safetensors.compressed`
//! (the form the shipped models are kept in git: `specfit_engine::compressed`), checks that it
//! decompresses to the same bytes, and prints both sizes. Run it after retraining a shipped
//! model, then commit the compressed file (the decompressed one is ignored by git).
//!
//! ```text
//! cargo run --release -p specfit-engine --example compress_checkpoint -- models/target models/drafter
//! ```

use std::path::Path;

use specfit_engine::compressed::{compress, compressed_path, decompress};

fn main() {
    let dirs: Vec<String> = std::env::args().skip(1).collect();
    if dirs.is_empty() {
        eprintln!("usage: compress_checkpoint DIR [DIR …]");
        std::process::exit(2);
    }
    for dir in dirs {
        let dir = Path::new(&dir);
        let (src, dst) = (dir.join("model.safetensors"), compressed_path(dir));
        if let Err(e) = compress(&src, &dst) {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
        let original = std::fs::read(&src).expect("read the checkpoint");
        let compressed = std::fs::read(&dst).expect("read the compressed file");
        assert!(
            decompress(&compressed).expect("decompress") == original,
            "round trip"
        );
        println!(
            "{}: {} bytes -> {} ({:.1}%)",
            dst.display(),
            original.len(),
            compressed.len(),
            100.0 * compressed.len() as f64 / original.len() as f64
        );
    }
}
