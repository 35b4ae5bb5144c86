//! `inflate` preserves the shipped pair's function: the target inflated with every matrix in
//! F32 gives the shipped target's logits (to summation-order rounding) and greedy tokens, its
//! drafter commits as many tokens per cycle as the shipped drafter, and the Q8_0 file agrees
//! with the shipped target's greedy choices; bad sources and outputs are refused. The shape is
//! a small one with every kind of growth the full-size one has (hidden ×2, head_dim ×2, GQA
//! groups ×2, experts ×2, layers 8 → 10, zero-padded MLPs), so the test stays fast.

mod common;
use common::*;

use std::path::{Path, PathBuf};

use specfit_engine::inflate::{inflate, manifest_path, FileType, Options, Routing, Shape};
use specfit_engine::predictor::{HeadShape, RoutePredictor};
use specfit_engine::Start;
use specfit_engine::{load_target, Batch, CacheMode, Eagle3, Logits, Sampling, Tier};

fn shape() -> Shape {
    Shape {
        num_hidden_layers: 10,
        hidden_size: 512,
        num_attention_heads: 8,
        num_key_value_heads: 4,
        head_dim: 128,
        num_experts: 128,
        num_experts_per_tok: 8,
        moe_intermediate_size: 64,
        drafter_intermediate_size: 1024,
    }
}

fn options(out: &Path, types: Vec<FileType>) -> Options {
    Options {
        model: root().join("models/target"),
        drafter: root().join("models/drafter"),
        predictor: Some(root().join("models/route-predictor.safetensors")),
        out: out.to_path_buf(),
        types,
        shape: shape(),
        routing: None,
    }
}

/// One inflation of both types into a temporary folder, shared by the tests of this file.
fn inflated() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let dir = temp_dir("inflate").join("out");
        let _ = std::fs::remove_dir_all(&dir);
        let mut o = options(&dir, vec![FileType::F32, FileType::Q8_0]);
        o.routing = Some(Routing {
            prompts: calibration_prompts(),
            target: specfit_engine::inflate::routers::Target::Overlap(0.43),
        });
        inflate(&o, &mut |_| {}).unwrap();
        dir
    })
    .clone()
}

/// The shipped calibration prompts (disjoint from the bench's), chat-rendered.
fn calibration_prompts() -> Vec<Vec<u32>> {
    let tok = specfit_engine::Tokenizer::load(&root().join("models/target")).unwrap();
    ["gsm8k_train", "cnn_dm_train"]
        .iter()
        .flat_map(|f| {
            let text = std::fs::read_to_string(root().join(format!("data/calibration/{f}.jsonl")))
                .unwrap();
            text.lines()
                .map(|l| {
                    let v: serde_json::Value = serde_json::from_str(l).unwrap();
                    tok.encode(&tok.chat_prompt(v["question"].as_str().unwrap()).unwrap())
                        .unwrap()
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Prompts from both bench sets, as token ids.
fn prompts() -> Vec<Vec<u32>> {
    let tok = specfit_engine::Tokenizer::load(&root().join("models/target")).unwrap();
    [
        "Question: Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many clips did Natalia sell altogether in April and May?\nAnswer:",
        "Summarize: The city council met on Tuesday to discuss the new budget. Members argued over funding for parks and roads, and the mayor said a decision would come next week.\nSummary:",
    ]
    .iter()
    .map(|p| tok.encode(p).unwrap())
    .collect()
}

/// The target at `path` with every expert in RAM.
fn in_ram(path: &Path) -> (specfit_engine::Qwen3Moe, specfit_engine::ExpertCache) {
    load_target(path, &Tier::Ram, usize::MAX, CacheMode::Lru, None).unwrap()
}

/// Logits of every position of `ids` (one causal forward).
fn all_logits(model: &Path, ids: &[u32]) -> Vec<Vec<f32>> {
    let (m, mut cache) = in_ram(model);
    let rows: Vec<usize> = (0..ids.len()).collect();
    let (out, _) = forward_fresh(
        &m,
        &mut cache,
        &Batch::causal(ids).with_logits(Logits::Rows(&rows)),
    );
    rows.iter().map(|&r| out.row(r).to_vec()).collect()
}

fn argmax(v: &[f32]) -> usize {
    (0..v.len()).fold(0, |b, i| if v[i] > v[b] { i } else { b })
}

#[test]
fn the_f32_inflation_gives_the_shipped_targets_logits_and_greedy_tokens() {
    let dir = inflated();
    let shipped = root().join("models/target");
    let big = FileType::F32.target_path(&dir);
    for prompt in prompts() {
        let (m, mut c) = in_ram(&shipped);
        let want = greedy_tokens(&m, &mut c, &prompt, 24);
        let (b, mut bc) = in_ram(&big);
        assert_eq!(b.config().num_hidden_layers, 10);
        let got = greedy_tokens(&b, &mut bc, &prompt, 24);
        assert_eq!(got, want);
        let ids: Vec<u32> = prompt.iter().chain(&want).copied().collect();
        for (g, w) in all_logits(&big, &ids)
            .iter()
            .zip(all_logits(&shipped, &ids))
        {
            let err = rel_err(g, &w);
            assert!(err < 1e-4, "relative logit error {err}");
        }
    }
}

#[test]
fn the_inflated_drafter_commits_as_many_tokens_per_cycle_as_the_shipped_one() {
    let dir = inflated();
    let mut per_cycle = Vec::new();
    for (target, drafter) in [
        (root().join("models/target"), root().join("models/drafter")),
        (FileType::F32.target_path(&dir), dir.join("drafter")),
    ] {
        let (m, mut c) = in_ram(&target);
        let d = Eagle3::load(&drafter, m.config()).unwrap();
        let pair = Pair::new(&m, &d);
        let (mut cycles, mut committed) = (0, 0);
        for prompt in prompts() {
            let plain = greedy_tokens(&m, &mut c, &prompt, 24);
            let options = decode_options(24, Sampling::Greedy, 0);
            let r = pair.top_k(&mut c, Start::Prompt(&prompt), 7, &options);
            assert_eq!(
                r.tokens,
                plain,
                "speculation is lossless on {}",
                target.display()
            );
            cycles += r.cycles;
            committed += r.committed;
        }
        per_cycle.push(committed as f64 / cycles as f64);
    }
    let (shipped, big) = (per_cycle[0], per_cycle[1]);
    assert!(shipped > 1.5, "the shipped pair accepts drafts: {shipped}");
    assert!(
        (big / shipped - 1.0).abs() < 0.05,
        "tokens per cycle {big} vs {shipped}"
    );
}

#[test]
fn the_q8_0_inflation_agrees_with_the_shipped_targets_greedy_choices() {
    let dir = inflated();
    let shipped = root().join("models/target");
    let (m, mut c) = in_ram(&shipped);
    let (mut same, mut total, mut worst) = (0, 0, 0.0f32);
    for prompt in prompts() {
        let greedy = greedy_tokens(&m, &mut c, &prompt, 24);
        let ids: Vec<u32> = prompt.iter().chain(&greedy).copied().collect();
        let want = all_logits(&shipped, &ids);
        let got = all_logits(&FileType::Q8_0.target_path(&dir), &ids);
        for (g, w) in got.iter().zip(&want) {
            same += (argmax(g) == argmax(w)) as usize;
            total += 1;
            worst = worst.max(rel_err(g, w));
        }
    }
    eprintln!("Q8_0: {same} of {total} argmaxes agree, largest relative logit error {worst:.3}");
    // Q8_0 rounds every weight and activation to 8 bits: a few percent of the largest logit.
    assert!(worst < 0.15, "largest relative logit error {worst}");
    assert!(
        same as f64 >= 0.95 * total as f64,
        "{same} of {total} argmaxes agree"
    );
}

#[test]
fn the_carried_over_route_predictor_loads_for_the_inflated_pair() {
    let dir = inflated();
    let (m, _) = in_ram(&FileType::Q8_0.target_path(&dir));
    let d = Eagle3::load(&dir.join("drafter"), m.config()).unwrap();
    let shape = HeadShape::for_pair(m.config(), d.config().hidden_size);
    let p = RoutePredictor::load(&dir.join("route-predictor.safetensors"), shape).unwrap();
    assert_eq!(p.dim(), 1024);
}

#[test]
fn pass_through_routers_reuse_the_previous_tokens_experts_as_often_as_asked_on_held_out_prompts() {
    let dir = inflated();
    let manifest = json_file(&manifest_path(&dir));
    let fitted = manifest["routers"].as_array().unwrap();
    // Layers 4 and 9 of 10 pass the residual through.
    assert_eq!(fitted.len(), 2);
    for f in fitted {
        assert!(f["base_overlap"].as_f64().unwrap() < 0.3, "{f}");
        assert!(f["overlap"].as_f64().unwrap() >= 0.43, "{f}");
    }
    // On the bench prompts (not fitted on): the pass-through layers' routes, every copy of a
    // small expert chosen together.
    let (m, mut c) = in_ram(&FileType::Q8_0.target_path(&dir));
    let (mut same, mut total) = (0, 0);
    for prompt in prompts() {
        let (out, _) = forward_fresh(
            &m,
            &mut c,
            &Batch::causal(&prompt).with_logits(Logits::None),
        );
        let routes: Vec<&Vec<Vec<u32>>> = out.routes.iter().flatten().collect();
        for layer in [4, 9] {
            for t in routes[layer] {
                let mut small: Vec<u32> = t.iter().map(|e| e % 64).collect();
                small.sort();
                small.dedup();
                assert_eq!(small.len(), 4, "both copies of 4 small experts: {t:?}");
            }
            for w in routes[layer].windows(2) {
                same += w[1].iter().filter(|e| w[0].contains(e)).count();
                total += w[1].len();
            }
        }
    }
    let overlap = same as f64 / total as f64;
    assert!(overlap > 0.3, "held-out previous-token overlap {overlap}");
}

#[test]
fn an_existing_target_file_or_another_inflation_in_the_folder_is_refused() {
    let dir = inflated();
    let e = inflate(&options(&dir, vec![FileType::Q8_0]), &mut |_| {})
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("target-q8_0.gguf") && e.contains("already exists"),
        "{e}"
    );
    let mut other = options(&dir, vec![FileType::Q4KM]);
    other.shape.num_hidden_layers = 12;
    let e = inflate(&other, &mut |_| {}).unwrap_err().to_string();
    assert!(
        e.contains("inflate.json") && e.contains("another inflation"),
        "{e}"
    );
    assert!(!FileType::Q4KM.target_path(&dir).exists());
}

#[test]
fn a_source_that_is_not_a_fitting_qwen3_moe_pair_is_refused_before_anything_is_written() {
    let out = temp_dir("inflate-bad").join("out");
    let mut o = options(&out, vec![FileType::Q8_0]);
    o.model = root().join("models/drafter");
    let e = inflate(&o, &mut |_| {}).unwrap_err().to_string();
    assert!(
        e.contains("architectures") || e.contains("config.json"),
        "{e}"
    );
    // The fixture drafter was made for another target.
    let mut o = options(&out, vec![FileType::Q8_0]);
    o.drafter = drafter_dir();
    let e = inflate(&o, &mut |_| {}).unwrap_err().to_string();
    assert!(
        e.contains("drafter") || e.contains("hidden_size") || e.contains("vocab"),
        "{e}"
    );
    let mut o = options(&out, vec![FileType::Q8_0]);
    o.shape.num_experts_per_tok = 4;
    let e = inflate(&o, &mut |_| {}).unwrap_err().to_string();
    assert!(e.contains("num_experts_per_tok"), "{e}");
    assert!(!out.exists(), "nothing written");
}
