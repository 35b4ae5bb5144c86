//! Writes a random EAGLE-3 drafter of the published Qwen3-30B-A3B shape (SpecForge
//! `configs/qwen3-30B-A3B-eagle3.json`: hidden 2048, 32 heads / 4 KV × 128, intermediate 12288,
//! vocabulary 151,936, draft vocabulary 32,000, bf16), in the SpecForge tensor layout, to measure
//! drafting cost at full size beside a full-size GGUF target. Its proposals are random (nothing
//! is trained); only speed is meaningful.
//!
//! ```sh
//! cargo run --release -p specfit-engine --example random_eagle3 -- bench-models/full/eagle3-qwen3-30b-a3b
//! ```

use specfit_engine::model::random_eagle3::RandomEagle3;

fn main() {
    let Some(dir) = std::env::args().nth(1).map(std::path::PathBuf::from) else {
        eprintln!("usage: random_eagle3 OUT_DIR");
        std::process::exit(2);
    };
    if let Err(e) = RandomEagle3::qwen3_30b_a3b().write(&dir) {
        eprintln!("error: {e}");
        std::process::exit(2);
    }
    eprintln!("wrote {}", dir.display());
}
