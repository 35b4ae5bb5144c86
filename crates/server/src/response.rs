//! OpenAI response bodies: whole completions, streamed chunks, `usage` and the `specfit`
//! extension object with the decoding statistics. It only shapes JSON; the values come from
//! `http`.

use serde_json::{json, Value};

use crate::api::Endpoint;
use crate::decoder::DecodeStats;

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

/// `usage`: prompt, completion and total tokens.
pub fn usage(stats: &DecodeStats, completion_tokens: usize) -> Value {
    json!({
        "prompt_tokens": stats.prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": stats.prompt_tokens + completion_tokens,
    })
}

/// The `specfit` extension: how the output was decoded and what it cost.
pub fn extension(policy: &str, stats: &DecodeStats, time_to_first_token: f64) -> Value {
    let per = |a: f64, b: usize| if b > 0 { a / b as f64 } else { 0.0 };
    json!({
        "policy": policy,
        "cycles": stats.cycles,
        "tokens_per_cycle": per(stats.committed as f64, stats.cycles),
        "nodes_verified_per_cycle": per(stats.verified_nodes as f64, stats.cycles),
        "expert_copies": stats.expert_copies,
        "expert_bytes_copied": stats.expert_bytes,
        "expert_copies_per_token": per(stats.expert_copies as f64, stats.completion_tokens),
        "prefill_ms": 1e3 * stats.prefill_seconds,
        "time_to_first_token_ms": 1e3 * time_to_first_token,
        "decode_tokens_per_second": if stats.decode_seconds > 0.0 {
            stats.completion_tokens.saturating_sub(1) as f64 / stats.decode_seconds
        } else {
            0.0
        },
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

/// The chunk that ends the choice: its finish reason, the `specfit` extension and, with
/// `token_ids`, the output's ids.
pub fn last_chunk(
    head: &Head,
    finish: Finish,
    extension: Value,
    token_ids: Option<&[u32]>,
    with_usage_field: bool,
) -> Value {
    let mut c = chunk(head, "", false, with_usage_field);
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
