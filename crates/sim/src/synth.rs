//! Seeded synthetic traces at paper scale (Qwen3-30B-A3B: 48 MoE layers × 128 experts, top-8),
//! for replaying SpecFit where no such model can run. Two knobs shape them:
//!
//! * **acceptance** — the drafter's confidence: the first child of every expanded node gets local
//!   probability `confidence` (± `spread`), later siblings share part of the rest. The drafter is
//!   calibrated: at a node whose path agrees with the target, the target's next token is child
//!   `c` with probability equal to `c`'s local probability (at most one child agrees).
//! * **routing locality** — consecutive tokens keep each expert of a layer with probability
//!   `locality`; a drafted child keeps each of its parent's experts with probability `share`.
//!
//! Consistency: an agreeing node *is* the next committed token, so its routes are the routes the
//! root has at the next position (the target is batch-invariant). This module only generates
//! data; replaying it is `simulate`'s job.

use specfit_selector::synth::Rng;
use specfit_trace::{TraceHeader, TraceNode, TraceStep};

/// The most positions a synthetic trace may have (a paper-scale position holds a few KB of routes).
pub const MAX_POSITIONS: usize = 20_000;

/// Parameters of a synthetic trace.
#[derive(Debug, Clone, PartialEq)]
pub struct SynthParams {
    pub layers: usize,
    pub experts: usize,
    pub num_experts_per_tok: usize,
    pub positions: usize,
    /// Children per expanded node and nodes expanded per level.
    pub branching: usize,
    pub levels: usize,
    /// Mean local probability of the first child.
    pub confidence: f64,
    /// Half-width of the uniform jitter on `confidence`.
    pub spread: f64,
    /// Probability a token keeps each expert of the previous token (per layer).
    pub locality: f64,
    /// Probability a drafted child keeps each expert of its parent.
    pub share: f64,
    pub seed: u64,
}

impl SynthParams {
    /// Qwen3-30B-A3B shape, the paper's 18-node pools, the routing overlap fitted to the paper
    /// ([`PAPER_LOCALITY`], [`PAPER_SHARE`]) and a given confidence.
    pub fn paper(confidence: f64, seed: u64) -> SynthParams {
        SynthParams {
            layers: 48,
            experts: 128,
            num_experts_per_tok: 8,
            positions: 400,
            branching: 2,
            levels: 5,
            confidence,
            spread: 0.25,
            locality: PAPER_LOCALITY,
            share: PAPER_SHARE,
            seed,
        }
    }
}

/// Routing locality (probability a token keeps each expert of the previous token) that, with
/// [`PAPER_SHARE`] and the A100 preset, best matches the paper's throughputs at 48 slots: a grid
/// over locality × share ∈ {0.5, 0.6, 0.7, 0.8} × {0.6, 0.7, 0.8, 0.9} (BENCHMARKS.md) gives
/// EAGLE-3 at 1.39× / 2.20× plain decoding on the summarization / GSM8K profiles (paper 1.46× /
/// 2.14×) and SpecFit +14.0% / +9.4% over EAGLE-3 (paper +21.6% / +7.0%).
pub const PAPER_LOCALITY: f64 = 0.8;
/// Probability a drafted child keeps each expert of its parent (see [`PAPER_LOCALITY`]).
pub const PAPER_SHARE: f64 = 0.8;

fn sample(rng: &mut Rng, n: usize, k: usize, avoid: &[u32]) -> Vec<u32> {
    let mut out: Vec<u32> = Vec::with_capacity(k);
    while out.len() < k {
        let e = rng.below(n) as u32;
        if !out.contains(&e) && !avoid.contains(&e) {
            out.push(e);
        }
    }
    out
}

/// Routes that keep each expert of `from` with probability `keep`, refilled at random.
fn drift(rng: &mut Rng, p: &SynthParams, from: &[Vec<u32>], keep: f64) -> Vec<Vec<u32>> {
    from.iter()
        .map(|layer| {
            let mut kept: Vec<u32> = layer
                .iter()
                .copied()
                .filter(|_| rng.unit() < keep)
                .collect();
            let fresh = sample(rng, p.experts, p.num_experts_per_tok - kept.len(), layer);
            kept.extend(fresh);
            kept
        })
        .collect()
}

/// Local probabilities of `b` children: a confident first child, the rest sharing what is left.
fn locals(rng: &mut Rng, p: &SynthParams) -> Vec<f64> {
    let first = (p.confidence + (rng.unit() * 2.0 - 1.0) * p.spread).clamp(0.01, 0.99);
    let mut left = 1.0 - first;
    let mut out = vec![first];
    for _ in 1..p.branching {
        let q = left * 0.5 * rng.unit();
        left -= q;
        out.push(q);
    }
    out
}

/// A trace of `positions` steps.
pub fn trace(p: &SynthParams) -> (TraceHeader, Vec<TraceStep>) {
    let mut rng = Rng::new(p.seed);
    // The routes of the committed tokens, position by position (with locality).
    let mut roots: Vec<Vec<Vec<u32>>> = Vec::with_capacity(p.positions + p.levels + 1);
    roots.push(
        (0..p.layers)
            .map(|_| sample(&mut rng, p.experts, p.num_experts_per_tok, &[]))
            .collect(),
    );
    while roots.len() < p.positions + p.levels + 1 {
        let next = drift(&mut rng, p, roots.last().expect("non-empty"), p.locality);
        roots.push(next);
    }
    // Each position draws from its own stream, so a change at one position (another confidence)
    // does not reshuffle every later one.
    let steps = (0..p.positions)
        .map(|pos| {
            step(
                &mut Rng::new(p.seed ^ (pos as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15)),
                p,
                &roots,
                pos,
            )
        })
        .collect();
    let mut header = TraceHeader::new(p.layers, p.experts, p.num_experts_per_tok, 0);
    header
        .meta
        .insert("synthetic".into(), format!("{p:?}").into());
    (header, steps)
}

/// The pool at one position: top-b expansion of the most probable nodes per level.
fn step(rng: &mut Rng, p: &SynthParams, roots: &[Vec<Vec<u32>>], pos: usize) -> TraceStep {
    let mut nodes: Vec<TraceNode> = Vec::new();
    // Expand `parent` (None = root): children with local probabilities; at most one agrees,
    // and only when the parent's path agrees.
    let expand = |nodes: &mut Vec<TraceNode>, parent: Option<usize>, rng: &mut Rng| -> Vec<usize> {
        let (depth, path_p, agrees, routes) = match parent {
            None => (0, 1.0, true, roots[pos].clone()),
            Some(i) => (
                nodes[i].depth,
                nodes[i].prob,
                nodes[i].agrees,
                nodes[i].routes.clone(),
            ),
        };
        let local = locals(rng, p);
        let u = rng.unit();
        let mut acc = 0.0;
        let mut made = Vec::new();
        for (c, &q) in local.iter().enumerate() {
            let hit = agrees && u >= acc && u < acc + q;
            acc += q;
            let child_routes = if hit {
                roots[pos + depth + 1].clone()
            } else {
                drift(rng, p, &routes, p.share)
            };
            made.push(nodes.len());
            nodes.push(TraceNode {
                parent: parent.map_or(-1, |i| i as i64),
                token: c as u32,
                prob: path_p * q,
                depth: depth + 1,
                routes: child_routes,
                agrees: hit,
            });
        }
        made
    };
    let mut level = expand(&mut nodes, None, rng);
    for _ in 1..p.levels {
        level.sort_by(|&a, &b| nodes[b].prob.total_cmp(&nodes[a].prob).then(a.cmp(&b)));
        level.truncate(p.branching);
        level.sort_unstable();
        let mut next = Vec::new();
        for &i in &level {
            next.extend(expand(&mut nodes, Some(i), rng));
        }
        level = next;
    }
    TraceStep {
        position: pos,
        root: 0,
        root_routes: roots[pos].clone(),
        nodes,
        next: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agreeing_nodes_carry_the_next_roots_routes_and_pools_have_eighteen_nodes() {
        let p = SynthParams {
            positions: 50,
            ..SynthParams::paper(0.7, 3)
        };
        let (h, steps) = trace(&p);
        assert_eq!(
            (h.moe_layers, h.experts, h.num_experts_per_tok),
            (48, 128, 8)
        );
        for (i, s) in steps.iter().enumerate().take(40) {
            assert_eq!(s.nodes.len(), 18);
            for n in s.nodes.iter().filter(|n| n.agrees) {
                assert_eq!(n.routes, steps[i + n.depth].root_routes);
            }
            // At most one agreeing child per node.
            for parent in -1..s.nodes.len() as i64 {
                assert!(
                    s.nodes
                        .iter()
                        .filter(|n| n.parent == parent && n.agrees)
                        .count()
                        <= 1
                );
            }
        }
    }

    #[test]
    fn confidence_controls_acceptance() {
        let agree = |c: f64| {
            let (_, steps) = trace(&SynthParams {
                positions: 200,
                ..SynthParams::paper(c, 1)
            });
            steps
                .iter()
                .map(|s| s.nodes.iter().filter(|n| n.agrees).count())
                .sum::<usize>()
        };
        assert!(agree(0.9) > agree(0.5));
    }
}
