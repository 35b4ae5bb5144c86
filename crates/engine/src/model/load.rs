//! Loading `Qwen3MoeForCausalLM` checkpoints (HF safetensors directories or GGUF files) into
//! [`Qwen3Moe`]: the dense weights by their HF names, and the routed experts into a host-RAM
//! store, left on disk for the disk tier (shapes checked), or opened in the GGUF file itself.
//! It computes nothing.

use std::path::Path;

use crate::config::Qwen3MoeConfig;
use crate::error::EngineError;
use crate::experts::disk::expert_block_bytes;
use crate::experts::{ExpertLayout, ExpertStore, Fingerprint, RamStore};
use crate::kernels::WeightDtype;
use crate::model::layers::{Attention, AttentionShape, DenseMlp, Linear, Rope};
use crate::model::qwen3_moe::{DecoderLayer, Mlp, Qwen3Moe, SparseMoe};
use crate::weights::Checkpoint;

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
                        gate: Linear::load(&mut ck, &format!("{p}.mlp.gate"), cfg.num_experts, h)?,
                        num_experts_per_tok: cfg.num_experts_per_tok,
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
            Linear::load(&mut ck, "lm_head", v, h)?
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
    layer: usize,
    e: usize,
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
                write_quant_expert_block(ck, &layout, layer, e, block)?;
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
