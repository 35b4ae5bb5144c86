//! GGUF, the file format of llama.cpp and ggml: the header, the typed metadata, the tensor
//! directory ([`Gguf`], every offset and size checked against the file) and the block formats of
//! the tensor data ([`GgmlType`], exact dequantization in [`dequant`], quantization in [`quant`]). It knows nothing of any
//! model: which tensor is what, and what the metadata keys mean, is the engine's business.
//!
//! Format: <https://github.com/ggml-org/ggml/blob/master/docs/gguf.md> (version 2 and 3).

mod error;
mod file;
mod parse;
mod types;
mod value;

pub mod dequant;
pub mod finite;
pub mod quant;
pub mod write;

pub use error::GgufError;
pub use file::GgufFile;
pub use parse::{Gguf, TensorInfo, DEFAULT_ALIGNMENT, MAGIC};
pub use types::GgmlType;
pub use value::{Value, ValueType};
