//! Recording traces (`specfit record`): the drafted pools and their atlas routes along a greedy
//! decode. It does not replay them.

use super::greedy_start;
use crate::batch::{ForwardOutput, Logits};
use crate::error::EngineError;
use crate::experts::ExpertCache;
use crate::model::{Eagle3, Qwen3Moe};
use crate::predictor::RouteSample;
use crate::sampling::{Sampler, Sampling};
use crate::spec::{
    advance_drafter, draft_tree, verify, Atlas, DraftNode, PoolRoutes, Tree, TreeShape,
};

/// Records a trace for the simulator: decodes greedily after `prompt` for `positions` tokens
/// and, at every position, drafts the full pool (no stop rule) and routes the root and every
/// node with the atlas, noting which nodes the target's greedy choice agrees with.
pub fn record(
    target: &Qwen3Moe,
    drafter: &Eagle3,
    experts: &mut ExpertCache,
    atlas: &mut Atlas,
    prompt: &[u32],
    shape: TreeShape,
    positions: usize,
) -> Result<Vec<specfit_trace::TraceStep>, EngineError> {
    let mut steps = Vec::with_capacity(positions);
    walk_pools(
        target,
        drafter,
        experts,
        atlas,
        prompt,
        (shape, positions, Logits::All),
        &mut |at| {
            // Row 0 is the root; node i is row i + 1. A node agrees when it is the target's argmax
            // after its parent.
            let nodes = at
                .pool
                .iter()
                .zip(at.routes.nodes)
                .map(|(node, routes)| specfit_trace::TraceNode {
                    parent: node.parent.map_or(-1, |p| p as i64),
                    token: node.token,
                    prob: node.prob.clamp(0.0, 1.0),
                    depth: node.depth,
                    routes,
                    agrees: at.out.argmax(node.parent.map_or(0, |p| p + 1)) == node.token,
                })
                .collect();
            steps.push(specfit_trace::TraceStep {
                position: at.n,
                root: at.root,
                root_routes: at.routes.root,
                nodes,
                next: at.out.argmax(0),
            });
        },
    )?;
    Ok(steps)
}

/// One position of a greedy walk: the cache length, the root, the full drafted pool, its atlas
/// routes and the atlas forward's output (logits as the walk asked).
struct PoolAt<'a> {
    n: usize,
    root: u32,
    pool: &'a [DraftNode],
    routes: PoolRoutes,
    out: ForwardOutput,
}

/// Decodes greedily after `prompt` for `positions` tokens (`plan` = tree shape, positions, atlas
/// logits); at every position drafts the full pool (no stop rule), routes it with the atlas and
/// hands it to `visit`, then advances one token exactly as plain greedy decoding.
fn walk_pools(
    target: &Qwen3Moe,
    drafter: &Eagle3,
    experts: &mut ExpertCache,
    atlas: &mut Atlas,
    prompt: &[u32],
    (shape, positions, logits): (TreeShape, usize, Logits<'_>),
    visit: &mut dyn FnMut(PoolAt<'_>),
) -> Result<(), EngineError> {
    let mut sampler = Sampler::new(Sampling::Greedy, 0);
    let (mut kv, mut root, mut draft) = greedy_start(target, drafter, experts, prompt)?;
    for _ in 0..positions {
        let n = kv.len();
        let pool = draft_tree(target, drafter, &mut draft, n, shape, &mut |_| Ok(true))?;
        let (routes, out) = atlas.route_pool(target, &mut kv, root, &pool, logits)?;
        visit(PoolAt {
            n,
            root,
            pool: &pool,
            routes,
            out,
        });
        let tree = Tree {
            root,
            pool: &pool,
            chosen: &[],
        };
        let v = verify(target, drafter, experts, &mut kv, tree, &mut sampler)?;
        advance_drafter(target, drafter, &mut draft, n, &v)?;
        root = *v.committed.last().expect("the bonus token");
    }
    Ok(())
}

/// Training data for the route predictor: decodes greedily after `prompt` for `positions`
/// tokens and, at every position, pairs each drafted node's features with its atlas routes.
pub fn collect_route_samples(
    target: &Qwen3Moe,
    drafter: &Eagle3,
    experts: &mut ExpertCache,
    atlas: &mut Atlas,
    prompt: &[u32],
    shape: TreeShape,
    positions: usize,
) -> Result<Vec<RouteSample>, EngineError> {
    let h = target.config().hidden_size;
    let mut samples = Vec::new();
    let plan = (shape, positions, Logits::None);
    walk_pools(target, drafter, experts, atlas, prompt, plan, &mut |at| {
        for (node, r) in at.pool.iter().zip(at.routes.nodes) {
            samples.push((
                crate::predictor::features(&node.hidden, target.embed(), node.token, h),
                r,
            ));
        }
    })?;
    Ok(samples)
}
