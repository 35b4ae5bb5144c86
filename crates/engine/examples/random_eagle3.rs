//! Writes a random EAGLE-3 drafter of the published Qwen3-30B-A3B shape (SpecForge
//! `configs/qwen3-30B-A3B-eagle3.json`: hidden 2048, 32 heads / 4 KV × 128, intermediate 12288,
//! vocabulary 151,936, draft vocabulary 32,000, bf16), in the SpecForge tensor layout, to measure
//! drafting cost at full size beside a full-size GGUF target. Its proposals are random (nothing
//! is trained); only speed is meaningful.
//!
//! ```sh
//! cargo run --release -p specfit-engine --example random_eagle3 -- bench-models/full/eagle3-qwen3-30b-a3b
//! ```

use safetensors::tensor::{Dtype, TensorView};

fn main() -> std::io::Result<()> {
    let Some(dir) = std::env::args().nth(1).map(std::path::PathBuf::from) else {
        eprintln!("usage: random_eagle3 OUT_DIR");
        std::process::exit(2);
    };
    std::fs::create_dir_all(&dir)?;
    let (h, heads, kv, d, im, v, vd) = (2048usize, 32, 4, 128, 12288, 151_936, 32_000);
    let shapes: Vec<(&str, Vec<usize>)> = vec![
        ("fc.weight", vec![h, 3 * h]),
        ("midlayer.hidden_norm.weight", vec![h]),
        ("midlayer.input_layernorm.weight", vec![h]),
        ("midlayer.self_attn.q_proj.weight", vec![heads * d, 2 * h]),
        ("midlayer.self_attn.k_proj.weight", vec![kv * d, 2 * h]),
        ("midlayer.self_attn.v_proj.weight", vec![kv * d, 2 * h]),
        ("midlayer.self_attn.o_proj.weight", vec![h, heads * d]),
        ("midlayer.post_attention_layernorm.weight", vec![h]),
        ("midlayer.mlp.gate_proj.weight", vec![im, h]),
        ("midlayer.mlp.up_proj.weight", vec![im, h]),
        ("midlayer.mlp.down_proj.weight", vec![h, im]),
        ("norm.weight", vec![h]),
        ("lm_head.weight", vec![vd, h]),
    ];
    let mut state = 0x5eed_0003u64;
    let mut data: Vec<Vec<u8>> = shapes
        .iter()
        .map(|(name, shape)| {
            let n: usize = shape.iter().product();
            let norm = name.ends_with("norm.weight");
            let mut out = Vec::with_capacity(2 * n);
            for _ in 0..n {
                state ^= state >> 12;
                state ^= state << 25;
                state ^= state >> 27;
                let u = (state.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40) as f32
                    / (1u64 << 24) as f32
                    - 0.5;
                let x = if norm { 1.0 } else { 0.04 * u };
                out.extend_from_slice(&half::bf16::from_f32(x).to_bits().to_le_bytes());
            }
            out
        })
        .collect();
    // The draft vocabulary: the first 32,000 target ids (offset 0 each).
    data.push(vec![0u8; 8 * vd]);
    let mut views: Vec<(String, TensorView<'_>)> = shapes
        .iter()
        .zip(&data)
        .map(|((name, shape), bytes)| {
            (
                name.to_string(),
                TensorView::new(Dtype::BF16, shape.clone(), bytes).expect("sizes match"),
            )
        })
        .collect();
    views.push((
        "d2t".into(),
        TensorView::new(Dtype::I64, vec![vd], data.last().expect("pushed")).expect("sizes match"),
    ));
    let path = dir.join("model.safetensors");
    let tmp = dir.join("model.safetensors.tmp");
    safetensors::serialize_to_file(views, None, &tmp).map_err(std::io::Error::other)?;
    std::fs::rename(&tmp, &path)?;
    let config = serde_json::json!({
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
        "num_hidden_layers": 1, "hidden_size": h, "intermediate_size": im,
        "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": d,
        "hidden_act": "silu", "rms_norm_eps": 1e-6, "rope_theta": 1e6, "rope_scaling": null,
        "max_position_embeddings": 2048, "vocab_size": v, "draft_vocab_size": vd,
        "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    });
    std::fs::write(dir.join("config.json"), config.to_string())?;
    eprintln!("wrote {}", dir.display());
    Ok(())
}
