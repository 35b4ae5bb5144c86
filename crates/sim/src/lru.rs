//! The engine's per-layer expert slot cache (`specfit_engine::ExpertCache`), counted instead of
//! copied: the same slots, the same eviction and the same order of events, so a replayed trace
//! gets the hits and misses the engine got (a test in `crates/engine/tests/slot_model.rs` holds
//! the two together on random route streams). It owns no timing.
//!
//! One call for `needed` (distinct, ascending) experts of a layer, as the engine runs it:
//! 1. the resident ones are hits and are pinned; the missing ones queue, in order;
//! 2. each queued expert takes the free slot that is empty, else least recently used (first
//!    such slot), while one is free;
//! 3. the hits are used (each becomes the most recent, in order) and unpinned; more reads start;
//! 4. the reads finish in the order they started: each expert is used (most recent), its slot
//!    freed, and more reads start (those waited for a slot: `Access::slot_waits`).
//!
//! With 0 slots there is no cache: every needed expert is a miss.

/// Per-layer slots of one cache.
#[derive(Debug, Clone)]
pub struct SlotLru {
    slots: usize,
    clock: u64,
    layers: Vec<Layer>,
}

#[derive(Debug, Clone)]
struct Layer {
    holds: Vec<Option<u32>>,
    last_use: Vec<u64>,
}

impl SlotLru {
    /// Empty slots: `slots` per layer (0 = no cache).
    pub fn new(layers: usize, slots: usize) -> SlotLru {
        SlotLru {
            slots,
            clock: 0,
            layers: (0..layers)
                .map(|_| Layer {
                    holds: vec![None; slots],
                    last_use: vec![0; slots],
                })
                .collect(),
        }
    }

    /// One slot per expert of each layer, each holding its expert (all equally old): what a
    /// cache of experts used in place holds from the start.
    pub fn holding_all(layers: usize, experts: usize) -> SlotLru {
        let mut lru = SlotLru::new(layers, experts);
        for layer in &mut lru.layers {
            for (e, held) in layer.holds.iter_mut().enumerate() {
                *held = Some(e as u32);
            }
        }
        lru
    }

    /// Whether some layer still has an empty slot (never without slots).
    pub fn filling(&self) -> bool {
        self.layers
            .iter()
            .any(|l| l.holds.iter().any(Option::is_none))
    }

    /// Slots per layer.
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// The experts resident in `layer`, least recently used first.
    pub fn resident(&self, layer: usize) -> Vec<u32> {
        let l = &self.layers[layer];
        let mut held: Vec<(u64, u32)> = l
            .holds
            .iter()
            .zip(&l.last_use)
            .filter_map(|(h, &t)| h.map(|e| (t, e)))
            .collect();
        held.sort_unstable();
        held.into_iter().map(|(_, e)| e).collect()
    }

    /// One forward's use of `needed` (distinct, ascending) in `layer`: (hits, misses).
    pub fn access_layer(&mut self, layer: usize, needed: &[u32]) -> (u64, u64) {
        let a = self.access(layer, needed);
        (a.hits, a.misses)
    }

    /// One forward's use of `needed` (distinct, ascending) in `layer`, counted.
    pub fn access(&mut self, layer: usize, needed: &[u32]) -> Access {
        if self.slots == 0 {
            return Access {
                misses: needed.len() as u64,
                ..Access::default()
            };
        }
        let l = &mut self.layers[layer];
        let slot_of = |l: &Layer, e: u32| l.holds.iter().position(|&h| h == Some(e));
        let (hit, miss): (Vec<u32>, Vec<u32>) =
            needed.iter().partition(|&&e| slot_of(l, e).is_some());
        let mut busy = vec![false; self.slots];
        for &e in &hit {
            busy[slot_of(l, e).expect("resident")] = true;
        }
        let mut pending: std::collections::VecDeque<u32> = miss.iter().copied().collect();
        let mut in_flight: std::collections::VecDeque<usize> = Default::default();
        let launch = |l: &mut Layer,
                      busy: &mut [bool],
                      pending: &mut std::collections::VecDeque<u32>,
                      in_flight: &mut std::collections::VecDeque<usize>| {
            while let Some(&e) = pending.front() {
                let Some(victim) = (0..busy.len())
                    .filter(|&s| !busy[s])
                    .min_by_key(|&s| (l.holds[s].is_some(), l.last_use[s]))
                else {
                    return;
                };
                pending.pop_front();
                l.holds[victim] = Some(e);
                busy[victim] = true;
                in_flight.push_back(victim);
            }
        };
        launch(l, &mut busy, &mut pending, &mut in_flight);
        if !hit.is_empty() {
            for &e in &hit {
                self.clock += 1;
                let s = slot_of(l, e).expect("pinned");
                l.last_use[s] = self.clock;
            }
            for &e in &hit {
                busy[slot_of(l, e).expect("pinned")] = false;
            }
            launch(l, &mut busy, &mut pending, &mut in_flight);
        }
        let mut slot_waits = 0;
        while let Some(s) = in_flight.pop_front() {
            self.clock += 1;
            l.last_use[s] = self.clock;
            busy[s] = false;
            let before = pending.len();
            launch(l, &mut busy, &mut pending, &mut in_flight);
            slot_waits += (before - pending.len()) as u64;
        }
        Access {
            hits: hit.len() as u64,
            misses: miss.len() as u64,
            slot_waits,
        }
    }
}

/// What one layer's call cost the slots.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Access {
    pub hits: u64,
    pub misses: u64,
    /// Of `misses`, the reads that could start only once a slot was freed by an expert computed
    /// (the engine's `LayerStats::slot_waits`).
    pub slot_waits: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hits_are_pinned_so_a_miss_evicts_another_expert_even_when_the_hit_is_older() {
        // Two slots: A (older) and B. Needing {A, C}: A is a hit and pinned, C evicts B.
        let mut lru = SlotLru::new(1, 2);
        assert_eq!(lru.access_layer(0, &[1]), (0, 1));
        assert_eq!(lru.access_layer(0, &[2]), (0, 1));
        assert_eq!(lru.access_layer(0, &[0, 1]), (1, 1));
        assert_eq!(lru.resident(0), vec![1, 0]);
    }

    #[test]
    fn slots_fill_until_every_layer_holds_an_expert_in_each() {
        let mut lru = SlotLru::new(2, 2);
        assert!(lru.filling());
        lru.access(0, &[0, 1]);
        assert!(lru.filling(), "layer 1 is still empty");
        lru.access(1, &[3, 4]);
        assert!(!lru.filling());
        assert!(!SlotLru::new(2, 0).filling(), "no slots, nothing to fill");
        assert!(!SlotLru::holding_all(2, 4).filling());
    }

    #[test]
    fn more_misses_than_slots_cycle_through_the_slots_in_order() {
        let mut lru = SlotLru::new(1, 2);
        assert_eq!(lru.access_layer(0, &[0, 1, 2, 3]), (0, 4));
        assert_eq!(lru.resident(0), vec![2, 3]);
        assert_eq!(lru.access_layer(0, &[3]), (1, 0));
    }

    #[test]
    fn reads_beyond_the_free_slots_wait_for_a_slot_and_are_counted() {
        // Three slots holding 0, 1, 2; needing {0, 5, 6, 7, 8}: 0 is a hit (pinned), 5 and 6
        // start at once, 7 once the hit is used, 8 only once 5 is computed.
        let mut lru = SlotLru::new(1, 3);
        lru.access(0, &[0, 1, 2]);
        let a = lru.access(0, &[0, 5, 6, 7, 8]);
        assert_eq!((a.hits, a.misses, a.slot_waits), (1, 4, 1));
        // Enough slots: nobody waits.
        let mut lru = SlotLru::new(1, 8);
        let a = lru.access(0, &[1, 2, 3, 4, 5]);
        assert_eq!((a.hits, a.misses, a.slot_waits), (0, 5, 0));
        // No cache: nothing is counted but misses.
        let mut lru = SlotLru::new(1, 0);
        assert_eq!(lru.access(0, &[1, 2]).slot_waits, 0);
    }

    #[test]
    fn a_cache_holding_every_expert_never_misses() {
        let mut lru = SlotLru::holding_all(2, 4);
        assert_eq!(lru.resident(1), vec![0, 1, 2, 3]);
        for needed in [&[0u32, 3][..], &[1, 2, 3], &[0, 1, 2, 3]] {
            let a = lru.access(1, needed);
            assert_eq!(
                (a.hits, a.misses, a.slot_waits),
                (needed.len() as u64, 0, 0)
            );
        }
        // Used as any cache: the latest used are the most recent.
        assert_eq!(lru.access_layer(0, &[2]), (1, 0));
        assert_eq!(lru.resident(0), vec![0, 1, 3, 2]);
    }

    #[test]
    fn no_slots_means_every_expert_is_a_miss() {
        let mut lru = SlotLru::new(2, 0);
        assert_eq!(lru.access_layer(1, &[0, 5]), (0, 2));
        assert_eq!(lru.access_layer(1, &[0, 5]), (0, 2));
    }
}
