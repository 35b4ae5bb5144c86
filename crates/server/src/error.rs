//! The server's two error types: [`ApiError`], an HTTP status with an OpenAI-style error body
//! (what a client sees), and [`ServerError`], what stops the server from starting or running
//! (what the operator sees). It does not decide which requests are bad; `api` does.

use serde::Serialize;

/// An OpenAI-style error: `{"error": {"message", "type", "param", "code"}}` with an HTTP status.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{status} {kind}: {message}")]
pub struct ApiError {
    pub status: u16,
    pub message: String,
    /// OpenAI's `type`: `invalid_request_error`, `not_found_error`, `rate_limit_error`, …
    pub kind: &'static str,
    /// The request field at fault, when there is one.
    pub param: Option<String>,
    /// A machine-readable code (`context_length_exceeded`, `model_not_found`, …).
    pub code: Option<&'static str>,
    /// Seconds for the `Retry-After` header of a refused request.
    pub retry_after: Option<u64>,
}

#[derive(Serialize)]
struct Body<'a> {
    error: Inner<'a>,
}

#[derive(Serialize)]
struct Inner<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'a str,
    param: Option<&'a str>,
    code: Option<&'a str>,
}

impl ApiError {
    /// 400 `invalid_request_error` about `param`.
    pub fn invalid(param: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            status: 400,
            message: message.into(),
            kind: "invalid_request_error",
            param: Some(param.to_string()),
            code: None,
            retry_after: None,
        }
    }

    /// A request-level error with no single field at fault.
    pub fn request(status: u16, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            kind: "invalid_request_error",
            param: None,
            code: None,
            retry_after: None,
        }
    }

    /// The engine cannot take the request now (queue full: 429; shutting down: 503).
    pub fn busy(status: u16, message: impl Into<String>, retry_after: u64) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            kind: if status == 429 {
                "rate_limit_error"
            } else {
                "server_error"
            },
            param: None,
            code: None,
            retry_after: Some(retry_after),
        }
    }

    /// 500: the engine failed on a request it had accepted. `detail` goes to the server's log
    /// only: it may name the server's files, which clients have no business seeing.
    pub fn internal(detail: impl Into<String>) -> ApiError {
        eprintln!("specfit serve: internal error: {}", detail.into());
        ApiError {
            status: 500,
            message: "the server failed on this request; its log has the detail".into(),
            kind: "server_error",
            param: None,
            code: None,
            retry_after: None,
        }
    }

    pub fn with_code(mut self, code: &'static str) -> ApiError {
        self.code = Some(code);
        self
    }

    pub fn with_kind(mut self, kind: &'static str) -> ApiError {
        self.kind = kind;
        self
    }

    /// The JSON body.
    pub fn body(&self) -> String {
        let body = Body {
            error: Inner {
                message: &self.message,
                kind: self.kind,
                param: self.param.as_deref(),
                code: self.code,
            },
        };
        serde_json::to_string(&body).expect("an error body always serializes")
    }
}

/// What keeps the server from starting, or ends it.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("cannot listen on {addr}: {error}")]
    Bind { addr: String, error: std::io::Error },
    #[error("the model's chat template does not compile: {0}")]
    Template(String),
    /// An access setting (API key, origin, host) that cannot work.
    #[error("{0}")]
    Access(String),
    #[error(
        "a request queue of {capacity}: it must be between 1 and {}",
        crate::queue::MAX_QUEUE
    )]
    Queue { capacity: usize },
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_body_has_the_openai_shape() {
        let e = ApiError::invalid("temperature", "temperature must be >= 0, got -1");
        let v: serde_json::Value = serde_json::from_str(&e.body()).unwrap();
        assert_eq!(v["error"]["param"], "temperature");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(v["error"]["code"], serde_json::Value::Null);
        assert!(v["error"]["message"].as_str().unwrap().contains("-1"));
        let busy = ApiError::busy(429, "queue full", 1);
        assert_eq!(busy.kind, "rate_limit_error");
        assert_eq!(busy.retry_after, Some(1));
    }
}
