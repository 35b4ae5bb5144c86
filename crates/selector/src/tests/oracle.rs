//! Property tests: the exact search equals the brute-force oracle on random pools of up to 14
//! nodes, under both cost forms and both searched objectives, with ties and shared routes
//! deliberately common.

use proptest::prelude::*;

use super::naive;
use crate::cost::{CostModel, ResidentSet};
use crate::objective::Objective;
use crate::pool::{NodeSpec, PoolSpec};
use crate::search::Selector;
use crate::synth::Rng;

/// Knobs of one random case; the pool itself is drawn from `seed`.
#[derive(Debug, Clone)]
struct Case {
    seed: u64,
    nodes: usize,
    layers: usize,
    experts: usize,
    num_experts_per_tok: usize,
    k: usize,
    residency: bool,
    lambda: Option<f64>,
    root_routed: bool,
    tie_heavy: bool,
    /// Tokens cached before the root, and the cost's charge per row per cached token.
    context: (usize, f64),
}

fn case() -> impl Strategy<Value = Case> {
    (
        any::<u64>(),
        0usize..=14,
        1usize..=4,
        prop_oneof![
            Just(1usize),
            Just(3),
            Just(8),
            Just(64),
            Just(65),
            Just(130)
        ],
        1usize..=4,
        0usize..=9,
        any::<bool>(),
        prop_oneof![Just(None), (0.0f64..0.2).prop_map(Some)],
        any::<bool>(),
        any::<bool>(),
        prop_oneof![Just((0usize, 0.0f64)), (0usize..4096, 0.0f64..0.01)],
    )
        .prop_map(
            |(
                seed,
                nodes,
                layers,
                experts,
                num_experts_per_tok,
                k,
                residency,
                lambda,
                root_routed,
                tie_heavy,
                context,
            )| {
                Case {
                    seed,
                    nodes,
                    layers,
                    experts,
                    num_experts_per_tok: num_experts_per_tok.min(experts),
                    k,
                    residency,
                    lambda,
                    root_routed,
                    tie_heavy,
                    context,
                }
            },
        )
}

fn routes(c: &Case, rng: &mut Rng, like: Option<&Vec<Vec<u32>>>) -> Vec<Vec<u32>> {
    (0..c.layers)
        .map(|l| {
            // Tie-heavy cases copy the parent's routes often, so many subsets share demand.
            if let Some(parent) = like.filter(|_| c.tie_heavy && rng.unit() < 0.5) {
                return parent[l].clone();
            }
            let mut ids: Vec<u32> = Vec::new();
            while ids.len() < c.num_experts_per_tok {
                let e = rng.below(c.experts) as u32;
                if !ids.contains(&e) {
                    ids.push(e);
                }
            }
            ids
        })
        .collect()
}

fn build(c: &Case) -> (PoolSpec, CostModel, Objective, Vec<Vec<u32>>) {
    let mut rng = Rng::new(c.seed);
    let root = routes(c, &mut rng, None);
    let mut nodes: Vec<NodeSpec> = Vec::new();
    for i in 0..c.nodes {
        let parent = if i == 0 || rng.unit() < 0.3 {
            None
        } else {
            Some(rng.below(i))
        };
        let parent_prob = parent.map_or(1.0, |p| nodes[p].prob);
        let prob = if c.tie_heavy {
            [0.0, 0.25, 0.5, 1.0][rng.below(4)] * parent_prob
        } else if rng.unit() < 0.1 {
            rng.unit() // occasionally more probable than its parent
        } else {
            parent_prob * rng.unit()
        };
        let like = parent.map(|p| &nodes[p].routes).unwrap_or(&root).clone();
        let r = routes(c, &mut rng, Some(&like));
        nodes.push(NodeSpec {
            parent,
            prob,
            routes: r,
        });
    }
    let intercepts: Vec<f64> = (0..=c.k.max(1))
        .map(|n| {
            if c.tie_heavy {
                10.0
            } else {
                5.0 + n as f64 * rng.unit() * 2.0 + rng.unit()
            }
        })
        .collect();
    let beta = if c.tie_heavy { 0.5 } else { rng.unit() * 0.5 };
    let cost = if c.residency {
        CostModel::residency(intercepts, beta * rng.unit(), beta * 3.0).unwrap()
    } else {
        CostModel::paper(intercepts, beta).unwrap()
    }
    .with_context_ms(c.context.1)
    .unwrap();
    let objective = match c.lambda {
        Some(l) => Objective::lambda(l).unwrap(),
        None => Objective::Ratio,
    };
    let slots = rng.below(c.experts + 1);
    let resident: Vec<Vec<u32>> = (0..c.layers)
        .map(|_| {
            (0..c.experts as u32)
                .filter(|_| rng.below(c.experts + 1) < slots)
                .collect()
        })
        .collect();
    let spec = PoolSpec {
        layers: c.layers,
        experts: c.experts,
        root_routes: c.root_routed.then_some(root),
        nodes,
        context: c.context.0,
    };
    (spec, cost, objective, resident)
}

fn check(c: &Case) -> Result<(), TestCaseError> {
    let (spec, cost, objective, resident) = build(c);
    let pool = spec.build().unwrap();
    let set = ResidentSet::new(c.layers, c.experts, &resident).unwrap();
    let want = naive::best(&spec, &cost, objective, Some(&resident), c.k);
    for portable in [false, true] {
        let mut sel = Selector::new(cost.clone(), c.k, objective).unwrap();
        if portable {
            sel = sel.with_portable_kernels();
        }
        let got = sel.select(&pool, Some(&set)).unwrap();
        prop_assert_eq!(&got.nodes, &want.nodes, "case {:?}", c);
        prop_assert_eq!(got.objective.to_bits(), want.objective.to_bits());
        prop_assert_eq!(got.demand, want.demand);
        prop_assert_eq!(got.hits, want.hits);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1500, ..ProptestConfig::default() })]

    #[test]
    fn exact_search_equals_the_brute_force_oracle(c in case()) {
        check(&c)?;
    }
}

#[test]
fn exact_search_equals_the_oracle_on_paper_shaped_pools_cut_to_fourteen_nodes() {
    use crate::synth::{pool, Shape};
    for seed in 0..40 {
        let mut spec = pool(
            &Shape {
                keep: Some(14),
                ..Shape::paper()
            },
            seed,
        );
        spec.layers = 6;
        spec.root_routes.as_mut().unwrap().truncate(6);
        for n in &mut spec.nodes {
            n.routes.truncate(6);
        }
        let cost =
            CostModel::paper(vec![20.0, 21.0, 21.5, 22.5, 23.0, 24.0, 25.0, 26.0], 0.25).unwrap();
        let want = naive::best(&spec, &cost, Objective::Ratio, None, 7);
        let got = Selector::new(cost, 7, Objective::Ratio)
            .unwrap()
            .select(&spec.build().unwrap(), None)
            .unwrap();
        assert_eq!(got.nodes, want.nodes, "seed {seed}");
        assert_eq!(got.objective.to_bits(), want.objective.to_bits());
    }
}
