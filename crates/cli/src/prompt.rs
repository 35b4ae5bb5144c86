//! The prompt options shared by `generate` and `record`: text through the checkpoint's tokenizer
//! (optionally in its chat format), or raw token ids; and the JSON Lines prompt files that
//! `calibrate` and `train-predictor` read.

use std::path::Path;

use anyhow::{ensure, Result};
use specfit_engine::Tokenizer;

#[derive(Debug, clap::Args)]
pub struct PromptArgs {
    /// The prompt text (needs the model's tokenizer.json).
    #[arg(
        long,
        required_unless_present = "prompt_ids",
        conflicts_with = "prompt_ids"
    )]
    pub prompt: Option<String>,
    /// The prompt as comma-separated token ids (no tokenizer needed; output is printed as ids).
    #[arg(long, value_delimiter = ',')]
    pub prompt_ids: Option<Vec<u32>>,
}

impl PromptArgs {
    /// The tokenizer of `model` when the prompt is text.
    pub fn tokenizer(&self, model: &Path) -> Result<Option<Tokenizer>> {
        Ok(match self.prompt {
            Some(_) => Some(Tokenizer::load(model)?),
            None => None,
        })
    }

    /// The prompt's token ids (`chat` wraps text in the chat format).
    pub fn tokens(&self, tokenizer: Option<&Tokenizer>, chat: bool) -> Result<Vec<u32>> {
        let ids = match (tokenizer, &self.prompt, &self.prompt_ids) {
            (Some(tok), Some(text), _) => {
                let text = if chat {
                    tok.chat_prompt(text)?
                } else {
                    text.clone()
                };
                tok.encode(&text)?
            }
            (_, _, Some(ids)) => ids.clone(),
            _ => anyhow::bail!("give --prompt TEXT or --prompt-ids"),
        };
        ensure!(!ids.is_empty(), "the prompt encodes to no tokens");
        Ok(ids)
    }
}

/// Reads up to `limit` items from a JSON Lines file of prompts, one per non-empty line, each made
/// by `item` from the line's JSON and its "FILE line N" (for error messages). No item at all is
/// an error.
pub fn read_jsonl<T>(
    path: &Path,
    limit: usize,
    mut item: impl FnMut(&serde_json::Value, &str) -> Result<T>,
) -> Result<Vec<T>> {
    use anyhow::Context;
    let text = crate::files::read_text(path)?;
    let mut out = Vec::new();
    let lines = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty());
    for (i, line) in lines.take(limit) {
        let at = format!("{} line {}", path.display(), i + 1);
        let v: serde_json::Value =
            serde_json::from_str(line).with_context(|| format!("{at}: not JSON"))?;
        out.push(item(&v, &at)?);
    }
    ensure!(!out.is_empty(), "{}: no prompts", path.display());
    Ok(out)
}

/// The user turn of a prompt line: its `"question"`, Spec-Bench's `"turns"[0]`, or the first
/// user message of a chat document's `"messages"`.
pub fn user_turn<'a>(v: &'a serde_json::Value, at: &str) -> Result<&'a str> {
    let user = v["question"]
        .as_str()
        .or_else(|| v["turns"][0].as_str())
        .or_else(|| {
            v["messages"]
                .as_array()?
                .iter()
                .find(|m| m["role"] == "user")?["content"]
                .as_str()
        });
    user.ok_or_else(|| {
        anyhow::anyhow!("{at}: no string \"question\", \"turns\"[0] or user message")
    })
}

/// The first `limit` prompts of a JSON Lines file (a "question", Spec-Bench "turns" or chat
/// "messages" per line, see [`user_turn`]), each rendered with the chat template.
pub fn read_prompts(path: &Path, tok: &Tokenizer, limit: usize) -> Result<Vec<Vec<u32>>> {
    read_jsonl(path, limit, |v, at| chat_tokens(tok, user_turn(v, at)?, at))
}

/// `user` rendered with the chat template and tokenized; no tokens is an error naming `at`.
pub fn chat_tokens(tok: &Tokenizer, user: &str, at: &str) -> Result<Vec<u32>> {
    let ids = tok.encode(&tok.chat_prompt(user)?)?;
    ensure!(!ids.is_empty(), "{at}: the prompt encodes to no tokens");
    Ok(ids)
}
