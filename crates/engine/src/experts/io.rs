//! Expert reads off the compute thread: a few I/O threads (`SPECFIT_IO_THREADS`, default 8; 0
//! reads synchronously on the calling thread) so
//! that several O_DIRECT reads are in flight at once (one read at a time leaves the device
//! idle between requests) and reads overlap the computation of experts already resident.
//! Reads a forward waits for go ahead of reads started early (read-ahead) in the queue.

use std::collections::VecDeque;
use std::sync::mpsc::Sender;
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::Instant;

use crate::error::EngineError;
use crate::experts::store::ExpertStore;

/// A pointer to one slot's bytes, handed to an I/O thread.
pub(crate) struct SlotPtr {
    pub ptr: *mut u8,
    pub len: usize,
}
// SAFETY: the cache hands each slot to exactly one read and does not touch it (or free it)
// until that read's completion has been received.
unsafe impl Send for SlotPtr {}

/// A finished read: the caller's tag, the outcome, and how long the read took.
pub(crate) type Completion = (usize, Result<(), EngineError>, f64);

type Job = Box<dyn FnOnce() + Send>;

/// Reads not yet taken by an I/O thread: urgent ones (a forward waits for them) first, then
/// read-ahead, each in the order started.
#[derive(Default)]
struct Queue {
    urgent: VecDeque<Job>,
    ahead: VecDeque<Job>,
}

impl Queue {
    fn pop(&mut self) -> Option<Job> {
        self.urgent.pop_front().or_else(|| self.ahead.pop_front())
    }
}

struct IoPool {
    /// `None` when `SPECFIT_IO_THREADS=0`: reads run on the calling thread.
    queue: Option<Arc<(Mutex<Queue>, Condvar)>>,
    /// Reads in flight at once (1 when synchronous).
    width: usize,
}

/// How soon a read is needed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Urgency {
    /// A forward is waiting for it: it goes before every queued read-ahead.
    Now,
    /// Read-ahead for a later layer: behind every queued urgent read.
    Ahead,
}

/// How many expert reads can be in flight at once: the I/O threads, or 1 when reads run
/// synchronously. A layer that copies `m` experts waits about `⌈m / width⌉` read latencies.
pub fn reads_in_flight() -> usize {
    pool().width
}

/// Default I/O threads. Measured on the shipped model's disk tier (64 KiB expert blocks, 8 math
/// prompts, 16 slots): 8 threads gave plain decoding +3–13% and EAGLE-3 +10–24% over 2, as more
/// reads are in flight at once (BENCHMARKS.md).
const IO_THREADS: usize = 8;

fn pool() -> &'static IoPool {
    static POOL: OnceLock<IoPool> = OnceLock::new();
    POOL.get_or_init(|| {
        let threads = std::env::var("SPECFIT_IO_THREADS")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .unwrap_or(IO_THREADS);
        if threads == 0 {
            return IoPool {
                queue: None,
                width: 1,
            };
        }
        let queue = Arc::new((Mutex::new(Queue::default()), Condvar::new()));
        for i in 0..threads {
            let queue = Arc::clone(&queue);
            std::thread::Builder::new()
                .name(format!("specfit-io-{i}"))
                .spawn(move || loop {
                    let job = {
                        let (lock, ready) = &*queue;
                        let mut q = lock.lock().unwrap_or_else(|e| e.into_inner());
                        loop {
                            if let Some(job) = q.pop() {
                                break job;
                            }
                            q = ready.wait(q).unwrap_or_else(|e| e.into_inner());
                        }
                    };
                    job();
                })
                .expect("spawn I/O thread");
        }
        IoPool {
            queue: Some(queue),
            width: threads,
        }
    })
}

/// One read: MoE layer `layer`'s expert `expert` into `slot`, its completion tagged `tag`, in
/// the lane of `urgency`.
pub(crate) struct Read {
    pub(crate) layer: usize,
    pub(crate) expert: usize,
    pub(crate) slot: SlotPtr,
    pub(crate) tag: usize,
    pub(crate) urgency: Urgency,
}

/// Starts `read` from `store`; the completion arrives on `done` tagged `read.tag`. Synchronous
/// reads (no I/O threads) complete before this returns.
pub(crate) fn start_read(store: &Arc<dyn ExpertStore>, read: Read, done: &Sender<Completion>) {
    let Read {
        layer,
        expert,
        slot,
        tag,
        urgency,
    } = read;
    let store = Arc::clone(store);
    let done = done.clone();
    let job: Job = Box::new(move || {
        let slot = slot; // capture the whole `SlotPtr` (it is `Send`), not its raw field
        let start = Instant::now();
        // SAFETY: see `SlotPtr`: this read is the only user of the slot until it completes.
        let dst = unsafe { std::slice::from_raw_parts_mut(slot.ptr, slot.len) };
        let result = store.read_into(layer, expert, dst);
        let _ = done.send((tag, result, start.elapsed().as_secs_f64()));
    });
    match &pool().queue {
        Some(queue) => {
            let (lock, ready) = &**queue;
            let mut q = lock.lock().unwrap_or_else(|e| e.into_inner());
            match urgency {
                Urgency::Now => q.urgent.push_back(job),
                Urgency::Ahead => q.ahead.push_back(job),
            }
            ready.notify_one();
        }
        None => job(),
    }
}
