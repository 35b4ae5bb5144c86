//! The decoding thread and its bounded FIFO: the engine decodes one request at a time; up to
//! `capacity` more wait in order; beyond that a request is refused at once (never blocks). Each
//! job streams its tokens back over a channel and is cancelled when that channel's receiver is
//! gone (the client disconnected) or when the server aborts. It does not know about HTTP.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use specfit_engine::spec::TokenSink;
use specfit_engine::Cancel;
use tokio::sync::mpsc::UnboundedSender;

use crate::decoder::{DecodeRequest, EngineDecoder, RequestStats};
use crate::error::ServerError;
use crate::metrics::Metrics;

/// What a job sends back.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// Decoding of the job began (the first event of every job that runs).
    Started,
    /// The job never ran: the server began shutting down while it waited.
    Refused,
    Token(u32),
    /// The decode ended: its statistics, or why it failed.
    Done(Result<RequestStats, String>),
}

/// One request for the engine.
pub struct Job {
    pub request: DecodeRequest,
    /// Raised by the request's handler (stop string matched) or by the engine (receiver gone).
    pub cancel: Cancel,
    pub events: UnboundedSender<Event>,
}

/// Why a job was not queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    Full,
    Stopped,
}

/// The handle the HTTP side submits jobs through.
/// The longest queue [`Engine::start`] takes (each waiting request holds its prompt; the
/// channel's slots are allocated up front).
pub const MAX_QUEUE: usize = 4096;

pub struct Engine {
    sender: Mutex<Option<SyncSender<Job>>>,
    waiting: Arc<AtomicUsize>,
    busy: Arc<AtomicUsize>,
    abort: Cancel,
    /// Set when the decoding thread stopped after a panic.
    dead: Arc<std::sync::atomic::AtomicBool>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Engine {
    /// Starts the decoding thread with room for `capacity` waiting jobs (1 to [`MAX_QUEUE`]).
    pub fn start(
        mut decoder: EngineDecoder,
        capacity: usize,
        metrics: Arc<Metrics>,
    ) -> Result<Engine, ServerError> {
        if !(1..=MAX_QUEUE).contains(&capacity) {
            return Err(ServerError::Queue { capacity });
        }
        let (sender, receiver) = sync_channel::<Job>(capacity);
        let waiting = Arc::new(AtomicUsize::new(0));
        let busy = Arc::new(AtomicUsize::new(0));
        let abort = Cancel::default();
        let dead = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (w, b, a, d) = (waiting.clone(), busy.clone(), abort.clone(), dead.clone());
        let thread = std::thread::Builder::new()
            .name("specfit-decode".into())
            .spawn(move || {
                while let Ok(job) = receiver.recv() {
                    b.store(1, Ordering::SeqCst);
                    w.fetch_sub(1, Ordering::SeqCst);
                    let events = job.events.clone();
                    let decoded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        run(&mut decoder, job, &a, &metrics)
                    }));
                    // Idle before the answer goes out: whoever reads it sees the engine free.
                    b.store(0, Ordering::SeqCst);
                    match decoded {
                        Ok(Some(done)) => {
                            let _ = events.send(Event::Done(done));
                        }
                        Ok(None) => {}
                        Err(_) => {
                            // The engine's state is unknown after a panic: answer this request,
                            // then stop taking work (health turns 503, new requests get 503).
                            let _ = events.send(Event::Done(Err(
                                "the engine failed on this request and stopped".into(),
                            )));
                            d.store(true, Ordering::SeqCst);
                            return;
                        }
                    }
                }
            })
            .map_err(ServerError::Io)?;
        Ok(Engine {
            sender: Mutex::new(Some(sender)),
            waiting,
            busy,
            abort,
            dead,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Queues `job`, or refuses it when the queue is full or the engine stopped.
    pub fn submit(&self, job: Job) -> Result<(), Refused> {
        let sender = self.sender.lock().unwrap_or_else(|e| e.into_inner());
        let Some(sender) = sender.as_ref() else {
            return Err(Refused::Stopped);
        };
        self.waiting.fetch_add(1, Ordering::SeqCst);
        match sender.try_send(job) {
            Ok(()) => Ok(()),
            Err(e) => {
                self.waiting.fetch_sub(1, Ordering::SeqCst);
                Err(match e {
                    TrySendError::Full(_) => Refused::Full,
                    TrySendError::Disconnected(_) => Refused::Stopped,
                })
            }
        }
    }

    /// Whether the decoding thread is still taking work.
    pub fn is_alive(&self) -> bool {
        !self.dead.load(Ordering::SeqCst)
    }

    /// Jobs waiting behind the one being decoded.
    pub fn queue_length(&self) -> usize {
        self.waiting.load(Ordering::SeqCst)
    }

    /// Jobs being decoded (0 or 1).
    pub fn in_flight(&self) -> usize {
        self.busy.load(Ordering::SeqCst)
    }

    /// Cancels the job in progress at its next cycle and every waiting job before it starts.
    pub fn abort(&self) {
        self.abort.cancel();
    }

    /// Takes no more jobs, lets the thread finish what it holds, and waits for it.
    pub fn stop(&self) {
        *self.sender.lock().unwrap_or_else(|e| e.into_inner()) = None;
        let thread = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(t) = thread {
            let _ = t.join();
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.abort();
        self.stop();
    }
}

/// Decodes one job, sending tokens as they come; a closed receiver or the abort flag cancels.
/// Returns what its `Done` event says (None: the client left before it started).
fn run(
    decoder: &mut EngineDecoder,
    job: Job,
    abort: &Cancel,
    metrics: &Metrics,
) -> Option<Result<RequestStats, String>> {
    if abort.is_cancelled() {
        let _ = job.events.send(Event::Refused);
        return None;
    }
    if job.cancel.is_cancelled() || job.events.send(Event::Started).is_err() {
        return None;
    }
    let (events, cancel, abort) = (job.events.clone(), job.cancel.clone(), abort.clone());
    let sink = TokenSink(Arc::new(move |t| {
        if events.send(Event::Token(t)).is_err() || abort.is_cancelled() {
            cancel.cancel();
        }
    }));
    let result = decoder.decode(&job.request, &job.cancel, sink);
    if let Ok(stats) = &result {
        metrics.decoded(stats);
    }
    Some(result.map_err(|e| e.to_string()))
}
