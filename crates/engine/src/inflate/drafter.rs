//! The inflated EAGLE-3 drafter: the small head in the published head's shape (SpecForge
//! layout, bf16), top to bottom — `fc` reads the first copy of each tapped residual and writes
//! every copy; the layer's attention keeps the small heads in their GQA groups with rotary pair
//! `j` at pair `m·j` and the softmax scale carried by `q_proj` (×√m); the MLP is zero-padded;
//! the LM head reads the first copy. `d2t`/`t2d` and the draft vocabulary are the small head's.
//! Writing only.

use std::collections::HashMap;
use std::path::Path;

use safetensors::tensor::{Dtype, TensorView};
use serde_json::json;
use specfit_gguf::GgmlType;

use super::plan::Plan;
use super::rows::{first_copy, row, Matrix, Row};
use crate::error::EngineError;
use crate::model::eagle3::Eagle3Config;
use crate::weights::Checkpoint;

/// An MLP gate or up matrix `[inter, h]`: the small `[i0, h0]` rows on the first copy, then zero
/// rows.
fn padded_rows<'a>(
    name: &'static str,
    small: &'a [f32],
    inter: usize,
    h: usize,
    h0: usize,
    i0: usize,
) -> (&'static str, Vec<usize>, Matrix<'a>) {
    (
        name,
        vec![inter, h],
        Matrix {
            rows: inter,
            cols: h,
            place: first_copy(h0),
            row: Box::new(move |r| {
                if r < i0 {
                    Row::Small(row(small, h0, r), 1.0)
                } else {
                    Row::Zero
                }
            }),
        },
    )
}

/// The drafter's tensors and config.json, written into `dir` (which must not exist; made
/// through a temporary sibling renamed at the end).
pub fn write(
    plan: &Plan,
    small_dir: &Path,
    cfg: &Eagle3Config,
    taps: &[usize],
    dir: &Path,
) -> Result<(), EngineError> {
    let (s, big) = (&plan.small, &plan.shape);
    let (h0, h, d0, d) = (cfg.hidden_size, big.hidden_size, s.head_dim, big.head_dim);
    let (heads0, kv0) = (cfg.num_attention_heads, cfg.num_key_value_heads);
    let (i0, inter) = (cfg.intermediate_size, big.drafter_intermediate_size);
    let vd = cfg.draft_vocab_size.unwrap_or(cfg.vocab_size);
    let copies = h / h0;
    let (q_out, kv_out) = (big.num_attention_heads * d, big.num_key_value_heads * d);
    // The small head's float tensors, widened to f32 with their shapes checked.
    let ck = Checkpoint::open(small_dir)?;
    let fc = ck.peek("fc.weight", &[h0, 3 * h0])?;
    let wq = ck.peek("midlayer.self_attn.q_proj.weight", &[heads0 * d0, 2 * h0])?;
    let wk = ck.peek("midlayer.self_attn.k_proj.weight", &[kv0 * d0, 2 * h0])?;
    let wv = ck.peek("midlayer.self_attn.v_proj.weight", &[kv0 * d0, 2 * h0])?;
    let wo = ck.peek("midlayer.self_attn.o_proj.weight", &[h0, heads0 * d0])?;
    let gate = ck.peek("midlayer.mlp.gate_proj.weight", &[i0, h0])?;
    let up = ck.peek("midlayer.mlp.up_proj.weight", &[i0, h0])?;
    let down = ck.peek("midlayer.mlp.down_proj.weight", &[h0, i0])?;
    let lm_head = ck.peek("lm_head.weight", &[vd, h0])?;
    let (fc, wq, wk, wv, wo, down, lm_head) = (
        fc.as_slice(),
        wq.as_slice(),
        wk.as_slice(),
        wv.as_slice(),
        wo.as_slice(),
        down.as_slice(),
        lm_head.as_slice(),
    );
    let norms: Vec<(String, Vec<f32>)> = [
        "midlayer.hidden_norm.weight",
        "midlayer.input_layernorm.weight",
        "midlayer.post_attention_layernorm.weight",
        "norm.weight",
    ]
    .iter()
    .map(|&n| Ok((n.to_string(), ck.peek(n, &[h0])?.repeat(copies))))
    .collect::<Result<_, EngineError>>()?;
    // Attention input [embedding; hidden], 2·H wide: the small halves' first copies.
    let attn_in: Vec<Vec<usize>> = (0..2 * h0)
        .map(|c| vec![if c < h0 { c } else { h + c - h0 }])
        .collect();
    let small_query = |g: usize| (0..heads0).find(|&x| plan.query_head(x, heads0, kv0) == g);
    let q_scale = (plan.pair_factor() as f32).sqrt();
    let rotary = |r: usize| plan.rotary_dim(r % d);
    let padded_rows = |name, small| padded_rows(name, small, inter, h, h0, i0);
    let matrices: Vec<(&str, Vec<usize>, Matrix<'_>)> = vec![
        padded_rows("midlayer.mlp.gate_proj.weight", &gate),
        padded_rows("midlayer.mlp.up_proj.weight", &up),
        (
            "fc.weight",
            vec![h, 3 * h],
            Matrix {
                rows: h,
                cols: 3 * h,
                place: (0..3 * h0).map(|c| vec![(c / h0) * h + c % h0]).collect(),
                row: Box::new(move |r| Row::Small(row(fc, 3 * h0, r % h0), 1.0)),
            },
        ),
        (
            "midlayer.self_attn.q_proj.weight",
            vec![q_out, 2 * h],
            Matrix {
                rows: q_out,
                cols: 2 * h,
                place: attn_in.clone(),
                row: Box::new(move |r| match (small_query(r / d), rotary(r)) {
                    (Some(x), (j, 0)) => Row::Small(row(wq, 2 * h0, x * d0 + j), q_scale),
                    _ => Row::Zero,
                }),
            },
        ),
        (
            "midlayer.self_attn.k_proj.weight",
            vec![kv_out, 2 * h],
            Matrix {
                rows: kv_out,
                cols: 2 * h,
                place: attn_in.clone(),
                row: Box::new(move |r| match (r / d, rotary(r)) {
                    (c, (j, 0)) if c < kv0 => Row::Small(row(wk, 2 * h0, c * d0 + j), 1.0),
                    _ => Row::Zero,
                }),
            },
        ),
        (
            "midlayer.self_attn.v_proj.weight",
            vec![kv_out, 2 * h],
            Matrix {
                rows: kv_out,
                cols: 2 * h,
                place: attn_in,
                row: Box::new(move |r| match (r / d, r % d) {
                    (c, x) if c < kv0 && x < d0 => Row::Small(row(wv, 2 * h0, c * d0 + x), 1.0),
                    _ => Row::Zero,
                }),
            },
        ),
        (
            "midlayer.self_attn.o_proj.weight",
            vec![h, q_out],
            Matrix {
                rows: h,
                cols: q_out,
                place: (0..heads0 * d0)
                    .map(|c| vec![plan.query_head(c / d0, heads0, kv0) * d + c % d0])
                    .collect(),
                row: Box::new(move |r| Row::Small(row(wo, heads0 * d0, r % h0), 1.0)),
            },
        ),
        (
            "midlayer.mlp.down_proj.weight",
            vec![h, inter],
            Matrix {
                rows: h,
                cols: inter,
                place: first_copy(i0),
                row: Box::new(move |r| Row::Small(row(down, i0, r % h0), 1.0)),
            },
        ),
        (
            "lm_head.weight",
            vec![vd, h],
            Matrix {
                rows: vd,
                cols: h,
                place: first_copy(h0),
                row: Box::new(move |r| Row::Small(row(lm_head, h0, r), 1.0)),
            },
        ),
    ];
    // d2t / t2d (integer and bool tensors) are copied as stored.
    let path = small_dir.join("model.safetensors");
    let raw = std::fs::read(&path).map_err(EngineError::io(&path))?;
    let st = safetensors::SafeTensors::deserialize(&raw).map_err(|e| EngineError::Safetensors {
        path: path.clone(),
        message: e.to_string(),
    })?;
    let bad = |name: &str, reason: String| EngineError::Safetensors {
        path: path.clone(),
        message: format!("{name}: {reason}"),
    };
    let mut data: Vec<(String, Vec<usize>, Dtype, Vec<u8>)> = Vec::new();
    for (name, shape, m) in &matrices {
        let bytes = m
            .to_bytes(GgmlType::BF16)
            .map_err(|e| bad(name, e.to_string()))?;
        data.push((name.to_string(), shape.clone(), Dtype::BF16, bytes));
    }
    for (name, v) in &norms {
        let bytes = Matrix::vector(v)
            .to_bytes(GgmlType::BF16)
            .map_err(|e| bad(name, e.to_string()))?;
        data.push((name.clone(), vec![h], Dtype::BF16, bytes));
    }
    for name in ["d2t", "t2d"] {
        if let Ok(view) = st.tensor(name) {
            data.push((
                name.into(),
                view.shape().to_vec(),
                view.dtype(),
                view.data().to_vec(),
            ));
        }
    }
    let views = data
        .iter()
        .map(|(name, shape, dtype, bytes)| {
            TensorView::new(*dtype, shape.clone(), bytes)
                .map(|v| (name.clone(), v))
                .map_err(|e| bad(name, e.to_string()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    // The small config with the large shape: every other field (ids, θ, eps, context) kept.
    let cfg_path = small_dir.join("config.json");
    let text = std::fs::read_to_string(&cfg_path).map_err(EngineError::io(&cfg_path))?;
    let mut config: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| EngineError::Json {
            path: cfg_path.clone(),
            message: e.to_string(),
        })?;
    for (key, value) in [
        ("hidden_size", json!(h)),
        ("intermediate_size", json!(inter)),
        ("num_attention_heads", json!(big.num_attention_heads)),
        ("num_key_value_heads", json!(big.num_key_value_heads)),
        ("head_dim", json!(d)),
        ("target_hidden_size", json!(h)),
        ("torch_dtype", json!("bfloat16")),
        (
            "eagle_config",
            json!({"eagle_aux_hidden_state_layer_ids": taps}),
        ),
    ] {
        config[key] = value;
    }
    let tmp = dir.with_extension("tmp");
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(EngineError::io(&tmp))?;
    }
    std::fs::create_dir_all(&tmp).map_err(EngineError::io(&tmp))?;
    let st_path = tmp.join("model.safetensors");
    let meta: HashMap<String, String> = [("format".to_string(), "pt".to_string())].into();
    safetensors::serialize_to_file(views, Some(meta), &st_path).map_err(|e| {
        EngineError::Safetensors {
            path: st_path.clone(),
            message: e.to_string(),
        }
    })?;
    let cfg_path = tmp.join("config.json");
    let text = serde_json::to_string_pretty(&config).expect("plain JSON") + "\n";
    std::fs::write(&cfg_path, text).map_err(EngineError::io(&cfg_path))?;
    std::fs::rename(&tmp, dir).map_err(EngineError::io(dir))
}
