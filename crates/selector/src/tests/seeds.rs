//! The seed table (`seeds.json`): tiny hand-checked pools with the subtree each objective must pick (the
//! arithmetic is in each seed's comment), expanded by `generate` into variants that must not
//! change the pick: expert relabelling, extra layers no token routes in, and an appended
//! zero-probability leaf. Every variant is checked against both the search and the oracle.

use super::naive;
use crate::cost::{CostModel, ResidentSet};
use crate::objective::Objective;
use crate::pool::{NodeSpec, PoolSpec};
use crate::search::Selector;

const E: usize = 16;

/// One hand-checked pool from `seeds.json`: `root` routes and `nodes` as (parent, prob,
/// experts) in one layer; `beta` is the paper form's β (used when `residency` is null, else
/// `[hit, miss]` prices the residency form); `k` is the node budget, capped by the intercepts
/// given; `want` is the subtree every variant must pick; `why` holds the arithmetic.
struct Seed {
    name: String,
    root: Vec<u32>,
    nodes: Vec<(i64, f64, Vec<u32>)>,
    intercepts: Vec<f64>,
    beta: f64,
    residency: Option<(f64, f64)>,
    resident: Vec<u32>,
    objective: Objective,
    k: usize,
    want: Vec<usize>,
}

fn seeds() -> Vec<Seed> {
    let table: serde_json::Value = serde_json::from_str(include_str!("seeds.json")).unwrap();
    table
        .as_array()
        .unwrap()
        .iter()
        .map(Seed::from_json)
        .collect()
}

fn numbers<T>(
    v: &serde_json::Value,
    field: &str,
    from: impl Fn(&serde_json::Value) -> T,
) -> Vec<T> {
    v[field].as_array().unwrap().iter().map(from).collect()
}

fn id(v: &serde_json::Value) -> u32 {
    u32::try_from(v.as_u64().unwrap()).unwrap()
}

impl Seed {
    fn from_json(v: &serde_json::Value) -> Seed {
        let node = |n: &serde_json::Value| {
            let experts = n[2].as_array().unwrap().iter().map(id).collect();
            (n[0].as_i64().unwrap(), n[1].as_f64().unwrap(), experts)
        };
        let residency = v["residency"]
            .as_array()
            .map(|hm| (hm[0].as_f64().unwrap(), hm[1].as_f64().unwrap()));
        Seed {
            name: v["name"].as_str().unwrap().to_owned(),
            root: numbers(v, "root", id),
            nodes: numbers(v, "nodes", node),
            intercepts: numbers(v, "intercepts", |x| x.as_f64().unwrap()),
            beta: v["beta"].as_f64().unwrap(),
            residency,
            resident: numbers(v, "resident", id),
            objective: Objective::parse(v["objective"].as_str().unwrap()).unwrap(),
            k: usize::try_from(v["k"].as_u64().unwrap()).unwrap(),
            want: numbers(v, "want", |x| usize::try_from(x.as_u64().unwrap()).unwrap()),
        }
    }
}

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
            .map(|(parent, prob, experts)| NodeSpec {
                parent: usize::try_from(*parent).ok(),
                prob: *prob,
                routes: vec![experts.clone()],
            })
            .collect();
        let spec = PoolSpec {
            layers: 1,
            experts: E,
            root_routes: Some(vec![self.root.to_vec()]),
            nodes,
            context: 0,
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
    let seeds = seeds();
    assert!(seeds.len() >= 15, "the seed table lost entries");
    for seed in &seeds {
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
