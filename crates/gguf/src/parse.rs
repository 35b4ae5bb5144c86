//! Parsing a GGUF header: magic, version, metadata and the tensor directory, with every length,
//! count and offset checked against the bytes actually present, so that a truncated or corrupt
//! file is an error naming what is wrong, never a panic or a huge allocation. Reading tensor
//! data is [`crate::GgufFile`]'s; decoding it is [`crate::dequant`]'s.

use std::collections::HashMap;

use crate::error::GgufError;
use crate::types::GgmlType;
use crate::value::{Value, ValueType};

/// `"GGUF"` as the file's first four bytes.
pub const MAGIC: [u8; 4] = *b"GGUF";
/// Alignment of the data section and of each tensor when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml's `GGML_MAX_DIMS`.
const MAX_DIMS: u32 = 4;
/// Nesting depth of arrays of arrays accepted (GGUF files in the wild use none).
const MAX_ARRAY_DEPTH: usize = 2;

/// One entry of the tensor directory.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    /// ggml order: `dims[0]` is the row length (the fastest-moving index), so a PyTorch
    /// `[out, in]` weight is `[in, out]` here and a stack of experts `[in, out, experts]`.
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    /// Offset of the first byte from the start of the data section.
    pub offset: u64,
    /// Bytes of data.
    pub size: u64,
}

impl TensorInfo {
    /// Elements in the tensor.
    pub fn elements(&self) -> u64 {
        self.dims.iter().product()
    }

    /// Bytes of one row (`dims[0]` elements).
    pub fn row_bytes(&self) -> u64 {
        self.ty.row_bytes(self.dims[0]).expect("checked at parse")
    }
}

/// A parsed GGUF header.
#[derive(Debug, Clone)]
pub struct Gguf {
    pub version: u32,
    /// Metadata in file order.
    pub metadata: Vec<(String, Value)>,
    /// Tensor directory in file order.
    pub tensors: Vec<TensorInfo>,
    /// `general.alignment`, or 32.
    pub alignment: u64,
    /// Absolute offset of the data section in the file.
    pub data_offset: u64,
    key_index: HashMap<String, usize>,
    tensor_index: HashMap<String, usize>,
}

impl Gguf {
    /// Parses the header of a whole GGUF file held in `bytes` and checks that every tensor's
    /// data lies inside it.
    pub fn parse(bytes: &[u8]) -> Result<Gguf, GgufError> {
        let mut r = Reader { bytes, at: 0 };
        let magic = r.take(4, "the magic")?;
        if magic != MAGIC {
            return Err(GgufError::BadMagic {
                found: magic.to_vec(),
            });
        }
        let version = r.u32("the version")?;
        if !(2..=3).contains(&version) {
            return Err(GgufError::Version { version });
        }
        let tensor_count = r.u64("the tensor count")?;
        let kv_count = r.u64("the metadata count")?;
        // Each key-value pair takes at least 8 + 4 + 1 bytes, each tensor entry 8 + 4 + 8 + 4 + 8.
        r.plausible_count(kv_count, 13, "metadata count")?;
        r.plausible_count(tensor_count, 32, "tensor count")?;
        let mut metadata = Vec::with_capacity(kv_count as usize);
        let mut key_index = HashMap::new();
        for _ in 0..kv_count {
            let key = r.string("a metadata key")?;
            let ty = r.u32(&format!("the type of {key:?}"))?;
            let ty = ValueType::from_id(ty).ok_or(GgufError::ValueType {
                key: key.clone(),
                ty,
            })?;
            let value = r.value(ty, &key, 0)?;
            if key_index.insert(key.clone(), metadata.len()).is_some() {
                return Err(GgufError::DuplicateKey { key });
            }
            metadata.push((key, value));
        }
        let alignment = match key_index.get("general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(&i) => match metadata[i].1 {
                Value::U32(a) if a > 0 && a.is_power_of_two() => a as u64,
                ref other => {
                    return Err(GgufError::BadMetadata {
                        key: "general.alignment".into(),
                        reason: format!("must be a u32 power of two, got {other:?}"),
                    })
                }
            },
        };
        let mut tensors = Vec::with_capacity(tensor_count as usize);
        let mut tensor_index = HashMap::new();
        for _ in 0..tensor_count {
            let info = r.tensor_info(alignment)?;
            if tensor_index
                .insert(info.name.clone(), tensors.len())
                .is_some()
            {
                return Err(GgufError::DuplicateTensor { name: info.name });
            }
            tensors.push(info);
        }
        let data_offset = r.at.div_ceil(alignment) * alignment;
        check_data(&tensors, data_offset, bytes.len() as u64)?;
        Ok(Gguf {
            version,
            metadata,
            tensors,
            alignment,
            data_offset,
            key_index,
            tensor_index,
        })
    }

    /// The value of metadata key `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.key_index.get(key).map(|&i| &self.metadata[i].1)
    }

    /// The directory entry of tensor `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }
}

/// Every tensor's data must lie in the file and no two may overlap.
fn check_data(tensors: &[TensorInfo], data_offset: u64, len: u64) -> Result<(), GgufError> {
    let mut spans: Vec<(u64, u64, &str)> = tensors
        .iter()
        .map(|t| {
            // An end past u64 is past the file too: saturating keeps the check below honest.
            let end = t.offset.saturating_add(t.size);
            (t.offset, end, t.name.as_str())
        })
        .collect();
    spans.sort_unstable();
    for (i, &(start, end, name)) in spans.iter().enumerate() {
        if data_offset.saturating_add(end) > len {
            return Err(GgufError::Truncated {
                what: format!("the data of tensor {name:?}"),
                at: data_offset.saturating_add(start),
                need: end - start,
                len,
            });
        }
        if let Some(&(next, _, other)) = spans.get(i + 1) {
            if next < end {
                return Err(GgufError::BadTensor {
                    name: other.to_string(),
                    reason: format!("its data overlaps tensor {name:?}"),
                });
            }
        }
    }
    Ok(())
}

/// A cursor over the header bytes.
struct Reader<'a> {
    bytes: &'a [u8],
    at: u64,
}

impl<'a> Reader<'a> {
    fn left(&self) -> u64 {
        self.bytes.len() as u64 - self.at
    }

    fn take(&mut self, n: u64, what: &str) -> Result<&'a [u8], GgufError> {
        if n > self.left() {
            return Err(GgufError::Truncated {
                what: what.to_string(),
                at: self.at,
                need: n,
                len: self.bytes.len() as u64,
            });
        }
        let start = self.at as usize;
        self.at += n;
        Ok(&self.bytes[start..start + n as usize])
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], GgufError> {
        Ok(self.take(N as u64, what)?.try_into().expect("N bytes"))
    }

    fn u32(&mut self, what: &str) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A count of items of at least `min_bytes` each must fit in what is left.
    fn plausible_count(&self, count: u64, min_bytes: u64, what: &str) -> Result<(), GgufError> {
        let limit = self.left() / min_bytes;
        if count > limit {
            return Err(GgufError::TooLarge {
                what: format!("{what} (the file is too short to hold that many)"),
                value: count,
                limit,
            });
        }
        Ok(())
    }

    fn string(&mut self, what: &str) -> Result<String, GgufError> {
        let len = self.u64(&format!("the length of {what}"))?;
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| GgufError::Utf8 {
            what: what.to_string(),
        })
    }

    fn value(&mut self, ty: ValueType, key: &str, depth: usize) -> Result<Value, GgufError> {
        let what = format!("the value of {key:?}");
        Ok(match ty {
            ValueType::U8 => Value::U8(self.array::<1>(&what)?[0]),
            ValueType::I8 => Value::I8(self.array::<1>(&what)?[0] as i8),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.array(&what)?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.array(&what)?)),
            ValueType::U32 => Value::U32(self.u32(&what)?),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.array(&what)?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.array(&what)?)),
            ValueType::U64 => Value::U64(self.u64(&what)?),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.array(&what)?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.array(&what)?)),
            ValueType::Bool => match self.array::<1>(&what)?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => {
                    return Err(GgufError::BadMetadata {
                        key: key.to_string(),
                        reason: format!("a bool must be 0 or 1, got {b}"),
                    })
                }
            },
            ValueType::String => Value::String(self.string(&what)?),
            ValueType::Array => {
                let item = self.u32(&format!("the item type of {key:?}"))?;
                let item = ValueType::from_id(item).ok_or(GgufError::ValueType {
                    key: key.to_string(),
                    ty: item,
                })?;
                if item == ValueType::Array && depth >= MAX_ARRAY_DEPTH {
                    return Err(GgufError::BadMetadata {
                        key: key.to_string(),
                        reason: format!("arrays nested deeper than {MAX_ARRAY_DEPTH}"),
                    });
                }
                let count = self.u64(&format!("the length of {key:?}"))?;
                // Strings take at least their 8-byte length, arrays 12 bytes.
                let min = item.fixed_size().unwrap_or(8);
                self.plausible_count(count, min, &format!("the length of {key:?}"))?;
                let values = (0..count)
                    .map(|_| self.value(item, key, depth + 1))
                    .collect::<Result<Vec<_>, _>>()?;
                Value::Array { item, values }
            }
        })
    }

    fn tensor_info(&mut self, alignment: u64) -> Result<TensorInfo, GgufError> {
        let name = self.string("a tensor name")?;
        let bad = |reason: String| GgufError::BadTensor {
            name: name.clone(),
            reason,
        };
        let n_dims = self.u32(&format!("the rank of {name:?}"))?;
        if n_dims == 0 || n_dims > MAX_DIMS {
            return Err(bad(format!("rank {n_dims} is not 1..={MAX_DIMS}")));
        }
        let dims = (0..n_dims)
            .map(|_| self.u64(&format!("the shape of {name:?}")))
            .collect::<Result<Vec<u64>, _>>()?;
        let ty = self.u32(&format!("the type of {name:?}"))?;
        let ty = GgmlType::from_id(ty).ok_or(GgufError::UnknownType {
            name: name.clone(),
            ty,
        })?;
        let offset = self.u64(&format!("the offset of {name:?}"))?;
        if dims.contains(&0) {
            return Err(bad(format!("shape {dims:?} has a zero dimension")));
        }
        let elements = dims
            .iter()
            .try_fold(1u64, |n, &d| n.checked_mul(d))
            .filter(|&n| n < 1 << 50)
            .ok_or_else(|| bad(format!("shape {dims:?} is too large")))?;
        let row = ty.row_bytes(dims[0]).ok_or_else(|| {
            bad(format!(
                "rows of {} elements are not whole {} blocks of {}",
                dims[0],
                ty.name(),
                ty.block().0
            ))
        })?;
        if !offset.is_multiple_of(alignment) {
            return Err(bad(format!(
                "offset {offset} is not a multiple of the alignment {alignment}"
            )));
        }
        let size = row * (elements / dims[0]);
        Ok(TensorInfo {
            name,
            dims,
            ty,
            offset,
            size,
        })
    }
}
