//! OpenAI response bodies: whole completions, streamed chunks, `usage` and the `specfit`
//! extension object with the decoding statistics. It only shapes JSON; the values come from
//! `http`.

use serde_json::{json, Value};

use crate::api::Endpoint;
use crate::decoder::RequestStats;

/// What every response of one request shares.
#[derive(Debug, Clone)]
pub struct Head {
    pub endpoint: Endpoint,
    pub id: String,
    pub created: u64,
    pub model: String,
}

impl Head {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.endpoint, chunk) {
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
            (Endpoint::Completions, _) => "text_completion",
        }
    }
}

/// How the output ended, as OpenAI names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// A stop token or stop string.
    Stop,
    /// `max_tokens` reached.
    Length,
    /// The server cancelled it (shutting down).
    Abort,
}

impl Finish {
    pub fn name(self) -> &'static str {
        match self {
            Finish::Stop => "stop",
            Finish::Length => "length",
            Finish::Abort => "abort",
        }
    }
}

/// `usage`: prompt, completion and total tokens, and the prompt tokens taken from the prompt
/// cache (`prompt_tokens_details.cached_tokens`, as OpenAI reports it).
pub fn usage(stats: &RequestStats, completion_tokens: usize) -> Value {
    json!({
        "prompt_tokens": stats.prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": stats.prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": stats.cached_prompt_tokens},
    })
}

/// The `specfit` extension: how the output was decoded and what it cost.
pub fn extension(policy: &str, stats: &RequestStats, time_to_first_token: f64) -> Value {
    let per = |a: f64, b: usize| if b > 0 { a / b as f64 } else { 0.0 };
    json!({
        "policy": policy,
        "cycles": stats.cycles,
        "tokens_per_cycle": stats.tokens_per_cycle(),
        "nodes_verified_per_cycle": per(stats.verified_nodes as f64, stats.cycles),
        "expert_copies": stats.expert_copies,
        "expert_bytes_copied": stats.expert_bytes,
        "expert_copies_per_token": per(stats.expert_copies as f64, stats.completion_tokens),
        "prefill_ms": 1e3 * stats.prefill_seconds,
        "time_to_first_token_ms": 1e3 * time_to_first_token,
        "decode_tokens_per_second": stats.decode_tokens_per_second(),
    })
}

/// The whole (non-streamed) response.
pub struct Whole<'a> {
    pub text: &'a str,
    pub finish: Finish,
    pub usage: Value,
    pub extension: Value,
    /// `return_token_ids`: (prompt ids, output ids).
    pub token_ids: Option<(&'a [u32], &'a [u32])>,
}

pub fn whole(head: &Head, w: Whole<'_>) -> Value {
    let mut choice = match head.endpoint {
        Endpoint::Chat => json!({
            "index": 0,
            "message": {"role": "assistant", "content": w.text},
            "logprobs": null,
            "finish_reason": w.finish.name(),
        }),
        Endpoint::Completions => json!({
            "index": 0,
            "text": w.text,
            "logprobs": null,
            "finish_reason": w.finish.name(),
        }),
    };
    if let Some((prompt, output)) = w.token_ids {
        choice["token_ids"] = json!(output);
        choice["prompt_token_ids"] = json!(prompt);
    }
    json!({
        "id": head.id,
        "object": head.object(false),
        "created": head.created,
        "model": head.model,
        "choices": [choice],
        "usage": w.usage,
        "specfit": w.extension,
    })
}

/// One streamed chunk with new text (chat: `role` set on the first).
pub fn chunk(head: &Head, text: &str, first: bool, with_usage_field: bool) -> Value {
    let choice = match head.endpoint {
        Endpoint::Chat if first => json!({
            "index": 0, "delta": {"role": "assistant", "content": text},
            "logprobs": null, "finish_reason": null,
        }),
        Endpoint::Chat => json!({
            "index": 0, "delta": {"content": text}, "logprobs": null, "finish_reason": null,
        }),
        Endpoint::Completions => json!({
            "index": 0, "text": text, "logprobs": null, "finish_reason": null,
        }),
    };
    let mut c = json!({
        "id": head.id,
        "object": head.object(true),
        "created": head.created,
        "model": head.model,
        "choices": [choice],
    });
    if with_usage_field {
        c["usage"] = Value::Null;
    }
    c
}

/// The chunk that ends the choice: its finish reason, the `specfit` extension, with
/// `token_ids` the output's ids, and `usage` — null when a separate usage chunk follows
/// (`stream_options.include_usage`, as OpenAI specifies), else the usage itself.
pub fn last_chunk(
    head: &Head,
    finish: Finish,
    extension: Value,
    token_ids: Option<&[u32]>,
    usage: Option<Value>,
) -> Value {
    let mut c = chunk(head, "", false, true);
    c["usage"] = usage.unwrap_or(Value::Null);
    let choice = &mut c["choices"][0];
    choice["finish_reason"] = finish.name().into();
    if head.endpoint == Endpoint::Chat {
        choice["delta"] = json!({});
    }
    if let Some(ids) = token_ids {
        choice["token_ids"] = json!(ids);
    }
    c["specfit"] = extension;
    c
}

/// The extra chunk `stream_options.include_usage` asks for: no choices, the usage.
pub fn usage_chunk(head: &Head, usage: Value) -> Value {
    json!({
        "id": head.id,
        "object": head.object(true),
        "created": head.created,
        "model": head.model,
        "choices": [],
        "usage": usage,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(endpoint: Endpoint) -> Head {
        Head {
            endpoint,
            id: "x-1".into(),
            created: 7,
            model: "m".into(),
        }
    }

    fn stats() -> RequestStats {
        RequestStats {
            prompt_tokens: 5,
            cached_prompt_tokens: 2,
            completion_tokens: 3,
            cycles: 2,
            committed: 2,
            decode_seconds: 0.5,
            ..RequestStats::default()
        }
    }

    #[test]
    fn whole_responses_carry_the_choice_usage_and_extension_in_openai_shape() {
        let w = |endpoint| {
            whole(
                &head(endpoint),
                Whole {
                    text: "hi",
                    finish: Finish::Length,
                    usage: usage(&stats(), 3),
                    extension: extension("specfit", &stats(), 0.01),
                    token_ids: Some((&[1, 2], &[3])),
                },
            )
        };
        let chat = w(Endpoint::Chat);
        assert_eq!(chat["object"], "chat.completion");
        assert_eq!(chat["choices"][0]["message"]["content"], "hi");
        assert_eq!(chat["choices"][0]["finish_reason"], "length");
        assert_eq!(chat["usage"]["total_tokens"], 8);
        assert_eq!(chat["usage"]["prompt_tokens_details"]["cached_tokens"], 2);
        assert_eq!(chat["specfit"]["tokens_per_cycle"], 1.0);
        assert_eq!(chat["specfit"]["decode_tokens_per_second"], 4.0);
        assert_eq!(chat["choices"][0]["prompt_token_ids"], json!([1, 2]));
        let text = w(Endpoint::Completions);
        assert_eq!(text["object"], "text_completion");
        assert_eq!(text["choices"][0]["text"], "hi");
    }

    #[test]
    fn streamed_chunks_follow_openai_usage_rules() {
        let h = head(Endpoint::Chat);
        let first = chunk(&h, "a", true, false);
        assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
        assert!(first.get("usage").is_none());
        assert!(chunk(&h, "b", false, false)["choices"][0]["delta"]
            .get("role")
            .is_none());
        // With include_usage: null on every choice chunk, then a usage chunk with no choices.
        let last = last_chunk(&h, Finish::Stop, json!({}), None, None);
        assert_eq!(last["usage"], Value::Null);
        assert_eq!(last["choices"][0]["delta"], json!({}));
        assert_eq!(last["choices"][0]["finish_reason"], "stop");
        let u = usage_chunk(&h, usage(&stats(), 3));
        assert_eq!(u["choices"], json!([]));
        assert_eq!(u["usage"]["completion_tokens"], 3);
        // Without it, the usage rides on the last chunk.
        let last = last_chunk(&h, Finish::Stop, json!({}), None, Some(usage(&stats(), 3)));
        assert_eq!(last["usage"]["prompt_tokens"], 5);
        assert_eq!(
            chunk(&head(Endpoint::Completions), "t", true, false)["object"],
            "text_completion"
        );
    }
}
