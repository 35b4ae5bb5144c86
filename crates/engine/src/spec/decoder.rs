//! The decode loop, plain or speculative: a [`Decoder`] holds the target with its expert cache,
//! the speculation (EAGLE-3 drafter, verify policy, route source), the sampler and the options,
//! and its [`Decoder::step`] reads like the paper's algorithm box — draft, choose, verify,
//! advance the drafter, emit. Plain decoding is the same loop whose every step is
//! [`Decoder::commit_plain`], which also serves a policy's plain bursts.
//!
//! Why it is lossless: the target forward is batch-invariant and each emitted token is one draw
//! from the target's distribution in the same order as plain decoding draws it (argmax when
//! greedy; one temperature/top-p draw per token otherwise, see [`super::verify()`]), so the
//! output is token for token that of plain decoding with the same seed. Drafting, verifying and
//! routing live in their own modules; this one only sequences them.

use std::time::Instant;

use specfit_selector::{Decision, Pool, PoolBuilder, ResidentSet, VerifyPolicy};
use specfit_sim::CATCH_UP_TOKENS;

use crate::batch::{Batch, Logits};
use crate::cancel::Cancel;
use crate::config::Qwen3MoeConfig;
use crate::error::EngineError;
use crate::experts::{CopyStats, ExpertCache};
use crate::kv::KvCache;
use crate::model::{Eagle3, Qwen3Moe};
use crate::prefix::Prefix;
use crate::sampling::{Sampler, Sampling};

use super::draft::{
    advance_drafter, concat_taps, draft_tree, feed_drafter, learn, pool_depth, DraftNode,
    DraftState, TreeShape,
};
use super::routes::{CycleAt, PoolRoutes, Routes};
use super::stats::{Clock, DecodeStats, Phase};
use super::verify::{taken_children, verify, Tree, Verified};

/// Settings of one generation.
#[derive(Debug, Clone, Default)]
pub struct DecodeOptions {
    /// At most this many new tokens.
    pub max_tokens: usize,
    /// Stop after emitting any of these (the stop token is included in the output).
    pub stop: Vec<u32>,
    /// How tokens are drawn (greedy or temperature/top-p) and the seed of the draws.
    pub sampling: Sampling,
    pub seed: u64,
    /// Called with every committed token as soon as it is known (for streaming).
    pub on_token: Option<TokenSink>,
    /// Raised by someone else: stop after the cycle (or plain step) in progress.
    pub cancel: Cancel,
    /// Teacher forcing (plain decoding only): when not empty, the forward after the i-th emitted
    /// token is fed `feed[i]` instead of that token, so a benchmark decodes one fixed sequence
    /// whatever the model chooses (as llama-bench feeds its tokens). The tokens reported are
    /// still the ones chosen at each position. Needs at least `max_tokens - 1` ids.
    pub feed: Vec<u32>,
    /// The draft tree's shape (speculative decoding).
    pub shape: TreeShape,
    /// Before each verify forward, start reading every MoE layer's missing experts that the
    /// route source expects the root and the chosen nodes to route to
    /// ([`ExpertCache::read_ahead`]), so the layers' reads overlap instead of waiting one layer
    /// at a time. Needs a route source; outputs are unchanged (only copies move).
    pub read_ahead: bool,
}

/// A callback receiving committed tokens.
#[derive(Clone)]
pub struct TokenSink(pub std::sync::Arc<dyn Fn(u32) + Send + Sync>);

impl std::fmt::Debug for TokenSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TokenSink")
    }
}

/// The drafter side of speculative decoding: the EAGLE-3 drafter, the verify policy and where
/// draft-node routes come from.
pub struct Speculation<'a> {
    pub drafter: &'a Eagle3,
    pub policy: &'a mut VerifyPolicy,
    pub routes: Routes<'a>,
}

/// Where a generation starts: a whole prompt, or a prompt prefilled once ([`Prefix::new`], with
/// the drafter when speculating), whose last token the decoder runs itself — bit for bit what
/// starting from the whole prompt gives; the prefill figures then cover that last token only.
#[derive(Debug, Clone, Copy)]
pub enum Start<'a> {
    Prompt(&'a [u32]),
    Prefix(&'a Prefix),
}

impl Start<'_> {
    fn prompt_tokens(&self) -> usize {
        match self {
            Start::Prompt(p) => p.len(),
            Start::Prefix(prefix) => prefix.prompt_len,
        }
    }
}

/// Generates after `start`: plainly without `speculation` (or with a policy that does not
/// draft), else by draft–verify cycles.
pub fn generate(
    target: &Qwen3Moe,
    cache: &mut ExpertCache,
    speculation: Option<Speculation<'_>>,
    start: Start<'_>,
    options: &DecodeOptions,
) -> Result<DecodeStats, EngineError> {
    if options.max_tokens == 0 {
        return Ok(DecodeStats {
            prompt_tokens: start.prompt_tokens(),
            ..DecodeStats::default()
        });
    }
    let mut decoder = Decoder::start(target, cache, speculation, start, options)?;
    while !decoder.done() {
        decoder.step()?;
    }
    Ok(decoder.finish())
}

/// One generation in progress (see the module docs).
pub struct Decoder<'a> {
    target: &'a Qwen3Moe,
    cache: &'a mut ExpertCache,
    speculation: Option<Speculation<'a>>,
    options: &'a DecodeOptions,
    sampler: Sampler,
    /// The target's cache over every committed token but the newest.
    kv: KvCache,
    /// The newest committed token, not yet seen by the target: the next tree's root.
    root: u32,
    /// The drafter's state (when speculating).
    draft: Option<DraftState>,
    /// Plain-burst tokens the drafter has not learned yet (when speculating): it learns them
    /// when drafting resumes, inside that cycle's clock, so the policy sees what switching back
    /// costs.
    unlearned: Option<Unlearned>,
    stats: DecodeStats,
    /// Copy counters when decoding began (after the prefill).
    copies_before: CopyStats,
    decode_started: Instant,
}

/// Plain-burst tokens waiting for the drafter: `tokens[i]` followed position `first + i`, whose
/// target features are `features[i·3H..(i+1)·3H]`.
struct Unlearned {
    first: usize,
    tokens: Vec<u32>,
    features: Vec<f32>,
}

impl Unlearned {
    /// Drops all but the latest `n` tokens (once there are more than `n`).
    fn keep_latest(&mut self, n: usize) {
        let drop = self.tokens.len().saturating_sub(n);
        if drop > 0 {
            let width = self.features.len() / self.tokens.len();
            self.tokens.drain(..drop);
            self.features.drain(..drop * width);
            self.first += drop;
        }
    }

    /// Keeps at least the latest `n` tokens and at most `2n`: trims to `n` once there are `2n`
    /// (one copy of the features per `n` tokens; trimming to `n` at every token would copy them
    /// at every plain step, a few percent of a step where every expert is resident).
    fn bound(&mut self, n: usize) {
        if self.tokens.len() >= 2 * n.max(1) {
            self.keep_latest(n);
        }
    }
}

impl<'a> Decoder<'a> {
    /// Prefills from `start` and emits the first token.
    pub fn start(
        target: &'a Qwen3Moe,
        cache: &'a mut ExpertCache,
        speculation: Option<Speculation<'a>>,
        start: Start<'_>,
        options: &'a DecodeOptions,
    ) -> Result<Decoder<'a>, EngineError> {
        let speculation = speculation.filter(|s| s.policy.drafts());
        check_feed(options, speculation.is_some())?;
        let tree = if speculation.is_some() {
            options.shape.levels
        } else {
            0
        };
        check_context(
            target.config(),
            start.prompt_tokens(),
            options.max_tokens,
            tree,
        )?;
        let mut sampler = Sampler::new(options.sampling, options.seed);
        let (started, before) = (Instant::now(), cache.stats().clone());
        let drafter = speculation.as_ref().map(|s| s.drafter);
        let (kv, root, draft) = prefill(target, drafter, cache, start, &mut sampler)?;
        let mut stats = DecodeStats {
            prompt_tokens: start.prompt_tokens(),
            prefill_seconds: started.elapsed().as_secs_f64(),
            prefill_copies: cache.stats().since(&before).total,
            ..DecodeStats::default()
        };
        stats.tokens.push(root);
        if let Some(sink) = &options.on_token {
            (sink.0)(root);
        }
        Ok(Decoder {
            copies_before: cache.stats().clone(),
            target,
            cache,
            speculation,
            options,
            sampler,
            kv,
            root,
            draft,
            unlearned: None,
            stats,
            decode_started: Instant::now(),
        })
    }

    /// Whether the generation is over: `max_tokens` emitted, a stop token, or cancelled.
    pub fn done(&self) -> bool {
        self.stats.tokens.len() >= self.options.max_tokens
            || self.options.stop.contains(&self.root)
            || self.options.cancel.is_cancelled()
    }

    /// One cycle: a plain step (or a policy's plain burst), or draft → choose → verify →
    /// advance the drafter → emit.
    pub fn step(&mut self) -> Result<(), EngineError> {
        let burst = match self.speculation.as_mut() {
            Some(s) => s.policy.take_burst(),
            None => 1,
        };
        if burst > 0 {
            return self.commit_plain(burst);
        }
        // One token left: a cycle would commit it from the root alone, after drafting for
        // nothing. Decode it plainly.
        if self.tokens_left() <= 1 {
            return self.commit_plain(1);
        }
        let mut clock = Clock::start(self.outside_clock_seconds());
        let filling = self.cache.filling();
        self.catch_up_drafter(&mut clock)?;
        let Drafted {
            pool,
            chosen,
            routes,
        } = self.draft_and_choose(&mut clock)?;
        self.read_ahead(routes.as_ref(), &chosen);
        let verified = self.verify(&pool, &chosen)?;
        self.advance_drafter(&verified)?;
        clock.lap(Phase::Verify, self.outside_clock_seconds(), &mut self.stats);
        let committed = verified.committed.len();
        if let Some(s) = self.speculation.as_mut() {
            s.policy.slots_filling(filling);
            s.policy.observe_cycle(committed, clock.total_ms());
            for c in taken_children(&pool, &verified) {
                s.policy.record_taken(c.q, c.top, c.taken);
            }
        }
        self.stats
            .count_cycle(chosen.len(), pool_depth(&pool), committed);
        self.emit(&verified.committed);
        Ok(())
    }

    /// Tokens still to emit before `max_tokens`.
    fn tokens_left(&self) -> usize {
        self.options
            .max_tokens
            .saturating_sub(self.stats.tokens.len())
    }

    /// Up to `burst` plain decoding steps (one target forward each, one token drawn exactly as
    /// plain decoding draws it). When speculating, each new token is kept with the target's
    /// features at the position before it, for the drafter to learn when drafting resumes (as
    /// after a verified cycle): the latest [`CATCH_UP_TOKENS`] of them, so its recent context
    /// has no gaps.
    pub fn commit_plain(&mut self, burst: usize) -> Result<(), EngineError> {
        let mut clock = Clock::start(self.outside_clock_seconds());
        let h = self.target.config().hidden_size;
        let learning = self.speculation.is_some() && self.draft.is_some();
        let taps = match (learning, self.speculation.as_ref().map(|s| s.drafter)) {
            (true, Some(drafter)) => drafter.taps(),
            _ => &[],
        };
        for step in 0..burst {
            if step > 0 && self.done() {
                // The generation ended first: the policy keeps the rest for the next one.
                if let Some(s) = self.speculation.as_mut() {
                    s.policy.keep_burst(burst - step);
                }
                break;
            }
            let at = self.kv.len();
            let fed = self.stats.tokens.len() - 1;
            let input = [self.options.feed.get(fed).copied().unwrap_or(self.root)];
            let batch = Batch::causal(&input)
                .with_taps(taps)
                .with_logits(Logits::Last);
            let out = self.target.forward(&batch, &mut self.kv, self.cache)?;
            let next = self.sampler.sample(out.row(0));
            self.stats.count_plain_step();
            self.emit(&[next]);
            if learning {
                let u = self.unlearned.get_or_insert_with(|| Unlearned {
                    first: at,
                    tokens: Vec::new(),
                    features: Vec::new(),
                });
                u.tokens.push(next);
                u.features.extend(concat_taps(&out.taps, 1, h));
                u.bound(CATCH_UP_TOKENS);
            }
            // One lap per step. The policy hears of every step but the first, which pays for
            // what the cycle before it left in the processor's caches.
            let seconds = clock.lap(Phase::Verify, self.outside_clock_seconds(), &mut self.stats);
            if let (true, Some(s)) = (step > 0, self.speculation.as_mut()) {
                s.policy.observe_plain(1, 1e3 * seconds);
            }
        }
        Ok(())
    }

    /// The drafter learns the plain-burst tokens it has not seen, in one forward (timed as
    /// drafting, in the cycle that needs it).
    fn catch_up_drafter(&mut self, clock: &mut Clock) -> Result<(), EngineError> {
        let (Some(mut u), Some(s), Some(draft)) = (
            self.unlearned.take(),
            &self.speculation,
            self.draft.as_mut(),
        ) else {
            return Ok(());
        };
        u.keep_latest(CATCH_UP_TOKENS);
        learn(
            self.target,
            s.drafter,
            draft,
            &u.tokens,
            &u.features,
            u.first,
        )?;
        clock.lap(Phase::Draft, self.outside_clock_seconds(), &mut self.stats);
        Ok(())
    }

    /// What the generation produced and cost.
    pub fn finish(mut self) -> DecodeStats {
        let decode = self.decode_started.elapsed().as_secs_f64();
        self.stats.decode_seconds = decode - self.stats.atlas_seconds;
        self.stats.copies = self.cache.stats().since(&self.copies_before).total;
        self.stats
    }

    fn outside_clock_seconds(&self) -> f64 {
        self.speculation
            .as_ref()
            .map_or(0.0, |s| s.routes.outside_clock_seconds())
    }

    /// Drafts the pool level by level, asking the policy after each whether to go on, until it
    /// chooses the nodes to verify. Returns the pool, the chosen nodes and the latest routes.
    fn draft_and_choose(&mut self, clock: &mut Clock) -> Result<Drafted, EngineError> {
        // A cycle commits at most one token per drafted level and the bonus token: levels past
        // the tokens left would be drafted for nothing.
        let shape = TreeShape {
            levels: self.options.shape.levels.min(self.tokens_left() - 1),
            ..self.options.shape
        };
        let spec = self.speculation.as_mut().expect("speculating");
        let draft = self.draft.as_mut().expect("speculating");
        let n = self.kv.len();
        let resident = match spec.policy.uses_residency() {
            true => Some(resident_set(self.target, self.cache)?),
            false => None,
        };
        let mut chooser = Chooser {
            policy: &mut *spec.policy,
            routes: &mut spec.routes,
            at: CycleAt {
                target: self.target,
                kv: &mut self.kv,
                root: self.root,
                root_hidden: &draft.hidden.clone(),
            },
            resident,
            latest: None,
            clock,
            stats: &mut self.stats,
        };
        let mut chosen = None;
        let target = self.target;
        let pool = draft_tree(
            target,
            spec.drafter,
            draft,
            n,
            shape,
            &mut |pool| match chooser.decide(pool, true)? {
                Decision::Draft => Ok(true),
                Decision::Verify(nodes) => {
                    chosen = Some(nodes);
                    Ok(false)
                }
            },
        )?;
        let chosen = match chosen {
            Some(nodes) => nodes,
            None => match chooser.decide(&pool, false)? {
                Decision::Verify(nodes) => nodes,
                Decision::Draft => unreachable!("a policy verifies when no level is left"),
            },
        };
        Ok(Drafted {
            routes: chooser.latest,
            pool,
            chosen,
        })
    }

    /// Starts reading the experts `routes` expects the verify forward to need (`read_ahead`).
    fn read_ahead(&mut self, routes: Option<&PoolRoutes>, chosen: &[usize]) {
        if let (true, Some(routes)) = (self.options.read_ahead, routes) {
            self.cache.read_ahead(&expected_experts(routes, chosen));
        }
    }

    /// One tree-masked target forward over the root and the chosen nodes, and the walk that
    /// accepts the longest path the target agrees with.
    fn verify(&mut self, pool: &[DraftNode], chosen: &[usize]) -> Result<Verified, EngineError> {
        let drafter = self.speculation.as_ref().expect("speculating").drafter;
        let tree = Tree {
            root: self.root,
            pool,
            chosen,
        };
        let (kv, sampler) = (&mut self.kv, &mut self.sampler);
        verify(self.target, drafter, self.cache, kv, tree, sampler)
    }

    /// The drafter learns the committed tokens from the target's features along the path.
    fn advance_drafter(&mut self, verified: &Verified) -> Result<(), EngineError> {
        let drafter = self.speculation.as_ref().expect("speculating").drafter;
        let draft = self.draft.as_mut().expect("speculating");
        let n = self.kv.len() - verified.committed.len();
        advance_drafter(self.target, drafter, draft, n, verified)
    }

    /// Appends committed tokens to the output (up to `max_tokens`, through a stop token),
    /// telling the sink of each; the last one appended becomes the root.
    fn emit(&mut self, committed: &[u32]) {
        for &tok in committed {
            if self.stats.tokens.len() >= self.options.max_tokens {
                break;
            }
            self.stats.tokens.push(tok);
            if let Some(sink) = &self.options.on_token {
                (sink.0)(tok);
            }
            self.root = tok;
            if self.options.stop.contains(&tok) {
                break;
            }
        }
    }
}

/// A cycle's drafted pool, the nodes chosen to verify and the routes the choice saw.
struct Drafted {
    pool: Vec<DraftNode>,
    chosen: Vec<usize>,
    routes: Option<PoolRoutes>,
}

/// Asks the verify policy after each drafted level, on the routes the cycle's route source
/// gives, timing drafting and deciding apart.
struct Chooser<'c, 'r> {
    policy: &'c mut VerifyPolicy,
    routes: &'c mut Routes<'r>,
    at: CycleAt<'c>,
    resident: Option<ResidentSet>,
    /// The routes of the latest decision (the pool so far), when the policy needs routes.
    latest: Option<PoolRoutes>,
    clock: &'c mut Clock,
    stats: &'c mut DecodeStats,
}

impl Chooser<'_, '_> {
    /// The policy's decision on `pool`; `more`: whether another level could be drafted.
    fn decide(&mut self, pool: &[DraftNode], more: bool) -> Result<Decision, EngineError> {
        let outside = self.routes.outside_clock_seconds();
        self.clock.lap(Phase::Draft, outside, self.stats);
        let p = self.selector_pool(pool)?;
        let searched = Instant::now();
        let decision = self.policy.decide(&p, self.resident.as_ref(), more)?;
        if self.policy.needs_routes() {
            // The policies that need routes are those that search.
            let us = searched.elapsed().as_secs_f64() * 1e6;
            self.stats.select_us.push(us);
        }
        let outside = self.routes.outside_clock_seconds();
        self.clock.lap(Phase::Select, outside, self.stats);
        Ok(decision)
    }

    /// The selector's pool of `pool` at the cycle's context: with routes when the policy needs
    /// them, else parent links and path probabilities over empty routes.
    fn selector_pool(&mut self, pool: &[DraftNode]) -> Result<Pool, EngineError> {
        let num_experts = self.at.target.config().num_experts;
        let context = self.at.kv.len();
        if !self.policy.needs_routes() {
            let none: [&[u32]; 1] = [&[]];
            let mut b = PoolBuilder::new(1, num_experts)?;
            for node in pool {
                b.push(node.parent, node.prob.clamp(0.0, 1.0), &none)?;
            }
            b.context(context);
            return Ok(b.build());
        }
        let routes = self.routes.route(&mut self.at, pool, self.latest.take())?;
        let mut b = PoolBuilder::new(routes.root.len(), num_experts)?;
        b.root_routes(&routes.root)?.context(context);
        let nodes: Vec<_> = pool.iter().map(|n| (n.parent, n.edge, n.prob)).collect();
        let probs = self.policy.path_probs(&nodes);
        for ((node, r), p) in pool.iter().zip(&routes.nodes).zip(probs) {
            b.push(node.parent, p.clamp(0.0, 1.0), r)?;
        }
        self.latest = Some(routes);
        Ok(b.build())
    }
}

/// The experts resident in each MoE layer's slots right now, as the selector reads them.
fn resident_set(target: &Qwen3Moe, cache: &ExpertCache) -> Result<ResidentSet, EngineError> {
    let layers = target.config().moe_layers().len();
    let lists: Vec<Vec<u32>> = (0..layers).map(|l| cache.resident(l)).collect();
    Ok(ResidentSet::new(
        layers,
        target.config().num_experts,
        &lists,
    )?)
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

/// Refuses a teacher-forced decode with fewer fed ids than forwards after the prefill, or one
/// that speculates (drafts would be verified against tokens the target did not choose).
/// Refuses a decode that would run past the model's positions: the `prompt`, `max_tokens` new
/// tokens and the `tree` levels a draft tree needs below the last one (0 for plain decoding).
/// Checked arithmetic: no count wraps around.
pub fn check_context(
    cfg: &Qwen3MoeConfig,
    prompt: usize,
    max_tokens: usize,
    tree: usize,
) -> Result<(), EngineError> {
    let context = cfg.max_position_embeddings;
    let needed = prompt
        .checked_add(max_tokens)
        .and_then(|n| n.checked_add(tree));
    match needed {
        Some(n) if n <= context => Ok(()),
        _ => Err(EngineError::ContextExceeded {
            prompt,
            max_tokens,
            tree,
            context,
        }),
    }
}

fn check_feed(options: &DecodeOptions, speculating: bool) -> Result<(), EngineError> {
    let needed = options.max_tokens.saturating_sub(1);
    if options.feed.is_empty() {
        Ok(())
    } else if speculating {
        Err(EngineError::FeedWhileSpeculating)
    } else if options.feed.len() >= needed {
        Ok(())
    } else {
        Err(EngineError::FeedTooShort {
            feed: options.feed.len(),
            needed,
        })
    }
}

/// Runs the prompt (or a prefix's last token) through the target — with the drafter's taps when
/// speculating — draws the first token (the root), and feeds the drafter the same features
/// shifted by one token (drafter position `j` pairs the target's feature `j` with token `j + 1`;
/// the last pairs with the root). Returns the target's cache, the root and the drafter state
/// that predicts the root's children.
pub(crate) fn prefill(
    target: &Qwen3Moe,
    drafter: Option<&Eagle3>,
    cache: &mut ExpertCache,
    start: Start<'_>,
    sampler: &mut Sampler,
) -> Result<(KvCache, u32, Option<DraftState>), EngineError> {
    let (mut kv, fresh, draft_kv) = match start {
        Start::Prompt([]) => return Err(EngineError::EmptyPrompt),
        Start::Prompt(prompt) => (
            target.new_kv_cache(),
            prompt,
            drafter.map(Eagle3::new_kv_cache),
        ),
        Start::Prefix(prefix) => {
            let draft_kv = match drafter {
                Some(_) => Some(
                    prefix
                        .draft_kv
                        .clone()
                        .ok_or(EngineError::PrefixWithoutDrafter)?,
                ),
                None => None,
            };
            let last = std::slice::from_ref(&prefix.last);
            (prefix.target_kv.clone(), last, draft_kv)
        }
    };
    let first = kv.len();
    let batch = Batch::causal(fresh)
        .with_taps(drafter.map_or(&[], Eagle3::taps))
        .with_logits(Logits::Last);
    let out = target.forward(&batch, &mut kv, cache)?;
    let root = sampler.sample(out.row(0));
    let draft = match (drafter, draft_kv) {
        (Some(drafter), Some(draft_kv)) => {
            let features = concat_taps(&out.taps, fresh.len(), target.config().hidden_size);
            let mut shifted = fresh[1..].to_vec();
            shifted.push(root);
            Some(feed_drafter(
                target, drafter, draft_kv, &shifted, &features, first,
            )?)
        }
        _ => None,
    };
    Ok((kv, root, draft))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unlearned_tokens_keep_the_latest_with_their_features_and_positions() {
        let mut u = Unlearned {
            first: 10,
            tokens: vec![1, 2, 3, 4, 5],
            features: (0..10).map(|f| f as f32).collect(), // 2 values per token
        };
        u.keep_latest(8);
        assert_eq!((u.first, u.tokens.len()), (10, 5), "fewer than 8: all kept");
        u.keep_latest(2);
        assert_eq!(u.first, 13);
        assert_eq!(u.tokens, [4, 5]);
        assert_eq!(u.features, [6.0, 7.0, 8.0, 9.0]);
    }

    #[test]
    fn bounded_unlearned_tokens_trim_only_when_twice_the_bound_and_keep_the_latest() {
        let mut u = Unlearned {
            first: 0,
            tokens: Vec::new(),
            features: Vec::new(),
        };
        for t in 0..7u32 {
            u.tokens.push(t);
            u.features.push(t as f32);
            u.bound(3);
            // Never fewer than the 3 latest, never 6 or more.
            assert!(u.tokens.len() >= 3.min(t as usize + 1) && u.tokens.len() < 6);
            assert_eq!(*u.tokens.last().unwrap(), t);
            assert_eq!(u.first + u.tokens.len(), t as usize + 1);
        }
        // Trimmed at the 6th token (to 3), then grew again to 4.
        assert_eq!(u.tokens, [3, 4, 5, 6]);
        assert_eq!(u.features, [3.0, 4.0, 5.0, 6.0]);
    }
}
