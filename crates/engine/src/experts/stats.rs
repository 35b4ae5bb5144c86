//! Copy counters: hits, misses, bytes, read and wait times per MoE layer and in total, and the
//! difference between two readings (one forward's copies). It counts; it copies nothing.

/// Copy counters for one layer (or summed over layers).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LayerStats {
    /// Needed experts found in a slot, not brought there by a read-ahead.
    pub hits: u64,
    /// Expert copies: reads a forward started for experts it needed, plus read-aheads.
    pub misses: u64,
    pub bytes_copied: u64,
    /// Sum of the durations of the reads (they may overlap each other and compute).
    pub copy_seconds: f64,
    /// Time the forward stood still waiting for reads: the copies' cost on the critical path.
    pub wait_seconds: f64,
    /// Of `misses`, the copies started ahead of the forward ([`ExpertCache::read_ahead`]).
    pub read_ahead: u64,
    /// Experts a forward needed that a read-ahead had brought (or was bringing): counted in
    /// `misses` when their read started, not again in `hits`.
    pub ahead_used: u64,
    /// Layer-ahead predictions ([`ExpertCache::with_experts`]' `ahead`): experts predicted for
    /// this layer's calls, how many of those calls' needed experts were among them, and how
    /// many experts those calls needed. Precision = right / predicted, recall = right / needed.
    /// Reading several layers ahead, a layer's guess made farthest ahead is the one counted.
    ///
    /// [`ExpertCache::with_experts`]: crate::experts::ExpertCache::with_experts
    pub predicted: u64,
    pub predicted_right: u64,
    pub predicted_needed: u64,
    /// Of `misses`, the reads a forward could start only once a slot of its layer was freed
    /// (the expert that held it computed, or a read-ahead into it finished): when a layer needs
    /// more experts than it has free slots. They wait behind experts computed in launch order,
    /// which costs more than reads queued behind other reads (the replay model's own term).
    pub slot_waits: u64,
}

impl LayerStats {
    /// Adds `other`'s counts and times to these.
    pub fn add(&mut self, other: &LayerStats) {
        self.hits += other.hits;
        self.misses += other.misses;
        self.bytes_copied += other.bytes_copied;
        self.copy_seconds += other.copy_seconds;
        self.wait_seconds += other.wait_seconds;
        self.read_ahead += other.read_ahead;
        self.ahead_used += other.ahead_used;
        self.predicted += other.predicted;
        self.predicted_right += other.predicted_right;
        self.predicted_needed += other.predicted_needed;
        self.slot_waits += other.slot_waits;
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
            read_ahead: a.read_ahead - b.read_ahead,
            ahead_used: a.ahead_used - b.ahead_used,
            predicted: a.predicted - b.predicted,
            predicted_right: a.predicted_right - b.predicted_right,
            predicted_needed: a.predicted_needed - b.predicted_needed,
            slot_waits: a.slot_waits - b.slot_waits,
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
