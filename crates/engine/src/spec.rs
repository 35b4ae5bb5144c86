//! EAGLE-3 tree speculative decoding on the offloaded engine: draft a tree with the drafter
//! (EAGLE-2/3 dynamic expansion), let a [`Verify`] rule choose the part to verify, verify it in
//! one target forward with a tree mask (copying only the experts it misses), then walk down from
//! the root drawing the target's token at each node exactly as plain decoding draws it (argmax
//! when greedy; one temperature/top-p draw per emitted token otherwise) and follow the verified
//! child that carries it; the first token no verified child carries is the bonus token. Because
//! the target forward is batch-invariant and each emitted token is one draw from the same
//! distribution in the same order, the output is token-for-token that of plain decoding with the
//! same seed — greedy or sampled — and so exactly the target's distribution. (With drafts that
//! are the drafter's top-k rather than samples from it, this direct draw accepts with the largest
//! probability any exact scheme can: the target mass on the verified children.) Choosing with SpecFit's selector (routes, costs) lives in the caller's rule; this
//! module owns drafting, verification, acceptance and the caches.

use std::time::Instant;

use crate::batch::{Batch, Logits, Mask};
use crate::error::EngineError;
use crate::experts::{ExpertCache, LayerStats};
use crate::kv::KvCache;
use crate::model::{DraftHidden, Eagle3, Qwen3Moe};
use crate::predictor::{RoutePredictor, RouteSample};
use crate::prefix::Prefix;
use crate::sampling::{Sampler, Sampling};

/// One drafted node: a target token under a parent (`None` = the root).
#[derive(Debug, Clone, PartialEq)]
pub struct DraftNode {
    pub parent: Option<usize>,
    pub token: u32,
    /// Product of the drafter's probabilities along the path.
    pub prob: f64,
    pub depth: usize,
    /// The drafter's hidden state that proposed this node (its parent's output row), which a
    /// route predictor reads. Empty when unknown.
    pub hidden: Vec<f32>,
}

/// Which drafted nodes to verify: given the pool (parents before children), the chosen
/// ancestor-closed node indices, ascending. Empty = verify the root alone.
pub trait Verify {
    /// Called after each drafted level with the pool so far; `false` stops drafting.
    fn keep_drafting(
        &mut self,
        _pool: &[DraftNode],
        _routes: &mut dyn RouteSource,
    ) -> Result<bool, EngineError> {
        Ok(true)
    }
    /// The nodes to verify.
    fn choose(
        &mut self,
        pool: &[DraftNode],
        routes: &mut dyn RouteSource,
    ) -> Result<Vec<usize>, EngineError>;
    /// Microseconds of each subtree search so far (rules that search report them).
    fn select_us(&self) -> &[f64] {
        &[]
    }
    /// Tokens to decode plainly (no drafting, no tree) before the next speculative cycle.
    fn plain_steps(&mut self) -> usize {
        0
    }
}

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
    /// Routing time spent so far, when routes are computed outside the timer.
    fn atlas_seconds(&self) -> Option<f64> {
        None
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
    fn route_pool(
        &mut self,
        target: &Qwen3Moe,
        kv: &mut KvCache,
        root: u32,
        pool: &[DraftNode],
        logits: Logits<'_>,
    ) -> Result<(PoolRoutes, crate::batch::ForwardOutput), EngineError> {
        let n = kv.len();
        let mut tokens = vec![root];
        let mut parents = vec![None];
        let mut positions = vec![n];
        for node in pool {
            tokens.push(node.token);
            parents.push(Some(node.parent.map_or(0, |p| p + 1)));
            positions.push(n + node.depth);
        }
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

/// The atlas at one cycle: the committed cache and the root.
struct AtlasView<'a> {
    target: &'a Qwen3Moe,
    atlas: &'a mut Atlas,
    /// Left as it came by every call.
    kv: &'a mut KvCache,
    root: u32,
    resident: Vec<Vec<u32>>,
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
        Ok(routes)
    }

    fn resident(&self) -> Vec<Vec<u32>> {
        self.resident.clone()
    }

    fn atlas_seconds(&self) -> Option<f64> {
        Some(self.atlas.seconds)
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
}

impl RouteSource for PredictorView<'_> {
    fn routes(&mut self, pool: &[DraftNode]) -> Result<PoolRoutes, EngineError> {
        let h = self.target.config().hidden_size;
        let predict = |hidden: &[f32], token: u32| {
            self.predictor.predict(&crate::predictor::features(
                hidden,
                self.target.embed(),
                token,
                h,
            ))
        };
        Ok(PoolRoutes {
            root: predict(&self.root_hidden, self.root),
            nodes: pool.iter().map(|n| predict(&n.hidden, n.token)).collect(),
        })
    }

    fn resident(&self) -> Vec<Vec<u32>> {
        self.resident.clone()
    }
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

/// A source for rules that never ask for routes.
pub struct NoRoutes;

impl RouteSource for NoRoutes {
    fn routes(&mut self, _pool: &[DraftNode]) -> Result<PoolRoutes, EngineError> {
        Err(EngineError::BadMask {
            reason: "this verify rule needs routes but no route source was given".into(),
        })
    }
    fn resident(&self) -> Vec<Vec<u32>> {
        Vec::new()
    }
}

/// The vanilla EAGLE-3 rule: the `k` most probable nodes (ties by index).
#[derive(Debug, Clone, Copy)]
pub struct TopK(pub usize);

impl Verify for TopK {
    fn choose(
        &mut self,
        pool: &[DraftNode],
        _routes: &mut dyn RouteSource,
    ) -> Result<Vec<usize>, EngineError> {
        let mut order: Vec<usize> = (0..pool.len()).collect();
        order.sort_by(|&a, &b| pool[b].prob.total_cmp(&pool[a].prob).then(a.cmp(&b)));
        let mut chosen = vec![false; pool.len()];
        let mut picked = Vec::new();
        // Greedy among nodes whose parent is chosen, so the set is ancestor-closed.
        while picked.len() < self.0 {
            let next = order
                .iter()
                .copied()
                .find(|&i| !chosen[i] && pool[i].parent.is_none_or(|p| chosen[p]));
            let Some(i) = next else { break };
            chosen[i] = true;
            picked.push(i);
        }
        picked.sort_unstable();
        Ok(picked)
    }
}

/// Tree shape: `branching` children per expanded node, the `branching` best nodes of each level
/// expanded, `levels` levels (defaults 2 and 5: an 18-node pool).
#[derive(Debug, Clone, Copy)]
pub struct TreeShape {
    pub branching: usize,
    pub levels: usize,
}

impl Default for TreeShape {
    fn default() -> Self {
        TreeShape {
            branching: 2,
            levels: 5,
        }
    }
}

/// What a speculative generation produced and cost.
#[derive(Debug, Clone, Default)]
pub struct SpecReport {
    pub tokens: Vec<u32>,
    pub cycles: usize,
    /// Draft nodes verified, summed over cycles.
    pub verified_nodes: usize,
    /// Cycles that were plain decoding steps (bursts of an adaptive rule), included in `cycles`.
    pub plain_steps: usize,
    /// Tokens committed per cycle, summed (accepted drafts + bonus).
    pub committed: usize,
    pub draft_seconds: f64,
    pub select_seconds: f64,
    pub verify_seconds: f64,
    pub prefill_seconds: f64,
    /// Decode wall time, atlas routing excluded.
    pub decode_seconds: f64,
    /// Time spent computing atlas routes (outside the decode timer).
    pub atlas_seconds: f64,
    /// Expert copies of the prefill forward.
    pub prefill_copies: LayerStats,
    /// Expert copies while decoding (after the prefill).
    pub copies: LayerStats,
}

/// The drafter's state between cycles.
pub(crate) struct DraftState {
    pub(crate) kv: KvCache,
    /// Drafter cache entries of committed tokens (fewer than the target's after plain bursts,
    /// whose tokens the drafter skips; tree entries come after them).
    committed: usize,
    /// Last committed-position hidden output and logits (they predict level 1).
    hidden: Vec<f32>,
    logits: Vec<f32>,
}

/// Settings of one speculative generation.
#[derive(Debug, Clone, Default)]
pub struct SpecOptions {
    pub shape: TreeShape,
    /// At most this many new tokens.
    pub max_tokens: usize,
    /// Stop after emitting any of these.
    pub stop: Vec<u32>,
    /// How tokens are drawn (greedy or temperature/top-p) and the seed of the draws.
    pub sampling: Sampling,
    pub seed: u64,
    /// Called with every committed token as soon as its cycle is verified (for streaming).
    pub on_token: Option<TokenSink>,
}

/// A callback receiving committed tokens.
#[derive(Clone)]
pub struct TokenSink(pub std::sync::Arc<dyn Fn(u32) + Send + Sync>);

impl std::fmt::Debug for TokenSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TokenSink")
    }
}

/// Speculative generation after `prompt`, choosing verified nodes with `rule`.
pub fn generate_spec(
    target: &Qwen3Moe,
    drafter: &Eagle3,
    experts: &mut ExpertCache,
    routes: Routes<'_>,
    prompt: &[u32],
    rule: &mut dyn Verify,
    options: &SpecOptions,
) -> Result<SpecReport, EngineError> {
    let from = Start::Prompt(prompt);
    start_and_decode(target, drafter, experts, routes, from, rule, options)
}

/// [`generate_spec`] from a prompt prefilled once ([`Prefix::new`] with the drafter): runs the
/// last prompt token through `experts`, then decodes. Gives bit for bit what `generate_spec` on
/// the whole prompt gives; `prefill_seconds` and `prefill_copies` cover the last token only.
pub fn generate_spec_from(
    target: &Qwen3Moe,
    drafter: &Eagle3,
    experts: &mut ExpertCache,
    routes: Routes<'_>,
    prefix: &Prefix,
    rule: &mut dyn Verify,
    options: &SpecOptions,
) -> Result<SpecReport, EngineError> {
    let from = Start::Prefix(prefix);
    start_and_decode(target, drafter, experts, routes, from, rule, options)
}

/// Where a generation starts: a whole prompt, or a prompt prefilled once.
#[derive(Clone, Copy)]
enum Start<'a> {
    Prompt(&'a [u32]),
    Prefix(&'a Prefix),
}

/// Prefills (the whole prompt, or the last token of a prefix), then decodes.
fn start_and_decode(
    target: &Qwen3Moe,
    drafter: &Eagle3,
    experts: &mut ExpertCache,
    routes: Routes<'_>,
    from: Start<'_>,
    rule: &mut dyn Verify,
    options: &SpecOptions,
) -> Result<SpecReport, EngineError> {
    if options.max_tokens == 0 {
        return Ok(SpecReport::default());
    }
    let start = Instant::now();
    let stats_before = experts.stats().clone();
    // Prefill the target (with the drafter's taps) and the drafter (shifted by one token).
    let mut sampler = Sampler::new(options.sampling, options.seed);
    let state = match from {
        Start::Prompt(prompt) => prefill(target, drafter, experts, prompt, &mut sampler)?,
        Start::Prefix(prefix) => resume(target, drafter, experts, prefix, &mut sampler)?,
    };
    let prefill = (start.elapsed().as_secs_f64(), stats_before);
    decode(
        target, drafter, experts, routes, state, sampler, prefill, rule, options,
    )
}

/// The draft–select–verify loop after the prefill, from the target cache, the first token and
/// the drafter's state; `prefill` = (its seconds, the copy counters before it).
#[allow(clippy::too_many_arguments)]
fn decode(
    target: &Qwen3Moe,
    drafter: &Eagle3,
    experts: &mut ExpertCache,
    routes: Routes<'_>,
    (mut kv, mut root, mut draft): (KvCache, u32, DraftState),
    mut sampler: Sampler,
    (prefill_seconds, stats_before): (f64, crate::experts::CopyStats),
    rule: &mut dyn Verify,
    options: &SpecOptions,
) -> Result<SpecReport, EngineError> {
    let (shape, max_tokens, stop) = (options.shape, options.max_tokens, &options.stop[..]);
    let mut report = SpecReport {
        prefill_seconds,
        prefill_copies: experts.stats().since(&stats_before).total,
        ..SpecReport::default()
    };
    let stats_before = experts.stats().clone();
    report.tokens.push(root);
    if let Some(sink) = &options.on_token {
        (sink.0)(root);
    }
    let (mut atlas, predictor) = match routes {
        Routes::None => (None, None),
        Routes::Atlas(a) => (Some(a), None),
        Routes::Predictor(p) => (None, Some(p)),
    };
    let decode = Instant::now();
    while report.tokens.len() < max_tokens && !stop.contains(&root) {
        let burst = rule.plain_steps();
        if burst > 0 {
            let t0 = Instant::now();
            root = plain_burst(
                target,
                drafter,
                experts,
                (&mut kv, &mut draft),
                (root, burst),
                &mut sampler,
                options,
                &mut report,
            )?;
            report.verify_seconds += t0.elapsed().as_secs_f64();
            continue;
        }
        let n = kv.len(); // the root will sit at cache index / position n
        let t0 = Instant::now();
        let resident: Vec<Vec<u32>> = (0..target.config().moe_layers().len())
            .map(|l| experts.resident(l))
            .collect();
        let atlas_before = atlas.as_ref().map_or(0.0, |a| a.seconds);
        let (pool, chosen, t1, atlas_mid) = {
            let mut source: Box<dyn RouteSource + '_> = match atlas.as_deref_mut() {
                Some(a) => Box::new(AtlasView {
                    target,
                    atlas: a,
                    kv: &mut kv,
                    root,
                    resident,
                }),
                None => match predictor {
                    Some(predictor) => Box::new(PredictorView {
                        predictor,
                        target,
                        root,
                        root_hidden: draft.hidden.clone(),
                        resident,
                    }),
                    None => Box::new(NoRoutes),
                },
            };
            let pool = draft_tree(target, drafter, &mut draft, n, shape, &mut |p| {
                rule.keep_drafting(p, source.as_mut())
            })?;
            let t1 = Instant::now();
            let atlas_mid = source.atlas_seconds();
            let chosen = rule.choose(&pool, source.as_mut())?;
            (pool, chosen, t1, atlas_mid)
        };
        let t2 = Instant::now();
        let atlas_after = atlas.as_ref().map_or(0.0, |a| a.seconds);
        // Routes from the atlas are computed outside the timer, as in the paper.
        report.atlas_seconds += atlas_after - atlas_before;
        report.draft_seconds -= atlas_mid.unwrap_or(atlas_before) - atlas_before;
        report.select_seconds -= atlas_after - atlas_mid.unwrap_or(atlas_before);
        let tree = Tree {
            root,
            pool: &pool,
            chosen: &chosen,
        };
        let v = verify(target, drafter, experts, &mut kv, tree, &mut sampler)?;
        report.verify_seconds += t2.elapsed().as_secs_f64();
        report.draft_seconds += (t1 - t0).as_secs_f64();
        report.select_seconds += (t2 - t1).as_secs_f64();
        report.cycles += 1;
        report.verified_nodes += chosen.len();
        report.committed += v.committed.len();
        // The drafter learns the accepted tokens from the target's features along the path.
        advance_drafter(target, drafter, &mut draft, n, &v)?;
        let committed = v.committed;
        for tok in committed {
            if report.tokens.len() >= max_tokens {
                break;
            }
            report.tokens.push(tok);
            if let Some(sink) = &options.on_token {
                (sink.0)(tok);
            }
            root = tok;
            if stop.contains(&tok) {
                break;
            }
        }
    }
    report.decode_seconds = decode.elapsed().as_secs_f64() - report.atlas_seconds;
    report.copies = experts.stats().since(&stats_before).total;
    Ok(report)
}

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
    /// Wall time of the verify forward.
    pub seconds: f64,
}

/// Verifies `root` (at cache index and position `kv.len()`) plus the `chosen` pool nodes in one
/// target forward with a tree mask, accepts the longest path whose tokens equal the target's
/// argmax, and compacts `kv` to the prefix, the root and that path.
pub fn verify(
    target: &Qwen3Moe,
    drafter: &Eagle3,
    experts: &mut ExpertCache,
    kv: &mut KvCache,
    tree: Tree<'_>,
    sampler: &mut Sampler,
) -> Result<Verified, EngineError> {
    let Tree { root, pool, chosen } = tree;
    let n = kv.len();
    let row_of = |node: usize| chosen.iter().position(|&c| c == node).map(|i| i + 1);
    let mut tokens = vec![root];
    let mut parents = vec![None];
    let mut positions = vec![n];
    for &c in chosen {
        let parent = match pool[c].parent {
            None => 0,
            Some(p) => row_of(p).ok_or_else(|| EngineError::BadMask {
                reason: format!("chosen node {c} without its parent {p}"),
            })?,
        };
        tokens.push(pool[c].token);
        parents.push(Some(parent));
        positions.push(n + pool[c].depth);
    }
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
    let start = Instant::now();
    let mut out = target.forward(&batch, kv, experts)?;
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
    let seconds = start.elapsed().as_secs_f64();
    let demand = out.demand();
    kv.compact(n, &path.iter().map(|&r| n + r).collect::<Vec<_>>())?;
    let all = concat_taps(&out.taps, tokens.len(), h);
    let features = path
        .iter()
        .flat_map(|&r| all[r * 3 * h..(r + 1) * 3 * h].iter().copied())
        .collect();
    let mut committed: Vec<u32> = path[1..].iter().map(|&r| tokens[r]).collect();
    committed.push(bonus);
    Ok(Verified {
        accepted: path[1..].iter().map(|&r| chosen[r - 1]).collect(),
        committed,
        features,
        demand,
        read_rounds: out.copies.read_rounds(experts.read_width()),
        copies: out.copies.total,
        seconds,
    })
}

/// Prefills the target over `prompt` (with the drafter's taps) and the drafter with the same
/// features shifted by one token (drafter position `j` pairs the target's feature `j` with token
/// `j + 1`; the last pairs with the target's next token, the root). Returns the target's cache,
/// the root and the drafter state that predicts the root's children.
fn prefill(
    target: &Qwen3Moe,
    drafter: &Eagle3,
    experts: &mut ExpertCache,
    prompt: &[u32],
    sampler: &mut Sampler,
) -> Result<(KvCache, u32, DraftState), EngineError> {
    if prompt.is_empty() {
        return Err(EngineError::EmptyPrompt);
    }
    let mut kv = target.new_kv_cache();
    let batch = Batch {
        taps: drafter.taps(),
        logits: Logits::Last,
        ..Batch::causal(prompt)
    };
    let pre = target.forward(&batch, &mut kv, experts)?;
    let root = sampler.sample(pre.row(0));
    let features = concat_taps(&pre.taps, prompt.len(), target.config().hidden_size);
    let mut shifted: Vec<u32> = prompt[1..].to_vec();
    shifted.push(root);
    let draft = feed_drafter(
        target,
        drafter,
        drafter.new_kv_cache(),
        &shifted,
        &features,
        0,
    )?;
    Ok((kv, root, draft))
}

/// Up to `burst` plain decoding steps after `root` (one target forward each, one token drawn
/// exactly as plain decoding draws it), then the drafter learns the last new token only: the
/// burst's earlier positions stay out of its cache, which can only cost acceptance, never
/// exactness. Each step counts as a cycle that verified nothing. Returns the new root.
#[allow(clippy::too_many_arguments)]
fn plain_burst(
    target: &Qwen3Moe,
    drafter: &Eagle3,
    experts: &mut ExpertCache,
    (kv, draft): (&mut KvCache, &mut DraftState),
    (mut root, burst): (u32, usize),
    sampler: &mut Sampler,
    options: &SpecOptions,
    report: &mut SpecReport,
) -> Result<u32, EngineError> {
    let h = target.config().hidden_size;
    for step in 0..burst {
        if report.tokens.len() >= options.max_tokens || options.stop.contains(&root) {
            break;
        }
        let at = kv.len();
        let last = [root];
        let batch = Batch {
            taps: drafter.taps(),
            logits: Logits::Last,
            ..Batch::causal(&last)
        };
        let out = target.forward(&batch, kv, experts)?;
        let next = sampler.sample(out.row(0));
        report.cycles += 1;
        report.plain_steps += 1;
        report.committed += 1;
        report.tokens.push(next);
        if let Some(sink) = &options.on_token {
            (sink.0)(next);
        }
        let done = step + 1 == burst
            || report.tokens.len() >= options.max_tokens
            || options.stop.contains(&next);
        if done {
            let features = concat_taps(&out.taps, 1, h);
            draft.kv.truncate(draft.committed)?;
            let cache = std::mem::replace(&mut draft.kv, KvCache::new(0, 0, 0));
            *draft = feed_drafter(target, drafter, cache, &[next], &features, at)?;
        }
        root = next;
    }
    Ok(root)
}

/// Runs the prompt's last token on a copy of `prefix` (target with the drafter's taps, then the
/// drafter on the first generated token): the state [`prefill`] would have left.
fn resume(
    target: &Qwen3Moe,
    drafter: &Eagle3,
    experts: &mut ExpertCache,
    prefix: &Prefix,
    sampler: &mut Sampler,
) -> Result<(KvCache, u32, DraftState), EngineError> {
    let draft_kv = prefix
        .draft_kv
        .clone()
        .ok_or(EngineError::PrefixWithoutDrafter)?;
    let mut kv = prefix.target_kv.clone();
    let last = [prefix.last];
    let batch = Batch {
        taps: drafter.taps(),
        logits: Logits::Last,
        ..Batch::causal(&last)
    };
    let out = target.forward(&batch, &mut kv, experts)?;
    let root = sampler.sample(out.row(0));
    let features = concat_taps(&out.taps, 1, target.config().hidden_size);
    let at = prefix.prompt_len - 1;
    let draft = feed_drafter(target, drafter, draft_kv, &[root], &features, at)?;
    Ok((kv, root, draft))
}

/// After verifying at cache length `n`: drops the drafter's tree entries and feeds it the
/// committed tokens with the target's features along the accepted path.
fn advance_drafter(
    target: &Qwen3Moe,
    drafter: &Eagle3,
    draft: &mut DraftState,
    n: usize,
    v: &Verified,
) -> Result<(), EngineError> {
    draft.kv.truncate(draft.committed)?;
    let kv = std::mem::replace(&mut draft.kv, KvCache::new(0, 0, 0));
    *draft = feed_drafter(target, drafter, kv, &v.committed, &v.features, n)?;
    Ok(())
}

/// Per-token concatenation `[low | mid | high]` of the target's three taps (T × 3H).
pub(crate) fn concat_taps(taps: &[Vec<f32>], t: usize, h: usize) -> Vec<f32> {
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
    let out = drafter.forward_last(
        target.embed(),
        tokens,
        DraftHidden::Target(feats),
        Some(&positions),
        Mask::Causal,
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
fn draft_tree(
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
            &tokens,
            DraftHidden::Own(&hidden),
            Some(&positions),
            Mask::Explicit(&rows),
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

/// The expert cache's state before each probed verify forward.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeCache {
    /// Every other cycle starts from an emptied cache, the others from the LRU state decoding
    /// left: both ends a calibration needs.
    LruAndCleared,
    /// The cache as decoding left it, never emptied (with every expert fitting in the slots,
    /// the forwards become all-resident once the prompt's experts have been read).
    Lru,
}

/// What [`probe`] measures.
#[derive(Debug, Clone, Copy)]
pub struct ProbePlan {
    pub shape: TreeShape,
    /// Node counts cycle through `0..=max_nodes` (starting at `seed mod (max_nodes + 1)`).
    pub max_nodes: usize,
    pub cycles: usize,
    pub seed: u64,
    pub cache: ProbeCache,
}

/// One measured verify forward, for calibrating the cost model (`specfit calibrate`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProbeRow {
    pub nodes: usize,
    pub demand: u64,
    pub hits: u64,
    pub misses: u64,
    /// Read rounds ([`crate::experts::CopyStats::read_rounds`]).
    pub read_rounds: usize,
    pub ms: f64,
    /// Drafter forwards that drafted this cycle's levels past the first, and their time.
    pub draft_forwards: usize,
    pub draft_ms: f64,
    /// Committed tokens fed back to the drafter after the verify, and the time it took.
    pub fed: usize,
    pub feed_ms: f64,
    /// Tokens already in the target's KV cache (the context every verified token attends to).
    pub context: usize,
}

/// Decodes after `prompt` for `cycles` cycles, verifying each cycle a random ancestor-closed
/// subtree of the drafted pool whose size cycles through `0..=max_nodes` (a random subset of
/// each size), and measures each verify forward, from the cache states `plan.cache` names.
/// Committed tokens follow the target's greedy choices, as in real decoding.
pub fn probe(
    target: &Qwen3Moe,
    drafter: &Eagle3,
    experts: &mut ExpertCache,
    prompt: &[u32],
    plan: &ProbePlan,
) -> Result<Vec<ProbeRow>, EngineError> {
    let mut rng = specfit_selector::synth::Rng::new(plan.seed);
    let (max_nodes, cycles) = (plan.max_nodes, plan.cycles);
    let mut sampler = Sampler::new(Sampling::Greedy, 0);
    let (mut kv, mut root, mut draft) = prefill(target, drafter, experts, prompt, &mut sampler)?;
    let mut rows = Vec::with_capacity(cycles);
    for cycle in 0..cycles {
        let n = kv.len();
        let t0 = Instant::now();
        let pool = draft_tree(target, drafter, &mut draft, n, plan.shape, &mut |_| {
            Ok(true)
        })?;
        let draft_ms = t0.elapsed().as_secs_f64() * 1e3;
        let levels = pool.iter().map(|p| p.depth).max().unwrap_or(0);
        // Sizes cycle through 0..=K, offset by the seed so that short probes of many prompts
        // still cover every size.
        let want = (cycle / 2 + plan.seed as usize) % (max_nodes + 1);
        let chosen = random_subtree(&pool, want, &mut rng);
        if plan.cache == ProbeCache::LruAndCleared && cycle % 2 == 1 {
            experts.clear();
        }
        let tree = Tree {
            root,
            pool: &pool,
            chosen: &chosen,
        };
        let v = verify(target, drafter, experts, &mut kv, tree, &mut sampler)?;
        rows.push(ProbeRow {
            nodes: chosen.len(),
            demand: v.demand,
            hits: v.copies.hits,
            misses: v.copies.misses,
            read_rounds: v.read_rounds,
            ms: v.seconds * 1e3,
            draft_forwards: levels.saturating_sub(1),
            draft_ms,
            fed: v.committed.len(),
            feed_ms: 0.0,
            context: n,
        });
        let t1 = Instant::now();
        advance_drafter(target, drafter, &mut draft, n, &v)?;
        rows.last_mut().expect("pushed").feed_ms = t1.elapsed().as_secs_f64() * 1e3;
        root = *v.committed.last().expect("the bonus token");
    }
    Ok(rows)
}

/// A uniformly grown random ancestor-closed subtree of (at most) `size` nodes.
fn random_subtree(
    pool: &[DraftNode],
    size: usize,
    rng: &mut specfit_selector::synth::Rng,
) -> Vec<usize> {
    let mut chosen = vec![false; pool.len()];
    let mut picked = Vec::new();
    while picked.len() < size {
        let frontier: Vec<usize> = (0..pool.len())
            .filter(|&i| !chosen[i] && pool[i].parent.is_none_or(|p| chosen[p]))
            .collect();
        if frontier.is_empty() {
            break;
        }
        let i = frontier[rng.below(frontier.len())];
        chosen[i] = true;
        picked.push(i);
    }
    picked.sort_unstable();
    picked
}

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
    out: crate::batch::ForwardOutput,
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
    let (mut kv, mut root, mut draft) = prefill(target, drafter, experts, prompt, &mut sampler)?;
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
