//! Writing GGUF files (version 3): header, metadata, tensor directory, then each tensor's data
//! padded to the alignment — streamed from a callback so that files larger than memory can be
//! written, to a temporary file renamed into place. Used by tests and by the generators of
//! synthetic models; it does not quantize ([`crate::quant`] does).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use crate::error::GgufError;
use crate::parse::{DEFAULT_ALIGNMENT, MAGIC};
use crate::types::GgmlType;
use crate::value::Value;

/// A tensor to write: its name, ggml-order shape (row length first) and type.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorSpec {
    pub name: String,
    pub dims: Vec<u64>,
    pub ty: GgmlType,
}

impl TensorSpec {
    /// Bytes of the tensor's data.
    pub fn size(&self) -> Result<u64, GgufError> {
        let rows: u64 = self.dims[1..].iter().product();
        let row = self
            .ty
            .row_bytes(self.dims[0])
            .ok_or_else(|| GgufError::BadTensor {
                name: self.name.clone(),
                reason: format!(
                    "rows of {} elements are not whole {} blocks",
                    self.dims[0],
                    self.ty.name()
                ),
            })?;
        Ok(row * rows)
    }
}

/// The whole file as bytes (tests and small files): `data[i]` is tensor `i`'s bytes.
pub fn to_bytes(
    metadata: &[(String, Value)],
    tensors: &[TensorSpec],
    data: &[Vec<u8>],
) -> Result<Vec<u8>, GgufError> {
    let mut out = Vec::new();
    write_to(&mut out, metadata, tensors, |i, w| w.write_all(&data[i]))
        .map_err(|source| io_error(Path::new("<memory>"), source))??;
    Ok(out)
}

/// Writes a GGUF file at `path` (through `path` + `.tmp`, renamed when complete); `data(i, w)`
/// must write exactly tensor `i`'s bytes to `w`.
pub fn write_file(
    path: &Path,
    metadata: &[(String, Value)],
    tensors: &[TensorSpec],
    data: impl FnMut(usize, &mut dyn Write) -> std::io::Result<()>,
) -> Result<(), GgufError> {
    let tmp = path.with_extension("gguf.tmp");
    let file = File::create(&tmp).map_err(|e| io_error(&tmp, e))?;
    let mut w = BufWriter::with_capacity(1 << 20, file);
    write_to(&mut w, metadata, tensors, data).map_err(|e| io_error(&tmp, e))??;
    let file = w.into_inner().map_err(|e| io_error(&tmp, e.into_error()))?;
    file.sync_all().map_err(|e| io_error(&tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| io_error(path, e))
}

fn io_error(path: &Path, error: std::io::Error) -> GgufError {
    GgufError::Io {
        path: path.to_path_buf(),
        error,
    }
}

/// Counts bytes written through it.
struct Counting<'a> {
    inner: &'a mut dyn Write,
    written: u64,
}

impl Write for Counting<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.written += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Outer error: I/O; inner: a tensor whose shape or data size is wrong.
fn write_to(
    w: &mut dyn Write,
    metadata: &[(String, Value)],
    tensors: &[TensorSpec],
    mut data: impl FnMut(usize, &mut dyn Write) -> std::io::Result<()>,
) -> std::io::Result<Result<(), GgufError>> {
    let alignment = metadata
        .iter()
        .find(|(k, _)| k == "general.alignment")
        .and_then(|(_, v)| v.as_u64())
        .unwrap_or(DEFAULT_ALIGNMENT);
    let sizes = match tensors
        .iter()
        .map(TensorSpec::size)
        .collect::<Result<Vec<_>, _>>()
    {
        Ok(s) => s,
        Err(e) => return Ok(Err(e)),
    };
    let mut w = Counting {
        inner: w,
        written: 0,
    };
    w.write_all(&MAGIC)?;
    w.write_all(&3u32.to_le_bytes())?;
    w.write_all(&(tensors.len() as u64).to_le_bytes())?;
    w.write_all(&(metadata.len() as u64).to_le_bytes())?;
    for (key, value) in metadata {
        write_string(&mut w, key)?;
        w.write_all(&value.value_type().id().to_le_bytes())?;
        write_value(&mut w, value)?;
    }
    let mut offset = 0u64;
    for (t, &size) in tensors.iter().zip(&sizes) {
        write_string(&mut w, &t.name)?;
        w.write_all(&(t.dims.len() as u32).to_le_bytes())?;
        for &d in &t.dims {
            w.write_all(&d.to_le_bytes())?;
        }
        w.write_all(&t.ty.id().to_le_bytes())?;
        w.write_all(&offset.to_le_bytes())?;
        offset = (offset + size).div_ceil(alignment) * alignment;
    }
    pad(&mut w, alignment)?;
    for (i, (t, &size)) in tensors.iter().zip(&sizes).enumerate() {
        let start = w.written;
        data(i, &mut w)?;
        if w.written - start != size {
            return Ok(Err(GgufError::BadTensor {
                name: t.name.clone(),
                reason: format!(
                    "{} bytes of data written, {size} expected",
                    w.written - start
                ),
            }));
        }
        pad(&mut w, alignment)?;
    }
    w.flush()?;
    Ok(Ok(()))
}

fn pad(w: &mut Counting<'_>, alignment: u64) -> std::io::Result<()> {
    let n = w.written.div_ceil(alignment) * alignment - w.written;
    w.write_all(&vec![0u8; n as usize])
}

fn write_string(w: &mut dyn Write, s: &str) -> std::io::Result<()> {
    w.write_all(&(s.len() as u64).to_le_bytes())?;
    w.write_all(s.as_bytes())
}

fn write_value(w: &mut dyn Write, v: &Value) -> std::io::Result<()> {
    match v {
        Value::U8(x) => w.write_all(&[*x]),
        Value::I8(x) => w.write_all(&x.to_le_bytes()),
        Value::U16(x) => w.write_all(&x.to_le_bytes()),
        Value::I16(x) => w.write_all(&x.to_le_bytes()),
        Value::U32(x) => w.write_all(&x.to_le_bytes()),
        Value::I32(x) => w.write_all(&x.to_le_bytes()),
        Value::F32(x) => w.write_all(&x.to_le_bytes()),
        Value::Bool(x) => w.write_all(&[*x as u8]),
        Value::String(s) => write_string(w, s),
        Value::Array { item, values } => {
            w.write_all(&item.id().to_le_bytes())?;
            w.write_all(&(values.len() as u64).to_le_bytes())?;
            values.iter().try_for_each(|v| write_value(w, v))
        }
        Value::U64(x) => w.write_all(&x.to_le_bytes()),
        Value::I64(x) => w.write_all(&x.to_le_bytes()),
        Value::F64(x) => w.write_all(&x.to_le_bytes()),
    }
}
