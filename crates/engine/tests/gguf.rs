//! GGUF files written by llama.cpp's own converter and quantizer (fixtures/gguf, made by
//! tools/gguf/make_gguf_fixtures.py): the config and tokenizer they carry, specfit's forward on
//! them against transformers on the same dequantized weights (`--weights f32`, exact arithmetic)
//! and, run quantized, against llama.cpp on the same file, and experts streamed from the file
//! itself.

mod common;
use common::*;

use std::path::PathBuf;

use serde_json::Value;
use specfit_engine::{
    load_target, Batch, CacheMode, ExpertCache, Qwen3Moe, Qwen3MoeConfig, Sampling, Tier, Tokenizer,
};

const QUANTS: [&str; 3] = ["q8_0", "q4_0", "q4_k_m"];

fn gguf(name: &str) -> PathBuf {
    root().join(format!("fixtures/gguf/tiny-{name}.gguf"))
}

fn reference(name: &str) -> Value {
    json_file(&root().join(format!("fixtures/gguf/tiny-{name}.reference.json")))
}

/// Logits recorded by the fixture script: `{llama,hf}.logits.{prompt}`, `[tokens, vocab]`.
fn recorded(name: &str, which: &str, prompt: usize) -> Vec<f32> {
    let path = root().join(format!("fixtures/gguf/tiny-{name}.logits.safetensors"));
    f32_tensor(&path, &format!("{which}.logits.{prompt}"))
}

#[test]
fn the_qwen3moe_metadata_becomes_the_hugging_face_config() {
    let cfg = Qwen3MoeConfig::load(&gguf("q8_0")).unwrap();
    assert_eq!(
        (
            cfg.vocab_size,
            cfg.hidden_size,
            cfg.num_hidden_layers,
            cfg.moe_intermediate_size
        ),
        (4096, 256, 2, 128)
    );
    assert_eq!(
        (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim()
        ),
        (4, 2, 64)
    );
    assert_eq!((cfg.num_experts, cfg.num_experts_per_tok), (8, 2));
    assert!(cfg.tie_word_embeddings && cfg.norm_topk_prob && cfg.mlp_only_layers.is_empty());
    assert_eq!(cfg.rope_theta(), 1e6);
    assert_eq!(cfg.max_position_embeddings, 4096);
}

#[test]
fn the_tokenizer_in_the_file_encodes_like_the_tokenizer_json_it_was_made_from() {
    let from_file = Tokenizer::from_gguf(&gguf("q4_k_m")).unwrap();
    let original = Tokenizer::load(&root().join("models/target")).unwrap();
    for text in [
        "Natalia sold clips to 48 of her friends in April.",
        "  Leading spaces, tabs\tand\nnewlines\r\n; numbers 12345 and 3.14!",
        "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
        "Ünïcödé — “quotes” and emoji 🙂, CJK 漢字.",
        "",
    ] {
        let ids = original.encode(text).unwrap();
        assert_eq!(from_file.encode(text).unwrap(), ids, "{text:?}");
        assert_eq!(
            from_file.decode(&ids).unwrap(),
            original.decode(&ids).unwrap()
        );
    }
    let chat = |t: &Tokenizer| t.chat_prompt("What is 2 + 2?").unwrap();
    assert_eq!(chat(&from_file), chat(&original));
}

#[test]
fn logits_routes_and_greedy_tokens_equal_transformers_on_the_dequantized_weights() {
    for name in QUANTS {
        let r = reference(name);
        let f32 = Some(specfit_engine::WeightDtype::F32);
        let (model, mut cache) =
            load_target(&gguf(name), &Tier::Ram, usize::MAX, CacheMode::Lru, f32).unwrap();
        for (k, run) in r["runs"].as_array().unwrap().iter().enumerate() {
            let prompt = ints(&run["prompt"]);
            let out = forward_all(&model, &mut cache, &prompt);
            let err = rel_err(&out.logits, &recorded(name, "hf", k));
            eprintln!("{name} prompt {k}: relative error against transformers {err:e}");
            assert!(err <= 1e-5, "{name} prompt {k}: {err:e}");
            let want: Vec<Vec<Vec<u32>>> =
                serde_json::from_value(run["hf_routes"].clone()).unwrap();
            same_experts(&out.routes, &want, &format!("{name} prompt {k}"));
            let want = ints(&run["hf_greedy"]);
            let got = greedy_tokens(&model, &mut cache, &prompt, want.len());
            assert_eq!(got, want, "{name} prompt {k}");
        }
    }
}

/// Asserts that every token of every MoE layer chose the experts of `want` (`[layer][token]`
/// ids, in any order).
fn same_experts(routes: &[Option<Vec<Vec<u32>>>], want: &[Vec<Vec<u32>>], label: &str) {
    for (layer, want) in want.iter().enumerate() {
        let got = routes[layer].as_ref().unwrap();
        for (t, w) in want.iter().enumerate() {
            let (mut g, mut w) = (got[t].clone(), w.clone());
            g.sort_unstable();
            w.sort_unstable();
            assert_eq!(g, w, "{label} layer {layer} token {t}: experts");
        }
    }
}

/// The experts llama.cpp selected on fixture `name`: `[prompt][layer][token]` ids.
fn llama_routes(name: &str) -> Vec<Vec<Vec<Vec<u32>>>> {
    let path = root().join(format!("fixtures/gguf/tiny-{name}.llama-routes.json"));
    let v = json_file(&path);
    assert_eq!(
        v["sha256"],
        reference(name)["sha256"],
        "routes of another file"
    );
    serde_json::from_value(v["routes"].clone()).unwrap()
}

/// The share of positions whose argmax agrees, and `max |a − b| / max |b|`, over `[rows, vocab]`.
fn agreement(a: &[f32], b: &[f32], vocab: usize) -> (f64, f32) {
    let argmax = |row: &[f32]| {
        row.iter()
            .enumerate()
            .max_by(|x, y| x.1.total_cmp(y.1))
            .unwrap()
            .0
    };
    let rows = a.len() / vocab;
    let same = (0..rows)
        .filter(|&r| {
            argmax(&a[r * vocab..(r + 1) * vocab]) == argmax(&b[r * vocab..(r + 1) * vocab])
        })
        .count();
    (same as f64 / rows as f64, rel_err(a, b))
}

/// specfit runs a GGUF's quantized matrices as llama.cpp does (and routes every token to the
/// experts llama.cpp's graph selects, on every file, layer and position): activations rounded per row to
/// 8-bit blocks (Q8_0 blocks for Q8_0/Q4_0/Q5_0 weights, Q8_K for k-quants) and integer dot
/// products per block. The float steps around them are ordered differently (and llama.cpp's
/// attention, norms and softmax are its own), so logits agree closely but not bitwise. Measured
/// on these files: largest relative error 1.3e-7 for Q8_0, 0.015 for Q4_0, 0.020 for Q4_K_M
/// (before the integer kernels, with f32 activations: 0.019, 0.039, 0.163); the bounds leave
/// headroom. The exact reference is transformers on the same weights, above.
#[test]
fn quantized_logits_and_greedy_tokens_agree_with_llama_cpp_on_the_same_file() {
    let bound = [("q8_0", 1e-5f32), ("q4_0", 0.03), ("q4_k_m", 0.04)];
    for (name, max_rel) in bound {
        let (model, mut cache) =
            load_target(&gguf(name), &Tier::Ram, usize::MAX, CacheMode::Lru, None).unwrap();
        let vocab = model.config().vocab_size;
        let r = reference(name);
        for (k, run) in r["runs"].as_array().unwrap().iter().enumerate() {
            let prompt = ints(&run["prompt"]);
            let out = forward_all(&model, &mut cache, &prompt);
            let (argmax, err) = agreement(&out.logits, &recorded(name, "llama", k), vocab);
            eprintln!("{name} prompt {k}: against llama.cpp relative error {err:.2e}, argmax agreement {argmax:.2}");
            assert!(err <= max_rel, "{name} prompt {k}: {err}");
            assert_eq!(argmax, 1.0, "{name} prompt {k}: argmax agreement {argmax}");
            // The experts each token chose, against the ids llama.cpp's graph selected
            // (`ffn_moe_topk`, recorded by tools/gguf/llama_routes.py).
            same_experts(
                &out.routes,
                &llama_routes(name)[k],
                &format!("{name} prompt {k}"),
            );
            let want = ints(&run["llama_greedy"]);
            let got = greedy_tokens(&model, &mut cache, &prompt, want.len());
            assert_eq!(
                got, want,
                "{name} prompt {k}: greedy tokens against llama.cpp's"
            );
        }
    }
}

/// The quantized kernels against the exact decode of the same file (`--weights f32`): close,
/// within the rounding of 8-bit activations.
#[test]
fn quantized_kernels_stay_close_to_the_exact_decode_of_the_same_weights() {
    use specfit_engine::WeightDtype;
    for (name, max_rel) in [("q8_0", 0.03f32), ("q4_0", 0.03), ("q4_k_m", 0.04)] {
        let prompt = [1u32, 45, 300, 17, 999, 5, 6, 7, 8];
        let logits = |dtype: Option<WeightDtype>| {
            let (model, mut cache) =
                load_target(&gguf(name), &Tier::Ram, usize::MAX, CacheMode::Lru, dtype).unwrap();
            let mut kv = model.new_kv_cache();
            model
                .forward(&Batch::causal(&prompt), &mut kv, &mut cache)
                .unwrap()
                .logits
        };
        let (quantized, exact) = (logits(None), logits(Some(WeightDtype::F32)));
        let err = rel_err(&quantized, &exact);
        eprintln!("{name}: quantized kernels against the exact decode: relative error {err:.2e}");
        assert!(err <= max_rel && err > 0.0, "{name}: {err}");
    }
}

#[test]
fn experts_streamed_from_the_gguf_give_the_tokens_of_experts_in_ram() {
    for name in QUANTS {
        let path = gguf(name);
        let prompt = [1u32, 45, 300, 17, 999, 5];
        let run = |tier: &Tier, slots: usize| {
            let (model, mut cache) = load_target(&path, tier, slots, CacheMode::Lru, None).unwrap();
            let tokens = greedy_tokens(&model, &mut cache, &prompt, 12);
            let stats = cache.stats().total;
            cache.verify_slots().unwrap();
            (tokens, stats.misses, cache.tier(), cache.in_place())
        };
        let (want, misses, tier, in_place) = run(&Tier::Ram, usize::MAX);
        assert!(tier.contains("mapped"), "{tier}");
        // Mapped experts are used where they rest: nothing is ever copied.
        assert!(in_place && misses == 0, "{name}: {misses} misses");
        // The same experts copied into a host-RAM store (`Qwen3Moe::load`) instead of mapped.
        let (model, store) = Qwen3Moe::load(&path, None).unwrap();
        let cfg = model.config();
        let layers = cfg.moe_layers().len();
        let mut cache = ExpertCache::new(
            std::sync::Arc::new(store),
            layers,
            cfg.num_experts,
            2,
            CacheMode::Lru,
        )
        .unwrap();
        assert_eq!(
            greedy_tokens(&model, &mut cache, &prompt, 12),
            want,
            "{name}: RAM store"
        );
        assert!(!cache.in_place(), "{name}: a RAM store copies into slots");
        let (got, misses, tier, in_place) = run(&Tier::Disk(PathBuf::from("unused")), 2);
        assert_eq!(got, want, "{name}");
        assert!(misses > 0 && !in_place, "{name}");
        assert!(tier.contains("GGUF"), "{tier}");
    }
}

/// A random EAGLE-3 drafter that fits the tiny GGUF target (hidden 256, vocabulary 4,096, its
/// three taps all at layer 1 of 2), written to a temporary folder.
fn random_drafter() -> PathBuf {
    let dir = temp_dir("gguf-drafter");
    specfit_engine::model::random_eagle3::RandomEagle3 {
        hidden: 256,
        heads: 4,
        kv_heads: 2,
        head_dim: 64,
        intermediate: 512,
        vocab: 4096,
        draft_vocab: 4096,
        taps: Some([0, 0, 0]),
        max_positions: 4096,
        bf16: false,
        scale: 0.1,
        seed: 7,
    }
    .write(&dir)
    .unwrap();
    dir
}

#[test]
fn speculative_decoding_on_a_quantized_target_gives_plain_decodings_tokens() {
    use specfit_engine::Eagle3;
    let drafter_dir = random_drafter();
    for name in QUANTS {
        for (sampling, seed) in [
            (Sampling::Greedy, 0),
            (Sampling::from_temperature(0.8, 0.9), 5),
        ] {
            let (model, mut cache) =
                load_target(&gguf(name), &Tier::Ram, usize::MAX, CacheMode::Lru, None).unwrap();
            let drafter = Eagle3::load(&drafter_dir, model.config()).unwrap();
            let pair = Pair::new(&model, &drafter);
            let prompt = [1u32, 45, 300, 17, 999, 5];
            let want = plain_tokens(&model, &mut cache, &prompt, sampling, seed, 24);
            let (_, mut disk) = load_target(
                &gguf(name),
                &Tier::Disk(PathBuf::from("unused")),
                3,
                CacheMode::Lru,
                None,
            )
            .unwrap();
            let options = decode_options(24, sampling, seed);
            let got = pair.top_k(
                &mut disk,
                specfit_engine::Start::Prompt(&prompt),
                7,
                &options,
            );
            assert_eq!(got.tokens, want, "{name} {sampling:?}");
            assert!(got.verified_nodes > 0);
        }
    }
    std::fs::remove_dir_all(&drafter_dir).unwrap();
}
