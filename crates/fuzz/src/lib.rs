//! specfit's fuzz targets as plain functions of the input bytes, so that one body serves
//! libFuzzer (`fuzz/`, built by `cargo fuzz`) and the replay of the kept corpus in the ordinary
//! test suite. A target returns normally for every input, whatever it makes of it (bad input is
//! an `Err` inside); a panic, an abort, a hang or unbounded memory is the bug a fuzzer finds.
//! [`seeds`] writes the inputs each target starts from. It holds no check of its own: every
//! check is the product's.

mod scratch;
pub mod seeds;
mod targets;

pub use targets::{calibration, config, gguf, pool, request, safetensors};

/// A fuzz target: runs one input.
pub type Target = fn(&[u8]);

/// Every target, by the name its corpus folder and `cargo fuzz` binary carry.
pub const TARGETS: [(&str, Target); 6] = [
    ("gguf", gguf),
    ("safetensors", safetensors),
    ("config", config),
    ("pool", pool),
    ("calibration", calibration),
    ("request", request),
];
