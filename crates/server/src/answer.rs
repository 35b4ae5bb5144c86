//! Answering a queued request: waiting for its tokens and turning them into text (stop
//! strings included), then one JSON body or a stream of server-sent events, the finish reason,
//! and the request's tally (metrics and log line). It does not parse requests or queue them.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use specfit_engine::Cancel;
use tokio::sync::mpsc::UnboundedReceiver;

use crate::api::{Endpoint, Params};
use crate::decoder::RequestStats;
use crate::error::ApiError;
use crate::http::{App, Served};
use crate::metrics::Outcome;
use crate::queue::Event;
use crate::response::{self, Finish, Head};
use crate::text::TextStream;

/// A request that is queued on the engine.
pub(crate) struct Queued {
    pub(crate) params: Params,
    pub(crate) head: Head,
    pub(crate) prompt: Vec<u32>,
    pub(crate) max_tokens: usize,
    pub(crate) events: UnboundedReceiver<Event>,
    pub(crate) cancel: Cancel,
    pub(crate) submitted: Instant,
}

/// Why the output ended.
fn finish(served: &Served, text: &TextStream, stats: &RequestStats, q: &Queued) -> Finish {
    let last = text.tokens().last();
    let stop_tokens = match q.head.endpoint {
        Endpoint::Chat => &served.chat_stop_tokens,
        Endpoint::Completions => &served.stop_tokens,
    };
    let stop_token = !q.params.ignore_eos && last.is_some_and(|t| stop_tokens.contains(t));
    if text.stopped() || stop_token {
        Finish::Stop
    } else if stats.completion_tokens >= q.max_tokens {
        Finish::Length
    } else {
        Finish::Abort
    }
}

/// Counts the request (as cancelled unless it was marked finished: a dropped stream or handler)
/// and writes its one log line.
struct Tally {
    app: Arc<App>,
    endpoint: Endpoint,
    id: String,
    outcome: Option<Outcome>,
    /// What the log line says after the outcome.
    detail: String,
}

impl Tally {
    fn new(app: &Arc<App>, q: &Queued) -> Tally {
        Tally {
            app: app.clone(),
            endpoint: q.head.endpoint,
            id: q.head.id.clone(),
            outcome: None,
            detail: String::new(),
        }
    }

    /// Marks the request completed, with its figures for the log.
    fn done(&mut self, stats: &RequestStats, completion: usize, ttft: f64, finish: Finish) {
        self.outcome = Some(Outcome::Ok);
        self.detail = format!(
            "prompt {} (cached {}), completion {completion}, first token {:.0} ms, {:.1} tok/s, {:.2} tokens/cycle, finish {}",
            stats.prompt_tokens,
            stats.cached_prompt_tokens,
            1e3 * ttft,
            stats.decode_tokens_per_second(),
            stats.tokens_per_cycle(),
            finish.name()
        );
    }

    fn failed(&mut self, e: &ApiError) {
        self.outcome = Some(Outcome::Failed);
        self.detail = e.message.clone();
    }
}

impl Drop for Tally {
    fn drop(&mut self) {
        let outcome = self.outcome.unwrap_or(Outcome::Cancelled);
        self.app.metrics.request(self.endpoint.name(), outcome);
        let detail = match outcome {
            Outcome::Cancelled => "the client went away",
            _ => &self.detail,
        };
        eprintln!(
            "specfit serve: {} {} {}: {detail}",
            self.id,
            self.endpoint.name(),
            outcome.label()
        );
    }
}

/// Waits for the whole output, then answers with one JSON body.
pub(crate) async fn whole(app: Arc<App>, mut q: Queued) -> Response {
    let mut tally = Tally::new(&app, &q);
    let served = &app.served;
    let mut text = TextStream::new(q.params.stop.clone());
    let mut out = String::new();
    let mut first_token = None;
    while let Some(event) = q.events.recv().await {
        match event {
            Event::Started => {}
            Event::Refused => return failed(&mut tally, &q, shutting_down()),
            Event::Token(t) => {
                first_token.get_or_insert_with(|| q.submitted.elapsed().as_secs_f64());
                match text.push(&served.tokenizer, t) {
                    Ok(piece) => out.push_str(&piece),
                    Err(e) => return failed(&mut tally, &q, e),
                }
                if text.stopped() {
                    q.cancel.cancel();
                }
            }
            Event::Done(Err(e)) => return failed(&mut tally, &q, ApiError::internal(e)),
            Event::Done(Ok(stats)) => {
                match text.finish(&served.tokenizer) {
                    Ok(rest) => out.push_str(&rest),
                    Err(e) => return failed(&mut tally, &q, e),
                }
                let completion = text.tokens().len();
                let finish = finish(served, &text, &stats, &q);
                tally.done(&stats, completion, first_token.unwrap_or(0.0), finish);
                let body = response::whole(
                    &q.head,
                    response::Whole {
                        text: &out,
                        finish,
                        usage: response::usage(&stats, completion),
                        extension: response::extension(
                            &served.policy,
                            &stats,
                            first_token.unwrap_or(0.0),
                        ),
                        token_ids: q
                            .params
                            .return_token_ids
                            .then_some((&q.prompt[..], text.tokens())),
                    },
                );
                return axum::Json(body).into_response();
            }
        }
    }
    failed(
        &mut tally,
        &q,
        ApiError::internal("the decoding thread stopped"),
    )
}

/// A queued request the server will not run: it is shutting down.
fn shutting_down() -> ApiError {
    ApiError::busy(503, "the server is shutting down", 5)
}

fn failed(tally: &mut Tally, q: &Queued, e: ApiError) -> Response {
    q.cancel.cancel();
    tally.failed(&e);
    e.into_response()
}

/// Answers with server-sent events once decoding starts (a request the server will not run gets a
/// 503 instead): a chunk per piece of text, the last chunk with the finish reason, the usage chunk
/// when asked, then `[DONE]`. Dropping the stream (the client left) drops the receiver, which
/// cancels the decode at its next token.
pub(crate) async fn stream(app: Arc<App>, mut q: Queued) -> Response {
    let mut tally = Tally::new(&app, &q);
    match q.events.recv().await {
        Some(Event::Started) => {}
        Some(Event::Refused) => return failed(&mut tally, &q, shutting_down()),
        _ => {
            return failed(
                &mut tally,
                &q,
                ApiError::internal("the decoding thread stopped"),
            )
        }
    }
    let state = Streaming {
        text: TextStream::new(q.params.stop.clone()),
        q,
        app,
        tally,
        first: true,
        first_token: None,
        done: false,
    };
    let events = futures_util::stream::unfold(state, |mut s| async move {
        let batch = s.next().await?;
        Some((
            futures_util::stream::iter(batch.into_iter().map(Ok::<_, Infallible>)),
            s,
        ))
    })
    .flatten();
    Sse::new(events).into_response()
}

struct Streaming {
    q: Queued,
    app: Arc<App>,
    text: TextStream,
    tally: Tally,
    first: bool,
    first_token: Option<f64>,
    done: bool,
}

impl Streaming {
    /// The next events to send; None when the stream is over.
    async fn next(&mut self) -> Option<Vec<SseEvent>> {
        if self.done {
            return None;
        }
        let usage_field = self.q.params.include_usage;
        loop {
            let Some(event) = self.q.events.recv().await else {
                return Some(self.fail(ApiError::internal("the decoding thread stopped")));
            };
            match event {
                Event::Started | Event::Refused => {}
                Event::Token(t) => {
                    self.first_token
                        .get_or_insert_with(|| self.q.submitted.elapsed().as_secs_f64());
                    let piece = match self.text.push(&self.app.served.tokenizer, t) {
                        Ok(p) => p,
                        Err(e) => return Some(self.fail(e)),
                    };
                    if self.text.stopped() {
                        self.q.cancel.cancel();
                    }
                    if piece.is_empty() && !self.first {
                        continue;
                    }
                    let c = response::chunk(&self.q.head, &piece, self.first, usage_field);
                    self.first = false;
                    return Some(vec![json_event(&c)]);
                }
                Event::Done(Err(e)) => return Some(self.fail(ApiError::internal(e))),
                Event::Done(Ok(stats)) => return Some(self.end(&stats)),
            }
        }
    }

    fn end(&mut self, stats: &RequestStats) -> Vec<SseEvent> {
        self.done = true;
        let served = &self.app.served;
        let rest = match self.text.finish(&served.tokenizer) {
            Ok(r) => r,
            Err(e) => return self.fail(e),
        };
        let usage_field = self.q.params.include_usage;
        let mut out = Vec::new();
        if !rest.is_empty() || self.first {
            out.push(json_event(&response::chunk(
                &self.q.head,
                &rest,
                self.first,
                usage_field,
            )));
        }
        let finish = finish(served, &self.text, stats, &self.q);
        let completion = self.text.tokens().len();
        let ext = response::extension(&served.policy, stats, self.first_token.unwrap_or(0.0));
        let ids = self.q.params.return_token_ids.then_some(self.text.tokens());
        let usage = response::usage(stats, completion);
        let inline = (!usage_field).then(|| usage.clone());
        let last = response::last_chunk(&self.q.head, finish, ext, ids, inline);
        out.push(json_event(&last));
        if usage_field {
            out.push(json_event(&response::usage_chunk(&self.q.head, usage)));
        }
        out.push(SseEvent::default().data("[DONE]"));
        let ttft = self.first_token.unwrap_or(0.0);
        self.tally.done(stats, completion, ttft, finish);
        out
    }

    /// An error after the headers went out: an `error` event, then the end.
    fn fail(&mut self, e: ApiError) -> Vec<SseEvent> {
        self.done = true;
        self.q.cancel.cancel();
        self.tally.failed(&e);
        vec![
            SseEvent::default().data(e.body()),
            SseEvent::default().data("[DONE]"),
        ]
    }
}

fn json_event(v: &serde_json::Value) -> SseEvent {
    SseEvent::default().data(v.to_string())
}
