//! Where draft-node routes come from: the atlas (the target's routers on the pool, outside the
//! timer), the route predictor, or none. It does not choose subtrees.

use super::*;

/// Expert routes of a pool, per MoE layer: the root's and each node's experts.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolRoutes {
    /// `[moe layer][k]`.
    pub root: Vec<Vec<u32>>,
    /// `[node][moe layer][k]`.
    pub nodes: Vec<Vec<Vec<u32>>>,
}

/// Where a rule gets the routes of draft nodes (and the live slot contents) from.
pub trait RouteSource {
    /// Routes of the root and every node of `pool`.
    fn routes(&mut self, pool: &[DraftNode]) -> Result<PoolRoutes, EngineError>;
    /// Experts resident in each MoE layer's slots right now.
    fn resident(&self) -> Vec<Vec<u32>>;
    /// The routes of the latest [`RouteSource::routes`] call, if any.
    fn latest(&self) -> Option<&PoolRoutes> {
        None
    }
    /// Routing time spent so far outside the clock (the atlas, as in the paper); 0 for sources
    /// whose routing counts as decoding time.
    fn outside_clock_seconds(&self) -> f64 {
        0.0
    }
}

/// The route source of one cycle: the atlas when given, else the predictor, else none.
pub(super) fn route_source<'a>(
    target: &'a Qwen3Moe,
    atlas: Option<&'a mut Atlas>,
    predictor: Option<&'a RoutePredictor>,
    kv: &'a mut KvCache,
    (root, root_hidden): (u32, &[f32]),
    resident: Vec<Vec<u32>>,
) -> Box<dyn RouteSource + 'a> {
    match (atlas, predictor) {
        (Some(atlas), _) => Box::new(AtlasView {
            target,
            atlas,
            kv,
            root,
            resident,
            routes: None,
        }),
        (None, Some(predictor)) => Box::new(PredictorView {
            predictor,
            target,
            root,
            root_hidden: root_hidden.to_vec(),
            resident,
            routes: None,
        }),
        (None, None) => Box::new(NoRoutes),
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
    pub(super) fn route_pool(
        &mut self,
        target: &Qwen3Moe,
        kv: &mut KvCache,
        root: u32,
        pool: &[DraftNode],
        logits: Logits<'_>,
    ) -> Result<(PoolRoutes, crate::batch::ForwardOutput), EngineError> {
        let n = kv.len();
        let all: Vec<usize> = (0..pool.len()).collect();
        let super::verify::TreeRows {
            tokens,
            parents,
            positions,
        } = super::verify::tree_rows(root, n, pool, &all)?;
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

    pub(super) fn corrupt(&mut self, routes: &mut PoolRoutes, experts: usize) {
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

/// The atlas at one cycle: the committed cache and the root.
struct AtlasView<'a> {
    target: &'a Qwen3Moe,
    atlas: &'a mut Atlas,
    /// Left as it came by every call.
    kv: &'a mut KvCache,
    root: u32,
    resident: Vec<Vec<u32>>,
    routes: Option<PoolRoutes>,
}

impl RouteSource for AtlasView<'_> {
    fn routes(&mut self, pool: &[DraftNode]) -> Result<PoolRoutes, EngineError> {
        let start = Instant::now();
        let (mut routes, _) =
            self.atlas
                .route_pool(self.target, &mut *self.kv, self.root, pool, Logits::None)?;
        self.atlas
            .corrupt(&mut routes, self.target.config().num_experts);
        self.atlas.seconds += start.elapsed().as_secs_f64();
        self.routes = Some(routes.clone());
        Ok(routes)
    }

    fn resident(&self) -> Vec<Vec<u32>> {
        self.resident.clone()
    }

    fn latest(&self) -> Option<&PoolRoutes> {
        self.routes.as_ref()
    }

    fn outside_clock_seconds(&self) -> f64 {
        self.atlas.seconds
    }
}

/// Where the specfit rules get draft-node routes from.
pub enum Routes<'a> {
    /// No routes (rules that need them fail).
    None,
    /// The target's routers on the pool, outside the timer.
    Atlas(&'a mut Atlas),
    /// The linear route predictor on the drafter's hidden states (inside the timer).
    Predictor(&'a RoutePredictor),
}

/// Routes predicted from the drafter's hidden states.
struct PredictorView<'a> {
    predictor: &'a RoutePredictor,
    target: &'a Qwen3Moe,
    root: u32,
    /// The drafter state at the committed position (it proposed the root's children).
    root_hidden: Vec<f32>,
    resident: Vec<Vec<u32>>,
    /// Routes of the pool so far (the root's and each node's, in pool order).
    routes: Option<PoolRoutes>,
}

impl RouteSource for PredictorView<'_> {
    /// The pool only grows while a cycle drafts: nodes predicted at an earlier level keep their
    /// routes, and the new ones are scored together in one product.
    fn routes(&mut self, pool: &[DraftNode]) -> Result<PoolRoutes, EngineError> {
        let h = self.target.config().hidden_size;
        let features = |hidden: &[f32], token: u32| {
            crate::predictor::features(hidden, self.target.embed(), token, h)
        };
        let mut routes = match self.routes.take() {
            Some(r) if r.nodes.len() <= pool.len() => r,
            _ => PoolRoutes {
                root: self
                    .predictor
                    .predict(&features(&self.root_hidden, self.root)),
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
                .extend(self.predictor.predict_rows(&xs, fresh.len()));
        }
        self.routes = Some(routes.clone());
        Ok(routes)
    }

    fn resident(&self) -> Vec<Vec<u32>> {
        self.resident.clone()
    }

    fn latest(&self) -> Option<&PoolRoutes> {
        self.routes.as_ref()
    }
}

/// A source for rules that never ask for routes.
pub struct NoRoutes;

impl RouteSource for NoRoutes {
    fn routes(&mut self, _pool: &[DraftNode]) -> Result<PoolRoutes, EngineError> {
        Err(EngineError::NoRoutes {
            reason: "this verify rule needs routes but no route source was given".into(),
        })
    }
    fn resident(&self) -> Vec<Vec<u32>> {
        Vec::new()
    }
}
