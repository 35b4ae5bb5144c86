//! The per-layer slot cache: `S` expert-sized slots per MoE layer, filled from the store on a
//! miss and evicted least-recently-used. Every hit, miss, copied byte and copy time is counted,
//! per layer and in total. With [`CacheMode::ClearEveryForward`] the slots are emptied before each
//! forward (the paper's "vanilla" baseline, where every routed expert is copied).
//!
//! Misses are read by the I/O threads ([`crate::experts::io`]) while the resident experts are
//! computed, several reads in flight at once; each missing expert is still copied exactly once
//! per call, even when the call needs more experts than there are slots.

use std::collections::VecDeque;
use std::sync::mpsc::channel;
use std::sync::Arc;
use std::time::Instant;

use crate::error::EngineError;
use crate::experts::aligned::{padded, AlignedBuf};
use crate::experts::io::{start_read, Completion, SlotPtr};
use crate::experts::store::{ExpertLayout, ExpertStore};

/// When the slots are invalidated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheMode {
    /// Keep experts across forwards (LRU).
    Lru,
    /// Empty every slot before each forward.
    ClearEveryForward,
}

/// Copy counters for one layer (or summed over layers).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LayerStats {
    pub hits: u64,
    pub misses: u64,
    pub bytes_copied: u64,
    /// Sum of the durations of the reads (they may overlap each other and compute).
    pub copy_seconds: f64,
    /// Time the forward stood still waiting for reads: the copies' cost on the critical path.
    pub wait_seconds: f64,
}

impl LayerStats {
    fn add(&mut self, other: &LayerStats) {
        self.hits += other.hits;
        self.misses += other.misses;
        self.bytes_copied += other.bytes_copied;
        self.copy_seconds += other.copy_seconds;
        self.wait_seconds += other.wait_seconds;
    }
}

/// Counters per MoE layer plus their sum.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CopyStats {
    pub per_layer: Vec<LayerStats>,
    pub total: LayerStats,
}

impl CopyStats {
    /// Read rounds: per layer `⌈misses / width⌉` with `width` reads in flight at once
    /// ([`crate::experts::reads_in_flight`]), summed over layers. A layer waits about one read
    /// latency per round, however many reads share it (the replay cost model's latency term).
    pub fn read_rounds(&self, width: usize) -> usize {
        let width = width.max(1) as u64;
        self.per_layer
            .iter()
            .map(|l| l.misses.div_ceil(width) as usize)
            .sum()
    }

    /// `self − earlier`, for the counters of one forward.
    pub fn since(&self, earlier: &CopyStats) -> CopyStats {
        let sub = |a: &LayerStats, b: &LayerStats| LayerStats {
            hits: a.hits - b.hits,
            misses: a.misses - b.misses,
            bytes_copied: a.bytes_copied - b.bytes_copied,
            copy_seconds: a.copy_seconds - b.copy_seconds,
            wait_seconds: a.wait_seconds - b.wait_seconds,
        };
        let per_layer: Vec<LayerStats> = self
            .per_layer
            .iter()
            .zip(
                earlier
                    .per_layer
                    .iter()
                    .chain(std::iter::repeat(&LayerStats::default())),
            )
            .map(|(a, b)| sub(a, b))
            .collect();
        CopyStats {
            total: sub(&self.total, &earlier.total),
            per_layer,
        }
    }
}

/// One layer's slots (their bytes are the layer's range of [`ExpertCache::data`]).
struct Slots {
    /// Expert held by each slot.
    holds: Vec<Option<u32>>,
    /// Slot holding each expert.
    slot_of: Vec<Option<u32>>,
    /// Last use of each slot (a global clock), for LRU.
    last_use: Vec<u64>,
}

/// The fast-memory side of expert offload.
pub struct ExpertCache {
    store: Arc<dyn ExpertStore>,
    layout: ExpertLayout,
    /// Bytes per slot (the block padded to 4 KiB).
    stride: usize,
    /// Every layer's `S` slots of `stride` bytes, layer after layer, on transparent huge pages:
    /// slot `s` of layer `l` starts at `(l · S + s) · stride`, 4 KiB-aligned.
    data: AlignedBuf,
    slots: Vec<Slots>,
    mode: CacheMode,
    clock: u64,
    stats: CopyStats,
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
    /// `slots_per_layer` slots for each of `layers` MoE layers of `experts` experts over `store`.
    pub fn new(
        store: Box<dyn ExpertStore>,
        layers: usize,
        experts: usize,
        slots_per_layer: usize,
        mode: CacheMode,
    ) -> Result<ExpertCache, EngineError> {
        Self::over(Arc::from(store), layers, experts, slots_per_layer, mode)
    }

    /// A new, empty cache of `slots_per_layer` slots per layer in `mode` over the same store:
    /// several caches (one per benchmarked policy, say) share one store and one copy of the
    /// experts.
    pub fn sibling(
        &self,
        slots_per_layer: usize,
        mode: CacheMode,
    ) -> Result<ExpertCache, EngineError> {
        let experts = self.slots.first().map_or(0, |s| s.slot_of.len());
        Self::over(
            Arc::clone(&self.store),
            self.slots.len(),
            experts,
            slots_per_layer,
            mode,
        )
    }

    fn over(
        store: Arc<dyn ExpertStore>,
        layers: usize,
        experts: usize,
        slots_per_layer: usize,
        mode: CacheMode,
    ) -> Result<ExpertCache, EngineError> {
        if slots_per_layer == 0 {
            return Err(EngineError::TooFewSlots { slots: 0 });
        }
        let s = slots_per_layer.min(experts);
        let layout = store.layout();
        let stride = padded(layout.bytes());
        let data = AlignedBuf::huge_zeroed(layers * s * stride);
        let slots = (0..layers)
            .map(|_| Slots {
                holds: vec![None; s],
                slot_of: vec![None; experts],
                last_use: vec![0; s],
            })
            .collect();
        Ok(ExpertCache {
            store,
            layout,
            stride,
            data,
            slots,
            mode,
            clock: 0,
            stats: CopyStats {
                per_layer: vec![LayerStats::default(); layers],
                total: LayerStats::default(),
            },
        })
    }

    /// Shape of each expert block.
    pub fn layout(&self) -> ExpertLayout {
        self.layout
    }

    /// Slots per layer.
    pub fn slots_per_layer(&self) -> usize {
        self.slots.first().map_or(0, |s| s.holds.len())
    }

    /// Reads this cache can have in flight at once: the I/O threads
    /// ([`crate::experts::reads_in_flight`]), but no more than a layer's slots, since each read
    /// needs a free slot until its expert has been computed.
    pub fn read_width(&self) -> usize {
        crate::experts::reads_in_flight().min(self.slots_per_layer().max(1))
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
        let mut r: Vec<u32> = self.slots[layer].holds.iter().flatten().copied().collect();
        r.sort_unstable();
        r
    }

    /// Moves the slots to a newly allocated arena, bytes and bookkeeping unchanged, then frees
    /// the old one. On a virtual machine the speed of reads into (and compute from) an arena can
    /// depend on where its memory landed, for as long as it lives; `specfit bench` relocates
    /// every configuration's cache before each prompt so that no configuration keeps a slow or
    /// fast arena for a whole run (BENCHMARKS.md, "Expert slots on huge pages"). It needs a
    /// second arena's memory for a moment: meant for benchmarking, not for serving a big model.
    pub fn relocate(&mut self) {
        let len = self.data.as_slice().len();
        let mut fresh = AlignedBuf::huge_zeroed(len);
        fresh.as_mut_slice().copy_from_slice(self.data.as_slice());
        self.data = fresh;
    }

    /// Called at the start of every forward.
    pub fn begin_forward(&mut self) {
        if self.mode == CacheMode::ClearEveryForward {
            self.clear();
        }
    }

    /// Empties every slot (the next forward copies every expert it routes to).
    pub fn clear(&mut self) {
        for layer in &mut self.slots {
            layer.holds.iter_mut().for_each(|h| *h = None);
            layer.slot_of.iter_mut().for_each(|s| *s = None);
        }
    }

    /// Runs `f` on `(expert, block bytes)` for every expert of `needed` (distinct ids) in
    /// `layer`, once each: first one call with all the resident experts, while the missing ones
    /// are read into free slots (least recently used first) by the I/O threads, then one call
    /// per missing expert as soon as its read is done (its slot may then take a later miss). Every expert is copied at most
    /// once per call, whatever the slot count.
    pub fn with_experts(
        &mut self,
        layer: usize,
        needed: &[u32],
        mut f: impl FnMut(&[(u32, &[u8])]),
    ) -> Result<(), EngineError> {
        let (hit, miss): (Vec<u32>, Vec<u32>) = needed
            .iter()
            .partition(|&&e| self.slots[layer].slot_of[e as usize].is_some());
        let slot_count = self.slots[layer].holds.len();
        // Slots whose expert this call still has to run (not evictable).
        let mut busy = vec![false; slot_count];
        for &e in &hit {
            busy[self.slots[layer].slot_of[e as usize].expect("resident") as usize] = true;
        }
        let (done_tx, done_rx) = channel::<Completion>();
        let mut pending: VecDeque<u32> = miss.iter().copied().collect();
        let mut in_flight: VecDeque<(u32, usize)> = VecDeque::new(); // (expert, slot), launch order
        let mut ready: Vec<Option<(Result<(), EngineError>, f64)>> =
            (0..slot_count).map(|_| None).collect();
        let mut stats = LayerStats {
            hits: hit.len() as u64,
            ..LayerStats::default()
        };
        let mut error = None;
        self.launch(layer, &mut pending, &mut in_flight, &mut busy, &done_tx);
        // The resident experts run together (the caller may spread them over threads) while the
        // first misses are read.
        if !hit.is_empty() {
            let (len, base) = (self.layout.bytes(), self.slot_offset(layer, 0));
            let stride = self.stride;
            let slots = &mut self.slots[layer];
            let mut at = Vec::with_capacity(hit.len());
            for &e in &hit {
                self.clock += 1;
                let s = slots.slot_of[e as usize].expect("resident") as usize;
                slots.last_use[s] = self.clock;
                at.push((e, s));
            }
            let views: Vec<(u32, &[u8])> = at
                .iter()
                .map(|&(e, s)| (e, self.data.range(base + s * stride, len)))
                .collect();
            f(&views);
            for &(_, s) in &at {
                busy[s] = false;
            }
            self.launch(layer, &mut pending, &mut in_flight, &mut busy, &done_tx);
        }
        while let Some((e, s)) = in_flight.pop_front() {
            let wait = Instant::now();
            while ready[s].is_none() {
                let (tag, result, seconds) = done_rx.recv().expect("I/O threads alive");
                ready[tag] = Some((result, seconds));
            }
            stats.wait_seconds += wait.elapsed().as_secs_f64();
            let (result, seconds) = ready[s].take().expect("just received");
            stats.copy_seconds += seconds;
            match result {
                Ok(()) if error.is_none() => {
                    stats.misses += 1;
                    stats.bytes_copied += self.layout.bytes() as u64;
                    self.clock += 1;
                    self.slots[layer].last_use[s] = self.clock;
                    let at = self.slot_offset(layer, s);
                    f(&[(e, self.data.range(at, self.layout.bytes()))]);
                }
                Ok(()) => {}
                Err(err) => {
                    error.get_or_insert(err);
                    self.forget(layer, s);
                }
            }
            busy[s] = false;
            if error.is_none() {
                self.launch(layer, &mut pending, &mut in_flight, &mut busy, &done_tx);
            }
        }
        self.stats.per_layer[layer].add(&stats);
        self.stats.total.add(&stats);
        match error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Starts reads for pending misses while a slot is free; the least recently used free slot
    /// is taken first (empty slots before occupied ones).
    fn launch(
        &mut self,
        layer: usize,
        pending: &mut VecDeque<u32>,
        in_flight: &mut VecDeque<(u32, usize)>,
        busy: &mut [bool],
        done: &std::sync::mpsc::Sender<Completion>,
    ) {
        while let Some(&e) = pending.front() {
            let base = self.slot_offset(layer, 0);
            let slots = &mut self.slots[layer];
            let Some(victim) = (0..busy.len())
                .filter(|&s| !busy[s])
                .min_by_key(|&s| (slots.holds[s].is_some(), slots.last_use[s]))
            else {
                return;
            };
            pending.pop_front();
            if let Some(old) = slots.holds[victim].take() {
                slots.slot_of[old as usize] = None;
            }
            slots.holds[victim] = Some(e);
            slots.slot_of[e as usize] = Some(victim as u32);
            busy[victim] = true;
            let stride = self.stride;
            let ptr = SlotPtr {
                ptr: self.data.range_ptr(base + victim * stride, stride),
                len: stride,
            };
            start_read(&self.store, layer, e as usize, ptr, victim, done);
            in_flight.push_back((e, victim));
        }
    }

    /// Where slot `s` of `layer` starts in [`ExpertCache::data`].
    fn slot_offset(&self, layer: usize, s: usize) -> usize {
        (layer * self.slots_per_layer() + s) * self.stride
    }

    /// Empties slot `s` of `layer` (after a failed read).
    fn forget(&mut self, layer: usize, s: usize) {
        let slots = &mut self.slots[layer];
        if let Some(e) = slots.holds[s].take() {
            slots.slot_of[e as usize] = None;
        }
    }

    /// Checks every occupied slot against a fresh read from the store (a debugging aid: the
    /// cache must never hold a stale or wrong expert). Returns the first mismatch.
    pub fn verify_slots(&mut self) -> Result<(), EngineError> {
        let (len, stride) = (self.layout.bytes(), self.stride);
        let mut fresh = AlignedBuf::zeroed(stride);
        for layer in 0..self.slots.len() {
            for s in 0..self.slots[layer].holds.len() {
                let Some(e) = self.slots[layer].holds[s] else {
                    continue;
                };
                self.store
                    .read_into(layer, e as usize, fresh.as_mut_slice())?;
                let slots = &self.slots[layer];
                if slots.slot_of[e as usize] != Some(s as u32)
                    || self.data.range(self.slot_offset(layer, s), len) != &fresh.as_slice()[..len]
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
        };
        let mut store = RamStore::new(layout, 2, 6);
        for layer in 0..2 {
            for e in 0..6 {
                store.block_mut(layer, e).fill((10 * layer + e) as u8);
            }
        }
        ExpertCache::new(Box::new(store), 2, 6, slots, CacheMode::Lru).unwrap()
    }

    /// The experts `needed` of `layer`, as the cache hands them over: (expert, first byte).
    fn run(c: &mut ExpertCache, layer: usize, needed: &[u32]) -> Vec<(u32, u8)> {
        let mut seen = Vec::new();
        c.with_experts(layer, needed, |views| {
            seen.extend(views.iter().map(|&(e, b)| (e, b[0])));
        })
        .unwrap();
        seen.sort_unstable();
        seen
    }

    #[test]
    fn a_relocated_cache_keeps_its_experts_bytes_and_lru_order() {
        let (mut moved, mut kept) = (cache(3), cache(3));
        for c in [&mut moved, &mut kept] {
            run(c, 0, &[1, 2, 3]);
            run(c, 1, &[4, 5]);
            run(c, 0, &[2]);
        }
        let before = moved.data.as_slice().as_ptr();
        moved.relocate();
        assert_ne!(moved.data.as_slice().as_ptr(), before);
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
}
