//! The disk tier: an expert-major file written once by [`convert`] (`specfit convert`) and read
//! with O_DIRECT, one `pread` per missing expert straight into a 4 KiB-aligned slot — never
//! through mmap page faults (59–89 MiB/s for random 128 KiB faults on this kind of machine,
//! against ~1 GB/s for direct reads).
//!
//! Layout: `b"SPFTEXP\0"`, `u32` version (4), `u32` header length, a JSON header (shape, dtype,
//! strides, the [`Fingerprint`] of the source checkpoint, where the checksums are), zero padding to
//! `data_offset` (4 KiB-aligned), then one block per (MoE layer, expert) in that order, each an
//! [`ExpertLayout`] block (`gate | up` and `down` in K-major panels; version 1 stored them
//! row-major) as little-endian f32 or bf16 padded to `stride_bytes` (a multiple of 4 KiB), then
//! (version 3) the CRC32C of every block's `block_bytes`, `u32` little-endian, in block order.
//! Every read is checked against its checksum, so a corrupt block is an error naming the layer and
//! expert, never a silently wrong expert. This module owns the format; the slot cache decides what
//! to read.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::config::Qwen3MoeConfig;
use crate::error::EngineError;
use crate::experts::aligned::{padded, ALIGN};
use crate::experts::store::{ExpertLayout, ExpertStore};
use crate::kernels::WeightDtype;
use crate::weights::Checkpoint;

use super::fingerprint::Fingerprint;

const MAGIC: &[u8; 8] = b"SPFTEXP\0";
const VERSION: u32 = 4;

/// One expert's block (see [`ExpertLayout`]) as little-endian bytes of `dtype`.
pub(crate) fn expert_block_bytes(
    ck: &Checkpoint,
    cfg: &Qwen3MoeConfig,
    layer: usize,
    expert: usize,
    dtype: WeightDtype,
) -> Result<Vec<u8>, EngineError> {
    let (h, i) = (cfg.hidden_size, cfg.moe_intermediate_size);
    let p = format!("model.layers.{layer}.mlp.experts.{expert}");
    let gate = ck.peek_as(&format!("{p}.gate_proj.weight"), &[i, h], dtype)?;
    let up = ck.peek_as(&format!("{p}.up_proj.weight"), &[i, h], dtype)?;
    let down = ck.peek_as(&format!("{p}.down_proj.weight"), &[h, i], dtype)?;
    let layout = ExpertLayout {
        hidden: h,
        intermediate: i,
        dtype,
        quant_bytes: None,
    };
    Ok(layout.block_bytes(gate.view(), up.view(), down.view()))
}

/// Whether `path` is a specfit expert file in the format this build reads (magic and version;
/// [`DiskStore::open`] checks the rest). A file from an older build needs `specfit convert`.
pub fn is_current_format(path: &Path) -> bool {
    let mut prefix = [0u8; 12];
    File::open(path)
        .and_then(|f| f.read_exact_at(&mut prefix, 0))
        .is_ok_and(|()| &prefix[..8] == MAGIC && prefix[8..12] == VERSION.to_le_bytes())
}

/// The JSON header of a disk expert file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiskHeader {
    pub format: String,
    pub moe_layers: usize,
    pub experts: usize,
    pub hidden: usize,
    pub intermediate: usize,
    pub dtype: String,
    pub block_bytes: usize,
    pub stride_bytes: usize,
    pub data_offset: u64,
    pub fingerprint: Fingerprint,
    /// Where the CRC32C table starts (right after the last block).
    pub checksum_offset: u64,
}

/// What `convert` wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct ConvertReport {
    pub path: PathBuf,
    pub blocks: usize,
    pub bytes: u64,
    pub dtype: WeightDtype,
    pub seconds: f64,
}

/// Writes the expert-major disk file for the checkpoint in `dir` to `out` (atomically: a
/// temporary file in the same directory, synced, then renamed), storing blocks as `dtype`
/// (default: the checkpoint's own, see [`Checkpoint::native_dtype`]).
pub fn convert(
    dir: &Path,
    out: &Path,
    dtype: Option<WeightDtype>,
) -> Result<ConvertReport, EngineError> {
    let start = Instant::now();
    let cfg = Qwen3MoeConfig::load(dir)?;
    let ck = Checkpoint::open(dir)?;
    let dtype = dtype.unwrap_or_else(|| ck.native_dtype());
    let layers = cfg.moe_layers();
    let layout = ExpertLayout {
        hidden: cfg.hidden_size,
        intermediate: cfg.moe_intermediate_size,
        dtype,
        quant_bytes: None,
    };
    let stride_bytes = padded(layout.bytes());
    let header = DiskHeader {
        format: "specfit-experts".into(),
        moe_layers: layers.len(),
        experts: cfg.num_experts,
        hidden: layout.hidden,
        intermediate: layout.intermediate,
        dtype: dtype.name().into(),
        block_bytes: layout.bytes(),
        stride_bytes,
        data_offset: 0,
        fingerprint: Fingerprint::of_checkpoint(&ck, &cfg)?,
        checksum_offset: 0,
    };
    // Room for the two offsets' digits.
    let json_len = serde_json::to_vec(&header).expect("serialisable").len() + 64;
    let data_offset = padded(16 + json_len);
    let blocks = layers.len() * cfg.num_experts;
    let header = DiskHeader {
        data_offset: data_offset as u64,
        checksum_offset: (data_offset + blocks * stride_bytes) as u64,
        ..header
    };
    let json = serde_json::to_vec(&header).expect("serialisable");
    debug_assert!(16 + json.len() <= data_offset);
    let tmp = out.with_extension(format!("tmp.{}", std::process::id()));
    let write = || -> Result<u64, EngineError> {
        let file = File::create(&tmp).map_err(EngineError::io(&tmp))?;
        let mut w = BufWriter::with_capacity(1 << 20, file);
        let mut head = Vec::with_capacity(data_offset);
        head.extend_from_slice(MAGIC);
        head.extend_from_slice(&VERSION.to_le_bytes());
        head.extend_from_slice(&(json.len() as u32).to_le_bytes());
        head.extend_from_slice(&json);
        head.resize(data_offset, 0);
        w.write_all(&head).map_err(EngineError::io(&tmp))?;
        let mut bytes = head.len() as u64;
        let mut checksums = Vec::with_capacity(4 * blocks);
        for &layer in &layers {
            for e in 0..cfg.num_experts {
                let mut block = expert_block_bytes(&ck, &cfg, layer, e, dtype)?;
                checksums.extend_from_slice(&crc32c::crc32c(&block).to_le_bytes());
                block.resize(stride_bytes, 0);
                w.write_all(&block).map_err(EngineError::io(&tmp))?;
                bytes += stride_bytes as u64;
            }
        }
        w.write_all(&checksums).map_err(EngineError::io(&tmp))?;
        bytes += checksums.len() as u64;
        let file = w.into_inner().map_err(|e| EngineError::Io {
            path: tmp.clone(),
            error: e.into_error(),
        })?;
        file.sync_all().map_err(EngineError::io(&tmp))?;
        Ok(bytes)
    };
    let bytes = match write() {
        Ok(b) => b,
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
    };
    std::fs::rename(&tmp, out).map_err(EngineError::io(out))?;
    Ok(ConvertReport {
        path: out.to_path_buf(),
        blocks: layers.len() * cfg.num_experts,
        bytes,
        dtype,
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// The header of the expert file `path` (open as `plain`): magic, version and JSON checked.
fn read_header(path: &Path, plain: &File) -> Result<DiskHeader, EngineError> {
    let bad = |reason: String| EngineError::ExpertStore {
        reason: format!("{}: {reason}", path.display()),
    };
    let mut prefix = [0u8; 16];
    plain
        .read_exact_at(&mut prefix, 0)
        .map_err(|_| bad("too short for a specfit expert file".into()))?;
    if &prefix[..8] != MAGIC {
        return Err(bad(
            "not a specfit expert file (bad magic); make one with `specfit convert`".into(),
        ));
    }
    let version = u32::from_le_bytes(prefix[8..12].try_into().expect("4 bytes"));
    if version != VERSION {
        return Err(bad(format!(
            "version {version}, this build reads version {VERSION}; rerun `specfit convert`"
        )));
    }
    let json_len = u32::from_le_bytes(prefix[12..16].try_into().expect("4 bytes")) as usize;
    let mut json = vec![0u8; json_len];
    plain
        .read_exact_at(&mut json, 16)
        .map_err(|_| bad("truncated header".into()))?;
    serde_json::from_slice(&json).map_err(|e| bad(format!("bad header: {e}")))
}

/// Why the expert file `file` does not serve the checkpoint in `model` as it is now (None: it
/// does); the file must be in this build's format ([`is_current_format`]).
pub fn staleness(file: &Path, model: &Path) -> Result<Option<String>, EngineError> {
    let plain = File::open(file).map_err(EngineError::io(file))?;
    let header = read_header(file, &plain)?;
    let cfg = Qwen3MoeConfig::load(model)?;
    let ck = Checkpoint::open(model)?;
    let now = Fingerprint::of_checkpoint(&ck, &cfg)?;
    Ok(header.fingerprint.differs(&now))
}

/// The open file a store reads expert bytes from: O_DIRECT where asked for and the filesystem
/// allows it, else buffered through the page cache.
#[derive(Debug)]
pub(crate) struct ExpertFile {
    pub(crate) path: PathBuf,
    pub(crate) file: File,
    /// Whether reads bypass the page cache.
    pub(crate) direct: bool,
}

impl ExpertFile {
    /// `path` opened again with O_DIRECT when `bypass` says so, or `plain` (the same file,
    /// buffered) otherwise or where the filesystem refuses it.
    pub(crate) fn open(path: &Path, plain: File, bypass: bool) -> ExpertFile {
        let direct = bypass.then(|| {
            OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_DIRECT)
                .open(path)
        });
        let (file, direct) = match direct {
            Some(Ok(f)) => (f, true),
            _ => (plain, false),
        };
        ExpertFile {
            path: path.to_path_buf(),
            file,
            direct,
        }
    }
}

/// Reads expert blocks from a disk file, with O_DIRECT where the filesystem allows it.
#[derive(Debug)]
pub struct DiskStore {
    source: ExpertFile,
    header: DiskHeader,
    layout: ExpertLayout,
    /// CRC32C of every block, `[moe layer · experts + expert]` (not printed).
    checksums: Checksums,
}

/// Per-block checksums, shown by count only.
struct Checksums(Vec<u32>);

impl std::fmt::Debug for Checksums {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} checksums", self.0.len())
    }
}

impl DiskStore {
    /// Opens `path` for the model whose shape and fingerprint are given, reading blocks stored
    /// as `dtype`; any mismatch, a bad header or a truncated file is an error naming the file.
    pub fn open(
        path: &Path,
        cfg: &Qwen3MoeConfig,
        fingerprint: Fingerprint,
        dtype: WeightDtype,
    ) -> Result<DiskStore, EngineError> {
        let bad = |reason: String| EngineError::ExpertStore {
            reason: format!("{}: {reason}", path.display()),
        };
        let plain = File::open(path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => bad(
                "no expert file here: write it once with `specfit convert --model MODEL --out FILE`, or name another with `--expert-file FILE` where the command has it".into(),
            ),
            _ => EngineError::io(path)(e),
        })?;
        let header = read_header(path, &plain)?;
        let layout = ExpertLayout {
            hidden: cfg.hidden_size,
            intermediate: cfg.moe_intermediate_size,
            dtype,
            quant_bytes: None,
        };
        let expected = (
            cfg.moe_layers().len(),
            cfg.num_experts,
            layout.hidden,
            layout.intermediate,
        );
        let got = (
            header.moe_layers,
            header.experts,
            header.hidden,
            header.intermediate,
        );
        if got != expected {
            return Err(bad(format!(
                "made for (moe layers, experts, hidden, intermediate) = {got:?}, this model is {expected:?}"
            )));
        }
        if let Some(why) = header.fingerprint.differs(&fingerprint) {
            return Err(bad(format!(
                "{why}; rerun `specfit convert` (`serve` and `bench` convert again themselves)"
            )));
        }
        if header.dtype != dtype.name() || header.block_bytes != layout.bytes() {
            return Err(bad(format!(
                "stores {} experts but the model is loaded with {} weights; convert again with `specfit convert --weights {}`, or load the model with {} weights (`--weights {}` where the command has it)",
                header.dtype,
                dtype.name(),
                dtype.name(),
                header.dtype,
                header.dtype
            )));
        }
        if !header.stride_bytes.is_multiple_of(ALIGN)
            || !header.data_offset.is_multiple_of(ALIGN as u64)
            || header.stride_bytes < header.block_bytes
        {
            return Err(bad("header strides are not 4 KiB-aligned".into()));
        }
        let blocks = header.moe_layers * header.experts;
        let data_end = header.data_offset + (blocks * header.stride_bytes) as u64;
        if header.checksum_offset != data_end {
            return Err(bad(format!(
                "the checksum table is at byte {}, not right after the blocks (byte {data_end})",
                header.checksum_offset
            )));
        }
        let need = data_end + 4 * blocks as u64;
        let len = plain.metadata().map_err(EngineError::io(path))?.len();
        if len < need {
            return Err(bad(format!(
                "truncated: {len} bytes, the header needs {need}"
            )));
        }
        let mut table = vec![0u8; 4 * blocks];
        plain
            .read_exact_at(&mut table, data_end)
            .map_err(EngineError::io(path))?;
        let checksums = table
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        Ok(DiskStore {
            source: ExpertFile::open(path, plain, true),
            header,
            layout,
            checksums: Checksums(checksums),
        })
    }

    /// Whether reads bypass the page cache.
    pub fn is_direct(&self) -> bool {
        self.source.direct
    }
}

impl ExpertStore for DiskStore {
    fn layout(&self) -> ExpertLayout {
        self.layout
    }

    fn read_into(&self, layer: usize, expert: usize, dst: &mut [u8]) -> Result<(), EngineError> {
        let stride = self.header.stride_bytes;
        let offset =
            self.header.data_offset + ((layer * self.header.experts + expert) * stride) as u64;
        self.source
            .file
            .read_exact_at(&mut dst[..stride], offset)
            .map_err(|e| EngineError::ExpertStore {
                reason: format!(
                    "{}: reading layer {layer} expert {expert}: {e}",
                    self.source.path.display()
                ),
            })?;
        let want = self.checksums.0[layer * self.header.experts + expert];
        let got = crc32c::crc32c(&dst[..self.header.block_bytes]);
        if got != want {
            return Err(EngineError::ExpertStore {
                reason: format!(
                    "{}: MoE layer {layer} expert {expert} is corrupt (CRC32C {got:08x}, the file recorded {want:08x}); rewrite it with `specfit convert`",
                    self.source.path.display()
                ),
            });
        }
        Ok(())
    }

    fn tier(&self) -> &'static str {
        if self.source.direct {
            "disk (O_DIRECT)"
        } else {
            "disk (buffered)"
        }
    }
}

#[cfg(not(target_endian = "little"))]
compile_error!("the disk expert format stores little-endian values");
