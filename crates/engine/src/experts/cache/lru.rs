//! One layer's slots as the LRU policy sees them: which expert each slot holds, which slot holds
//! each expert, when each was last used, which are being read into, and which hold a read-ahead
//! no forward has used yet; the victim a new expert evicts. Their bytes are the arena's; reads
//! are the cache's.

/// One layer's slots (their bytes are the layer's range of the arena).
pub(super) struct Slots {
    /// Expert held by each slot.
    pub(super) holds: Vec<Option<u32>>,
    /// Slot holding each expert.
    pub(super) slot_of: Vec<Option<u32>>,
    /// Last use of each slot (a global clock), for LRU.
    pub(super) last_use: Vec<u64>,
    /// A read into the slot is in flight (its `holds` is the expert being read).
    pub(super) loading: Vec<bool>,
    /// The slot's expert came by read-ahead and no forward has used it yet.
    pub(super) unused_ahead: Vec<bool>,
}

impl Slots {
    /// `count` empty slots for a layer of `experts` experts.
    pub(super) fn new(count: usize, experts: usize) -> Slots {
        Slots {
            holds: vec![None; count],
            slot_of: vec![None; experts],
            last_use: vec![0; count],
            loading: vec![false; count],
            unused_ahead: vec![false; count],
        }
    }

    /// The slot a new expert takes among those `usable` and not being read into: an empty one
    /// first, else the least recently used.
    pub(super) fn victim(&self, usable: impl Fn(usize) -> bool) -> Option<usize> {
        (0..self.holds.len())
            .filter(|&s| usable(s) && !self.loading[s])
            .min_by_key(|&s| (self.holds[s].is_some(), self.last_use[s]))
    }

    /// Slot `s` now holds expert `e` (its read starting; `ahead`: a read-ahead), evicting
    /// whatever it held.
    pub(super) fn assign(&mut self, e: u32, s: usize, ahead: bool) {
        self.forget(s);
        self.holds[s] = Some(e);
        self.slot_of[e as usize] = Some(s as u32);
        self.loading[s] = true;
        self.unused_ahead[s] = ahead;
    }

    /// Empties slot `s`.
    pub(super) fn forget(&mut self, s: usize) {
        if let Some(e) = self.holds[s].take() {
            self.slot_of[e as usize] = None;
        }
    }

    /// Empties every slot.
    pub(super) fn clear(&mut self) {
        self.holds.iter_mut().for_each(|h| *h = None);
        self.slot_of.iter_mut().for_each(|s| *s = None);
    }

    /// The experts held, ascending.
    pub(super) fn resident(&self) -> Vec<u32> {
        let mut r: Vec<u32> = self.holds.iter().flatten().copied().collect();
        r.sort_unstable();
        r
    }
}
