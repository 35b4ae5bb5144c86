//! The checkpoint's tokenizer (`tokenizer.json`, Hugging Face `tokenizers`), its chat format
//! (`tokenizer_config.json`'s `chat_template`) and the incremental detokenizer that turns ids into
//! text as they are generated. Only ChatML templates are rendered (the Qwen
//! family's format: `<|im_start|>role\ncontent<|im_end|>\n`); any other template is an error
//! rather than a silently different prompt. It does not know about models.

use std::path::{Path, PathBuf};

use crate::error::EngineError;

/// A loaded tokenizer plus its chat format.
#[derive(Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    chat_template: Option<String>,
    /// The texts of the beginning- and end-of-sequence tokens, for chat templates.
    bos_token: Option<String>,
    eos_token: Option<String>,
    path: PathBuf,
    /// A copy that reads special token texts as plain text, made on first use
    /// ([`Tokenizer::encode_literal`]).
    literal: std::sync::OnceLock<tokenizers::Tokenizer>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("path", &self.path)
            .finish()
    }
}

impl Tokenizer {
    /// Loads `dir/tokenizer.json` and, when present, the chat template of
    /// `dir/tokenizer_config.json`. When `dir` is a GGUF file: the `tokenizer.json` (and
    /// `tokenizer_config.json`) beside it if there is one, else the tokenizer the file carries
    /// ([`crate::gguf::tokenizer_json`]).
    pub fn load(dir: &Path) -> Result<Tokenizer, EngineError> {
        if crate::gguf::is_gguf(dir) {
            let beside = dir.parent().unwrap_or(Path::new("."));
            if beside.join("tokenizer.json").exists() {
                return Tokenizer::load(beside);
            }
            return Tokenizer::from_gguf(dir);
        }
        let path = dir.join("tokenizer.json");
        if !path.exists() {
            return Err(EngineError::Io {
                path: path.clone(),
                error: std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "no tokenizer.json in the model directory",
                ),
            });
        }
        let inner = tokenizers::Tokenizer::from_file(&path).map_err(|e| EngineError::Json {
            path: path.clone(),
            message: e.to_string(),
        })?;
        let config = dir.join("tokenizer_config.json");
        let config: serde_json::Value = if config.exists() {
            let text = std::fs::read_to_string(&config).map_err(EngineError::io(&config))?;
            serde_json::from_str(&text).map_err(|e| EngineError::Json {
                path: config.clone(),
                message: e.to_string(),
            })?
        } else {
            serde_json::Value::Null
        };
        // A special token is written as its text or as an added-token object with "content".
        let special = |key: &str| {
            let v = &config[key];
            v.as_str()
                .or_else(|| v["content"].as_str())
                .map(str::to_string)
        };
        Ok(Tokenizer {
            inner,
            chat_template: config["chat_template"].as_str().map(str::to_string),
            bos_token: special("bos_token"),
            eos_token: special("eos_token"),
            path,
            literal: std::sync::OnceLock::new(),
        })
    }

    /// The tokenizer and chat template a GGUF file carries in its metadata.
    pub fn from_gguf(path: &Path) -> Result<Tokenizer, EngineError> {
        let file = crate::gguf::open(path)?;
        let (json, chat_template) = crate::gguf::tokenizer_json(path, file.header())?;
        let inner: tokenizers::Tokenizer = json.parse().map_err(|e| EngineError::Json {
            path: path.to_path_buf(),
            message: format!("the GGUF tokenizer: {e}"),
        })?;
        let special = |key: &str| {
            let id = file.header().get(key)?.as_u64()?;
            inner.id_to_token(u32::try_from(id).ok()?)
        };
        Ok(Tokenizer {
            bos_token: special("tokenizer.ggml.bos_token_id"),
            eos_token: special("tokenizer.ggml.eos_token_id"),
            inner,
            chat_template,
            path: path.to_path_buf(),
            literal: std::sync::OnceLock::new(),
        })
    }

    /// Token ids of `text` (special tokens written in the text are recognised).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, EngineError> {
        self.inner
            .encode(text, false)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| EngineError::Json {
                path: self.path.clone(),
                message: format!("encoding: {e}"),
            })
    }

    /// Token ids of `text` with every special token's text read as plain text (what a user
    /// typed can never become a control token this way). The first call makes a second copy of
    /// the tokenizer for this, kept for later calls.
    pub fn encode_literal(&self, text: &str) -> Result<Vec<u32>, EngineError> {
        let literal = self.literal.get_or_init(|| {
            let mut literal = self.inner.clone();
            literal.set_encode_special_tokens(true);
            literal
        });
        literal
            .encode(text, false)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| EngineError::Json {
                path: self.path.clone(),
                message: format!("encoding: {e}"),
            })
    }

    /// The texts of the special (control) tokens, such as `<|im_start|>`, longest first.
    pub fn special_tokens(&self) -> Vec<String> {
        let mut texts: Vec<String> = self
            .inner
            .get_added_tokens_decoder()
            .into_values()
            .filter(|t| t.special && !t.content.is_empty())
            .map(|t| t.content)
            .collect();
        texts.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        texts.dedup();
        texts
    }

    /// Text of `ids`, without special tokens.
    pub fn decode(&self, ids: &[u32]) -> Result<String, EngineError> {
        self.inner.decode(ids, true).map_err(|e| EngineError::Json {
            path: self.path.clone(),
            message: format!("decoding: {e}"),
        })
    }

    /// The id of a special token such as `<|im_end|>`.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The checkpoint's Jinja chat template (`tokenizer_config.json`'s `chat_template`, or the
    /// GGUF's `tokenizer.chat_template`), when it has one.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// The text of the beginning-of-sequence token (`bos_token` of `tokenizer_config.json`, or
    /// the GGUF's `tokenizer.ggml.bos_token_id`), when the model names one.
    pub fn bos_token(&self) -> Option<&str> {
        self.bos_token.as_deref()
    }

    /// The text of the end-of-sequence token, when the model names one.
    pub fn eos_token(&self) -> Option<&str> {
        self.eos_token.as_deref()
    }

    /// `prompt` as one user turn followed by the assistant's turn, in the checkpoint's ChatML
    /// format.
    pub fn chat_prompt(&self, prompt: &str) -> Result<String, EngineError> {
        match &self.chat_template {
            Some(t) if t.contains("<|im_start|>") && t.contains("<|im_end|>") => Ok(format!(
                "<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"
            )),
            Some(_) => Err(EngineError::Config {
                field: "chat_template",
                value: "(not ChatML)".into(),
                reason: "only ChatML chat templates are supported",
            }),
            None => Err(EngineError::Config {
                field: "chat_template",
                value: "(missing)".into(),
                reason: "tokenizer_config.json has no chat_template; drop --chat",
            }),
        }
    }
}

/// Token ids turned into text as they arrive, whole characters only: the incremental
/// detokenizer of TGI and vLLM. Each step decodes the short window `ids[prefix..]` (not the
/// whole output), so streaming n tokens costs O(n), and what it emits adds up to the decode of
/// all the ids.
#[derive(Debug, Default, Clone)]
pub struct TextDecoder {
    ids: Vec<u32>,
    /// `ids[prefix..read]` was decoded and emitted before; the window starts at `prefix` so that
    /// a token's text is decoded beside its predecessor (spaces and merged bytes come out right).
    prefix: usize,
    read: usize,
}

impl TextDecoder {
    pub fn new() -> TextDecoder {
        TextDecoder::default()
    }

    /// Tokens taken so far.
    pub fn tokens(&self) -> &[u32] {
        &self.ids
    }

    /// Takes one token; returns the text that can be shown now (empty while a character is
    /// incomplete).
    pub fn push(&mut self, tokenizer: &Tokenizer, token: u32) -> Result<String, EngineError> {
        self.ids.push(token);
        match self.grown(tokenizer)? {
            // A trailing U+FFFD is an incomplete character: wait for the next token.
            Some(text) if !text.ends_with('\u{FFFD}') => {
                self.emitted();
                Ok(text)
            }
            _ => Ok(String::new()),
        }
    }

    /// The text not emitted yet once generation ended (a final incomplete character comes out
    /// as U+FFFD).
    pub fn finish(&mut self, tokenizer: &Tokenizer) -> Result<String, EngineError> {
        let text = self.grown(tokenizer)?.unwrap_or_default();
        self.emitted();
        Ok(text)
    }

    /// The text the ids after `read` add to the window, when it grew by whole characters.
    fn grown(&self, tokenizer: &Tokenizer) -> Result<Option<String>, EngineError> {
        let before = tokenizer.decode(&self.ids[self.prefix..self.read])?;
        let now = tokenizer.decode(&self.ids[self.prefix..])?;
        let grew = now.len() > before.len() && now.is_char_boundary(before.len());
        Ok(grew.then(|| now[before.len()..].to_string()))
    }

    /// Moves the window past the ids just emitted.
    fn emitted(&mut self) {
        (self.prefix, self.read) = (self.read, self.ids.len());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shipped() -> Tokenizer {
        Tokenizer::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/target")).unwrap()
    }

    #[test]
    fn streamed_pieces_add_up_to_the_whole_decode_whatever_the_characters() {
        let tok = shipped();
        for text in [
            "Natalia sold 48/2 = 24 clips in May. ✓ 日本語 — \"quotes\" and emoji 🎉!",
            "  leading spaces,\n\nnew lines\tand tabs ",
            "🎉🎉🎉",
        ] {
            let ids = tok.encode(text).unwrap();
            let mut stream = TextDecoder::new();
            let mut out = String::new();
            for &id in &ids {
                out.push_str(&stream.push(&tok, id).unwrap());
            }
            out.push_str(&stream.finish(&tok).unwrap());
            assert_eq!(out, tok.decode(&ids).unwrap(), "{text:?}");
            assert_eq!(stream.tokens(), &ids[..]);
        }
    }

    #[test]
    fn an_incomplete_character_is_held_back_then_finished_as_a_replacement_character() {
        let tok = shipped();
        let ids = tok.encode("ok 🎉").unwrap();
        let mut stream = TextDecoder::new();
        let shown: String = ids[..ids.len() - 1]
            .iter()
            .map(|&id| stream.push(&tok, id).unwrap())
            .collect();
        assert!(!shown.contains('\u{FFFD}'), "{shown:?}");
        assert_eq!(
            stream.finish(&tok).unwrap().chars().last(),
            Some('\u{FFFD}')
        );
    }
}
