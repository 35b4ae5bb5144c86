//! `specfit serve`: an OpenAI-compatible HTTP server over specfit's engine. `POST
//! /v1/chat/completions` and `/v1/completions` (streamed as server-sent events or whole),
//! `GET /v1/models`, `/health` and `/metrics` (Prometheus). The engine decodes one request at a
//! time on its own thread; requests wait in a bounded FIFO, a full queue answers 429, a client
//! that disconnects cancels its decode at the next cycle, and SIGTERM or Ctrl-C drains the
//! server within a bound. It does not load models; the caller hands it an [`EngineDecoder`].

pub mod access;
mod answer;
pub mod api;
pub mod chat;
pub mod content;
pub mod decoder;
pub mod error;
mod http;
pub mod metrics;
pub mod queue;
pub mod response;
pub mod text;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

pub use access::Access;
pub use decoder::{DecodeRequest, DraftRoutes, EngineDecoder, RequestStats, Speculation};
pub use error::{ApiError, ServerError};
pub use http::{Admitted, Limits, Served};

/// How the server listens and how much it takes.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    pub host: String,
    /// 0: any free port (the bound address is reported).
    pub port: u16,
    /// Requests that may wait behind the one being decoded; more are refused with 429.
    pub queue: usize,
    pub limits: Limits,
    pub access: Access,
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
    let engine = queue::Engine::start(decoder, options.queue, metrics.clone())?;
    let app = Arc::new(http::App::new(
        served,
        engine,
        metrics,
        options.limits,
        options.access.clone(),
    ));
    let (tx, rx) = tokio::sync::watch::channel(false);
    let draining = app.clone();
    tokio::spawn(async move {
        shutdown.await;
        draining.draining.store(true, Ordering::SeqCst);
        let _ = tx.send(true);
    });
    let connections = accept(listener, http::router(app.clone()), rx, options.limits).await;
    let drained = connections.shutdown();
    tokio::pin!(drained);
    if tokio::time::timeout(options.shutdown_grace, &mut drained)
        .await
        .is_err()
    {
        eprintln!(
            "specfit serve: cancelling the requests still running after {:?}",
            options.shutdown_grace
        );
        app.engine.abort();
        // A cancelled decode ends within a cycle; its stream then closes.
        let _ = tokio::time::timeout(Duration::from_secs(10), &mut drained).await;
    }
    // Nothing left to answer: cancel whatever still runs and wait for the decoding thread.
    app.engine.abort();
    app.engine.stop();
    Ok(())
}

/// Accepts HTTP/1.1 connections until `stop` turns true, each served by `router` with a bound on
/// how long a client may take to send a request's headers (a client that opens connections and
/// never finishes its headers cannot hold them forever). Returns the open connections, to be
/// drained.
async fn accept(
    listener: tokio::net::TcpListener,
    router: axum::Router,
    mut stop: tokio::sync::watch::Receiver<bool>,
    limits: Limits,
) -> hyper_util::server::graceful::GracefulShutdown {
    let connections = hyper_util::server::graceful::GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(limits.read_timeout.max(Duration::from_millis(100)));
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors and the like: wait, then go on accepting.
                    eprintln!("specfit serve: accepting a connection: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = stop.wait_for(|stopping| *stopping) => return connections,
        };
        let service = hyper_util::service::TowerToHyperService::new(router.clone());
        let conn = http.serve_connection(hyper_util::rt::TokioIo::new(stream), service);
        let conn = connections.watch(conn);
        tokio::spawn(async move {
            let _ = conn.await;
        });
    }
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
