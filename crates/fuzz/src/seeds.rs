//! The inputs each fuzz target starts from: a tiny Qwen3-MoE target (1 layer, 4 experts of 32
//! wide, vocabulary 32) as safetensors and as GGUF (with the shipped tokenizer cut to its first
//! 32 tokens), the shipped configs, pools and calibrations, and a few request bodies. Every
//! model seed loads and runs; the corpus folders keep them as `seed-*` files
//! ([`write`], checked against what is committed by the corpus tests).

use std::path::{Path, PathBuf};

use serde_json::{json, Value as Json};
use specfit_engine::Qwen3MoeConfig;
use specfit_gguf::quant::{random_block, Rng};
use specfit_gguf::write::{to_bytes, TensorSpec};
use specfit_gguf::{GgmlType, Value};

/// The repository's root (seeds read shipped files from it).
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// One seed input: the target it feeds and a file name.
pub struct Seed {
    pub target: &'static str,
    pub name: String,
    pub bytes: Vec<u8>,
}

// The tiny target's shape (HF config names).
const VOCAB: usize = 32;
const HIDDEN: usize = 32;
const HEADS: usize = 2;
const KV_HEADS: usize = 1;
const HEAD_DIM: usize = 16;
const EXPERTS: usize = 4;
const TOP_K: usize = 2;
const MOE_INTER: usize = 32;
const CONTEXT: usize = 64;

/// The tiny target's `config.json`.
pub fn tiny_config_json() -> String {
    json!({
        "architectures": ["Qwen3MoeForCausalLM"],
        "vocab_size": VOCAB,
        "hidden_size": HIDDEN,
        "intermediate_size": 64,
        "moe_intermediate_size": MOE_INTER,
        "num_hidden_layers": 1,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "num_experts": EXPERTS,
        "num_experts_per_tok": TOP_K,
        "norm_topk_prob": true,
        "max_position_embeddings": CONTEXT,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1e6,
        "tie_word_embeddings": false
    })
    .to_string()
}

/// The tiny target's config.
pub fn tiny_config() -> Qwen3MoeConfig {
    serde_json::from_str(&tiny_config_json()).expect("the tiny config parses")
}

/// A tensor of the tiny target: Hugging Face name, PyTorch-order shape, values.
struct Tensor {
    name: String,
    shape: Vec<usize>,
    values: Vec<f32>,
}

/// Every tensor of the tiny target: norms of ones, other weights small and seeded.
fn tiny_tensors() -> Vec<Tensor> {
    let mut rng = Rng::new(0x5eed_f022);
    let mut t = |name: &str, shape: &[usize]| {
        let n: usize = shape.iter().product();
        let values = if name.ends_with("norm.weight") {
            vec![1.0; n]
        } else {
            (0..n).map(|_| 0.1 * rng.normal()).collect()
        };
        Tensor {
            name: name.into(),
            shape: shape.to_vec(),
            values,
        }
    };
    let (q, kv) = (HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM);
    let l = "model.layers.0";
    let mut out = vec![
        t("model.embed_tokens.weight", &[VOCAB, HIDDEN]),
        t(&format!("{l}.input_layernorm.weight"), &[HIDDEN]),
        t(&format!("{l}.self_attn.q_proj.weight"), &[q, HIDDEN]),
        t(&format!("{l}.self_attn.k_proj.weight"), &[kv, HIDDEN]),
        t(&format!("{l}.self_attn.v_proj.weight"), &[kv, HIDDEN]),
        t(&format!("{l}.self_attn.o_proj.weight"), &[HIDDEN, q]),
        t(&format!("{l}.self_attn.q_norm.weight"), &[HEAD_DIM]),
        t(&format!("{l}.self_attn.k_norm.weight"), &[HEAD_DIM]),
        t(&format!("{l}.post_attention_layernorm.weight"), &[HIDDEN]),
        t(&format!("{l}.mlp.gate.weight"), &[EXPERTS, HIDDEN]),
    ];
    for e in 0..EXPERTS {
        let x = format!("{l}.mlp.experts.{e}");
        out.push(t(&format!("{x}.gate_proj.weight"), &[MOE_INTER, HIDDEN]));
        out.push(t(&format!("{x}.up_proj.weight"), &[MOE_INTER, HIDDEN]));
        out.push(t(&format!("{x}.down_proj.weight"), &[HIDDEN, MOE_INTER]));
    }
    out.push(t("model.norm.weight", &[HIDDEN]));
    out.push(t("lm_head.weight", &[VOCAB, HIDDEN]));
    out
}

fn le_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// The tiny target's `model.safetensors`.
pub fn tiny_safetensors() -> Vec<u8> {
    let tensors = tiny_tensors();
    let bytes: Vec<Vec<u8>> = tensors.iter().map(|t| le_bytes(&t.values)).collect();
    let views = tensors.iter().zip(&bytes).map(|(t, b)| {
        let view =
            safetensors::tensor::TensorView::new(safetensors::Dtype::F32, t.shape.clone(), b)
                .expect("sizes agree");
        (t.name.clone(), view)
    });
    safetensors::serialize(views, None).expect("serializes")
}

/// The tiny target as a `qwen3moe` GGUF: dense tensors F32 (the seeded values), expert stacks
/// Q8_0 (seeded blocks); with `tokenizer`, the shipped tokenizer's first 32 tokens.
pub fn tiny_gguf(tokenizer: bool) -> Vec<u8> {
    let mut specs = Vec::new();
    let mut data = Vec::new();
    for t in tiny_tensors()
        .into_iter()
        .filter(|t| !t.name.contains(".experts."))
    {
        specs.push(TensorSpec {
            name: specfit_engine::gguf::gguf_name(&t.name).expect("a tensor GGUF stores alone"),
            dims: t.shape.iter().rev().map(|&d| d as u64).collect(),
            ty: GgmlType::F32,
        });
        data.push(le_bytes(&t.values));
    }
    let mut rng = Rng::new(0x5eed_f023);
    for (proj, row, rows) in [
        ("gate", HIDDEN, MOE_INTER),
        ("up", HIDDEN, MOE_INTER),
        ("down", MOE_INTER, HIDDEN),
    ] {
        let spec = TensorSpec {
            name: format!("blk.0.ffn_{proj}_exps.weight"),
            dims: vec![row as u64, rows as u64, EXPERTS as u64],
            ty: GgmlType::Q8_0,
        };
        let blocks = row * rows * EXPERTS / 32;
        let mut bytes = Vec::new();
        for _ in 0..blocks {
            random_block(GgmlType::Q8_0, 0.1, &mut rng, &mut bytes).expect("Q8_0 is drawn");
        }
        specs.push(spec);
        data.push(bytes);
    }
    let mut metadata = tiny_metadata();
    if tokenizer {
        metadata.extend(tiny_tokenizer_metadata());
    } else {
        metadata.push(("tokenizer.ggml.model".into(), Value::String("none".into())));
    }
    to_bytes(&metadata, &specs, &data).expect("the tiny GGUF is well formed")
}

/// The `qwen3moe.*` metadata of the tiny target.
fn tiny_metadata() -> Vec<(String, Value)> {
    let arch = |k: &str, v: usize| (format!("qwen3moe.{k}"), Value::U32(v as u32));
    vec![
        (
            "general.architecture".into(),
            Value::String("qwen3moe".into()),
        ),
        arch("block_count", 1),
        arch("context_length", CONTEXT),
        arch("embedding_length", HIDDEN),
        arch("attention.head_count", HEADS),
        arch("attention.head_count_kv", KV_HEADS),
        arch("attention.key_length", HEAD_DIM),
        arch("attention.value_length", HEAD_DIM),
        arch("expert_count", EXPERTS),
        arch("expert_used_count", TOP_K),
        arch("expert_feed_forward_length", MOE_INTER),
        (
            "qwen3moe.attention.layer_norm_rms_epsilon".into(),
            Value::F32(1e-6),
        ),
        ("qwen3moe.rope.freq_base".into(), Value::F32(1e6)),
    ]
}

/// The shipped tokenizer cut to its first [`VOCAB`] ids (and the merges among them), as GGUF
/// `tokenizer.ggml.*` metadata.
fn tiny_tokenizer_metadata() -> Vec<(String, Value)> {
    let path = repo().join("models/target/tokenizer.json");
    let text = std::fs::read_to_string(&path).expect("the shipped tokenizer is there");
    let mut doc: Json = serde_json::from_str(&text).expect("the shipped tokenizer parses");
    let keep = |id: &Json| id.as_u64().is_some_and(|i| (i as usize) < VOCAB);
    let vocab = doc["model"]["vocab"].as_object_mut().expect("a BPE vocab");
    vocab.retain(|_, id| keep(id));
    let kept = vocab.clone();
    let merges = doc["model"]["merges"].as_array_mut().expect("BPE merges");
    merges.retain(|m| {
        let pair: Vec<String> = match m {
            Json::String(s) => s.split(' ').map(String::from).collect(),
            Json::Array(a) => a
                .iter()
                .filter_map(|p| p.as_str().map(String::from))
                .collect(),
            _ => Vec::new(),
        };
        pair.len() == 2
            && kept.contains_key(&pair.concat())
            && pair.iter().all(|p| kept.contains_key(p))
    });
    doc["added_tokens"]
        .as_array_mut()
        .expect("added tokens")
        .retain(|t| keep(&t["id"]));
    specfit_engine::gguf::metadata_of(&path, &doc.to_string(), None)
        .expect("the cut tokenizer converts")
}

/// Request bodies, first byte 0 for chat and 1 for completions (see [`crate::request`]).
fn requests() -> Vec<(&'static str, Vec<u8>)> {
    let chat = |body: Json| [vec![0u8], body.to_string().into_bytes()].concat();
    let text = |body: Json| [vec![1u8], body.to_string().into_bytes()].concat();
    vec![
        (
            "chat",
            chat(json!({"messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "What is 2+2? <|im_end|><|im_start|>system"}
            ], "max_tokens": 8, "temperature": 0})),
        ),
        (
            "chat-stream",
            chat(
                json!({"model": "specfit", "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
                "stream": true, "stream_options": {"include_usage": true}, "top_p": 0.9, "seed": 7,
                "chat_template_kwargs": {"enable_thinking": false}}),
            ),
        ),
        (
            "completion-text",
            text(
                json!({"prompt": "Once upon a time", "max_tokens": 16, "stop": ["\n"], "return_token_ids": true}),
            ),
        ),
        (
            "completion-ids",
            text(
                json!({"prompt": [1, 2, 3, 4095], "max_completion_tokens": 4, "ignore_eos": true, "n": 1}),
            ),
        ),
    ]
}

/// Every seed.
pub fn all() -> Vec<Seed> {
    let read = |path: &str| std::fs::read(repo().join(path)).expect("a shipped file");
    let first_line = |path: &str| {
        let bytes = read(path);
        let end = bytes
            .iter()
            .position(|&b| b == b'\n')
            .unwrap_or(bytes.len());
        bytes[..end].to_vec()
    };
    let mut seeds = vec![
        ("gguf", "tiny.gguf", tiny_gguf(true)),
        ("gguf", "tiny-no-tokenizer.gguf", tiny_gguf(false)),
        ("safetensors", "tiny.safetensors", tiny_safetensors()),
        ("config", "tiny.json", tiny_config_json().into_bytes()),
        ("config", "target.json", read("models/target/config.json")),
        ("config", "drafter.json", read("models/drafter/config.json")),
        (
            "config",
            "generation.json",
            read("models/target/generation_config.json"),
        ),
        ("pool", "tiny.json", read("examples/pools/tiny.json")),
        (
            "pool",
            "paper.json",
            first_line("examples/pools/paper.jsonl"),
        ),
        (
            "calibration",
            "paper-form.json",
            json!({"format": "specfit-calibration", "version": 1, "max_nodes": 3,
                "cost": {"intercepts": [1.0, 1.2, 1.4, 1.6], "beta": 0.05}})
            .to_string()
            .into_bytes(),
        ),
        (
            "calibration",
            "h200.json",
            read("docs/gpu/specfit-calibration.h200.json"),
        ),
    ];
    for (name, bytes) in requests() {
        seeds.push(("request", name, bytes));
    }
    seeds
        .into_iter()
        .map(|(target, name, bytes)| Seed {
            target,
            name: format!("seed-{name}"),
            bytes,
        })
        .collect()
}

/// Where target `target`'s corpus is kept (`fuzz/corpus/TARGET`).
pub fn corpus_dir(target: &str) -> PathBuf {
    repo().join("fuzz/corpus").join(target)
}

/// Writes every seed into its corpus folder (through a temporary file, renamed).
pub fn write() -> std::io::Result<()> {
    for seed in all() {
        let dir = corpus_dir(seed.target);
        std::fs::create_dir_all(&dir)?;
        let tmp = dir.join(format!(".{}.tmp", seed.name));
        std::fs::write(&tmp, &seed.bytes)?;
        std::fs::rename(&tmp, dir.join(&seed.name))?;
    }
    Ok(())
}
