//! The inflated target as one `qwen3moe` GGUF file, top to bottom like the model: embedding,
//! then each of the large model's layers — a trained layer holds its small layer exactly; a
//! pass-through layer has full-size random q/k/v and expert gate/up weights (so it costs what a
//! real layer costs), zero attention output and expert down projections (so it adds nothing to
//! the residual), and a router copied from the next trained layer — then the final norm and LM
//! head. Tokenizer, chat template and the plan go in the metadata. Writing only.

use std::collections::HashMap;
use std::path::Path;

use specfit_gguf::quant::{q4_k_m_type, Rng};
use specfit_gguf::write::TensorSpec;
use specfit_gguf::{GgmlType, Value};

use super::plan::Plan;
use super::rows::{every_copy, first_copy, row, Matrix, Row};
use super::FileType;
use crate::error::EngineError;

/// The small target's tensors as f32, by Hugging Face name.
pub type Tensors = HashMap<String, Vec<f32>>;

/// One tensor of the file: its directory entry and how to make its data.
pub struct Tensor<'a> {
    pub spec: TensorSpec,
    pub matrix: Matrix<'a>,
}

fn small<'a>(t: &'a Tensors, name: &str) -> &'a [f32] {
    t.get(name)
        .unwrap_or_else(|| panic!("{name} was read with the checkpoint"))
}

/// Every tensor of the inflated target, in file order.
pub fn tensors<'a>(
    plan: &'a Plan,
    t: &'a Tensors,
    ty: FileType,
    vectors: &'a Vectors,
) -> Vec<Tensor<'a>> {
    let (s, big) = (&plan.small, &plan.shape);
    let (h0, h) = (s.hidden, big.hidden_size);
    let copies = plan.hidden_copies();
    let n = big.num_hidden_layers;
    let pick = |name: &str| match ty {
        FileType::Q8_0 => GgmlType::Q8_0,
        FileType::Q4KM => q4_k_m_type(name, n),
        FileType::F32 => GgmlType::F32,
    };
    let spec = |name: String, dims: &[usize], ty: GgmlType| TensorSpec {
        name,
        dims: dims.iter().rev().map(|&d| d as u64).collect(),
        ty,
    };
    let mut out = Vec::new();
    let embed = small(t, "model.embed_tokens.weight");
    let lm_head = t.get("lm_head.weight").map_or(embed, Vec::as_slice);
    // token_embd [V, H]: each token's small embedding on every copy.
    out.push(Tensor {
        spec: spec(
            "token_embd.weight".into(),
            &[s.vocab, h],
            pick("token_embd.weight"),
        ),
        matrix: Matrix {
            rows: s.vocab,
            cols: h,
            place: every_copy(h0, copies),
            row: Box::new(move |v| Row::Small(row(embed, h0, v), 1.0)),
        },
    });
    out.push(Tensor {
        spec: spec("output_norm.weight".into(), &[h], GgmlType::F32),
        matrix: Matrix::vector(&vectors.output_norm),
    });
    // output [V, H]: the small LM head reads the first copy.
    out.push(Tensor {
        spec: spec("output.weight".into(), &[s.vocab, h], pick("output.weight")),
        matrix: Matrix {
            rows: s.vocab,
            cols: h,
            place: first_copy(h0),
            row: Box::new(move |v| Row::Small(row(lm_head, h0, v), 1.0)),
        },
    });
    for l in 0..n {
        out.extend(layer(plan, t, l, &pick, vectors));
    }
    out
}

/// What is computed once per layer: replicated hidden norms, remapped head norms, and the
/// pass-through layers' fitted routers.
pub struct Vectors {
    pub output_norm: Vec<f32>,
    /// Per large layer: attn_norm, q_norm, k_norm, ffn_norm.
    pub layers: Vec<[Vec<f32>; 4]>,
    /// Per large layer: its fitted router `[small experts, small hidden]` (pass-through layers
    /// with fitted routing), else `None` (the small router of its source layer).
    pub routers: Vec<Option<Vec<f32>>>,
}

impl Vectors {
    pub fn new(plan: &Plan, t: &Tensors, routers: Vec<Option<Vec<f32>>>) -> Vectors {
        let copies = plan.hidden_copies();
        let repeat =
            |v: &[f32]| -> Vec<f32> { (0..copies).flat_map(|_| v.iter().copied()).collect() };
        let d = plan.shape.head_dim;
        // Softmax scale: the small model divides by √d0, the large one by √(m·d0); q carries √m.
        let q_scale = (plan.pair_factor() as f32).sqrt();
        let layers = (0..plan.shape.num_hidden_layers)
            .map(|l| {
                let p = |name: &str| format!("model.layers.{}.{name}", plan.router_source[l]);
                let q_norm = small(t, &p("self_attn.q_norm.weight"));
                let k_norm = small(t, &p("self_attn.k_norm.weight"));
                [
                    repeat(small(t, &p("input_layernorm.weight"))),
                    // Every copy of a pair is normalised like the pair (the same pre-norm values
                    // make the same mean square); only the first copy of k survives the norm, so
                    // the copies add nothing to q·k.
                    (0..d)
                        .map(|x| q_norm[plan.rotary_dim(x).0] * q_scale)
                        .collect(),
                    (0..d)
                        .map(|x| match plan.rotary_dim(x) {
                            (j, 0) => k_norm[j],
                            _ => 0.0,
                        })
                        .collect(),
                    repeat(small(t, &p("post_attention_layernorm.weight"))),
                ]
            })
            .collect();
        Vectors {
            output_norm: repeat(small(t, "model.norm.weight")),
            layers,
            routers,
        }
    }
}

/// The tensors of large layer `l`.
fn layer<'a>(
    plan: &'a Plan,
    t: &'a Tensors,
    l: usize,
    pick: &dyn Fn(&str) -> GgmlType,
    vectors: &'a Vectors,
) -> Vec<Tensor<'a>> {
    let (s, big) = (&plan.small, &plan.shape);
    let (h0, h, d0, d) = (s.hidden, big.hidden_size, s.head_dim, big.head_dim);
    let (i0, inter, e) = (
        s.moe_intermediate,
        big.moe_intermediate_size,
        big.num_experts,
    );
    let (q_out, kv_out) = (big.num_attention_heads * d, big.num_key_value_heads * d);
    let trained = plan.trained_layers.contains(&l);
    let source = plan.router_source[l];
    let p = move |name: &str| format!("model.layers.{source}.{name}");
    let name = |suffix: &str| format!("blk.{l}.{suffix}");
    let spec = |suffix: &str, dims: &[usize], ty: GgmlType| TensorSpec {
        name: name(suffix),
        dims: dims.iter().rev().map(|&x| x as u64).collect(),
        ty,
    };
    let typed = |suffix: &str, dims: &[usize]| spec(suffix, dims, pick(&name(suffix)));
    let [attn_norm, q_norm, k_norm, ffn_norm] = &vectors.layers[l];
    // The small query head at large head g, if any.
    let small_query =
        move |g: usize| (0..s.heads).find(|&hh| plan.query_head(hh, s.heads, s.kv_heads) == g);
    let (wq, wk, wv, wo) = (
        small(t, &p("self_attn.q_proj.weight")),
        small(t, &p("self_attn.k_proj.weight")),
        small(t, &p("self_attn.v_proj.weight")),
        small(t, &p("self_attn.o_proj.weight")),
    );
    let random_or =
        |rows: Box<dyn Fn(usize) -> Row<'a> + 'a>| -> Box<dyn Fn(usize) -> Row<'a> + 'a> {
            if trained {
                rows
            } else {
                Box::new(|_| Row::Random)
            }
        };
    let zero_or = |rows: Box<dyn Fn(usize) -> Row<'a> + 'a>| -> Box<dyn Fn(usize) -> Row<'a> + 'a> {
        if trained {
            rows
        } else {
            Box::new(|_| Row::Zero)
        }
    };
    let mut out = vec![Tensor {
        spec: spec("attn_norm.weight", &[h], GgmlType::F32),
        matrix: Matrix::vector(attn_norm),
    }];
    // q [heads·D, H]: every copy of a rotary pair is the small pair's row.
    out.push(Tensor {
        spec: typed("attn_q.weight", &[q_out, h]),
        matrix: Matrix {
            rows: q_out,
            cols: h,
            place: first_copy(h0),
            row: random_or(Box::new(move |r| match small_query(r / d) {
                Some(hh) => Row::Small(row(wq, h0, hh * d0 + plan.rotary_dim(r % d).0), 1.0),
                None => Row::Zero,
            })),
        },
    });
    out.push(Tensor {
        spec: typed("attn_k.weight", &[kv_out, h]),
        matrix: Matrix {
            rows: kv_out,
            cols: h,
            place: first_copy(h0),
            row: random_or(Box::new(move |r| match r / d {
                c if c < s.kv_heads => {
                    Row::Small(row(wk, h0, c * d0 + plan.rotary_dim(r % d).0), 1.0)
                }
                _ => Row::Zero,
            })),
        },
    });
    // v [kv·D, H]: the small head's values in the first d0 dims.
    out.push(Tensor {
        spec: typed("attn_v.weight", &[kv_out, h]),
        matrix: Matrix {
            rows: kv_out,
            cols: h,
            place: first_copy(h0),
            row: random_or(Box::new(move |r| match (r / d, r % d) {
                (c, x) if c < s.kv_heads && x < d0 => Row::Small(row(wv, h0, c * d0 + x), 1.0),
                _ => Row::Zero,
            })),
        },
    });
    // o [H, heads·D]: every copy of the residual gets the small output; columns of the small
    // heads' value dims.
    let o_place: Vec<Vec<usize>> = (0..s.heads * d0)
        .map(|c| vec![plan.query_head(c / d0, s.heads, s.kv_heads) * d + c % d0])
        .collect();
    out.push(Tensor {
        spec: typed("attn_output.weight", &[h, q_out]),
        matrix: Matrix {
            rows: h,
            cols: q_out,
            place: o_place,
            row: zero_or(Box::new(move |r| {
                Row::Small(row(wo, s.heads * d0, r % h0), 1.0)
            })),
        },
    });
    out.push(Tensor {
        spec: spec("attn_q_norm.weight", &[d], GgmlType::F32),
        matrix: Matrix::vector(q_norm),
    });
    out.push(Tensor {
        spec: spec("attn_k_norm.weight", &[d], GgmlType::F32),
        matrix: Matrix::vector(k_norm),
    });
    out.push(Tensor {
        spec: spec("ffn_norm.weight", &[h], GgmlType::F32),
        matrix: Matrix::vector(ffn_norm),
    });
    // Router [E, H]: every copy of a small expert gets its row (their logits tie, so top-k
    // picks all copies and the renormalised weights sum to the small expert's).
    let router = match &vectors.routers[l] {
        Some(fitted) => fitted.as_slice(),
        None => small(t, &p("mlp.gate.weight")),
    };
    out.push(Tensor {
        spec: spec("ffn_gate_inp.weight", &[e, h], GgmlType::F32),
        matrix: Matrix {
            rows: e,
            cols: h,
            place: first_copy(h0),
            row: Box::new(move |id| Row::Small(row(router, h0, plan.small_expert(l, id)), 1.0)),
        },
    });
    let experts: Vec<[&'a [f32]; 3]> = (0..s.experts)
        .map(|x| {
            ["gate_proj", "up_proj", "down_proj"]
                .map(|m| small(t, &p(&format!("mlp.experts.{x}.{m}.weight"))))
        })
        .collect();
    let experts = std::rc::Rc::new(experts);
    for (k, suffix) in [(0, "ffn_gate_exps.weight"), (1, "ffn_up_exps.weight")] {
        let experts = experts.clone();
        out.push(Tensor {
            spec: typed(suffix, &[e, inter, h]),
            matrix: Matrix {
                rows: e * inter,
                cols: h,
                place: first_copy(h0),
                row: random_or(Box::new(move |r| match r % inter {
                    j if j < i0 => {
                        Row::Small(row(experts[plan.small_expert(l, r / inter)][k], h0, j), 1.0)
                    }
                    _ => Row::Zero,
                })),
            },
        });
    }
    out.push(Tensor {
        spec: typed("ffn_down_exps.weight", &[e, h, inter]),
        matrix: Matrix {
            rows: e * h,
            cols: inter,
            place: first_copy(i0),
            row: zero_or(Box::new(move |r| {
                Row::Small(
                    row(experts[plan.small_expert(l, r / h)][2], i0, (r % h) % h0),
                    1.0,
                )
            })),
        },
    });
    out
}

/// The file's metadata: the `qwen3moe` hyperparameters, the tokenizer and the plan.
pub fn metadata(
    plan: &Plan,
    ty: FileType,
    cfg: &crate::config::Qwen3MoeConfig,
    tokenizer: Vec<(String, Value)>,
    source: &Path,
) -> Vec<(String, Value)> {
    let big = &plan.shape;
    let arch = |k: &str| format!("qwen3moe.{k}");
    let u32v = |v: usize| Value::U32(v as u32);
    let mut m = vec![
        (
            "general.architecture".to_string(),
            Value::String("qwen3moe".into()),
        ),
        (
            "general.name".to_string(),
            Value::String(format!(
                "{} inflated to Qwen3-30B-A3B shapes (vocabulary {}, not 151,936)",
                source.display(),
                cfg.vocab_size
            )),
        ),
        ("general.file_type".to_string(), Value::U32(ty.ftype())),
        ("general.quantization_version".to_string(), Value::U32(2)),
        (arch("block_count"), u32v(big.num_hidden_layers)),
        (arch("context_length"), u32v(cfg.max_position_embeddings)),
        (arch("embedding_length"), u32v(big.hidden_size)),
        (arch("feed_forward_length"), u32v(6144)),
        (arch("attention.head_count"), u32v(big.num_attention_heads)),
        (
            arch("attention.head_count_kv"),
            u32v(big.num_key_value_heads),
        ),
        (arch("rope.freq_base"), Value::F32(cfg.rope_theta() as f32)),
        (
            arch("attention.layer_norm_rms_epsilon"),
            Value::F32(cfg.rms_norm_eps as f32),
        ),
        (arch("expert_used_count"), u32v(big.num_experts_per_tok)),
        (arch("expert_count"), u32v(big.num_experts)),
        (arch("attention.key_length"), u32v(big.head_dim)),
        (arch("attention.value_length"), u32v(big.head_dim)),
        (
            arch("expert_feed_forward_length"),
            u32v(big.moe_intermediate_size),
        ),
        (arch("vocab_size"), u32v(cfg.vocab_size)),
        (
            "specfit.inflate.trained_layers".to_string(),
            Value::Array {
                item: specfit_gguf::ValueType::U32,
                values: plan.trained_layers.iter().map(|&l| u32v(l)).collect(),
            },
        ),
    ];
    m.extend(tokenizer);
    m
}

/// Writes the target file at `path` (through a temporary name); `progress(bytes)` after each
/// tensor.
pub fn write(
    path: &Path,
    metadata: &[(String, Value)],
    tensors: &[Tensor<'_>],
    progress: &mut dyn FnMut(u64),
) -> Result<(), EngineError> {
    let specs: Vec<TensorSpec> = tensors.iter().map(|t| t.spec.clone()).collect();
    specfit_gguf::write::write_file(path, metadata, &specs, |i, w| {
        let t = &tensors[i];
        // A seed per tensor: the file is the same whatever order it is written in.
        let mut rng = Rng::new(0x1f1a_7e00 ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        t.matrix.write(t.spec.ty, &mut rng, w)?;
        progress(t.matrix.bytes(t.spec.ty));
        Ok(())
    })
    .map_err(|error| {
        // Nothing partial stays behind.
        let _ = std::fs::remove_file(path.with_extension("gguf.tmp"));
        EngineError::Gguf {
            path: path.to_path_buf(),
            error,
        }
    })
}
