//! Compressed checkpoints: a `model.safetensors` kept in git as `model.safetensors.compressed`,
//! about two thirds of its size, and decompressed (once, atomically) into `model.safetensors`
//! beside it when a checkpoint directory holds only the compressed file. It owns the format and
//! both directions; it does not read tensors (`weights` does, from the decompressed file).
//!
//! A bf16 checkpoint's bytes alternate between a low byte (one exponent bit and the mantissa:
//! noise to a compressor) and a high byte (sign and exponent: a few bits of entropy). So the data
//! section is split into those two planes, the high one zstd-compressed and the low one kept
//! raw; the safetensors header stays as it is. Lossless by construction, and checked: the
//! decompressed file must have the SHA-256 recorded when compressing.
//!
//! Layout (integers little-endian):
//! `MAGIC` · file length u64 · header length u64 (8 + the JSON header's) · compressed high
//! plane length u64 · SHA-256 of the file (32 bytes) · the header bytes · the zstd frame of
//! the high plane (data bytes 1, 3, 5, …) · the low plane (data bytes 0, 2, 4, …).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use sha2::{Digest, Sha256};

use crate::error::EngineError;

/// The first 8 bytes of a compressed checkpoint.
pub const MAGIC: &[u8; 8] = b"SFZPLN01";

/// The zstd level of the high plane (19: the highest before zstd's memory-hungry ultra levels).
pub const LEVEL: i32 = 19;

/// Bytes before the header: magic, three lengths, the digest.
const FIXED: usize = 8 + 3 * 8 + 32;

/// The compressed file of a checkpoint directory's `model.safetensors`.
pub fn compressed_path(dir: &Path) -> PathBuf {
    dir.join("model.safetensors.compressed")
}

/// Compresses the safetensors file `src` into `dst` (written atomically), the high plane at
/// zstd level [`LEVEL`].
pub fn compress(src: &Path, dst: &Path) -> Result<(), EngineError> {
    let file = std::fs::read(src).map_err(EngineError::io(src))?;
    let prefix = safetensors_prefix(&file).map_err(|reason| EngineError::Compressed {
        path: src.to_path_buf(),
        reason,
    })?;
    let data = &file[prefix..];
    let high: Vec<u8> = data.iter().skip(1).step_by(2).copied().collect();
    let low: Vec<u8> = data.iter().step_by(2).copied().collect();
    let frame = zstd::bulk::compress(&high, LEVEL).map_err(EngineError::io(src))?;
    let mut out = Vec::with_capacity(FIXED + prefix + frame.len() + low.len());
    out.extend_from_slice(MAGIC);
    for n in [file.len(), prefix, frame.len()] {
        out.extend_from_slice(&(n as u64).to_le_bytes());
    }
    out.extend_from_slice(&Sha256::digest(&file));
    out.extend_from_slice(&file[..prefix]);
    out.extend_from_slice(&frame);
    out.extend_from_slice(&low);
    write_atomically(dst, &out)
}

/// When `dir` has a compressed checkpoint but no `model.safetensors`, decompresses it there
/// (atomically: concurrent callers each write their own temporary file and the same bytes win).
/// Does nothing otherwise.
pub fn ensure_decompressed(dir: &Path) -> Result<(), EngineError> {
    let (compressed, plain) = (compressed_path(dir), dir.join("model.safetensors"));
    if plain.exists() || !compressed.is_file() {
        return Ok(());
    }
    let bytes = std::fs::read(&compressed).map_err(EngineError::io(&compressed))?;
    let file = decompress(&bytes).map_err(|reason| EngineError::Compressed {
        path: compressed.clone(),
        reason,
    })?;
    write_atomically(&plain, &file)
}

/// The original file of compressed `bytes`, or why they are not a compressed checkpoint.
pub fn decompress(bytes: &[u8]) -> Result<Vec<u8>, String> {
    if bytes.len() < FIXED || &bytes[..8] != MAGIC {
        return Err(format!(
            "not a compressed checkpoint (it does not start with {:?})",
            std::str::from_utf8(MAGIC).unwrap_or_default()
        ));
    }
    let field = |i: usize| {
        let at = 8 + 8 * i;
        u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
    };
    let (file_len, prefix, frame_len) = (field(0), field(1), field(2));
    let digest = &bytes[32..FIXED];
    // Every length must account for the compressed file exactly, which bounds what is allocated
    // by the file's own size.
    let data = file_len
        .checked_sub(prefix)
        .ok_or_else(|| format!("header length {prefix} exceeds the file length {file_len}"))?;
    let (high_len, low_len) = (data / 2, data - data / 2);
    let expected = [FIXED as u64, prefix, frame_len, low_len]
        .iter()
        .try_fold(0u64, |a, &b| a.checked_add(b));
    if expected != Some(bytes.len() as u64) {
        return Err(format!(
            "its lengths (file {file_len}, header {prefix}, compressed {frame_len}) do not add up to its {} bytes (truncated?)",
            bytes.len()
        ));
    }
    let (prefix, frame_len) = (prefix as usize, frame_len as usize);
    let (head, rest) = bytes[FIXED..].split_at(prefix);
    let (frame, low) = rest.split_at(frame_len);
    let mut high = Vec::with_capacity(high_len as usize);
    let mut decoder = zstd::stream::read::Decoder::with_buffer(frame)
        .map_err(|e| format!("the high-byte plane is not a zstd frame: {e}"))?;
    (&mut decoder)
        .take(high_len + 1)
        .read_to_end(&mut high)
        .map_err(|e| format!("the high-byte plane does not decompress: {e}"))?;
    if high.len() as u64 != high_len {
        return Err(format!(
            "the high-byte plane holds {} bytes, not {high_len}",
            high.len()
        ));
    }
    let mut file = Vec::with_capacity(file_len as usize);
    file.extend_from_slice(head);
    for (i, &lo) in low.iter().enumerate() {
        file.push(lo);
        if let Some(&hi) = high.get(i) {
            file.push(hi);
        }
    }
    if Sha256::digest(&file).as_slice() != digest {
        return Err(
            "the decompressed bytes do not have the SHA-256 recorded when compressing".into(),
        );
    }
    Ok(file)
}

/// The length of a safetensors file's header (8 + its JSON), checked against the file.
fn safetensors_prefix(file: &[u8]) -> Result<usize, String> {
    let n = file
        .get(..8)
        .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
        .ok_or("shorter than a safetensors header")?;
    match 8u64.checked_add(n) {
        Some(end) if end <= file.len() as u64 => Ok(end as usize),
        _ => Err(format!(
            "its header length {n} does not fit its {} bytes",
            file.len()
        )),
    }
}

/// Writes `bytes` to a temporary file beside `path` (named for this process and call, so that
/// concurrent writers never share one) and renames it over `path`.
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), EngineError> {
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, Ordering::Relaxed);
    let tmp = path.with_extension(format!("tmp-{}-{call}", std::process::id()));
    std::fs::write(&tmp, bytes).map_err(EngineError::io(&tmp))?;
    std::fs::rename(&tmp, path).map_err(EngineError::io(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small safetensors file: one BF16 tensor of `n` values (odd data lengths too).
    fn safetensors(n: usize, extra: usize) -> Vec<u8> {
        let header = format!(
            r#"{{"w":{{"dtype":"BF16","shape":[{n}],"data_offsets":[0,{}]}}}}"#,
            2 * n + extra
        );
        let mut file = (header.len() as u64).to_le_bytes().to_vec();
        file.extend_from_slice(header.as_bytes());
        file.extend((0..2 * n + extra).map(|i| (i * 37 % 251) as u8));
        file
    }

    /// `file` compressed, through files in a directory of its own (tests run in parallel).
    fn compressed(file: &[u8]) -> Vec<u8> {
        static CALLS: AtomicUsize = AtomicUsize::new(0);
        let call = CALLS.fetch_add(1, Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("specfit-compress-{}-{call}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (src, dst) = (dir.join("m.safetensors"), dir.join("m.compressed"));
        std::fs::write(&src, file).unwrap();
        compress(&src, &dst).unwrap();
        let bytes = std::fs::read(&dst).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        bytes
    }

    #[test]
    fn a_compressed_file_decompresses_to_the_same_bytes() {
        for (n, extra) in [(0, 0), (1, 0), (1000, 0), (1000, 1), (3, 1)] {
            let file = safetensors(n, extra);
            assert_eq!(
                decompress(&compressed(&file)).unwrap(),
                file,
                "{n} values + {extra}"
            );
        }
    }

    #[test]
    fn a_damaged_compressed_file_is_an_error_naming_what_is_wrong() {
        let good = compressed(&safetensors(1000, 0));
        let err = |bytes: &[u8]| decompress(bytes).unwrap_err();
        assert!(err(b"SFZPLN0").contains("not a compressed checkpoint"));
        assert!(err(&good[..good.len() - 1]).contains("do not add up"));
        let mut huge = good.clone();
        huge[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(err(&huge).contains("do not add up"), "{}", err(&huge));
        let mut short = good.clone();
        short[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(err(&short).contains("exceeds"));
        // A flipped low-plane byte decompresses fine; the digest catches it.
        let mut flipped = good.clone();
        *flipped.last_mut().unwrap() ^= 1;
        assert!(err(&flipped).contains("SHA-256"));
        // A damaged frame.
        let mut frame = good.clone();
        let at = FIXED + safetensors_prefix(&safetensors(1000, 0)).unwrap();
        frame[at..at + 4].copy_from_slice(b"junk");
        assert!(err(&frame).contains("high-byte plane"), "{}", err(&frame));
    }

    #[test]
    fn a_directory_with_only_the_compressed_file_is_decompressed_once_in_place() {
        let dir = std::env::temp_dir().join(format!("specfit-decompress-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = safetensors(500, 0);
        std::fs::write(dir.join("model.safetensors"), &file).unwrap();
        compress(&dir.join("model.safetensors"), &compressed_path(&dir)).unwrap();
        std::fs::remove_file(dir.join("model.safetensors")).unwrap();
        ensure_decompressed(&dir).unwrap();
        assert_eq!(std::fs::read(dir.join("model.safetensors")).unwrap(), file);
        // An existing model.safetensors is left alone.
        std::fs::write(dir.join("model.safetensors"), b"kept").unwrap();
        ensure_decompressed(&dir).unwrap();
        assert_eq!(
            std::fs::read(dir.join("model.safetensors")).unwrap(),
            b"kept"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
