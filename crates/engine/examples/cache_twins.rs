//! Whether identical plain decodes run at different speeds on different expert caches: builds
//! `N` sibling caches (same store, same slots, LRU) and, for each of the first prompts of
//! `data/spec_bench/math_reasoning.jsonl`, runs the same greedy decode on every cache in a
//! rotating order, then prints each cache's tok/s and share of decode time spent waiting for
//! expert reads, time per read and compute per token. Written to chase the per-cache slowdown
//! `specfit bench` showed: with the slots on 4 KiB pages (`SPECFIT_HUGE_PAGES=0`) reads took
//! ~175 µs and one cache of four often ran 10% faster than the others; on huge pages (the
//! default) every cache reads in ~100 µs (BENCHMARKS.md).
//!
//! ```text
//! cargo run --release -p specfit-engine --example cache_twins -- [CACHES] [PROMPTS] [SLOTS]
//! SPECFIT_HUGE_PAGES=0 cargo run --release -p specfit-engine --example cache_twins
//! ```

use std::path::Path;

use specfit_engine::experts::CacheMode;
use specfit_engine::prefix::Prefix;
use specfit_engine::spec::{generate, DecodeOptions, Start};
use specfit_engine::tokenizer::Tokenizer;
use specfit_engine::{load_target, Tier};

fn arg(i: usize, default: usize) -> usize {
    std::env::args()
        .nth(i)
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let (caches, prompts, slots) = (arg(1, 4), arg(2, 12), arg(3, 16));
    let dir = Path::new("models/target");
    let tier = Tier::Disk(specfit_engine::default_expert_file(dir));
    let (model, mut first) = load_target(dir, &tier, slots, CacheMode::Lru, None).expect("load");
    let mut twins: Vec<_> = (0..caches)
        .map(|_| first.sibling(slots, CacheMode::Lru).expect("cache"))
        .collect();
    let tokenizer = Tokenizer::load(dir).expect("tokenizer");
    let stop: Vec<u32> = ["<|im_end|>", "<|endoftext|>"]
        .iter()
        .filter_map(|t| tokenizer.token_id(t))
        .collect();
    let text = std::fs::read_to_string("data/spec_bench/math_reasoning.jsonl").expect("prompts");
    let (mut seconds, mut waits, mut tokens) =
        (vec![0.0; caches], vec![0.0; caches], vec![0usize; caches]);
    let (mut reads, mut misses) = (vec![0.0; caches], vec![0u64; caches]);
    for (p, line) in text.lines().take(prompts).enumerate() {
        let v: serde_json::Value = serde_json::from_str(line).expect("json");
        let question = v["turns"][0].as_str().expect("turn");
        let chat = tokenizer.chat_prompt(question).expect("chat");
        let ids = tokenizer.encode(&chat).expect("encode");
        let prefix = Prefix::new(&model, None, &mut first, &ids).expect("prefix");
        let options = DecodeOptions {
            max_tokens: 200,
            stop: stop.clone(),
            ..Default::default()
        };
        let mut reference: Option<Vec<u32>> = None;
        for k in 0..caches {
            let c = (k + p) % caches;
            let start = Start::Prefix(&prefix);
            let g = generate(&model, &mut twins[c], None, start, &options).expect("decode");
            assert_eq!(reference.get_or_insert(g.tokens.clone()), &g.tokens);
            seconds[c] += g.decode_seconds;
            waits[c] += g.copies.wait_seconds;
            reads[c] += g.copies.copy_seconds;
            misses[c] += g.copies.misses;
            tokens[c] += g.tokens.len().saturating_sub(1);
        }
    }
    report(&seconds, &waits, &tokens, &reads, &misses);
}

fn report(seconds: &[f64], waits: &[f64], tokens: &[usize], reads: &[f64], misses: &[u64]) {
    for c in 0..seconds.len() {
        println!(
            "cache {c}: {:.1} tok/s, waiting {:.1}% of decode, {:.1} µs per read, {:.3} ms compute per token, {:.2} copies per token",
            tokens[c] as f64 / seconds[c],
            100.0 * waits[c] / seconds[c],
            1e6 * reads[c] / misses[c].max(1) as f64,
            1e3 * (seconds[c] - waits[c]) / tokens[c].max(1) as f64,
            misses[c] as f64 / tokens[c].max(1) as f64,
        );
    }
}
