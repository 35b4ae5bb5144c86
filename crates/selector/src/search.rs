//! Exact search for the verified subtree: every ancestor-closed set `S` of at most `K` draft
//! nodes is a candidate, and the one with the best objective (ties: fewer nodes, then the
//! lexicographically smallest sorted index list) is returned.
//!
//! Enumeration is the classic frontier scheme: from a subtree `S` with candidate list `F`
//! (nodes whose parent is in `S ∪ {root}`, not yet excluded), branch `j` adds `F[j]`, excludes
//! `F[..j]` for good and appends `F[j]`'s children, so every subtree is generated exactly once.
//! Each step updates the flat per-layer union incrementally: one `|m \ U|` popcount over
//! `⌈L·E/64⌉` words (96 for 48 × 128), nothing else proportional to the pool.
//!
//! Pruning: `F` is kept sorted by the largest path probability found in each candidate's
//! subtree (`submax`), so every node reachable in branch `j` or later has `P ≤ submax(F[j])`.
//! Adding `m` more nodes therefore gains at most `m · submax(F[j])` reward and takes at least
//! `a[|S|+m] + β·demand(S)` time, because unions only grow. If the best objective that bound
//! allows, over every `m ≤ K − |S|`, is below the incumbent, branch `j` and all later ones are
//! cut. The bound is computed with the same monotone floating-point operations as the real
//! objective, so it never cuts a subtree that could win.
//!
//! Worst case `O(#subtrees · L·E/64)`; on paper-shaped pools the bound visits a small fraction.
//! The fixed baselines (`topk`, `all`, `none`) are evaluated directly. This module does not
//! decide when to stop drafting (`stop`) and does not fit costs (`calibrate`).

use crate::bitset::{self, Kernels};
use crate::cost::{CostModel, ResidentSet};
use crate::error::Error;
use crate::objective::{plain_reward, quantize, reward, Objective};
use crate::pool::Pool;

/// Largest node budget `K` the exact search accepts.
pub const MAX_SELECT: usize = 64;

/// The most subtrees one exact search may score before it gives up with
/// [`Error::SearchTooLarge`] (about a second or two on one core): the bound prunes nearly all of
/// a drafted pool's subtrees (the paper's 18-node pools under K = 7 have at most ~50,000 in all),
/// but a large pool of tied nodes has no order to prune by.
pub const MAX_VISITS: u64 = 20_000_000;

/// The chosen subtree and what the cost model predicts for it.
#[derive(Debug, Clone, PartialEq)]
pub struct Selection {
    /// Selected draft nodes, ascending. Empty = verify the root alone (autoregressive step).
    pub nodes: Vec<usize>,
    /// Expected committed tokens, `1 + Σ P`.
    pub reward: f64,
    /// Predicted verify time in ms.
    pub time_ms: f64,
    /// `Σ_l |U_l|`: distinct (layer, expert) pairs the verify forward needs.
    pub demand: u32,
    /// Of `demand`, how many are resident (0 unless a resident set was given).
    pub hits: u32,
    /// Of `demand`, how many are not resident.
    pub misses: u32,
    /// The objective value (the ratio for baselines).
    pub objective: f64,
    /// How much work the search did.
    pub stats: SearchStats,
}

/// Search effort: subtrees scored and branches cut by the bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SearchStats {
    /// Non-empty subtrees whose objective was computed.
    pub visited: u64,
    /// Frontier branches cut by the bound (each one a whole family of subtrees).
    pub pruned: u64,
}

/// The incumbent of the search.
#[derive(Debug, Clone, Default)]
struct Best {
    objective: f64,
    nodes: Vec<u32>,
    hits: u32,
    misses: u32,
}

/// Reusable selector: validated cost and budget plus scratch buffers, so that a decode loop
/// selects without allocating.
#[derive(Clone)]
pub struct Selector {
    /// The cost model as given.
    cost: CostModel,
    /// The cost model at the context of the pool being selected on (`cost` with its context
    /// charge folded into the intercepts, [`CostModel::at_context`]).
    priced: CostModel,
    max_nodes: usize,
    objective: Objective,
    kernels: Kernels,
    // Per-call scratch, sized on demand.
    /// Quantised path probability per node.
    q: Vec<u64>,
    /// Largest quantised path probability in each node's subtree (itself included).
    submax: Vec<u64>,
    /// Children of node i: `child_list[child_start[i]..child_start[i + 1]]`, by `submax` desc.
    child_start: Vec<u32>,
    child_list: Vec<u32>,
    /// Unions of the current path: level `d` = root plus the first `d` picked nodes. (K+1) × W.
    unions: Vec<u64>,
    /// Candidate list per level.
    frontiers: Vec<Vec<u32>>,
    /// Nodes picked on the current path, by level.
    picked: Vec<u32>,
    /// Resident bitset (all zero when none given). W words.
    resident: Vec<u64>,
    best: Best,
    stats: SearchStats,
}

impl std::fmt::Debug for Selector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Selector")
            .field("cost", &self.cost)
            .field("max_nodes", &self.max_nodes)
            .field("objective", &self.objective)
            .field("kernels", &self.kernels.name)
            .finish()
    }
}

impl Selector {
    /// A selector verifying at most `max_nodes` draft nodes under `cost`, maximising `objective`.
    pub fn new(cost: CostModel, max_nodes: usize, objective: Objective) -> Result<Selector, Error> {
        if max_nodes > MAX_SELECT {
            return Err(Error::MaxNodesTooLarge {
                max_nodes,
                limit: MAX_SELECT,
            });
        }
        cost.check_covers(max_nodes)?;
        if let Objective::Lambda { lambda } = objective {
            Objective::lambda(lambda)?;
        }
        Ok(Selector {
            priced: cost.at_context(0),
            cost,
            max_nodes,
            objective,
            kernels: Kernels::detect(),
            q: Vec::new(),
            submax: Vec::new(),
            child_start: Vec::new(),
            child_list: Vec::new(),
            unions: Vec::new(),
            frontiers: Vec::new(),
            picked: Vec::new(),
            resident: Vec::new(),
            best: Best::default(),
            stats: SearchStats::default(),
        })
    }

    /// Uses the portable popcount kernels instead of the CPU-specific ones (for cross-checks).
    pub fn with_portable_kernels(mut self) -> Selector {
        self.kernels = Kernels::portable();
        self
    }

    /// Name of the popcount kernel set in use.
    pub fn kernel_name(&self) -> &'static str {
        self.kernels.name
    }

    /// The cost model (as given: its context charge applies at each pool's context).
    pub fn cost(&self) -> &CostModel {
        &self.cost
    }

    /// The node budget `K`.
    pub fn max_nodes(&self) -> usize {
        self.max_nodes
    }

    /// The objective.
    pub fn objective(&self) -> Objective {
        self.objective
    }

    /// Chooses the subtree of `pool` to verify, priced at the pool's context. `resident` only
    /// matters under the residency-aware cost; without it nothing is resident.
    pub fn select(
        &mut self,
        pool: &Pool,
        resident: Option<&ResidentSet>,
    ) -> Result<Selection, Error> {
        self.load(pool, resident)?;
        match self.objective {
            Objective::Ratio | Objective::Lambda { .. } => self.search(pool),
            Objective::TopK => Ok(self.evaluate_unchecked(pool, &top_k(pool, self.max_nodes))),
            Objective::All => {
                self.priced.check_covers(pool.len())?;
                Ok(self.evaluate_unchecked(pool, &(0..pool.len()).collect::<Vec<_>>()))
            }
            Objective::None => Ok(self.evaluate_unchecked(pool, &[])),
        }
    }

    /// Scores a given ancestor-closed node set under this selector's cost (at the pool's
    /// context) and objective, with `resident` (or nothing) resident.
    pub fn evaluate(
        &mut self,
        pool: &Pool,
        resident: Option<&ResidentSet>,
        nodes: &[usize],
    ) -> Result<Selection, Error> {
        self.load(pool, resident)?;
        self.priced.check_covers(nodes.len())?;
        Ok(self.evaluate_unchecked(pool, nodes))
    }

    /// Prices at `pool`'s context and loads the resident set.
    fn load(&mut self, pool: &Pool, resident: Option<&ResidentSet>) -> Result<(), Error> {
        self.cost.fold_context(pool.context(), &mut self.priced);
        self.resident.clear();
        match resident {
            Some(r) => {
                r.check_shape(pool.layers(), pool.experts())?;
                self.resident.extend_from_slice(r.bits());
            }
            None => self.resident.resize(pool.words(), 0),
        }
        Ok(())
    }

    /// Direct evaluation of a node set: union, demand split, reward, time, objective.
    fn evaluate_unchecked(&self, pool: &Pool, nodes: &[usize]) -> Selection {
        let mut union = pool.root_bits().to_vec();
        for &i in nodes {
            for (u, m) in union.iter_mut().zip(pool.expert_bits(i)) {
                *u |= m;
            }
        }
        let demand = bitset::count(&union);
        let hits: u32 = union
            .iter()
            .zip(&self.resident)
            .map(|(u, r)| (u & r).count_ones())
            .sum();
        let (hits, misses) = self.split(hits, demand - hits);
        let mut sorted = nodes.to_vec();
        sorted.sort_unstable();
        self.report(pool, sorted, hits, misses, SearchStats::default())
    }

    /// The selection record for a sorted node set. The reported reward is the plain `f64` sum
    /// `1 + Σ P` in ascending node order (readable, deterministic); the search compares the
    /// exact quantised sums instead, which differ from it by at most ~1e-13 relative.
    fn report(
        &self,
        pool: &Pool,
        nodes: Vec<usize>,
        hits: u32,
        misses: u32,
        stats: SearchStats,
    ) -> Selection {
        let reward = plain_reward(nodes.iter().map(|&i| pool.prob(i)));
        let time_ms = self.priced.time_ms(nodes.len(), hits, misses);
        Selection {
            nodes,
            reward,
            time_ms,
            demand: hits + misses,
            hits,
            misses,
            objective: self.objective.score(reward, time_ms),
            stats,
        }
    }

    /// Under the uniform cost every expert counts as a miss (the split is irrelevant there, and
    /// this keeps `hits = 0` as documented).
    fn split(&self, hits: u32, misses: u32) -> (u32, u32) {
        if self.priced.is_residency() {
            (hits, misses)
        } else {
            (0, hits + misses)
        }
    }

    /// The exact branch-and-bound search.
    fn search(&mut self, pool: &Pool) -> Result<Selection, Error> {
        self.prepare(pool);
        let root_hits: u32 = pool
            .root_bits()
            .iter()
            .zip(&self.resident)
            .map(|(u, r)| (u & r).count_ones())
            .sum();
        let root_demand = bitset::count(pool.root_bits());
        let (hits, misses) = self.split(root_hits, root_demand - root_hits);
        self.best = Best {
            objective: self
                .objective
                .score(reward(0), self.priced.time_ms(0, hits, misses)),
            nodes: Vec::with_capacity(self.max_nodes),
            hits,
            misses,
        };
        self.stats = SearchStats::default();
        if self.max_nodes > 0 && !self.frontiers[0].is_empty() {
            if self.priced.is_residency() {
                self.dfs::<true>(pool, 0, 0, hits, misses);
            } else {
                self.dfs::<false>(pool, 0, 0, hits, misses);
            }
        }
        if self.stats.visited > MAX_VISITS {
            return Err(Error::SearchTooLarge {
                nodes: pool.len(),
                max_nodes: self.max_nodes,
                limit: MAX_VISITS,
            });
        }
        let nodes = self.best.nodes.iter().map(|&i| i as usize).collect();
        Ok(self.report(pool, nodes, self.best.hits, self.best.misses, self.stats))
    }

    /// Sizes the scratch for `pool`: quantised probabilities, subtree maxima, sorted children,
    /// the root's union and the root's candidate list.
    fn prepare(&mut self, pool: &Pool) {
        let (n, w, k) = (pool.len(), pool.words(), self.max_nodes);
        self.q.clear();
        self.q.extend((0..n).map(|i| quantize(pool.prob(i))));
        self.submax.clear();
        self.submax.extend_from_slice(&self.q);
        for i in (0..n).rev() {
            if let Some(p) = pool.parent(i) {
                self.submax[p] = self.submax[p].max(self.submax[i]);
            }
        }
        // Children lists (CSR over node index + 1; slot 0 is the root).
        self.child_start.clear();
        self.child_start.resize(n + 2, 0);
        for i in 0..n {
            self.child_start[pool.parent(i).map_or(0, |p| p + 1) + 1] += 1;
        }
        for s in 1..self.child_start.len() {
            self.child_start[s] += self.child_start[s - 1];
        }
        self.child_list.clear();
        self.child_list.resize(n, 0);
        let mut fill = self.child_start.clone();
        for i in 0..n {
            let slot = pool.parent(i).map_or(0, |p| p + 1);
            self.child_list[fill[slot] as usize] = i as u32;
            fill[slot] += 1;
        }
        for s in 0..=n {
            let (a, b) = (
                self.child_start[s] as usize,
                self.child_start[s + 1] as usize,
            );
            let submax = &self.submax;
            self.child_list[a..b]
                .sort_unstable_by_key(|&c| (std::cmp::Reverse(submax[c as usize]), c));
        }
        self.unions.clear();
        self.unions.resize((k + 1) * w, 0);
        self.unions[..w].copy_from_slice(pool.root_bits());
        self.frontiers.resize_with(k + 1, Vec::new);
        self.frontiers[0].clear();
        let roots = &self.child_list[self.child_start[0] as usize..self.child_start[1] as usize];
        self.frontiers[0].extend_from_slice(roots);
        self.picked.clear();
        self.picked.resize(k, 0);
    }

    /// Explores every subtree that extends the current path of `level` picked nodes.
    fn dfs<const RES: bool>(&mut self, pool: &Pool, level: usize, rq: u64, hits: u32, misses: u32) {
        let (k, w) = (self.max_nodes, pool.words());
        let n = level + 1;
        let len = self.frontiers[level].len();
        for j in 0..len {
            if self.stats.visited > MAX_VISITS {
                return;
            }
            let v = self.frontiers[level][j] as usize;
            if self.bound(level, rq, self.submax[v], hits, misses) < self.best.objective {
                self.stats.pruned += (len - j) as u64;
                break;
            }
            // Score S + v, writing its union to level n when deeper levels will need it.
            let (lower, upper) = self.unions.split_at_mut(n * w);
            let union = &lower[level * w..];
            let out = if n < k { Some(&mut upper[..w]) } else { None };
            let (dh, dm) = if RES {
                self.kernels
                    .marginal_res(pool.expert_bits(v), union, &self.resident, out)
            } else {
                (0, self.kernels.marginal(pool.expert_bits(v), union, out))
            };
            let (rq2, h2, m2) = (rq + self.q[v], hits + dh, misses + dm);
            self.picked[level] = v as u32;
            self.stats.visited += 1;
            let objective = self
                .objective
                .score(reward(rq2), self.priced.time_ms(n, h2, m2));
            self.offer(objective, n, h2, m2);
            if n < k {
                self.next_frontier(level, j, v);
                if !self.frontiers[n].is_empty() {
                    self.dfs::<RES>(pool, n, rq2, h2, m2);
                }
            }
        }
    }

    /// Upper bound on the objective of any subtree that extends the current `level`-node path by
    /// `m ≥ 1` nodes, none more probable than `pmax` (quantised).
    #[inline]
    fn bound(&self, level: usize, rq: u64, pmax: u64, hits: u32, misses: u32) -> f64 {
        let mut best = f64::NEG_INFINITY;
        for m in 1..=(self.max_nodes - level) {
            let r = reward(rq + m as u64 * pmax);
            best = best.max(
                self.objective
                    .score(r, self.priced.time_ms(level + m, hits, misses)),
            );
        }
        best
    }

    /// Candidate list after picking `frontier[level][j] = v`: the later candidates of this level
    /// merged with `v`'s children, kept in `submax`-descending order.
    fn next_frontier(&mut self, level: usize, j: usize, v: usize) {
        let mut next = std::mem::take(&mut self.frontiers[level + 1]);
        next.clear();
        let rest = &self.frontiers[level][j + 1..];
        let kids =
            &self.child_list[self.child_start[v + 1] as usize..self.child_start[v + 2] as usize];
        let key = |c: u32| (std::cmp::Reverse(self.submax[c as usize]), c);
        let (mut a, mut b) = (0, 0);
        while a < rest.len() && b < kids.len() {
            if key(rest[a]) <= key(kids[b]) {
                next.push(rest[a]);
                a += 1;
            } else {
                next.push(kids[b]);
                b += 1;
            }
        }
        next.extend_from_slice(&rest[a..]);
        next.extend_from_slice(&kids[b..]);
        self.frontiers[level + 1] = next;
    }

    /// Replaces the incumbent when the subtree on the current path (`n` nodes) beats it.
    fn offer(&mut self, objective: f64, n: usize, hits: u32, misses: u32) {
        let better = objective > self.best.objective
            || (objective == self.best.objective && self.wins_tie(n));
        if better {
            let best = &mut self.best;
            best.objective = objective;
            best.nodes.clear();
            best.nodes.extend_from_slice(&self.picked[..n]);
            best.nodes.sort_unstable();
            best.hits = hits;
            best.misses = misses;
        }
    }

    /// Tie rule: fewer nodes win, then the lexicographically smaller sorted index list.
    fn wins_tie(&self, n: usize) -> bool {
        let best = &self.best.nodes;
        if n != best.len() {
            return n < best.len();
        }
        let mut mine = self.picked[..n].to_vec();
        mine.sort_unstable();
        mine < *best
    }
}

/// The `k` most probable nodes, ties by index, taken greedily among nodes whose parent is
/// already taken so the result is ancestor-closed even if a child is more probable than its
/// parent (with path probabilities, which never grow along a path, it is the plain top-k).
pub fn top_k(pool: &Pool, k: usize) -> Vec<usize> {
    let parents: Vec<Option<usize>> = (0..pool.len()).map(|i| pool.parent(i)).collect();
    let probs: Vec<f64> = (0..pool.len()).map(|i| pool.prob(i)).collect();
    crate::subtree::top_k_closed(&parents, &probs, k)
}

/// Number of ancestor-closed subtrees with at most `k` nodes (the empty one included): the size
/// of the exact search space, for reporting how much the bound prunes (saturating at
/// `u128::MAX`).
pub fn count_subtrees(pool: &Pool, k: usize) -> u128 {
    // f[i][s] = subtrees rooted at node i with s nodes; children are later in index order.
    let n = pool.len();
    let mut f: Vec<Vec<u128>> = vec![Vec::new(); n];
    let mut acc: Vec<Vec<u128>> = (0..=n).map(|_| poly_one(k)).collect();
    for i in (0..n).rev() {
        let mut fi = vec![0u128; k + 1];
        fi[1..=k].copy_from_slice(&acc[i + 1][..k]);
        f[i] = fi;
        let slot = pool.parent(i).map_or(0, |p| p + 1);
        let mut with_child = f[i].clone();
        with_child[0] = 1;
        acc[slot] = poly_mul(&acc[slot], &with_child, k);
    }
    acc[0].iter().fold(0u128, |a, &b| a.saturating_add(b))
}

fn poly_one(k: usize) -> Vec<u128> {
    let mut p = vec![0u128; k + 1];
    p[0] = 1;
    p
}

fn poly_mul(a: &[u128], b: &[u128], k: usize) -> Vec<u128> {
    let mut out = vec![0u128; k + 1];
    for (i, &x) in a.iter().enumerate() {
        for (j, &y) in b.iter().enumerate().take(k + 1 - i) {
            out[i + j] = out[i + j].saturating_add(x.saturating_mul(y));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::PoolBuilder;

    fn chain(len: usize) -> Pool {
        let mut b = PoolBuilder::new(1, 64).unwrap();
        for i in 0..len {
            b.push(i.checked_sub(1), 0.5, &[[i as u32]]).unwrap();
        }
        b.build()
    }

    fn star(len: usize) -> Pool {
        let mut b = PoolBuilder::new(1, 64).unwrap();
        for i in 0..len {
            b.push(None, 0.5, &[[i as u32]]).unwrap();
        }
        b.build()
    }

    #[test]
    fn subtree_counts_match_closed_forms_for_chains_and_stars() {
        // A chain of n has n + 1 rooted prefixes; a star of n has Σ_{s≤k} C(n, s) subsets.
        assert_eq!(count_subtrees(&chain(10), 7), 8);
        assert_eq!(count_subtrees(&chain(5), 7), 6);
        assert_eq!(count_subtrees(&star(5), 7), 32);
        assert_eq!(count_subtrees(&star(6), 2), 1 + 6 + 15);
        assert_eq!(count_subtrees(&star(0), 3), 1);
    }

    #[test]
    fn top_k_stays_ancestor_closed_when_a_child_outranks_its_parent() {
        let mut b = PoolBuilder::new(1, 8).unwrap();
        b.push(None, 0.1, &[[0u32]]).unwrap();
        b.push(Some(0), 0.9, &[[1u32]]).unwrap();
        b.push(None, 0.5, &[[2u32]]).unwrap();
        let pool = b.build();
        assert_eq!(top_k(&pool, 1), vec![2]);
        assert_eq!(top_k(&pool, 2), vec![0, 2]);
        assert_eq!(top_k(&pool, 3), vec![0, 1, 2]);
    }

    #[test]
    fn a_long_context_makes_a_node_too_dear_to_verify() {
        // a = 10 ms for any size, experts free, 0.01 ms per row per cached token; one node of
        // probability 0.5. No context: 1.5 / 10 beats 1 / 10. At 2 000 tokens each row costs
        // 20 ms: 1.5 / 50 = 0.030 loses to 1 / 30 = 0.033.
        let cost = CostModel::paper(vec![10.0; 2], 0.0)
            .unwrap()
            .with_context_ms(0.01)
            .unwrap();
        let mut sel = Selector::new(cost.clone(), 1, Objective::Ratio).unwrap();
        let mut b = PoolBuilder::new(1, 8).unwrap();
        b.push(None, 0.5, &[[1u32]]).unwrap();
        let short = b.clone().build();
        let long = b.context(2000).clone().build();
        let near = sel.select(&short, None).unwrap();
        assert_eq!((near.nodes, near.time_ms), (vec![0], 10.0));
        let far = sel.select(&long, None).unwrap();
        assert_eq!((far.nodes, far.time_ms), (vec![], 30.0));
        assert_eq!(sel.evaluate(&long, None, &[0]).unwrap().time_ms, 50.0);
        // The selector keeps the model as given.
        assert_eq!(sel.cost(), &cost);
    }

    #[test]
    fn selector_rejects_budgets_its_intercepts_do_not_cover() {
        let cost = CostModel::paper(vec![1.0; 4], 0.1).unwrap();
        assert!(matches!(
            Selector::new(cost.clone(), 4, Objective::Ratio),
            Err(Error::TooFewIntercepts {
                got: 4,
                max_nodes: 4,
                need: 5
            })
        ));
        assert!(matches!(
            Selector::new(cost, 65, Objective::Ratio),
            Err(Error::MaxNodesTooLarge { .. })
        ));
    }

    #[test]
    fn all_needs_an_intercept_for_the_whole_pool() {
        let cost = CostModel::paper(vec![1.0; 3], 0.1).unwrap();
        let mut sel = Selector::new(cost, 2, Objective::All).unwrap();
        assert!(matches!(
            sel.select(&star(4), None),
            Err(Error::TooFewIntercepts { need: 5, .. })
        ));
    }

    #[test]
    fn a_pool_of_tied_nodes_too_large_to_search_is_refused_within_seconds() {
        // 400 equal siblings on shared experts, K = 7: ~10^15 subtrees and nothing to prune by.
        let mut b = PoolBuilder::new(1, 64).unwrap();
        for _ in 0..400 {
            b.push(None, 0.5, &[[1u32]]).unwrap();
        }
        let pool = b.build();
        let cost = CostModel::paper(vec![1.0; 8], 0.0).unwrap();
        let mut sel = Selector::new(cost, 7, Objective::Ratio).unwrap();
        let start = std::time::Instant::now();
        let err = sel.select(&pool, None).unwrap_err();
        assert!(start.elapsed().as_secs() < 10, "{:?}", start.elapsed());
        assert!(
            matches!(
                err,
                Error::SearchTooLarge {
                    nodes: 400,
                    max_nodes: 7,
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains(&MAX_VISITS.to_string()), "{err}");
        // The same selector still answers pools it can search.
        assert!(sel.select(&chain(5), None).is_ok());
    }

    #[test]
    fn counting_a_huge_search_space_saturates_instead_of_overflowing() {
        let mut b = PoolBuilder::new(1, 64).unwrap();
        for _ in 0..1000 {
            b.push(None, 0.5, &[[0u32]]).unwrap();
        }
        assert_eq!(count_subtrees(&b.build(), 64), u128::MAX);
        assert_eq!(count_subtrees(&star(3), 2), 1 + 3 + 3);
    }
}
