//! An opened GGUF file: memory-mapped, its header parsed and checked, tensor data handed out as
//! byte slices (and decoded to `f32` through [`crate::dequant`]). Streaming experts with
//! O_DIRECT reads uses [`GgufFile::absolute_offset`]; this module does not read on its own.

use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use crate::dequant;
use crate::error::GgufError;
use crate::parse::{Gguf, TensorInfo};

/// A GGUF file on disk.
pub struct GgufFile {
    path: PathBuf,
    map: Mmap,
    header: Gguf,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("tensors", &self.header.tensors.len())
            .finish()
    }
}

impl GgufFile {
    /// Maps `path` and parses its header.
    pub fn open(path: &Path) -> Result<GgufFile, GgufError> {
        let io = |error| GgufError::Io {
            path: path.to_path_buf(),
            error,
        };
        let file = File::open(path).map_err(io)?;
        // SAFETY: the file is opened read-only and only read through this map; a concurrent
        // writer truncating it would be a misuse we cannot prevent (as for every mmap loader).
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        let header = Gguf::parse(&map)?;
        Ok(GgufFile {
            path: path.to_path_buf(),
            map,
            header,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The parsed header (metadata and tensor directory).
    pub fn header(&self) -> &Gguf {
        &self.header
    }

    /// Bytes in the file.
    pub fn len(&self) -> u64 {
        self.map.len() as u64
    }

    /// Whether the file is empty (never, once parsed).
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The header: every byte before the data section.
    pub fn prefix(&self) -> &[u8] {
        &self.map[..self.header.data_offset.min(self.map.len() as u64) as usize]
    }

    /// The whole file.
    pub fn raw(&self) -> &[u8] {
        &self.map
    }

    /// Asks the kernel to start reading the whole file into the page cache in the background
    /// (`madvise(MADV_WILLNEED)`, as llama.cpp does for a mapped model), for a caller about to
    /// use most of it in place. A hint: an error only means no read-ahead.
    pub fn will_need(&self) {
        let _ = self.map.advise(memmap2::Advice::WillNeed);
    }

    /// Where `info`'s data starts in the file.
    pub fn absolute_offset(&self, info: &TensorInfo) -> u64 {
        self.header.data_offset + info.offset
    }

    /// The raw bytes of `info`'s data (checked to lie in the file when it was opened).
    pub fn bytes(&self, info: &TensorInfo) -> &[u8] {
        let start = self.absolute_offset(info) as usize;
        &self.map[start..start + info.size as usize]
    }

    /// Tensor `info` decoded to `f32`, `dims[0]`-element rows one after another.
    pub fn dequantize(&self, info: &TensorInfo) -> Result<Vec<f32>, GgufError> {
        let mut out = vec![0.0f32; info.elements() as usize];
        dequant::dequantize(info.ty, self.bytes(info), &mut out).map_err(|ty| {
            GgufError::UnsupportedType {
                name: info.name.clone(),
                ty: ty.name(),
                supported: dequant::SUPPORTED,
            }
        })?;
        Ok(out)
    }
}
