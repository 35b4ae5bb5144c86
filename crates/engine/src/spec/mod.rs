//! EAGLE-3 tree speculative decoding on the offloaded engine: draft a tree with the drafter
//! (EAGLE-2/3 dynamic expansion), let a [`SpecRule`] choose the part to verify, verify it in
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
//!
//! Parts: `draft` (the drafter's tree and its cache), `verify` (one tree-masked target forward and
//! the walk that accepts), `routes` (where draft-node routes come from), `probe` (measured verify
//! forwards for calibration), `walk` (recording traces and route samples); this file holds the
//! decode loop.

mod draft;
mod probe;
mod routes;
mod verify;
mod walk;

pub use draft::concat_taps;
pub(crate) use draft::feed_drafter;
pub use draft::top_children;
use draft::{advance_drafter, draft_tree};
pub use probe::{probe, PlainStep, ProbePlan, ProbeRow, Probed};
use routes::route_source;
pub use routes::{Atlas, NoRoutes, PoolRoutes, RouteSource, Routes};
pub use verify::{verify, Tree, Verified};
pub use walk::{collect_route_samples, record};

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

/// A speculative decoding rule: how deep to draft, which drafted nodes to verify (given the pool,
/// parents before children: the chosen ancestor-closed node indices, ascending; empty = the root
/// alone) and when to decode plainly instead. The verify forward itself is [`verify`].
pub trait SpecRule {
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

/// The vanilla EAGLE-3 rule: the `k` most probable nodes (ties by index). Drafting stops as soon
/// as no deeper level can change them ([`specfit_selector::subtree::top_k_settled`]): the same
/// nodes are verified as after drafting every level, with fewer drafter forwards.
#[derive(Debug, Clone, Copy)]
pub struct TopK(pub usize);

impl SpecRule for TopK {
    fn keep_drafting(
        &mut self,
        pool: &[DraftNode],
        _routes: &mut dyn RouteSource,
    ) -> Result<bool, EngineError> {
        let (parents, probs) = links(pool);
        let depth = pool_depth(pool);
        let newest: Vec<usize> = (0..pool.len())
            .filter(|&i| pool[i].depth == depth)
            .collect();
        Ok(!specfit_selector::subtree::top_k_settled(
            &parents, &probs, self.0, &newest,
        ))
    }

    fn choose(
        &mut self,
        pool: &[DraftNode],
        _routes: &mut dyn RouteSource,
    ) -> Result<Vec<usize>, EngineError> {
        let (parents, probs) = links(pool);
        Ok(specfit_selector::subtree::top_k_closed(
            &parents, &probs, self.0,
        ))
    }
}

/// A pool's parent links and path probabilities, as the selector's subtree functions take them.
fn links(pool: &[DraftNode]) -> (Vec<Option<usize>>, Vec<f64>) {
    pool.iter().map(|n| (n.parent, n.prob)).unzip()
}

/// The levels drafted in a pool: its deepest node's depth (0 when empty).
fn pool_depth(pool: &[DraftNode]) -> usize {
    pool.iter().map(|n| n.depth).max().unwrap_or(0)
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
    /// Levels drafted (the pool's depth), summed over cycles.
    pub drafted_levels: usize,
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
    /// Before each verify forward, start reading every MoE layer's missing experts that the
    /// route source expects the root and the chosen nodes to route to
    /// ([`ExpertCache::read_ahead`]), so that the layers' reads overlap instead of waiting
    /// one layer at a time. Needs a route source; outputs are unchanged (only copies move).
    pub read_ahead: bool,
    /// Raised by someone else: stop after the cycle (or plain step) in progress.
    pub cancel: crate::cancel::Cancel,
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
    rule: &mut dyn SpecRule,
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
    rule: &mut dyn SpecRule,
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
    rule: &mut dyn SpecRule,
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
    rule: &mut dyn SpecRule,
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
    while report.tokens.len() < max_tokens
        && !stop.contains(&root)
        && !options.cancel.is_cancelled()
    {
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
        let started = Instant::now();
        let resident: Vec<Vec<u32>> = (0..target.config().moe_layers().len())
            .map(|l| experts.resident(l))
            .collect();
        let (pool, chosen, times, wanted) = {
            let mut source = route_source(
                target,
                atlas.as_deref_mut(),
                predictor,
                &mut kv,
                (root, &draft.hidden),
                resident,
            );
            let phase = Phase { started, shape, n };
            let (pool, chosen, times) =
                draft_and_choose(target, drafter, &mut draft, phase, rule, source.as_mut())?;
            let wanted = match source.latest() {
                Some(routes) if options.read_ahead => expected_experts(routes, &chosen),
                _ => Vec::new(),
            };
            (pool, chosen, times, wanted)
        };
        report.draft_seconds += times.draft;
        report.select_seconds += times.select;
        report.atlas_seconds += times.outside;
        let t = Instant::now();
        experts.read_ahead(&wanted);
        let tree = Tree {
            root,
            pool: &pool,
            chosen: &chosen,
        };
        let v = verify(target, drafter, experts, &mut kv, tree, &mut sampler)?;
        report.verify_seconds += t.elapsed().as_secs_f64();
        report.cycles += 1;
        report.verified_nodes += chosen.len();
        report.drafted_levels += pool_depth(&pool);
        report.committed += v.committed.len();
        // The drafter learns the accepted tokens from the target's features along the path.
        advance_drafter(target, drafter, &mut draft, n, &v)?;
        root = emit(&mut report, &v.committed, options).unwrap_or(root);
    }
    report.decode_seconds = decode.elapsed().as_secs_f64() - report.atlas_seconds;
    report.copies = experts.stats().since(&stats_before).total;
    Ok(report)
}

/// Per MoE layer, the experts `routes` expects the verify forward of the root and the `chosen`
/// nodes to use: the root's first, then each chosen node's, without repeats.
fn expected_experts(routes: &PoolRoutes, chosen: &[usize]) -> Vec<Vec<u32>> {
    (0..routes.root.len())
        .map(|layer| {
            let mut list: Vec<u32> = Vec::new();
            let nodes = chosen.iter().filter_map(|&i| routes.nodes.get(i));
            for &e in std::iter::once(&routes.root)
                .chain(nodes)
                .flat_map(|r| &r[layer])
            {
                if !list.contains(&e) {
                    list.push(e);
                }
            }
            list
        })
        .collect()
}

/// Where a cycle's drafting starts: its start time, the tree shape and the root's position.
struct Phase {
    started: Instant,
    shape: TreeShape,
    n: usize,
}

/// Seconds of a cycle's drafting and selection inside the clock, and its routing outside it.
struct PhaseTimes {
    draft: f64,
    select: f64,
    outside: f64,
}

/// Drafts the pool (asking `rule` after each level whether to go on), then lets `rule` choose
/// the subtree to verify, both on `source`'s routes. Routing outside the clock (the atlas) is
/// taken out of the phase it happened in.
fn draft_and_choose(
    target: &Qwen3Moe,
    drafter: &Eagle3,
    draft: &mut DraftState,
    phase: Phase,
    rule: &mut dyn SpecRule,
    source: &mut dyn RouteSource,
) -> Result<(Vec<DraftNode>, Vec<usize>, PhaseTimes), EngineError> {
    let before = source.outside_clock_seconds();
    let pool = draft_tree(target, drafter, draft, phase.n, phase.shape, &mut |p| {
        rule.keep_drafting(p, &mut *source)
    })?;
    let (drafted, mid) = (Instant::now(), source.outside_clock_seconds());
    let chosen = rule.choose(&pool, &mut *source)?;
    let (chosen_at, after) = (Instant::now(), source.outside_clock_seconds());
    let times = PhaseTimes {
        draft: (drafted - phase.started).as_secs_f64() - (mid - before),
        select: (chosen_at - drafted).as_secs_f64() - (after - mid),
        outside: after - before,
    };
    Ok((pool, chosen, times))
}

/// Appends committed tokens to the output (up to `max_tokens`, through a stop token), telling
/// the sink of each; returns the last one appended.
fn emit(report: &mut SpecReport, committed: &[u32], options: &SpecOptions) -> Option<u32> {
    let mut last = None;
    for &tok in committed {
        if report.tokens.len() >= options.max_tokens {
            break;
        }
        report.tokens.push(tok);
        if let Some(sink) = &options.on_token {
            (sink.0)(tok);
        }
        last = Some(tok);
        if options.stop.contains(&tok) {
            break;
        }
    }
    last
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
        let done = report.tokens.len() >= options.max_tokens || options.stop.contains(&root);
        if done || options.cancel.is_cancelled() {
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
