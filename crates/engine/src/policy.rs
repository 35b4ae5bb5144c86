//! SpecFit's verify rule on the engine: build the selector's pool from the drafted tree and the
//! atlas routes, pick the subtree with the selector (exact search; `ratio`, `lambda`, or the
//! residency-aware cost on the live slot contents), and apply the draft-stop rule after each
//! level. Drafting and verification are `spec`'s; the search is `specfit_selector`'s.

use std::time::Instant;

use specfit_selector::{stop, Pool, PoolBuilder, ResidentSet, Selector};

use crate::error::EngineError;
use crate::spec::{DraftNode, PoolRoutes, RouteSource, SpecRule};

/// The SpecFit rule.
pub struct SpecFitRule {
    selector: Selector,
    experts: usize,
    /// Apply the draft-stop rule after each level.
    pub stop_rule: bool,
    /// Charge resident experts `beta_hit` (needs a residency-aware cost).
    pub use_resident: bool,
    /// Microseconds of each selection (search only), for reports.
    pub select_us: Vec<f64>,
    /// Plain bursts: after a cycle whose subtree is empty, decode the next tokens without
    /// drafting (1, 2, 4, … up to [`MAX_BURST`] while the subtree stays empty).
    pub adaptive: bool,
    empty_streak: u32,
    burst: usize,
    /// When the stop rule ended drafting: the pool's size and the subtree it chose, which is
    /// what `choose` would compute again on the same pool.
    stopped: Option<(usize, Vec<usize>)>,
}

/// The longest plain burst of an adaptive rule.
pub const MAX_BURST: usize = 16;

impl std::fmt::Debug for SpecFitRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpecFitRule")
            .field("selector", &self.selector)
            .finish()
    }
}

fn selector_error(e: specfit_selector::Error) -> EngineError {
    EngineError::Selector(e)
}

impl SpecFitRule {
    /// A rule over a target with `experts` experts per MoE layer.
    pub fn new(selector: Selector, experts: usize) -> SpecFitRule {
        SpecFitRule {
            selector,
            experts,
            stop_rule: true,
            use_resident: false,
            select_us: Vec::new(),
            adaptive: false,
            empty_streak: 0,
            burst: 0,
            stopped: None,
        }
    }

    /// The selector pool of `pool` with `routes`.
    fn pool(&self, pool: &[DraftNode], routes: &PoolRoutes) -> Result<Pool, EngineError> {
        let mut b = PoolBuilder::new(routes.root.len(), self.experts).map_err(selector_error)?;
        b.root_routes(&routes.root).map_err(selector_error)?;
        for (node, r) in pool.iter().zip(&routes.nodes) {
            b.push(node.parent, node.prob.clamp(0.0, 1.0), r)
                .map_err(selector_error)?;
        }
        Ok(b.build())
    }

    /// Runs the selector on `pool`, timing the search alone.
    fn select(
        &mut self,
        pool: &[DraftNode],
        source: &mut dyn RouteSource,
    ) -> Result<(Pool, specfit_selector::Selection), EngineError> {
        let routes = source.routes(pool)?;
        let p = self.pool(pool, &routes)?;
        let resident = if self.use_resident {
            let r = source.resident();
            Some(ResidentSet::new(routes.root.len(), self.experts, &r).map_err(selector_error)?)
        } else {
            None
        };
        let start = Instant::now();
        let selection = self
            .selector
            .select(&p, resident.as_ref())
            .map_err(selector_error)?;
        self.select_us.push(start.elapsed().as_secs_f64() * 1e6);
        Ok((p, selection))
    }
}

impl SpecRule for SpecFitRule {
    fn keep_drafting(
        &mut self,
        pool: &[DraftNode],
        routes: &mut dyn RouteSource,
    ) -> Result<bool, EngineError> {
        if !self.stop_rule {
            return Ok(true);
        }
        let (p, selection) = self.select(pool, routes)?;
        let decision = stop::decide(&p, selection);
        let keep = decision.keep_drafting();
        self.stopped = (!keep).then_some((pool.len(), decision.selection.nodes));
        Ok(keep)
    }

    fn choose(
        &mut self,
        pool: &[DraftNode],
        routes: &mut dyn RouteSource,
    ) -> Result<Vec<usize>, EngineError> {
        // Drafting stopped on this very pool: its winner is the choice (no second search).
        let nodes = match self.stopped.take() {
            Some((len, nodes)) if len == pool.len() => nodes,
            _ => self.select(pool, routes)?.1.nodes,
        };
        if self.adaptive {
            if nodes.is_empty() {
                self.empty_streak += 1;
                self.burst = (1usize << (self.empty_streak - 1).min(4)).min(MAX_BURST);
            } else {
                self.empty_streak = 0;
                self.burst = 0;
            }
        }
        Ok(nodes)
    }

    fn plain_steps(&mut self) -> usize {
        std::mem::take(&mut self.burst)
    }

    fn select_us(&self) -> &[f64] {
        &self.select_us
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use specfit_selector::{CostModel, Objective};

    /// Fixed routes: the root and node `i` route to experts `{i, i+1}` of one layer.
    struct Fixed;

    impl RouteSource for Fixed {
        fn routes(&mut self, pool: &[DraftNode]) -> Result<PoolRoutes, EngineError> {
            Ok(PoolRoutes {
                root: vec![vec![0, 1]],
                nodes: (0..pool.len() as u32)
                    .map(|i| vec![vec![i % 8, (i + 1) % 8]])
                    .collect(),
            })
        }
        fn resident(&self) -> Vec<Vec<u32>> {
            vec![Vec::new()]
        }
    }

    fn node(parent: Option<usize>, prob: f64, depth: usize) -> DraftNode {
        DraftNode {
            parent,
            token: 0,
            prob,
            depth,
            hidden: Vec::new(),
        }
    }

    fn rule() -> SpecFitRule {
        let cost = CostModel::paper(vec![1.0; 8], 0.3).unwrap();
        SpecFitRule::new(Selector::new(cost, 7, Objective::Ratio).unwrap(), 8)
    }

    #[test]
    fn the_choice_after_the_stop_rule_ends_drafting_is_a_fresh_searchs_choice() {
        // A newest level too improbable to take: the stop rule ends drafting here.
        let pool = vec![
            node(None, 0.9, 1),
            node(None, 0.05, 1),
            node(Some(0), 0.8, 2),
            node(Some(2), 0.01, 3),
        ];
        let mut stopping = rule();
        assert!(!stopping.keep_drafting(&pool, &mut Fixed).unwrap());
        let searches = stopping.select_us().len();
        let reused = stopping.choose(&pool, &mut Fixed).unwrap();
        assert_eq!(stopping.select_us().len(), searches, "no second search");
        let fresh = rule().choose(&pool, &mut Fixed).unwrap();
        assert_eq!(reused, fresh);
        // A grown pool is searched again.
        let mut grown = pool.clone();
        grown.push(node(Some(3), 0.01, 4));
        assert_eq!(
            stopping.choose(&grown, &mut Fixed).unwrap(),
            rule().choose(&grown, &mut Fixed).unwrap()
        );
    }
}
