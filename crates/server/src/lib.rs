//! `specfit serve`: an OpenAI-compatible HTTP server over specfit's engine. `POST
//! /v1/chat/completions` and `/v1/completions` (streamed as server-sent events or whole),
//! `GET /v1/models`, `/health` and `/metrics` (Prometheus). The engine decodes one request at a
//! time on its own thread; requests wait in a bounded FIFO, a full queue answers 429, a client
//! that disconnects cancels its decode at the next cycle, and SIGTERM or Ctrl-C drains the
//! server within a bound. It does not load models; the caller hands it an [`EngineDecoder`].

pub mod api;
pub mod chat;
pub mod decoder;
pub mod error;
mod http;
pub mod metrics;
pub mod queue;
pub mod response;
pub mod text;

use std::future::{Future, IntoFuture};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

pub use decoder::{DecodeRequest, DecodeStats, DraftRoutes, EngineDecoder, Speculation};
pub use error::{ApiError, ServerError};
pub use http::{Limits, Served};

/// How the server listens and how much it takes.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    pub host: String,
    /// 0: any free port (the bound address is reported).
    pub port: u16,
    /// Requests that may wait behind the one being decoded; more are refused with 429.
    pub queue: usize,
    pub limits: Limits,
    /// After SIGTERM, how long requests in progress may finish before they are cancelled.
    pub shutdown_grace: Duration,
}

/// Serves on `host:port` until SIGTERM or Ctrl-C, on a runtime of its own; `ready` is told the
/// bound address once the server accepts connections.
pub fn run(
    decoder: EngineDecoder,
    served: Served,
    options: &ServeOptions,
    ready: impl FnOnce(SocketAddr),
) -> Result<(), ServerError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("specfit-http")
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let addr = format!("{}:{}", options.host, options.port);
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .map_err(|error| ServerError::Bind {
                addr: addr.clone(),
                error,
            })?;
        ready(listener.local_addr()?);
        serve(listener, decoder, served, options, stop_signal()).await
    })
}

/// Serves on `listener` until `shutdown` resolves; then refuses new requests (503), lets those
/// in progress finish for `shutdown_grace`, cancels what is left, and returns.
pub async fn serve(
    listener: tokio::net::TcpListener,
    decoder: EngineDecoder,
    served: Served,
    options: &ServeOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    let metrics = Arc::new(metrics::Metrics::default());
    let engine = queue::Engine::start(decoder, options.queue, metrics.clone());
    let app = Arc::new(http::App::new(served, engine, metrics, options.limits));
    let (tx, mut rx) = tokio::sync::watch::channel(false);
    let draining = app.clone();
    let signal = async move {
        shutdown.await;
        draining.draining.store(true, Ordering::SeqCst);
        let _ = tx.send(true);
    };
    let server = axum::serve(listener, http::router(app.clone()))
        .with_graceful_shutdown(signal)
        .into_future();
    tokio::pin!(server);
    tokio::select! {
        r = &mut server => return finish(&app, r),
        _ = rx.wait_for(|stopping| *stopping) => {}
    }
    if tokio::time::timeout(options.shutdown_grace, &mut server)
        .await
        .is_err()
    {
        eprintln!(
            "specfit serve: cancelling the requests still running after {:?}",
            options.shutdown_grace
        );
        app.engine.abort();
        // A cancelled decode ends within a cycle; its stream then closes.
        let _ = tokio::time::timeout(Duration::from_secs(10), &mut server).await;
    }
    app.engine.abort();
    finish(&app, Ok(()))
}

fn finish(app: &http::App, result: std::io::Result<()>) -> Result<(), ServerError> {
    app.engine.stop();
    result.map_err(ServerError::Io)
}

/// Resolves on SIGTERM or Ctrl-C (SIGINT).
async fn stop_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
    eprintln!("specfit serve: stopping (no new requests; finishing those in progress)");
}
