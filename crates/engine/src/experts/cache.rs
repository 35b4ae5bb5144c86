//! The per-layer slot cache: `S` expert-sized slots per MoE layer, filled from the store on a
//! miss and evicted least-recently-used. Every hit, miss, copied byte and copy time is counted,
//! per layer and in total. With [`CacheMode::ClearEveryForward`] the slots are emptied before each
//! forward (the paper's "vanilla" baseline, where every routed expert is copied).

use std::time::Instant;

use crate::error::EngineError;
use crate::experts::aligned::{padded, AlignedBuf};
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
    pub copy_seconds: f64,
}

impl LayerStats {
    fn add(&mut self, other: &LayerStats) {
        self.hits += other.hits;
        self.misses += other.misses;
        self.bytes_copied += other.bytes_copied;
        self.copy_seconds += other.copy_seconds;
    }
}

/// Counters per MoE layer plus their sum.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CopyStats {
    pub per_layer: Vec<LayerStats>,
    pub total: LayerStats,
}

impl CopyStats {
    /// `self − earlier`, for the counters of one forward.
    pub fn since(&self, earlier: &CopyStats) -> CopyStats {
        let sub = |a: &LayerStats, b: &LayerStats| LayerStats {
            hits: a.hits - b.hits,
            misses: a.misses - b.misses,
            bytes_copied: a.bytes_copied - b.bytes_copied,
            copy_seconds: a.copy_seconds - b.copy_seconds,
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

/// One layer's slots.
struct Slots {
    /// `S` slots of `stride` bytes, each 4 KiB-aligned.
    data: AlignedBuf,
    /// Expert held by each slot.
    holds: Vec<Option<u32>>,
    /// Slot holding each expert.
    slot_of: Vec<Option<u32>>,
    /// Last use of each slot (a global clock), for LRU.
    last_use: Vec<u64>,
}

/// The fast-memory side of expert offload.
pub struct ExpertCache {
    store: Box<dyn ExpertStore>,
    layout: ExpertLayout,
    /// Bytes per slot (the block padded to 4 KiB).
    stride: usize,
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
        if slots_per_layer == 0 {
            return Err(EngineError::TooFewSlots { slots: 0 });
        }
        let s = slots_per_layer.min(experts);
        let layout = store.layout();
        let stride = padded(layout.bytes());
        let slots = (0..layers)
            .map(|_| Slots {
                data: AlignedBuf::zeroed(s * stride),
                holds: vec![None; s],
                slot_of: vec![None; experts],
                last_use: vec![0; s],
            })
            .collect();
        Ok(ExpertCache {
            store,
            layout,
            stride,
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

    /// Called at the start of every forward.
    pub fn begin_forward(&mut self) {
        if self.mode == CacheMode::ClearEveryForward {
            for layer in &mut self.slots {
                layer.holds.iter_mut().for_each(|h| *h = None);
                layer.slot_of.iter_mut().for_each(|s| *s = None);
            }
        }
    }

    /// Runs `f(expert, block bytes)` for every expert of `needed` (distinct ids) in `layer`: the
    /// resident ones first, then each missing one right after it is copied into the least
    /// recently used slot. Every expert is therefore copied at most once per call, even when
    /// `needed` outnumbers the slots.
    pub fn with_experts(
        &mut self,
        layer: usize,
        needed: &[u32],
        mut f: impl FnMut(u32, &[u8]),
    ) -> Result<(), EngineError> {
        let (len, stride) = (self.layout.bytes(), self.stride);
        let (hit, miss): (Vec<u32>, Vec<u32>) = needed
            .iter()
            .partition(|&&e| self.slots[layer].slot_of[e as usize].is_some());
        for &e in &hit {
            self.clock += 1;
            let slots = &mut self.slots[layer];
            let s = slots.slot_of[e as usize].expect("resident") as usize;
            slots.last_use[s] = self.clock;
            f(e, &slots.data.as_slice()[s * stride..s * stride + len]);
        }
        for &e in &miss {
            self.clock += 1;
            let seconds = self.load(layer, e)?;
            let slots = &self.slots[layer];
            let s = slots.slot_of[e as usize].expect("just loaded") as usize;
            let stats = LayerStats {
                hits: 0,
                misses: 1,
                bytes_copied: self.layout.bytes() as u64,
                copy_seconds: seconds,
            };
            self.stats.per_layer[layer].add(&stats);
            self.stats.total.add(&stats);
            f(e, &slots.data.as_slice()[s * stride..s * stride + len]);
        }
        let hits = LayerStats {
            hits: hit.len() as u64,
            ..LayerStats::default()
        };
        self.stats.per_layer[layer].add(&hits);
        self.stats.total.add(&hits);
        Ok(())
    }

    /// Copies expert `e` into the least recently used slot of `layer`; returns the copy time.
    fn load(&mut self, layer: usize, e: u32) -> Result<f64, EngineError> {
        let stride = self.stride;
        let clock = self.clock;
        let slots = &mut self.slots[layer];
        let victim = (0..slots.holds.len())
            .min_by_key(|&s| (slots.holds[s].is_some(), slots.last_use[s]))
            .expect("at least one slot");
        if let Some(old) = slots.holds[victim].take() {
            slots.slot_of[old as usize] = None;
        }
        let start = Instant::now();
        let dst = &mut slots.data.as_mut_slice()[victim * stride..(victim + 1) * stride];
        self.store.read_into(layer, e as usize, dst)?;
        let seconds = start.elapsed().as_secs_f64();
        slots.holds[victim] = Some(e);
        slots.slot_of[e as usize] = Some(victim as u32);
        slots.last_use[victim] = clock;
        Ok(seconds)
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
                    || slots.data.as_slice()[s * stride..s * stride + len]
                        != fresh.as_slice()[..len]
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
