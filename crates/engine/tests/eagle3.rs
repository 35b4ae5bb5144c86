//! The EAGLE-3 drafter against the PyTorch reference of `tools/fixtures/make_eagle3_fixture.py`:
//! logits and fed-back hidden states within 1e-4 relative, the same draft tokens, and the cached
//! next step; then the target's taps feeding it end to end, and drafters that do not fit.

mod common;
use common::*;

use specfit_engine::{Batch, DraftHidden, Eagle3, Logits, Qwen3Moe};

fn argmax(row: &[f32]) -> usize {
    specfit_engine::sampling::argmax(row) as usize
}

#[test]
fn the_drafter_matches_the_pytorch_reference_step_by_step() {
    let dir = drafter_dir();
    let r = json_file(&dir.join("reference.json"));
    let (target, _) = Qwen3Moe::load(&target_dir(), None).unwrap();
    let drafter = Eagle3::load(&dir, target.config()).unwrap();
    let pair = Pair::new(&target, &drafter);
    assert_eq!(drafter.taps(), &[2, 4, 5]);
    let tokens = ints(&r["input_ids"]);
    let features = floats(&r["target_hidden"]);
    let mut kv = drafter.new_kv_cache();
    let out = pair.draft(
        &Batch::causal(&tokens),
        DraftHidden::Target(&features),
        &mut kv,
    );
    let err = rel_err(&out.hidden, &floats(&r["hidden_out"]));
    assert!(err <= 1e-4, "hidden_out relative error {err:e}");
    let err = rel_err(&out.logits, &floats(&r["logits"]));
    assert!(err <= 1e-4, "logits relative error {err:e}");
    let drafts: Vec<u32> = (0..tokens.len())
        .map(|t| drafter.to_target(argmax(out.row(t))))
        .collect();
    assert_eq!(drafts, ints(&r["argmax_target_ids"]));
    // One more step: the last output fed back (no fc), attending to the cached positions.
    let step = &r["step"];
    let h = drafter.config().hidden_size;
    let last = &out.hidden[(tokens.len() - 1) * h..];
    let token = [step["input_id"].as_u64().unwrap() as u32];
    let pos = [step["position_id"].as_u64().unwrap() as usize];
    let next = pair.draft(
        &Batch::causal(&token).with_positions(&pos),
        DraftHidden::Own(last),
        &mut kv,
    );
    assert!(rel_err(&next.hidden, &floats(&step["hidden_out"])) <= 1e-4);
    assert!(rel_err(&next.logits, &floats(&step["logits"])) <= 1e-4);
    assert_eq!(
        drafter.to_target(argmax(next.row(0))),
        step["argmax_target_id"].as_u64().unwrap() as u32
    );
}

#[test]
fn the_targets_taps_feed_the_drafter_end_to_end() {
    let dir = drafter_dir();
    let r = json_file(&dir.join("reference.json"));
    let tdir = target_dir();
    let (target, store) = Qwen3Moe::load(&tdir, None).unwrap();
    let cfg = target.config().clone();
    let mut cache = specfit_engine::ExpertCache::new(
        std::sync::Arc::new(store),
        cfg.moe_layers().len(),
        cfg.num_experts,
        2,
        specfit_engine::CacheMode::Lru,
    )
    .unwrap();
    let drafter = Eagle3::load(&dir, &cfg).unwrap();
    let pair = Pair::new(&target, &drafter);
    let prompt = ints(&r["target_input_ids"]);
    let (out, _) = forward_fresh(
        &target,
        &mut cache,
        &Batch::causal(&prompt).with_taps(drafter.taps()),
    );
    let h = cfg.hidden_size;
    let features: Vec<f32> = (0..prompt.len())
        .flat_map(|t| {
            out.taps
                .iter()
                .flat_map(move |tap| tap[t * h..(t + 1) * h].iter().copied())
        })
        .collect();
    assert!(rel_err(&features, &floats(&r["target_hidden"])) <= 1e-4);
    let mut dkv = drafter.new_kv_cache();
    let d = pair.draft(
        &Batch::causal(&ints(&r["input_ids"])),
        DraftHidden::Target(&features),
        &mut dkv,
    );
    let drafts: Vec<u32> = (0..prompt.len())
        .map(|t| drafter.to_target(argmax(d.row(t))))
        .collect();
    assert_eq!(drafts, ints(&r["argmax_target_ids"]));
}

#[test]
fn drafters_that_do_not_fit_the_target_are_refused() {
    let dir = drafter_dir();
    let base = specfit_engine::Qwen3MoeConfig::load(&target_dir()).unwrap();
    let refuse = |cfg: &specfit_engine::Qwen3MoeConfig| match Eagle3::load(&dir, cfg) {
        Ok(_) => panic!("a drafter that does not fit was accepted"),
        Err(e) => e.to_string(),
    };
    let wider = specfit_engine::Qwen3MoeConfig {
        hidden_size: 48,
        ..base.clone()
    };
    let shallow = specfit_engine::Qwen3MoeConfig {
        num_hidden_layers: 2,
        ..base.clone()
    };
    for (cfg, says) in [
        (wider, "does not fit the target"),
        (shallow, "eagle_aux_hidden_state_layer_ids"),
    ] {
        let why = refuse(&cfg);
        assert!(why.contains(says), "{why}");
    }
    let tmp = temp_dir("eagle-bad");
    std::fs::copy(dir.join("model.safetensors"), tmp.join("model.safetensors")).unwrap();
    let cfg = std::fs::read_to_string(dir.join("config.json"))
        .unwrap()
        .replace("\"vocab_size\": 256", "\"vocab_size\": 300");
    std::fs::write(tmp.join("config.json"), cfg).unwrap();
    let err = match Eagle3::load(&tmp, &base) {
        Ok(_) => panic!("accepted"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("drafter vocab_size = 300 does not fit the target (vocab_size 256)"),
        "{err}"
    );
    std::fs::remove_dir_all(&tmp).unwrap();
}

#[test]
fn last_row_logits_alone_have_the_bits_of_the_full_forwards_last_row() {
    use specfit_engine::DraftHidden;
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let (target, _) = specfit_engine::load_target(
        &root.join("fixtures/qwen3moe/eagle_target"),
        &specfit_engine::Tier::Ram,
        usize::MAX,
        specfit_engine::CacheMode::Lru,
        None,
    )
    .unwrap();
    let drafter =
        specfit_engine::Eagle3::load(&root.join("fixtures/eagle3/tiny"), target.config()).unwrap();
    let pair = Pair::new(&target, &drafter);
    let tokens = [3u32, 17, 101, 9, 250];
    let width = 3 * target.config().hidden_size;
    let feats: Vec<f32> = (0..tokens.len() * width)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 40.0)
        .collect();
    let (mut a, mut b) = (drafter.new_kv_cache(), drafter.new_kv_cache());
    let all = pair.draft(&Batch::causal(&tokens), DraftHidden::Target(&feats), &mut a);
    let last = pair.draft(
        &Batch::causal(&tokens).with_logits(Logits::Last),
        DraftHidden::Target(&feats),
        &mut b,
    );
    assert_eq!(last.logits.len(), all.draft_vocab);
    assert_eq!(bits(last.row(0)), bits(all.row(tokens.len() - 1)));
    assert_eq!(bits(&last.hidden), bits(&all.hidden));
    assert_eq!(a.len(), b.len());
}

#[test]
fn a_drafter_quantized_at_load_drafts_what_the_stored_one_drafts_and_decoding_stays_lossless() {
    use specfit_engine::{load_target, CacheMode, DrafterDtype, Sampling, Tier};
    // The shipped pair: its drafter's matrices are whole Q8_0 and Q4_K blocks wide.
    let (target, mut cache) = load_target(
        &root().join("models/target"),
        &Tier::Ram,
        usize::MAX,
        CacheMode::Lru,
        None,
    )
    .unwrap();
    let dir = root().join("models/drafter");
    let load = |dtype| Eagle3::load_as(&dir, target.config(), dtype).unwrap();
    let native = load(DrafterDtype::Native);
    assert_eq!(native.dtype(), DrafterDtype::Native);
    // The drafter's forward over a prompt with the target's taps, as the decoder feeds it.
    let prompt: Vec<u32> = (0..48).map(|i| (7 + 131 * i) % 4096).collect();
    let (out, _) = forward_fresh(
        &target,
        &mut cache,
        &Batch::causal(&prompt).with_taps(native.taps()),
    );
    let h = target.config().hidden_size;
    let features = specfit_engine::spec::concat_taps(&out.taps, prompt.len(), h);
    let next: Vec<u32> = prompt[1..].iter().copied().chain([5]).collect();
    let draft = |d: &Eagle3| {
        Pair::new(&target, d)
            .draft(
                &Batch::causal(&next),
                DraftHidden::Target(&features),
                &mut d.new_kv_cache(),
            )
            .logits
    };
    let want = draft(&native);
    let rows = prompt.len();
    let vd = want.len() / rows;
    let argmaxes = |l: &[f32]| -> Vec<usize> { l.chunks_exact(vd).map(argmax).collect() };
    // Logits close to the stored drafter's (Q8_0 rounds each weight to 1/254 of its block's
    // largest, Q4_K to about 1/30), and the same most likely draft in most rows.
    for (dtype, bound, agree) in [
        (DrafterDtype::Q8_0, 0.02, 0.95),
        (DrafterDtype::Q4_K, 0.15, 0.8),
    ] {
        let quantized = load(dtype);
        assert_eq!(quantized.dtype(), dtype);
        let got = draft(&quantized);
        let err = rel_err(&got, &want);
        assert!(
            err > 0.0 && err <= bound,
            "{dtype:?}: relative error {err:e}"
        );
        let same = argmaxes(&got)
            .iter()
            .zip(argmaxes(&want))
            .filter(|(a, b)| **a == *b)
            .count();
        assert!(
            same as f64 >= agree * rows as f64,
            "{dtype:?}: {same} of {rows} rows"
        );
        // Whatever it drafts, the target decides: the same tokens as plain decoding.
        let options = decode_options(24, Sampling::Greedy, 0);
        let plain = greedy_tokens(&target, &mut cache, &prompt[..12], 24);
        let got = Pair::new(&target, &quantized).top_k(
            &mut cache,
            specfit_engine::Start::Prompt(&prompt[..12]),
            4,
            &options,
        );
        assert_eq!(got.tokens, plain, "{dtype:?}");
        assert!(
            got.committed > got.cycles,
            "{dtype:?}: no draft taken: {got:?}"
        );
    }
}
