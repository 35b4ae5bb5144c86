//! The engine against `transformers`: every fixture under `fixtures/qwen3moe/` (made by
//! `tools/fixtures/make_fixtures.py`) must give logits within 1e-4 relative of the reference,
//! the same expert sets per layer and token, and the same greedy continuation. Then the
//! offload and invariance properties on the same checkpoints: any slot count and the cleared
//! cache equal all-resident bit for bit, a tree-masked forward equals the same tokens decoded one
//! by one, and KV truncate/compact followed by more decoding equals a fresh run.

mod common;
use common::*;

use std::path::{Path, PathBuf};

use serde_json::Value;
use specfit_engine::{Batch, CacheMode, ExpertCache, Logits, Mask, Qwen3Moe, Tier, WeightDtype};

fn fixture_dirs() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/qwen3moe");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("reference.json").exists())
        .collect();
    dirs.sort();
    assert!(dirs.len() >= 7, "fixtures missing under {}", root.display());
    dirs
}

/// The fixture directory named `name`.
fn fixture(name: &str) -> PathBuf {
    let dirs = fixture_dirs();
    dirs.into_iter()
        .find(|d| d.ends_with(name))
        .unwrap_or_else(|| panic!("no fixture {name}"))
}

fn reference(dir: &Path) -> Value {
    json_file(&dir.join("reference.json"))
}

fn load(dir: &Path, slots: usize, mode: CacheMode) -> (Qwen3Moe, ExpertCache) {
    let (model, store) =
        Qwen3Moe::load(dir, None).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let cfg = model.config();
    let layers = cfg.moe_layers().len();
    let experts = cfg.num_experts;
    let cache = ExpertCache::new(std::sync::Arc::new(store), layers, experts, slots, mode).unwrap();
    (model, cache)
}

/// Prefill then `n` greedy steps; returns the tokens and every forward's output logits.
fn greedy(
    model: &Qwen3Moe,
    cache: &mut ExpertCache,
    prompt: &[u32],
    n: usize,
) -> (Vec<u32>, Vec<Vec<f32>>) {
    let (out, mut kv) = forward_fresh(
        model,
        cache,
        &Batch::causal(prompt).with_logits(Logits::Last),
    );
    let mut tokens = vec![out.argmax(0)];
    let mut logits = vec![out.logits.clone()];
    while tokens.len() < n {
        let last = [*tokens.last().unwrap()];
        let out = model
            .forward(&Batch::causal(&last), &mut kv, cache)
            .unwrap();
        tokens.push(out.argmax(0));
        logits.push(out.logits.clone());
    }
    (tokens, logits)
}

#[test]
fn logits_routes_and_greedy_tokens_match_transformers_on_every_fixture() {
    for dir in fixture_dirs() {
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        let r = reference(&dir);
        let (model, mut cache) = load(&dir, 64, CacheMode::Lru);
        let prompt = ints(&r["input_ids"]);
        let (out, _) = forward_fresh(&model, &mut cache, &Batch::causal(&prompt));
        let err = rel_err(&out.logits, &floats(&r["logits"]));
        eprintln!("{name}: logits relative error {err:e}");
        assert!(err <= 1e-4, "{name}: logits relative error {err:e}");
        let want_routes = r["routes"]["topk_ids_sorted"].as_array().unwrap();
        for (layer, want) in want_routes.iter().enumerate() {
            match (&out.routes[layer], want) {
                (None, Value::Null) => {}
                (Some(got), Value::Array(tokens)) => {
                    for (t, w) in tokens.iter().enumerate() {
                        let mut g = got[t].clone();
                        g.sort_unstable();
                        assert_eq!(g, ints(w), "{name}: layer {layer} token {t}");
                    }
                }
                (g, w) => panic!("{name}: layer {layer} dense/sparse mismatch: {g:?} vs {w}"),
            }
        }
        let n = r["greedy"]["n"].as_u64().unwrap() as usize;
        let (tokens, step_logits) = greedy(&model, &mut cache, &prompt, n);
        assert_eq!(
            tokens,
            ints(&r["greedy"]["tokens"]),
            "{name}: greedy tokens"
        );
        let want_steps = r["greedy"]["step_logits"].as_array().unwrap();
        for (s, (got, want)) in step_logits.iter().zip(want_steps).enumerate() {
            let err = rel_err(got, &floats(want));
            assert!(
                err <= 1e-4,
                "{name}: greedy step {s} logits relative error {err:e}"
            );
        }
    }
}

#[test]
fn hidden_state_taps_match_the_residual_stream_entering_each_layer() {
    let dir = fixture("eagle_target");
    let r = reference(&dir);
    let (model, mut cache) = load(&dir, 4, CacheMode::Lru);
    let prompt = ints(&r["input_ids"]);
    let taps = [2usize, 4, 5];
    let mut kv = model.new_kv_cache();
    let batch = Batch::causal(&prompt).with_taps(&taps);
    let out = model.forward(&batch, &mut kv, &mut cache).unwrap();
    for (slot, &layer) in taps.iter().enumerate() {
        let err = rel_err(&out.taps[slot], &floats(&r["layer_inputs"][layer]));
        assert!(err <= 1e-4, "layer {layer}: {err:e}");
    }
}

#[test]
fn offloaded_experts_at_any_slot_count_equal_all_resident_bit_for_bit() {
    for dir in fixture_dirs() {
        let r = reference(&dir);
        let prompt = ints(&r["input_ids"]);
        let (model, mut full) = load(&dir, usize::MAX, CacheMode::Lru);
        let (want_tokens, want_logits) = greedy(&model, &mut full, &prompt, 6);
        let experts = model.config().num_experts;
        for (slots, mode) in [
            (1, CacheMode::Lru),
            (2, CacheMode::Lru),
            (experts / 2, CacheMode::Lru),
            (experts, CacheMode::NoCache),
        ] {
            let (_, mut cache) = load(&dir, slots.max(1), mode);
            let (tokens, logits) = greedy(&model, &mut cache, &prompt, 6);
            assert_eq!(
                tokens,
                want_tokens,
                "{} slots {slots} {mode:?}",
                dir.display()
            );
            for (a, b) in logits.iter().zip(&want_logits) {
                assert_eq!(bits(a), bits(b), "{} slots {slots} {mode:?}", dir.display());
            }
            cache.verify_slots().unwrap();
            if slots < experts || mode == CacheMode::NoCache {
                assert!(cache.stats().total.misses > full.stats().total.misses);
            }
        }
    }
}

#[test]
fn the_cleared_cache_copies_every_routed_expert_of_every_forward() {
    let dir = fixture("topk_norm");
    // With one slot per layer the forward needs more experts than slots: each is still read once.
    for slots in [1, 8] {
        let (model, mut cache) = load(&dir, slots, CacheMode::NoCache);
        let mut kv = model.new_kv_cache();
        let tokens = [1u32, 5, 9];
        let out = model
            .forward(&Batch::causal(&tokens), &mut kv, &mut cache)
            .unwrap();
        assert_eq!(out.copies.total.misses, out.demand(), "slots {slots}");
        assert_eq!(out.copies.total.hits, 0);
        let again = model
            .forward(&Batch::causal(&[7]), &mut kv, &mut cache)
            .unwrap();
        assert_eq!(again.copies.total.hits, 0);
        assert_eq!(
            again.copies.total.bytes_copied,
            again.copies.total.misses * cache.layout().bytes() as u64
        );
        cache.verify_slots().unwrap();
    }
}

/// One decode step's logit bits and, per layer, the token's experts (`None` for dense layers).
type Step = (Vec<u32>, Vec<Option<Vec<u32>>>);

/// Decodes `path` one token at a time after `prompt` and returns each step's logits and routes.
fn sequential(
    model: &Qwen3Moe,
    cache: &mut ExpertCache,
    prompt: &[u32],
    path: &[u32],
) -> Vec<Step> {
    let mut kv = model.new_kv_cache();
    model
        .forward(
            &Batch::causal(prompt).with_logits(Logits::None),
            &mut kv,
            cache,
        )
        .unwrap();
    path.iter()
        .map(|&tok| {
            let out = model
                .forward(&Batch::causal(&[tok]), &mut kv, cache)
                .unwrap();
            let routes = out
                .routes
                .iter()
                .map(|l| l.as_ref().map(|r| r[0].clone()))
                .collect();
            (bits(&out.logits), routes)
        })
        .collect()
}

#[test]
fn a_tree_masked_forward_equals_the_same_tokens_decoded_one_by_one() {
    for dir in fixture_dirs() {
        let r = reference(&dir);
        let prompt = ints(&r["input_ids"]);
        let (model, mut cache) = load(&dir, 3, CacheMode::Lru);
        // A tree of 7 nodes: two branches under the root, a chain under the first.
        let tokens = [17u32, 200, 33, 91, 5, 250, 64];
        let parents = [None, None, Some(0), Some(2), Some(2), Some(1), Some(4)];
        let depth = |mut i: usize| {
            let mut d = 1;
            while let Some(p) = parents[i] {
                d += 1;
                i = p;
            }
            d
        };
        let mut kv = prefilled(&model, &mut cache, &prompt);
        let positions: Vec<usize> = (0..tokens.len())
            .map(|i| prompt.len() - 1 + depth(i))
            .collect();
        let batch = Batch {
            tokens: &tokens,
            positions: Some(&positions),
            mask: Mask::Tree(&parents),
            taps: &[],
            logits: Logits::All,
        };
        let tree = model.forward(&batch, &mut kv, &mut cache).unwrap();
        for leaf in 0..tokens.len() {
            let mut path = vec![leaf];
            while let Some(p) = parents[*path.last().unwrap()] {
                path.push(p);
            }
            path.reverse();
            let seq = sequential(
                &model,
                &mut cache,
                &prompt,
                &path.iter().map(|&i| tokens[i]).collect::<Vec<_>>(),
            );
            let (logits, routes) = seq.last().unwrap();
            assert_eq!(
                &bits(tree.row(leaf)),
                logits,
                "{}: node {leaf}",
                dir.display()
            );
            let tree_routes: Vec<Option<Vec<u32>>> = tree
                .routes
                .iter()
                .map(|l| l.as_ref().map(|r| r[leaf].clone()))
                .collect();
            assert_eq!(&tree_routes, routes, "{}: node {leaf}", dir.display());
        }
    }
}

#[test]
fn truncating_or_compacting_the_kv_cache_then_continuing_equals_a_fresh_run() {
    let dir = fixture("head_dim");
    let (model, mut cache) = load(&dir, 8, CacheMode::Lru);
    let prompt = [1u32, 40, 41, 42];
    let fresh = |cache: &mut ExpertCache, seq: &[u32], next: u32| {
        let mut kv = model.new_kv_cache();
        model.forward(&Batch::causal(seq), &mut kv, cache).unwrap();
        bits(
            &model
                .forward(&Batch::causal(&[next]), &mut kv, cache)
                .unwrap()
                .logits,
        )
    };
    // Truncate: run prompt + 3 extra, cut back to the prompt, continue.
    let mut kv = model.new_kv_cache();
    model
        .forward(
            &Batch::causal(&[1, 40, 41, 42, 7, 8, 9]),
            &mut kv,
            &mut cache,
        )
        .unwrap();
    kv.truncate(4).unwrap();
    let got = bits(
        &model
            .forward(&Batch::causal(&[100]), &mut kv, &mut cache)
            .unwrap()
            .logits,
    );
    assert_eq!(got, fresh(&mut cache, &prompt, 100));
    // Compact: verify a tree, keep the accepted path (tokens 0 and 2), continue.
    let mut kv = model.new_kv_cache();
    model
        .forward(&Batch::causal(&prompt), &mut kv, &mut cache)
        .unwrap();
    let tokens = [50u32, 60, 70];
    let parents = [None, None, Some(0)];
    let positions = [4usize, 4, 5];
    model
        .forward(
            &Batch {
                tokens: &tokens,
                positions: Some(&positions),
                mask: Mask::Tree(&parents),
                taps: &[],
                logits: Logits::All,
            },
            &mut kv,
            &mut cache,
        )
        .unwrap();
    kv.compact(4, &[4, 6]).unwrap();
    assert_eq!(kv.len(), 6);
    let got = bits(
        &model
            .forward(&Batch::causal(&[100]), &mut kv, &mut cache)
            .unwrap()
            .logits,
    );
    assert_eq!(got, fresh(&mut cache, &[1, 40, 41, 42, 50, 70], 100));
    let refused = |r: Result<(), specfit_engine::EngineError>| {
        matches!(r, Err(specfit_engine::EngineError::BadCacheEdit { .. }))
    };
    assert!(refused(kv.compact(0, &[3, 2])));
    assert!(refused(kv.truncate(99)));
}

#[test]
fn bad_checkpoints_and_inputs_give_clear_errors() {
    let dir = fixture("topk_norm");
    let (model, mut cache) = load(&dir, 8, CacheMode::Lru);
    let mut kv = model.new_kv_cache();
    let err = model
        .forward(&Batch::causal(&[1, 9999]), &mut kv, &mut cache)
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "token id 9999 at position 1 is outside the vocabulary (vocab_size = 256)"
    );
    // A truncated copy of the weights.
    let tmp = temp_dir("bad-ckpt");
    std::fs::copy(dir.join("config.json"), tmp.join("config.json")).unwrap();
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    std::fs::write(tmp.join("model.safetensors"), &bytes[..bytes.len() / 2]).unwrap();
    let err = Qwen3Moe::load(&tmp, None).unwrap_err().to_string();
    assert!(err.contains("not a valid safetensors file"), "{err}");
    std::fs::write(tmp.join("model.safetensors"), b"garbage").unwrap();
    assert!(Qwen3Moe::load(&tmp, None)
        .unwrap_err()
        .to_string()
        .contains("not a valid safetensors file"));
    // A config that disagrees with the weights.
    std::fs::write(tmp.join("model.safetensors"), &bytes).unwrap();
    let cfg = std::fs::read_to_string(dir.join("config.json"))
        .unwrap()
        .replace("\"hidden_size\": 32", "\"hidden_size\": 48");
    std::fs::write(tmp.join("config.json"), cfg).unwrap();
    let err = Qwen3Moe::load(&tmp, None).unwrap_err().to_string();
    assert!(
        err.contains("32], config.json implies [") && err.contains("48]"),
        "{err}"
    );
    // An unknown architecture.
    let cfg = std::fs::read_to_string(dir.join("config.json"))
        .unwrap()
        .replace("Qwen3MoeForCausalLM", "LlamaForCausalLM");
    std::fs::write(tmp.join("config.json"), cfg).unwrap();
    assert!(Qwen3Moe::load(&tmp, None)
        .unwrap_err()
        .to_string()
        .contains("this engine runs Qwen3MoeForCausalLM"));
    std::fs::remove_dir_all(&tmp).unwrap();
}

#[test]
fn an_expert_file_of_an_older_format_is_not_current() {
    let tmp = temp_dir("old-format");
    let old = tmp.join("v1.specfit");
    let mut bytes = b"SPFTEXP\0".to_vec();
    bytes.extend_from_slice(&1u32.to_le_bytes());
    bytes.extend_from_slice(&[0u8; 64]);
    std::fs::write(&old, bytes).unwrap();
    assert!(!specfit_engine::experts::is_current_format(&old));
    assert!(!specfit_engine::experts::is_current_format(
        &tmp.join("missing")
    ));
}

#[test]
fn the_disk_tier_reads_the_same_experts_as_ram_bit_for_bit() {
    let tmp = temp_dir("disk-tier");
    for dir in fixture_dirs() {
        let file = tmp.join(format!(
            "{}.specfit",
            dir.file_name().unwrap().to_string_lossy()
        ));
        let report = specfit_engine::experts::convert(&dir, &file, None).unwrap();
        assert_eq!(report.bytes, std::fs::metadata(&file).unwrap().len());
        assert!(specfit_engine::experts::is_current_format(&file));
        let r = reference(&dir);
        let prompt = ints(&r["input_ids"]);
        let (model, mut ram) = load(&dir, usize::MAX, CacheMode::Lru);
        let (want_tokens, want_logits) = greedy(&model, &mut ram, &prompt, 5);
        for slots in [1usize, 3, usize::MAX] {
            let (_, mut disk) = specfit_engine::load_target(
                &dir,
                &Tier::Disk(file.clone()),
                slots,
                CacheMode::Lru,
                None,
            )
            .unwrap();
            assert!(disk.tier().starts_with("disk"));
            let (tokens, logits) = greedy(&model, &mut disk, &prompt, 5);
            assert_eq!(tokens, want_tokens, "{} slots {slots}", dir.display());
            for (a, b) in logits.iter().zip(&want_logits) {
                assert_eq!(bits(a), bits(b));
            }
            disk.verify_slots().unwrap();
            assert!(disk.stats().total.bytes_copied > 0);
        }
    }
    std::fs::remove_dir_all(&tmp).unwrap();
}

#[test]
fn disk_files_that_are_truncated_corrupt_or_from_another_model_are_rejected() {
    let tmp = temp_dir("disk-bad");
    let dirs = fixture_dirs();
    let a = dirs.iter().find(|d| d.ends_with("topk_norm")).unwrap();
    let b = dirs.iter().find(|d| d.ends_with("topk_raw")).unwrap();
    let file = tmp.join("a.specfit");
    specfit_engine::experts::convert(a, &file, None).unwrap();
    let open = |path: &Path, dir: &Path| {
        specfit_engine::load_target(
            dir,
            &Tier::Disk(path.to_path_buf()),
            4,
            CacheMode::Lru,
            None,
        )
        .unwrap_err()
        .to_string()
    };
    let err = open(&file, b);
    assert!(
        err.contains("made for") || err.contains("another checkpoint"),
        "{err}"
    );
    let bytes = std::fs::read(&file).unwrap();
    let cut = tmp.join("cut.specfit");
    std::fs::write(&cut, &bytes[..bytes.len() - 4096]).unwrap();
    assert!(open(&cut, a).contains("truncated"), "{}", open(&cut, a));
    let junk = tmp.join("junk.specfit");
    std::fs::write(&junk, b"definitely not experts").unwrap();
    assert!(open(&junk, a).contains("bad magic"));
    assert!(open(&tmp.join("missing.specfit"), a).contains("specfit convert"));
    std::fs::remove_dir_all(&tmp).unwrap();
}

#[test]
fn a_corrupt_block_in_an_expert_file_is_an_error_naming_its_layer_and_expert() {
    let tmp = temp_dir("disk-corrupt");
    let dir = fixture("topk_norm");
    let file = tmp.join("a.specfit");
    specfit_engine::experts::convert(&dir, &file, None).unwrap();
    let mut bytes = std::fs::read(&file).unwrap();
    let json_len = u32::from_le_bytes(bytes[12..16].try_into().unwrap()) as usize;
    let header: Value = serde_json::from_slice(&bytes[16..16 + json_len]).unwrap();
    let (data, stride) = (
        header["data_offset"].as_u64().unwrap() as usize,
        header["stride_bytes"].as_u64().unwrap() as usize,
    );
    let experts = header["experts"].as_u64().unwrap() as usize;
    // Random bytes inside block 11 (MoE layer 1, expert 3), as a failing disk might leave them.
    let at = data + (experts + 3) * stride + 100;
    let mut state = 1u64;
    for b in &mut bytes[at..at + 128] {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1);
        *b ^= (state >> 56) as u8 | 1;
    }
    std::fs::write(&file, &bytes).unwrap();
    let (model, mut cache) =
        specfit_engine::load_target(&dir, &Tier::Disk(file.clone()), 2, CacheMode::Lru, None)
            .unwrap();
    let errors = errors_reading_every_expert(&model, &mut cache);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].contains("MoE layer 1 expert 3 is corrupt"),
        "{}",
        errors[0]
    );
    std::fs::remove_dir_all(&tmp).unwrap();
}

#[test]
fn bf16_storage_gives_the_bits_of_f32_storage_on_a_bf16_checkpoint_on_either_tier() {
    let dir = fixture("bf16");
    let r = reference(&dir);
    let prompt = ints(&r["input_ids"]);
    let run = |tier: &Tier, dtype| {
        let (model, mut cache) =
            specfit_engine::load_target(&dir, tier, 3, CacheMode::Lru, Some(dtype)).unwrap();
        assert_eq!(model.weight_dtype(), dtype);
        greedy(&model, &mut cache, &prompt, 5)
    };
    let (tok32, log32) = run(&Tier::Ram, WeightDtype::F32);
    let (tok16, log16) = run(&Tier::Ram, WeightDtype::Bf16);
    assert_eq!(tok16, tok32);
    for (a, b) in log16.iter().zip(&log32) {
        assert_eq!(bits(a), bits(b));
    }
    let tmp = temp_dir("bf16-disk");
    let file = tmp.join("bf16.specfit");
    let report = specfit_engine::experts::convert(&dir, &file, None).unwrap();
    assert_eq!(report.dtype, WeightDtype::Bf16);
    let (tok_disk, log_disk) = run(&Tier::Disk(file.clone()), WeightDtype::Bf16);
    assert_eq!(tok_disk, tok32);
    assert_eq!(bits(&log_disk[4]), bits(&log32[4]));
    let err = specfit_engine::load_target(
        &dir,
        &Tier::Disk(file),
        3,
        CacheMode::Lru,
        Some(WeightDtype::F32),
    )
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("stores bf16 experts but the model is loaded with f32 weights"),
        "{err}"
    );
    std::fs::remove_dir_all(&tmp).unwrap();
}

#[test]
fn an_f32_checkpoint_stored_as_bf16_stays_close_to_the_reference() {
    let dir = fixture("topk_norm");
    let r = reference(&dir);
    let (model, mut cache) =
        specfit_engine::load_target(&dir, &Tier::Ram, 8, CacheMode::Lru, Some(WeightDtype::Bf16))
            .unwrap();
    let (out, _) = forward_fresh(&model, &mut cache, &Batch::causal(&ints(&r["input_ids"])));
    let err = rel_err(&out.logits, &floats(&r["logits"]));
    assert!(err < 5e-2, "bf16 rounding error {err}");
}

/// `src` copied to a fresh folder with the first float of tensor `name` set to NaN.
/// A copy of the checkpoint folder `src` in temp folder `tag`.
fn copy_of(src: &Path, tag: &str) -> PathBuf {
    let dir = temp_dir(tag);
    for f in std::fs::read_dir(src).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, dir.join(f.file_name().unwrap())).unwrap();
    }
    dir
}

/// A copy of the checkpoint in `src` (under temp folder `tag`) with tensor `name`'s bytes
/// edited by `edit`.
fn patched(src: &Path, name: &str, tag: &str, edit: impl FnOnce(&mut [u8])) -> PathBuf {
    let dir = copy_of(src, tag);
    let path = dir.join("model.safetensors");
    let mut bytes = std::fs::read(&path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let offsets = &header[name]["data_offsets"];
    let (start, end) = (offsets[0].as_u64().unwrap(), offsets[1].as_u64().unwrap());
    edit(&mut bytes[8 + n + start as usize..8 + n + end as usize]);
    std::fs::write(&path, bytes).unwrap();
    dir
}

#[test]
fn activations_that_overflow_stop_the_forward_naming_the_layer_and_block() {
    // Every weight finite (so the load accepts them), but a norm of f32::MAX overflows layer 1's
    // attention input.
    let norm = "model.layers.1.input_layernorm.weight";
    let dir = patched(&fixture("eagle_target"), norm, "overflow", |b| {
        b.chunks_exact_mut(4)
            .for_each(|v| v.copy_from_slice(&f32::MAX.to_le_bytes()))
    });
    let (model, mut cache) =
        specfit_engine::load_target(&dir, &Tier::Ram, usize::MAX, CacheMode::Lru, None).unwrap();
    let mut kv = model.new_kv_cache();
    let err = model
        .forward(&Batch::causal(&[1, 243, 56]), &mut kv, &mut cache)
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("decoder layer 1") && text.contains("self_attn"),
        "{text}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn an_expert_file_made_before_its_checkpoint_changed_is_refused_saying_so() {
    let model = copy_of(&fixture("topk_norm"), "disk-stale");
    let file = model.join("experts.specfit");
    specfit_engine::experts::convert(&model, &file, None).unwrap();
    let load = || {
        specfit_engine::load_target(&model, &Tier::Disk(file.clone()), 4, CacheMode::Lru, None)
            .map(|_| ())
    };
    load().unwrap();
    assert_eq!(
        specfit_engine::experts::staleness(&file, &model).unwrap(),
        None
    );
    // The checkpoint rewritten in place (same bytes here, as a re-download would be): new time.
    let weights = std::fs::File::options()
        .write(true)
        .open(model.join("model.safetensors"))
        .unwrap();
    let later = std::time::SystemTime::now() + std::time::Duration::from_secs(60);
    weights.set_modified(later).unwrap();
    let err = load().unwrap_err().to_string();
    assert!(
        err.contains("it was made from model.safetensors (")
            && err.contains("the checkpoint changed since")
            && err.contains("rerun `specfit convert`"),
        "{err}"
    );
    let why = specfit_engine::experts::staleness(&file, &model)
        .unwrap()
        .unwrap();
    assert!(why.contains("the checkpoint changed since"), "{why}");
    // Converted again, it serves the checkpoint as it is now.
    specfit_engine::experts::convert(&model, &file, None).unwrap();
    load().unwrap();
    std::fs::remove_dir_all(&model).unwrap();
}

#[test]
fn a_nan_or_infinity_in_any_safetensors_tensor_is_refused_at_load_naming_it() {
    // An f32 checkpoint (NaN in an attention weight) and a bf16 one (infinity in an expert, which
    // the RAM store keeps in bf16, bit for bit); each in the third element.
    for (fixture_name, tensor, bad) in [
        (
            "topk_norm",
            "model.layers.1.self_attn.k_proj.weight",
            f32::NAN.to_le_bytes().to_vec(),
        ),
        (
            "bf16",
            "model.layers.0.mlp.experts.3.up_proj.weight",
            vec![0x80, 0x7f],
        ),
    ] {
        let tag = format!("nan-{fixture_name}");
        let dir = patched(&fixture(fixture_name), tensor, &tag, |b| {
            b[2 * bad.len()..3 * bad.len()].copy_from_slice(&bad)
        });
        match specfit_engine::load_target(&dir, &Tier::Ram, 4, CacheMode::Lru, None) {
            Err(specfit_engine::EngineError::NonFiniteTensor { tensor: t, at, .. }) => {
                assert_eq!((t.as_str(), at), (tensor, 2), "{fixture_name}")
            }
            other => panic!("{fixture_name}: {:?}", other.err()),
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
