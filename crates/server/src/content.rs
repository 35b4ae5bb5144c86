//! Chat prompts whose message *content* stays text: a special token's text that a client writes
//! into a message (`<|im_start|>system …`) is tokenized as the plain text it is, so only the chat
//! template's own markup makes control tokens. It renders through [`ChatTemplate`] and tokenizes
//! through the engine's [`Tokenizer`]; it does not decide what the template says.
//!
//! How: every special token's text in a content is swapped for a placeholder made of
//! private-use characters and a per-request nonce before rendering; after rendering, the text
//! between placeholders is tokenized as usual (the template's markup parses into control tokens)
//! and each placeholder as its special token's text read literally. A content without special
//! token texts renders and tokenizes exactly as before.

use specfit_engine::Tokenizer;

use crate::chat::{ChatTemplate, Message};
use crate::error::ApiError;

/// How chat messages become a prompt: the model's template, and whether special token texts in
/// message content are read as control tokens (`special_tokens_in_content`, the old and unsafe
/// way) or as text (the default).
pub struct ChatFormat {
    template: ChatTemplate,
    special_tokens_in_content: bool,
    /// The tokenizer's special token texts, longest first (read once, not per request).
    specials: Vec<String>,
}

impl ChatFormat {
    pub fn new(
        template: ChatTemplate,
        tokenizer: &Tokenizer,
        special_tokens_in_content: bool,
    ) -> ChatFormat {
        ChatFormat {
            template,
            special_tokens_in_content,
            specials: tokenizer.special_tokens(),
        }
    }

    /// The token ids of `messages` (`nonce`: a fresh number per request, see the module docs).
    pub fn ids(
        &self,
        tokenizer: &Tokenizer,
        messages: &[Message],
        kwargs: &serde_json::Map<String, serde_json::Value>,
        nonce: u64,
    ) -> Result<Vec<u32>, ApiError> {
        if !self.special_tokens_in_content {
            return chat_ids(self, tokenizer, messages, kwargs, nonce);
        }
        let text = self.template.render(messages, kwargs)?;
        tokenizer
            .encode(&text)
            .map_err(|e| ApiError::invalid("messages", format!("tokenizing: {e}")))
    }
}

const OPEN: char = '\u{E000}';
const CLOSE: char = '\u{E001}';

/// The token ids of `messages` rendered by `format`'s template, content kept literal.
fn chat_ids(
    format: &ChatFormat,
    tokenizer: &Tokenizer,
    messages: &[Message],
    kwargs: &serde_json::Map<String, serde_json::Value>,
    nonce: u64,
) -> Result<Vec<u32>, ApiError> {
    let specials = &format.specials;
    let escaped: Vec<Message> = messages
        .iter()
        .map(|m| Message {
            role: m.role.clone(),
            content: escape(&m.content, specials, nonce),
        })
        .collect();
    let rendered = format.template.render(&escaped, kwargs)?;
    let mut ids = Vec::new();
    for piece in split(&rendered, nonce) {
        let encoded = match piece {
            Piece::Markup(text) => tokenizer.encode(text),
            Piece::Literal(k) => tokenizer.encode_literal(&specials[k]),
        };
        ids.extend(encoded.map_err(|e| ApiError::invalid("messages", format!("tokenizing: {e}")))?);
    }
    Ok(ids)
}

/// `content` with each special token text `specials[k]` (longest first) swapped for its
/// placeholder.
fn escape(content: &str, specials: &[String], nonce: u64) -> String {
    let mut out = content.to_string();
    for (k, special) in specials.iter().enumerate() {
        if out.contains(special.as_str()) {
            out = out.replace(special.as_str(), &placeholder(k, nonce));
        }
    }
    out
}

fn placeholder(k: usize, nonce: u64) -> String {
    format!("{OPEN}{nonce:016x}:{k}{CLOSE}")
}

/// A stretch of the rendered prompt.
#[derive(Debug, PartialEq)]
enum Piece<'a> {
    /// Template markup and ordinary content: tokenized with special tokens parsed.
    Markup(&'a str),
    /// The special token text `specials[k]` a client wrote: tokenized as text.
    Literal(usize),
}

/// `rendered` cut at this request's placeholders (anything else that looks like one is text).
fn split(rendered: &str, nonce: u64) -> Vec<Piece<'_>> {
    let prefix = format!("{OPEN}{nonce:016x}:");
    let mut pieces = Vec::new();
    let mut rest = rendered;
    while let Some(at) = rest.find(&prefix) {
        let tail = &rest[at + prefix.len()..];
        let Some(end) = tail.find(CLOSE) else { break };
        let Ok(k) = tail[..end].parse::<usize>() else {
            break;
        };
        if at > 0 {
            pieces.push(Piece::Markup(&rest[..at]));
        }
        pieces.push(Piece::Literal(k));
        rest = &tail[end + CLOSE.len_utf8()..];
    }
    if !rest.is_empty() {
        pieces.push(Piece::Markup(rest));
    }
    pieces
}

#[cfg(test)]
mod tests {
    use super::*;

    fn specials() -> Vec<String> {
        vec!["<|im_start|>".into(), "<|im_end|>".into()]
    }

    #[test]
    fn special_token_texts_in_content_become_placeholders_and_split_back_out() {
        let escaped = escape("a<|im_end|>b<|im_start|>", &specials(), 7);
        assert!(!escaped.contains("<|im"));
        let rendered = format!("<|im_start|>user\n{escaped}<|im_end|>");
        assert_eq!(
            split(&rendered, 7),
            vec![
                Piece::Markup("<|im_start|>user\na"),
                Piece::Literal(1),
                Piece::Markup("b"),
                Piece::Literal(0),
                Piece::Markup("<|im_end|>"),
            ]
        );
    }

    #[test]
    fn content_without_special_token_texts_is_left_alone() {
        assert_eq!(
            escape("plain <| text |>", &specials(), 1),
            "plain <| text |>"
        );
        assert_eq!(split("plain", 1), vec![Piece::Markup("plain")]);
    }

    #[test]
    fn a_forged_placeholder_with_another_nonce_stays_text() {
        let forged = placeholder(0, 99);
        assert_eq!(split(&forged, 1), vec![Piece::Markup(&forged)]);
    }
}
