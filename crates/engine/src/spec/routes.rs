//! Where draft-node routes come from: the atlas (the target's routers on the pool, outside the
//! clock), the route predictor, or none. It does not choose subtrees.

use std::time::Instant;

use crate::batch::{Batch, ForwardOutput, Logits, Mask};
use crate::error::EngineError;
use crate::experts::ExpertCache;
use crate::kv::KvCache;
use crate::model::Qwen3Moe;
use crate::predictor::RoutePredictor;

use super::draft::DraftNode;
use super::verify::{tree_rows, TreeRows};

/// Expert routes of a pool, per MoE layer: the root's and each node's experts.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolRoutes {
    /// `[moe layer][k]`.
    pub root: Vec<Vec<u32>>,
    /// `[node][moe layer][k]`.
    pub nodes: Vec<Vec<Vec<u32>>>,
}

/// Where a verify policy gets the routes of draft nodes.
pub enum Routes<'a> {
    /// No routes (policies that need them fail).
    None,
    /// The target's routers on the pool, outside the clock.
    Atlas(&'a mut Atlas),
    /// The linear route predictor on the drafter's hidden states (inside the clock).
    Predictor(&'a RoutePredictor),
}

/// What routing a cycle's pool reads: the target, its committed cache (left as it came) and the
/// root with the drafter state that proposed the root's children.
pub(crate) struct CycleAt<'a> {
    pub(crate) target: &'a Qwen3Moe,
    pub(crate) kv: &'a mut KvCache,
    pub(crate) root: u32,
    pub(crate) root_hidden: &'a [f32],
}

impl Routes<'_> {
    /// Routes of the root and every node of `pool`. `known` are the routes this cycle got for an
    /// earlier, smaller pool (the pool only grows while a cycle drafts): the predictor keeps
    /// them and scores only the new nodes; the atlas routes the whole pool again.
    pub(crate) fn route(
        &mut self,
        at: &mut CycleAt<'_>,
        pool: &[DraftNode],
        known: Option<PoolRoutes>,
    ) -> Result<PoolRoutes, EngineError> {
        match self {
            Routes::None => Err(EngineError::NoRoutes {
                reason: "this verify policy needs routes but no route source was given".into(),
            }),
            Routes::Atlas(atlas) => atlas.route(at, pool),
            Routes::Predictor(predictor) => Ok(predict(predictor, at, pool, known)),
        }
    }

    /// Routing time spent so far outside the clock (the atlas, as in the paper); 0 for sources
    /// whose routing counts as decoding time.
    pub fn outside_clock_seconds(&self) -> f64 {
        match self {
            Routes::Atlas(atlas) => atlas.seconds,
            _ => 0.0,
        }
    }
}

/// The atlas: the target's own routers run on the draft pool (a full forward over root + pool on a
/// copy of the KV cache, with all experts resident in a separate cache), outside the timer.
pub struct Atlas {
    cache: ExpertCache,
    /// Time spent so far.
    pub seconds: f64,
    /// `corrupt:P`: each routed expert replaced by a random other one with probability P.
    corrupt: Option<(f64, specfit_selector::synth::Rng)>,
}

impl Atlas {
    /// An atlas over `cache`, which should hold every expert (it is only used for routing).
    pub fn new(cache: ExpertCache) -> Atlas {
        Atlas {
            cache,
            seconds: 0.0,
            corrupt: None,
        }
    }

    /// The paper's degraded-predictor experiment: every expert of every route (root and nodes)
    /// is replaced, with probability `p`, by a uniformly random expert not already in the list.
    pub fn with_corruption(mut self, p: f64, seed: u64) -> Atlas {
        self.corrupt = Some((p, specfit_selector::synth::Rng::new(seed)));
        self
    }

    /// One forward of the root and the whole pool after `kv` with every expert resident: the
    /// routes of every token, and the output (for `logits`). The forward appends to `kv`, which
    /// is then truncated back, so `kv` leaves as it came (no copy of a long cache per call: an
    /// 8 MB copy per drafted level at a 1,000-token context also flushed the processor caches
    /// the timed verify then ran in).
    pub(crate) fn route_pool(
        &mut self,
        target: &Qwen3Moe,
        kv: &mut KvCache,
        root: u32,
        pool: &[DraftNode],
        logits: Logits<'_>,
    ) -> Result<(PoolRoutes, ForwardOutput), EngineError> {
        let n = kv.len();
        let all: Vec<usize> = (0..pool.len()).collect();
        let TreeRows {
            tokens,
            parents,
            positions,
        } = tree_rows(root, n, pool, &all)?;
        let batch = Batch {
            tokens: &tokens,
            positions: Some(&positions),
            mask: Mask::Tree(&parents),
            taps: &[],
            logits,
        };
        let out = target.forward(&batch, kv, &mut self.cache);
        // Also after a failed forward, which may have appended to some layers only.
        kv.truncate(n)?;
        let out = out?;
        let layers: Vec<&Vec<Vec<u32>>> = out.routes.iter().flatten().collect();
        let routes = PoolRoutes {
            root: layers.iter().map(|l| l[0].clone()).collect(),
            nodes: (1..tokens.len())
                .map(|t| layers.iter().map(|l| l[t].clone()).collect())
                .collect(),
        };
        Ok((routes, out))
    }

    /// The routes of the root and `pool` at `at`, corrupted when asked, timed outside the clock.
    fn route(
        &mut self,
        at: &mut CycleAt<'_>,
        pool: &[DraftNode],
    ) -> Result<PoolRoutes, EngineError> {
        let start = Instant::now();
        let (mut routes, _) = self.route_pool(at.target, at.kv, at.root, pool, Logits::None)?;
        self.corrupt(&mut routes, at.target.config().num_experts);
        self.seconds += start.elapsed().as_secs_f64();
        Ok(routes)
    }

    /// Replaces each routed expert with a random other one with the corruption's probability.
    fn corrupt(&mut self, routes: &mut PoolRoutes, experts: usize) {
        let Some((p, rng)) = self.corrupt.as_mut() else {
            return;
        };
        for list in routes
            .root
            .iter_mut()
            .chain(routes.nodes.iter_mut().flatten())
        {
            for i in 0..list.len() {
                if rng.unit() < *p && list.len() < experts {
                    let fresh = loop {
                        let e = rng.below(experts) as u32;
                        if !list.contains(&e) {
                            break e;
                        }
                    };
                    list[i] = fresh;
                }
            }
        }
    }
}

/// Routes predicted from the drafter's hidden states: the root's from the state that proposed
/// its children, each node's from the state that proposed it; `known` nodes keep theirs and the
/// new ones are scored together in one product.
fn predict(
    predictor: &RoutePredictor,
    at: &CycleAt<'_>,
    pool: &[DraftNode],
    known: Option<PoolRoutes>,
) -> PoolRoutes {
    let h = at.target.config().hidden_size;
    let features = |hidden: &[f32], token: u32| {
        crate::predictor::features(hidden, at.target.embed(), token, h)
    };
    let mut routes = match known {
        Some(r) if r.nodes.len() <= pool.len() => r,
        _ => PoolRoutes {
            root: predictor.predict(&features(at.root_hidden, at.root)),
            nodes: Vec::new(),
        },
    };
    let fresh = &pool[routes.nodes.len()..];
    if !fresh.is_empty() {
        let xs: Vec<f32> = fresh
            .iter()
            .flat_map(|n| features(&n.hidden, n.token))
            .collect();
        routes
            .nodes
            .extend(predictor.predict_rows(&xs, fresh.len()));
    }
    routes
}
