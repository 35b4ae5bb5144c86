//! The tensors of a `qwen3moe` GGUF under the Hugging Face names the loader asks for:
//! `blk.3.attn_q.weight` is `model.layers.3.self_attn.q_proj.weight`, and the expert stack
//! `blk.3.ffn_gate_exps.weight` (`[H, I, E]` in ggml order) is the `E` tensors
//! `model.layers.3.mlp.experts.{e}.gate_proj.weight` (`[I, H]`), each one contiguous byte range
//! of the file. Shapes are given in PyTorch order (ggml's reversed). Tensors with no Hugging
//! Face name keep their GGUF name, so the loader reports them as extra.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use specfit_gguf::{GgmlType, GgufFile, TensorInfo};

use crate::error::EngineError;

/// One Hugging Face tensor: a GGUF tensor, or one expert of a GGUF expert stack.
#[derive(Debug, Clone)]
struct Entry {
    /// Index into the GGUF tensor directory.
    tensor: usize,
    expert: Option<usize>,
    /// PyTorch-order shape.
    shape: Vec<usize>,
}

/// A GGUF file's tensors by Hugging Face name.
pub struct GgufTensors {
    file: Arc<GgufFile>,
    entries: BTreeMap<String, Entry>,
}

/// GGUF name → Hugging Face name of the tensors outside the blocks.
const TOP: [(&str, &str); 3] = [
    ("token_embd.weight", "model.embed_tokens.weight"),
    ("output_norm.weight", "model.norm.weight"),
    ("output.weight", "lm_head.weight"),
];

/// Per-block GGUF suffix → Hugging Face suffix (after `model.layers.{i}.`).
const BLOCK: [(&str, &str); 19] = [
    ("attn_norm.weight", "input_layernorm.weight"),
    ("attn_q.weight", "self_attn.q_proj.weight"),
    ("attn_k.weight", "self_attn.k_proj.weight"),
    ("attn_v.weight", "self_attn.v_proj.weight"),
    ("attn_output.weight", "self_attn.o_proj.weight"),
    ("attn_q.bias", "self_attn.q_proj.bias"),
    ("attn_k.bias", "self_attn.k_proj.bias"),
    ("attn_v.bias", "self_attn.v_proj.bias"),
    ("attn_output.bias", "self_attn.o_proj.bias"),
    ("attn_q_norm.weight", "self_attn.q_norm.weight"),
    ("attn_k_norm.weight", "self_attn.k_norm.weight"),
    ("ffn_norm.weight", "post_attention_layernorm.weight"),
    ("ffn_gate_inp.weight", "mlp.gate.weight"),
    ("ffn_gate.weight", "mlp.gate_proj.weight"),
    ("ffn_up.weight", "mlp.up_proj.weight"),
    ("ffn_down.weight", "mlp.down_proj.weight"),
    ("ffn_gate_exps.weight", "mlp.experts.{e}.gate_proj.weight"),
    ("ffn_up_exps.weight", "mlp.experts.{e}.up_proj.weight"),
    ("ffn_down_exps.weight", "mlp.experts.{e}.down_proj.weight"),
];

/// `name` looked up in [`TOP`] and [`BLOCK`] read as `(from, to)` pairs by `pair`: a top-level
/// name directly, a per-layer one (`{from_layer}N.suffix`) by its suffix.
fn translate(
    name: &str,
    from_layer: &str,
    to_layer: &str,
    pair: fn(&(&'static str, &'static str)) -> (&'static str, &'static str),
) -> Option<String> {
    if let Some((_, to)) = TOP.iter().map(pair).find(|(from, _)| *from == name) {
        return Some(to.to_string());
    }
    let rest = name.strip_prefix(from_layer)?;
    let (layer, suffix) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let to = BLOCK.iter().map(pair).find(|(from, _)| *from == suffix)?.1;
    Some(format!("{to_layer}{layer}.{to}"))
}

/// The Hugging Face name of GGUF tensor `name` (`{e}` marks a per-expert name), if it has one.
fn hf_name(name: &str) -> Option<String> {
    translate(name, "blk.", "model.layers.", |&(gguf, hf)| (gguf, hf))
}

/// The GGUF name of the Hugging Face tensor `name`, if it is one GGUF stores on its own (the
/// per-expert tensors are parts of stacks, so they have none).
pub fn gguf_name(name: &str) -> Option<String> {
    translate(name, "model.layers.", "blk.", |&(gguf, hf)| (hf, gguf))
}

impl GgufTensors {
    /// Names every tensor of `file`.
    pub fn new(file: Arc<GgufFile>) -> GgufTensors {
        let mut entries = BTreeMap::new();
        for (index, t) in file.header().tensors.iter().enumerate() {
            let torch: Vec<usize> = t.dims.iter().rev().map(|&d| d as usize).collect();
            match hf_name(&t.name) {
                Some(name) if name.contains("{e}") && torch.len() == 3 => {
                    for e in 0..torch[0] {
                        entries.insert(
                            name.replace("{e}", &e.to_string()),
                            Entry {
                                tensor: index,
                                expert: Some(e),
                                shape: torch[1..].to_vec(),
                            },
                        );
                    }
                }
                Some(name) if !name.contains("{e}") => {
                    // Vectors are 1-D in both; matrices drop ggml's trailing 1s.
                    entries.insert(
                        name,
                        Entry {
                            tensor: index,
                            expert: None,
                            shape: squeeze(torch),
                        },
                    );
                }
                _ => {
                    entries.insert(
                        t.name.clone(),
                        Entry {
                            tensor: index,
                            expert: None,
                            shape: torch,
                        },
                    );
                }
            }
        }
        GgufTensors { file, entries }
    }

    pub fn path(&self) -> &Path {
        self.file.path()
    }

    /// The file.
    pub fn file(&self) -> &Arc<GgufFile> {
        &self.file
    }

    /// Every Hugging Face name, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries.keys().map(String::as_str)
    }

    pub fn contains(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }

    /// The PyTorch-order shape of `name`.
    pub fn shape(&self, name: &str) -> Option<&[usize]> {
        self.entries.get(name).map(|e| e.shape.as_slice())
    }

    /// The ggml type `name` is stored in.
    pub fn ggml_type(&self, name: &str) -> Option<GgmlType> {
        self.entries
            .get(name)
            .map(|e| self.file.header().tensors[e.tensor].ty)
    }

    /// `name`'s GGUF tensor and, for an expert, the byte range of its part inside it.
    pub fn location(&self, name: &str) -> Option<(&TensorInfo, std::ops::Range<u64>)> {
        let e = self.entries.get(name)?;
        let info = &self.file.header().tensors[e.tensor];
        let range = match e.expert {
            None => 0..info.size,
            Some(x) => {
                let per = info.size / info.dims[2];
                x as u64 * per..(x as u64 + 1) * per
            }
        };
        Some((info, range))
    }

    /// The GGUF stack (`[H or I, I or H, experts]`) holding MoE layer `layer`'s experts'
    /// `proj` matrices (`"gate"`, `"up"` or `"down"`): one contiguous range per expert.
    pub fn expert_stack(&self, layer: usize, proj: &str) -> Option<&TensorInfo> {
        self.location(&format!(
            "model.layers.{layer}.mlp.experts.0.{proj}_proj.weight"
        ))
        .map(|(info, _)| info)
    }

    /// `name` decoded to `f32`, row-major in its PyTorch shape.
    pub fn values(&self, name: &str) -> Result<Vec<f32>, EngineError> {
        let (info, range) = self
            .location(name)
            .ok_or_else(|| EngineError::MissingTensor {
                name: name.to_string(),
                searched: self.file.path().display().to_string(),
            })?;
        let bytes = &self.file.bytes(info)[range.start as usize..range.end as usize];
        let elements: usize = self.entries[name].shape.iter().product();
        let mut out = vec![0.0f32; elements];
        specfit_gguf::dequant::dequantize(info.ty, bytes, &mut out).map_err(|ty| {
            EngineError::Gguf {
                path: self.file.path().to_path_buf(),
                error: specfit_gguf::GgufError::UnsupportedType {
                    name: info.name.clone(),
                    ty: ty.name(),
                    supported: specfit_gguf::dequant::SUPPORTED,
                },
            }
        })?;
        Ok(out)
    }
}

/// ggml pads shapes with 1s up to its rank; a PyTorch matrix has none leading.
fn squeeze(mut shape: Vec<usize>) -> Vec<usize> {
    while shape.len() > 1 && shape[0] == 1 {
        shape.remove(0);
    }
    shape
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama_cpp_names_map_to_hugging_face_names() {
        assert_eq!(
            hf_name("blk.12.attn_output.weight").unwrap(),
            "model.layers.12.self_attn.o_proj.weight"
        );
        assert_eq!(
            hf_name("blk.0.ffn_down_exps.weight").unwrap(),
            "model.layers.0.mlp.experts.{e}.down_proj.weight"
        );
        assert_eq!(
            hf_name("token_embd.weight").unwrap(),
            "model.embed_tokens.weight"
        );
        assert_eq!(hf_name("blk.x.attn_q.weight"), None);
        assert_eq!(hf_name("rope_freqs.weight"), None);
    }

    #[test]
    fn every_tensor_gguf_stores_on_its_own_maps_back_to_its_gguf_name() {
        let names = TOP.iter().map(|(g, _)| g.to_string()).chain(
            BLOCK
                .iter()
                .filter(|(_, hf)| !hf.contains("{e}"))
                .map(|(g, _)| format!("blk.7.{g}")),
        );
        for g in names {
            let hf = hf_name(&g).unwrap();
            assert_eq!(gguf_name(&hf).as_deref(), Some(g.as_str()), "{hf}");
        }
        assert_eq!(
            gguf_name("model.layers.0.mlp.experts.3.up_proj.weight"),
            None
        );
    }
}
