//! Realism checks of an inflated target (`specfit inflate`) against the small target it was
//! inflated from, on the bench prompts (Spec-Bench summarization = CNN/DM, math_reasoning =
//! GSM8K; summarization articles cut to their first `--max-prompt-tokens` tokens):
//! - agreement: the small target's greedy continuation of each prompt, then one forward of the
//!   inflated target over prompt + continuation; the share of continuation tokens that are the
//!   inflated target's argmax too, and the relative logit error (max |Δ| / max |logit|) per row;
//! - routing: per MoE layer, the share of a token's experts that the previous token also used,
//!   and per-layer LRU hit rates at `--lru` slots, over every token of prompt + continuation in
//!   order — for the inflated target and for the small one (at the same share of its experts);
//! - the route predictor's per-expert accuracy (`--predictor`), on the draft pools of
//!   `--positions` greedy positions per prompt, as `specfit train-predictor` measures it.
//!
//! Prints Markdown; `--json FILE` writes every figure.
//!
//! ```text
//! cargo build --release -p specfit-engine --example realism
//! SPECFIT_THREADS=2 target/release/examples/realism --inflated bench-models/paper/target-q8_0.gguf \
//!     --store disk --slots 32 --prompts 10 --json bench-results/realism-q8_0.json
//! ```

use std::path::PathBuf;
use std::time::Instant;

use serde_json::json;
use specfit_engine::inflate::routers::{lru_hits, previous_overlap};
use specfit_engine::measure::PoolWalk;
use specfit_engine::predictor::{HeadShape, RoutePredictor};
use specfit_engine::spec::{Atlas, Start, TreeShape};
use specfit_engine::{
    generate, load_target, Batch, CacheMode, DecodeOptions, Eagle3, Logits, Qwen3Moe, Tier,
    Tokenizer,
};

struct Args {
    small: PathBuf,
    inflated: PathBuf,
    drafter: Option<PathBuf>,
    predictor: Option<PathBuf>,
    small_drafter: PathBuf,
    small_predictor: PathBuf,
    disk: bool,
    slots: usize,
    prompts: usize,
    tokens: usize,
    max_prompt_tokens: usize,
    lru: Vec<usize>,
    positions: usize,
    json: Option<PathBuf>,
}

fn parse() -> Args {
    let mut a = Args {
        small: PathBuf::from("models/target"),
        inflated: PathBuf::from("bench-models/paper/target-q8_0.gguf"),
        drafter: None,
        predictor: None,
        small_drafter: PathBuf::from("models/drafter"),
        small_predictor: PathBuf::from("models/route-predictor.safetensors"),
        disk: false,
        slots: 32,
        prompts: 10,
        tokens: 28,
        max_prompt_tokens: 512,
        lru: vec![16, 32, 48, 64],
        positions: 4,
        json: None,
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    let num = |v: &str| v.parse::<usize>().expect("a non-negative integer");
    while i < argv.len() {
        let value = argv.get(i + 1).cloned().unwrap_or_default();
        match argv[i].as_str() {
            "--small" => a.small = value.into(),
            "--inflated" => a.inflated = value.into(),
            "--drafter" => a.drafter = Some(value.into()),
            "--predictor" => a.predictor = Some(value.into()),
            "--store" => a.disk = value == "disk",
            "--slots" => a.slots = num(&value),
            "--prompts" => a.prompts = num(&value),
            "--tokens" => a.tokens = num(&value),
            "--max-prompt-tokens" => a.max_prompt_tokens = num(&value),
            "--lru" => a.lru = value.split(',').map(num).collect(),
            "--positions" => a.positions = num(&value),
            "--json" => a.json = Some(value.into()),
            other => panic!("unknown argument {other}"),
        }
        i += 2;
    }
    let dir = a.inflated.parent().map(PathBuf::from).unwrap_or_default();
    a.drafter.get_or_insert(dir.join("drafter"));
    a.predictor
        .get_or_insert(dir.join("route-predictor.safetensors"));
    a
}

/// The first `n` prompts of a bench set, chat-wrapped, the user text cut to `max` tokens.
fn prompts(tok: &Tokenizer, set: &str, n: usize, max: usize) -> Vec<Vec<u32>> {
    let text = std::fs::read_to_string(format!("data/spec_bench/{set}.jsonl")).unwrap();
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .take(n)
        .map(|line| {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            let user = v["turns"][0].as_str().unwrap();
            let ids = tok.encode(user).unwrap();
            let user = if ids.len() > max {
                tok.decode(&ids[..max]).unwrap()
            } else {
                user.to_string()
            };
            tok.encode(&tok.chat_prompt(&user).unwrap()).unwrap()
        })
        .collect()
}

/// One causal forward over `ids`: the logits of `rows` and every MoE layer's routes per token.
fn forward(
    m: &Qwen3Moe,
    c: &mut specfit_engine::ExpertCache,
    ids: &[u32],
    rows: &[usize],
) -> (Vec<Vec<f32>>, Vec<Vec<Vec<u32>>>) {
    let mut kv = m.new_kv_cache();
    let out = m
        .forward(
            &Batch::causal(ids).with_logits(Logits::Rows(rows)),
            &mut kv,
            c,
        )
        .unwrap();
    let logits = (0..rows.len()).map(|r| out.row(r).to_vec()).collect();
    (logits, out.routes.into_iter().flatten().collect())
}

fn argmax(v: &[f32]) -> u32 {
    (0..v.len()).fold(0, |b, i| if v[i] > v[b] { i } else { b }) as u32
}

fn rel_err(g: &[f32], w: &[f32]) -> f64 {
    let d = g
        .iter()
        .zip(w)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    (d / w.iter().map(|v| v.abs()).fold(0.0f32, f32::max)) as f64
}

/// One layer's routes: per sequence, per token, its experts.
type LayerRoutes = Vec<Vec<Vec<u32>>>;

/// Previous-token overlap and LRU hit rates at `slots` over every sequence of `layers` (each
/// sequence of each layer from an empty cache), as the inflation's router fit measures them.
fn routing_stats<'a>(
    layers: impl Iterator<Item = &'a LayerRoutes>,
    slots: &[usize],
) -> (f64, Vec<f64>) {
    let sequences: LayerRoutes = layers.flatten().cloned().collect();
    (
        previous_overlap(&sequences),
        slots.iter().map(|&n| lru_hits(&sequences, n)).collect(),
    )
}

/// Which layers a summary row covers.
type LayerPick<'a> = Box<dyn Fn(usize) -> bool + 'a>;

fn share(a: usize, b: usize) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn main() {
    let a = parse();
    let started = Instant::now();
    let tok = Tokenizer::load(&a.small).unwrap();
    let (small, mut small_cache) =
        load_target(&a.small, &Tier::Ram, usize::MAX, CacheMode::Lru, None).unwrap();
    let tier = if a.disk {
        Tier::Disk(a.inflated.clone())
    } else {
        Tier::Ram
    };
    let slots = if a.disk { a.slots } else { usize::MAX };
    let (big, mut big_cache) =
        load_target(&a.inflated, &tier, slots, CacheMode::Lru, None).unwrap();
    let (sc, bc) = (small.config(), big.config());
    let ratio = bc.num_experts / sc.num_experts;
    let small_slots: Vec<usize> = a.lru.iter().map(|s| s / ratio).collect();
    let trained: Vec<usize> = {
        let f = specfit_gguf::GgufFile::open(&a.inflated).unwrap();
        f.header()
            .get("specfit.inflate.trained_layers")
            .and_then(|v| v.as_array())
            .map(|v| {
                v.iter()
                    .filter_map(|x| x.as_u64())
                    .map(|x| x as usize)
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut report = serde_json::Map::new();
    let mut markdown = String::new();
    markdown += &format!(
        "Inflated {} against {} ({} prompts per set, {} greedy tokens each, prompts cut to {} tokens of user text)\n\n",
        a.inflated.display(),
        a.small.display(),
        a.prompts,
        a.tokens,
        a.max_prompt_tokens
    );
    markdown += "| set | tokens | argmax agreement | rel. logit error median | p95 | max |\n|---|---|---|---|---|---|\n";
    let mut big_routing: Vec<LayerRoutes> = vec![Vec::new(); bc.moe_layers().len()];
    let mut small_routing: Vec<LayerRoutes> = vec![Vec::new(); sc.moe_layers().len()];
    let mut sets = Vec::new();
    let mut all_prompts = Vec::new();
    for set in ["summarization", "math_reasoning"] {
        let ps = prompts(&tok, set, a.prompts, a.max_prompt_tokens);
        let (mut same, mut total, mut errs) = (0usize, 0usize, Vec::new());
        for p in &ps {
            let options = DecodeOptions {
                max_tokens: a.tokens,
                ..Default::default()
            };
            let cont = generate(&small, &mut small_cache, None, Start::Prompt(p), &options)
                .unwrap()
                .tokens;
            let ids: Vec<u32> = p.iter().chain(&cont).copied().collect();
            let rows: Vec<usize> = (p.len() - 1..ids.len() - 1).collect();
            let (want, small_routes) = forward(&small, &mut small_cache, &ids, &rows);
            let (got, big_routes) = forward(&big, &mut big_cache, &ids, &rows);
            for ((g, w), &t) in got.iter().zip(&want).zip(&cont) {
                same += (argmax(g) == t) as usize;
                total += 1;
                errs.push(rel_err(g, w));
            }
            for (acc, routes) in big_routing.iter_mut().zip(big_routes) {
                acc.push(routes);
            }
            for (acc, routes) in small_routing.iter_mut().zip(small_routes) {
                acc.push(routes);
            }
            eprintln!(
                "{set}: prompt of {} tokens done at {:.0} s",
                p.len(),
                started.elapsed().as_secs_f64()
            );
        }
        let (median, p95, max) = (
            percentile(&mut errs, 0.5),
            percentile(&mut errs, 0.95),
            percentile(&mut errs, 1.0),
        );
        markdown += &format!(
            "| {set} | {total} | {:.1}% ({same}/{total}) | {median:.4} | {p95:.4} | {max:.4} |\n",
            100.0 * share(same, total)
        );
        sets.push(
            json!({"set": set, "prompts": ps.len(), "tokens": total, "agree": same,
            "rel_logit_error": {"median": median, "p95": p95, "max": max}}),
        );
        all_prompts.extend(ps);
    }
    report.insert("agreement".into(), json!(sets));
    // Routing summary: trained and pass-through layers apart.
    let summarize = |layers: &[LayerRoutes], pick: &dyn Fn(usize) -> bool, slots: &[usize]| {
        routing_stats(
            layers
                .iter()
                .enumerate()
                .filter(|(l, _)| pick(*l))
                .map(|(_, r)| r),
            slots,
        )
    };
    let groups: Vec<(&str, LayerPick<'_>, bool)> = vec![
        ("inflated, all 48 layers", Box::new(|_| true), true),
        (
            "inflated, trained layers",
            Box::new(|l| trained.contains(&l)),
            true,
        ),
        (
            "inflated, pass-through layers",
            Box::new(|l| !trained.contains(&l)),
            true,
        ),
        ("shipped target, all layers", Box::new(|_| true), false),
    ];
    markdown += &format!(
        "\n| layers | previous-token overlap | {} |\n|---|---|{}\n",
        a.lru
            .iter()
            .zip(&small_slots)
            .map(|(b, s)| format!(
                "LRU hits at {b}/{} (shipped {s}/{})",
                bc.num_experts, sc.num_experts
            ))
            .collect::<Vec<_>>()
            .join(" | "),
        "---|".repeat(a.lru.len())
    );
    let mut routing = Vec::new();
    for (label, pick, inflated) in &groups {
        let (overlap, hits) = if *inflated {
            summarize(&big_routing, pick.as_ref(), &a.lru)
        } else {
            summarize(&small_routing, pick.as_ref(), &small_slots)
        };
        markdown += &format!(
            "| {label} | {:.3} | {} |\n",
            overlap,
            hits.iter()
                .map(|h| format!("{:.1}%", 100.0 * h))
                .collect::<Vec<_>>()
                .join(" | ")
        );
        routing.push(json!({"layers": label, "previous_token_overlap": overlap, "lru_slots": a.lru, "lru_hit_rate": hits}));
    }
    let per_layer: Vec<serde_json::Value> = big_routing
        .iter()
        .enumerate()
        .map(|(l, r)| {
            let (overlap, hits) = routing_stats(std::iter::once(r), &a.lru);
            json!({"layer": l, "trained": trained.contains(&l), "previous_token_overlap": overlap,
                "lru_hit_rate": hits})
        })
        .collect();
    report.insert("routing".into(), json!(routing));
    report.insert("routing_per_layer".into(), json!(per_layer));
    // Route predictor accuracy on held-out draft pools (the bench prompts are held out of its
    // training data), inflated pair beside the shipped pair.
    if a.positions > 0 {
        let predictor_of = |path: &PathBuf, m: &Qwen3Moe, d: &Eagle3| {
            let shape = HeadShape::for_pair(m.config(), d.config().hidden_size);
            RoutePredictor::load(path, shape).unwrap()
        };
        let big_drafter = Eagle3::load(a.drafter.as_ref().unwrap(), bc).unwrap();
        let small_drafter = Eagle3::load(&a.small_drafter, sc).unwrap();
        let (_, big_all) =
            load_target(&a.inflated, &Tier::Ram, usize::MAX, CacheMode::Lru, None).unwrap();
        let mut big_atlas = Atlas::new(big_all);
        let (_, small_all) =
            load_target(&a.small, &Tier::Ram, usize::MAX, CacheMode::Lru, None).unwrap();
        let mut small_atlas = Atlas::new(small_all);
        let mut big_samples = Vec::new();
        let mut small_samples = Vec::new();
        // Two prompts of each set.
        let picks: Vec<&Vec<u32>> = all_prompts
            .iter()
            .enumerate()
            .filter(|(i, _)| i % a.prompts.max(1) < 2)
            .map(|(_, p)| p)
            .collect();
        let mut big_walk = PoolWalk {
            target: &big,
            drafter: &big_drafter,
            cache: &mut big_cache,
            atlas: &mut big_atlas,
            shape: TreeShape::default(),
        };
        let mut small_walk = PoolWalk {
            target: &small,
            drafter: &small_drafter,
            cache: &mut small_cache,
            atlas: &mut small_atlas,
            shape: TreeShape::default(),
        };
        for p in &picks {
            big_samples.extend(big_walk.route_samples(p, a.positions).unwrap());
            small_samples.extend(small_walk.route_samples(p, a.positions).unwrap());
        }
        let big_acc =
            predictor_of(a.predictor.as_ref().unwrap(), &big, &big_drafter).accuracy(&big_samples);
        let small_acc =
            predictor_of(&a.small_predictor, &small, &small_drafter).accuracy(&small_samples);
        let mean = |v: &[f64], pick: &dyn Fn(usize) -> bool| {
            let chosen: Vec<f64> = v
                .iter()
                .enumerate()
                .filter(|(l, _)| pick(*l))
                .map(|(_, x)| *x)
                .collect();
            chosen.iter().sum::<f64>() / chosen.len().max(1) as f64
        };
        let (all, tr, pass) = (
            mean(&big_acc, &|_| true),
            mean(&big_acc, &|l| trained.contains(&l)),
            mean(&big_acc, &|l| !trained.contains(&l)),
        );
        let shipped = mean(&small_acc, &|_| true);
        markdown += &format!(
            "\nRoute predictor, share of routed experts predicted (top-{} per layer), {} draft nodes of {} prompts: \
             inflated {:.3} (trained layers {:.3}, pass-through {:.3}); shipped pair {:.3} ({} nodes)\n",
            bc.num_experts_per_tok,
            big_samples.len(),
            picks.len(),
            all,
            tr,
            pass,
            shipped,
            small_samples.len()
        );
        report.insert(
            "predictor".into(),
            json!({"nodes": big_samples.len(), "inflated": {"all": all, "trained": tr, "pass_through": pass, "per_layer": big_acc},
                "shipped": {"all": shipped, "nodes": small_samples.len(), "per_layer": small_acc}}),
        );
    }
    markdown += &format!("\n({:.0} s)\n", started.elapsed().as_secs_f64());
    print!("{markdown}");
    if let Some(path) = &a.json {
        report.insert("markdown".into(), json!(markdown));
        let tmp = path.with_extension("json.tmp");
        std::fs::write(&tmp, serde_json::to_string_pretty(&report).unwrap() + "\n").unwrap();
        std::fs::rename(&tmp, path).unwrap();
    }
}
