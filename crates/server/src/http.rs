//! The HTTP side: routes, API key and CORS, request bodies (size limit, read timeout), prompt
//! building and context checks, and queueing a job on the engine; `answer` turns the job's tokens
//! into the response. Every failure is an OpenAI-style error.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use futures_util::StreamExt;
use specfit_engine::{Cancel, Sampling, Tokenizer};
use tokio::sync::mpsc::unbounded_channel;

use crate::access::{authorize, check_host, cors, Access};
use crate::answer::{self, Queued};
use crate::api::{self, Endpoint, Params, Prompt};
use crate::content::ChatFormat;
use crate::decoder::DecodeRequest;
use crate::error::ApiError;
use crate::metrics::{Live, Metrics, Outcome};
use crate::queue::{Engine, Job, Refused};
use crate::response::Head;

/// The model as the API presents it.
pub struct Served {
    /// The `model` id clients name (`GET /v1/models`).
    pub name: String,
    pub tokenizer: Tokenizer,
    pub chat: ChatFormat,
    /// Positions the model has (`max_position_embeddings`).
    pub context: usize,
    /// Positions a decode needs past its output (the draft tree's levels).
    pub tree_positions: usize,
    pub vocab: usize,
    /// End-of-sequence ids of completions; chat adds the template's end-of-turn token.
    pub stop_tokens: Vec<u32>,
    pub chat_stop_tokens: Vec<u32>,
    /// The decoding policy, for responses and logs.
    pub policy: String,
}

/// A request body checked and turned into what a decode needs.
pub struct Admitted {
    pub params: Params,
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
}

impl Served {
    /// Parses and checks a request `body` for `endpoint` (no I/O, no queue): the model it names,
    /// the prompt's token ids, and the tokens it may generate within the context.
    pub fn admit(&self, endpoint: Endpoint, body: &[u8]) -> Result<Admitted, ApiError> {
        let params = api::parse(endpoint, body)?;
        if let Some(name) = params.model.as_deref().filter(|n| *n != self.name) {
            return Err(ApiError {
                param: Some("model".into()),
                ..ApiError::request(
                    404,
                    format!(
                        "the model {name:?} does not exist; this server serves {:?}",
                        self.name
                    ),
                )
                .with_kind("not_found_error")
                .with_code("model_not_found")
            });
        }
        let prompt = prompt_ids(self, &params)?;
        let max_tokens = fit_context(self, &params, prompt.len())?;
        Ok(Admitted {
            params,
            prompt,
            max_tokens,
        })
    }
}

/// Limits on what a client may send.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_body_bytes: usize,
    /// A request's headers must arrive within this (else the connection is closed), and then
    /// its whole body (else 408).
    pub read_timeout: Duration,
}

/// Everything the handlers share.
pub struct App {
    pub served: Served,
    pub engine: Engine,
    pub metrics: Arc<Metrics>,
    pub limits: Limits,
    pub access: Access,
    /// Set once shutdown began: new requests get 503.
    pub draining: AtomicBool,
    next_id: AtomicU64,
    started: u64,
}

impl App {
    pub fn new(
        served: Served,
        engine: Engine,
        metrics: Arc<Metrics>,
        limits: Limits,
        access: Access,
    ) -> App {
        App {
            served,
            engine,
            metrics,
            limits,
            access,
            draining: AtomicBool::new(false),
            next_id: AtomicU64::new(0),
            started: unix_seconds(),
        }
    }
}

/// The routes, behind the API key check (for `/v1/`), CORS (when origins are allowed) and a
/// guard that turns a panicking handler into a 500 with an error body.
pub fn router(app: Arc<App>) -> Router {
    let api = Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/v1/models/{id}", get(model))
        .route_layer(axum::middleware::from_fn_with_state(app.clone(), authorize))
        .route_layer(axum::middleware::from_fn(json_body));
    let mut router = Router::new()
        .merge(api)
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(app.clone())
        .layer(axum::middleware::from_fn_with_state(
            app.clone(),
            check_host,
        ))
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(panicked));
    if let Some(cors) = cors(&app.access.allowed_origins) {
        router = router.layer(cors);
    }
    router
}

/// Refuses a POST whose body is not declared JSON with a 415, so that a web page's "simple"
/// cross-origin request (`text/plain`, a form) never runs: browsers send those without asking.
async fn json_body(req: Request, next: axum::middleware::Next) -> Response {
    if req.method() != axum::http::Method::POST {
        return next.run(req).await;
    }
    let declared = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            v.split(';')
                .next()
                .unwrap_or_default()
                .trim()
                .to_ascii_lowercase()
        });
    if declared.as_deref() == Some("application/json") {
        return next.run(req).await;
    }
    ApiError::request(
        415,
        format!(
            "the request body must be JSON with Content-Type: application/json (got {})",
            declared.map_or("no Content-Type".into(), |t| format!("{t:?}"))
        ),
    )
    .into_response()
}

/// A handler that panicked: a 500 with an error body (the server keeps serving).
fn panicked(_: Box<dyn std::any::Any + Send + 'static>) -> Response {
    ApiError::internal("the server failed on this request").into_response()
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut r = (
            status,
            [(header::CONTENT_TYPE, "application/json")],
            self.body(),
        )
            .into_response();
        if let Some(s) = self.retry_after {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        if self.status == 408 || self.status == 413 {
            // The client may still be sending: do not read the rest.
            r.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        r
    }
}

async fn not_found(req: Request) -> ApiError {
    ApiError::request(
        404,
        format!("no route {} {}", req.method(), req.uri().path()),
    )
    .with_kind("not_found_error")
}

async fn method_not_allowed(req: Request) -> ApiError {
    ApiError::request(
        405,
        format!("{} is not allowed on {}", req.method(), req.uri().path()),
    )
}

async fn health(State(app): State<Arc<App>>) -> Response {
    if !app.engine.is_alive() {
        let body =
            serde_json::json!({"status": "error", "message": "the engine stopped after a failure"});
        return (StatusCode::SERVICE_UNAVAILABLE, axum::Json(body)).into_response();
    }
    if app.draining.load(Ordering::SeqCst) {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(serde_json::json!({"status": "stopping"})),
        )
            .into_response();
    }
    axum::Json(serde_json::json!({"status": "ok"})).into_response()
}

async fn metrics(State(app): State<Arc<App>>) -> Response {
    let live = Live {
        queue_length: app.engine.queue_length(),
        in_flight: app.engine.in_flight(),
    };
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        app.metrics.render(live),
    )
        .into_response()
}

async fn models(State(app): State<Arc<App>>) -> Response {
    axum::Json(serde_json::json!({"object": "list", "data": [model_card(&app)]})).into_response()
}

async fn model(State(app): State<Arc<App>>, Path(id): Path<String>) -> Response {
    if id != app.served.name {
        return ApiError::request(
            404,
            format!(
                "the model {id:?} does not exist; this server serves {:?}",
                app.served.name
            ),
        )
        .with_kind("not_found_error")
        .with_code("model_not_found")
        .into_response();
    }
    axum::Json(model_card(&app)).into_response()
}

/// The served model as `/v1/models` lists it.
fn model_card(app: &App) -> serde_json::Value {
    serde_json::json!({
        "id": app.served.name,
        "object": "model",
        "created": app.started,
        "owned_by": "specfit",
        "max_model_len": app.served.context,
    })
}

async fn chat(State(app): State<Arc<App>>, req: Request) -> Response {
    generate(app, Endpoint::Chat, req).await
}

async fn completions(State(app): State<Arc<App>>, req: Request) -> Response {
    generate(app, Endpoint::Completions, req).await
}

async fn generate(app: Arc<App>, endpoint: Endpoint, req: Request) -> Response {
    match admit(&app, endpoint, req).await {
        Err(e) => {
            let outcome = if e.status == 429 || e.status == 503 {
                Outcome::Refused
            } else {
                Outcome::Invalid
            };
            app.metrics.request(endpoint.name(), outcome);
            eprintln!(
                "specfit serve: {} {} {}: {}",
                endpoint.name(),
                e.status,
                e.param.as_deref().unwrap_or("-"),
                e.message
            );
            e.into_response()
        }
        Ok(q) if q.params.stream => answer::stream(app, q).await,
        Ok(q) => answer::whole(app, q).await,
    }
}

/// Reads and checks the request, builds the prompt and queues it.
async fn admit(app: &App, endpoint: Endpoint, req: Request) -> Result<Queued, ApiError> {
    if app.draining.load(Ordering::SeqCst) {
        return Err(ApiError::busy(503, "the server is shutting down", 5));
    }
    let body = read_body(req, app.limits).await?;
    let served = &app.served;
    let Admitted {
        params,
        prompt,
        max_tokens,
    } = served.admit(endpoint, &body)?;
    let stop = match endpoint {
        _ if params.ignore_eos => Vec::new(),
        Endpoint::Chat => served.chat_stop_tokens.clone(),
        Endpoint::Completions => served.stop_tokens.clone(),
    };
    let sampling = Sampling::from_temperature(params.temperature, params.top_p);
    let n = app.next_id.fetch_add(1, Ordering::Relaxed);
    let request = DecodeRequest {
        prompt: prompt.clone(),
        max_tokens,
        sampling,
        seed: params.seed.unwrap_or_else(|| fresh_seed(n)),
        stop,
    };
    let (events, receiver) = unbounded_channel();
    let cancel = Cancel::default();
    let job = Job {
        request,
        cancel: cancel.clone(),
        events,
    };
    app.engine.submit(job).map_err(|r| match r {
        Refused::Full => ApiError::busy(
            429,
            format!(
                "the request queue is full ({} waiting); retry later",
                app.engine.queue_length()
            ),
            1,
        ),
        Refused::Stopped if !app.engine.is_alive() => ApiError::busy(
            503,
            "the engine stopped after a failure; the server needs a restart",
            30,
        ),
        Refused::Stopped => ApiError::busy(503, "the server is shutting down", 5),
    })?;
    let head = Head {
        endpoint,
        id: format!(
            "{}-{:x}{n:06x}",
            if endpoint == Endpoint::Chat {
                "chatcmpl"
            } else {
                "cmpl"
            },
            app.started
        ),
        created: unix_seconds(),
        model: served.name.clone(),
    };
    Ok(Queued {
        params,
        head,
        prompt,
        max_tokens,
        events: receiver,
        cancel,
        submitted: Instant::now(),
    })
}

/// The body, at most `max_body_bytes`, all of it within `read_timeout`.
async fn read_body(req: Request, limits: Limits) -> Result<Vec<u8>, ApiError> {
    let too_large = || {
        ApiError::request(
            413,
            format!(
                "the request body is larger than {} bytes",
                limits.max_body_bytes
            ),
        )
    };
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limits.max_body_bytes as u64) {
        return Err(too_large());
    }
    let deadline = tokio::time::Instant::now() + limits.read_timeout;
    let mut stream = req.into_body().into_data_stream();
    let mut body = Vec::new();
    loop {
        match tokio::time::timeout_at(deadline, stream.next()).await {
            Err(_) => {
                return Err(ApiError::request(
                    408,
                    format!(
                        "the request body did not arrive within {:?}",
                        limits.read_timeout
                    ),
                ))
            }
            Ok(None) => return Ok(body),
            Ok(Some(Err(e))) => {
                return Err(ApiError::request(
                    400,
                    format!("reading the request body: {e}"),
                ))
            }
            Ok(Some(Ok(chunk))) => {
                if body.len() + chunk.len() > limits.max_body_bytes {
                    return Err(too_large());
                }
                body.extend_from_slice(&chunk);
            }
        }
    }
}

/// The prompt's token ids: the chat template rendered and tokenized, text tokenized, or ids
/// checked against the vocabulary.
fn prompt_ids(served: &Served, params: &Params) -> Result<Vec<u32>, ApiError> {
    let encode = |text: &str, param: &str| {
        served
            .tokenizer
            .encode(text)
            .map_err(|e| ApiError::invalid(param, format!("tokenizing: {e}")))
    };
    let ids = match &params.prompt {
        Prompt::Chat { messages, kwargs } => {
            let nonce = fresh_seed(messages.len() as u64);
            served
                .chat
                .ids(&served.tokenizer, messages, kwargs, nonce)?
        }
        Prompt::Text(text) => encode(text, "prompt")?,
        Prompt::Ids(ids) => ids.clone(),
    };
    // Ids a client sent, or a tokenizer whose added tokens lie past the model's embeddings.
    if let Some((i, t)) = ids
        .iter()
        .enumerate()
        .find(|(_, &t)| t as usize >= served.vocab)
    {
        let param = params.endpoint.prompt_field();
        return Err(ApiError::invalid(
            param,
            format!(
                "token id {t} at position {i} is outside the vocabulary ({} tokens)",
                served.vocab
            ),
        ));
    }
    if ids.is_empty() {
        let param = params.endpoint.prompt_field();
        return Err(ApiError::invalid(param, "the prompt encodes to no tokens"));
    }
    Ok(ids)
}

/// `max_tokens` checked against the context (default: all the room left).
fn fit_context(served: &Served, params: &Params, prompt: usize) -> Result<usize, ApiError> {
    let room = served
        .context
        .saturating_sub(prompt.saturating_add(served.tree_positions));
    if room == 0 {
        let param = params.endpoint.prompt_field();
        return Err(ApiError::invalid(
            param,
            format!(
                "the prompt is {prompt} tokens; this model's context is {} tokens{}, which leaves no room to generate",
                served.context,
                tree_note(served)
            ),
        )
        .with_code("context_length_exceeded"));
    }
    match params.max_tokens {
        None => Ok(room),
        Some(n) if n <= room => Ok(n),
        Some(n) => Err(ApiError::invalid(
            "max_tokens",
            format!(
                "the prompt ({prompt} tokens) plus max_tokens {n} exceeds this model's context of {} tokens{}; use max_tokens {room} or less",
                served.context,
                tree_note(served)
            ),
        )
        .with_code("context_length_exceeded")),
    }
}

fn tree_note(served: &Served) -> String {
    if served.tree_positions > 0 {
        format!(
            " ({} positions are kept for the draft tree)",
            served.tree_positions
        )
    } else {
        String::new()
    }
}

fn unix_seconds() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A seed for a request that gave none: differs between requests and between runs.
fn fresh_seed(n: u64) -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    // splitmix64 of the clock and the request number
    let mut z = nanos ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
