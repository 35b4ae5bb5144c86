//! Generated token ids turned into text as they arrive: incremental detokenization
//! ([`TextDecoder`]: only whole characters are emitted) and `stop` strings (text that could
//! still become a stop string is held back; a match ends the text just before it). It does not
//! decode or stream anything.

use specfit_engine::{TextDecoder, Tokenizer};

use crate::error::ApiError;

/// The text of one generation so far.
#[derive(Debug)]
pub struct TextStream {
    decoder: TextDecoder,
    stops: Vec<String>,
    /// Decoded text not yet emitted because it may be the start of a stop string.
    held: String,
    stopped: bool,
}

impl TextStream {
    pub fn new(stops: Vec<String>) -> TextStream {
        TextStream {
            decoder: TextDecoder::new(),
            stops,
            held: String::new(),
            stopped: false,
        }
    }

    /// Tokens taken so far (the ones after a stop-string match are not taken).
    pub fn tokens(&self) -> &[u32] {
        self.decoder.tokens()
    }

    /// Whether a stop string matched; later tokens are ignored.
    pub fn stopped(&self) -> bool {
        self.stopped
    }

    /// Takes one token; returns the text that can be shown now (maybe empty).
    pub fn push(&mut self, tokenizer: &Tokenizer, token: u32) -> Result<String, ApiError> {
        if self.stopped {
            return Ok(String::new());
        }
        let text = self.decoder.push(tokenizer, token).map_err(detokenizing)?;
        self.held.push_str(&text);
        Ok(self.release())
    }

    /// The rest of the text once generation ended (held-back text that matched no stop string,
    /// and a final incomplete character as U+FFFD).
    pub fn finish(&mut self, tokenizer: &Tokenizer) -> Result<String, ApiError> {
        if self.stopped {
            return Ok(String::new());
        }
        let text = self.decoder.finish(tokenizer).map_err(detokenizing)?;
        self.held.push_str(&text);
        let mut out = self.release();
        if !self.stopped {
            out.push_str(&std::mem::take(&mut self.held));
        }
        Ok(out)
    }

    /// Emits the held text up to the first stop string (then stops), or all but its longest
    /// tail that a stop string starts with.
    fn release(&mut self) -> String {
        let first = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()))
            .min();
        if let Some(at) = first {
            self.stopped = true;
            let out = self.held[..at].to_string();
            self.held.clear();
            return out;
        }
        let keep = self
            .held
            .char_indices()
            .map(|(i, _)| i)
            .find(|&i| {
                let tail = &self.held[i..];
                self.stops.iter().any(|s| s.starts_with(tail))
            })
            .unwrap_or(self.held.len());
        let rest = self.held.split_off(keep);
        std::mem::replace(&mut self.held, rest)
    }
}

fn detokenizing(e: specfit_engine::EngineError) -> ApiError {
    ApiError::internal(format!("detokenizing the output: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn tokenizer() -> Tokenizer {
        Tokenizer::load(
            &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/target"),
        )
        .unwrap()
    }

    /// All the text a stream emits for `ids`.
    fn stream(tok: &Tokenizer, ids: &[u32], stops: &[&str]) -> (String, usize) {
        let mut s = TextStream::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = String::new();
        for &id in ids {
            out.push_str(&s.push(tok, id).unwrap());
        }
        out.push_str(&s.finish(tok).unwrap());
        (out, s.tokens().len())
    }

    #[test]
    fn streamed_pieces_add_up_to_the_whole_decode() {
        let tok = tokenizer();
        let text = "Natalia sold 48/2 = 24 clips in May. ✓ 日本語 — \"quotes\" and emoji 🎉!";
        let ids = tok.encode(text).unwrap();
        let (out, n) = stream(&tok, &ids, &[]);
        assert_eq!(out, tok.decode(&ids).unwrap());
        assert_eq!(n, ids.len());
    }

    #[test]
    fn a_stop_string_ends_the_text_just_before_it_even_across_tokens() {
        let tok = tokenizer();
        let ids = tok
            .encode("The answer is 84.\n\nQuestion: what next?")
            .unwrap();
        let (out, n) = stream(&tok, &ids, &["\n\nQuestion"]);
        assert_eq!(out, "The answer is 84.");
        assert!(n < ids.len());
        // Text that only starts like a stop string is released at the end.
        let (out, _) = stream(&tok, &tok.encode("one two thr").unwrap(), &["three"]);
        assert_eq!(out, "one two thr");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn stopping_equals_cutting_the_whole_text_at_the_first_stop_string(
            words in proptest::collection::vec("[a-c]{1,3}|é|\n|  ", 1..30),
            stop in "[a-c]{1,4}|\n[a-c]",
        ) {
            let tok = tokenizer();
            let text: String = words.concat();
            let ids = tok.encode(&text).unwrap();
            let whole = tok.decode(&ids).unwrap();
            let want = whole.find(&stop).map_or(whole.as_str(), |at| &whole[..at]);
            let (out, _) = stream(&tok, &ids, &[stop.as_str()]);
            prop_assert_eq!(out, want);
        }
    }
}
