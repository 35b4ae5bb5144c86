//! Greedy walks over drafted pools: traces for the simulator (`specfit record`) and the route
//! predictor's training samples (`specfit train-predictor`), the pools' atlas routes along a
//! greedy decode. It does not replay them.

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

/// The header of the traces [`PoolWalk::record`] makes on `target`: its MoE layers, experts,
/// experts per token and vocabulary (no meta).
pub fn trace_header(target: &Qwen3Moe) -> specfit_trace::TraceHeader {
    let cfg = target.config();
    specfit_trace::TraceHeader::new(
        cfg.moe_layers().len(),
        cfg.num_experts,
        cfg.num_experts_per_tok,
        cfg.vocab_size,
    )
}

/// A greedy walk that drafts the full pool (no stop rule) at every position and routes it with
/// the atlas, advancing one token at a time exactly as plain greedy decoding.
pub struct PoolWalk<'a> {
    pub target: &'a Qwen3Moe,
    pub drafter: &'a Eagle3,
    pub cache: &'a mut ExpertCache,
    pub atlas: &'a mut Atlas,
    pub shape: TreeShape,
}

/// One position of a walk: the cache length, the root, the full drafted pool, its atlas routes
/// and the atlas forward's output (logits as the walk asked).
struct PoolAt<'a> {
    n: usize,
    root: u32,
    pool: &'a [DraftNode],
    routes: PoolRoutes,
    out: ForwardOutput,
}

impl PoolWalk<'_> {
    /// A trace for the simulator: `positions` positions after `prompt`, each pool's nodes with
    /// their atlas routes and whether the target's greedy choice agrees with them.
    pub fn record(
        &mut self,
        prompt: &[u32],
        positions: usize,
    ) -> Result<Vec<specfit_trace::TraceStep>, EngineError> {
        let mut steps = Vec::new();
        self.walk(prompt, positions, Logits::All, &mut |at| {
            // Row 0 is the root; node i is row i + 1. A node agrees when it is the target's
            // argmax after its parent.
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
        })?;
        Ok(steps)
    }

    /// Training data for the route predictor: `positions` positions after `prompt`, each
    /// drafted node's features paired with its atlas routes.
    pub fn route_samples(
        &mut self,
        prompt: &[u32],
        positions: usize,
    ) -> Result<Vec<RouteSample>, EngineError> {
        let (target, h) = (self.target, self.target.config().hidden_size);
        let mut samples = Vec::new();
        self.walk(prompt, positions, Logits::None, &mut |at| {
            for (node, r) in at.pool.iter().zip(at.routes.nodes) {
                samples.push((
                    crate::predictor::features(&node.hidden, target.embed(), node.token, h),
                    r,
                ));
            }
        })?;
        Ok(samples)
    }

    /// Walks `positions` positions after `prompt`, handing each position's pool to `visit`
    /// (the atlas forward computing `logits`).
    fn walk(
        &mut self,
        prompt: &[u32],
        positions: usize,
        logits: Logits<'_>,
        visit: &mut dyn FnMut(PoolAt<'_>),
    ) -> Result<(), EngineError> {
        let (target, drafter) = (self.target, self.drafter);
        let levels = self.shape.levels;
        crate::spec::check_context(target.config(), prompt.len(), positions, levels)?;
        let mut sampler = Sampler::new(Sampling::Greedy, 0);
        let (mut kv, mut root, mut draft) = greedy_start(target, drafter, self.cache, prompt)?;
        for _ in 0..positions {
            let n = kv.len();
            let pool = draft_tree(target, drafter, &mut draft, n, self.shape, &mut |_| {
                Ok(true)
            })?;
            let (routes, out) = self
                .atlas
                .route_pool(target, &mut kv, root, &pool, logits)?;
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
            let v = verify(target, drafter, self.cache, &mut kv, tree, &mut sampler)?;
            advance_drafter(target, drafter, &mut draft, n, &v)?;
            root = *v.committed.last().expect("the bonus token");
        }
        Ok(())
    }
}
