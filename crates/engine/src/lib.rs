//! The target-model runtime SpecFit runs on: Hugging Face `Qwen3MoeForCausalLM` checkpoints
//! loaded as published, computed exactly as `transformers` computes them (to 1e-4 relative in
//! f32), with routed experts kept in an [`experts::ExpertStore`] behind per-layer LRU slot caches
//! ([`experts::ExpertCache`]) that count every copy.
//!
//! The forward is batch-invariant: each token's hidden states, routes and logits are bit-for-bit
//! the same whatever other tokens share its forward (see [`kernels`]), so verifying a draft tree
//! in one forward commits exactly what token-by-token decoding would.
//!
//! Attention takes explicit positions and a mask ([`batch::Mask`]), so a draft tree is verified
//! in one forward; the KV cache ([`kv::KvCache`]) truncates and compacts to the accepted path.

pub mod batch;
pub mod config;
mod error;
pub mod experts;
pub mod kernels;
pub mod kv;
pub mod model;
mod weights;

pub use batch::{Batch, ForwardOutput, Logits, Mask};
pub use config::{GenerationConfig, Qwen3MoeConfig};
pub use error::EngineError;
pub use experts::{CacheMode, CopyStats, ExpertCache, ExpertStore, RamStore};
pub use kv::KvCache;
pub use model::Qwen3Moe;
