//! Forward time of the target for a chain of T new tokens after C cached tokens (all experts
//! resident, every row's logits, as a verify forward needs), of one drafted level (two nodes
//! through the EAGLE-3 head, then the top-2 children of each) and of feeding the head committed
//! tokens (`--feed 3,32`: a verify's, or a plain burst's catch-up; default 3), the drafter's
//! matrices as stored or quantized at load (`--drafter-dtype native|q8_0|q4_k`). Prints one
//! JSON object on stdout; `tools/bench/forward_time.py` runs it beside llama.cpp on a GGUF of
//! the same target.
//!
//! ```text
//! cargo build --release -p specfit-engine --example forward_time
//! SPECFIT_THREADS=2 target/release/examples/forward_time --model models/target --dtype f32 \
//!     --drafter models/drafter --cached 100,1000 --tokens 1,2,4,8,16 --reps 30
//! # a GGUF file's quantized blocks as stored, the file mapped (`--store ram`):
//! SPECFIT_THREADS=2 target/release/examples/forward_time --model bench-models/paper/target-q4_k_m.gguf \
//!     --dtype native --drafter bench-models/paper/drafter --cached 100 --tokens 1,2,4,8 --vary
//! ```
//!
//! Token ids: the cached prefix is `(7 + 131·i) mod V` for `i < C`, the new tokens continue the
//! same formula (with `--vary`, each rep takes other new tokens, so other experts: the weights are
//! then not all warm in the caches, as in real decoding); the drafted level's two nodes are the two most probable children of the last
//! cached token.

use std::path::PathBuf;
use std::time::Instant;

use specfit_engine::experts::CacheMode;
use specfit_engine::kv::KvCache;
use specfit_engine::{
    load_target, Batch, DraftHidden, DrafterDtype, Eagle3, Logits, Mask, Tier, WeightDtype,
};

struct Args {
    model: PathBuf,
    drafter: Option<PathBuf>,
    /// `None`: the checkpoint's own (a GGUF file's quantized blocks, mapped).
    dtype: Option<WeightDtype>,
    cached: Vec<usize>,
    tokens: Vec<usize>,
    reps: usize,
    /// Other new tokens in every rep (other experts: closer to real decoding than one warm set).
    vary: bool,
    drafter_dtype: DrafterDtype,
    /// Committed tokens fed to the drafter in one forward (a cycle's accepted tokens, or a
    /// plain burst's catch-up).
    feed: Vec<usize>,
}

fn list(v: &str) -> Vec<usize> {
    v.split(',')
        .map(|s| {
            s.trim()
                .parse()
                .expect("a comma-separated list of integers")
        })
        .collect()
}

fn parse() -> Args {
    let mut a = Args {
        model: PathBuf::from("models/target"),
        drafter: Some(PathBuf::from("models/drafter")),
        dtype: Some(WeightDtype::F32),
        cached: vec![100, 1000],
        tokens: vec![1, 2, 4, 8, 16],
        reps: 30,
        vary: false,
        drafter_dtype: DrafterDtype::Native,
        feed: vec![3],
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < argv.len() {
        let value = argv.get(i + 1).cloned().unwrap_or_default();
        match argv[i].as_str() {
            "--model" => a.model = PathBuf::from(value),
            "--drafter" if value == "none" => a.drafter = None,
            "--drafter" => a.drafter = Some(PathBuf::from(value)),
            "--dtype" => {
                a.dtype = match value.as_str() {
                    "f32" => Some(WeightDtype::F32),
                    "bf16" => Some(WeightDtype::Bf16),
                    "native" => None,
                    other => panic!("--dtype f32|bf16|native, not {other}"),
                }
            }
            "--drafter-dtype" => {
                a.drafter_dtype = DrafterDtype::parse(&value)
                    .unwrap_or_else(|| panic!("--drafter-dtype native|q8_0|q4_k, not {value}"))
            }
            "--cached" => a.cached = list(&value),
            "--tokens" => a.tokens = list(&value),
            "--feed" => a.feed = list(&value),
            "--reps" => a.reps = value.parse().expect("--reps N"),
            "--vary" => {
                a.vary = true;
                i -= 1;
            }
            other => panic!("unknown argument {other}"),
        }
        i += 2;
    }
    a
}

fn ids(range: std::ops::Range<usize>, vocab: usize) -> Vec<u32> {
    range.map(|i| ((7 + 131 * i) % vocab) as u32).collect()
}

/// (min, median) in ms.
/// Runs `round(rep)` `reps` times after 3 warm-up rounds, each returning the ms of its timed
/// part; (min, median) of the timed rounds.
fn timed(reps: usize, mut round: impl FnMut(usize) -> f64) -> (f64, f64) {
    let mut ms: Vec<f64> = (0..reps + 3).map(&mut round).skip(3).collect();
    ms.sort_by(f64::total_cmp);
    (ms[0], ms[ms.len() / 2])
}

/// The ms `f` takes (its result kept from being optimised away).
fn time_ms<T>(f: impl FnOnce() -> T) -> f64 {
    let start = Instant::now();
    std::hint::black_box(f());
    start.elapsed().as_secs_f64() * 1e3
}

fn main() {
    let a = parse();
    let tier = Tier::Ram;
    let probe = specfit_engine::Qwen3MoeConfig::load(&a.model).expect("config");
    let (target, mut experts) = load_target(
        &a.model,
        &tier,
        // Every expert resident (a GGUF file's: the mapped file itself).
        if a.dtype.is_none() {
            usize::MAX
        } else {
            probe.num_experts
        },
        CacheMode::Lru,
        a.dtype,
    )
    .expect("load target");
    let drafter = a
        .drafter
        .as_ref()
        .map(|d| Eagle3::load_as(d, target.config(), a.drafter_dtype).expect("load drafter"));
    let vocab = target.config().vocab_size;
    let h = target.config().hidden_size;
    let mut rows = Vec::new();
    let mut levels = Vec::new();
    let mut feeds = Vec::new();
    for &c in &a.cached {
        let prefix = ids(0..c, vocab);
        let mut kv = target.new_kv_cache();
        let taps = drafter.as_ref().map_or(&[][..], |d| d.taps());
        let pre = target
            .forward(
                &Batch::causal(&prefix)
                    .with_taps(taps)
                    .with_logits(Logits::Last),
                &mut kv,
                &mut experts,
            )
            .expect("prefill");
        for &t in &a.tokens {
            let (min, median) = timed(a.reps, |rep| {
                let shift = if a.vary { 1 + rep * 7919 } else { 0 };
                let new = ids(c + shift..c + shift + t, vocab);
                kv.truncate(c).expect("truncate");
                time_ms(|| {
                    target
                        .forward(&Batch::causal(&new), &mut kv, &mut experts)
                        .expect("forward")
                })
            });
            rows.push(
                serde_json::json!({"cached": c, "tokens": t, "min_ms": min, "median_ms": median}),
            );
        }
        kv.truncate(c).expect("truncate");
        if let Some(d) = &drafter {
            // The drafter's cache over the prefix: entry i reads token i+1 with the target's
            // features of token i.
            let feats = specfit_engine::spec::concat_taps(&pre.taps, c, h);
            let mut next = prefix[1..].to_vec();
            next.push(ids(c..c + 1, vocab)[0]);
            let mut dkv: KvCache = d.new_kv_cache();
            let fed = d
                .forward(
                    target.embed(),
                    &Batch::causal(&next).with_logits(Logits::Last),
                    DraftHidden::Target(&feats),
                    &mut dkv,
                )
                .expect("feed drafter");
            // Feeding `n` committed tokens (3: as after a verify that took two drafts; more: a
            // plain burst's catch-up): `fc` over the target's features, then the layer and the
            // LM head for the last row.
            for &n in a.feed.iter().filter(|&&n| n >= 1 && n <= c) {
                let committed = dkv.len();
                let (fmin, fmedian) = timed(a.reps, |_| {
                    dkv.truncate(committed - n).expect("truncate");
                    let positions: Vec<usize> = (c - n..c).collect();
                    time_ms(|| {
                        let batch = Batch::causal(&next[c - n..])
                            .with_positions(&positions)
                            .with_logits(Logits::Last);
                        let own = DraftHidden::Target(&feats[(c - n) * 3 * h..]);
                        d.forward(target.embed(), &batch, own, &mut dkv)
                            .expect("feed")
                    })
                });
                feeds.push(
                    serde_json::json!({"cached": c, "tokens": n, "min_ms": fmin, "median_ms": fmedian}),
                );
            }
            let children = specfit_engine::spec::top_children(d, fed.row(0), 2);
            let tokens: Vec<u32> = children.iter().map(|&(tok, _)| tok).collect();
            // Both nodes are children of the last cached token: they read its drafter output.
            let dh = d.config().hidden_size;
            let last = &fed.hidden[fed.hidden.len() - dh..];
            let hidden: Vec<f32> = [last, last].concat();
            let committed = dkv.len();
            let mask: Vec<Vec<bool>> = (0..2)
                .map(|i| {
                    let mut row = vec![true; committed + 2];
                    row[committed + (1 - i)] = false;
                    row
                })
                .collect();
            let positions = vec![c + 1, c + 1];
            let (min, median) = timed(a.reps, |_| {
                dkv.truncate(committed).expect("truncate");
                time_ms(|| {
                    let level = Batch::causal(&tokens)
                        .with_positions(&positions)
                        .with_mask(Mask::Explicit(&mask));
                    let own = DraftHidden::Own(&hidden);
                    let out = d.forward(target.embed(), &level, own, &mut dkv);
                    let out = out.expect("draft level");
                    (0..2)
                        .map(|r| specfit_engine::spec::top_children(d, out.row(r), 2))
                        .collect::<Vec<_>>()
                })
            });
            levels.push(
                serde_json::json!({"cached": c, "nodes": 2, "min_ms": min, "median_ms": median}),
            );
        }
    }
    let report = serde_json::json!({
        "engine": "specfit",
        "dtype": a.dtype.map_or("native", |d| d.name()),
        "threads": specfit_engine::threads::pool().threads(),
        "rows": rows,
        "draft_level": levels,
        "draft_feed": feeds,
    });
    println!("{report}");
}
