//! A GGUF file's checksum sidecar: made on first use from bytes that are all finite, covering
//! every tensor; later loads refuse a corrupt non-expert tensor at once and name it, corrupt
//! experts when they are read; a file that changed gets new checksums, saying why.

mod common;
use common::*;

use std::path::{Path, PathBuf};

use specfit_engine::gguf::ensure_checksums;
use specfit_engine::{load_target, CacheMode, EngineError, Tier};
use specfit_gguf::GgufFile;

/// A copy of the tiny Q4_K_M fixture in its own folder (no sidecar yet).
fn fresh_copy(tag: &str) -> (PathBuf, PathBuf) {
    let tmp = temp_dir(tag);
    let path = tmp.join("model.gguf");
    std::fs::copy(root().join("fixtures/gguf/tiny-q4_k_m.gguf"), &path).unwrap();
    (tmp, path)
}

/// Where tensor `name`'s data starts in the file, and its bytes per expert (whole size when not
/// a stack).
fn locate(path: &Path, name: &str) -> (usize, u64) {
    let file = GgufFile::open(path).unwrap();
    let info = file.header().tensor(name).unwrap().clone();
    let per = info.size / info.dims.get(2).copied().unwrap_or(1);
    (file.absolute_offset(&info) as usize, per)
}

/// Rewrites `path` with `edit` applied, keeping its modification time (as bit rot would).
fn corrupt_in_place(path: &Path, edit: impl FnOnce(&mut [u8])) {
    let modified = std::fs::metadata(path).unwrap().modified().unwrap();
    let mut bytes = std::fs::read(path).unwrap();
    edit(&mut bytes);
    std::fs::write(path, &bytes).unwrap();
    let file = std::fs::File::options().write(true).open(path).unwrap();
    file.set_modified(modified).unwrap();
}

fn ram(path: &Path) -> Result<(), EngineError> {
    load_target(path, &Tier::Ram, usize::MAX, CacheMode::Lru, None).map(|_| ())
}

fn disk(
    path: &Path,
) -> Result<(specfit_engine::Qwen3Moe, specfit_engine::ExpertCache), EngineError> {
    load_target(
        path,
        &Tier::Disk(PathBuf::from("unused")),
        2,
        CacheMode::Lru,
        None,
    )
}

#[test]
fn a_corrupt_expert_in_a_gguf_is_caught_by_the_checksum_sidecar_and_named() {
    let (tmp, path) = fresh_copy("gguf-corrupt-expert");
    drop(disk(&path).unwrap());
    assert!(
        tmp.join("model.specfit-checksums.json").exists(),
        "the first use writes the sidecar"
    );
    // Flip bytes inside expert 3 of layer 1's up stack.
    let (start, per) = locate(&path, "blk.1.ffn_up_exps.weight");
    let at = start + 3 * per as usize + 10;
    corrupt_in_place(&path, |b| {
        b[at..at + 16].iter_mut().for_each(|x| *x ^= 0x5a)
    });
    // Streamed into slots, and used in place from the mapped file: caught either way.
    let mapped = || load_target(&path, &Tier::Ram, usize::MAX, CacheMode::Lru, None);
    for (model, mut cache) in [disk(&path).unwrap(), mapped().unwrap()] {
        let errors = errors_reading_every_expert(&model, &mut cache);
        assert_eq!(errors.len(), 1, "{} {errors:?}", cache.tier());
        assert!(
            errors[0].contains("MoE layer 1 expert 3 (up) is corrupt"),
            "{}",
            errors[0]
        );
    }
    std::fs::remove_dir_all(&tmp).unwrap();
}

#[test]
fn a_corrupt_non_expert_tensor_is_refused_at_load_naming_it() {
    let (tmp, path) = fresh_copy("gguf-corrupt-dense");
    ram(&path).unwrap();
    let (start, _) = locate(&path, "blk.0.attn_k.weight");
    corrupt_in_place(&path, |b| b[start + 5] ^= 0x01);
    for load in [ram(&path), disk(&path).map(|_| ())] {
        match load {
            Err(EngineError::CorruptTensor { tensor, .. }) => {
                assert_eq!(tensor, "blk.0.attn_k.weight")
            }
            other => panic!("{:?}", other.err()),
        }
    }
    std::fs::remove_dir_all(&tmp).unwrap();
}

#[test]
fn a_nan_in_any_tensor_is_refused_at_first_use_naming_the_tensor() {
    // An F32 norm weight, and the f16 scale of a Q4_K expert block (expert 2).
    for (name, expert, bytes, want) in [
        (
            "output_norm.weight",
            0,
            f32::NAN.to_le_bytes().to_vec(),
            "output_norm.weight",
        ),
        (
            "blk.0.ffn_gate_exps.weight",
            2,
            vec![0x00, 0x7c],
            "blk.0.ffn_gate_exps.weight (expert 2)",
        ),
    ] {
        let (tmp, path) = fresh_copy("gguf-nan");
        let (start, per) = locate(&path, name);
        let at = start + expert * per as usize;
        let mut data = std::fs::read(&path).unwrap();
        data[at..at + bytes.len()].copy_from_slice(&bytes);
        std::fs::write(&path, &data).unwrap();
        match ram(&path) {
            Err(EngineError::NonFiniteTensor { tensor, at, .. }) => {
                assert_eq!((tensor.as_str(), at), (want, 0))
            }
            other => panic!("{name}: {:?}", other.err()),
        }
        assert!(
            !tmp.join("model.specfit-checksums.json").exists(),
            "no checksums of bad bytes"
        );
        std::fs::remove_dir_all(&tmp).unwrap();
    }
}

#[test]
fn a_file_that_changed_gets_new_checksums_and_a_notice_saying_why() {
    let (tmp, path) = fresh_copy("gguf-changed");
    let first = ensure_checksums(&path).unwrap().expect("none yet");
    assert_eq!(first.why, "it had no checksums yet");
    assert!(
        first
            .to_string()
            .contains("trusts these bytes as they are now"),
        "{first}"
    );
    assert!(
        ensure_checksums(&path).unwrap().is_none(),
        "the sidecar serves the file"
    );
    // A new modification time (the file rewritten by a converter, say) is a changed file.
    let file = std::fs::File::options().write(true).open(&path).unwrap();
    file.set_modified(std::time::SystemTime::now() + std::time::Duration::from_secs(5))
        .unwrap();
    let again = ensure_checksums(&path).unwrap().expect("the file changed");
    assert_eq!(again.why, "the file changed since its checksums were made");
    // A sidecar of the first format (experts only) is made again.
    let sidecar = tmp.join("model.specfit-checksums.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&sidecar).unwrap()).unwrap();
    v["format"] = "specfit-gguf-checksums/1".into();
    std::fs::write(&sidecar, v.to_string()).unwrap();
    let old = ensure_checksums(&path).unwrap().expect("an older format");
    assert_eq!(old.why, "its checksums were of an older format");
    ram(&path).unwrap();
    std::fs::remove_dir_all(&tmp).unwrap();
}
