//! `Qwen3MoeForCausalLM`, top to bottom as in HF `modeling_qwen3_moe.py`: RoPE → linear → attention
//! (per-head q/k RMSNorm before RoPE, GQA) → dense MLP → sparse MoE block (f32 softmax router,
//! top-k, optional renormalisation, SwiGLU experts run from the expert cache) → decoder layer →
//! model → LM head. Every matmul, norm and softmax runs through the batch-invariant kernels, so a
//! token's results do not depend on the other tokens of its forward.
//!
//! Legend: T = tokens in the forward, H = hidden_size, D = head_dim, Hq/Hkv = query/KV heads,
//! E = num_experts, K = num_experts_per_tok, I = moe_intermediate_size, V = vocab_size.
//! Routed experts are not held here: the MoE block asks the [`ExpertCache`] for them.

use std::path::Path;

use crate::batch::{Batch, ForwardOutput, Logits};
use crate::config::Qwen3MoeConfig;
use crate::error::EngineError;
use crate::experts::disk::expert_block_bytes;
use crate::experts::{
    ExpertCache, ExpertLayout, ExpertMatrices, ExpertStore, Fingerprint, RamStore,
};
use crate::kernels::quant::{QuantActs, QuantView};
use crate::kernels::silu;
use crate::kernels::{
    math, rms_norm, softmax_in_place, Isa, PackedView, WeightBuf, WeightDtype, WeightView,
};
use crate::kv::KvCache;
use crate::model::layers::{swiglu, Attention, AttentionShape, DenseMlp, Linear, Rope};
use crate::weights::Checkpoint;

/// One SwiGLU expert applied to `m` rows `xs` (m × H), from its matrices (a slot's packed
/// `gate | up` and `down`, or GGUF rows): `down(silu(gate(x)) · up(x))`, m × H. With `parallel`,
/// each matmul is split by output across the worker pool (when large enough), for an expert
/// that runs alone.
fn run_expert(
    layout: ExpertLayout,
    matrices: ExpertMatrices<'_>,
    xs: &[f32],
    m: usize,
    parallel: bool,
) -> Vec<f32> {
    let (h, i) = (layout.hidden, layout.intermediate);
    let mut y = vec![0.0; m * h];
    match matrices {
        ExpertMatrices::Float { gate_up, down } => {
            let gemm = |w: PackedView<'_>, x: &[f32], out: &mut [f32]| {
                if parallel {
                    w.gemm(x, m, out)
                } else {
                    w.gemm_serial(x, m, out)
                }
            };
            let mut gu = vec![0.0; m * 2 * i];
            gemm(gate_up, xs, &mut gu); // m × 2I
            let a = swiglu(&gu, i); // m × I
            gemm(down, &a, &mut y); // m × H
        }
        ExpertMatrices::Quant { gate, up, down } => {
            let isa = Isa::detected();
            let gemm = |w: QuantView<'_>, x: &QuantActs, out: &mut [f32]| {
                w.gemm_quantized(isa, x, out, parallel)
            };
            // gate and up share their input: quantized once when their types agree.
            let xg = QuantActs::quantize(gate.ty(), xs, m, h);
            let xu = (up.ty() != gate.ty()).then(|| QuantActs::quantize(up.ty(), xs, m, h));
            let (mut g, mut u) = (vec![0.0; m * i], vec![0.0; m * i]);
            gemm(gate, &xg, &mut g); // m × I
            gemm(up, xu.as_ref().unwrap_or(&xg), &mut u); // m × I
            let a: Vec<f32> = g.iter().zip(&u).map(|(&g, &u)| silu(g) * u).collect(); // m × I
            gemm(down, &QuantActs::quantize(down.ty(), &a, m, i), &mut y); // m × H
        }
    }
    y
}

/// Asks the processor to start loading `bytes` into the caches (a hint; no effect on results).
fn prefetch(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    for line in bytes.chunks(64) {
        // SAFETY: prefetching is a hint on a valid address and never faults.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(
                line.as_ptr() as *const i8
            )
        };
    }
}

/// `Qwen3MoeSparseMoeBlock`: the router is here; the experts are in the cache.
#[derive(Debug, Clone)]
struct SparseMoe {
    gate: Linear, // router [E, H]
    top_k: usize,
    norm_topk_prob: bool,
    /// Ordinal of this layer among the sparse layers (the expert cache's layer index).
    ordinal: usize,
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
                let mut top = math::top_k(probs, self.top_k);
                if self.norm_topk_prob {
                    let sum: f32 = top.iter().map(|(_, w)| w).sum();
                    top.iter_mut().for_each(|(_, w)| *w /= sum);
                }
                top
            })
            .collect()
    }

    /// `x`: T × H (normed) → T × H and each token's routes. Loads every needed expert at most
    /// once and runs it once over all tokens routed to it (one small batched matmul per expert);
    /// each token sums its experts' outputs in ascending expert id, as `index_add_` does in
    /// transformers.
    fn forward(
        &self,
        x: &[f32],
        t: usize,
        experts: &mut ExpertCache,
    ) -> Result<(Vec<f32>, Vec<Vec<u32>>), EngineError> {
        let routes = self.route(x, t);
        let layout = experts.layout();
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
        let out_ptr = crate::threads::SharedOut(outputs.as_mut_ptr());
        let compute = |e: u32, matrices: ExpertMatrices<'_>, parallel: bool| {
            let at = needed.binary_search(&e).expect("a needed expert");
            let range = rows_of[at].clone();
            let xs: Vec<f32> = uses[range.clone()]
                .iter()
                .flat_map(|&(_, tok, _)| x[tok * h..(tok + 1) * h].iter().copied())
                .collect();
            let y = run_expert(layout, matrices, &xs, range.len(), parallel);
            // SAFETY: each expert writes only its own rows `range` of `outputs`.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    y.as_ptr(),
                    out_ptr.get().add(range.start * h),
                    y.len(),
                )
            };
        };
        experts.with_experts(self.ordinal, &needed, |batch| {
            // Several experts: spread over the threads (one hand-off per batch). One expert (a
            // read that just finished): its matmuls are split by output panel instead. Each
            // output is computed by one thread in one fixed order either way.
            let pool = crate::threads::pool();
            let parts = pool.threads();
            if batch.len() > 1 && parts > 1 {
                pool.run(&|part| {
                    let mine: Vec<&(u32, ExpertMatrices<'_>)> =
                        batch.iter().skip(part).step_by(parts).collect();
                    for (i, &&(e, matrices)) in mine.iter().enumerate() {
                        if let Some(next) = mine.get(i + 1) {
                            next.1.bytes().into_iter().for_each(prefetch);
                        }
                        compute(e, matrices, false);
                    }
                });
            } else {
                for &(e, matrices) in batch {
                    compute(e, matrices, true);
                }
            }
        })?;
        // Where each (token, k) output sits.
        let mut at = vec![vec![0usize; self.top_k]; t];
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
enum Mlp {
    Dense(DenseMlp),
    Sparse(SparseMoe),
}

/// `Qwen3MoeDecoderLayer`: `h = x + attn(norm(x)); out = h + mlp(norm(h))`.
#[derive(Debug, Clone)]
struct DecoderLayer {
    input_layernorm: Vec<f32>, // [H]
    self_attn: Attention,
    post_attention_layernorm: Vec<f32>, // [H]
    mlp: Mlp,
}

/// The whole target model (dense weights; routed experts live in the expert store).
#[derive(Debug, Clone)]
pub struct Qwen3Moe {
    cfg: Qwen3MoeConfig,
    embed_tokens: WeightBuf, // [V, H]
    layers: Vec<DecoderLayer>,
    norm: Vec<f32>, // [H]
    /// Packed from `embed_tokens` when tied.
    lm_head: Linear, // [V, H]
    rope: Rope,
}

impl Qwen3Moe {
    /// Loads a checkpoint directory: the dense weights into the model, every routed expert into
    /// a host-RAM store (returned for the caller to wrap in an [`ExpertCache`]).
    /// Matrices keep the checkpoint's dtype unless `dtype` says otherwise.
    pub fn load(
        dir: &Path,
        dtype: Option<WeightDtype>,
    ) -> Result<(Qwen3Moe, RamStore), EngineError> {
        let (model, store, _) = Qwen3Moe::load_inner(dir, true, dtype)?;
        Ok((model, store.expect("experts loaded")))
    }

    /// Loads only the dense weights (routed experts are validated but left on disk) and
    /// returns the experts' fingerprint, to open a [`crate::experts::DiskStore`] with.
    pub fn load_dense(
        dir: &Path,
        dtype: Option<WeightDtype>,
    ) -> Result<(Qwen3Moe, Fingerprint), EngineError> {
        let (model, _, fingerprint) = Qwen3Moe::load_inner(dir, false, dtype)?;
        Ok((model, fingerprint))
    }

    /// Loads the dense weights of a GGUF file and opens the same file as the store its experts
    /// come from ([`crate::gguf::GgufStore`]): used in place from the mapped file when `in_place`
    /// and they stay quantized, else streamed into slots.
    pub fn load_gguf(
        path: &Path,
        dtype: Option<WeightDtype>,
        in_place: bool,
    ) -> Result<(Qwen3Moe, crate::gguf::GgufStore), EngineError> {
        let mut store = None;
        let (model, _, _) = Qwen3Moe::load_inner_with(path, false, dtype, |ck, cfg, layout| {
            let tensors = ck.gguf().expect("a GGUF checkpoint");
            let layers = cfg.moe_layers();
            store = Some(if in_place && layout.quant_bytes.is_some() {
                crate::gguf::GgufStore::open_mapped(tensors, &layers, layout)?
            } else {
                crate::gguf::GgufStore::open(tensors, &layers, layout)?
            });
            Ok(())
        })?;
        Ok((model, store.expect("opened")))
    }

    fn load_inner(
        dir: &Path,
        with_experts: bool,
        dtype: Option<WeightDtype>,
    ) -> Result<(Qwen3Moe, Option<RamStore>, Fingerprint), EngineError> {
        Qwen3Moe::load_inner_with(dir, with_experts, dtype, |_, _, _| Ok(()))
    }

    /// [`Qwen3Moe::load_inner`], calling `opened` with the checkpoint, config and expert layout
    /// before any tensor is taken.
    fn load_inner_with(
        dir: &Path,
        with_experts: bool,
        dtype: Option<WeightDtype>,
        opened: impl FnOnce(&Checkpoint, &Qwen3MoeConfig, ExpertLayout) -> Result<(), EngineError>,
    ) -> Result<(Qwen3Moe, Option<RamStore>, Fingerprint), EngineError> {
        let cfg = Qwen3MoeConfig::load(dir)?;
        let mut ck = Checkpoint::open(dir)?;
        if let Some(d) = dtype {
            ck.set_storage(d);
        }
        let fingerprint = Fingerprint::of_checkpoint(&ck, &cfg)?;
        let (h, v) = (cfg.hidden_size, cfg.vocab_size);
        let layout = ExpertLayout {
            hidden: h,
            intermediate: cfg.moe_intermediate_size,
            dtype: ck.storage(),
            quant_bytes: None,
        };
        let layout = ExpertLayout {
            quant_bytes: quant_expert_bytes(&ck, &cfg, &layout),
            ..layout
        };
        opened(&ck, &cfg, layout)?;
        let moe_layers = cfg.moe_layers();
        let mut store =
            with_experts.then(|| RamStore::new(layout, moe_layers.len(), cfg.num_experts));
        let embed_tokens = ck.take_weight("model.embed_tokens.weight", &[v, h])?;
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for i in 0..cfg.num_hidden_layers {
            let p = format!("model.layers.{i}");
            let mlp = match moe_layers.iter().position(|&l| l == i) {
                Some(ordinal) => {
                    load_experts(&mut ck, i, &cfg, ordinal, store.as_mut())?;
                    Mlp::Sparse(SparseMoe {
                        gate: Linear::load(
                            &mut ck,
                            &format!("{p}.mlp.gate"),
                            cfg.num_experts,
                            h,
                            false,
                        )?,
                        top_k: cfg.num_experts_per_tok,
                        norm_topk_prob: cfg.norm_topk_prob,
                        ordinal,
                    })
                }
                None => {
                    let im = cfg.intermediate_size;
                    Mlp::Dense(DenseMlp::load(&mut ck, &format!("{p}.mlp"), h, im)?)
                }
            };
            layers.push(DecoderLayer {
                input_layernorm: ck.take(&format!("{p}.input_layernorm.weight"), &[h])?,
                self_attn: Attention::load(
                    &mut ck,
                    &format!("{p}.self_attn"),
                    &attention_shape(&cfg),
                )?,
                post_attention_layernorm: ck
                    .take(&format!("{p}.post_attention_layernorm.weight"), &[h])?,
                mlp,
            });
        }
        let norm = ck.take("model.norm.weight", &[h])?;
        let lm_head = if cfg.tie_word_embeddings && !ck.contains("lm_head.weight") {
            match ck.peek_quantized("model.embed_tokens.weight", &[v, h])? {
                Some((ty, bytes)) => Linear::from_gguf(ty, bytes, v, h).expect("integer form"),
                None => Linear::from_weights(embed_tokens.view(), v, h),
            }
        } else {
            Linear::load(&mut ck, "lm_head", v, h, false)?
        };
        ck.finish()?;
        let rope = Rope::new(cfg.rope_theta(), cfg.head_dim());
        Ok((
            Qwen3Moe {
                cfg,
                embed_tokens,
                layers,
                norm,
                lm_head,
                rope,
            },
            store,
            fingerprint,
        ))
    }

    /// The dtype the matrices are stored in.
    pub fn weight_dtype(&self) -> WeightDtype {
        match self.embed_tokens {
            WeightBuf::F32(_) => WeightDtype::F32,
            WeightBuf::Bf16(_) => WeightDtype::Bf16,
        }
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
        experts: &mut ExpertCache,
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
        let visible = batch.mask.visible(cached, t)?;
        let before = experts.stats().clone();
        experts.begin_forward();
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
                    let (out, ids) = m.forward(&normed, t, experts)?;
                    routes.push(Some(ids));
                    out
                }
            };
            x.iter_mut().zip(&mlp).for_each(|(a, b)| *a += b);
        }
        kv.commit(t);
        for (slot, &tap) in batch.taps.iter().enumerate() {
            if tap >= self.layers.len() {
                taps[slot] = x.clone();
            }
        }
        let logit_rows: Vec<usize> = match batch.logits {
            Logits::All => (0..t).collect(),
            Logits::Last => (t.saturating_sub(1)..t).collect(),
            Logits::Rows(r) => r.iter().copied().filter(|&i| i < t).collect(),
            Logits::None => Vec::new(),
        };
        let logits = self.lm_head_rows(&x, &logit_rows);
        Ok(ForwardOutput {
            logits,
            logit_rows,
            vocab,
            routes,
            taps,
            copies: experts.stats().since(&before),
        })
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

/// The attention shape of a Qwen3-MoE layer: QK-norm, input and output of width H.
fn attention_shape(cfg: &Qwen3MoeConfig) -> AttentionShape {
    AttentionShape {
        input: cfg.hidden_size,
        output: cfg.hidden_size,
        heads: cfg.num_attention_heads,
        kv_heads: cfg.num_key_value_heads,
        head_dim: cfg.head_dim(),
        qk_norm: true,
        bias: cfg.attention_bias,
        eps: cfg.rms_norm_eps as f32,
    }
}

/// The block size of a GGUF's experts kept quantized (the largest layer's), when the checkpoint
/// is a GGUF whose expert stacks all have an integer form and no storage dtype was forced.
fn quant_expert_bytes(
    ck: &Checkpoint,
    cfg: &Qwen3MoeConfig,
    layout: &ExpertLayout,
) -> Option<usize> {
    if !ck.keeps_quantized() {
        return None;
    }
    let g = ck.gguf()?;
    let mut most = 0;
    for layer in cfg.moe_layers() {
        let ty = |proj: &str| g.expert_stack(layer, proj).map(|info| info.ty);
        let types = [ty("gate")?, ty("up")?, ty("down")?];
        most = most.max(layout.quant_block_len(types)?);
    }
    Some(most)
}

/// Writes the quantized block of one expert of a GGUF checkpoint into `out` (`layout.bytes()`).
fn write_quant_expert_block(
    ck: &Checkpoint,
    layout: &ExpertLayout,
    (layer, e): (usize, usize),
    out: &mut [u8],
) -> Result<(), EngineError> {
    let (h, i) = (layout.hidden, layout.intermediate);
    let q = format!("model.layers.{layer}.mlp.experts.{e}");
    let part =
        |proj: &str, shape: [usize; 2]| -> Result<(specfit_gguf::GgmlType, &[u8]), EngineError> {
            Ok(ck
                .peek_quantized(&format!("{q}.{proj}_proj.weight"), &shape)?
                .expect("checked when the layout was made"))
        };
    let (gate, up, down) = (
        part("gate", [i, h])?,
        part("up", [i, h])?,
        part("down", [h, i])?,
    );
    layout.write_quant_block([gate, up, down], out);
    Ok(())
}

/// Copies layer `layer`'s experts from the checkpoint into the store (block = gate | up | down,
/// in the storage dtype), or, without a store, only checks their shapes.
fn load_experts(
    ck: &mut Checkpoint,
    layer: usize,
    cfg: &Qwen3MoeConfig,
    ordinal: usize,
    mut store: Option<&mut RamStore>,
) -> Result<(), EngineError> {
    let (h, i) = (cfg.hidden_size, cfg.moe_intermediate_size);
    for e in 0..cfg.num_experts {
        if let Some(store) = store.as_deref_mut() {
            let layout = store.layout();
            let block = store.block_mut(ordinal, e);
            if layout.quant_bytes.is_some() {
                write_quant_expert_block(ck, &layout, (layer, e), block)?;
            } else {
                block.copy_from_slice(&expert_block_bytes(ck, cfg, layer, e, ck.storage())?);
            }
        }
        let q = format!("model.layers.{layer}.mlp.experts.{e}");
        ck.skip(&format!("{q}.gate_proj.weight"), &[i, h])?;
        ck.skip(&format!("{q}.up_proj.weight"), &[i, h])?;
        ck.skip(&format!("{q}.down_proj.weight"), &[h, i])?;
    }
    Ok(())
}
