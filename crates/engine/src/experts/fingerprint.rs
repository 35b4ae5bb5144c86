//! What ties a disk expert file to the checkpoint it was converted from: a sample of the content
//! (an FNV-1a hash of the shape and of two expert blocks, the first expert of the first sparse
//! layer and the last of the last, taken as f32 so that it does not depend on the storage dtype)
//! and every checkpoint file's name, length and modification time. A checkpoint rewritten in
//! place (fine-tuned, re-downloaded, re-quantized) has new times, so its old expert file is
//! stale even when the sampled blocks agree; a checkpoint moved or copied with its times kept
//! (`mv`, `cp -p`, `rsync -a`) is the same checkpoint. It compares; the disk file stores it.

use std::path::Path;
use std::time::UNIX_EPOCH;

use serde::{Deserialize, Serialize};

use crate::config::Qwen3MoeConfig;
use crate::error::EngineError;
use crate::experts::disk::expert_block_bytes;
use crate::kernels::WeightDtype;
use crate::weights::Checkpoint;

/// One checkpoint file as it was: its name in the checkpoint, length and modification time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceFile {
    pub name: String,
    pub bytes: u64,
    /// Nanoseconds since the Unix epoch.
    pub modified_ns: u64,
}

impl SourceFile {
    /// The file at `path` as it is now.
    pub(crate) fn of(path: &Path) -> Result<SourceFile, EngineError> {
        let meta = std::fs::metadata(path).map_err(EngineError::io(path))?;
        let modified_ns = meta
            .modified()
            .ok()
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos() as u64);
        Ok(SourceFile {
            name: path
                .file_name()
                .map_or_else(String::new, |n| n.to_string_lossy().into_owned()),
            bytes: meta.len(),
            modified_ns,
        })
    }
}

impl std::fmt::Display for SourceFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let secs = self.modified_ns / 1_000_000_000;
        let nanos = self.modified_ns % 1_000_000_000;
        write!(
            f,
            "{} ({} bytes, modified {secs}.{nanos:09} s after 1970)",
            self.name, self.bytes
        )
    }
}

/// Identifies the checkpoint a disk expert file was made from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fingerprint {
    /// FNV-1a of the shape and two expert blocks.
    pub sample: u64,
    /// Every file of the checkpoint, in the checkpoint's order.
    pub sources: Vec<SourceFile>,
}

impl Fingerprint {
    /// The fingerprint of a checkpoint (reads two expert blocks and each file's metadata).
    pub fn of_checkpoint(
        ck: &Checkpoint,
        cfg: &Qwen3MoeConfig,
    ) -> Result<Fingerprint, EngineError> {
        let layers = cfg.moe_layers();
        let mut h = Fnv::new();
        for v in [
            layers.len(),
            cfg.num_experts,
            cfg.hidden_size,
            cfg.moe_intermediate_size,
        ] {
            h.write(&(v as u64).to_le_bytes());
        }
        if let (Some(&first), Some(&last)) = (layers.first(), layers.last()) {
            for (layer, expert) in [(first, 0), (last, cfg.num_experts - 1)] {
                let block = expert_block_bytes(ck, cfg, layer, expert, WeightDtype::F32)?;
                h.write(&block);
            }
        }
        let sources = ck
            .files()
            .into_iter()
            .map(SourceFile::of)
            .collect::<Result<_, _>>()?;
        Ok(Fingerprint {
            sample: h.0,
            sources,
        })
    }

    /// Why an expert file made from the checkpoint as `self` describes it does not serve the
    /// checkpoint as `now` describes it (None: it does).
    pub fn differs(&self, now: &Fingerprint) -> Option<String> {
        if self.sample != now.sample {
            return Some(format!(
                "its sampled expert blocks (hash {:016x}) are not this checkpoint's ({:016x}): it was made from another checkpoint",
                self.sample, now.sample
            ));
        }
        if self.sources == now.sources {
            return None;
        }
        let then = self.sources.iter().find(|s| !now.sources.contains(s));
        let here = now.sources.iter().find(|s| !self.sources.contains(s));
        Some(match (then, here) {
            (Some(then), Some(here)) if then.name == here.name => format!(
                "it was made from {then}, but that file is now {here}: the checkpoint changed since"
            ),
            _ => format!(
                "it was made from the files [{}], but the checkpoint is now [{}]: the checkpoint changed since",
                list(&self.sources),
                list(&now.sources)
            ),
        })
    }
}

fn list(files: &[SourceFile]) -> String {
    files
        .iter()
        .map(SourceFile::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

struct Fnv(u64);

impl Fnv {
    fn new() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ b as u64).wrapping_mul(0x0100_0000_01b3);
        }
    }
}
