//! The models, one file each, top to bottom like the paper (config → layers → MoE block →
//! model): the target `qwen3_moe` (loaded by `load`), the EAGLE-3 drafter `eagle3`, and the
//! building blocks they share (`layers`).

pub mod eagle3;
pub(crate) mod layers;
mod load;
pub mod qwen3_moe;
pub mod random_eagle3;

pub use eagle3::{DraftHidden, DraftOutput, DrafterDtype, Eagle3};
pub use qwen3_moe::Qwen3Moe;
