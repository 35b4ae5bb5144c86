//! The `qwen3moe` metadata of a GGUF file (llama.cpp's key names) as the Hugging Face config the
//! engine runs: `{arch}.embedding_length` → `hidden_size`, and so on. Which layers are dense and
//! whether embeddings are tied are read off the tensor directory, as llama.cpp does.

use std::path::Path;

use specfit_gguf::Gguf;

use crate::config::{Qwen3MoeConfig, TokenIds};
use crate::error::EngineError;

/// The architecture this engine runs.
const ARCH: &str = "qwen3moe";

/// The config of the `qwen3moe` model in `g` (read from `path`), validated.
pub fn config_of(path: &Path, g: &Gguf) -> Result<Qwen3MoeConfig, EngineError> {
    let bad = |key: &str, reason: String| EngineError::GgufMetadata {
        path: path.to_path_buf(),
        key: key.to_string(),
        reason,
    };
    let arch = g
        .get("general.architecture")
        .and_then(|v| v.as_str())
        .ok_or_else(|| bad("general.architecture", "missing".into()))?;
    if arch != ARCH {
        return Err(EngineError::UnsupportedArchitecture {
            path: path.to_path_buf(),
            got: vec![format!(
                "{arch} (GGUF general.architecture; this engine runs {ARCH})"
            )],
        });
    }
    let int = |key: &str| -> Result<usize, EngineError> {
        let full = format!("{ARCH}.{key}");
        g.get(&full)
            .ok_or_else(|| bad(&full, "missing".into()))?
            .as_u64()
            .map(|v| v as usize)
            .ok_or_else(|| bad(&full, "not a non-negative integer".into()))
    };
    let float = |key: &str| -> Result<Option<f64>, EngineError> {
        let full = format!("{ARCH}.{key}");
        g.get(&full)
            .map(|v| v.as_f64().ok_or_else(|| bad(&full, "not a number".into())))
            .transpose()
    };
    let token = |key: &str| g.get(key).and_then(|v| v.as_u64()).map(|v| v as u32);
    let layers = int("block_count")?;
    if layers > crate::config::MAX_LAYERS {
        return Err(bad(
            &format!("{ARCH}.block_count"),
            format!(
                "{layers} layers; at most {} are supported",
                crate::config::MAX_LAYERS
            ),
        ));
    }
    let head_dim = int("attention.key_length")?;
    if let Ok(v) = int("attention.value_length") {
        if v != head_dim {
            return Err(bad(
                &format!("{ARCH}.attention.value_length"),
                format!("{v} differs from attention.key_length {head_dim}"),
            ));
        }
    }
    let embed = g
        .tensor("token_embd.weight")
        .ok_or_else(|| bad("token_embd.weight", "the tensor is missing".into()))?;
    let vocab_size = embed.dims.get(1).copied().unwrap_or(0) as usize;
    let mlp_only_layers = (0..layers)
        .filter(|i| g.tensor(&format!("blk.{i}.ffn_gate_inp.weight")).is_none())
        .collect();
    let cfg = Qwen3MoeConfig {
        architectures: vec!["Qwen3MoeForCausalLM".into()],
        vocab_size,
        hidden_size: int("embedding_length")?,
        intermediate_size: int("feed_forward_length").unwrap_or(0),
        moe_intermediate_size: int("expert_feed_forward_length")?,
        num_hidden_layers: layers,
        num_attention_heads: int("attention.head_count")?,
        num_key_value_heads: int("attention.head_count_kv")?,
        head_dim: Some(head_dim),
        rms_norm_eps: float("attention.layer_norm_rms_epsilon")?.unwrap_or(1e-6),
        rope_theta: Some(float("rope.freq_base")?.unwrap_or(1e6)),
        rope_parameters: None,
        rope_scaling: None,
        max_position_embeddings: int("context_length")?,
        num_experts: int("expert_count")?,
        num_experts_per_tok: int("expert_used_count")?,
        // llama.cpp's qwen3moe graph always renormalises the top-k weights.
        norm_topk_prob: true,
        decoder_sparse_step: 1,
        mlp_only_layers,
        tie_word_embeddings: g.tensor("output.weight").is_none(),
        attention_bias: g.tensor("blk.0.attn_q.bias").is_some(),
        use_sliding_window: false,
        hidden_act: "silu".into(),
        bos_token_id: token("tokenizer.ggml.bos_token_id"),
        eos_token_id: token("tokenizer.ggml.eos_token_id").map(TokenIds::One),
    };
    cfg.validate()?;
    Ok(cfg)
}
