//! Drafting: the drafted nodes and the drafter's state between cycles, the EAGLE-2/3 dynamic
//! expansion of the draft tree, the top-`b` children of a node, and feeding committed tokens back
//! to the drafter. It does not choose or verify.

use crate::batch::{Batch, Logits, Mask};
use crate::error::EngineError;
use crate::kv::KvCache;
use crate::model::{DraftHidden, Eagle3, Qwen3Moe};

use super::verify::Verified;

/// One drafted node: a target token under a parent (`None` = the root).
#[derive(Debug, Clone, PartialEq)]
pub struct DraftNode {
    pub parent: Option<usize>,
    pub token: u32,
    /// Product of the drafter's probabilities along the path.
    pub prob: f64,
    /// The drafter's probability of this token given the parent (the last factor of `prob`).
    pub edge: f64,
    pub depth: usize,
    /// The drafter's hidden state that proposed this node (its parent's output row), which a
    /// route predictor reads. Empty when unknown.
    pub hidden: Vec<f32>,
}

/// Tree shape: `branching` children per expanded node, the `branching` best nodes of each level
/// expanded, `levels` levels (defaults 2 and 5: an 18-node pool).
#[derive(Debug, Clone, Copy)]
pub struct TreeShape {
    pub branching: usize,
    pub levels: usize,
}

impl TreeShape {
    /// A shape of `branching` and `levels`, refused (with the limit) when either is 0 or the
    /// pool it drafts would exceed the selector's [`specfit_selector::MAX_POOL_NODES`].
    pub fn new(branching: usize, levels: usize) -> Result<TreeShape, EngineError> {
        let shape = TreeShape { branching, levels };
        let limit = specfit_selector::MAX_POOL_NODES;
        match shape.pool_nodes() {
            Some(nodes) if branching > 0 && levels > 0 && nodes <= limit => Ok(shape),
            nodes => Err(EngineError::TreeTooLarge {
                branching,
                levels,
                nodes,
                limit,
            }),
        }
    }

    /// Nodes of the full drafted pool: `branching` at level 1, `branching²` at each later level
    /// (None when that overflows).
    pub fn pool_nodes(&self) -> Option<usize> {
        let b = self.branching;
        let later = b
            .checked_mul(b)?
            .checked_mul(self.levels.saturating_sub(1))?;
        b.checked_add(later)
    }
}

impl Default for TreeShape {
    fn default() -> Self {
        TreeShape {
            branching: 2,
            levels: 5,
        }
    }
}

/// The drafter's state between cycles.
pub(crate) struct DraftState {
    pub(crate) kv: KvCache,
    /// Drafter cache entries of committed tokens (one per committed position, plain bursts'
    /// included; tree entries come after them).
    pub(crate) committed: usize,
    /// Last committed-position hidden output and logits (they predict level 1).
    pub(crate) hidden: Vec<f32>,
    pub(crate) logits: Vec<f32>,
}

/// After verifying at cache length `n`: drops the drafter's tree entries and feeds it the
/// committed tokens with the target's features along the accepted path.
pub(crate) fn advance_drafter(
    target: &Qwen3Moe,
    drafter: &Eagle3,
    draft: &mut DraftState,
    n: usize,
    v: &Verified,
) -> Result<(), EngineError> {
    learn(target, drafter, draft, &v.committed, &v.features, n)
}

/// Drops the drafter's uncommitted (tree) entries and feeds it `tokens` with the target's
/// features `feats`, at positions `first..`.
pub(crate) fn learn(
    target: &Qwen3Moe,
    drafter: &Eagle3,
    draft: &mut DraftState,
    tokens: &[u32],
    feats: &[f32],
    first: usize,
) -> Result<(), EngineError> {
    draft.kv.truncate(draft.committed)?;
    let kv = std::mem::replace(&mut draft.kv, KvCache::new(0, 0, 0));
    *draft = feed_drafter(target, drafter, kv, tokens, feats, first)?;
    Ok(())
}

/// Per-token concatenation `[low | mid | high]` of the target's three taps (T × 3H).
pub fn concat_taps(taps: &[Vec<f32>], t: usize, h: usize) -> Vec<f32> {
    (0..t)
        .flat_map(|i| {
            taps.iter()
                .flat_map(move |tap| tap[i * h..(i + 1) * h].iter().copied())
        })
        .collect()
}

/// Appends `tokens` with target features `feats` to the drafter's cache at positions
/// `first..`, returning the state whose last row predicts the next level-1 nodes.
pub(crate) fn feed_drafter(
    target: &Qwen3Moe,
    drafter: &Eagle3,
    mut kv: KvCache,
    tokens: &[u32],
    feats: &[f32],
    first: usize,
) -> Result<DraftState, EngineError> {
    let positions: Vec<usize> = (first..first + tokens.len()).collect();
    let out = drafter.forward(
        target.embed(),
        &Batch::causal(tokens)
            .with_positions(&positions)
            .with_logits(Logits::Last),
        DraftHidden::Target(feats),
        &mut kv,
    )?;
    let (t, h) = (tokens.len(), drafter.config().hidden_size);
    Ok(DraftState {
        committed: kv.len(),
        kv,
        hidden: out.hidden[(t - 1) * h..].to_vec(),
        logits: out.row(0).to_vec(),
    })
}

/// EAGLE-2/3 dynamic expansion: level 1 is the top-`b` children of the root; each next level
/// expands the `b` best nodes of the previous level (by path probability, ties by index) with
/// their top-`b` children. The drafter's cache gets the expanded nodes' entries (after the
/// committed `n`), which the caller truncates after verification.
pub(crate) fn draft_tree(
    target: &Qwen3Moe,
    drafter: &Eagle3,
    draft: &mut DraftState,
    n: usize,
    shape: TreeShape,
    keep_drafting: &mut dyn FnMut(&[DraftNode]) -> Result<bool, EngineError>,
) -> Result<Vec<DraftNode>, EngineError> {
    let h = drafter.config().hidden_size;
    let mut pool: Vec<DraftNode> = Vec::new();
    // Children of the root from the last committed row.
    let mut frontier: Vec<usize> = Vec::new();
    for (token, p) in top_children(drafter, &draft.logits, shape.branching) {
        frontier.push(pool.len());
        pool.push(DraftNode {
            parent: None,
            token,
            prob: p,
            edge: p,
            depth: 1,
            hidden: draft.hidden.clone(),
        });
    }

    // Drafter-cache index of each fed node.
    let mut cache_index: Vec<Option<usize>> = vec![None; pool.len()];
    for _level in 2..=shape.levels {
        if !keep_drafting(&pool)? {
            break;
        }
        let mut expand = frontier.clone();
        expand.sort_by(|&a, &b| pool[b].prob.total_cmp(&pool[a].prob).then(a.cmp(&b)));
        expand.truncate(shape.branching);
        expand.sort_unstable();
        if expand.is_empty() {
            break;
        }
        // Feed the expanded nodes: each sees the committed cache, its fed ancestors and itself.
        let cached = draft.kv.len();
        let rows: Vec<Vec<bool>> = expand
            .iter()
            .enumerate()
            .map(|(i, &node)| {
                let mut row = vec![false; cached + expand.len()];
                row[..draft.committed].iter_mut().for_each(|v| *v = true);
                let mut a = pool[node].parent;
                while let Some(p) = a {
                    row[cache_index[p].expect("ancestors were fed")] = true;
                    a = pool[p].parent;
                }
                row[cached + i] = true;
                row
            })
            .collect();
        let tokens: Vec<u32> = expand.iter().map(|&i| pool[i].token).collect();
        let hidden: Vec<f32> = expand
            .iter()
            .flat_map(|&i| pool[i].hidden.iter().copied())
            .collect();
        let positions: Vec<usize> = expand.iter().map(|&i| n - 1 + pool[i].depth).collect();
        let out = drafter.forward(
            target.embed(),
            &Batch::causal(&tokens)
                .with_positions(&positions)
                .with_mask(Mask::Explicit(&rows)),
            DraftHidden::Own(&hidden),
            &mut draft.kv,
        )?;
        let mut next = Vec::new();
        for (r, &node) in expand.iter().enumerate() {
            cache_index[node] = Some(cached + r);
            for (token, p) in top_children(drafter, out.row(r), shape.branching) {
                next.push(pool.len());
                pool.push(DraftNode {
                    parent: Some(node),
                    token,
                    prob: pool[node].prob * p,
                    edge: p,
                    depth: pool[node].depth + 1,
                    hidden: out.hidden[r * h..(r + 1) * h].to_vec(),
                });
                cache_index.push(None);
            }
        }
        frontier = next;
    }
    Ok(pool)
}

/// The `b` most probable draft tokens of a logits row, as (target id, probability): one
/// vectorised softmax and one selection pass over the draft vocabulary.
pub fn top_children(drafter: &Eagle3, logits: &[f32], b: usize) -> Vec<(u32, f64)> {
    let mut p = logits.to_vec();
    crate::kernels::math::softmax_scaled(&mut p, 1.0);
    crate::kernels::math::top_k(&p, b)
        .into_iter()
        .map(|(i, pi)| (drafter.to_target(i as usize), pi as f64))
        .collect()
}

/// The levels drafted in a pool: its deepest node's depth (0 when empty).
pub fn pool_depth(pool: &[DraftNode]) -> usize {
    pool.iter().map(|n| n.depth).max().unwrap_or(0)
}
