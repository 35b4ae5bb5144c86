//! The cache's reads: starting urgent reads for a forward's misses into free slots, booking
//! reads as they finish (a failed one empties its slot), and waiting for every read in flight
//! before the arena is emptied, moved or freed. The reads themselves run on the I/O threads
//! ([`crate::experts::io`]).

use std::collections::VecDeque;

use super::ExpertCache;
use crate::experts::io::{start_read, Read, Urgency};
use crate::experts::stats::LayerStats;

/// What one call of [`ExpertCache::with_experts`] waits for in its layer.
pub(super) struct Waiting {
    /// Slots whose expert this call still has to run (not evictable).
    pub(super) busy: Vec<bool>,
    /// Slots whose read this call waits for.
    pub(super) awaited: Vec<bool>,
    /// Awaited slots in the order they were queued (read-ahead ones as `needed` lists them,
    /// then misses as launched), not yet run.
    pub(super) queue: VecDeque<usize>,
    /// Each awaited slot's place in that order, counted from the call's first.
    pub(super) place: Vec<usize>,
    /// Slots queued so far in this call.
    queued: usize,
    /// Missing experts not yet given a slot.
    pub(super) pending: VecDeque<u32>,
}

impl Waiting {
    /// Nothing waited for yet, in a layer of `slots` slots.
    pub(super) fn new(slots: usize) -> Waiting {
        Waiting {
            busy: vec![false; slots],
            awaited: vec![false; slots],
            queue: VecDeque::new(),
            place: vec![0; slots],
            queued: 0,
            pending: VecDeque::new(),
        }
    }

    /// Waits for slot `s`'s read: it is busy until its expert has run.
    pub(super) fn enqueue(&mut self, s: usize) {
        (self.busy[s], self.awaited[s]) = (true, true);
        self.place[s] = self.queued;
        self.queued += 1;
        self.queue.push_back(s);
    }

    /// Where in the queue the next expert to run is, once its read has `arrived`: the first
    /// arrived one (completion order) while no miss waits for a slot, else only the queue's
    /// front. The reads' timing then decides which slot frees first and so which slot a
    /// waiting miss evicts; with none waiting, it decides only the order the experts run in,
    /// which the layer's output does not depend on (each expert's rows are kept apart and
    /// summed in a fixed order).
    pub(super) fn next_ready(&self, arrived: impl Fn(usize) -> bool) -> Option<usize> {
        if self.pending.is_empty() {
            self.queue.iter().position(|&s| arrived(s))
        } else {
            self.queue.front().filter(|&&s| arrived(s)).map(|_| 0)
        }
    }
}

impl ExpertCache {
    /// Starts urgent reads for `w`'s pending misses while a slot is free (neither busy in this
    /// call nor being read into); the least recently used free slot is taken first (empty slots
    /// before occupied ones). Returns how many it started.
    pub(super) fn launch(&mut self, layer: usize, w: &mut Waiting) -> u64 {
        let mut started = 0;
        while let Some(&e) = w.pending.front() {
            let Some(victim) = self.slots[layer].victim(|s| !w.busy[s]) else {
                return started;
            };
            w.pending.pop_front();
            w.enqueue(victim);
            self.start(layer, e, victim, Urgency::Now);
            started += 1;
        }
        started
    }

    /// [`Self::launch`] once a slot was freed during the layer's call: those reads waited for a
    /// slot, and are counted so (`slot_waits`) as well as misses.
    pub(super) fn launch_late(&mut self, layer: usize, w: &mut Waiting, stats: &mut LayerStats) {
        let late = self.launch(layer, w);
        stats.misses += late;
        stats.slot_waits += late;
    }

    /// Evicts slot `s` of `layer` and starts reading expert `e` into it.
    pub(super) fn start(&mut self, layer: usize, e: u32, s: usize, urgency: Urgency) {
        self.slots[layer].assign(e, s, urgency == Urgency::Ahead);
        let ptr = self.arena.slot_ptr(layer, s);
        let tag = layer * self.slots_per_layer() + s;
        self.in_flight += 1;
        let read = Read {
            layer,
            expert: e as usize,
            slot: ptr,
            tag,
            urgency,
        };
        start_read(&self.store, read, &self.done_tx);
    }

    /// Books the finished read tagged `tag` (`layer · S + slot`) and returns `(layer, slot)`:
    /// the slot is readable, or emptied if the read failed (whoever waits for it sees the
    /// error).
    pub(super) fn finish(&mut self, tag: usize, failed: bool, seconds: f64) -> (usize, usize) {
        let slot_count = self.slots_per_layer().max(1);
        let (layer, s) = (tag / slot_count, tag % slot_count);
        self.in_flight -= 1;
        self.slots[layer].loading[s] = false;
        self.stats.per_layer[layer].copy_seconds += seconds;
        self.stats.total.copy_seconds += seconds;
        if failed {
            self.slots[layer].forget(s);
        }
        (layer, s)
    }

    /// Books every read that has finished by now, without waiting.
    pub(super) fn absorb_finished(&mut self) {
        while let Ok((tag, result, seconds)) = self.done_rx.try_recv() {
            self.finish(tag, result.is_err(), seconds);
        }
    }

    /// Waits for every read in flight (before the slots are emptied, moved or freed).
    pub(super) fn settle(&mut self) {
        while self.in_flight > 0 {
            let (tag, result, seconds) = self.done_rx.recv().expect("a read is in flight");
            self.finish(tag, result.is_err(), seconds);
        }
    }
}
