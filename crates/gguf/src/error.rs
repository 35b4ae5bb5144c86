//! Everything that can be wrong with a GGUF file, with the offending values.

use std::path::PathBuf;

/// A GGUF file that cannot be read as one, or a tensor that cannot be decoded.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    /// The I/O error is part of the message, not a chained source, so it prints once.
    #[error("{path}: {error}")]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("not a GGUF file: it starts with {found:02x?}, not \"GGUF\"")]
    BadMagic { found: Vec<u8> },
    #[error("GGUF version {version} is not supported (2 and 3 are)")]
    Version { version: u32 },
    #[error("truncated GGUF: {what} at byte {at} needs {need} bytes but the file has {len}")]
    Truncated {
        what: String,
        at: u64,
        need: u64,
        len: u64,
    },
    #[error("GGUF metadata key {key:?}: unknown value type {ty}")]
    ValueType { key: String, ty: u32 },
    #[error("GGUF {what} is not valid UTF-8")]
    Utf8 { what: String },
    #[error("GGUF metadata key {key:?} appears twice")]
    DuplicateKey { key: String },
    #[error("GGUF tensor {name:?} appears twice")]
    DuplicateTensor { name: String },
    #[error("GGUF {what}: {value} is beyond the limit {limit}")]
    TooLarge {
        what: String,
        value: u64,
        limit: u64,
    },
    #[error("GGUF tensor {name:?}: unknown tensor type {ty}")]
    UnknownType { name: String, ty: u32 },
    #[error("GGUF tensor {name:?}: {reason}")]
    BadTensor { name: String, reason: String },
    #[error("GGUF metadata key {key:?}: {reason}")]
    BadMetadata { key: String, reason: String },
    #[error("GGUF tensor {name:?} has type {ty}, which this build cannot decode (it decodes {supported})")]
    UnsupportedType {
        name: String,
        ty: &'static str,
        supported: &'static str,
    },
}
