//! The kept fuzz inputs, replayed: every seed and every input `cargo fuzz` kept (corpus) or
//! found failing once (regressions) runs through its target without a panic. The model seeds
//! must load and decode, so that fuzzing starts from inputs that reach the whole loader.

use std::path::Path;

use specfit_engine::{load_target, Batch, CacheMode, Tier, Tokenizer};
use specfit_fuzz::seeds::{self, corpus_dir};
use specfit_fuzz::TARGETS;

fn files(dir: &Path) -> Vec<std::path::PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<_> = entries
        .map(|e| e.expect("a readable folder").path())
        .filter(|p| p.is_file())
        .collect();
    out.sort();
    out
}

#[test]
fn the_committed_seeds_are_what_the_seed_writer_writes() {
    for seed in seeds::all() {
        let path = corpus_dir(seed.target).join(&seed.name);
        let kept = std::fs::read(&path).unwrap_or_else(|e| {
            panic!(
                "{}: {e}; run `cargo run -p specfit-fuzz --example write_seeds`",
                path.display()
            )
        });
        assert!(
            kept == seed.bytes,
            "{} differs from what seeds::all() makes; run `cargo run -p specfit-fuzz --example write_seeds`",
            path.display()
        );
    }
}

#[test]
fn every_target_has_seeds() {
    for (name, _) in TARGETS {
        let n = seeds::all().iter().filter(|s| s.target == name).count();
        assert!(n > 0, "no seed for {name}");
    }
}

#[test]
fn the_model_seeds_load_and_run_a_forward() {
    let dir = scratch("seeds");
    let st = dir.join("tiny");
    std::fs::create_dir_all(&st).unwrap();
    std::fs::write(st.join("config.json"), seeds::tiny_config_json()).unwrap();
    std::fs::write(st.join("model.safetensors"), seeds::tiny_safetensors()).unwrap();
    let with = dir.join("tiny.gguf");
    std::fs::write(&with, seeds::tiny_gguf(true)).unwrap();
    let without = dir.join("tiny-no-tokenizer.gguf");
    std::fs::write(&without, seeds::tiny_gguf(false)).unwrap();
    let mut logits = Vec::new();
    for path in [&st, &with, &without] {
        let (model, mut cache) = load_target(path, &Tier::Ram, 2, CacheMode::Lru, None)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let mut kv = model.new_kv_cache();
        let out = model
            .forward(&Batch::causal(&[1, 2]), &mut kv, &mut cache)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let vocab = model.config().vocab_size;
        logits.push(out.logits[vocab..2 * vocab].to_vec());
    }
    // The safetensors seed and the GGUF seed share every dense tensor but not the experts.
    assert_eq!(logits[1], logits[2], "the tokenizer changes no weight");
    let tokenizer = Tokenizer::from_gguf(&with).expect("the cut tokenizer reads back");
    assert!(tokenizer.token_id("<|im_end|>").is_some());
    assert!(Tokenizer::from_gguf(&without).is_err());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn every_kept_input_runs_through_its_target() {
    let mut ran = 0;
    for (name, target) in TARGETS {
        let regressions = seeds::repo().join("fuzz/regressions").join(name);
        for path in files(&corpus_dir(name))
            .into_iter()
            .chain(files(&regressions))
        {
            let bytes = std::fs::read(&path).unwrap();
            target(&bytes);
            ran += 1;
        }
    }
    assert!(ran >= seeds::all().len(), "only {ran} inputs ran");
}

#[test]
fn a_gguf_claiming_four_billion_layers_is_refused_naming_the_key() {
    let mut bytes = seeds::tiny_gguf(false);
    let key = b"qwen3moe.block_count";
    let at = bytes
        .windows(key.len())
        .position(|w| w == key)
        .expect("the key is in the file")
        + key.len();
    // After the key: the value's type (u32, 4 bytes) and the value (u32).
    bytes[at + 4..at + 8].copy_from_slice(&u32::MAX.to_le_bytes());
    let dir = scratch("layers");
    let path = dir.join("huge.gguf");
    std::fs::write(&path, &bytes).unwrap();
    let err = specfit_engine::Qwen3MoeConfig::load(&path)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("qwen3moe.block_count") && err.contains("4294967295"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_tensor_whose_data_would_end_past_two_to_the_64_is_refused() {
    // Found by the gguf target: offset + size wrapped around and passed the bounds check.
    let path = seeds::repo().join("fuzz/regressions/gguf/tensor-end-past-u64.gguf");
    let bytes = std::fs::read(path).unwrap();
    let err = specfit_gguf::Gguf::parse(&bytes).unwrap_err().to_string();
    assert!(err.contains("the data of tensor"), "{err}");
}

/// This test's folder under cargo's `target/tmp`, emptied first (so runs neither see nor pile up
/// each other's files).
fn scratch(tag: &str) -> std::path::PathBuf {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("specfit-fuzz-{tag}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
