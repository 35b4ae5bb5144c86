//! Helpers shared by the engine's integration tests: the repository root, reference values read
//! from JSON, error measures, temporary folders and the tiny fixture target and drafter. Each
//! test file uses the part it needs.
#![allow(dead_code)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde_json::Value;
use specfit_engine::spec::{Routes, Speculation, Start};
use specfit_engine::{
    generate, Batch, CacheMode, DecodeOptions, DecodeStats, Eagle3, ExpertCache, KvCache, Logits,
    Qwen3Moe, Sampling, Tier, VerifyPolicy,
};

/// The repository root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every number of a (nested) JSON array, as f32.
pub fn floats(v: &Value) -> Vec<f32> {
    match v {
        Value::Array(a) => a.iter().flat_map(floats).collect(),
        Value::Number(n) => vec![n.as_f64().unwrap() as f32],
        _ => panic!("not numeric: {v}"),
    }
}

/// A JSON array of token ids.
pub fn ints(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// `max |got − want| / max |want|`.
pub fn rel_err(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len());
    let max_diff = got
        .iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max);
    max_diff / want.iter().map(|v| v.abs()).fold(0.0, f32::max)
}

/// Bit patterns, for exact comparisons that tell `-0.0` from `0.0`.
pub fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// This test binary's folder for `tag` under cargo's `target/tmp`, emptied the first time this
/// process asks for it: a run never sees an earlier run's files, and each run's files replace
/// the previous run's instead of piling up in the system temp dir (one inflation is 0.7 GB).
pub fn temp_dir(tag: &str) -> PathBuf {
    static EMPTIED: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("specfit-{}-{tag}", env!("CARGO_CRATE_NAME")));
    let mut emptied = EMPTIED.lock().unwrap_or_else(|e| e.into_inner());
    if emptied.insert(tag.to_string()) {
        let _ = std::fs::remove_dir_all(&dir);
    }
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The errors of reading every expert of every MoE layer of `model` through `cache`, one call
/// per layer (a check that corrupt blocks are caught and named).
pub fn errors_reading_every_expert(model: &Qwen3Moe, cache: &mut ExpertCache) -> Vec<String> {
    let cfg = model.config();
    let all: Vec<u32> = (0..cfg.num_experts as u32).collect();
    (0..cfg.moe_layers().len())
        .filter_map(|l| cache.with_experts(l, &all, &[], |_| {}).err())
        .map(|e| e.to_string())
        .collect()
}

/// The fixture target the tiny drafter was made for.
pub fn target_dir() -> PathBuf {
    root().join("fixtures/qwen3moe/eagle_target")
}

/// The tiny EAGLE-3 drafter fixture.
pub fn drafter_dir() -> PathBuf {
    root().join("fixtures/eagle3/tiny")
}

/// The fixture target's experts converted to a disk expert file in a fresh temporary folder
/// (`temp_dir(tag)/experts.specfit`).
pub fn fixture_expert_file(tag: &str) -> PathBuf {
    let file = temp_dir(tag).join("experts.specfit");
    specfit_engine::experts::convert(&target_dir(), &file, None).unwrap();
    file
}

/// The fixture target with its experts in RAM behind `slots` LRU slots per layer.
pub fn fixture_target(slots: usize) -> (Qwen3Moe, ExpertCache) {
    specfit_engine::load_target(&target_dir(), &Tier::Ram, slots, CacheMode::Lru, None).unwrap()
}

/// The fixture target's expert cache on the disk tier (expert file `file`): `slots` slots per
/// layer in `mode`.
pub fn fixture_disk_cache(file: &Path, slots: usize, mode: CacheMode) -> ExpertCache {
    let tier = Tier::Disk(file.to_path_buf());
    specfit_engine::load_target(&target_dir(), &tier, slots, mode, None)
        .unwrap()
        .1
}

/// The JSON file at `path`.
pub fn json_file(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// F32 tensor `name` of the safetensors file at `path` (a fixture script's sidecar), row-major.
pub fn f32_tensor(path: &Path, name: &str) -> Vec<f32> {
    let bytes = std::fs::read(path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let tensor = st.tensor(name).unwrap();
    assert_eq!(tensor.dtype(), safetensors::Dtype::F32, "{name}");
    tensor
        .data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// The fixture target (experts in RAM behind `slots` slots per layer) with the tiny drafter.
pub fn fixture_pair(slots: usize) -> (Qwen3Moe, Eagle3, ExpertCache) {
    let (target, cache) = fixture_target(slots);
    let drafter = tiny_drafter(&target);
    (target, drafter, cache)
}

/// The tiny drafter, loaded for `target`.
pub fn tiny_drafter(target: &Qwen3Moe) -> Eagle3 {
    Eagle3::load(&drafter_dir(), target.config()).unwrap()
}

/// One forward of `batch` from an empty KV cache: its output and the cache after it.
pub fn forward_fresh(
    target: &Qwen3Moe,
    cache: &mut ExpertCache,
    batch: &Batch<'_>,
) -> (specfit_engine::ForwardOutput, KvCache) {
    let mut kv = target.new_kv_cache();
    let out = target.forward(batch, &mut kv, cache).unwrap();
    (out, kv)
}

/// One forward over `tokens` from an empty KV cache, logits of every row.
pub fn forward_all(
    target: &Qwen3Moe,
    cache: &mut ExpertCache,
    tokens: &[u32],
) -> specfit_engine::ForwardOutput {
    forward_fresh(target, cache, &Batch::causal(tokens)).0
}

/// Options of a decode of at most `max_tokens` tokens drawn by `sampling` from `seed` (the rest
/// default: the default tree shape, no stop token).
pub fn decode_options(max_tokens: usize, sampling: Sampling, seed: u64) -> DecodeOptions {
    DecodeOptions {
        max_tokens,
        sampling,
        seed,
        ..DecodeOptions::default()
    }
}

/// A KV cache holding `prompt` (one forward, no logits).
pub fn prefilled(target: &Qwen3Moe, cache: &mut ExpertCache, prompt: &[u32]) -> KvCache {
    let batch = Batch::causal(prompt).with_logits(Logits::None);
    forward_fresh(target, cache, &batch).1
}

/// Plain decoding's tokens for `prompt` (the reference every speculative test compares with),
/// drawn by `sampling` from `seed`.
pub fn plain_tokens(
    target: &Qwen3Moe,
    cache: &mut ExpertCache,
    prompt: &[u32],
    sampling: Sampling,
    seed: u64,
    max_tokens: usize,
) -> Vec<u32> {
    let options = decode_options(max_tokens, sampling, seed);
    generate(target, cache, None, Start::Prompt(prompt), &options)
        .unwrap()
        .tokens
}

/// Plain decoding's `max_tokens` greedy tokens after `prompt`.
pub fn greedy_tokens(
    target: &Qwen3Moe,
    cache: &mut ExpertCache,
    prompt: &[u32],
    max_tokens: usize,
) -> Vec<u32> {
    plain_tokens(target, cache, prompt, Sampling::Greedy, 0, max_tokens)
}

/// The fixture target with a drafter for it: what every speculative test decodes with.
#[derive(Clone, Copy)]
pub struct Pair<'a> {
    pub target: &'a Qwen3Moe,
    pub drafter: &'a Eagle3,
}

impl<'a> Pair<'a> {
    pub fn new(target: &'a Qwen3Moe, drafter: &'a Eagle3) -> Pair<'a> {
        Pair { target, drafter }
    }

    /// The drafter's forward over `batch` (its embeddings are the target's).
    pub fn draft(
        self,
        batch: &Batch<'_>,
        hidden: specfit_engine::DraftHidden<'_>,
        kv: &mut KvCache,
    ) -> specfit_engine::DraftOutput {
        self.drafter
            .forward(self.target.embed(), batch, hidden, kv)
            .unwrap()
    }

    /// Speculative decoding from `start` under `policy` on `routes`.
    pub fn speculate(
        self,
        cache: &mut ExpertCache,
        policy: &mut VerifyPolicy,
        routes: Routes<'_>,
        start: Start<'_>,
        options: &DecodeOptions,
    ) -> Result<DecodeStats, specfit_engine::EngineError> {
        let speculation = Speculation {
            drafter: self.drafter,
            policy,
            routes,
        };
        generate(self.target, cache, Some(speculation), start, options)
    }

    /// Speculative decoding from `start` with the top-`k` verify policy and no route source
    /// (the setup most engine tests compare with plain decoding).
    pub fn top_k(
        self,
        cache: &mut ExpertCache,
        start: Start<'_>,
        k: usize,
        options: &DecodeOptions,
    ) -> DecodeStats {
        let mut policy = VerifyPolicy::top_k(k);
        self.speculate(cache, &mut policy, Routes::None, start, options)
            .unwrap()
    }
}

/// SpecFit's verify policy (ratio objective, K = 7, the draft-stop rule) believing `cost`.
pub fn specfit_policy(cost: specfit_selector::CostModel) -> VerifyPolicy {
    let selector = specfit_selector::Selector::new(cost, 7, specfit_selector::Objective::Ratio);
    VerifyPolicy::specfit(selector.unwrap())
}
