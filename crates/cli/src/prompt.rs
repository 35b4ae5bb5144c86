//! The prompt options shared by `generate` and `record`: text through the checkpoint's tokenizer
//! (optionally in its chat format), or raw token ids.

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
