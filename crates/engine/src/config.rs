//! `config.json` and `generation_config.json` of a Hugging Face Qwen3-MoE checkpoint, with the
//! field names HF uses, validated into the numbers the model needs. Accepts both the 4.x
//! (`rope_theta`, `torch_dtype`) and 5.x (`rope_parameters.rope_theta`, `dtype`) spellings.

use std::path::Path;

use serde::Deserialize;

use crate::error::EngineError;

/// The subset of `Qwen3MoeConfig` the forward depends on, as written in `config.json`.
#[derive(Debug, Clone, Deserialize)]
pub struct Qwen3MoeConfig {
    #[serde(default)]
    pub architectures: Vec<String>,
    pub vocab_size: usize,
    pub hidden_size: usize,
    #[serde(default)]
    pub intermediate_size: usize,
    pub moe_intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    #[serde(default)]
    pub head_dim: Option<usize>,
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f64,
    #[serde(default)]
    pub rope_theta: Option<f64>,
    #[serde(default)]
    pub rope_parameters: Option<RopeParameters>,
    #[serde(default)]
    pub rope_scaling: Option<serde_json::Value>,
    #[serde(default = "default_max_positions")]
    pub max_position_embeddings: usize,
    #[serde(alias = "num_local_experts")]
    pub num_experts: usize,
    pub num_experts_per_tok: usize,
    #[serde(default)]
    pub norm_topk_prob: bool,
    #[serde(default = "one")]
    pub decoder_sparse_step: usize,
    #[serde(default)]
    pub mlp_only_layers: Vec<usize>,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    #[serde(default)]
    pub attention_bias: bool,
    #[serde(default)]
    pub use_sliding_window: bool,
    #[serde(default = "silu")]
    pub hidden_act: String,
    #[serde(default)]
    pub bos_token_id: Option<u32>,
    #[serde(default)]
    pub eos_token_id: Option<TokenIds>,
}

/// transformers 5.x keeps RoPE settings here.
#[derive(Debug, Clone, Deserialize)]
pub struct RopeParameters {
    #[serde(default)]
    pub rope_theta: Option<f64>,
    #[serde(default)]
    pub rope_type: Option<String>,
}

/// `eos_token_id` may be one id or a list.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum TokenIds {
    One(u32),
    Many(Vec<u32>),
}

impl TokenIds {
    pub fn to_vec(&self) -> Vec<u32> {
        match self {
            TokenIds::One(t) => vec![*t],
            TokenIds::Many(v) => v.clone(),
        }
    }
}

fn default_eps() -> f64 {
    1e-6
}
fn default_max_positions() -> usize {
    32768
}
fn one() -> usize {
    1
}
fn silu() -> String {
    "silu".into()
}

/// `generation_config.json` (only the stop tokens matter here).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct GenerationConfig {
    #[serde(default)]
    pub eos_token_id: Option<TokenIds>,
}

/// Most decoder layers a config may have (the selector's bound).
pub const MAX_LAYERS: usize = specfit_selector::MAX_LAYERS;

fn bad(field: &'static str, value: impl ToString, reason: &'static str) -> EngineError {
    EngineError::Config {
        field,
        value: value.to_string(),
        reason,
    }
}

impl Qwen3MoeConfig {
    /// Reads and validates `dir/config.json`, or the metadata of `dir` when it is a GGUF file.
    pub fn load(dir: &Path) -> Result<Qwen3MoeConfig, EngineError> {
        crate::gguf::check_model_path(dir)?;
        if crate::gguf::is_gguf(dir) {
            let file = crate::gguf::open(dir)?;
            return crate::gguf::config_of(dir, file.header());
        }
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(EngineError::io(&path))?;
        let cfg: Qwen3MoeConfig = serde_json::from_str(&text).map_err(|e| EngineError::Json {
            path: path.clone(),
            message: e.to_string(),
        })?;
        if !cfg.architectures.is_empty()
            && !cfg.architectures.iter().any(|a| a == "Qwen3MoeForCausalLM")
        {
            return Err(EngineError::UnsupportedArchitecture {
                path,
                got: cfg.architectures,
            });
        }
        cfg.validate()?;
        Ok(cfg)
    }

    /// Checks the numbers the forward relies on.
    pub fn validate(&self) -> Result<(), EngineError> {
        let positive = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim()),
            ("decoder_sparse_step", self.decoder_sparse_step),
        ];
        if let Some((field, v)) = positive.iter().find(|(_, v)| *v == 0) {
            return Err(bad(field, v, "must be positive"));
        }
        // Far above any released model, low enough that nothing sized from them overflows or
        // asks for memory the machine cannot have before a tensor is read.
        let most = [
            (
                "num_hidden_layers",
                self.num_hidden_layers,
                MAX_LAYERS,
                "more than 1024 layers",
            ),
            (
                "vocab_size",
                self.vocab_size,
                1 << 22,
                "more than 4,194,304 tokens",
            ),
            ("hidden_size", self.hidden_size, 1 << 16, "more than 65,536"),
            (
                "num_attention_heads",
                self.num_attention_heads,
                1024,
                "more than 1024 heads",
            ),
            (
                "num_key_value_heads",
                self.num_key_value_heads,
                1024,
                "more than 1024 heads",
            ),
            ("head_dim", self.head_dim(), 1024, "more than 1024"),
            (
                "intermediate_size",
                self.intermediate_size,
                1 << 20,
                "more than 1,048,576",
            ),
            (
                "moe_intermediate_size",
                self.moe_intermediate_size,
                1 << 20,
                "more than 1,048,576",
            ),
            (
                "max_position_embeddings",
                self.max_position_embeddings,
                1 << 24,
                "more than 16,777,216 positions",
            ),
        ];
        if let Some((field, v, _, reason)) = most.iter().find(|(_, v, max, _)| v > max) {
            return Err(bad(field, v, reason));
        }
        if !self
            .num_attention_heads
            .is_multiple_of(self.num_key_value_heads)
        {
            return Err(bad(
                "num_key_value_heads",
                self.num_key_value_heads,
                "must divide num_attention_heads",
            ));
        }
        if !self.head_dim().is_multiple_of(2) {
            return Err(bad(
                "head_dim",
                self.head_dim(),
                "RoPE needs an even head_dim",
            ));
        }
        if self.num_experts > 0 && self.num_experts_per_tok == 0 {
            return Err(bad(
                "num_experts_per_tok",
                0,
                "must be positive when num_experts > 0",
            ));
        }
        if self.num_experts_per_tok > self.num_experts && self.num_experts > 0 {
            return Err(bad(
                "num_experts_per_tok",
                self.num_experts_per_tok,
                "exceeds num_experts",
            ));
        }
        if self.num_experts > specfit_selector::MAX_EXPERTS {
            return Err(bad(
                "num_experts",
                self.num_experts,
                "more than 512 experts per layer",
            ));
        }
        if self.hidden_act != "silu" {
            return Err(bad(
                "hidden_act",
                &self.hidden_act,
                "only silu is supported",
            ));
        }
        if self.use_sliding_window {
            return Err(bad(
                "use_sliding_window",
                true,
                "sliding-window attention is not supported",
            ));
        }
        if self.rope_scaling.as_ref().is_some_and(|v| !v.is_null()) {
            return Err(bad(
                "rope_scaling",
                self.rope_scaling.clone().unwrap_or_default(),
                "not supported",
            ));
        }
        if let Some(t) = self
            .rope_parameters
            .as_ref()
            .and_then(|p| p.rope_type.as_deref())
        {
            if t != "default" {
                return Err(bad(
                    "rope_parameters.rope_type",
                    t,
                    "only default RoPE is supported",
                ));
            }
        }
        let theta = self.rope_theta();
        if !(theta.is_finite() && theta > 0.0) {
            return Err(bad("rope_theta", theta, "must be positive"));
        }
        if !(self.rms_norm_eps.is_finite() && self.rms_norm_eps >= 0.0) {
            return Err(bad("rms_norm_eps", self.rms_norm_eps, "must be >= 0"));
        }
        if (0..self.num_hidden_layers).any(|i| !self.is_moe_layer(i)) && self.intermediate_size == 0
        {
            return Err(bad(
                "intermediate_size",
                0,
                "dense layers need a positive intermediate_size",
            ));
        }
        if (0..self.num_hidden_layers).any(|i| self.is_moe_layer(i))
            && self.moe_intermediate_size == 0
        {
            return Err(bad("moe_intermediate_size", 0, "must be positive"));
        }
        Ok(())
    }

    /// Per-head dimension: `head_dim` when given, else hidden / heads.
    pub fn head_dim(&self) -> usize {
        self.head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }

    /// RoPE base: `rope_parameters.rope_theta`, else `rope_theta`, else 10000.
    pub fn rope_theta(&self) -> f64 {
        self.rope_parameters
            .as_ref()
            .and_then(|p| p.rope_theta)
            .or(self.rope_theta)
            .unwrap_or(10000.0)
    }

    /// HF's rule: layer `i` is sparse iff not in `mlp_only_layers`, there are experts, and
    /// `(i + 1) % decoder_sparse_step == 0`.
    pub fn is_moe_layer(&self, i: usize) -> bool {
        !self.mlp_only_layers.contains(&i)
            && self.num_experts > 0
            && (i + 1).is_multiple_of(self.decoder_sparse_step)
    }

    /// Indices of the sparse layers, in order.
    pub fn moe_layers(&self) -> Vec<usize> {
        (0..self.num_hidden_layers)
            .filter(|&i| self.is_moe_layer(i))
            .collect()
    }
}

impl GenerationConfig {
    /// Reads `dir/generation_config.json` when present.
    pub fn load(dir: &Path) -> Result<GenerationConfig, EngineError> {
        let path = dir.join("generation_config.json");
        if !path.exists() {
            return Ok(GenerationConfig::default());
        }
        let text = std::fs::read_to_string(&path).map_err(EngineError::io(&path))?;
        serde_json::from_str(&text).map_err(|e| EngineError::Json {
            path: path.clone(),
            message: e.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny() -> serde_json::Value {
        serde_json::json!({
            "vocab_size": 32, "hidden_size": 32, "intermediate_size": 64,
            "moe_intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
            "num_key_value_heads": 1, "head_dim": 16, "num_experts": 4,
            "num_experts_per_tok": 2, "max_position_embeddings": 64
        })
    }

    fn check(v: serde_json::Value) -> Result<(), EngineError> {
        serde_json::from_value::<Qwen3MoeConfig>(v)
            .unwrap()
            .validate()
    }

    #[test]
    fn sizes_past_their_bound_are_refused_naming_the_field_before_anything_loops_over_them() {
        assert!(check(tiny()).is_ok());
        for (field, value) in [
            ("num_hidden_layers", 1_000_000_000_000u64),
            ("vocab_size", 1 << 40),
            ("hidden_size", 1 << 40),
            ("head_dim", 1 << 40),
            ("moe_intermediate_size", 1 << 40),
            ("max_position_embeddings", u64::MAX),
        ] {
            let mut v = tiny();
            v[field] = value.into();
            let start = std::time::Instant::now();
            match check(v) {
                Err(EngineError::Config { field: f, .. }) => assert_eq!(f, field),
                other => panic!("{field} {value}: {other:?}"),
            }
            assert!(start.elapsed().as_secs() < 5, "{field} took too long");
        }
    }
}
