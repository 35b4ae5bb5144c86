//! Verification: one target forward over the root and the chosen nodes with a tree mask, then
//! the walk that draws the target's token at each node and accepts the longest matching path.
//! It does not draft or choose.

use std::time::Instant;

use specfit_selector::{top_children, ChildTaken};

use crate::batch::{Batch, Logits, Mask};
use crate::error::EngineError;
use crate::experts::{ExpertCache, LayerStats};
use crate::kv::KvCache;
use crate::model::{Eagle3, Qwen3Moe};
use crate::sampling::Sampler;

use super::draft::{concat_taps, DraftNode};

/// What one verification covers: the root and the chosen nodes of the pool.
#[derive(Debug, Clone, Copy)]
pub struct Tree<'a> {
    /// The last committed token, not yet seen by the target.
    pub root: u32,
    pub pool: &'a [DraftNode],
    /// Chosen pool indices, ascending, ancestor-closed.
    pub chosen: &'a [usize],
}

/// The outcome of verifying one tree.
#[derive(Debug, Clone, PartialEq)]
pub struct Verified {
    /// Pool indices of the accepted draft nodes, root to leaf.
    pub accepted: Vec<usize>,
    /// Accepted draft tokens followed by the bonus token.
    pub committed: Vec<u32>,
    /// The target's drafter features (`[low | mid | high]`) of the root and accepted nodes.
    pub features: Vec<f32>,
    /// `Σ_l |∪ experts|` over the verified tokens (root included), from the target's routers.
    pub demand: u64,
    /// Expert copies of the verify forward.
    pub copies: LayerStats,
    /// Read rounds of the verify forward ([`crate::experts::CopyStats::read_rounds`]).
    pub read_rounds: usize,
    /// Wall time of the whole verify: the forward, the walk drawing the tokens and the
    /// bookkeeping after it (the cache compacted, the path's features), all of which a decoding
    /// cycle pays.
    pub seconds: f64,
}

/// What the verify `v` of a cycle on `pool` tells about the drafter's children: for the root and
/// each accepted node (the nodes the target reached), every drafted child's edge probability,
/// whether it is its parent's top child and whether it carries the token the target drew there
/// (verified or not: the draw is known).
pub fn taken_children(pool: &[DraftNode], v: &Verified) -> Vec<ChildTaken> {
    taken_along(pool, &v.committed)
}

/// What the target's tokens from the pool's root on (`continuation[0]` its token after the root,
/// `[1]` after that, …) tell about the drafter's children: for the root and each node whose
/// path is the continuation's start (the nodes the target reaches), every drafted child's edge
/// probability, whether it is its parent's top child and whether it carries the continuation's
/// next token, as far as the continuation goes. A cycle's committed tokens are such a
/// continuation ([`taken_children`]); so are the tokens plain decoding draws after a pool
/// drafted and never verified.
pub fn taken_along(pool: &[DraftNode], continuation: &[u32]) -> Vec<ChildTaken> {
    let parents: Vec<Option<usize>> = pool.iter().map(|n| n.parent).collect();
    let edges: Vec<f64> = pool.iter().map(|n| n.edge).collect();
    let top = top_children(&parents, &edges);
    // Parents precede children: a node's depth and whether the target reaches it follow its
    // parent's.
    let mut depth = vec![0usize; pool.len()];
    let mut reached = vec![false; pool.len()];
    let mut out = Vec::new();
    for (i, node) in pool.iter().enumerate() {
        let (d, parent_reached) = match node.parent {
            None => (0, true),
            Some(p) => (depth[p] + 1, reached[p]),
        };
        depth[i] = d;
        if let (true, Some(&drawn)) = (parent_reached, continuation.get(d)) {
            reached[i] = node.token == drawn;
            out.push(ChildTaken {
                q: node.edge,
                top: top[i],
                taken: reached[i],
            });
        }
    }
    out
}

/// Verifies `root` (at cache index and position `kv.len()`) plus the `chosen` pool nodes in one
/// target forward with a tree mask, then walks down from the root: at each node it draws the
/// target's next token with `sampler` exactly as plain decoding would (the argmax when greedy)
/// and follows the verified child carrying it; the first token no child carries is the bonus
/// token. `kv` is compacted to the prefix, the root and the accepted path.
pub fn verify(
    target: &Qwen3Moe,
    drafter: &Eagle3,
    cache: &mut ExpertCache,
    kv: &mut KvCache,
    tree: Tree<'_>,
    sampler: &mut Sampler,
) -> Result<Verified, EngineError> {
    // The whole verify is timed, its bookkeeping included (the tree's rows, the walk, the
    // cache's compaction, the accepted path's features): a decoding cycle pays all of it.
    let start = Instant::now();
    let Tree { root, pool, chosen } = tree;
    let n = kv.len();
    let TreeRows {
        tokens,
        parents,
        positions,
    } = tree_rows(root, n, pool, chosen)?;
    // The drafter's taps plus the final residual stream: logits are computed only for the rows
    // the walk below reads (the root, then each accepted node), not for every verified node.
    let mut taps = drafter.taps().to_vec();
    taps.push(target.final_tap());
    let batch = Batch {
        tokens: &tokens,
        positions: Some(&positions),
        mask: Mask::Tree(&parents),
        taps: &taps,
        logits: Logits::None,
    };
    let mut out = target.forward(&batch, kv, cache)?;
    let h = target.config().hidden_size;
    let residual = out.taps.pop().expect("the final tap");
    // At each node draw the target's next token exactly as plain decoding would (one draw per
    // emitted token); move to the verified child carrying it, or stop: it is the bonus token.
    let mut path = vec![0usize];
    let bonus = loop {
        let here = *path.last().expect("non-empty");
        let logits = target.logits_of(&residual[here * h..(here + 1) * h]);
        let token = sampler.sample(&logits);
        match (1..tokens.len()).find(|&r| parents[r] == Some(here) && tokens[r] == token) {
            Some(r) => path.push(r),
            None => break token,
        }
    };
    let demand = out.demand();
    kv.compact(n, &path.iter().map(|&r| n + r).collect::<Vec<_>>())?;
    let all = concat_taps(&out.taps, tokens.len(), h);
    let features = path
        .iter()
        .flat_map(|&r| all[r * 3 * h..(r + 1) * 3 * h].iter().copied())
        .collect();
    let mut committed: Vec<u32> = path[1..].iter().map(|&r| tokens[r]).collect();
    committed.push(bonus);
    let seconds = start.elapsed().as_secs_f64();
    Ok(Verified {
        accepted: path[1..].iter().map(|&r| chosen[r - 1]).collect(),
        committed,
        features,
        demand,
        read_rounds: out.copies.read_rounds(cache.read_width()),
        copies: out.copies.total,
        seconds,
    })
}

/// The rows of a tree forward: the root at position `n`, then each chosen pool node (ascending)
/// at `n + depth`, each attending to its parent's row.
pub(crate) struct TreeRows {
    pub tokens: Vec<u32>,
    /// `parents[r]`: the parent's row (`None` for the root: its parent is the last cached token).
    pub parents: Vec<Option<usize>>,
    pub positions: Vec<usize>,
}

/// [`TreeRows`] for `root` (at cache index and position `n`) and `chosen` (ascending, ancestor-
/// closed: a node whose parent is not chosen is an error).
pub(crate) fn tree_rows(
    root: u32,
    n: usize,
    pool: &[DraftNode],
    chosen: &[usize],
) -> Result<TreeRows, EngineError> {
    let row_of = |node: usize| chosen.iter().position(|&c| c == node).map(|i| i + 1);
    let mut rows = TreeRows {
        tokens: vec![root],
        parents: vec![None],
        positions: vec![n],
    };
    for &c in chosen {
        let parent = match pool[c].parent {
            None => 0,
            Some(p) => row_of(p).ok_or_else(|| EngineError::BadMask {
                reason: format!("chosen node {c} without its parent {p}"),
            })?,
        };
        rows.tokens.push(pool[c].token);
        rows.parents.push(Some(parent));
        rows.positions.push(n + pool[c].depth);
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(parent: Option<usize>, token: u32, edge: f64) -> DraftNode {
        DraftNode {
            parent,
            token,
            prob: edge,
            edge,
            depth: 1,
            hidden: vec![],
        }
    }

    fn child(q: f64, top: bool, taken: bool) -> ChildTaken {
        ChildTaken { q, top, taken }
    }

    #[test]
    fn the_children_of_every_reached_node_are_counted_taken_or_not() {
        // Root children 0 (token 5) and 1 (token 6); under node 1 children 2 (7) and 3 (8);
        // under node 0 child 4 (9), never reached.
        let pool = vec![
            node(None, 5, 0.6),
            node(None, 6, 0.3),
            node(Some(1), 7, 0.5),
            node(Some(1), 8, 0.2),
            node(Some(0), 9, 0.9),
        ];
        // The target drew 6 at the root, then 8 under node 1 (accepted, verified or not), then
        // the bonus 4 under node 3, which has no children.
        let v = Verified {
            accepted: vec![1, 3],
            committed: vec![6, 8, 4],
            features: vec![],
            demand: 0,
            copies: LayerStats::default(),
            read_rounds: 0,
            seconds: 0.0,
        };
        assert_eq!(
            taken_children(&pool, &v),
            vec![
                child(0.6, true, false),
                child(0.3, false, true),
                child(0.5, true, false),
                child(0.2, false, true)
            ]
        );
    }

    #[test]
    fn a_continuation_counts_the_children_of_the_nodes_it_reaches_as_far_as_it_goes() {
        // Root children 0 (token 5) and 1 (6); under 0: 2 (7) and 3 (8); under 3: 4 (9); under
        // 1: 5 (7).
        let pool = vec![
            node(None, 5, 0.6),
            node(None, 6, 0.3),
            node(Some(0), 7, 0.5),
            node(Some(0), 8, 0.4),
            node(Some(3), 9, 0.7),
            node(Some(1), 7, 0.2),
        ];
        // The target goes 5, 8, 1: it reaches 0 and 3, not 4 (and never 1, so not 5).
        assert_eq!(
            taken_along(&pool, &[5, 8, 1]),
            vec![
                child(0.6, true, true),
                child(0.3, false, false),
                child(0.5, true, false),
                child(0.4, false, true),
                child(0.7, true, false)
            ]
        );
        // Known only one token deep: the root's children alone.
        assert_eq!(
            taken_along(&pool, &[5]),
            vec![child(0.6, true, true), child(0.3, false, false)]
        );
        assert_eq!(taken_along(&pool, &[]), vec![]);
    }
}
