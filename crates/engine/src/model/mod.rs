//! Target model architectures (one file each).

pub mod eagle3;
pub(crate) mod layers;
pub mod qwen3_moe;
pub mod random_eagle3;

pub use eagle3::{DraftHidden, DraftOutput, Eagle3};
pub use qwen3_moe::Qwen3Moe;
