//! The shipped target (models/target, a trained Qwen3-MoE) computes what HF `transformers`
//! computes: logits to 1e-4 relative in f32, the same experts for every token and layer, the
//! same greedy tokens — on the disk tier with a few slots as well as all in RAM. The reference
//! (fixtures/shipped/reference.json, its logits in reference.logits.safetensors) comes from
//! tools/fixtures/make_shipped_reference.py.

mod common;
use common::*;

use std::collections::BTreeSet;

use serde_json::Value;
use specfit_engine::{load_target, Batch, CacheMode, Logits, Tier};

#[test]
fn the_shipped_target_matches_transformers_logits_routes_and_greedy_tokens() {
    let reference: Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("fixtures/shipped/reference.json")).unwrap(),
    )
    .unwrap();
    let logits = root().join("fixtures/shipped/reference.logits.safetensors");
    let dir = root().join("models/target");
    let (model, mut cache) =
        load_target(&dir, &Tier::Ram, usize::MAX, CacheMode::Lru, None).unwrap();
    for (i, case) in reference["cases"].as_array().unwrap().iter().enumerate() {
        let ids = ints(&case["input_ids"]);
        let rows: Vec<usize> = ints(&case["logit_rows"])
            .into_iter()
            .map(|r| r as usize)
            .collect();
        let (out, _) = forward_fresh(
            &model,
            &mut cache,
            &Batch::causal(&ids).with_logits(Logits::Rows(&rows)),
        );
        let mut worst = 0.0f32;
        let want = f32_tensor(&logits, &format!("logits.{i}")); // rows × V
        assert_eq!(want.len(), rows.len() * out.vocab);
        for (r, want) in want.chunks_exact(out.vocab).enumerate() {
            let err = rel_err(out.row(r), want);
            assert!(
                err < 1e-4,
                "{} row {}: relative error {err}",
                case["set"],
                rows[r]
            );
            worst = worst.max(err);
        }
        eprintln!("{}: largest relative logit error {worst:.2e}", case["set"]);
        let routes: Vec<&Vec<Vec<u32>>> = out.routes.iter().flatten().collect();
        for (layer, want) in case["topk_ids"].as_array().unwrap().iter().enumerate() {
            for (t, want) in want.as_array().unwrap().iter().enumerate() {
                let want: BTreeSet<u32> = ints(want).into_iter().collect();
                let got: BTreeSet<u32> = routes[layer][t].iter().copied().collect();
                assert_eq!(got, want, "{} layer {layer} token {t}", case["set"]);
            }
        }
        let want = ints(&case["greedy"]);
        for tier_slots in [None, Some(4)] {
            let (_, mut c) = match tier_slots {
                None => load_target(&dir, &Tier::Ram, usize::MAX, CacheMode::Lru, None).unwrap(),
                Some(s) => {
                    let file = temp_dir("shipped").join("target.experts");
                    specfit_engine::experts::convert(&dir, &file, None).unwrap();
                    let loaded =
                        load_target(&dir, &Tier::Disk(file.clone()), s, CacheMode::Lru, None)
                            .unwrap();
                    std::fs::remove_file(&file).unwrap();
                    loaded
                }
            };
            let got = greedy_tokens(&model, &mut c, &ids, want.len());
            assert_eq!(got, want, "{} greedy, slots {tier_slots:?}", case["set"]);
        }
    }
}
