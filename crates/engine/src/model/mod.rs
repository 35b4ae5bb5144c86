//! Target model architectures (one file each).

pub(crate) mod layers;
pub mod qwen3_moe;

pub use qwen3_moe::Qwen3Moe;
