//! Writes a random-weight GGUF of a Qwen3-MoE shape (default: Qwen3-30B-A3B's exact shapes — 48
//! layers, hidden 2048, 32 query / 4 KV heads × 128, 128 experts top-8, moe_intermediate 768,
//! vocab 151,936) as Q8_0 or as a Q4_K_M-like mix (Q4_K, with Q6_K for the output and for
//! attn_v / ffn_down_exps on the layers llama.cpp's Q4_K_M gives more bits), for measuring
//! speed and disk traffic at full size. Quantized blocks are drawn directly (random integers,
//! scales for weights of standard deviation ~0.002, embeddings ~1); the router is f32 with logits
//! of standard deviation ~1, so that routing spreads over the experts about as random routing
//! would (the worst case for any expert cache). The vocabulary is llama.cpp's "none"
//! tokenizer (ids in, logits out). Streams to FILE.tmp, then renames.
//!
//! ```sh
//! cargo run --release -p specfit-gguf --example random_qwen3moe -- q8_0 bench-models/full/qwen3-30b-a3b-q8_0.gguf
//! cargo run --release -p specfit-gguf --example random_qwen3moe -- q4_k_m bench-models/full/qwen3-30b-a3b-q4_k_m.gguf
//! cargo run --release -p specfit-gguf --example random_qwen3moe -- q8_0 /tmp/small.gguf --layers 4 --experts 16
//! ```

use std::io::Write;
use std::path::PathBuf;

use specfit_gguf::quant::{q4_k_m_type, random_block, Rng};
use specfit_gguf::write::{write_file, TensorSpec};
use specfit_gguf::{GgmlType, Value, ValueType};

struct Shape {
    layers: usize,
    hidden: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    experts: usize,
    top_k: usize,
    moe_inter: usize,
    vocab: usize,
}

fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: random_qwen3moe q8_0|q4_k_m OUT.gguf [--layers N] [--experts N]";
    let (kind, out) = match (args.first(), args.get(1)) {
        (Some(k), Some(o)) => (k.clone(), PathBuf::from(o)),
        _ => {
            eprintln!("{usage}");
            std::process::exit(2);
        }
    };
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .map(|v| v.parse::<usize>().expect("a number"))
    };
    let s = Shape {
        layers: flag("--layers").unwrap_or(48),
        hidden: 2048,
        heads: 32,
        kv_heads: 4,
        head_dim: 128,
        experts: flag("--experts").unwrap_or(128),
        top_k: 8,
        moe_inter: 768,
        vocab: 151_936,
    };
    let (base, ftype) = match kind.as_str() {
        "q8_0" => (GgmlType::Q8_0, 7u32),
        "q4_k_m" => (GgmlType::Q4_K, 15u32),
        _ => {
            eprintln!("{usage}");
            std::process::exit(2);
        }
    };
    let pick = |name: &str, layer: Option<usize>| -> GgmlType {
        let full = layer.map_or(name.to_string(), |i| format!("blk.{i}.{name}"));
        if base == GgmlType::Q8_0 {
            GgmlType::Q8_0
        } else {
            q4_k_m_type(&full, s.layers)
        }
    };
    let (h, q, kv) = (s.hidden, s.heads * s.head_dim, s.kv_heads * s.head_dim);
    let mut tensors = vec![
        TensorSpec {
            name: "token_embd.weight".into(),
            dims: vec![h as u64, s.vocab as u64],
            ty: pick("token_embd.weight", None),
        },
        TensorSpec {
            name: "output_norm.weight".into(),
            dims: vec![h as u64],
            ty: GgmlType::F32,
        },
        TensorSpec {
            name: "output.weight".into(),
            dims: vec![h as u64, s.vocab as u64],
            ty: pick("output.weight", None),
        },
    ];
    for i in 0..s.layers {
        let t = |n: &str, dims: Vec<usize>, ty: GgmlType| TensorSpec {
            name: format!("blk.{i}.{n}"),
            dims: dims.into_iter().map(|d| d as u64).collect(),
            ty,
        };
        let e = s.experts;
        tensors.extend([
            t("attn_norm.weight", vec![h], GgmlType::F32),
            t("attn_q.weight", vec![h, q], pick("attn_q.weight", Some(i))),
            t("attn_k.weight", vec![h, kv], pick("attn_k.weight", Some(i))),
            t("attn_v.weight", vec![h, kv], pick("attn_v.weight", Some(i))),
            t(
                "attn_output.weight",
                vec![q, h],
                pick("attn_output.weight", Some(i)),
            ),
            t("attn_q_norm.weight", vec![s.head_dim], GgmlType::F32),
            t("attn_k_norm.weight", vec![s.head_dim], GgmlType::F32),
            t("ffn_norm.weight", vec![h], GgmlType::F32),
            t("ffn_gate_inp.weight", vec![h, e], GgmlType::F32),
            t(
                "ffn_gate_exps.weight",
                vec![h, s.moe_inter, e],
                pick("ffn_gate_exps.weight", Some(i)),
            ),
            t(
                "ffn_up_exps.weight",
                vec![h, s.moe_inter, e],
                pick("ffn_up_exps.weight", Some(i)),
            ),
            t(
                "ffn_down_exps.weight",
                vec![s.moe_inter, h, e],
                pick("ffn_down_exps.weight", Some(i)),
            ),
        ]);
    }
    let arch = |k: &str| format!("qwen3moe.{k}");
    let u32v = |v: usize| Value::U32(v as u32);
    let metadata = vec![
        (
            "general.architecture".to_string(),
            Value::String("qwen3moe".into()),
        ),
        (
            "general.name".to_string(),
            Value::String(format!(
                "random Qwen3-MoE ({} layers, {} experts)",
                s.layers, s.experts
            )),
        ),
        ("general.file_type".to_string(), Value::U32(ftype)),
        ("general.quantization_version".to_string(), Value::U32(2)),
        (arch("block_count"), u32v(s.layers)),
        (arch("context_length"), u32v(40960)),
        (arch("embedding_length"), u32v(h)),
        (arch("feed_forward_length"), u32v(6144)),
        (arch("attention.head_count"), u32v(s.heads)),
        (arch("attention.head_count_kv"), u32v(s.kv_heads)),
        (arch("rope.freq_base"), Value::F32(1e6)),
        (arch("attention.layer_norm_rms_epsilon"), Value::F32(1e-6)),
        (arch("expert_used_count"), u32v(s.top_k)),
        (arch("expert_count"), u32v(s.experts)),
        (arch("attention.key_length"), u32v(s.head_dim)),
        (arch("attention.value_length"), u32v(s.head_dim)),
        (arch("expert_feed_forward_length"), u32v(s.moe_inter)),
        (arch("vocab_size"), u32v(s.vocab)),
        (
            "tokenizer.ggml.model".to_string(),
            Value::String("none".into()),
        ),
        (
            "tokenizer.ggml.tokens".to_string(),
            Value::Array {
                item: ValueType::String,
                values: Vec::new(),
            },
        ),
    ];
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let total: u64 = tensors
        .iter()
        .map(|t| t.size().expect("whole blocks"))
        .sum();
    eprintln!(
        "writing {} ({:.2} GB, {} tensors)",
        out.display(),
        total as f64 / 1e9,
        tensors.len()
    );
    let start = std::time::Instant::now();
    let mut rng = Rng::new(0x5eed_0001);
    let specs = tensors.clone();
    write_file(&out, &metadata, &tensors, |i, w: &mut dyn Write| {
        let t = &specs[i];
        let elements: u64 = t.dims.iter().product();
        if t.ty == GgmlType::F32 {
            let router = t.name.ends_with("ffn_gate_inp.weight");
            let mut buf = Vec::with_capacity(4 * elements as usize);
            for _ in 0..elements {
                let v = if router {
                    rng.normal() / (h as f32).sqrt()
                } else {
                    1.0
                };
                buf.extend_from_slice(&v.to_le_bytes());
            }
            return w.write_all(&buf);
        }
        let blocks = elements / t.ty.block().0 as u64;
        // Embeddings of standard deviation 1 and small other weights (0.002) keep each token's
        // identity dominant in the residual stream, so that tokens route to experts about
        // independently at every layer, as random routing would (with 0.02 everywhere, the
        // layers' outputs swamped the embedding and every token was routed alike: 86% hits at 8
        // of 128 slots).
        let std = if t.name == "token_embd.weight" {
            1.0
        } else {
            0.002
        };
        let mut buf = Vec::with_capacity(1 << 22);
        for _ in 0..blocks {
            random_block(t.ty, std, &mut rng, &mut buf)
                .map_err(|ty| std::io::Error::other(format!("no generator for {}", ty.name())))?;
            if buf.len() >= 1 << 22 {
                w.write_all(&buf)?;
                buf.clear();
            }
        }
        w.write_all(&buf)
    })
    .map_err(|e| std::io::Error::other(e.to_string()))?;
    eprintln!("done in {:.1} s", start.elapsed().as_secs_f64());
    Ok(())
}
