//! A small persistent worker pool that splits one kernel call across cores. Workers spin briefly
//! between jobs (a decode step issues a matmul every few tens of microseconds, and waking a
//! parked thread costs more than that), then park. Work is split by output feature, so every
//! output is still computed by one thread with one fixed reduction order: threading never
//! changes results. Thread count: `SPECFIT_THREADS`, else all available cores.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

/// A job: called once per part index `0..parts`.
type Job = dyn Fn(usize) + Sync;

/// A `'static`-erased pointer to the job of the current epoch.
#[derive(Clone, Copy)]
struct JobPtr(*const Job);
// SAFETY: the pointee is `Sync`, and `Pool::run` keeps it alive until every worker is done.
unsafe impl Send for JobPtr {}

struct Shared {
    epoch: AtomicUsize,
    done: Vec<AtomicUsize>,
    job: Mutex<Option<JobPtr>>,
    panicked: AtomicBool,
}

/// The pool; `threads()` includes the calling thread.
pub struct Pool {
    shared: Arc<Shared>,
    workers: Vec<Thread>,
    /// Serialises `run` calls from different threads.
    gate: Mutex<()>,
}

thread_local! {
    /// Whether this thread is running a part of a pool job.
    static IN_JOB: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Clears `IN_JOB` when the caller's `run` returns (or unwinds).
struct ResetInJob;

impl Drop for ResetInJob {
    fn drop(&mut self) {
        IN_JOB.with(|f| f.set(false));
    }
}

/// How long an idle worker spins before parking.
const SPIN: Duration = Duration::from_micros(300);

impl Pool {
    fn new(threads: usize) -> Pool {
        let extra = threads.saturating_sub(1);
        let shared = Arc::new(Shared {
            epoch: AtomicUsize::new(0),
            done: (0..extra).map(|_| AtomicUsize::new(0)).collect(),
            job: Mutex::new(None),
            panicked: AtomicBool::new(false),
        });
        let workers = (0..extra)
            .map(|w| {
                let shared = Arc::clone(&shared);
                thread::Builder::new()
                    .name(format!("specfit-worker-{w}"))
                    .spawn(move || worker(shared, w))
                    .expect("spawn worker thread")
                    .thread()
                    .clone()
            })
            .collect();
        Pool {
            shared,
            workers,
            gate: Mutex::new(()),
        }
    }

    /// Threads that share a job (workers plus the caller).
    pub fn threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Runs `job(part)` for every part `0..threads()` in parallel and returns when all are done.
    pub fn run<'a>(&self, job: &'a (dyn Fn(usize) + Sync + 'a)) {
        // A job that itself calls `run` (on a worker, or on the caller inside its own part) runs
        // its parts one after another here instead of deadlocking on the busy pool.
        if self.workers.is_empty() || IN_JOB.with(|f| f.get()) {
            (0..self.threads()).for_each(job);
            return;
        }
        IN_JOB.with(|f| f.set(true));
        let _reset = ResetInJob;
        let _serial = self.gate.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: the erased pointer is only dereferenced by workers for this epoch, and this
        // function does not return before every worker has marked the epoch done.
        let erased: *const Job =
            unsafe { std::mem::transmute::<&'a (dyn Fn(usize) + Sync + 'a), &'static Job>(job) };
        *self.shared.job.lock().unwrap_or_else(|e| e.into_inner()) = Some(JobPtr(erased));
        let epoch = self.shared.epoch.fetch_add(1, Ordering::AcqRel) + 1;
        for w in &self.workers {
            w.unpark();
        }
        job(0);
        for done in &self.shared.done {
            let mut spins = 0u32;
            while done.load(Ordering::Acquire) != epoch {
                // On an oversubscribed machine the worker may not be running: after a short
                // spin, give it the core instead of burning it.
                spins = spins.wrapping_add(1);
                if spins.is_multiple_of(256) {
                    thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
            }
        }
        if self.shared.panicked.load(Ordering::Acquire) {
            panic!("a specfit worker thread panicked");
        }
    }
}

fn worker(shared: Arc<Shared>, w: usize) {
    IN_JOB.with(|f| f.set(true));
    let mut seen = 0;
    loop {
        let idle = Instant::now();
        let mut spins = 0u32;
        let epoch = loop {
            let e = shared.epoch.load(Ordering::Acquire);
            if e != seen {
                break e;
            }
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(1024) && idle.elapsed() > SPIN {
                thread::park_timeout(Duration::from_millis(50));
            } else {
                std::hint::spin_loop();
            }
        };
        seen = epoch;
        let job =
            (*shared.job.lock().unwrap_or_else(|e| e.into_inner())).expect("job set before epoch");
        // SAFETY: see `Pool::run`: the job outlives this epoch.
        let f = unsafe { &*job.0 };
        if catch_unwind(AssertUnwindSafe(|| f(w + 1))).is_err() {
            shared.panicked.store(true, Ordering::Release);
        }
        shared.done[w].store(epoch, Ordering::Release);
    }
}

/// The process-wide pool.
pub fn pool() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(|| {
        let threads = std::env::var("SPECFIT_THREADS")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .filter(|&t| t > 0)
            .unwrap_or_else(|| thread::available_parallelism().map_or(1, |n| n.get()));
        Pool::new(threads)
    })
}

/// A raw output pointer that parts of a job write through at disjoint indices.
#[derive(Clone, Copy)]
pub(crate) struct SharedOut(pub *mut f32);
// SAFETY: users guarantee that concurrent parts write disjoint elements.
unsafe impl Sync for SharedOut {}
unsafe impl Send for SharedOut {}

impl SharedOut {
    /// The pointer (a method, so closures capture the whole `Sync` wrapper).
    pub(crate) fn get(self) -> *mut f32 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_that_runs_the_pool_again_does_not_deadlock() {
        let pool = Pool::new(2);
        let count = AtomicUsize::new(0);
        pool.run(&|_| {
            pool.run(&|_| {
                count.fetch_add(1, Ordering::Relaxed);
            });
        });
        assert_eq!(count.load(Ordering::Relaxed), 4);
    }

    #[test]
    fn every_part_runs_exactly_once_per_job() {
        let pool = Pool::new(3);
        for _ in 0..1000 {
            let hits: Vec<AtomicUsize> = (0..pool.threads()).map(|_| AtomicUsize::new(0)).collect();
            pool.run(&|part| {
                hits[part].fetch_add(1, Ordering::Relaxed);
            });
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
        }
    }
}
