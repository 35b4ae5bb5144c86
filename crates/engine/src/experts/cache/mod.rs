//! The per-layer slot cache: `S` expert-sized slots per MoE layer, filled from the store on a
//! miss and evicted least-recently-used. Every hit, miss, copied byte and copy time is counted,
//! per layer and in total ([`crate::experts::CopyStats`]). With [`CacheMode::NoCache`]
//! the slots are emptied before each forward (the paper's "vanilla" baseline, where every routed
//! expert is copied).
//!
//! Misses are read by the I/O threads ([`crate::experts::io`]) while the resident experts are
//! computed, several reads in flight at once; each missing expert is still copied exactly once
//! per call, even when the call needs more experts than there are slots. Reads can also be
//! started ahead ([`ExpertCache::read_ahead`]) for experts a later forward is expected to
//! route to: they fill slots in the background and a forward that needs one waits for it.
//!
//! Parts: `lru` (which expert each slot holds, the victim of a miss), `reads` (starting and
//! booking reads), `arena` (the slots' memory); this file hands experts to forwards.

mod arena;
mod lru;
mod reads;

use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::time::Instant;

use crate::error::EngineError;
use crate::experts::aligned::padded;
use crate::experts::io::{Completion, Urgency};
use crate::experts::stats::{CopyStats, LayerStats};
use crate::experts::store::{ExpertLayout, ExpertMatrices, ExpertStore};
use arena::Arena;
use lru::Slots;
use reads::Waiting;

/// Experts at least this large are read one layer ahead by default
/// ([`ExpertCache::auto_layers_ahead`]).
pub const LAYER_AHEAD_MIN_BYTES: usize = 1 << 20;

/// When the slots are invalidated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheMode {
    /// Keep experts across forwards (LRU).
    Lru,
    /// No cache (`--slots 0`; the paper's "vanilla" setting): every slot is emptied before each
    /// forward, so every routed expert is copied every forward.
    NoCache,
}

/// The fast-memory side of expert offload.
pub struct ExpertCache {
    store: Arc<dyn ExpertStore>,
    layout: ExpertLayout,
    /// Every layer's slots' bytes.
    arena: Arena,
    /// Every layer's slots' contents, for the LRU.
    slots: Vec<Slots>,
    mode: CacheMode,
    clock: u64,
    stats: CopyStats,
    /// Every read's completion, tagged `layer · S + slot`; reads outlive the call that started
    /// them when they were started ahead.
    done_tx: Sender<Completion>,
    done_rx: Receiver<Completion>,
    /// Reads in flight (the arena must outlive them).
    in_flight: usize,
    /// The store hands out every expert where it rests ([`ExpertStore::maps_in_place`]): no
    /// slots, no copies, every expert resident.
    in_place: bool,
    /// [`ExpertCache::layers_ahead`].
    layers_ahead: usize,
    /// Per layer, the experts the farthest layer-ahead prediction named for the next call in
    /// that layer (ascending), scored against what that call needs (precision and recall in the
    /// stats).
    predicted: Vec<Option<Vec<u32>>>,
}

impl std::fmt::Debug for ExpertCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExpertCache")
            .field("tier", &self.store.tier())
            .field("layers", &self.slots.len())
            .field("slots_per_layer", &self.slots_per_layer())
            .field("mode", &self.mode)
            .finish()
    }
}

impl ExpertCache {
    /// A new, empty cache of `slots_per_layer` slots per layer in `mode` over the same store:
    /// several caches (one per benchmarked policy, say) share one store and one copy of the
    /// experts.
    pub fn sibling(
        &self,
        slots_per_layer: usize,
        mode: CacheMode,
    ) -> Result<ExpertCache, EngineError> {
        let experts = self.slots.first().map_or(0, |s| s.slot_of.len());
        let mut sibling = Self::new(
            Arc::clone(&self.store),
            self.slots.len(),
            experts,
            slots_per_layer,
            mode,
        )?;
        sibling.layers_ahead = self.layers_ahead;
        Ok(sibling)
    }

    /// `slots_per_layer` slots for each of `layers` MoE layers of `experts` experts over `store`.
    pub fn new(
        store: Arc<dyn ExpertStore>,
        layers: usize,
        experts: usize,
        slots_per_layer: usize,
        mode: CacheMode,
    ) -> Result<ExpertCache, EngineError> {
        if slots_per_layer == 0 {
            return Err(EngineError::TooFewSlots { slots: 0 });
        }
        let in_place = store.maps_in_place();
        let s = if in_place {
            0
        } else {
            slots_per_layer.min(experts)
        };
        let layout = store.layout();
        let arena = Arena::new(layers, s, layout.bytes())?;
        let slots = (0..layers).map(|_| Slots::new(s, experts)).collect();
        let (done_tx, done_rx) = channel();
        Ok(ExpertCache {
            store,
            layout,
            arena,
            slots,
            mode,
            clock: 0,
            stats: CopyStats {
                per_layer: vec![LayerStats::default(); layers],
                total: LayerStats::default(),
            },
            done_tx,
            done_rx,
            in_flight: 0,
            in_place,
            layers_ahead: 0,
            predicted: vec![None; layers],
        })
    }

    /// Shape of each expert block.
    pub fn layout(&self) -> ExpertLayout {
        self.layout
    }

    /// Bytes of slot memory a sibling with `slots_per_layer` slots would hold (0 when the store
    /// maps experts in place).
    pub fn arena_bytes(&self, slots_per_layer: usize) -> u64 {
        if self.in_place {
            return 0;
        }
        let experts = self.slots.first().map_or(0, |s| s.slot_of.len());
        (self.slots.len() * slots_per_layer.min(experts) * padded(self.layout.bytes())) as u64
    }

    /// Whether the store hands out every expert where it rests: no slots, no copies, every
    /// expert resident from the start.
    pub fn in_place(&self) -> bool {
        self.in_place
    }

    /// Slots per layer (every expert when the store maps them in place).
    pub fn slots_per_layer(&self) -> usize {
        match self.slots.first() {
            Some(s) if self.in_place => s.slot_of.len(),
            Some(s) => s.holds.len(),
            None => 0,
        }
    }

    /// Reads this cache can have in flight at once: the I/O threads
    /// ([`crate::experts::reads_in_flight`]), but no more than a layer's slots, since each read
    /// needs a free slot until its expert has been computed.
    pub fn read_width(&self) -> usize {
        crate::experts::reads_in_flight().min(self.slots_per_layer().max(1))
    }

    /// Whether some layer still has an empty slot: the cache is still filling. Never where
    /// there are no slots to fill (experts used in place, slots emptied every forward).
    pub fn filling(&self) -> bool {
        !self.in_place
            && self.mode == CacheMode::Lru
            && self
                .slots
                .iter()
                .any(|s| s.holds.iter().any(Option::is_none))
    }

    /// Counters since construction.
    pub fn stats(&self) -> &CopyStats {
        &self.stats
    }

    /// The storage tier's name.
    pub fn tier(&self) -> &'static str {
        self.store.tier()
    }

    /// Experts resident in `layer`, ascending.
    pub fn resident(&self, layer: usize) -> Vec<u32> {
        if self.in_place {
            return (0..self.slots[layer].slot_of.len() as u32).collect();
        }
        self.slots[layer].resident()
    }

    /// Moves the slots to a newly allocated arena, bytes and bookkeeping unchanged, then frees
    /// the old one. On a virtual machine the speed of reads into (and compute from) an arena can
    /// depend on where its memory landed, for as long as it lives; `specfit bench` relocates
    /// every configuration's cache before each prompt so that no configuration keeps a slow or
    /// fast arena for a whole run (BENCHMARKS.md, "Expert slots on huge pages"). It needs a
    /// second arena's memory for a moment: meant for benchmarking, not for serving a big model.
    pub fn relocate(&mut self) {
        self.settle();
        self.arena.relocate();
    }

    /// Called at the start of every forward.
    pub fn begin_forward(&mut self) {
        if self.mode == CacheMode::NoCache {
            self.clear();
        }
    }

    /// Empties every slot (the next forward copies every expert it routes to).
    pub fn clear(&mut self) {
        self.settle();
        self.slots.iter_mut().for_each(Slots::clear);
    }

    /// Starts reading, in the background, the experts of `wanted[layer]` (most wanted first)
    /// that no slot holds, for a forward expected soon: at most half of each layer's slots are
    /// refilled, never evicting an expert this call wants, and those already resident become
    /// the most recently used. Reads go out layer by layer behind every read a forward is
    /// waiting for. Does nothing when the slots are emptied every forward. A read that fails is
    /// dropped (the forward that needs the expert reads it again and reports the error).
    pub fn read_ahead(&mut self, wanted: &[Vec<u32>]) {
        for (layer, list) in wanted.iter().enumerate() {
            self.read_ahead_layer(layer, list);
        }
    }

    /// [`ExpertCache::read_ahead`] for one layer's `wanted` experts (most wanted first).
    fn read_ahead_layer(&mut self, layer: usize, wanted: &[u32]) {
        if !self.can_read_ahead() || layer >= self.slots.len() {
            return;
        }
        let cap = (self.slots_per_layer() / 2).max(1);
        let count = self.slots[layer].holds.len();
        let mut keep = vec![false; count];
        let mut started = 0;
        for &e in wanted {
            if e as usize >= self.slots[layer].slot_of.len() {
                continue;
            }
            if let Some(s) = self.slots[layer].slot_of[e as usize] {
                self.clock += 1;
                self.slots[layer].last_use[s as usize] = self.clock;
                keep[s as usize] = true;
                continue;
            }
            if started == cap {
                continue;
            }
            let Some(victim) = self.slots[layer].victim(|s| !keep[s]) else {
                break;
            };
            keep[victim] = true;
            started += 1;
            self.start(layer, e, victim, Urgency::Ahead);
            self.clock += 1;
            self.slots[layer].last_use[victim] = self.clock;
            let bytes = self.layout.bytes() as u64;
            for stats in [&mut self.stats.per_layer[layer], &mut self.stats.total] {
                stats.misses += 1;
                stats.read_ahead += 1;
                stats.bytes_copied += bytes;
            }
        }
    }

    /// How many MoE layers ahead a forward predicts its routes and starts their reads
    /// ([`ExpertCache::with_experts`]' `ahead`): the setting, or 0 where nothing is read ahead
    /// (experts used in place, or slots emptied every forward).
    pub fn layers_ahead(&self) -> usize {
        if self.can_read_ahead() {
            self.layers_ahead
        } else {
            0
        }
    }

    /// Whether reads started ahead can help: slots kept across forwards, experts not used in
    /// place.
    fn can_read_ahead(&self) -> bool {
        self.mode == CacheMode::Lru && !self.in_place
    }

    /// The layers to read ahead when the user does not say: 1 on a slot tier whose experts
    /// are at least [`LAYER_AHEAD_MIN_BYTES`], else 0. Measured (BENCHMARKS.md, "Layer-ahead
    /// reads"): with 5 MB experts (Q8_0 at Qwen3-30B-A3B's shapes) one layer ahead gave plain
    /// decoding 1.14× and SpecFit 1.11× on a 2-vCPU machine's disk tier, two layers less; with
    /// 64 KiB experts (the shipped pair) a layer computes for about one read, so there is little
    /// to hide reads behind and the wrong guesses cost more (0.78–0.99×).
    pub fn auto_layers_ahead(&self) -> usize {
        if self.can_read_ahead() && self.layout.bytes() >= LAYER_AHEAD_MIN_BYTES {
            1
        } else {
            0
        }
    }

    /// Sets [`ExpertCache::layers_ahead`] (0 turns layer-ahead reads off).
    pub fn set_layers_ahead(&mut self, layers: usize) {
        self.layers_ahead = layers;
    }

    /// Runs `f` on `(expert, its matrices)` for every expert of `needed` (distinct ids) in
    /// `layer`, once each: first one call with all the resident experts, while the missing ones
    /// are read into free slots (least recently used first) by the I/O threads, then one call
    /// per missing expert (or expert still arriving from a read-ahead) as soon as its read is
    /// done (its slot may then take a later miss). Every expert is copied at most once per call,
    /// whatever the slot count.
    ///
    /// `ahead` lists later layers' predicted experts (layer, most wanted first): once this
    /// call's own misses are queued, their reads start as [`ExpertCache::read_ahead`]'s do,
    /// behind every read a forward waits for; each prediction is scored against what the next
    /// call in its layer needs ([`LayerStats::predicted`]).
    pub fn with_experts(
        &mut self,
        layer: usize,
        needed: &[u32],
        ahead: &[(usize, Vec<u32>)],
        mut f: impl FnMut(&[(u32, ExpertMatrices<'_>)]),
    ) -> Result<(), EngineError> {
        let mut stats = LayerStats::default();
        if let Some(predicted) = self.predicted.get_mut(layer).and_then(Option::take) {
            stats.predicted = predicted.len() as u64;
            stats.predicted_needed = needed.len() as u64;
            stats.predicted_right = needed
                .iter()
                .filter(|e| predicted.binary_search(e).is_ok())
                .count() as u64;
        }
        if self.in_place {
            let views = needed
                .iter()
                .map(|&e| Ok((e, self.store.in_place(layer, e as usize)?)))
                .collect::<Result<Vec<_>, EngineError>>()?;
            f(&views);
            stats.hits = needed.len() as u64;
            self.stats.per_layer[layer].add(&stats);
            self.stats.total.add(&stats);
            return Ok(());
        }
        self.absorb_finished();
        let slot_count = self.slots[layer].holds.len();
        let mut w = Waiting::new(slot_count);
        let mut hit = Vec::new();
        for &e in needed {
            let slots = &mut self.slots[layer];
            let Some(s) = slots.slot_of[e as usize].map(|s| s as usize) else {
                w.pending.push_back(e);
                continue;
            };
            w.busy[s] = true;
            if std::mem::take(&mut slots.unused_ahead[s]) {
                stats.ahead_used += 1;
            } else {
                stats.hits += 1;
            }
            if slots.loading[s] {
                w.enqueue(s);
            } else {
                hit.push(e);
            }
        }
        let mut error = None;
        stats.misses += self.launch(layer, &mut w);
        self.start_ahead(ahead);
        // The resident experts run together (the caller may spread them over threads) while the
        // first misses are read.
        if !hit.is_empty() {
            let len = self.layout.bytes();
            let slots = &mut self.slots[layer];
            let mut at = Vec::with_capacity(hit.len());
            for &e in &hit {
                self.clock += 1;
                let s = slots.slot_of[e as usize].expect("resident") as usize;
                slots.last_use[s] = self.clock;
                at.push((e, s));
            }
            let layout = self.layout;
            let views: Vec<(u32, ExpertMatrices<'_>)> = at
                .iter()
                .map(|&(e, s)| (e, layout.expert(self.arena.slot(layer, s, len))))
                .collect();
            f(&views);
            for &(_, s) in &at {
                w.busy[s] = false;
            }
            stats.misses += self.launch(layer, &mut w);
        }
        let bytes = self.layout.bytes() as u64;
        // Awaited experts run as their reads finish (`Waiting::next_ready`), but each takes the
        // LRU stamp it would take running in queue order (`base` + its place + 1), so the LRU
        // order, and with it every later eviction, does not depend on the disk's timing.
        let base = self.clock;
        let mut arrived: Vec<Option<Result<(), EngineError>>> =
            (0..slot_count).map(|_| None).collect();
        loop {
            let Some(i) = w.next_ready(|s| arrived[s].is_some()) else {
                if w.queue.is_empty() && (error.is_some() || w.pending.is_empty()) {
                    break;
                }
                // Wait for a read: ours, or a read-ahead whose slot a pending miss needs.
                let wait = Instant::now();
                let (tag, result, seconds) = self.done_rx.recv().expect("a read is in flight");
                stats.wait_seconds += wait.elapsed().as_secs_f64();
                let (l, s) = self.finish(tag, result.is_err(), seconds);
                if l == layer && w.awaited[s] {
                    arrived[s] = Some(result);
                } else if error.is_none() {
                    self.launch_late(layer, &mut w, &mut stats);
                }
                continue;
            };
            let s = w.queue.remove(i).expect("a ready slot");
            w.awaited[s] = false;
            w.busy[s] = false;
            match arrived[s].take().expect("arrived") {
                Ok(()) if error.is_none() => {
                    let stamp = base + w.place[s] as u64 + 1;
                    self.clock = self.clock.max(stamp);
                    self.slots[layer].last_use[s] = stamp;
                    let e = self.slots[layer].holds[s].expect("read into this slot");
                    let block = self.arena.slot(layer, s, bytes as usize);
                    f(&[(e, self.layout.expert(block))]);
                }
                Ok(()) => {}
                Err(err) => {
                    error.get_or_insert(err);
                }
            }
            if error.is_none() {
                self.launch_late(layer, &mut w, &mut stats);
            }
        }
        stats.bytes_copied = stats.misses * bytes;
        self.stats.per_layer[layer].add(&stats);
        self.stats.total.add(&stats);
        match error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Starts the reads of `ahead` (later layers' predicted experts, most wanted first) and
    /// keeps each layer's first prediction (the one made farthest ahead) to score it against
    /// that layer's next call.
    fn start_ahead(&mut self, ahead: &[(usize, Vec<u32>)]) {
        for (layer, wanted) in ahead {
            let Some(kept) = self.predicted.get_mut(*layer) else {
                continue;
            };
            // The guess made farthest ahead is the one scored (nearer ones still read).
            if kept.is_none() {
                let mut sorted = wanted.clone();
                sorted.sort_unstable();
                *kept = Some(sorted);
            }
            self.read_ahead_layer(*layer, wanted);
        }
    }

    /// Checks every occupied slot against a fresh read from the store (a debugging aid: the
    /// cache must never hold a stale or wrong expert). Returns the first mismatch.
    pub fn verify_slots(&mut self) -> Result<(), EngineError> {
        self.settle();
        let len = self.layout.bytes();
        let mut fresh = self.arena.scratch();
        for layer in 0..self.slots.len() {
            for s in 0..self.slots[layer].holds.len() {
                let Some(e) = self.slots[layer].holds[s] else {
                    continue;
                };
                self.store
                    .read_into(layer, e as usize, fresh.as_mut_slice())?;
                let slots = &self.slots[layer];
                if slots.slot_of[e as usize] != Some(s as u32)
                    || self.arena.slot(layer, s, len) != &fresh.as_slice()[..len]
                {
                    return Err(EngineError::ExpertStore {
                        reason: format!(
                            "layer {layer} slot {s} does not hold expert {e} as stored"
                        ),
                    });
                }
            }
        }
        Ok(())
    }
}

impl Drop for ExpertCache {
    /// The I/O threads may still be reading into the arena: wait for them before it is freed.
    fn drop(&mut self) {
        self.settle();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::experts::store::RamStore;
    use crate::kernels::WeightDtype;

    /// A cache of `slots` slots over 2 layers × 6 experts whose every byte names its block.
    fn cache(slots: usize) -> ExpertCache {
        let layout = ExpertLayout {
            hidden: 8,
            intermediate: 4,
            dtype: WeightDtype::F32,
            quant_bytes: None,
        };
        let mut store = RamStore::new(layout, 2, 6);
        for layer in 0..2 {
            for e in 0..6 {
                store.block_mut(layer, e).fill((10 * layer + e) as u8);
            }
        }
        ExpertCache::new(Arc::new(store), 2, 6, slots, CacheMode::Lru).unwrap()
    }

    /// The experts `needed` of `layer`, as the cache hands them over: (expert, first byte).
    fn run(c: &mut ExpertCache, layer: usize, needed: &[u32]) -> Vec<(u32, u8)> {
        run_ahead(c, layer, needed, &[])
    }

    /// [`run`], naming later layers' experts `ahead`.
    fn run_ahead(
        c: &mut ExpertCache,
        layer: usize,
        needed: &[u32],
        ahead: &[(usize, Vec<u32>)],
    ) -> Vec<(u32, u8)> {
        let mut seen = Vec::new();
        c.with_experts(layer, needed, ahead, |views| {
            seen.extend(views.iter().map(|&(e, m)| (e, m.bytes()[0][0])));
        })
        .unwrap();
        seen.sort_unstable();
        seen
    }

    #[test]
    fn a_cache_is_filling_until_every_layer_holds_an_expert_in_each_slot() {
        let mut c = cache(2);
        assert!(c.filling());
        run(&mut c, 0, &[1, 2]);
        assert!(c.filling(), "layer 1 is still empty");
        run(&mut c, 1, &[0, 5]);
        assert!(!c.filling());
        // Slots emptied every forward have nothing to fill.
        let layout = c.layout();
        let store = RamStore::new(layout, 2, 6);
        let none = ExpertCache::new(Arc::new(store), 2, 6, 2, CacheMode::NoCache).unwrap();
        assert!(!none.filling());
    }

    /// A store whose reads of one expert take `delay`; the others are immediate.
    struct SlowOne {
        inner: RamStore,
        slow: (usize, usize),
        delay: std::time::Duration,
    }

    impl ExpertStore for SlowOne {
        fn layout(&self) -> ExpertLayout {
            self.inner.layout()
        }
        fn read_into(
            &self,
            layer: usize,
            expert: usize,
            dst: &mut [u8],
        ) -> Result<(), EngineError> {
            if (layer, expert) == self.slow {
                std::thread::sleep(self.delay);
            }
            self.inner.read_into(layer, expert, dst)
        }
        fn tier(&self) -> &'static str {
            "test (one slow expert)"
        }
    }

    #[test]
    fn missed_experts_run_as_their_reads_finish_and_keep_the_lru_order_of_their_queue() {
        let layout = ExpertLayout {
            hidden: 8,
            intermediate: 4,
            dtype: WeightDtype::F32,
            quant_bytes: None,
        };
        let store = SlowOne {
            inner: RamStore::new(layout, 1, 6),
            slow: (0, 0),
            delay: std::time::Duration::from_millis(300),
        };
        let mut c = ExpertCache::new(Arc::new(store), 1, 6, 3, CacheMode::Lru).unwrap();
        let mut order = Vec::new();
        c.with_experts(0, &[0, 1, 2], &[], |views| {
            order.extend(views.iter().map(|&(e, _)| e));
        })
        .unwrap();
        // Expert 0's read is slow: with reads in flight together, 1 and 2 run while it is read,
        // in whichever order their own (immediate) reads happen to finish.
        if crate::experts::io::reads_in_flight() > 1 {
            assert_eq!(order[2], 0, "the slow expert runs last: {order:?}");
            let mut first = [order[0], order[1]];
            first.sort_unstable();
            assert_eq!(first, [1, 2]);
        } else {
            assert_eq!(order, [0, 1, 2]);
        }
        // The LRU order is the queue's (0 least recently used) whatever order they ran in.
        run(&mut c, 0, &[3]);
        assert_eq!(c.resident(0), [1, 2, 3]);
    }

    #[test]
    fn a_relocated_cache_keeps_its_experts_bytes_and_lru_order() {
        let (mut moved, mut kept) = (cache(3), cache(3));
        for c in [&mut moved, &mut kept] {
            run(c, 0, &[1, 2, 3]);
            run(c, 1, &[4, 5]);
            run(c, 0, &[2]);
        }
        let before = moved.arena.base();
        moved.relocate();
        assert_ne!(moved.arena.base(), before);
        moved.verify_slots().unwrap();
        assert_eq!(moved.resident(0), vec![1, 2, 3]);
        // Expert 1 is the least recently used of layer 0 in both: the next miss evicts it.
        for c in [&mut moved, &mut kept] {
            assert_eq!(run(c, 0, &[0, 3]), vec![(0, 0), (3, 3)]);
            assert_eq!(c.resident(0), vec![0, 2, 3]);
            assert_eq!(run(c, 1, &[5]), vec![(5, 15)]);
        }
        let count = |c: &ExpertCache| {
            let t = c.stats().total;
            (t.hits, t.misses, t.bytes_copied)
        };
        assert_eq!(count(&moved), count(&kept));
    }

    #[test]
    fn experts_read_ahead_are_handed_over_as_stored_and_copied_once() {
        let mut c = cache(4);
        run(&mut c, 0, &[0, 1]);
        c.read_ahead(&[vec![1, 4, 5], vec![2]]);
        let t = c.stats().total;
        assert_eq!((t.misses, t.read_ahead), (2 + 3, 3), "4, 5 and layer 1's 2");
        assert_eq!(run(&mut c, 0, &[1, 4, 5]), vec![(1, 1), (4, 4), (5, 5)]);
        assert_eq!(run(&mut c, 1, &[2, 3]), vec![(2, 12), (3, 13)]);
        let t = c.stats().total;
        assert_eq!(
            (t.hits, t.ahead_used, t.misses),
            (1, 3, 6),
            "only 3 was read on demand"
        );
        assert_eq!(t.bytes_copied, 6 * c.layout().bytes() as u64);
        c.verify_slots().unwrap();
    }

    #[test]
    fn experts_named_ahead_are_read_into_their_layer_and_scored_against_its_next_call() {
        let mut c = cache(4);
        let ahead = [(1, vec![4, 2, 3])];
        assert_eq!(run_ahead(&mut c, 0, &[1, 2], &ahead), vec![(1, 1), (2, 2)]);
        let t = c.stats().per_layer[1];
        assert_eq!((t.misses, t.read_ahead), (2, 2), "half of 4 slots: 4 and 2");
        assert_eq!(run(&mut c, 1, &[2, 5]), vec![(2, 12), (5, 15)]);
        let t = c.stats().per_layer[1];
        assert_eq!(
            (t.ahead_used, t.misses),
            (1, 3),
            "2 came ahead, 5 is read now"
        );
        assert_eq!(
            (t.predicted, t.predicted_right, t.predicted_needed),
            (3, 1, 2),
            "3 named, 1 of the 2 needed among them"
        );
        // A prediction is scored once: the next call in layer 1 has none.
        run(&mut c, 1, &[2]);
        assert_eq!(c.stats().per_layer[1].predicted, 3);
        c.verify_slots().unwrap();
    }

    #[test]
    fn big_experts_on_slots_are_read_one_layer_ahead_by_default_and_small_ones_not() {
        assert_eq!(cache(4).auto_layers_ahead(), 0, "256-byte experts");
        let layout = ExpertLayout {
            hidden: 512,
            intermediate: 256,
            dtype: WeightDtype::F32,
            quant_bytes: None,
        };
        assert!(layout.bytes() >= LAYER_AHEAD_MIN_BYTES);
        let store = Arc::new(RamStore::new(layout, 2, 3));
        let lru = ExpertCache::new(store.clone(), 2, 3, 2, CacheMode::Lru).unwrap();
        assert_eq!(lru.auto_layers_ahead(), 1);
        let cleared = ExpertCache::new(store, 2, 3, 2, CacheMode::NoCache).unwrap();
        assert_eq!(
            cleared.auto_layers_ahead(),
            0,
            "slots emptied every forward"
        );
    }

    #[test]
    fn read_ahead_fills_at_most_half_the_slots_and_keeps_the_experts_it_wants() {
        let mut c = cache(4);
        run(&mut c, 0, &[0, 1, 2, 3]);
        // 3 is wanted and resident: it becomes the most recently used and is not evicted.
        c.read_ahead(&[vec![3, 4, 5, 1]]);
        assert_eq!(c.stats().total.read_ahead, 2, "half of 4 slots");
        assert_eq!(
            c.resident(0),
            vec![2, 3, 4, 5],
            "0 and 1 were the least recently used"
        );
        c.verify_slots().unwrap();
    }

    #[test]
    fn read_ahead_does_nothing_when_the_slots_are_emptied_every_forward() {
        let mut c = cache(4);
        c.mode = CacheMode::NoCache;
        c.read_ahead(&[vec![1, 2]]);
        assert_eq!(c.stats().total.misses, 0);
        assert!(c.resident(0).is_empty());
    }

    #[test]
    fn a_cache_dropped_or_cleared_with_reads_in_flight_waits_for_them() {
        for _ in 0..20 {
            let mut c = cache(6);
            c.read_ahead(&[vec![0, 1, 2], vec![3, 4, 5]]);
            c.clear();
            assert!(c.resident(1).is_empty());
            c.read_ahead(&[vec![0, 1, 2], vec![3, 4, 5]]);
        }
    }

    #[test]
    fn a_cache_larger_than_memory_is_an_error_naming_its_size_not_an_abort() {
        let layout = ExpertLayout {
            hidden: 8,
            intermediate: 4,
            dtype: WeightDtype::F32,
            quant_bytes: None,
        };
        let store = RamStore::new(layout, 1, 6);
        let err = ExpertCache::new(Arc::new(store), 1 << 32, 6, 6, CacheMode::Lru).unwrap_err();
        assert!(err.to_string().contains("use fewer slots"), "{err}");
    }
}
