//! The tokenizer a GGUF file carries (`tokenizer.ggml.*`), written as a Hugging Face
//! `tokenizer.json` so that the `tokenizers` crate runs it: byte-level BPE over the file's
//! vocabulary and merges, split first by the pre-tokenizer regex llama.cpp uses for the file's
//! `tokenizer.ggml.pre`, control tokens as special added tokens. Only pre-tokenizers whose regex
//! is known here are accepted; for others a `tokenizer.json` beside the file is the way in.

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
