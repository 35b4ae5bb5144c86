//! The oracle: every subset of the pool's nodes (2^N), keep the ancestor-closed ones within the
//! budget, score each with plain `BTreeSet` unions per layer, and keep the best under the same
//! tie rule as the search (higher objective, then fewer nodes, then lexicographically smaller).
//! Deliberately shares nothing with the search but the public cost formula and reward rounding.

use std::collections::BTreeSet;

use crate::cost::CostModel;
use crate::objective::{reward_of, Objective};
use crate::pool::PoolSpec;

/// What the oracle picks.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct NaivePick {
    pub nodes: Vec<usize>,
    /// The comparison key (exact quantised reward).
    pub key: f64,
    /// The reported objective (plain `f64` reward in ascending node order).
    pub objective: f64,
    pub demand: u32,
    pub hits: u32,
}

/// Scores one node set: union per layer of the root's and the nodes' experts.
pub(crate) fn score(
    spec: &PoolSpec,
    cost: &CostModel,
    objective: Objective,
    resident: Option<&[Vec<u32>]>,
    nodes: &[usize],
) -> NaivePick {
    let mut demand = 0;
    let mut hits = 0;
    for layer in 0..spec.layers {
        let mut union: BTreeSet<u32> = BTreeSet::new();
        if let Some(root) = &spec.root_routes {
            union.extend(&root[layer]);
        }
        for &i in nodes {
            union.extend(&spec.nodes[i].routes[layer]);
        }
        demand += union.len() as u32;
        if let Some(r) = resident {
            hits += union.iter().filter(|e| r[layer].contains(e)).count() as u32;
        }
    }
    if !cost.is_residency() {
        hits = 0;
    }
    let exact = reward_of(nodes.iter().map(|&i| spec.nodes[i].prob));
    let mut sorted = nodes.to_vec();
    sorted.sort_unstable();
    let plain = sorted.iter().fold(1.0, |a, &i| a + spec.nodes[i].prob);
    let time = cost
        .at_context(spec.context)
        .time_ms(nodes.len(), hits, demand - hits);
    NaivePick {
        nodes: sorted,
        key: objective.score(exact, time),
        objective: objective.score(plain, time),
        demand,
        hits,
    }
}

/// The best ancestor-closed subset of at most `k` nodes. Panics above 20 nodes (2^N subsets).
pub(crate) fn best(
    spec: &PoolSpec,
    cost: &CostModel,
    objective: Objective,
    resident: Option<&[Vec<u32>]>,
    k: usize,
) -> NaivePick {
    let n = spec.nodes.len();
    assert!(n <= 20, "the oracle enumerates 2^N subsets");
    let mut best: Option<NaivePick> = None;
    for subset in 0u32..(1 << n) {
        let nodes: Vec<usize> = (0..n).filter(|i| subset >> i & 1 == 1).collect();
        let closed = nodes
            .iter()
            .all(|&i| spec.nodes[i].parent.is_none_or(|p| subset >> p & 1 == 1));
        if !closed || nodes.len() > k {
            continue;
        }
        let pick = score(spec, cost, objective, resident, &nodes);
        let better = match &best {
            None => true,
            Some(b) => {
                pick.key > b.key
                    || (pick.key == b.key
                        && (pick.nodes.len(), &pick.nodes) < (b.nodes.len(), &b.nodes))
            }
        };
        if better {
            best = Some(pick);
        }
    }
    best.expect("the empty subtree is always a candidate")
}
