//! A llama.cpp GGUF file as a Qwen3-MoE checkpoint: the `qwen3moe` metadata as a
//! [`crate::Qwen3MoeConfig`], its tensors under Hugging Face names (expert stacks split per
//! expert, decoded to `f32`), its byte-level BPE tokenizer, and its experts streamed from the file
//! itself. The file format is `specfit_gguf`'s; the model is `crate::model`'s.

mod config;
mod names;
mod sidecar;
mod store;
mod tokenizer;

pub use config::config_of;
pub use names::{gguf_name, GgufTensors};
pub use sidecar::{sidecar_path, Made};
pub use store::{ensure_checksums, GgufStore};
pub use tokenizer::{metadata_of, tokenizer_json};

use std::path::Path;

/// Opens the GGUF file at `path` (header and tensor index), errors naming the file.
pub fn open(path: &Path) -> Result<specfit_gguf::GgufFile, crate::EngineError> {
    specfit_gguf::GgufFile::open(path).map_err(|error| crate::EngineError::Gguf {
        path: path.to_path_buf(),
        error,
    })
}

/// Refuses a model path that is a file but not a GGUF file (a checkpoint is a directory), saying
/// what the file starts with, instead of looking for `config.json` inside a file.
pub fn check_model_path(path: &Path) -> Result<(), crate::EngineError> {
    use std::io::Read;
    if !path.is_file() || is_gguf(path) {
        return Ok(());
    }
    let mut head = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(4).read_to_end(&mut head))
        .map_err(crate::EngineError::io(path))?;
    Err(crate::EngineError::NotAModel {
        path: path.to_path_buf(),
        head,
    })
}

/// Whether `path` names a GGUF file (by its first four bytes), not a checkpoint directory.
pub fn is_gguf(path: &Path) -> bool {
    use std::io::Read;
    if !path.is_file() {
        return false;
    }
    let mut magic = [0u8; 4];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok()
        && magic == specfit_gguf::MAGIC
}
