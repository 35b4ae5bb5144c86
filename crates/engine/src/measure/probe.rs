//! Measured verify forwards for calibrating the cost model (`specfit calibrate`): random
//! ancestor-closed subtrees of each size from chosen cache states, then plain steps, and the
//! drafter's acceptance along both. It does not fit.

use std::time::Instant;

use specfit_selector::Acceptance;

use super::greedy_start;
use crate::batch::{Batch, Logits};
use crate::error::EngineError;
use crate::experts::ExpertCache;
use crate::kv::KvCache;
use crate::model::{Eagle3, Qwen3Moe};
use crate::sampling::{Sampler, Sampling};
use crate::spec::{
    advance_drafter, concat_taps, draft_tree, learn, pool_depth, taken_along, taken_children,
    verify, DraftNode, Tree, TreeShape,
};

/// What [`probe`] measures.
#[derive(Debug, Clone, Copy)]
pub struct ProbePlan {
    pub shape: TreeShape,
    /// Node counts cycle through `0..=max_nodes` (starting at `seed mod (max_nodes + 1)`).
    pub max_nodes: usize,
    pub cycles: usize,
    /// Timed plain one-token forwards after the cycles, on the same sequence (no second
    /// prefill: at paper scale on the disk tier a prefill reads most of the file).
    pub plain: usize,
    pub seed: u64,
}

/// What [`probe`] measured on one prompt.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Probed {
    /// One row per verify cycle.
    pub verify: Vec<ProbeRow>,
    /// The plain steps after the cycles.
    pub plain: Vec<PlainStep>,
    /// How often the target took the drafted children of the nodes it reached.
    pub acceptance: Acceptance,
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
    /// Reads that waited for a slot ([`crate::experts::LayerStats::slot_waits`]).
    pub slot_waits: u64,
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
/// each size), and measures each verify forward. Committed tokens follow the target's greedy
/// choices, as in real decoding. The forwards run on `cache`, the cache decoding keeps and
/// never empties (its steady state of hits and misses); with `emptied` (a cache in
/// [`crate::experts::CacheMode::NoCache`]) every other one runs there instead, every
/// expert a miss: both ends a calibration needs. (Emptying the decoding cache itself would leave
/// the next cycle a nearly empty cache, never the steady state.) Then `plan.plain` greedy
/// one-token forwards continue the same sequence, alternating between the two caches the same
/// way.
pub fn probe(
    target: &Qwen3Moe,
    drafter: &Eagle3,
    cache: &mut ExpertCache,
    mut emptied: Option<&mut ExpertCache>,
    prompt: &[u32],
    plan: &ProbePlan,
) -> Result<Probed, EngineError> {
    // Each cycle commits at least one token: refuse up front a plan that cannot fit in the
    // context even so, rather than at its last position (a run that accepts many tokens per
    // cycle may still reach the end of the context, and stops there with `PastContext`).
    let least = plan.cycles.saturating_add(plan.plain);
    crate::spec::check_context(target.config(), prompt.len(), least, plan.shape.levels)?;
    let mut rng = specfit_selector::synth::Rng::new(plan.seed);
    let (max_nodes, cycles) = (plan.max_nodes, plan.cycles);
    let mut sampler = Sampler::new(Sampling::Greedy, 0);
    let (mut kv, mut root, mut draft) = greedy_start(target, drafter, cache, prompt)?;
    let mut rows = Vec::new();
    let mut acceptance = Acceptance::new();
    for cycle in 0..cycles {
        let n = kv.len();
        let t0 = Instant::now();
        let pool = draft_tree(target, drafter, &mut draft, n, plan.shape, &mut |_| {
            Ok(true)
        })?;
        let draft_ms = t0.elapsed().as_secs_f64() * 1e3;
        let levels = pool_depth(&pool);
        let want = probe_size(cycle, plan.seed, cycles, max_nodes);
        let chosen = random_subtree(&pool, want, &mut rng);
        let run_on = every_other(cache, emptied.as_deref_mut(), cycle);
        let tree = Tree {
            root,
            pool: &pool,
            chosen: &chosen,
        };
        let v = verify(target, drafter, run_on, &mut kv, tree, &mut sampler)?;
        for c in taken_children(&pool, &v) {
            acceptance.record(c.q, c.top, c.taken);
        }
        rows.push(ProbeRow {
            nodes: chosen.len(),
            demand: v.demand,
            hits: v.copies.hits,
            misses: v.copies.misses,
            read_rounds: v.read_rounds,
            slot_waits: v.copies.slot_waits,
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
    // Before each plain step (outside its timer) the drafter drafts a pool as decoding would,
    // and learns the step's token after it; once the greedy continuation is known, each pool
    // counts the children of the nodes it reaches (many more samples than the cycles' verifies
    // give: the target's tokens are known however deep the pool goes).
    let mut plain = Vec::new();
    let mut pools = Vec::with_capacity(plan.plain);
    let mut continuation = Vec::with_capacity(plan.plain);
    let h = target.config().hidden_size;
    for step in 0..plan.plain {
        let n = kv.len();
        pools.push(draft_tree(
            target,
            drafter,
            &mut draft,
            n,
            plan.shape,
            &mut |_| Ok(true),
        )?);
        let run_on = every_other(cache, emptied.as_deref_mut(), step);
        let (row, next, taps) = plain_step(target, drafter, run_on, &mut kv, root)?;
        plain.push(row);
        learn(
            target,
            drafter,
            &mut draft,
            &[next],
            &concat_taps(&taps, 1, h),
            n,
        )?;
        continuation.push(next);
        root = next;
    }
    for (i, pool) in pools.iter().enumerate() {
        for c in taken_along(pool, &continuation[i..]) {
            acceptance.record(c.q, c.top, c.taken);
        }
    }
    Ok(Probed {
        verify: rows,
        plain,
        acceptance,
    })
}

/// The subtree size probe cycle `cycle` (of `cycles`) of the prompt with seed `seed` asks for:
/// sizes step through 0..=K every second cycle (so each size is probed on both caches, see
/// [`every_other`]), and each seed starts where the previous one's run of sizes ended, so
/// that a few prompts with a few cycles each (4 × 4 at paper scale, where every prompt's
/// prefill is costly) still cover every size from 0 to K.
fn probe_size(cycle: usize, seed: u64, cycles: usize, max_nodes: usize) -> usize {
    let sizes = max_nodes + 1;
    // Taken modulo the number of sizes first: no product or sum can overflow.
    let start = (seed % sizes as u64) as usize * (cycles.div_ceil(2) % sizes);
    (cycle / 2 % sizes + start % sizes) % sizes
}

/// The cache forward `i` of a probe runs on: `emptied` for every odd `i` when there is one, the
/// decoding cache otherwise.
fn every_other<'a>(
    cache: &'a mut ExpertCache,
    emptied: Option<&'a mut ExpertCache>,
    i: usize,
) -> &'a mut ExpertCache {
    match emptied {
        Some(empty) if i % 2 == 1 => empty,
        _ => cache,
    }
}

/// A uniformly grown random ancestor-closed subtree of (at most) `size` nodes.
fn random_subtree(
    pool: &[DraftNode],
    size: usize,
    rng: &mut specfit_selector::synth::Rng,
) -> Vec<usize> {
    let parents: Vec<Option<usize>> = pool.iter().map(|n| n.parent).collect();
    specfit_selector::subtree::random_closed(&parents, size, rng)
}

/// One timed plain-decoding forward (`specfit calibrate`'s plain-step rows).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PlainStep {
    pub hits: u64,
    pub misses: u64,
    /// Read rounds ([`crate::experts::CopyStats::read_rounds`]).
    pub read_rounds: usize,
    /// Reads that waited for a slot ([`crate::experts::LayerStats::slot_waits`]).
    pub slot_waits: u64,
    /// Tokens already cached.
    pub context: usize,
    pub ms: f64,
}

/// One timed greedy one-token forward of `token` through `cache`, keeping the drafter's taps as
/// decoding's plain steps do while speculating: its row, the next token and the taps.
fn plain_step(
    target: &Qwen3Moe,
    drafter: &Eagle3,
    cache: &mut ExpertCache,
    kv: &mut KvCache,
    token: u32,
) -> Result<(PlainStep, u32, Vec<Vec<f32>>), EngineError> {
    let context = kv.len();
    let t = Instant::now();
    let input = [token];
    let batch = Batch::causal(&input)
        .with_taps(drafter.taps())
        .with_logits(Logits::Last);
    let out = target.forward(&batch, kv, cache)?;
    // The token is drawn inside the timer, as decoding's plain step draws it.
    let next = out.argmax(0);
    let ms = t.elapsed().as_secs_f64() * 1e3;
    let row = PlainStep {
        hits: out.copies.total.hits,
        misses: out.copies.total.misses,
        read_rounds: out.copies.read_rounds(cache.read_width()),
        slot_waits: out.copies.total.slot_waits,
        context,
        ms,
    };
    Ok((row, next, out.taps))
}

#[cfg(test)]
mod tests {
    use super::probe_size;

    /// The sizes `prompts` prompts (seeds 0..prompts) of `cycles` cycles each probe.
    fn sizes(prompts: u64, cycles: usize, k: usize) -> Vec<usize> {
        (0..prompts)
            .flat_map(|seed| (0..cycles).map(move |c| probe_size(c, seed, cycles, k)))
            .collect()
    }

    #[test]
    fn four_prompts_of_four_cycles_probe_every_size_up_to_k_on_both_caches() {
        let s = sizes(4, 4, 7);
        for n in 0..=7 {
            // Cycles alternate between the decoding and the emptied cache: each size on both.
            let cycles: Vec<usize> = (0..s.len()).filter(|&i| s[i] == n).collect();
            assert_eq!(cycles.len(), 2, "size {n}: {s:?}");
            assert_ne!(cycles[0] % 2, cycles[1] % 2, "size {n}: {s:?}");
        }
    }

    #[test]
    fn every_plan_of_one_or_more_cycles_per_size_covers_every_size() {
        for (prompts, cycles) in [(8, 2), (8, 4), (30, 32), (2, 8), (1, 16), (16, 1)] {
            let s = sizes(prompts, cycles, 7);
            assert!(
                (0..=7).all(|n| s.contains(&n)),
                "{prompts} x {cycles}: {s:?}"
            );
        }
        // Huge counts wrap instead of overflowing.
        assert!(probe_size(usize::MAX, u64::MAX, usize::MAX, 7) <= 7);
        assert_eq!(probe_size(5, 3, 9, 0), 0);
    }
}
