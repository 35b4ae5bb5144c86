//! Reads a Hugging Face checkpoint's safetensors — one `model.safetensors` or the shards named by
//! `model.safetensors.index.json` — memory-mapped, or a GGUF file under Hugging Face names
//! ([`crate::gguf::GgufTensors`]), and hands out tensors as `f32` (F32 as is, BF16/F16 widened
//! exactly, quantized blocks decoded exactly) after checking each name, shape and dtype, and that
//! every value is finite (a GGUF file's are checked once, by its checksum sidecar). Tracks
//! which tensors were taken so that leftovers are reported. Knows nothing of the model's
//! structure.

use std::collections::{BTreeMap, HashSet};
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use safetensors::tensor::{Dtype, TensorInfo};
use safetensors::SafeTensors;

use crate::error::EngineError;
use crate::gguf::GgufTensors;
use crate::kernels::{WeightBuf, WeightDtype};

struct Shard {
    path: PathBuf,
    map: Mmap,
    /// Offset of the data section (8 + header length).
    data_start: usize,
    tensors: BTreeMap<String, TensorInfo>,
}

/// An opened checkpoint.
pub struct Checkpoint {
    shards: Vec<Shard>,
    gguf: Option<GgufTensors>,
    /// Quantized GGUF matrices stay quantized ([`Checkpoint::take_quantized`]).
    keep_quantized: bool,
    taken: HashSet<String>,
    /// Dtype matrices are kept in ([`Checkpoint::take_weight`]).
    storage: WeightDtype,
    /// Float matrices quantized at load into this type ([`Checkpoint::quantize_matrices`]).
    quantize: Option<specfit_gguf::GgmlType>,
}

impl Checkpoint {
    /// Opens `dir/model.safetensors` (decompressed first from
    /// `dir/model.safetensors.compressed` when only that is there: [`crate::compressed`]), or
    /// every shard listed in
    /// `dir/model.safetensors.index.json`, or, when `dir` is a GGUF file, that file.
    pub fn open(dir: &Path) -> Result<Checkpoint, EngineError> {
        crate::gguf::check_model_path(dir)?;
        if crate::gguf::is_gguf(dir) {
            let file = crate::gguf::open(dir)?;
            let tensors = GgufTensors::new(std::sync::Arc::new(file));
            let mut ck = Checkpoint {
                shards: Vec::new(),
                gguf: Some(tensors),
                keep_quantized: true,
                taken: HashSet::new(),
                storage: WeightDtype::F32,
                quantize: None,
            };
            ck.storage = ck.native_dtype();
            return Ok(ck);
        }
        crate::compressed::ensure_decompressed(dir)?;
        let index = dir.join("model.safetensors.index.json");
        let files = if index.exists() {
            shard_files(dir, &index)?
        } else {
            vec![dir.join("model.safetensors")]
        };
        let shards = files
            .into_iter()
            .map(open_shard)
            .collect::<Result<Vec<_>, _>>()?;
        let mut ck = Checkpoint {
            shards,
            gguf: None,
            keep_quantized: false,
            taken: HashSet::new(),
            storage: WeightDtype::F32,
            quantize: None,
        };
        ck.storage = ck.native_dtype();
        Ok(ck)
    }

    /// The files the tensors are read from: every safetensors shard, or the GGUF file.
    pub fn files(&self) -> Vec<&Path> {
        match &self.gguf {
            Some(g) => vec![g.path()],
            None => self.shards.iter().map(|s| s.path.as_path()).collect(),
        }
    }

    /// Whether quantized GGUF matrices are kept quantized (no storage dtype forced).
    pub fn keeps_quantized(&self) -> bool {
        self.gguf.is_some() && self.keep_quantized
    }

    /// The GGUF file's tensors, when the checkpoint is one.
    pub fn gguf(&self) -> Option<&GgufTensors> {
        self.gguf.as_ref()
    }

    /// Whether the checkpoint holds `name`.
    pub fn contains(&self, name: &str) -> bool {
        match &self.gguf {
            Some(g) => g.contains(name),
            None => self.shards.iter().any(|s| s.tensors.contains_key(name)),
        }
    }

    /// Takes tensor `name`, which must have exactly `shape`, as `f32` values (row-major).
    pub fn take(&mut self, name: &str, shape: &[usize]) -> Result<Vec<f32>, EngineError> {
        let values = self.peek(name, shape)?;
        self.taken.insert(name.to_string());
        Ok(values)
    }

    /// Checks tensor `name` against `shape` and marks it used without reading it (experts
    /// served from another store).
    pub fn skip(&mut self, name: &str, shape: &[usize]) -> Result<(), EngineError> {
        if let Some(g) = &self.gguf {
            gguf_shape(g, name, shape)?;
            self.taken.insert(name.to_string());
            return Ok(());
        }
        self.info(name, shape)?;
        self.taken.insert(name.to_string());
        Ok(())
    }

    /// Reads tensor `name` as `f32` without marking it used.
    pub fn peek(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, EngineError> {
        if let Some(g) = &self.gguf {
            gguf_shape(g, name, shape)?;
            return g.values(name);
        }
        let (shard, info) = self.info(name, shape)?;
        let (start, end) = info.data_offsets;
        let bytes = &shard.map[shard.data_start + start..shard.data_start + end];
        let values = widen(bytes, info.dtype).ok_or_else(|| EngineError::TensorDtype {
            path: shard.path.clone(),
            name: name.to_string(),
            dtype: format!("{:?}", info.dtype),
        })?;
        match values.iter().position(|v| !v.is_finite()) {
            None => Ok(values),
            Some(at) => Err(non_finite(shard, name, at)),
        }
    }

    /// Keeps matrices taken with [`Checkpoint::take_weight`] in `dtype` from now on, and
    /// quantized GGUF matrices decoded into it too (instead of kept quantized).
    pub fn set_storage(&mut self, dtype: WeightDtype) {
        self.storage = dtype;
        self.keep_quantized = false;
    }

    /// The dtype [`Checkpoint::take_weight`] returns.
    pub fn storage(&self) -> WeightDtype {
        self.storage
    }

    /// From now on, [`Checkpoint::take_quantized`] returns the float matrices of a safetensors
    /// checkpoint quantized into `ty` (Q8_0, Q4_K or Q6_K: the block types
    /// [`specfit_gguf::quant::quantize_row`] writes that the kernels keep quantized), rows
    /// whose width is not whole blocks of `ty` excepted.
    pub(crate) fn quantize_matrices(&mut self, ty: specfit_gguf::GgmlType) {
        use specfit_gguf::GgmlType::{Q4_K, Q6_K, Q8_0};
        debug_assert!(
            matches!(ty, Q8_0 | Q4_K | Q6_K),
            "{} is not quantized at load",
            ty.name()
        );
        self.quantize = Some(ty);
    }

    /// Takes tensor `name` as quantized rows: a GGUF file's own rows when it stores it in a
    /// quantized type with an integer form (kept quantized by the kernels) and no storage dtype
    /// was forced, or a safetensors matrix quantized at load ([`Checkpoint::quantize_matrices`]);
    /// `None` (nothing taken) otherwise.
    pub fn take_quantized(
        &mut self,
        name: &str,
        shape: &[usize],
    ) -> Result<Option<(specfit_gguf::GgmlType, Vec<u8>)>, EngineError> {
        let found = match self.quantize {
            Some(ty) if self.gguf.is_none() => self.quantized_at_load(ty, name, shape)?,
            _ => self
                .peek_quantized(name, shape)?
                .map(|(ty, bytes)| (ty, bytes.to_vec())),
        };
        if found.is_some() {
            self.taken.insert(name.to_string());
        }
        Ok(found)
    }

    /// Matrix `name` (`[out, in]`) quantized into `ty` row by row, when `in` is whole blocks.
    fn quantized_at_load(
        &self,
        ty: specfit_gguf::GgmlType,
        name: &str,
        shape: &[usize],
    ) -> Result<Option<(specfit_gguf::GgmlType, Vec<u8>)>, EngineError> {
        let &[_, inp] = shape else {
            return Ok(None);
        };
        if inp == 0 || !inp.is_multiple_of(ty.block().0) {
            return Ok(None);
        }
        let values = self.peek(name, shape)?;
        let mut bytes = Vec::with_capacity(values.len() / ty.block().0 * ty.block().1);
        for row in values.chunks_exact(inp) {
            specfit_gguf::quant::quantize_row(ty, row, &mut bytes).expect("checked when set");
        }
        Ok(Some((ty, bytes)))
    }

    /// [`Checkpoint::take_quantized`] without marking the tensor used, borrowing the rows from
    /// the mapped file.
    pub fn peek_quantized(
        &self,
        name: &str,
        shape: &[usize],
    ) -> Result<Option<(specfit_gguf::GgmlType, &[u8])>, EngineError> {
        let Some(g) = self.gguf.as_ref().filter(|_| self.keep_quantized) else {
            return Ok(None);
        };
        gguf_shape(g, name, shape)?;
        let (info, range) = g.location(name).expect("shape checked");
        if specfit_gguf::dequant::int_groups(info.ty).is_none() {
            return Ok(None);
        }
        let bytes = &g.file().bytes(info)[range.start as usize..range.end as usize];
        Ok(Some((info.ty, bytes)))
    }

    /// Takes a matrix in the storage dtype.
    pub fn take_weight(&mut self, name: &str, shape: &[usize]) -> Result<WeightBuf, EngineError> {
        self.take_as(name, shape, self.storage)
    }

    /// Takes tensor `name` stored as `dtype`: bf16 tensors stay bit-exact when `dtype` is bf16;
    /// f32/f16 tensors are rounded to nearest-even when bf16 is asked for.
    pub fn take_as(
        &mut self,
        name: &str,
        shape: &[usize],
        dtype: WeightDtype,
    ) -> Result<WeightBuf, EngineError> {
        let values = self.peek_as(name, shape, dtype)?;
        self.taken.insert(name.to_string());
        Ok(values)
    }

    /// As [`Checkpoint::take_as`], without marking the tensor used.
    pub fn peek_as(
        &self,
        name: &str,
        shape: &[usize],
        dtype: WeightDtype,
    ) -> Result<WeightBuf, EngineError> {
        if self.gguf.is_some() {
            // BF16 stays bit-exact when bf16 is asked for; f32 from decoding is rounded.
            return Ok(store_as(self.peek(name, shape)?, dtype));
        }
        let (shard, info) = self.info(name, shape)?;
        if dtype == WeightDtype::Bf16 && info.dtype == Dtype::BF16 {
            let (start, end) = info.data_offsets;
            let bytes = &shard.map[shard.data_start + start..shard.data_start + end];
            let bf16 = specfit_gguf::GgmlType::BF16;
            if let Ok(Some(at)) = specfit_gguf::finite::first_non_finite(bf16, bytes) {
                return Err(non_finite(shard, name, at));
            }
            return Ok(WeightBuf::Bf16(
                bytes
                    .chunks_exact(2)
                    .map(|b| u16::from_le_bytes([b[0], b[1]]))
                    .collect(),
            ));
        }
        let values = self.peek(name, shape)?;
        Ok(store_as(values, dtype))
    }

    /// The dtype weights keep by default: bf16 when the token embedding (or, in a checkpoint
    /// without one, the LM head) is stored in bf16, else f32 (f16 checkpoints are widened).
    pub fn native_dtype(&self) -> WeightDtype {
        if let Some(g) = &self.gguf {
            let bf16 =
                g.ggml_type("model.embed_tokens.weight") == Some(specfit_gguf::GgmlType::BF16);
            return if bf16 {
                WeightDtype::Bf16
            } else {
                WeightDtype::F32
            };
        }
        // An EAGLE-3 head has no embedding of its own: its LM head decides.
        let stored = |name: &str| self.shards.iter().find_map(|s| s.tensors.get(name));
        let bf16 = stored("model.embed_tokens.weight")
            .or_else(|| stored("lm_head.weight"))
            .is_some_and(|i| i.dtype == Dtype::BF16);
        if bf16 {
            WeightDtype::Bf16
        } else {
            WeightDtype::F32
        }
    }

    /// Takes an integer tensor (I64 or I32) as `i64` values.
    pub fn take_i64(&mut self, name: &str, shape: &[usize]) -> Result<Vec<i64>, EngineError> {
        let (shard, info) = self.info(name, shape)?;
        let (start, end) = info.data_offsets;
        let bytes = &shard.map[shard.data_start + start..shard.data_start + end];
        let values = match info.dtype {
            Dtype::I64 => bytes
                .chunks_exact(8)
                .map(|b| i64::from_le_bytes(b.try_into().expect("8 bytes")))
                .collect(),
            Dtype::I32 => bytes
                .chunks_exact(4)
                .map(|b| i32::from_le_bytes(b.try_into().expect("4 bytes")) as i64)
                .collect(),
            other => {
                return Err(EngineError::TensorDtype {
                    path: shard.path.clone(),
                    name: name.to_string(),
                    dtype: format!("{other:?} (expected I64)"),
                })
            }
        };
        self.taken.insert(name.to_string());
        Ok(values)
    }

    /// Marks `name` used whatever its dtype, if present (buffers this engine does not need).
    pub fn ignore(&mut self, name: &str) {
        if self.contains(name) {
            self.taken.insert(name.to_string());
        }
    }

    /// The shard and metadata of `name`, checked against `shape`.
    fn info(&self, name: &str, shape: &[usize]) -> Result<(&Shard, &TensorInfo), EngineError> {
        let shard = self
            .shards
            .iter()
            .find(|s| s.tensors.contains_key(name))
            .ok_or_else(|| EngineError::MissingTensor {
                name: name.to_string(),
                searched: self
                    .shards
                    .iter()
                    .map(|s| s.path.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
            })?;
        let info = &shard.tensors[name];
        if info.shape != shape {
            return Err(EngineError::TensorShape {
                path: shard.path.clone(),
                name: name.to_string(),
                expected: shape.to_vec(),
                got: info.shape.clone(),
            });
        }
        Ok((shard, info))
    }

    /// Fails on the first tensor that was never taken (a checkpoint that is not this model).
    pub fn finish(self) -> Result<(), EngineError> {
        if let Some(g) = &self.gguf {
            if let Some(name) = g.names().find(|n| !self.taken.contains(*n)) {
                return Err(EngineError::ExtraTensor {
                    path: g.path().to_path_buf(),
                    name: name.to_string(),
                });
            }
        }
        for shard in &self.shards {
            if let Some(name) = shard.tensors.keys().find(|n| !self.taken.contains(*n)) {
                return Err(EngineError::ExtraTensor {
                    path: shard.path.clone(),
                    name: name.clone(),
                });
            }
        }
        Ok(())
    }
}

/// Decoded values kept as `dtype` (bf16: rounded to nearest-even, exact for BF16 sources).
fn store_as(values: Vec<f32>, dtype: WeightDtype) -> WeightBuf {
    match dtype {
        WeightDtype::F32 => WeightBuf::F32(values),
        WeightDtype::Bf16 => WeightBuf::Bf16(
            values
                .iter()
                .map(|&v| half::bf16::from_f32(v).to_bits())
                .collect(),
        ),
    }
}

/// Checks that the GGUF holds `name` with PyTorch-order shape `shape`.
fn gguf_shape(g: &GgufTensors, name: &str, shape: &[usize]) -> Result<(), EngineError> {
    let got = g.shape(name).ok_or_else(|| EngineError::MissingTensor {
        name: name.to_string(),
        searched: g.path().display().to_string(),
    })?;
    if got != shape {
        return Err(EngineError::TensorShape {
            path: g.path().to_path_buf(),
            name: name.to_string(),
            expected: shape.to_vec(),
            got: got.to_vec(),
        });
    }
    Ok(())
}

/// The shard file names of an index, validated to exist.
fn shard_files(dir: &Path, index: &Path) -> Result<Vec<PathBuf>, EngineError> {
    #[derive(serde::Deserialize)]
    struct Index {
        weight_map: BTreeMap<String, String>,
    }
    let text = std::fs::read_to_string(index).map_err(EngineError::io(index))?;
    let parsed: Index = serde_json::from_str(&text).map_err(|e| EngineError::Json {
        path: index.to_path_buf(),
        message: e.to_string(),
    })?;
    let mut names: Vec<&String> = parsed.weight_map.values().collect();
    names.sort();
    names.dedup();
    names
        .into_iter()
        .map(|name| {
            let path = dir.join(name);
            if name.contains('/') || !path.exists() {
                Err(EngineError::MissingShard {
                    index: index.to_path_buf(),
                    shard: name.clone(),
                })
            } else {
                Ok(path)
            }
        })
        .collect()
}

/// Tensor `name` of `shard` holds a NaN or an infinity at element `at`.
fn non_finite(shard: &Shard, name: &str, at: usize) -> EngineError {
    EngineError::NonFiniteTensor {
        path: shard.path.clone(),
        tensor: name.to_string(),
        at,
    }
}

fn open_shard(path: PathBuf) -> Result<Shard, EngineError> {
    if path.is_dir() {
        return Err(EngineError::Safetensors {
            path,
            message: "a directory, not a safetensors file".into(),
        });
    }
    let file = File::open(&path).map_err(EngineError::io(&path))?;
    // SAFETY: the file is opened read-only and only read through this map; a concurrent writer
    // truncating it would be a misuse we cannot prevent (as for every mmap-based loader).
    let map = unsafe { Mmap::map(&file) }.map_err(EngineError::io(&path))?;
    let corrupt = |message: String| EngineError::Safetensors {
        path: path.clone(),
        message,
    };
    let (header_len, metadata) =
        SafeTensors::read_metadata(&map).map_err(|e| corrupt(e.to_string()))?;
    let data_start = 8 + header_len;
    let data_len = map.len().saturating_sub(data_start);
    let mut tensors = BTreeMap::new();
    for (name, info) in metadata.tensors() {
        let (start, end) = info.data_offsets;
        let elems: usize = info.shape.iter().product();
        let want = elems * info.dtype.bitsize() / 8;
        if end > data_len || start > end || end - start != want {
            return Err(corrupt(format!(
                "tensor {name}: data offsets {start}..{end} do not fit {want} bytes in a {data_len}-byte data section (truncated?)"
            )));
        }
        tensors.insert(name.clone(), info.clone());
    }
    drop(metadata);
    Ok(Shard {
        path,
        map,
        data_start,
        tensors,
    })
}

/// Little-endian F32/BF16/F16 bytes as `f32` (exact for the half types).
fn widen(bytes: &[u8], dtype: Dtype) -> Option<Vec<f32>> {
    Some(match dtype {
        Dtype::F32 => bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        Dtype::BF16 => bytes
            .chunks_exact(2)
            .map(|b| half::bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32())
            .collect(),
        Dtype::F16 => bytes
            .chunks_exact(2)
            .map(|b| half::f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32())
            .collect(),
        _ => return None,
    })
}
