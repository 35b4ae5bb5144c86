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
pub mod cancel;
pub mod compressed;
pub mod config;
mod error;
pub mod experts;
pub mod gguf;
pub mod inflate;
pub mod kernels;
pub mod kv;
pub mod measure;
pub mod model;
pub mod policy;
pub mod predictor;
pub mod prefix;
pub mod sampling;
pub mod spec;
pub mod threads;
pub mod tokenizer;
mod weights;

use std::path::Path;
use std::sync::Arc;

pub use batch::{Batch, ForwardOutput, Logits, Mask};
pub use cancel::Cancel;
pub use config::{GenerationConfig, Qwen3MoeConfig};
pub use error::EngineError;
pub use experts::{CacheMode, CopyStats, ExpertCache, ExpertStore, RamStore};
pub use kernels::WeightDtype;
pub use kv::KvCache;
pub use model::{DraftHidden, DraftOutput, DrafterDtype, Eagle3, Qwen3Moe};
pub use prefix::Prefix;
pub use sampling::{Sampler, Sampling};
pub use spec::{generate, DecodeOptions, DecodeStats, Decoder, Speculation, Start, TokenSink};
pub use specfit_selector::VerifyPolicy;
pub use tokenizer::{TextDecoder, Tokenizer};

/// Where routed experts rest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tier {
    /// All experts in host RAM (a GGUF file's quantized experts: the memory-mapped file itself,
    /// used in place).
    Ram,
    /// The expert-major file written by [`experts::convert`], read with O_DIRECT.
    Disk(std::path::PathBuf),
}

/// The default disk expert file of a model directory.
pub fn default_expert_file(dir: &Path) -> std::path::PathBuf {
    dir.join("experts.specfit")
}

/// Loads the target in `dir` with its experts in `tier`, behind `slots` slots per MoE layer;
/// matrices keep the checkpoint's dtype unless `dtype` says otherwise.
pub fn load_target(
    dir: &Path,
    tier: &Tier,
    slots: usize,
    mode: CacheMode,
    dtype: Option<WeightDtype>,
) -> Result<(Qwen3Moe, ExpertCache), EngineError> {
    let (model, store): (Qwen3Moe, Arc<dyn ExpertStore>) = match tier {
        // A GGUF file is its own expert store, no conversion: in RAM, its quantized experts
        // are used in place from the mapped file (no slots, no copies); on disk, they stream
        // from it into the slots.
        Tier::Ram | Tier::Disk(_) if gguf::is_gguf(dir) => {
            let (model, store) = Qwen3Moe::load_gguf(dir, dtype, *tier == Tier::Ram)?;
            (model, Arc::new(store))
        }
        Tier::Ram => {
            let (model, store) = Qwen3Moe::load(dir, dtype)?;
            (model, Arc::new(store))
        }
        Tier::Disk(path) => {
            let (model, fingerprint) = Qwen3Moe::load_dense(dir, dtype)?;
            let store =
                experts::DiskStore::open(path, model.config(), fingerprint, model.weight_dtype())?;
            (model, Arc::new(store))
        }
    };
    let cfg = model.config();
    let cache = ExpertCache::new(store, cfg.moe_layers().len(), cfg.num_experts, slots, mode)?;
    Ok((model, cache))
}
