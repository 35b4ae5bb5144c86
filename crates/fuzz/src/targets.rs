//! One function per fuzz target, each running an input through the product's own path for that
//! kind of input, as far as the input gets: a model file is loaded and, when it loads, run for
//! one forward; JSON is parsed, validated and used. Errors are expected and dropped.

use std::path::Path;
use std::sync::OnceLock;

use specfit_engine::{
    load_target, Batch, CacheMode, Eagle3, GenerationConfig, Qwen3Moe, Qwen3MoeConfig, Tier,
    Tokenizer,
};
use specfit_selector::json::{read_pools, CalibrationJson, Overrides};
use specfit_selector::{stop, Objective, PoolBuilder, Selector};
use specfit_server::api::Endpoint;
use specfit_server::chat::ChatTemplate;
use specfit_server::content::ChatFormat;
use specfit_server::Served;

use crate::scratch;
use crate::seeds;

/// Token ids the loaded models are run on (inside the seeds' vocabulary).
const TOKENS: [u32; 2] = [1, 2];

/// The input as a GGUF file: parsed, loaded as a target with its experts in RAM, run for one
/// forward, and its tokenizer metadata turned into `tokenizer.json` text. (Compiling that text
/// is the `tokenizers` crate's work, 3 ms a time; the corpus tests do it for the seeds.)
pub fn gguf(data: &[u8]) {
    let Ok(header) = specfit_gguf::Gguf::parse(data) else {
        return;
    };
    let dir = scratch::folder("gguf", &[("model.gguf", data)]);
    let path = dir.join("model.gguf");
    run_target(&path);
    let _ = specfit_engine::gguf::tokenizer_json(&path, &header);
}

/// The input as the `model.safetensors` of a model directory whose `config.json` is the tiny
/// seed model's: loaded with its experts in RAM and run for one forward.
pub fn safetensors(data: &[u8]) {
    let config = seeds::tiny_config_json();
    let dir = scratch::folder(
        "safetensors",
        &[
            ("config.json", config.as_bytes()),
            ("model.safetensors", data),
        ],
    );
    run_target(&dir);
}

/// The input as a target's `config.json` and `generation_config.json`, and as a drafter's
/// `config.json` checked against the tiny seed target.
pub fn config(data: &[u8]) {
    let dir = scratch::folder(
        "config",
        &[("config.json", data), ("generation_config.json", data)],
    );
    let _ = Qwen3MoeConfig::load(&dir);
    let _ = GenerationConfig::load(&dir);
    let _ = Eagle3::load(&dir, &seeds::tiny_config());
}

/// The input as a pool file (one pool object or JSON Lines): each pool validated, selected and
/// put through the stop rule, as `specfit select` does.
pub fn pool(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let overrides = Overrides::default();
    for problem in read_pools(text, &overrides) {
        let Ok(p) = problem else { continue };
        let Ok(mut selector) = Selector::new(p.cost.clone(), p.max_nodes, p.objective) else {
            continue;
        };
        if let Ok(selection) = selector.select(&p.pool, p.resident.as_ref()) {
            let _ = stop::decide(&p.pool, selection);
        }
    }
}

/// The input as a calibration file: parsed, both cost forms built, and each used to select on a
/// small fixed pool.
pub fn calibration(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(cal) = CalibrationJson::parse(text) else {
        return;
    };
    for residency in [false, true] {
        let Ok(cost) = cal.cost_model(residency) else {
            continue;
        };
        // Intercepts cover verify forwards of 0..n nodes (index 0: the root alone).
        let max_nodes = cost.intercepts().len().saturating_sub(1).min(3);
        let Ok(mut selector) = Selector::new(cost, max_nodes, Objective::Ratio) else {
            continue;
        };
        let _ = selector.select(&small_pool(), None);
    }
}

/// A request body for the endpoint the input's first byte picks (even: chat, odd: completions),
/// admitted as the server admits it (parsed, model name, prompt tokenized, context fitted) by a
/// server of the shipped target's tokenizer and chat template.
pub fn request(data: &[u8]) {
    let Some((&first, body)) = data.split_first() else {
        return;
    };
    let endpoint = if first % 2 == 0 {
        Endpoint::Chat
    } else {
        Endpoint::Completions
    };
    let _ = served().admit(endpoint, body);
}

/// Loads `path` as a target (experts in RAM, 2 slots) and runs one forward on [`TOKENS`].
fn run_target(path: &Path) {
    let Ok((model, mut cache)) = load_target(path, &Tier::Ram, 2, CacheMode::Lru, None) else {
        return;
    };
    forward(&model, &mut cache);
}

fn forward(model: &Qwen3Moe, cache: &mut specfit_engine::ExpertCache) {
    let tokens: Vec<u32> = TOKENS
        .iter()
        .copied()
        .filter(|&t| (t as usize) < model.config().vocab_size)
        .collect();
    if tokens.is_empty() {
        return;
    }
    let mut kv = model.new_kv_cache();
    let _ = model.forward(&Batch::causal(&tokens), &mut kv, cache);
}

/// Two layers of 8 experts, four nodes: enough for every cost form to be used.
fn small_pool() -> specfit_selector::Pool {
    let mut b = PoolBuilder::new(2, 8).expect("a valid shape");
    b.root_routes(&[vec![0, 1], vec![2, 3]])
        .expect("valid routes");
    let a = b
        .push(None, 0.7, &[vec![0, 2], vec![2, 4]])
        .expect("a node");
    b.push(Some(a), 0.4, &[vec![1, 5], vec![3, 6]])
        .expect("a node");
    b.push(None, 0.2, &[vec![6, 7], vec![0, 1]])
        .expect("a node");
    b.push(Some(a), 0.1, &[vec![0, 1], vec![2, 3]])
        .expect("a node");
    b.build()
}

/// The shipped target's tokenizer and chat template behind a 4096-position context.
fn served() -> &'static Served {
    static SERVED: OnceLock<Served> = OnceLock::new();
    SERVED.get_or_init(|| {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/target");
        let tokenizer = Tokenizer::load(&dir).expect("the shipped tokenizer loads");
        let template = ChatTemplate::new(
            tokenizer.chat_template(),
            tokenizer.bos_token(),
            tokenizer.eos_token(),
        )
        .expect("the shipped chat template compiles");
        Served {
            name: "specfit".into(),
            chat: ChatFormat::new(template, &tokenizer, false),
            context: 4096,
            tree_positions: 8,
            vocab: 8192,
            stop_tokens: Vec::new(),
            chat_stop_tokens: Vec::new(),
            policy: "ar".into(),
            tokenizer,
        }
    })
}
