//! The EAGLE-3 draft head (`LlamaForCausalLMEagle3` as published by EAGLE and SpecForge), top to
//! bottom: `fc` fuses the target's residual stream at three layers (low, mid, high) into one
//! hidden state → one Llama decoder layer whose attention input is
//! `[RMSNorm(embedding); RMSNorm(hidden)]` (2·H wide) → its own norm and LM head over a draft
//! vocabulary mapped to target ids by `d2t` (offsets). The token embedding is the target's
//! unless the checkpoint carries its own. The layer's pre-norm output is what the next draft
//! step feeds back (without `fc`).
//!
//! Legend: T = tokens in the forward, H = drafter hidden size, Ht = target hidden size,
//! Vd = draft vocabulary. Drafting policy (which nodes to expand) is not here.

use std::path::Path;

use serde::Deserialize;

use crate::batch::Batch;
use crate::config::Qwen3MoeConfig;
use crate::error::EngineError;
use crate::kernels::{rms_norm, WeightBuf, WeightView};
use crate::kv::KvCache;
use crate::model::layers::{Attention, AttentionShape, DenseMlp, Linear, Rope};
use crate::weights::Checkpoint;

/// The drafter's `config.json` fields this engine reads.
#[derive(Debug, Clone, Deserialize)]
pub struct Eagle3Config {
    #[serde(default)]
    pub architectures: Vec<String>,
    #[serde(default = "one")]
    pub num_hidden_layers: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    #[serde(default)]
    pub head_dim: Option<usize>,
    #[serde(default = "eps")]
    pub rms_norm_eps: f64,
    #[serde(default)]
    pub rope_theta: Option<f64>,
    #[serde(default)]
    pub rope_scaling: Option<serde_json::Value>,
    pub vocab_size: usize,
    #[serde(default)]
    pub draft_vocab_size: Option<usize>,
    #[serde(default)]
    pub target_hidden_size: Option<usize>,
    #[serde(default)]
    pub eagle_config: Option<EagleConfig>,
    #[serde(default)]
    pub fc_norm: bool,
    #[serde(default)]
    pub norm_output: bool,
}

/// `eagle_config` (SpecForge): which target layers feed `fc`.
#[derive(Debug, Clone, Deserialize)]
pub struct EagleConfig {
    /// SpecForge "layer ids": the *outputs* of these layers, i.e. the inputs of `id + 1`.
    #[serde(default)]
    pub eagle_aux_hidden_state_layer_ids: Option<Vec<usize>>,
}

impl Eagle3Config {
    /// The decoder layers of an `n`-layer target whose *input* residuals feed `fc`: the layers
    /// after SpecForge's `eagle_aux_hidden_state_layer_ids`, else EAGLE-3's 2, n/2, n − 3.
    pub fn taps(&self, n: usize) -> Vec<usize> {
        match self
            .eagle_config
            .as_ref()
            .and_then(|e| e.eagle_aux_hidden_state_layer_ids.as_ref())
        {
            Some(ids) => ids.iter().map(|&i| i + 1).collect(),
            None => vec![2, n / 2, n.saturating_sub(3)],
        }
    }
}

fn one() -> usize {
    1
}
fn eps() -> f64 {
    1e-6
}

/// Where a draft step's hidden input comes from.
#[derive(Debug, Clone, Copy)]
pub enum DraftHidden<'a> {
    /// The target's residual stream at the tap layers, concatenated: T × 3·Ht (goes through fc).
    Target(&'a [f32]),
    /// The drafter's own previous output: T × H (no fc).
    Own(&'a [f32]),
}

/// One drafter forward's output.
#[derive(Debug, Clone)]
pub struct DraftOutput {
    /// Pre-norm output of the decoder layer, T × H (fed back to the children).
    pub hidden: Vec<f32>,
    /// Draft-vocabulary logits, T × Vd.
    pub logits: Vec<f32>,
    pub draft_vocab: usize,
}

impl DraftOutput {
    /// Logits of token `t`.
    pub fn row(&self, t: usize) -> &[f32] {
        &self.logits[t * self.draft_vocab..(t + 1) * self.draft_vocab]
    }
}

/// The loaded drafter.
#[derive(Debug, Clone)]
pub struct Eagle3 {
    cfg: Eagle3Config,
    dtype: DrafterDtype,
    fc: Linear,                         // [H, 3·Ht]
    hidden_norm: Vec<f32>,              // [H]
    input_layernorm: Vec<f32>,          // [H]
    self_attn: Attention,               // input 2·H → H
    post_attention_layernorm: Vec<f32>, // [H]
    mlp: DenseMlp,
    norm: Vec<f32>,                  // [H]
    lm_head: Linear,                 // [Vd, H]
    d2t: Option<Vec<i64>>,           // [Vd] offsets; None when the draft vocabulary is the target's
    embed_tokens: Option<WeightBuf>, // [V, H] when the checkpoint has its own
    rope: Rope,
    taps: Vec<usize>,
}

/// How the drafter keeps its matrices (`--drafter-dtype`): as its checkpoint stores them, or
/// quantized at load into a GGUF block type (Q8_0: about half the bytes of bf16 for every draft
/// step to read; Q4_K: about a quarter), at a small change in the drafted probabilities. The
/// target verifies every drafted token, so the output never depends on this choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[allow(non_camel_case_types)]
pub enum DrafterDtype {
    /// As stored (bf16 or f32 panels).
    #[default]
    Native,
    /// Q8_0 rows (32-element blocks, one f16 scale each), multiplied by the quantized kernels.
    Q8_0,
    /// Q4_K rows (256-element blocks of 4-bit values with 6-bit group scales and minimums).
    Q4_K,
}

impl DrafterDtype {
    /// Every choice, in flag order.
    pub const ALL: [DrafterDtype; 3] =
        [DrafterDtype::Native, DrafterDtype::Q8_0, DrafterDtype::Q4_K];

    /// The name used in flags and reports.
    pub fn name(self) -> &'static str {
        match self {
            DrafterDtype::Native => "native",
            DrafterDtype::Q8_0 => "q8_0",
            DrafterDtype::Q4_K => "q4_k",
        }
    }

    /// The default for a target: Q4_K beside a target whose matrices are kept quantized (a
    /// GGUF file: the drafter's bf16 matrices would be read at several times the bytes per
    /// weight of the target's, every draft step), as stored otherwise.
    pub fn for_target(target: &crate::Qwen3Moe) -> DrafterDtype {
        if target.keeps_quantized() {
            DrafterDtype::Q4_K
        } else {
            DrafterDtype::Native
        }
    }

    /// The choice named `name` ([`DrafterDtype::name`]).
    pub fn parse(name: &str) -> Option<DrafterDtype> {
        DrafterDtype::ALL.into_iter().find(|d| d.name() == name)
    }
}

fn mismatch(field: &'static str, drafter: impl ToString, target: impl ToString) -> EngineError {
    EngineError::DrafterMismatch {
        field,
        drafter: drafter.to_string(),
        target: target.to_string(),
    }
}

impl Eagle3 {
    /// Checks that a drafter with config `cfg` fits `target` (what [`Eagle3::load`] checks
    /// before reading any tensor).
    pub fn check(cfg: &Eagle3Config, target: &Qwen3MoeConfig) -> Result<(), EngineError> {
        check_fit(cfg, target).map(|_| ())
    }

    /// Loads a drafter directory (`config.json` + safetensors) for `target`, its matrices as
    /// stored.
    pub fn load(dir: &Path, target: &Qwen3MoeConfig) -> Result<Eagle3, EngineError> {
        Eagle3::load_as(dir, target, DrafterDtype::Native)
    }

    /// [`Eagle3::load`] with the matrices kept as `dtype` says.
    pub fn load_as(
        dir: &Path,
        target: &Qwen3MoeConfig,
        dtype: DrafterDtype,
    ) -> Result<Eagle3, EngineError> {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(EngineError::io(&path))?;
        let cfg: Eagle3Config = serde_json::from_str(&text).map_err(|e| EngineError::Json {
            path: path.clone(),
            message: e.to_string(),
        })?;
        let taps = check_fit(&cfg, target)?;
        let mut ck = Checkpoint::open(dir)?;
        match dtype {
            DrafterDtype::Native => {}
            DrafterDtype::Q8_0 => ck.quantize_matrices(specfit_gguf::GgmlType::Q8_0),
            DrafterDtype::Q4_K => ck.quantize_matrices(specfit_gguf::GgmlType::Q4_K),
        }
        let (h, ht, v) = (
            cfg.hidden_size,
            cfg.target_hidden_size.unwrap_or(target.hidden_size),
            cfg.vocab_size,
        );
        let vd = cfg.draft_vocab_size.unwrap_or(v);
        let d = cfg.head_dim.unwrap_or(h / cfg.num_attention_heads);
        let shape = AttentionShape {
            input: 2 * h,
            output: h,
            heads: cfg.num_attention_heads,
            kv_heads: cfg.num_key_value_heads,
            head_dim: d,
            qk_norm: false,
            bias: false,
            eps: cfg.rms_norm_eps as f32,
        };
        let embed_tokens = if ck.contains("embed_tokens.weight") {
            Some(ck.take_weight("embed_tokens.weight", &[v, h])?)
        } else if h != target.hidden_size {
            return Err(mismatch(
                "hidden_size (no embed_tokens.weight of its own)",
                h,
                target.hidden_size,
            ));
        } else {
            None
        };
        let d2t = if vd != v {
            Some(ck.take_i64("d2t", &[vd])?)
        } else {
            None
        };
        ck.ignore("d2t");
        ck.ignore("t2d");
        let drafter = Eagle3 {
            fc: Linear::load(&mut ck, "fc", h, 3 * ht)?,
            hidden_norm: ck.take("midlayer.hidden_norm.weight", &[h])?,
            input_layernorm: ck.take("midlayer.input_layernorm.weight", &[h])?,
            self_attn: Attention::load(&mut ck, "midlayer.self_attn", &shape)?,
            post_attention_layernorm: ck.take("midlayer.post_attention_layernorm.weight", &[h])?,
            mlp: DenseMlp::load(&mut ck, "midlayer.mlp", h, cfg.intermediate_size)?,
            norm: ck.take("norm.weight", &[h])?,
            lm_head: Linear::load(&mut ck, "lm_head", vd, h)?,
            d2t,
            embed_tokens,
            rope: Rope::new(cfg.rope_theta.unwrap_or(10000.0), d),
            taps,
            cfg,
            dtype,
        };
        ck.finish()?;
        if let Some(d2t) = &drafter.d2t {
            if let Some((i, _)) = d2t
                .iter()
                .enumerate()
                .find(|&(i, &o)| i as i64 + o < 0 || (i as i64 + o) as usize >= v)
            {
                return Err(mismatch(
                    "d2t",
                    format!("entry {i} maps outside the vocabulary"),
                    format!("vocab_size {v}"),
                ));
            }
        }
        Ok(drafter)
    }

    /// The target layers whose input residual stream feeds `fc` (low, mid, high).
    pub fn taps(&self) -> &[usize] {
        &self.taps
    }

    /// How the matrices are kept.
    pub fn dtype(&self) -> DrafterDtype {
        self.dtype
    }

    /// The configuration.
    pub fn config(&self) -> &Eagle3Config {
        &self.cfg
    }

    /// Size of the draft vocabulary.
    pub fn draft_vocab(&self) -> usize {
        self.lm_head.out
    }

    /// The target token id of draft-vocabulary index `i` (`i + d2t[i]`).
    pub fn to_target(&self, i: usize) -> u32 {
        match &self.d2t {
            Some(d2t) => (i as i64 + d2t[i]) as u32,
            None => i as u32,
        }
    }

    /// A KV cache for the drafter's one layer.
    pub fn new_kv_cache(&self) -> KvCache {
        let d = self
            .cfg
            .head_dim
            .unwrap_or(self.cfg.hidden_size / self.cfg.num_attention_heads);
        KvCache::new(1, self.cfg.num_key_value_heads, d)
    }

    /// One forward over `batch` (target token ids, positions, mask, which rows get logits; its
    /// taps are not read) with the tokens' hidden inputs, appending to `kv`. `target_embed` is
    /// the target's token embedding (used unless the drafter has its own). Logits are computed
    /// only for the rows `batch.logits` names (`row(0)` is the first of them): feeding committed
    /// tokens needs only the last row, and the draft lm_head is most of the drafter's work.
    pub fn forward(
        &self,
        target_embed: WeightView<'_>,
        batch: &Batch<'_>,
        hidden: DraftHidden<'_>,
        kv: &mut KvCache,
    ) -> Result<DraftOutput, EngineError> {
        let tokens = batch.tokens;
        let (t, h) = (tokens.len(), self.cfg.hidden_size);
        if let Some((index, &token)) = tokens
            .iter()
            .enumerate()
            .find(|(_, &tok)| tok as usize >= self.cfg.vocab_size)
        {
            return Err(EngineError::TokenOutOfRange {
                token,
                index,
                vocab: self.cfg.vocab_size,
            });
        }
        let cached = kv.len();
        let positions = crate::batch::resolve_positions(batch.positions, cached, t)?;
        let visible = batch.mask.visible(cached, t)?;
        // Hidden input: fc(target features) or the drafter's own output. T × H.
        let residual = match hidden {
            DraftHidden::Target(f) if f.len() == t * self.fc.inp => self.fc.forward(f, t),
            DraftHidden::Own(x) if x.len() == t * h => x.to_vec(),
            DraftHidden::Target(f) | DraftHidden::Own(f) => {
                return Err(EngineError::BadDraftInput {
                    reason: format!("hidden input has {} values for {t} tokens", f.len()),
                })
            }
        };
        // Attention input: [RMSNorm_input(embedding); RMSNorm_hidden(hidden)], T × 2H.
        let embed = self
            .embed_tokens
            .as_ref()
            .map_or(target_embed, WeightBuf::view);
        let emb: Vec<f32> = tokens
            .iter()
            .flat_map(|&tok| {
                let row = embed.slice(tok as usize * h..(tok as usize + 1) * h);
                (0..h).map(move |c| row.get(c))
            })
            .collect();
        let eps = self.cfg.rms_norm_eps as f32;
        let (mut e_n, mut h_n) = (vec![0.0; t * h], vec![0.0; t * h]);
        rms_norm(&emb, &self.input_layernorm, eps, &mut e_n);
        rms_norm(&residual, &self.hidden_norm, eps, &mut h_n);
        let x: Vec<f32> = (0..t)
            .flat_map(|i| {
                e_n[i * h..(i + 1) * h]
                    .iter()
                    .chain(&h_n[i * h..(i + 1) * h])
                    .copied()
            })
            .collect();
        let rope = self.rope.table(&positions);
        let attn = self.self_attn.forward(&x, &rope, &visible, kv, 0);
        kv.commit(t);
        // h2 = hidden + attn; h3 = h2 + mlp(post_attention_layernorm(h2)).
        let mut out: Vec<f32> = residual.iter().zip(&attn).map(|(a, b)| a + b).collect();
        let mut normed = vec![0.0; t * h];
        rms_norm(&out, &self.post_attention_layernorm, eps, &mut normed);
        let mlp = self.mlp.forward(&normed, t);
        out.iter_mut().zip(&mlp).for_each(|(a, b)| *a += b);
        // Logits over the draft vocabulary from the final norm.
        rms_norm(&out, &self.norm, eps, &mut normed);
        let rows = batch.logits.rows(t);
        let picked: Vec<f32> = rows
            .iter()
            .flat_map(|&r| normed[r * h..(r + 1) * h].iter().copied())
            .collect();
        let logits = self.lm_head.forward(&picked, rows.len());
        Ok(DraftOutput {
            hidden: out,
            logits,
            draft_vocab: self.lm_head.out,
        })
    }
}

/// Checks that the drafter fits the target; returns the target layers to tap.
fn check_fit(cfg: &Eagle3Config, target: &Qwen3MoeConfig) -> Result<Vec<usize>, EngineError> {
    if cfg.num_hidden_layers != 1 {
        return Err(mismatch(
            "num_hidden_layers",
            cfg.num_hidden_layers,
            "EAGLE-3 drafters have one layer",
        ));
    }
    if cfg.fc_norm || cfg.norm_output {
        return Err(mismatch(
            "fc_norm/norm_output",
            true,
            "the EAGLE-3.1 variant is not supported",
        ));
    }
    if cfg.rope_scaling.as_ref().is_some_and(|v| !v.is_null()) {
        return Err(mismatch("rope_scaling", "set", "not supported"));
    }
    if cfg.vocab_size != target.vocab_size {
        return Err(mismatch(
            "vocab_size",
            cfg.vocab_size,
            format!("vocab_size {}", target.vocab_size),
        ));
    }
    let ht = cfg.target_hidden_size.unwrap_or(target.hidden_size);
    if ht != target.hidden_size {
        return Err(mismatch(
            "target_hidden_size",
            ht,
            format!("hidden_size {}", target.hidden_size),
        ));
    }
    if cfg
        .draft_vocab_size
        .is_some_and(|vd| vd == 0 || vd > cfg.vocab_size)
    {
        return Err(mismatch(
            "draft_vocab_size",
            cfg.draft_vocab_size.unwrap_or(0),
            format!("vocab_size {}", cfg.vocab_size),
        ));
    }
    let n = target.num_hidden_layers;
    let taps = cfg.taps(n);
    if taps.len() != 3 || taps.iter().any(|&l| l >= n) {
        return Err(mismatch(
            "eagle_aux_hidden_state_layer_ids",
            format!("{taps:?} (as layer inputs)"),
            format!("{n} layers"),
        ));
    }
    Ok(taps)
}
