//! Random-weight EAGLE-3 drafters in the SpecForge layout (`config.json` + `model.safetensors`),
//! for measuring drafting cost at a published shape and for testing speculative decoding on a
//! target no trained drafter fits. The weights are uniform noise (norms near 1): proposals are
//! random, only speed and losslessness mean anything. It writes files; loading them is
//! [`crate::Eagle3::load`]'s.

use std::path::Path;

use safetensors::tensor::{Dtype, TensorView};

use crate::error::EngineError;

/// The shape and storage of a random drafter.
#[derive(Debug, Clone, Copy)]
pub struct RandomEagle3 {
    pub hidden: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub intermediate: usize,
    /// The target's vocabulary.
    pub vocab: usize,
    /// The drafter's own; when smaller, `d2t` maps draft id `i` to target id `i`.
    pub draft_vocab: usize,
    /// `eagle_aux_hidden_state_layer_ids`; `None` leaves the default (2, N/2, N−3 as inputs).
    pub taps: Option<[usize; 3]>,
    /// `max_position_embeddings`.
    pub max_positions: usize,
    /// bf16 tensors (else f32).
    pub bf16: bool,
    /// Weights are uniform in `[−scale/2, scale/2)`, norms in `1 ± scale/2`.
    pub scale: f32,
    pub seed: u64,
}

impl RandomEagle3 {
    /// The published Qwen3-30B-A3B drafter's shape (SpecForge `configs/qwen3-30B-A3B-eagle3.json`),
    /// bf16.
    pub fn qwen3_30b_a3b() -> RandomEagle3 {
        RandomEagle3 {
            hidden: 2048,
            heads: 32,
            kv_heads: 4,
            head_dim: 128,
            intermediate: 12288,
            vocab: 151_936,
            draft_vocab: 32_000,
            taps: None,
            max_positions: 2048,
            bf16: true,
            scale: 0.04,
            seed: 0x5eed_0003,
        }
    }

    /// Writes `dir/model.safetensors` (atomically) and `dir/config.json`.
    pub fn write(&self, dir: &Path) -> Result<(), EngineError> {
        std::fs::create_dir_all(dir).map_err(EngineError::io(dir))?;
        let (h, d) = (self.hidden, self.head_dim);
        let shapes: Vec<(&str, Vec<usize>)> = vec![
            ("fc.weight", vec![h, 3 * h]),
            ("midlayer.hidden_norm.weight", vec![h]),
            ("midlayer.input_layernorm.weight", vec![h]),
            (
                "midlayer.self_attn.q_proj.weight",
                vec![self.heads * d, 2 * h],
            ),
            (
                "midlayer.self_attn.k_proj.weight",
                vec![self.kv_heads * d, 2 * h],
            ),
            (
                "midlayer.self_attn.v_proj.weight",
                vec![self.kv_heads * d, 2 * h],
            ),
            ("midlayer.self_attn.o_proj.weight", vec![h, self.heads * d]),
            ("midlayer.post_attention_layernorm.weight", vec![h]),
            ("midlayer.mlp.gate_proj.weight", vec![self.intermediate, h]),
            ("midlayer.mlp.up_proj.weight", vec![self.intermediate, h]),
            ("midlayer.mlp.down_proj.weight", vec![h, self.intermediate]),
            ("norm.weight", vec![h]),
            ("lm_head.weight", vec![self.draft_vocab, h]),
        ];
        let mut state = self.seed;
        let mut data: Vec<Vec<u8>> = shapes
            .iter()
            .map(|(name, shape)| {
                let n: usize = shape.iter().product();
                let mut out = Vec::with_capacity(n * if self.bf16 { 2 } else { 4 });
                for _ in 0..n {
                    state = state
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let u = (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
                    let norm = if name.ends_with("norm.weight") {
                        1.0
                    } else {
                        0.0
                    };
                    let x = norm + self.scale * u;
                    if self.bf16 {
                        out.extend_from_slice(&half::bf16::from_f32(x).to_bits().to_le_bytes());
                    } else {
                        out.extend_from_slice(&x.to_le_bytes());
                    }
                }
                out
            })
            .collect();
        let d2t = self.draft_vocab < self.vocab;
        if d2t {
            data.push(vec![0u8; 8 * self.draft_vocab]);
        }
        let dtype = if self.bf16 { Dtype::BF16 } else { Dtype::F32 };
        let bad = |e: safetensors::SafeTensorError| EngineError::Safetensors {
            path: dir.to_path_buf(),
            message: e.to_string(),
        };
        let mut views = Vec::with_capacity(data.len());
        for ((name, shape), bytes) in shapes.iter().zip(&data) {
            views.push((
                name.to_string(),
                TensorView::new(dtype, shape.clone(), bytes).map_err(bad)?,
            ));
        }
        if d2t {
            let bytes = data.last().expect("pushed");
            views.push((
                "d2t".into(),
                TensorView::new(Dtype::I64, vec![self.draft_vocab], bytes).map_err(bad)?,
            ));
        }
        let (path, tmp) = (
            dir.join("model.safetensors"),
            dir.join("model.safetensors.tmp"),
        );
        safetensors::serialize_to_file(views, None, &tmp).map_err(bad)?;
        std::fs::rename(&tmp, &path).map_err(EngineError::io(&path))?;
        let mut config = serde_json::json!({
            "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
            "num_hidden_layers": 1, "hidden_size": h, "intermediate_size": self.intermediate,
            "num_attention_heads": self.heads, "num_key_value_heads": self.kv_heads,
            "head_dim": d, "hidden_act": "silu", "rms_norm_eps": 1e-6, "rope_theta": 1e6,
            "rope_scaling": null, "max_position_embeddings": self.max_positions, "vocab_size": self.vocab,
            "draft_vocab_size": self.draft_vocab, "tie_word_embeddings": false,
            "torch_dtype": if self.bf16 { "bfloat16" } else { "float32" },
        });
        if let Some(taps) = self.taps {
            config["eagle_config"] = serde_json::json!({"eagle_aux_hidden_state_layer_ids": taps});
        }
        let cfg = dir.join("config.json");
        std::fs::write(&cfg, config.to_string()).map_err(EngineError::io(&cfg))
    }
}
