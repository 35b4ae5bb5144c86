//! The tokenizer a GGUF file carries (`tokenizer.ggml.*`), written as a Hugging Face
//! `tokenizer.json` so that the `tokenizers` crate runs it: byte-level BPE over the file's
//! vocabulary and merges, split first by the pre-tokenizer regex llama.cpp uses for the file's
//! `tokenizer.ggml.pre`, control tokens as special added tokens. Only pre-tokenizers whose regex
//! is known here are accepted; for others a `tokenizer.json` beside the file is the way in.
//! [`metadata_of`] goes the other way: a Hugging Face byte-level BPE tokenizer as those keys.

use std::path::Path;

use serde_json::{json, Value as Json};
use specfit_gguf::{Gguf, Value};

use crate::error::EngineError;

/// llama.cpp's split regex per `tokenizer.ggml.pre` (llama-vocab.cpp), in the form Hugging Face
/// tokenizer files write it.
fn split_regex(pre: &str) -> Option<&'static str> {
    Some(match pre {
        "qwen2" | "deepseek-r1-qwen" => {
            r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
        }
        _ => return None,
    })
}

/// The `tokenizer.ggml.*` metadata (and `tokenizer.chat_template`) for a Hugging Face byte-level
/// BPE tokenizer: `tokenizer_json` is its `tokenizer.json` text (read from `path`), `config` its
/// `tokenizer_config.json` when there is one (chat template, eos, padding and bos tokens). Its
/// split regex must be one llama.cpp knows by a pre-tokenizer name (Qwen2's is `qwen2`), so that
/// llama.cpp and [`tokenizer_json`] tokenize the file's text as the original does.
pub fn metadata_of(
    path: &Path,
    tokenizer_json: &str,
    config: Option<&Json>,
) -> Result<Vec<(String, Value)>, EngineError> {
    let bad = |message: String| EngineError::Json {
        path: path.to_path_buf(),
        message,
    };
    let doc: Json = serde_json::from_str(tokenizer_json).map_err(|e| bad(e.to_string()))?;
    let model = &doc["model"];
    if model["type"] != "BPE" {
        return Err(bad(format!(
            "model.type {}: only byte-level BPE tokenizers are written to GGUF",
            model["type"]
        )));
    }
    let regex = doc["pre_tokenizer"]["pretokenizers"]
        .as_array()
        .and_then(|p| p.iter().find_map(|t| t["pattern"]["Regex"].as_str()))
        .ok_or_else(|| {
            bad("pre_tokenizer: no Split regex (a byte-level BPE split is needed)".into())
        })?;
    let pre = ["qwen2"]
        .into_iter()
        .find(|name| split_regex(name) == Some(regex))
        .ok_or_else(|| {
            bad(format!(
                "pre_tokenizer regex {regex:?} is not one llama.cpp knows by name (Qwen2's is)"
            ))
        })?;
    let vocab = model["vocab"]
        .as_object()
        .ok_or_else(|| bad("model.vocab is not an object".into()))?;
    let mut tokens: Vec<Option<String>> = vec![None; vocab.len()];
    for (token, id) in vocab {
        let id = id
            .as_u64()
            .map(|i| i as usize)
            .filter(|&i| i < tokens.len() && tokens[i].is_none())
            .ok_or_else(|| {
                bad(format!(
                    "model.vocab: {token:?} has id {id}, not a free id below {}",
                    vocab.len()
                ))
            })?;
        tokens[id] = Some(token.clone());
    }
    let mut types = vec![1i32; tokens.len()];
    for added in doc["added_tokens"].as_array().into_iter().flatten() {
        let id = added["id"].as_u64().map(|i| i as usize);
        let content = added["content"].as_str();
        match (id, content) {
            (Some(id), Some(c)) if id < tokens.len() && tokens[id].as_deref() == Some(c) => {
                // llama.cpp token types: 3 control, 4 user-defined.
                types[id] = if added["special"] == true { 3 } else { 4 };
            }
            _ => {
                return Err(bad(format!(
                    "added token {added} is not in the vocabulary under its id"
                )))
            }
        }
    }
    let merges = model["merges"]
        .as_array()
        .ok_or_else(|| bad("model.merges is not an array".into()))?
        .iter()
        .map(|m| match m {
            Json::String(s) => Ok(s.clone()),
            Json::Array(pair) if pair.len() == 2 && pair.iter().all(Json::is_string) => {
                Ok(format!(
                    "{} {}",
                    pair[0].as_str().unwrap_or_default(),
                    pair[1].as_str().unwrap_or_default()
                ))
            }
            other => Err(bad(format!("merge {other} is not two tokens"))),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let strings = |values: Vec<String>| Value::Array {
        item: specfit_gguf::ValueType::String,
        values: values.into_iter().map(Value::String).collect(),
    };
    let mut out = vec![
        (
            "tokenizer.ggml.model".to_string(),
            Value::String("gpt2".into()),
        ),
        ("tokenizer.ggml.pre".to_string(), Value::String(pre.into())),
        (
            "tokenizer.ggml.tokens".to_string(),
            strings(tokens.into_iter().map(|t| t.unwrap_or_default()).collect()),
        ),
        (
            "tokenizer.ggml.token_type".to_string(),
            Value::Array {
                item: specfit_gguf::ValueType::I32,
                values: types.into_iter().map(Value::I32).collect(),
            },
        ),
        ("tokenizer.ggml.merges".to_string(), strings(merges)),
    ];
    let config = config.unwrap_or(&Json::Null);
    let id_of = |key: &str| -> Option<u32> {
        let name = config[key]
            .as_str()
            .or_else(|| config[key]["content"].as_str())?;
        vocab.get(name).and_then(Json::as_u64).map(|i| i as u32)
    };
    for (key, gguf_key) in [
        ("bos_token", "tokenizer.ggml.bos_token_id"),
        ("eos_token", "tokenizer.ggml.eos_token_id"),
        ("pad_token", "tokenizer.ggml.padding_token_id"),
    ] {
        if let Some(id) = id_of(key) {
            out.push((gguf_key.to_string(), Value::U32(id)));
        }
    }
    out.push((
        "tokenizer.ggml.add_bos_token".to_string(),
        Value::Bool(id_of("bos_token").is_some() && config["add_bos_token"] == true),
    ));
    if let Some(template) = config["chat_template"].as_str() {
        out.push((
            "tokenizer.chat_template".to_string(),
            Value::String(template.to_string()),
        ));
    }
    Ok(out)
}

/// `tokenizer.json` text for the tokenizer in `g` (read from `path`), and its chat template.
pub fn tokenizer_json(path: &Path, g: &Gguf) -> Result<(String, Option<String>), EngineError> {
    let bad = |key: &str, reason: String| EngineError::GgufMetadata {
        path: path.to_path_buf(),
        key: key.to_string(),
        reason,
    };
    let string = |key: &str| g.get(key).and_then(Value::as_str);
    let model = string("tokenizer.ggml.model")
        .ok_or_else(|| bad("tokenizer.ggml.model", "missing".into()))?;
    if model != "gpt2" {
        return Err(bad(
            "tokenizer.ggml.model",
            format!("{model:?}: only byte-level BPE (\"gpt2\") is read from GGUF; put the model's tokenizer.json beside the file"),
        ));
    }
    let pre = string("tokenizer.ggml.pre").unwrap_or("default");
    let regex = split_regex(pre).ok_or_else(|| {
        bad(
            "tokenizer.ggml.pre",
            format!("{pre:?} is not a pre-tokenizer known here (qwen2 is); put the model's tokenizer.json beside the file"),
        )
    })?;
    let strings = |key: &str| -> Result<Vec<&str>, EngineError> {
        g.get(key)
            .and_then(Value::as_array)
            .ok_or_else(|| bad(key, "missing or not an array".into()))?
            .iter()
            .map(|v| {
                v.as_str()
                    .ok_or_else(|| bad(key, "holds a non-string".into()))
            })
            .collect()
    };
    let tokens = strings("tokenizer.ggml.tokens")?;
    let merges = strings("tokenizer.ggml.merges")?;
    let types: Vec<i64> = match g.get("tokenizer.ggml.token_type").and_then(Value::as_array) {
        Some(a) => a.iter().map(|v| v.as_i64().unwrap_or(1)).collect(),
        None => vec![1; tokens.len()],
    };
    let mut vocab = serde_json::Map::new();
    let mut added = Vec::new();
    for (id, (&t, &ty)) in tokens
        .iter()
        .zip(types.iter().chain(std::iter::repeat(&1)))
        .enumerate()
    {
        vocab.insert(t.to_string(), json!(id));
        // llama.cpp token types: 3 control, 4 user-defined.
        if ty == 3 || ty == 4 {
            added.push(
                json!({"id": id, "content": t, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": ty == 3}),
            );
        }
    }
    let merges: Vec<Json> = merges
        .iter()
        .map(|m| {
            m.split_once(' ')
                .map(|(a, b)| json!([a, b]))
                .ok_or_else(|| bad("tokenizer.ggml.merges", format!("{m:?} is not two tokens")))
        })
        .collect::<Result<_, _>>()?;
    let byte_level = json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false});
    let doc = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": false},
            byte_level,
        ]},
        "post_processor": byte_level,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
            "vocab": vocab, "merges": merges},
    });
    let template = string("tokenizer.chat_template").map(str::to_string);
    Ok((doc.to_string(), template))
}
