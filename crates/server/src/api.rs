//! OpenAI request bodies (`/v1/chat/completions`, `/v1/completions`) checked field by field into
//! [`Params`]: every wrong type, range or unsupported option is a 400 naming the field. It does
//! not tokenize or check the context length; `http` does that with the model at hand.

use serde_json::{Map, Value};

use crate::chat::Message;
use crate::error::ApiError;

/// The two generation endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completions,
}

impl Endpoint {
    pub fn name(self) -> &'static str {
        match self {
            Endpoint::Chat => "chat",
            Endpoint::Completions => "completions",
        }
    }

    /// The request field that holds the prompt (`messages` or `prompt`), named in errors about it.
    pub fn prompt_field(self) -> &'static str {
        match self {
            Endpoint::Chat => "messages",
            Endpoint::Completions => "prompt",
        }
    }
}

/// What to continue.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    /// Messages for the chat template, with extra template variables.
    Chat {
        messages: Vec<Message>,
        kwargs: Map<String, Value>,
    },
    Text(String),
    Ids(Vec<u32>),
}

/// A checked generation request.
#[derive(Debug, Clone, PartialEq)]
pub struct Params {
    pub endpoint: Endpoint,
    pub model: Option<String>,
    pub prompt: Prompt,
    /// `max_completion_tokens`, else `max_tokens`; None: up to the context.
    pub max_tokens: Option<usize>,
    pub temperature: f32,
    pub top_p: f32,
    pub seed: Option<u64>,
    pub stop: Vec<String>,
    pub stream: bool,
    /// `stream_options.include_usage`: a last chunk with `usage`.
    pub include_usage: bool,
    /// vLLM's extension: the prompt's and the output's token ids in the response.
    pub return_token_ids: bool,
    /// vLLM's extension: do not stop at end-of-sequence tokens (for timing fixed lengths).
    pub ignore_eos: bool,
}

/// Most stop sequences, as OpenAI allows.
pub const MAX_STOPS: usize = 4;

/// Parses and checks a request body for `endpoint`.
pub fn parse(endpoint: Endpoint, body: &[u8]) -> Result<Params, ApiError> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::request(400, format!("the request body is not valid JSON: {e}")))?;
    let Value::Object(o) = v else {
        return Err(ApiError::request(
            400,
            "the request body must be a JSON object",
        ));
    };
    let prompt = match endpoint {
        Endpoint::Chat => Prompt::Chat {
            messages: messages(o.get("messages"))?,
            kwargs: object(&o, "chat_template_kwargs")?.unwrap_or_default(),
        },
        Endpoint::Completions => prompt(o.get("prompt"))?,
    };
    unsupported(&o, endpoint)?;
    let max_tokens = match (
        count(&o, "max_completion_tokens")?,
        count(&o, "max_tokens")?,
    ) {
        (Some(n), _) | (None, Some(n)) => Some(n),
        (None, None) => None,
    };
    let temperature = number(&o, "temperature")?.unwrap_or(1.0);
    if !(0.0..=2.0).contains(&temperature) {
        return Err(ApiError::invalid(
            "temperature",
            format!("temperature must be between 0 and 2, got {temperature}"),
        ));
    }
    let top_p = number(&o, "top_p")?.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::invalid(
            "top_p",
            format!("top_p must be in (0, 1], got {top_p}"),
        ));
    }
    let n = integer(&o, "n")?.unwrap_or(1);
    if n != 1 {
        return Err(ApiError::invalid(
            "n",
            format!("only n = 1 is supported, got {n}"),
        ));
    }
    let stream = boolean(&o, "stream")?.unwrap_or(false);
    let include_usage = match object(&o, "stream_options")? {
        Some(opts) => boolean(&opts, "include_usage")?.unwrap_or(false),
        None => false,
    };
    Ok(Params {
        endpoint,
        model: string(&o, "model")?,
        prompt,
        max_tokens,
        temperature: temperature as f32,
        top_p: top_p as f32,
        seed: integer(&o, "seed")?.map(|s| s as u64),
        stop: stops(o.get("stop"))?,
        stream,
        include_usage,
        return_token_ids: boolean(&o, "return_token_ids")?.unwrap_or(false),
        ignore_eos: boolean(&o, "ignore_eos")?.unwrap_or(false),
    })
}

/// `messages`: a non-empty array of `{role, content}` with known roles and text content.
fn messages(v: Option<&Value>) -> Result<Vec<Message>, ApiError> {
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Err(ApiError::invalid("messages", "messages is required"));
    };
    let Value::Array(list) = v else {
        return Err(ApiError::invalid("messages", "messages must be an array"));
    };
    if list.is_empty() {
        return Err(ApiError::invalid("messages", "messages must not be empty"));
    }
    list.iter()
        .enumerate()
        .map(|(i, m)| message(i, m))
        .collect()
}

fn message(i: usize, m: &Value) -> Result<Message, ApiError> {
    let at = |f: &str| format!("messages[{i}].{f}");
    let Value::Object(m) = m else {
        return Err(ApiError::invalid(
            &format!("messages[{i}]"),
            "each message must be an object",
        ));
    };
    let role = match m.get("role") {
        Some(Value::String(r)) => r.as_str(),
        Some(_) => return Err(ApiError::invalid(&at("role"), "role must be a string")),
        None => return Err(ApiError::invalid(&at("role"), "role is required")),
    };
    let role = match role {
        "system" | "user" | "assistant" | "tool" => role,
        "developer" => "system", // OpenAI's newer name for system instructions
        other => {
            return Err(ApiError::invalid(
                &at("role"),
                format!(
                    "unknown role {other:?}: expected system, developer, user, assistant or tool"
                ),
            ))
        }
    };
    let content = match m.get("content") {
        Some(Value::String(s)) => s.clone(),
        None | Some(Value::Null) if role == "assistant" => String::new(),
        Some(Value::Array(parts)) => text_parts(&at("content"), parts)?,
        None | Some(Value::Null) => {
            return Err(ApiError::invalid(&at("content"), "content is required"))
        }
        Some(_) => {
            return Err(ApiError::invalid(
                &at("content"),
                "content must be a string or an array of text parts",
            ))
        }
    };
    Ok(Message {
        role: role.to_string(),
        content,
    })
}

/// `[{"type": "text", "text": …}, …]` joined; other part types are refused (text-only model).
fn text_parts(at: &str, parts: &[Value]) -> Result<String, ApiError> {
    let mut out = String::new();
    for p in parts {
        match (p.get("type").and_then(Value::as_str), p.get("text")) {
            (Some("text"), Some(Value::String(t))) => out.push_str(t),
            (Some("text"), _) => {
                return Err(ApiError::invalid(at, "a text part needs a string \"text\""))
            }
            (Some(kind), _) => {
                return Err(ApiError::invalid(
                    at,
                    format!("content parts of type {kind:?} are not supported (text only)"),
                ))
            }
            (None, _) => return Err(ApiError::invalid(at, "each content part needs a \"type\"")),
        }
    }
    Ok(out)
}

/// `prompt`: a string, or token ids, or a one-element array of either.
fn prompt(v: Option<&Value>) -> Result<Prompt, ApiError> {
    let bad = || {
        ApiError::invalid(
            "prompt",
            "prompt must be a string, an array of token ids, or a one-element array of either",
        )
    };
    match v {
        None | Some(Value::Null) => Err(ApiError::invalid("prompt", "prompt is required")),
        Some(Value::String(s)) => Ok(Prompt::Text(s.clone())),
        Some(Value::Array(items)) if items.len() == 1 && !items[0].is_number() => {
            prompt(Some(&items[0]))
        }
        Some(Value::Array(items)) if items.len() > 1 && !items[0].is_number() => {
            Err(ApiError::invalid(
                "prompt",
                "one prompt per request (batches of prompts are not supported)",
            ))
        }
        Some(Value::Array(items)) => {
            let ids = items
                .iter()
                .map(|x| x.as_u64().and_then(|t| u32::try_from(t).ok()))
                .collect::<Option<Vec<u32>>>()
                .ok_or_else(bad)?;
            Ok(Prompt::Ids(ids))
        }
        Some(_) => Err(bad()),
    }
}

/// `stop`: a string or up to [`MAX_STOPS`] non-empty strings.
fn stops(v: Option<&Value>) -> Result<Vec<String>, ApiError> {
    let list = match v {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) => items
            .iter()
            .map(|x| x.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| {
                ApiError::invalid("stop", "stop must be a string or an array of strings")
            })?,
        Some(_) => {
            return Err(ApiError::invalid(
                "stop",
                "stop must be a string or an array of strings",
            ))
        }
    };
    if list.len() > MAX_STOPS {
        return Err(ApiError::invalid(
            "stop",
            format!("at most {MAX_STOPS} stop sequences, got {}", list.len()),
        ));
    }
    if list.iter().any(String::is_empty) {
        return Err(ApiError::invalid(
            "stop",
            "stop sequences must not be empty",
        ));
    }
    Ok(list)
}

/// Options that would change the output in ways this server does not implement: refused rather
/// than silently ignored.
fn unsupported(o: &Map<String, Value>, endpoint: Endpoint) -> Result<(), ApiError> {
    let refuse = |name: &str, what: &str| {
        Err(ApiError::invalid(
            name,
            format!("{name} is not supported by this server ({what})"),
        ))
    };
    for name in ["presence_penalty", "frequency_penalty"] {
        if number(o, name)?.is_some_and(|x| x != 0.0) {
            return refuse(name, "only 0 is accepted");
        }
    }
    if object(o, "logit_bias")?.is_some_and(|m| !m.is_empty()) {
        return refuse("logit_bias", "only an empty map is accepted");
    }
    match (endpoint, o.get("logprobs")) {
        (_, None | Some(Value::Null) | Some(Value::Bool(false))) => {}
        (Endpoint::Completions, Some(Value::Number(n))) if n.as_u64() == Some(0) => {}
        _ => return refuse("logprobs", "log probabilities are not returned"),
    }
    if o.get("top_logprobs").is_some_and(|v| !v.is_null()) {
        return refuse("top_logprobs", "log probabilities are not returned");
    }
    if o.get("tools")
        .is_some_and(|v| v.as_array().is_some_and(|a| !a.is_empty()) || v.is_object())
    {
        return refuse("tools", "no tool calling");
    }
    if let Some(Value::Object(f)) = o.get("response_format") {
        if f.get("type").and_then(Value::as_str) != Some("text") {
            return refuse("response_format", "only {\"type\": \"text\"}");
        }
    }
    if boolean(o, "echo")? == Some(true) {
        return refuse("echo", "the prompt is not echoed");
    }
    if integer(o, "best_of")?.is_some_and(|b| b != 1) {
        return refuse("best_of", "only 1");
    }
    if string(o, "suffix")?.is_some_and(|s| !s.is_empty()) {
        return refuse("suffix", "no insertion");
    }
    Ok(())
}

/// A positive integer field (`max_tokens` and friends).
fn count(o: &Map<String, Value>, name: &str) -> Result<Option<usize>, ApiError> {
    match integer(o, name)? {
        None => Ok(None),
        Some(n) if n >= 1 => Ok(Some(usize::try_from(n).unwrap_or(usize::MAX))),
        Some(n) => Err(ApiError::invalid(
            name,
            format!("{name} must be at least 1, got {n}"),
        )),
    }
}

fn integer(o: &Map<String, Value>, name: &str) -> Result<Option<i64>, ApiError> {
    match o.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) if n.is_i64() => Ok(n.as_i64()),
        Some(Value::Number(n)) if n.is_u64() => Ok(Some(i64::MAX)),
        Some(other) => Err(ApiError::invalid(
            name,
            format!("{name} must be an integer, got {other}"),
        )),
    }
}

fn number(o: &Map<String, Value>, name: &str) -> Result<Option<f64>, ApiError> {
    match o.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => Ok(n.as_f64()),
        Some(other) => Err(ApiError::invalid(
            name,
            format!("{name} must be a number, got {other}"),
        )),
    }
}

fn boolean(o: &Map<String, Value>, name: &str) -> Result<Option<bool>, ApiError> {
    match o.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(other) => Err(ApiError::invalid(
            name,
            format!("{name} must be true or false, got {other}"),
        )),
    }
}

fn string(o: &Map<String, Value>, name: &str) -> Result<Option<String>, ApiError> {
    match o.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(ApiError::invalid(
            name,
            format!("{name} must be a string, got {other}"),
        )),
    }
}

fn object(o: &Map<String, Value>, name: &str) -> Result<Option<Map<String, Value>>, ApiError> {
    match o.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(m)) => Ok(Some(m.clone())),
        Some(other) => Err(ApiError::invalid(
            name,
            format!("{name} must be an object, got {other}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(body: &str) -> Result<Params, ApiError> {
        parse(Endpoint::Chat, body.as_bytes())
    }

    fn completion(body: &str) -> Result<Params, ApiError> {
        parse(Endpoint::Completions, body.as_bytes())
    }

    fn refused(r: Result<Params, ApiError>, param: Option<&str>, says: &str) {
        let e = r.unwrap_err();
        assert_eq!(e.status, 400, "{e}");
        assert_eq!(e.param.as_deref(), param, "{e}");
        assert!(e.message.contains(says), "{e} should say {says:?}");
    }

    #[test]
    fn a_full_chat_request_is_read_field_by_field() {
        let p = chat(r#"{"model":"m","messages":[{"role":"developer","content":"be brief"},
            {"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},
            {"role":"assistant","content":null}],
            "max_completion_tokens":9,"max_tokens":3,"temperature":0,"top_p":0.5,"seed":-1,
            "stop":["x","y"],"stream":true,"stream_options":{"include_usage":true},"n":1,
            "chat_template_kwargs":{"enable_thinking":false},"user":"ignored","presence_penalty":0}"#)
        .unwrap();
        let Prompt::Chat { messages, kwargs } = &p.prompt else {
            panic!()
        };
        assert_eq!(messages[0].role, "system");
        assert_eq!(messages[1].content, "ab");
        assert_eq!(messages[2].content, "");
        assert_eq!(kwargs["enable_thinking"], false);
        assert_eq!(p.max_tokens, Some(9));
        assert_eq!((p.temperature, p.top_p, p.seed), (0.0, 0.5, Some(u64::MAX)));
        assert_eq!(p.stop, ["x", "y"]);
        assert!(p.stream && p.include_usage && !p.return_token_ids && !p.ignore_eos);
        assert_eq!(p.model.as_deref(), Some("m"));
    }

    #[test]
    fn completion_prompts_are_text_or_token_ids() {
        assert_eq!(
            completion(r#"{"prompt":"hi"}"#).unwrap().prompt,
            Prompt::Text("hi".into())
        );
        assert_eq!(
            completion(r#"{"prompt":["hi"]}"#).unwrap().prompt,
            Prompt::Text("hi".into())
        );
        assert_eq!(
            completion(r#"{"prompt":[1,2]}"#).unwrap().prompt,
            Prompt::Ids(vec![1, 2])
        );
        assert_eq!(
            completion(r#"{"prompt":[[3]]}"#).unwrap().prompt,
            Prompt::Ids(vec![3])
        );
        let p = completion(r#"{"prompt":"x"}"#).unwrap();
        assert_eq!(
            (p.temperature, p.top_p, p.max_tokens, p.stream),
            (1.0, 1.0, None, false)
        );
        refused(
            completion(r#"{"prompt":["a","b"]}"#),
            Some("prompt"),
            "one prompt per request",
        );
        refused(
            completion(r#"{"prompt":[1,-2]}"#),
            Some("prompt"),
            "token ids",
        );
        refused(
            completion(r#"{"prompt":{"a":1}}"#),
            Some("prompt"),
            "must be a string",
        );
        refused(completion(r#"{}"#), Some("prompt"), "required");
    }

    #[test]
    fn every_bad_field_is_a_400_naming_it() {
        refused(chat("{"), None, "not valid JSON");
        refused(chat("[1]"), None, "JSON object");
        refused(
            chat(r#"{"messages":[]}"#),
            Some("messages"),
            "must not be empty",
        );
        refused(
            chat(r#"{"messages":"hi"}"#),
            Some("messages"),
            "must be an array",
        );
        refused(chat(r#"{"model":"m"}"#), Some("messages"), "required");
        refused(
            chat(r#"{"messages":[{"role":"wizard","content":"x"}]}"#),
            Some("messages[0].role"),
            "unknown role",
        );
        refused(
            chat(r#"{"messages":[{"content":"x"}]}"#),
            Some("messages[0].role"),
            "required",
        );
        refused(
            chat(r#"{"messages":[{"role":"user","content":5}]}"#),
            Some("messages[0].content"),
            "string",
        );
        refused(
            chat(r#"{"messages":[{"role":"user"}]}"#),
            Some("messages[0].content"),
            "required",
        );
        refused(
            chat(
                r#"{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{}}]}]}"#,
            ),
            Some("messages[0].content"),
            "not supported",
        );
        let ok = r#""messages":[{"role":"user","content":"x"}]"#;
        for (extra, param, says) in [
            (r#""max_tokens":0"#, "max_tokens", "at least 1"),
            (r#""max_tokens":-5"#, "max_tokens", "at least 1"),
            (r#""max_tokens":"10""#, "max_tokens", "integer"),
            (
                r#""max_completion_tokens":1.5"#,
                "max_completion_tokens",
                "integer",
            ),
            (r#""temperature":-0.1"#, "temperature", "between 0 and 2"),
            (r#""temperature":"hot""#, "temperature", "number"),
            (r#""top_p":0"#, "top_p", "(0, 1]"),
            (r#""top_p":1.01"#, "top_p", "(0, 1]"),
            (r#""n":2"#, "n", "n = 1"),
            (r#""stream":"yes""#, "stream", "true or false"),
            (r#""stop":[1]"#, "stop", "strings"),
            (r#""stop":["a","b","c","d","e"]"#, "stop", "at most 4"),
            (r#""stop":"""#, "stop", "not be empty"),
            (r#""model":7"#, "model", "string"),
            (r#""seed":"x""#, "seed", "integer"),
            (
                r#""presence_penalty":0.5"#,
                "presence_penalty",
                "not supported",
            ),
            (r#""logprobs":true"#, "logprobs", "not supported"),
            (r#""tools":[{"type":"function"}]"#, "tools", "not supported"),
            (
                r#""response_format":{"type":"json_object"}"#,
                "response_format",
                "not supported",
            ),
            (r#""logit_bias":{"5":1}"#, "logit_bias", "not supported"),
            (r#""stream_options":true"#, "stream_options", "object"),
            (
                r#""chat_template_kwargs":[]"#,
                "chat_template_kwargs",
                "object",
            ),
        ] {
            refused(chat(&format!("{{{ok},{extra}}}")), Some(param), says);
        }
        refused(
            completion(r#"{"prompt":"x","echo":true}"#),
            Some("echo"),
            "not supported",
        );
        refused(
            completion(r#"{"prompt":"x","best_of":3}"#),
            Some("best_of"),
            "not supported",
        );
    }
}
