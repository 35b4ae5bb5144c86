//! The simulator's slot model (`specfit_sim::lru::SlotLru`) counts exactly the hits, misses and
//! reads that waited for a slot the engine's `ExpertCache` counts on the same stream of
//! per-layer expert sets: the simulator check of `specfit bench` compares replayed and measured
//! runs on that premise.

use proptest::prelude::*;
use specfit_engine::experts::ExpertLayout;
use specfit_engine::{CacheMode, ExpertCache, RamStore, WeightDtype};
use specfit_sim::lru::SlotLru;

/// A stream of forwards: per forward, per layer, a set of needed experts (distinct, ascending).
fn streams() -> impl Strategy<Value = (usize, usize, usize, Vec<Vec<Vec<u32>>>)> {
    (1usize..3, 2usize..12).prop_flat_map(|(layers, experts)| {
        let set = proptest::collection::btree_set(0..experts as u32, 0..=experts.min(8))
            .prop_map(|s| s.into_iter().collect::<Vec<u32>>());
        (
            Just(layers),
            Just(experts),
            1usize..=experts,
            proptest::collection::vec(proptest::collection::vec(set, layers), 1..40),
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn the_simulators_slots_count_the_engines_hits_misses_and_slot_waits(
        (layers, experts, slots, forwards) in streams()
    ) {
        let layout = ExpertLayout { hidden: 16, intermediate: 16, dtype: WeightDtype::F32, quant_bytes: None };
        let store = RamStore::new(layout, layers, experts);
        let mut cache =
            ExpertCache::new(std::sync::Arc::new(store), layers, experts, slots, CacheMode::Lru).unwrap();
        let mut model = SlotLru::new(layers, slots);
        for (f, forward) in forwards.iter().enumerate() {
            for (layer, needed) in forward.iter().enumerate() {
                let before = cache.stats().per_layer[layer];
                cache.with_experts(layer, needed, &[], |_| {}).unwrap();
                let after = cache.stats().per_layer[layer];
                let engine = (
                    after.hits - before.hits,
                    after.misses - before.misses,
                    after.slot_waits - before.slot_waits,
                );
                let modeled = model.access(layer, needed);
                prop_assert_eq!(
                    (modeled.hits, modeled.misses, modeled.slot_waits),
                    engine,
                    "forward {} layer {} needed {:?}",
                    f,
                    layer,
                    needed
                );
                let mut resident = cache.resident(layer);
                resident.sort_unstable();
                let mut modeled = model.resident(layer);
                modeled.sort_unstable();
                prop_assert_eq!(modeled, resident);
            }
        }
    }
}
