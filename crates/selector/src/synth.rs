//! Seeded synthetic pools shaped like EAGLE-3 drafts over a Qwen3-MoE-sized target, for benches,
//! property tests and the shipped example. Not a model of any particular drafter: it only
//! reproduces the structure the selector sees (top-b expansion of the best nodes per level,
//! path probabilities that shrink along a path, children that keep part of their parent's
//! experts). Real pools come from the engine.

use crate::pool::{NodeSpec, PoolSpec};

/// SplitMix64: a tiny, well-mixed, seedable generator (no dependency needed).
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        ((self.next_u64() as u128 * n as u128) >> 64) as usize
    }
}

/// The shape of a synthetic draft pool.
#[derive(Debug, Clone, PartialEq)]
pub struct Shape {
    /// MoE layers.
    pub layers: usize,
    /// Experts per layer.
    pub experts: usize,
    /// Experts each token routes to per layer.
    pub num_experts_per_tok: usize,
    /// Children drafted under each expanded node.
    pub branching: usize,
    /// Nodes of a level that are expanded into the next one (by path probability).
    pub expand: usize,
    /// Drafted levels.
    pub levels: usize,
    /// Keep only this many most probable nodes at the end (EAGLE's final re-ranking).
    pub keep: Option<usize>,
    /// Probability that a child keeps each of its parent's experts in a layer.
    pub share: f64,
}

impl Shape {
    /// The paper's pool: top-2 expansion over 5 levels (2 + 4·4 = 18 nodes), 48 layers × 128
    /// experts, top-8 routes, children keeping about half of their parent's experts.
    pub fn paper() -> Shape {
        Shape {
            layers: 48,
            experts: 128,
            num_experts_per_tok: 8,
            branching: 2,
            expand: 2,
            levels: 5,
            keep: None,
            share: 0.5,
        }
    }

    /// An EAGLE-2-style wide pool re-ranked down to `nodes` (top-4 expansion over 6 levels,
    /// 84 drafted, the `nodes` most probable kept), on the paper's 48 × 128 top-8 target.
    pub fn wide(nodes: usize) -> Shape {
        Shape {
            branching: 4,
            expand: 4,
            levels: 6,
            keep: Some(nodes),
            ..Shape::paper()
        }
    }
}

/// Intercepts `a[0..=k]` (ms) shaped like the paper's setting: `a[n] = 130 + 2n`, so that with
/// β = 0.211 ms and 48 × 8 root experts an autoregressive step takes about 211 ms, the paper's
/// 4.67 tok/s on an A100 with 48 slots per layer. Used by the synthetic pools and the benches.
pub fn paper_intercepts(k: usize) -> Vec<f64> {
    (0..=k).map(|n| 130.0 + 2.0 * n as f64).collect()
}

/// A random pool of the given shape. Deterministic in `(shape, seed)`.
pub fn pool(shape: &Shape, seed: u64) -> PoolSpec {
    let mut rng = Rng::new(seed);
    let root = random_routes(shape, &mut rng);
    let mut nodes: Vec<NodeSpec> = Vec::new();
    let mut level: Vec<Option<usize>> = vec![None];
    for _ in 0..shape.levels {
        let mut next = Vec::new();
        for &parent in &level {
            let (parent_p, parent_routes) = match parent {
                None => (1.0, &root),
                Some(i) => (nodes[i].prob, &nodes[i].routes),
            };
            let locals = child_probs(shape.branching, &mut rng);
            let children: Vec<NodeSpec> = locals
                .into_iter()
                .map(|local| NodeSpec {
                    parent,
                    prob: parent_p * local,
                    routes: inherit_routes(shape, parent_routes, &mut rng),
                })
                .collect();
            for child in children {
                next.push(nodes.len());
                nodes.push(child);
            }
        }
        next.sort_by(|&a, &b| nodes[b].prob.total_cmp(&nodes[a].prob).then(a.cmp(&b)));
        level = next.into_iter().take(shape.expand).map(Some).collect();
    }
    if let Some(keep) = shape.keep {
        nodes = keep_most_probable(nodes, keep);
    }
    PoolSpec {
        layers: shape.layers,
        experts: shape.experts,
        root_routes: Some(root),
        nodes,
        context: 0,
    }
}

/// A random resident set of `slots` experts per layer (all experts when `slots ≥ experts`).
pub fn resident(shape: &Shape, slots: usize, seed: u64) -> Vec<Vec<u32>> {
    let mut rng = Rng::new(seed ^ 0x5eed_5107);
    (0..shape.layers)
        .map(|_| sample_distinct(shape.experts, slots, &[], &mut rng))
        .collect()
}

/// Local draft probabilities of `b` children: a confident first choice, the rest sharing what
/// is left. They sum to at most 1.
fn child_probs(b: usize, rng: &mut Rng) -> Vec<f64> {
    let mut left = 1.0;
    (0..b)
        .map(|i| {
            let frac = if i == 0 {
                0.35 + 0.6 * rng.unit()
            } else {
                0.6 * rng.unit()
            };
            let p = left * frac;
            left -= p;
            p
        })
        .collect()
}

fn random_routes(shape: &Shape, rng: &mut Rng) -> Vec<Vec<u32>> {
    (0..shape.layers)
        .map(|_| sample_distinct(shape.experts, shape.num_experts_per_tok, &[], rng))
        .collect()
}

/// Per layer: keep each parent expert with probability `share`, fill up to top-k at random.
fn inherit_routes(shape: &Shape, parent: &[Vec<u32>], rng: &mut Rng) -> Vec<Vec<u32>> {
    parent
        .iter()
        .map(|experts| {
            let kept: Vec<u32> = experts
                .iter()
                .copied()
                .filter(|_| rng.unit() < shape.share)
                .collect();
            let fresh = sample_distinct(
                shape.experts,
                shape.num_experts_per_tok - kept.len(),
                experts,
                rng,
            );
            let mut all = [kept, fresh].concat();
            all.sort_unstable();
            all
        })
        .collect()
}

/// `count` distinct ids from `0..n`, avoiding `exclude`, sorted.
fn sample_distinct(n: usize, count: usize, exclude: &[u32], rng: &mut Rng) -> Vec<u32> {
    let mut pool: Vec<u32> = (0..n as u32).filter(|e| !exclude.contains(e)).collect();
    let count = count.min(pool.len());
    for i in 0..count {
        let j = i + rng.below(pool.len() - i);
        pool.swap(i, j);
    }
    let mut out = pool[..count].to_vec();
    out.sort_unstable();
    out
}

/// The `keep` most probable nodes (ties by index), renumbered in their original order.
/// Path probabilities never grow along a path, so the result is ancestor-closed.
fn keep_most_probable(nodes: Vec<NodeSpec>, keep: usize) -> Vec<NodeSpec> {
    let mut order: Vec<usize> = (0..nodes.len()).collect();
    order.sort_by(|&a, &b| nodes[b].prob.total_cmp(&nodes[a].prob).then(a.cmp(&b)));
    let mut kept = vec![false; nodes.len()];
    for &i in order.iter().take(keep) {
        kept[i] = true;
    }
    let mut new_index = vec![usize::MAX; nodes.len()];
    let mut out = Vec::new();
    for (i, node) in nodes.into_iter().enumerate() {
        if kept[i] {
            new_index[i] = out.len();
            let parent = node.parent.map(|p| new_index[p]);
            debug_assert!(
                parent.is_none_or(|p| p != usize::MAX),
                "kept set is ancestor-closed"
            );
            out.push(NodeSpec { parent, ..node });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_paper_shape_has_eighteen_nodes_over_five_levels() {
        let spec = pool(&Shape::paper(), 1);
        assert_eq!(spec.nodes.len(), 18);
        let pool = spec.build().unwrap();
        assert_eq!(pool.max_depth(), 5);
        assert!((0..pool.len()).all(|i| pool.routes(i).iter().all(|l| l.len() == 8)));
    }

    #[test]
    fn children_keep_about_half_of_their_parents_experts() {
        let spec = pool(&Shape::paper(), 3);
        let (mut shared, mut total) = (0, 0);
        for node in spec.nodes.iter().filter(|n| n.parent.is_some()) {
            let parent = &spec.nodes[node.parent.unwrap()];
            for (a, b) in node.routes.iter().zip(&parent.routes) {
                shared += a.iter().filter(|e| b.contains(e)).count();
                total += a.len();
            }
        }
        let frac = shared as f64 / total as f64;
        assert!((0.4..0.6).contains(&frac), "{frac}");
    }

    #[test]
    fn wide_pools_are_cut_to_the_requested_size_and_stay_valid() {
        for keep in [32, 60] {
            let spec = pool(&Shape::wide(keep), 5);
            assert_eq!(spec.nodes.len(), keep);
            assert!(spec.build().is_ok());
        }
    }

    #[test]
    fn generation_is_deterministic_in_the_seed() {
        assert_eq!(pool(&Shape::paper(), 11), pool(&Shape::paper(), 11));
        assert_ne!(pool(&Shape::paper(), 11), pool(&Shape::paper(), 12));
    }
}
