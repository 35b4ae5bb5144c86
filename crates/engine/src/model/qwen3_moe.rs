//! `Qwen3MoeForCausalLM`, top to bottom as in HF `modeling_qwen3_moe.py`: RoPE → linear → attention
//! (per-head q/k RMSNorm before RoPE, GQA) → dense MLP → sparse MoE block (f32 softmax router,
//! top-k, optional renormalisation, SwiGLU experts run from the expert cache) → decoder layer →
//! model → LM head. Every matmul, norm and softmax runs through the batch-invariant kernels, so a
//! token's results do not depend on the other tokens of its forward.
//!
//! Legend: T = tokens in the forward, H = hidden_size, D = head_dim, Hq/Hkv = query/KV heads,
//! E = num_experts, K = num_experts_per_tok, I = moe_intermediate_size, V = vocab_size.
//! Routed experts are not held here: the MoE block asks the [`ExpertCache`] for them and runs
//! them with [`crate::kernels::experts`]. Loading a checkpoint into this shape is `model::load`'s.

use crate::batch::{Batch, ForwardOutput};
use crate::config::Qwen3MoeConfig;
use crate::error::EngineError;
use crate::experts::ExpertCache;
use crate::kernels::experts::run_experts;
use crate::kernels::{math, rms_norm, softmax_in_place, WeightBuf, WeightDtype, WeightView};
use crate::kv::KvCache;
use crate::model::layers::{Attention, DenseMlp, Linear, Rope};

/// `Qwen3MoeSparseMoeBlock`: the router is here; the experts are in the cache.
#[derive(Debug, Clone)]
pub(super) struct SparseMoe {
    pub(super) gate: Linear, // router [E, H]
    pub(super) num_experts_per_tok: usize,
    pub(super) norm_topk_prob: bool,
    /// Ordinal of this layer among the sparse layers (the expert cache's layer index).
    pub(super) ordinal: usize,
}

impl SparseMoe {
    /// Routes every token: its top-k experts (descending probability, ties to the lower id) and
    /// their weights, renormalised when `norm_topk_prob`.
    fn route(&self, x: &[f32], t: usize) -> Vec<Vec<(u32, f32)>> {
        let mut logits = self.gate.forward(x, t); // T × E
        let e = self.gate.out;
        logits
            .chunks_exact_mut(e)
            .map(|probs| {
                softmax_in_place(probs);
                let mut top = math::top_k(probs, self.num_experts_per_tok);
                if self.norm_topk_prob {
                    let sum: f32 = top.iter().map(|(_, w)| w).sum();
                    top.iter_mut().for_each(|(_, w)| *w /= sum);
                }
                top
            })
            .collect()
    }

    /// The experts this layer's router would pick for `x` (T × H, normed), most wanted first: the
    /// union of the tokens' top-k, ordered by the tokens' summed router probability (ties to the
    /// lower id). A guess at this layer's needs made from an earlier layer's hidden state.
    fn predict(&self, x: &[f32], t: usize) -> Vec<u32> {
        let mut weight = vec![0.0f32; self.gate.out];
        for (e, p) in self.route(x, t).into_iter().flatten() {
            weight[e as usize] += p;
        }
        let mut wanted: Vec<u32> = (0..weight.len() as u32)
            .filter(|&e| weight[e as usize] > 0.0)
            .collect();
        wanted.sort_by(|&a, &b| {
            weight[b as usize]
                .total_cmp(&weight[a as usize])
                .then(a.cmp(&b))
        });
        wanted
    }

    /// `x`: T × H (normed) → T × H and each token's routes. Loads every needed expert at most
    /// once and runs it once over all tokens routed to it (one small batched matmul per expert);
    /// each token sums its experts' outputs in ascending expert id, as `index_add_` does in
    /// transformers.
    /// `ahead` (later layers' predicted experts) goes to the cache, whose reads start once this
    /// layer's misses are queued.
    fn forward(
        &self,
        x: &[f32],
        t: usize,
        ahead: &[(usize, Vec<u32>)],
        cache: &mut ExpertCache,
    ) -> Result<(Vec<f32>, Vec<Vec<u32>>), EngineError> {
        let routes = self.route(x, t);
        let layout = cache.layout();
        let h = layout.hidden;
        // (expert, token, k-th choice), grouped by expert in ascending id.
        let mut uses: Vec<(u32, usize, usize)> = routes
            .iter()
            .enumerate()
            .flat_map(|(tok, r)| r.iter().enumerate().map(move |(k, &(e, _))| (e, tok, k)))
            .collect();
        uses.sort_unstable();
        let mut needed: Vec<u32> = uses.iter().map(|u| u.0).collect();
        needed.dedup();
        // Each needed expert's rows: a range of `uses`.
        let mut rows_of: Vec<std::ops::Range<usize>> = Vec::with_capacity(needed.len());
        let mut start = 0;
        for (i, u) in uses.iter().enumerate() {
            if i + 1 == uses.len() || uses[i + 1].0 != u.0 {
                rows_of.push(start..i + 1);
                start = i + 1;
            }
        }
        // outputs[use] = that (token, k)'s expert output row, H wide.
        let mut outputs = vec![0.0f32; uses.len() * h];
        // Each needed expert's rows of `outputs` and its input rows (m × H).
        let rows = |e: u32| {
            let range = rows_of[needed.binary_search(&e).expect("a needed expert")].clone();
            let xs: Vec<f32> = uses[range.clone()]
                .iter()
                .flat_map(|&(_, tok, _)| x[tok * h..(tok + 1) * h].iter().copied())
                .collect();
            (range, xs)
        };
        cache.with_experts(self.ordinal, &needed, ahead, |batch| {
            run_experts(layout, batch, &rows, &mut outputs)
        })?;
        // Where each (token, k) output sits.
        let mut at = vec![vec![0usize; self.num_experts_per_tok]; t];
        for (u, &(_, tok, k)) in uses.iter().enumerate() {
            at[tok][k] = u;
        }
        let mut out = vec![0.0f32; t * h];
        for (tok, r) in routes.iter().enumerate() {
            let mut order: Vec<usize> = (0..r.len()).collect();
            order.sort_by_key(|&k| r[k].0);
            let o = &mut out[tok * h..(tok + 1) * h];
            for k in order {
                let y = &outputs[at[tok][k] * h..(at[tok][k] + 1) * h];
                for (ov, &yv) in o.iter_mut().zip(y) {
                    *ov += yv * r[k].1;
                }
            }
        }
        let ids = routes
            .iter()
            .map(|r| r.iter().map(|&(e, _)| e).collect())
            .collect();
        Ok((out, ids))
    }
}

#[derive(Debug, Clone)]
pub(super) enum Mlp {
    Dense(DenseMlp),
    Sparse(SparseMoe),
}

/// `Qwen3MoeDecoderLayer`: `h = x + attn(norm(x)); out = h + mlp(norm(h))`.
#[derive(Debug, Clone)]
pub(super) struct DecoderLayer {
    pub(super) input_layernorm: Vec<f32>, // [H]
    pub(super) self_attn: Attention,
    pub(super) post_attention_layernorm: Vec<f32>, // [H]
    pub(super) mlp: Mlp,
}

/// The whole target model (dense weights; routed experts live in the expert store).
#[derive(Debug, Clone)]
pub struct Qwen3Moe {
    pub(super) cfg: Qwen3MoeConfig,
    pub(super) embed_tokens: WeightBuf, // [V, H]
    pub(super) layers: Vec<DecoderLayer>,
    pub(super) norm: Vec<f32>, // [H]
    /// Packed from `embed_tokens` when tied.
    pub(super) lm_head: Linear, // [V, H]
    pub(super) rope: Rope,
}

impl Qwen3Moe {
    /// The dtype the matrices are stored in.
    pub fn weight_dtype(&self) -> WeightDtype {
        match self.embed_tokens {
            WeightBuf::F32(_) => WeightDtype::F32,
            WeightBuf::Bf16(_) => WeightDtype::Bf16,
        }
    }

    /// Whether the matrices are kept as a GGUF file's quantized rows (the LM head's is the
    /// witness: a file quantizes all of them or none).
    pub fn keeps_quantized(&self) -> bool {
        self.lm_head.w.is_quantized()
    }

    /// The token embedding (the EAGLE-3 drafter shares it).
    pub fn embed(&self) -> WeightView<'_> {
        self.embed_tokens.view()
    }

    /// The configuration.
    pub fn config(&self) -> &Qwen3MoeConfig {
        &self.cfg
    }

    /// A KV cache shaped for this model.
    pub fn new_kv_cache(&self) -> KvCache {
        KvCache::new(
            self.cfg.num_hidden_layers,
            self.cfg.num_key_value_heads,
            self.cfg.head_dim(),
        )
    }

    /// One forward over `batch`, appending its tokens to `kv`.
    pub fn forward(
        &self,
        batch: &Batch,
        kv: &mut KvCache,
        cache: &mut ExpertCache,
    ) -> Result<ForwardOutput, EngineError> {
        let (t, h, vocab) = (
            batch.tokens.len(),
            self.cfg.hidden_size,
            self.cfg.vocab_size,
        );
        if let Some((index, &token)) = batch
            .tokens
            .iter()
            .enumerate()
            .find(|(_, &tok)| tok as usize >= vocab)
        {
            return Err(EngineError::TokenOutOfRange {
                token,
                index,
                vocab,
            });
        }
        let cached = kv.len();
        let positions = crate::batch::resolve_positions(batch.positions, cached, t)?;
        let context = self.cfg.max_position_embeddings;
        let past = positions.iter().copied().chain((cached + t).checked_sub(1));
        if let Some(position) = past.filter(|&p| p >= context).max() {
            return Err(EngineError::PastContext { position, context });
        }
        let visible = batch.mask.visible(cached, t)?;
        let before = cache.stats().clone();
        cache.begin_forward();
        // Token embeddings: T × H.
        let mut x: Vec<f32> = batch
            .tokens
            .iter()
            .flat_map(|&tok| {
                let row = self
                    .embed_tokens
                    .view()
                    .slice(tok as usize * h..(tok as usize + 1) * h);
                (0..h).map(move |c| row.get(c))
            })
            .collect();
        let mut taps = vec![Vec::new(); batch.taps.len()];
        let mut routes = Vec::with_capacity(self.layers.len());
        let mut normed = vec![0.0f32; t * h];
        let rope = self.rope.table(&positions);
        for (l, layer) in self.layers.iter().enumerate() {
            for (slot, _) in batch.taps.iter().enumerate().filter(|(_, &tap)| tap == l) {
                taps[slot] = x.clone();
            }
            // h = x + attn(input_layernorm(x))
            rms_norm(
                &x,
                &layer.input_layernorm,
                self.cfg.rms_norm_eps as f32,
                &mut normed,
            );
            let attn = layer.self_attn.forward(&normed, &rope, &visible, kv, l);
            check_finite(&attn, l, "self_attn")?;
            x.iter_mut().zip(&attn).for_each(|(a, b)| *a += b);
            // out = h + mlp(post_attention_layernorm(h))
            rms_norm(
                &x,
                &layer.post_attention_layernorm,
                self.cfg.rms_norm_eps as f32,
                &mut normed,
            );
            let mlp = match &layer.mlp {
                Mlp::Dense(m) => {
                    routes.push(None);
                    m.forward(&normed, t)
                }
                Mlp::Sparse(m) => {
                    let ahead = self.predict_ahead(l, &x, t, cache.layers_ahead());
                    let (out, ids) = m.forward(&normed, t, &ahead, cache)?;
                    routes.push(Some(ids));
                    out
                }
            };
            check_finite(&mlp, l, "mlp")?;
            x.iter_mut().zip(&mlp).for_each(|(a, b)| *a += b);
        }
        kv.commit(t);
        for (slot, &tap) in batch.taps.iter().enumerate() {
            if tap >= self.layers.len() {
                taps[slot] = x.clone();
            }
        }
        let logit_rows = batch.logits.rows(t);
        let logits = self.lm_head_rows(&x, &logit_rows);
        Ok(ForwardOutput {
            logits,
            logit_rows,
            vocab,
            routes,
            taps,
            copies: cache.stats().since(&before),
        })
    }

    /// Layer-ahead route prediction: each of the next `layers` sparse layers' routers applied to
    /// `h` (T × H, layer `l`'s residual stream after its attention) normed by that layer's own
    /// `post_attention_layernorm`, as (cache layer, experts most wanted first). Only the
    /// cache's reads use it: outputs never depend on a prediction.
    fn predict_ahead(
        &self,
        l: usize,
        h: &[f32],
        t: usize,
        layers: usize,
    ) -> Vec<(usize, Vec<u32>)> {
        if layers == 0 {
            return Vec::new();
        }
        let mut normed = vec![0.0f32; h.len()];
        self.layers[l + 1..]
            .iter()
            .filter_map(|layer| match &layer.mlp {
                Mlp::Sparse(m) => Some((layer, m)),
                Mlp::Dense(_) => None,
            })
            .take(layers)
            .map(|(layer, m)| {
                rms_norm(
                    h,
                    &layer.post_attention_layernorm,
                    self.cfg.rms_norm_eps as f32,
                    &mut normed,
                );
                (m.ordinal, m.predict(&normed, t))
            })
            .collect()
    }

    /// The tap index that returns the final residual stream (after the last layer), from which
    /// [`Qwen3Moe::logits_of`] computes a row's logits later.
    pub fn final_tap(&self) -> usize {
        self.layers.len()
    }

    /// Logits of one token from its final residual stream (a [`Qwen3Moe::final_tap`] row):
    /// bit for bit the row a forward's `logits` would hold. Verification computes only the rows
    /// it reads this way.
    pub fn logits_of(&self, residual: &[f32]) -> Vec<f32> {
        self.lm_head_rows(residual, &[0])
    }

    /// Final norm then the LM head, for the chosen rows of the residual stream `x` (T × H).
    fn lm_head_rows(&self, x: &[f32], rows: &[usize]) -> Vec<f32> {
        let h = self.cfg.hidden_size;
        let picked: Vec<f32> = rows
            .iter()
            .flat_map(|&r| x[r * h..(r + 1) * h].iter().copied())
            .collect();
        let mut normed = vec![0.0; picked.len()];
        rms_norm(
            &picked,
            &self.norm,
            self.cfg.rms_norm_eps as f32,
            &mut normed,
        );
        self.lm_head.forward(&normed, rows.len())
    }
}

/// Stops a forward whose block `block` of decoder layer `layer` put out a NaN or an infinity
/// (a corrupt or overflowing weight): decoding on would give wrong tokens silently. One pass over
/// T × H floats per block, next to the block's own T × H × (≥ H) multiply-adds.
fn check_finite(values: &[f32], layer: usize, block: &'static str) -> Result<(), EngineError> {
    if values.iter().all(|v| v.is_finite()) {
        Ok(())
    } else {
        Err(EngineError::NonFinite { layer, block })
    }
}
