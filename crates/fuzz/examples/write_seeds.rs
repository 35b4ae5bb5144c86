//! Writes every fuzz target's seed inputs into `fuzz/corpus/TARGET/seed-*`.
//!
//! ```sh
//! cargo run --release -p specfit-fuzz --example write_seeds
//! ```

fn main() -> std::io::Result<()> {
    specfit_fuzz::seeds::write()
}
