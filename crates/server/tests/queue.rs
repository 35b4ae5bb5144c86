//! The decoding thread's queue on the shipped target: one job decodes, `capacity` wait, the next
//! is refused at once; a job whose receiver is dropped is cancelled within a cycle and frees the
//! engine; aborting cancels what runs and what waits.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use specfit_engine::{load_target, CacheMode, Cancel, Sampling, Tier};
use specfit_server::metrics::Metrics;
use specfit_server::queue::{Engine, Event, Job, Refused};
use specfit_server::{DecodeRequest, EngineDecoder};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

fn decoder() -> EngineDecoder {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/target");
    let (model, cache) = load_target(&dir, &Tier::Ram, usize::MAX, CacheMode::Lru, None).unwrap();
    EngineDecoder::new(model, cache, None, "ar")
}

fn engine(capacity: usize) -> Engine {
    Engine::start(decoder(), capacity, Arc::new(Metrics::default())).unwrap()
}

#[test]
fn a_queue_of_no_room_or_past_the_bound_is_refused_before_anything_is_allocated() {
    for capacity in [0, specfit_server::queue::MAX_QUEUE + 1, usize::MAX] {
        match Engine::start(decoder(), capacity, Arc::new(Metrics::default())) {
            Err(e) => assert!(e.to_string().contains("between 1 and 4096"), "{e}"),
            Ok(_) => panic!("a queue of {capacity} was taken"),
        }
    }
}

/// A job of `max_tokens` sampled tokens that never stops early.
fn job(max_tokens: usize) -> (Job, UnboundedReceiver<Event>, Cancel) {
    let (events, receiver) = unbounded_channel();
    let cancel = Cancel::default();
    let request = DecodeRequest {
        prompt: vec![1, 100, 200, 300],
        max_tokens,
        sampling: Sampling::from_temperature(0.9, 0.95),
        seed: 1,
        stop: vec![],
    };
    let job = Job {
        request,
        cancel: cancel.clone(),
        events,
    };
    (job, receiver, cancel)
}

fn wait_until(what: &str, cond: impl Fn() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Receives until `Done`; the tokens and the outcome (a job that never ran: "refused").
fn drain(rx: &mut UnboundedReceiver<Event>) -> (usize, Result<usize, String>) {
    let mut tokens = 0;
    loop {
        match rx.blocking_recv() {
            Some(Event::Started) => {}
            Some(Event::Refused) => return (tokens, Err("refused".into())),
            Some(Event::Token(_)) => tokens += 1,
            Some(Event::Done(r)) => return (tokens, r.map(|s| s.completion_tokens)),
            None => return (tokens, Err("channel closed".into())),
        }
    }
}

/// The first token of a job that started.
fn first_token(rx: &mut UnboundedReceiver<Event>) -> bool {
    matches!(rx.blocking_recv(), Some(Event::Started))
        && matches!(rx.blocking_recv(), Some(Event::Token(_)))
}

#[test]
fn one_job_decodes_capacity_wait_and_the_next_is_refused_at_once() {
    let engine = engine(1);
    let (long, mut long_rx, _) = job(3000);
    engine.submit(long).unwrap();
    assert!(first_token(&mut long_rx));
    assert_eq!(engine.in_flight(), 1);
    let (waiting, mut waiting_rx, _) = job(8);
    engine.submit(waiting).unwrap();
    assert_eq!(engine.queue_length(), 1);
    let (third, _third_rx, _) = job(8);
    assert_eq!(engine.submit(third).err(), Some(Refused::Full));
    // The long job's client goes away: its decode stops and the waiting job runs.
    drop(long_rx);
    let (tokens, done) = drain(&mut waiting_rx);
    assert_eq!((tokens, done), (8, Ok(8)));
    wait_until("the engine to be idle", || engine.in_flight() == 0);
    assert_eq!(engine.queue_length(), 0);
}

#[test]
fn a_cancelled_job_ends_early_with_its_tokens_so_far_and_abort_refuses_the_waiting() {
    let engine = engine(2);
    let (long, mut long_rx, cancel) = job(3000);
    engine.submit(long).unwrap();
    let (waiting, mut waiting_rx, _) = job(8);
    engine.submit(waiting).unwrap();
    // The first tokens arrive, then the handler cancels (a stop string matched, say).
    assert!(first_token(&mut long_rx));
    cancel.cancel();
    let (tokens, done) = drain(&mut long_rx);
    let made = done.unwrap();
    assert!(
        made < 3000 && made == tokens + 1,
        "{made} tokens, {tokens} after the first"
    );
    assert_eq!(drain(&mut waiting_rx).1, Ok(8));
    // Abort: the running job stops at its next token, a waiting one is told it never ran.
    let (running, mut running_rx, _) = job(3000);
    engine.submit(running).unwrap();
    // Started once its first token arrives (`in_flight` may still show the previous job).
    assert!(first_token(&mut running_rx));
    let (queued, mut queued_rx, _) = job(8);
    engine.submit(queued).unwrap();
    engine.abort();
    assert!(drain(&mut running_rx).1.unwrap() < 3000);
    let (_, refused) = drain(&mut queued_rx);
    assert_eq!(refused, Err("refused".into()));
    engine.stop();
    let (late, _late_rx, _) = job(1);
    assert_eq!(engine.submit(late).err(), Some(Refused::Stopped));
}
