//! The seed table: tiny hand-checked pools with the subtree each objective must pick (the
//! arithmetic is in each seed's comment), expanded by `generate` into variants that must not
//! change the pick: expert relabelling, extra layers no token routes in, and an appended
//! zero-probability leaf. Every variant is checked against both the search and the oracle.

use super::naive;
use crate::cost::{CostModel, ResidentSet};
use crate::objective::Objective;
use crate::pool::{NodeSpec, PoolSpec};
use crate::search::Selector;

const E: usize = 16;

struct Seed {
    name: &'static str,
    /// Root routes (one layer) and nodes as (parent, prob, experts) in one layer.
    root: &'static [u32],
    nodes: &'static [(i64, f64, &'static [u32])],
    intercepts: &'static [f64],
    /// β of the paper form (used when `residency` is `None`).
    beta: f64,
    /// `None` = the paper form with `beta`; `Some((hit, miss))` = the residency form.
    residency: Option<(f64, f64)>,
    resident: &'static [u32],
    objective: Objective,
    /// Node budget, capped by the intercepts given.
    k: usize,
    want: &'static [usize],
}

const SEEDS: &[Seed] = &[
    // none: 1/11 = .091; {0}: 1.5/11 = .136 (expert 0 is already the root's).
    Seed {
        name: "single cheap node",
        root: &[0],
        nodes: &[(-1, 0.5, &[0])],
        intercepts: &[10.0, 10.0],
        beta: 1.0,
        residency: None,
        resident: &[],
        objective: Objective::Ratio,
        k: 7,
        want: &[0],
    },
    // none: 1/11 = .091; {0}: 1.1/14 = .079.
    Seed {
        name: "single costly node",
        root: &[0],
        nodes: &[(-1, 0.1, &[1, 2, 3])],
        intercepts: &[10.0, 10.0],
        beta: 1.0,
        residency: None,
        resident: &[],
        objective: Objective::Ratio,
        k: 7,
        want: &[],
    },
    // sizes 0..3: 1/11, 1.9/12, 2.7/13, 3.4/14 = .243 (best).
    Seed {
        name: "chain",
        root: &[0],
        nodes: &[(-1, 0.9, &[1]), (0, 0.8, &[2]), (1, 0.7, &[3])],
        intercepts: &[10.0; 4],
        beta: 1.0,
        residency: None,
        resident: &[],
        objective: Objective::Ratio,
        k: 7,
        want: &[0, 1, 2],
    },
    // the same chain under K = 2 stops at 2.7/13.
    Seed {
        name: "chain under a budget",
        root: &[0],
        nodes: &[(-1, 0.9, &[1]), (0, 0.8, &[2]), (1, 0.7, &[3])],
        intercepts: &[10.0; 4],
        beta: 1.0,
        residency: None,
        resident: &[],
        objective: Objective::Ratio,
        k: 2,
        want: &[0, 1],
    },
    // {0}: 1.5/12 = .125; {0,1}: 1.9/13 = .146; {0,1,2}: 1.95/14 = .139.
    Seed {
        name: "star",
        root: &[0],
        nodes: &[(-1, 0.5, &[1]), (-1, 0.4, &[2]), (-1, 0.05, &[3])],
        intercepts: &[10.0; 4],
        beta: 1.0,
        residency: None,
        resident: &[],
        objective: Objective::Ratio,
        k: 7,
        want: &[0, 1],
    },
    // identical routes: every extra node is free after the first; all three: 1.9/12.
    Seed {
        name: "identical routes",
        root: &[0],
        nodes: &[(-1, 0.3, &[5]), (-1, 0.3, &[5]), (-1, 0.3, &[5])],
        intercepts: &[10.0; 4],
        beta: 1.0,
        residency: None,
        resident: &[],
        objective: Objective::Ratio,
        k: 7,
        want: &[0, 1, 2],
    },
    // everything resident and hits free: time is a[n] = 10, so take all: 1.3/10.
    Seed {
        name: "everything resident",
        root: &[0],
        nodes: &[(-1, 0.2, &[1]), (0, 0.1, &[2])],
        intercepts: &[10.0; 3],
        beta: 0.0,
        residency: Some((0.0, 5.0)),
        resident: &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15],
        objective: Objective::Ratio,
        k: 7,
        want: &[0, 1],
    },
    // nothing resident: none 1/15 = .067 beats {0} 1.2/20 = .06.
    Seed {
        name: "nothing resident",
        root: &[0],
        nodes: &[(-1, 0.2, &[1]), (0, 0.1, &[2])],
        intercepts: &[10.0; 3],
        beta: 0.0,
        residency: Some((0.0, 5.0)),
        resident: &[],
        objective: Objective::Ratio,
        k: 7,
        want: &[],
    },
    Seed {
        name: "budget zero",
        root: &[0],
        nodes: &[(-1, 0.9, &[0]), (0, 0.9, &[0])],
        intercepts: &[10.0],
        beta: 1.0,
        residency: None,
        resident: &[],
        objective: Objective::Ratio,
        k: 0,
        want: &[],
    },
    // {0} and {1} tie at 1.5/12; the smaller index wins. {0,1}: 2/22.
    Seed {
        name: "tie broken by index",
        root: &[0],
        nodes: &[(-1, 0.5, &[1]), (-1, 0.5, &[1])],
        intercepts: &[10.0, 10.0, 20.0],
        beta: 1.0,
        residency: None,
        resident: &[],
        objective: Objective::Ratio,
        k: 7,
        want: &[0],
    },
    // a zero-probability node on the root's experts ties with none (1/11); fewer nodes win.
    Seed {
        name: "tie broken by size",
        root: &[0],
        nodes: &[(-1, 0.0, &[0])],
        intercepts: &[10.0, 10.0],
        beta: 1.0,
        residency: None,
        resident: &[],
        objective: Objective::Ratio,
        k: 7,
        want: &[],
    },
    // lambda 0.5: none 1 - 5.5 = -4.5; {0} 1.9 - 6 = -4.1; {0,1} 2.0 - 6.5 = -4.5.
    Seed {
        name: "lambda rule",
        root: &[0],
        nodes: &[(-1, 0.9, &[1]), (0, 0.1, &[2])],
        intercepts: &[10.0; 3],
        beta: 1.0,
        residency: None,
        resident: &[],
        objective: Objective::Lambda { lambda: 0.5 },
        k: 7,
        want: &[0],
    },
    // intercepts that are not monotone: {0}: 1.3/30; {0,1}: 1.6/10 (the bound must look past m=1).
    Seed {
        name: "non-monotone intercepts",
        root: &[0],
        nodes: &[(-1, 0.3, &[0]), (-1, 0.3, &[0])],
        intercepts: &[10.0, 30.0, 10.0],
        beta: 1.0,
        residency: None,
        resident: &[],
        objective: Objective::Ratio,
        k: 7,
        want: &[0, 1],
    },
    // a child more probable than its parent: {0,1} 2.0/11 beats {0} 1.1/11.
    Seed {
        name: "child outranks parent",
        root: &[0],
        nodes: &[(-1, 0.1, &[0]), (0, 0.9, &[0])],
        intercepts: &[10.0; 3],
        beta: 1.0,
        residency: None,
        resident: &[],
        objective: Objective::Ratio,
        k: 7,
        want: &[0, 1],
    },
    // topk takes the K most probable regardless of cost.
    Seed {
        name: "topk baseline",
        root: &[0],
        nodes: &[(-1, 0.5, &[1]), (-1, 0.4, &[2]), (0, 0.45, &[3])],
        intercepts: &[10.0; 3],
        beta: 100.0,
        residency: None,
        resident: &[],
        objective: Objective::TopK,
        k: 2,
        want: &[0, 2],
    },
];

/// A pool, cost and resident set ready to run.
struct Variant {
    label: String,
    spec: PoolSpec,
    cost: CostModel,
    resident: Vec<Vec<u32>>,
}

impl Seed {
    fn base(&self) -> Variant {
        let nodes = self
            .nodes
            .iter()
            .map(|&(parent, prob, experts)| NodeSpec {
                parent: usize::try_from(parent).ok(),
                prob,
                routes: vec![experts.to_vec()],
            })
            .collect();
        let spec = PoolSpec {
            layers: 1,
            experts: E,
            root_routes: Some(vec![self.root.to_vec()]),
            nodes,
        };
        let cost = match self.residency {
            None => CostModel::paper(self.intercepts.to_vec(), self.beta),
            Some((h, m)) => CostModel::residency(self.intercepts.to_vec(), h, m),
        }
        .unwrap();
        Variant {
            label: "base".into(),
            spec,
            cost,
            resident: vec![self.resident.to_vec()],
        }
    }

    /// The base and every invariance-preserving variant.
    fn generate(&self) -> Vec<Variant> {
        let base = self.base();
        let mut out = Vec::new();
        // Relabel experts by a bijection of 0..16.
        let relabel = |ids: &Vec<u32>| {
            ids.iter()
                .map(|e| (e * 5 + 3) % E as u32)
                .collect::<Vec<_>>()
        };
        let mut v = clone(&base, "relabelled experts");
        map_routes(&mut v, relabel);
        v.resident = v.resident.iter().map(relabel).collect();
        out.push(v);
        // Extra layers in which no token routes anywhere.
        for (label, front) in [("empty layers after", false), ("empty layers before", true)] {
            let mut v = clone(&base, label);
            v.spec.layers += 2;
            let pad = |r: &mut Vec<Vec<u32>>| {
                for _ in 0..2 {
                    if front {
                        r.insert(0, vec![])
                    } else {
                        r.push(vec![])
                    }
                }
            };
            pad(v.spec.root_routes.as_mut().unwrap());
            v.spec.nodes.iter_mut().for_each(|n| pad(&mut n.routes));
            pad(&mut v.resident);
            out.push(v);
        }
        // A dominated leaf: zero probability, fresh experts, appended last.
        if !matches!(self.objective, Objective::TopK | Objective::All) {
            let mut v = clone(&base, "dominated leaf");
            let parent = v.spec.nodes.len().checked_sub(1);
            v.spec.nodes.push(NodeSpec {
                parent,
                prob: 0.0,
                routes: vec![vec![14, 15]],
            });
            out.push(v);
        }
        out.push(base);
        out
    }
}

fn clone(v: &Variant, label: &str) -> Variant {
    Variant {
        label: label.into(),
        spec: v.spec.clone(),
        cost: v.cost.clone(),
        resident: v.resident.clone(),
    }
}

fn map_routes(v: &mut Variant, f: impl Fn(&Vec<u32>) -> Vec<u32>) {
    if let Some(r) = v.spec.root_routes.as_mut() {
        *r = r.iter().map(&f).collect();
    }
    for n in &mut v.spec.nodes {
        n.routes = n.routes.iter().map(&f).collect();
    }
}

#[test]
fn every_seed_and_variant_picks_the_hand_checked_subtree() {
    for seed in SEEDS {
        for v in seed.generate() {
            let pool = v.spec.build().unwrap();
            let resident = ResidentSet::new(v.spec.layers, E, &v.resident).unwrap();
            let k = seed.k.min(seed.intercepts.len() - 1);
            let mut sel = Selector::new(v.cost.clone(), k, seed.objective).unwrap();
            let got = sel.select(&pool, Some(&resident)).unwrap();
            assert_eq!(got.nodes, seed.want, "{} / {}", seed.name, v.label);
            if seed.objective.is_searched() {
                let want = naive::best(&v.spec, &v.cost, seed.objective, Some(&v.resident), k);
                assert_eq!(want.nodes, seed.want, "oracle: {} / {}", seed.name, v.label);
                assert_eq!(got.objective.to_bits(), want.objective.to_bits());
            }
        }
    }
}
