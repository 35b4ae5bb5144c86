//! Replays a recorded trace (`specfit record`) under any verify policy and cost model, with a
//! per-layer LRU expert cache of any size, and reports what decoding would have cost. A pure,
//! deterministic function of (trace, policy, configuration): no model is run.
//!
//! Each cycle starts at a trace position: the policy picks a subtree of the pool recorded there
//! (optionally applying the draft-stop rule level by level), the verify forward's expert union is
//! charged against the LRU caches (hits and misses per layer), its time is the *true* cost model
//! `a[n] + β_hit · hits + β_miss · misses`, the accepted path follows the recorded agreement flags,
//! and the next cycle starts after the committed tokens. What the policy *believes* the costs
//! are (its selector's cost model) may differ from the true one.

pub mod fit;
pub mod lru;
pub mod machine;
pub mod oracle;
pub mod synth;

use specfit_selector::{
    top_children, ChildTaken, CostModel, Decision, Pool, PoolBuilder, ResidentSet, VerifyPolicy,
};
use specfit_trace::{TraceHeader, TraceNode, TraceStep};

/// The most plain-burst tokens the engine's drafter learns when drafting resumes (the replay
/// charges the same): the latest ones, which are what it drafts from. Feeding it a whole
/// 256-token burst would cost about 3% of the burst where every expert is resident (0.012 ms a
/// token against ~0.4 ms a step on the shipped pair).
pub const CATCH_UP_TOKENS: usize = 32;

/// The simulated machine.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Expert slots per MoE layer; 0 = cache cleared every forward.
    pub slots: usize,
    /// The true verify time model (residency form; intercepts must cover the largest subtree).
    pub true_cost: CostModel,
    /// What drafting adds to each speculative cycle (zero: verify time only, as in the paper's
    /// cost model).
    pub drafting: Drafting,
    /// Attention's share: ms per verified token per token already cached (the trace position).
    pub context_ms: f64,
    /// ms per read round: a layer that copies `m` experts waits `⌈m / read_width⌉` read
    /// latencies, on top of the true cost's per-miss β.
    pub read_round_ms: f64,
    /// Reads in flight at once (the engine's I/O threads; at least 1).
    pub read_width: usize,
    /// ms per read that could start only once a slot was freed by an expert computed (a layer
    /// needing more experts than it has free slots), on top of its miss and round.
    pub slot_wait_ms: f64,
    /// A plain decoding step's own cost, when it differs from a root-only verify's.
    pub plain: Option<PlainCost>,
    /// Every expert is used where it rests (a memory-mapped GGUF file on the RAM tier): with
    /// as many slots as experts, the slots start holding all of them, so no forward misses, as
    /// none copies; with fewer, this is ignored.
    pub in_place: bool,
    /// Timing noise: each forward's time (a plain step, or a cycle's verify with its drafting)
    /// is multiplied by a log-normal factor of mean 1 and this log standard deviation, drawn
    /// from `noise_seed` (0: every time exactly as the cost model says). A measuring policy
    /// (the never-lose rule) hears the noisy times, as it hears measured ones.
    pub noise: f64,
    pub noise_seed: u64,
}

impl SimConfig {
    /// A machine whose every forward costs what `true_cost` says and nothing else: no drafting
    /// time, attention term, read rounds or separate plain-step cost (the paper's cost model).
    pub fn verify_only(slots: usize, true_cost: CostModel) -> SimConfig {
        SimConfig {
            slots,
            true_cost,
            drafting: Drafting::default(),
            context_ms: 0.0,
            read_round_ms: 0.0,
            read_width: 1,
            slot_wait_ms: 0.0,
            plain: None,
            in_place: false,
            noise: 0.0,
            noise_seed: 0,
        }
    }
}

/// What a plain decoding step costs: `intercept + beta_hit · hits + beta_miss · misses +
/// read_round_ms · R + slot_wait_ms · W + context_ms · c` (`R` read rounds, `W` reads that
/// waited for a slot, `c` tokens cached).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PlainCost {
    pub intercept: f64,
    pub beta_hit: f64,
    pub beta_miss: f64,
    pub read_round_ms: f64,
    pub slot_wait_ms: f64,
    pub context_ms: f64,
}

/// The drafter's time per speculative cycle: `ms_per_level + level_context_ms · c` for each
/// drafted level past the first, and `feed_ms + (feed_ms_per_token + feed_context_ms · c) ·
/// committed` to feed the committed tokens back (`c` tokens cached). Plain decoding
/// (`VerifyPolicy::plain()`) drafts nothing.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Drafting {
    pub ms_per_level: f64,
    pub feed_ms: f64,
    pub feed_ms_per_token: f64,
    pub level_context_ms: f64,
    pub feed_context_ms: f64,
}

impl Drafting {
    /// One feed of `tokens` committed tokens to the drafter at `context` tokens cached.
    fn feed(&self, tokens: usize, context: f64) -> f64 {
        self.feed_ms + (self.feed_ms_per_token + self.feed_context_ms * context) * tokens as f64
    }

    /// A speculative cycle's drafting at `context` tokens cached: the drafter first catches up
    /// on the `unlearned` plain-burst tokens since the last cycle (their latest
    /// [`CATCH_UP_TOKENS`], in one feed), then drafts `levels` levels (the first comes with
    /// the feed of the previous cycle's tokens).
    fn drafting_ms(&self, unlearned: usize, levels: usize, context: f64) -> f64 {
        let catch_up = match unlearned {
            0 => 0.0,
            n => self.feed(n.min(CATCH_UP_TOKENS), context),
        };
        catch_up
            + (self.ms_per_level + self.level_context_ms * context)
                * levels.saturating_sub(1) as f64
    }
}

/// What a replay measured.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SimReport {
    /// Speculative cycles (or plain steps, for a plain policy).
    pub cycles: usize,
    /// Plain steps of a drafting policy's bursts.
    pub plain_steps: usize,
    pub committed: usize,
    pub verified_nodes: usize,
    pub hits: u64,
    pub misses: u64,
    pub time_ms: f64,
    /// Of `time_ms`, drafting: the drafter's levels past the first and its catch-up on plain
    /// bursts (the engine's draft phase; feeding committed tokens counts with the verify).
    pub draft_ms: f64,
}

impl SimReport {
    /// Committed tokens per second of simulated verify time.
    pub fn tokens_per_second(&self) -> f64 {
        if self.time_ms > 0.0 {
            1e3 * self.committed as f64 / self.time_ms
        } else {
            0.0
        }
    }
}

/// What can be wrong with a replay's inputs.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("trace steps are not consecutive positions (step {index} is position {got}, expected {want})")]
    Gap {
        index: usize,
        got: usize,
        want: usize,
    },
    /// The error is part of the message, not a chained source, so it prints once.
    #[error("selector: {0}")]
    Selector(specfit_selector::Error),
}

impl From<specfit_selector::Error> for SimError {
    fn from(e: specfit_selector::Error) -> SimError {
        SimError::Selector(e)
    }
}

/// Per-layer expert slots ([`lru::SlotLru`], the engine's cache counted) and the read width.
#[derive(Debug, Clone)]
struct Lru {
    slots: lru::SlotLru,
}

/// What one forward's union cost the slots, summed over layers.
#[derive(Debug, Clone, Copy, Default)]
struct Charged {
    hits: u64,
    misses: u64,
    read_rounds: usize,
    slot_waits: u64,
}

impl Lru {
    /// The slots of `config` for the model of `header`: empty, or holding every expert when
    /// the experts are used in place and there is a slot for each.
    fn new(header: &TraceHeader, config: &SimConfig) -> Lru {
        let (layers, slots) = (header.moe_layers, config.slots);
        Lru {
            slots: if config.in_place && slots >= header.experts {
                lru::SlotLru::holding_all(layers, header.experts)
            } else {
                lru::SlotLru::new(layers, slots)
            },
        }
    }

    /// Charges one forward's union (per layer, distinct and ascending); returns its counts,
    /// read rounds with `width` reads in flight at once, or as many as there are slots when
    /// fewer: each read holds a slot until its expert is computed, as in the engine's
    /// `ExpertCache::read_width`.
    fn access(&mut self, union: &[Vec<u32>], width: usize) -> Charged {
        let width = match self.slots.slots() {
            0 => width,
            s => width.min(s),
        };
        let mut c = Charged::default();
        for (layer, experts) in union.iter().enumerate() {
            let a = self.slots.access(layer, experts);
            c.hits += a.hits;
            c.misses += a.misses;
            c.slot_waits += a.slot_waits;
            c.read_rounds += a.misses.div_ceil(width.max(1) as u64) as usize;
        }
        c
    }

    /// Resident experts per layer, least recently used first.
    fn resident(&self, layers: usize) -> Vec<Vec<u32>> {
        (0..layers).map(|l| self.slots.resident(l)).collect()
    }
}

/// Replays `steps` (consecutive positions) under `policy` on `config`, from empty caches.
pub fn simulate(
    header: &TraceHeader,
    steps: &[TraceStep],
    policy: &VerifyPolicy,
    config: &SimConfig,
) -> Result<SimReport, SimError> {
    replay_all(header, [steps], policy, config)
}

/// Replays several traces one after the other, the expert caches carrying over from one to the
/// next (as in a session serving one prompt after another), and sums the reports.
pub fn simulate_many(
    header: &TraceHeader,
    traces: &[Vec<TraceStep>],
    policy: &VerifyPolicy,
    config: &SimConfig,
) -> Result<SimReport, SimError> {
    replay_all(header, traces.iter().map(Vec::as_slice), policy, config)
}

/// [`simulate_many`] over borrowed traces (one caches' state and policy for all of them).
fn replay_all<'a>(
    header: &TraceHeader,
    traces: impl IntoIterator<Item = &'a [TraceStep]>,
    policy: &VerifyPolicy,
    config: &SimConfig,
) -> Result<SimReport, SimError> {
    let mut lru = Lru::new(header, config);
    let mut policy = policy.clone();
    let mut report = SimReport::default();
    let mut noise = Noise::new(config.noise, config.noise_seed);
    for steps in traces {
        replay(
            header,
            steps,
            &mut policy,
            config,
            &mut lru,
            &mut noise,
            &mut report,
        )?;
    }
    Ok(report)
}

/// One trace's cycles, added to `report`.
fn replay(
    header: &TraceHeader,
    steps: &[TraceStep],
    policy: &mut VerifyPolicy,
    config: &SimConfig,
    lru: &mut Lru,
    noise: &mut Noise,
    report: &mut SimReport,
) -> Result<(), SimError> {
    check_consecutive(steps)?;
    let mut i = 0;
    // Plain-burst tokens the drafter has not learned yet.
    let mut unlearned = 0;
    while i < steps.len() {
        let burst = policy.take_burst();
        // As the engine's decoder: with one token left, a drafting policy decodes it plainly.
        let last = policy.drafts() && i + 1 == steps.len();
        if burst > 0 || last {
            let burst = burst.max(1);
            // The policy's plain burst: the root alone at each position, no drafting.
            let end = (i + burst).min(steps.len());
            // A burst past the trace's end goes on into the next trace, as in the engine.
            policy.keep_burst(i + burst - end);
            for (k, step) in steps[i..end].iter().enumerate() {
                let union = verify_union(header, step, &[]);
                let charged = lru.access(&union, config.read_width);
                let (hits, misses) = (charged.hits, charged.misses);
                let ms = plain_step_ms(config, &charged, step.position as f64) * noise.factor();
                // As the engine's decoder: every step but a burst's first.
                if k > 0 {
                    policy.observe_plain(1, ms);
                }
                report.time_ms += ms;
                report.hits += hits;
                report.misses += misses;
            }
            // As the engine's decoder: the drafter learns these tokens when drafting resumes.
            unlearned += end - i;
            report.plain_steps += end - i;
            report.committed += end - i;
            i = end;
            continue;
        }
        let step = &steps[i];
        // As the engine's decoder: whether the slots were still filling when the cycle began.
        let filling = lru.slots.filling();
        let (chosen, levels) = choose(header, step, policy, lru, steps.len() - i - 1)?;
        // The verify forward: union of the root's and the chosen nodes' experts per layer.
        let union = verify_union(header, step, &chosen);
        let charged = lru.access(&union, config.read_width);
        let (hits, misses) = (charged.hits, charged.misses);
        let context = step.position as f64;
        let mut ms = if policy.drafts() {
            verify_ms(config, chosen.len(), &charged, context)
        } else {
            plain_step_ms(config, &charged, context)
        };
        report.hits += hits;
        report.misses += misses;
        // Accept along agreeing chosen children, then the bonus token.
        let mut here: i64 = -1;
        let mut accepted = 0;
        let mut reached = vec![here];
        while let Some(&c) = chosen
            .iter()
            .find(|&&c| step.nodes[c].parent == here && step.nodes[c].agrees)
        {
            here = c as i64;
            accepted += 1;
            reached.push(here);
        }
        record_taken(step, levels, &reached, policy);
        if policy.drafts() {
            let d = &config.drafting;
            let drafting = d.drafting_ms(std::mem::take(&mut unlearned), levels, context);
            report.draft_ms += drafting;
            ms += drafting + d.feed(accepted + 1, context);
            ms *= noise.factor();
            policy.slots_filling(filling);
            policy.observe_cycle(accepted + 1, ms);
        } else {
            ms *= noise.factor();
        }
        report.time_ms += ms;
        report.cycles += 1;
        report.verified_nodes += chosen.len();
        // No level past the tokens left was drafted: the cycle ends within the trace.
        report.committed += accepted + 1;
        i += accepted + 1;
    }
    Ok(())
}

/// Log-normal timing noise of mean 1 ([`SimConfig::noise`]).
struct Noise {
    sigma: f64,
    rng: specfit_selector::synth::Rng,
}

impl Noise {
    fn new(sigma: f64, seed: u64) -> Noise {
        Noise {
            sigma: sigma.max(0.0),
            rng: specfit_selector::synth::Rng::new(seed),
        }
    }

    /// The next factor: `exp(σ·z − σ²/2)` for a standard normal `z` (Box–Muller); 1 without
    /// noise, drawing nothing.
    fn factor(&mut self) -> f64 {
        if self.sigma == 0.0 {
            return 1.0;
        }
        let u = 1.0 - self.rng.unit();
        let v = self.rng.unit();
        let z = (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos();
        (self.sigma * z - self.sigma * self.sigma / 2.0).exp()
    }
}

/// Errs unless `steps` are consecutive positions.
fn check_consecutive(steps: &[TraceStep]) -> Result<(), SimError> {
    for (index, s) in steps.iter().enumerate() {
        let want = steps[0].position + index;
        if s.position != want {
            return Err(SimError::Gap {
                index,
                got: s.position,
                want,
            });
        }
    }
    Ok(())
}

/// A verify forward's time: the true cost of `nodes` beside the root at its hits and misses,
/// its read rounds and reads that waited for a slot, and attention over `context` tokens for
/// each of its rows.
fn verify_ms(config: &SimConfig, nodes: usize, c: &Charged, context: f64) -> f64 {
    config
        .true_cost
        .time_ms(nodes, c.hits as u32, c.misses as u32)
        + config.read_round_ms * c.read_rounds as f64
        + config.slot_wait_ms * c.slot_waits as f64
        + attention_ms(config, nodes, context)
}

/// The machine's attention charge for a verify of `nodes` nodes and the root over `context`
/// cached tokens.
fn attention_ms(config: &SimConfig, nodes: usize, context: f64) -> f64 {
    config.context_ms * (nodes + 1) as f64 * context
}

/// A plain decoding step's time: the plain-step cost when the machine has one, else a
/// root-only verify's (with its read rounds and attention term).
fn plain_step_ms(config: &SimConfig, c: &Charged, context: f64) -> f64 {
    match &config.plain {
        Some(p) => {
            p.intercept
                + p.beta_hit * c.hits as f64
                + p.beta_miss * c.misses as f64
                + p.read_round_ms * c.read_rounds as f64
                + p.slot_wait_ms * c.slot_waits as f64
                + p.context_ms * context
        }
        None => verify_ms(config, 0, c, context),
    }
}

/// The experts per layer a verify forward of the root and `chosen` needs (distinct, sorted).
fn verify_union(header: &TraceHeader, step: &TraceStep, chosen: &[usize]) -> Vec<Vec<u32>> {
    (0..header.moe_layers)
        .map(|l| {
            let mut u: Vec<u32> = step.root_routes[l].clone();
            for &c in chosen {
                u.extend(&step.nodes[c].routes[l]);
            }
            u.sort_unstable();
            u.dedup();
            u
        })
        .collect()
}

/// The policy's subtree for one step, and how many levels it drafted: the policy decides after
/// each recorded level up to `max_levels` (the levels that can still commit a token), as the
/// engine's decoder asks it while drafting.
fn choose(
    header: &TraceHeader,
    step: &TraceStep,
    policy: &mut VerifyPolicy,
    lru: &Lru,
    max_levels: usize,
) -> Result<(Vec<usize>, usize), SimError> {
    if !policy.drafts() {
        return Ok((Vec::new(), 0));
    }
    let resident = match policy.uses_residency() && lru.slots.slots() > 0 {
        true => Some(ResidentSet::new(
            header.moe_layers,
            header.experts,
            &lru.resident(header.moe_layers),
        )?),
        false => None,
    };
    let max_depth = step.nodes.iter().map(|n| n.depth).max().unwrap_or(0);
    let max_depth = max_depth.min(max_levels);
    for depth in 1..=max_depth {
        let pool = pool_upto(header, step, depth, policy)?;
        let more = depth < max_depth;
        if let Decision::Verify(picked) = policy.decide(&pool, resident.as_ref(), more)? {
            // Pool indices up to `depth` are a prefix-order subset; map back to step indices.
            let index: Vec<usize> = (0..step.nodes.len())
                .filter(|&i| step.nodes[i].depth <= depth)
                .collect();
            return Ok((picked.into_iter().map(|p| index[p]).collect(), depth));
        }
    }
    Ok((Vec::new(), 0))
}

/// Tells `policy` what a step says about the drafter's children, as the engine's decoder does:
/// each child drafted (within `levels`) under a `reached` node (`-1`: the root), whether it is
/// its parent's top child and whether the target takes it (its agreement flag).
fn record_taken(step: &TraceStep, levels: usize, reached: &[i64], policy: &mut VerifyPolicy) {
    for c in children_taken(step, levels, reached) {
        policy.record_taken(c.q, c.top, c.taken);
    }
}

/// Each node of `step` drafted within `levels` under a `reached` node (`-1`: the root): its
/// probability given its parent, whether it is its parent's top child among the step's nodes
/// and whether the target takes it.
fn children_taken(step: &TraceStep, levels: usize, reached: &[i64]) -> Vec<ChildTaken> {
    let parents: Vec<Option<usize>> = step
        .nodes
        .iter()
        .map(|n| usize::try_from(n.parent).ok())
        .collect();
    let edges: Vec<f64> = step.nodes.iter().map(|n| edge_prob(step, n)).collect();
    let top = top_children(&parents, &edges);
    reached
        .iter()
        .flat_map(|&parent| {
            step.nodes
                .iter()
                .enumerate()
                .filter(move |(_, n)| n.parent == parent && n.depth <= levels)
        })
        .map(|(i, n)| ChildTaken {
            q: edges[i],
            top: top[i],
            taken: n.agrees,
        })
        .collect()
}

/// The drafter's probability of `n` given its parent (its path probability over the parent's).
fn edge_prob(step: &TraceStep, n: &TraceNode) -> f64 {
    let above = usize::try_from(n.parent).map_or(1.0, |p| step.nodes[p].prob);
    if above > 0.0 {
        n.prob / above
    } else {
        0.0
    }
}

/// The selector pool of the nodes of `step` with depth ≤ `depth`, scored as `policy` scores
/// paths ([`VerifyPolicy::path_probs`], as the engine's decoder does).
fn pool_upto(
    header: &TraceHeader,
    step: &TraceStep,
    depth: usize,
    policy: &VerifyPolicy,
) -> Result<Pool, SimError> {
    let mut b = PoolBuilder::new(header.moe_layers, header.experts)?;
    b.root_routes(&step.root_routes)?.context(step.position);
    let nodes: Vec<(&TraceNode, Option<usize>)> = nodes_upto(step, depth).collect();
    let scored: Vec<_> = nodes
        .iter()
        .map(|&(n, parent)| (parent, edge_prob(step, n), n.prob))
        .collect();
    for ((n, parent), p) in nodes.into_iter().zip(policy.path_probs(&scored)) {
        b.push(parent, p.clamp(0.0, 1.0), &n.routes)?;
    }
    Ok(b.build())
}

/// The nodes of `step` with depth ≤ `depth`, in trace order, each with its parent's index among
/// them (`None` for a child of the root).
fn nodes_upto(step: &TraceStep, depth: usize) -> impl Iterator<Item = (&TraceNode, Option<usize>)> {
    let mut next = 0;
    let index: Vec<Option<usize>> = step
        .nodes
        .iter()
        .map(|n| {
            (n.depth <= depth).then(|| {
                next += 1;
                next - 1
            })
        })
        .collect();
    step.nodes
        .iter()
        .filter(move |n| n.depth <= depth)
        .map(move |n| {
            let parent = usize::try_from(n.parent)
                .ok()
                .map(|p| index[p].expect("ancestors are shallower"));
            (n, parent)
        })
}

/// Costs of a published machine (the paper's measured β per expert, ms), as the simulated
/// machine (`true_cost`) and as SpecFit's belief (`believed`, the paper form).
#[derive(Debug, Clone)]
pub struct Preset {
    pub name: &'static str,
    pub true_cost: CostModel,
    pub believed: CostModel,
}

/// The paper's A100 PCIe (β 0.211 ms per expert with the cache, 0.408 ms with the cache cleared)
/// and RTX 4090 (0.206 / 0.782). Assumptions, not measurements: a copied expert costs the
/// cleared-cache β and a resident one 0.02 ms; intercepts `a[n] = 132 + 2n` ms, which with about
/// half of the 384 experts of a token resident gives the paper's ≈ 214 ms autoregressive step on
/// the A100 (4.67 tok/s); the RTX 4090 is given the same intercepts.
pub fn preset(name: &str, max_nodes: usize) -> Option<Preset> {
    let (cached, cleared) = match name {
        "a100" => (0.211, 0.408),
        "rtx4090" => (0.206, 0.782),
        _ => return None,
    };
    let a: Vec<f64> = (0..=max_nodes).map(|n| 132.0 + 2.0 * n as f64).collect();
    Some(Preset {
        name: if name == "a100" {
            "A100 PCIe"
        } else {
            "RTX 4090"
        },
        true_cost: CostModel::residency(a.clone(), 0.02, cleared).expect("valid preset"),
        believed: CostModel::paper(a, cached).expect("valid preset"),
    })
}

/// Mean accepted draft tokens per cycle of the `k` most probable nodes on `steps`.
pub fn topk_acceptance(header: &TraceHeader, steps: &[TraceStep], k: usize) -> f64 {
    topk_acceptance_many(header, std::slice::from_ref(&steps), k)
}

/// [`topk_acceptance`] over several traces (their cycles together).
pub fn topk_acceptance_many<S: AsRef<[TraceStep]>>(
    header: &TraceHeader,
    traces: &[S],
    k: usize,
) -> f64 {
    let config = SimConfig::verify_only(0, CostModel::paper(vec![1.0; k + 1], 0.0).expect("valid"));
    let traces = traces.iter().map(AsRef::as_ref);
    match replay_all(header, traces, &VerifyPolicy::top_k(k), &config) {
        Ok(r) => (r.committed - r.cycles) as f64 / r.cycles.max(1) as f64,
        Err(_) => 0.0,
    }
}

/// The drafter confidence whose synthetic traces make top-`k` accept `target` tokens per cycle
/// (bisection; acceptance grows with confidence).
pub fn fit_confidence(base: &synth::SynthParams, k: usize, target: f64) -> f64 {
    let (mut lo, mut hi) = (0.02, 0.99);
    for _ in 0..18 {
        let mid = 0.5 * (lo + hi);
        let (h, steps) = synth::trace(&synth::SynthParams {
            confidence: mid,
            ..base.clone()
        });
        if topk_acceptance(&h, &steps, k) < target {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    0.5 * (lo + hi)
}

/// Probes the simulated machine as `specfit probe` probes a real one: along the traces, one
/// after the other (advancing one position per probe, like autoregressive decoding), verifies a
/// random ancestor-closed subtree of size `n` (cycling through `0..=max_nodes`) of the recorded
/// pool, charging the LRU caches, and records `(nodes, demand, hits, misses, context, ms)` under
/// the true cost and the machine's attention charge; then fits the cost model by NNLS. This is
/// what a SpecFit deployment on that machine would believe.
pub fn calibrate_on<S: AsRef<[TraceStep]>>(
    header: &TraceHeader,
    traces: &[S],
    config: &SimConfig,
    max_nodes: usize,
    seed: u64,
) -> Result<specfit_selector::Calibration, SimError> {
    let mut rng = specfit_selector::synth::Rng::new(seed);
    let mut lru = Lru::new(header, config);
    let steps = traces.iter().flat_map(|t| t.as_ref());
    let mut probes = Vec::with_capacity(traces.iter().map(|t| t.as_ref().len()).sum());
    for (i, step) in steps.enumerate() {
        let want = i % (max_nodes + 1);
        // A random ancestor-closed subtree of `want` nodes.
        let parents: Vec<Option<usize>> = step
            .nodes
            .iter()
            .map(|n| usize::try_from(n.parent).ok())
            .collect();
        let chosen = specfit_selector::subtree::random_closed(&parents, want, &mut rng);
        let union = verify_union(header, step, &chosen);
        let demand: u64 = union.iter().map(|u| u.len() as u64).sum();
        let Charged { hits, misses, .. } = lru.access(&union, config.read_width);
        let ms = config
            .true_cost
            .time_ms(chosen.len(), hits as u32, misses as u32)
            + attention_ms(config, chosen.len(), step.position as f64);
        probes.push(specfit_selector::Probe {
            nodes: chosen.len(),
            demand,
            ms,
            hits_misses: Some((hits, misses)),
            context: step.position as u64,
        });
    }
    Ok(specfit_selector::calibrate(&probes)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use specfit_selector::{Acceptance, Objective, Selector};

    /// A trace step from (parent, prob, depth) triples, listed level by level.
    fn step(nodes: &[(i64, f64, usize)]) -> TraceStep {
        TraceStep {
            position: 0,
            root: 0,
            root_routes: vec![vec![0]],
            nodes: nodes
                .iter()
                .map(|&(parent, prob, depth)| TraceNode {
                    parent,
                    token: 0,
                    prob,
                    depth,
                    routes: vec![vec![0]],
                    agrees: false,
                })
                .collect(),
            next: 0,
        }
    }

    #[test]
    fn experts_used_in_place_are_hits_from_the_first_forward() {
        // Plain decoding of three positions routing {0, 1}, {1, 2}, {2, 3} in one layer of 8;
        // a forward costs 10 ms + 2 per hit + 5 per miss.
        let header = TraceHeader::new(1, 8, 2, 16);
        let steps: Vec<TraceStep> = [[0u32, 1], [1, 2], [2, 3]]
            .iter()
            .enumerate()
            .map(|(i, routes)| TraceStep {
                position: i,
                root_routes: vec![routes.to_vec()],
                ..step(&[])
            })
            .collect();
        let cost = CostModel::residency(vec![10.0; 8], 2.0, 5.0).unwrap();
        let replay = |in_place| {
            let config = SimConfig {
                in_place,
                ..SimConfig::verify_only(8, cost.clone())
            };
            simulate_many(
                &header,
                std::slice::from_ref(&steps),
                &VerifyPolicy::plain(),
                &config,
            )
            .unwrap()
        };
        let mapped = replay(true);
        assert_eq!((mapped.hits, mapped.misses, mapped.time_ms), (6, 0, 42.0));
        // Slots filled by reads: each expert's first use is a miss.
        let read = replay(false);
        assert_eq!((read.hits, read.misses, read.time_ms), (2, 4, 54.0));
    }

    #[test]
    fn the_children_of_reached_nodes_are_counted_as_the_engine_counts_them() {
        // The target took node 0 (edge 0.6) at the root; under it node 3 (edge 0.5 / 0.6) was
        // drafted, node 4 (depth 3) was not (2 levels drafted).
        let mut s = three_levels();
        s.nodes[0].agrees = true;
        s.nodes[3].agrees = true;
        let mut policy = VerifyPolicy::top_k(2).acceptance(Acceptance::new());
        record_taken(&s, 2, &[-1, 0], &mut policy);
        let mut want = Acceptance::new();
        want.record(0.6, true, true);
        want.record(0.3, false, false);
        want.record(0.5 / 0.6, true, true);
        assert_eq!(policy.acceptance_counts(), Some(&want));
        // Scored pools multiply the curve down each path.
        let header = TraceHeader::new(1, 8, 1, 16);
        let curve = want.curve();
        let pool = pool_upto(&header, &s, 2, &policy).unwrap();
        let p3 = pool.prob(3);
        assert!(
            (p3 - curve.at(0.6, true) * curve.at(0.5 / 0.6, true)).abs() < 1e-6,
            "{p3}"
        );
    }

    /// 0 (0.6), 1 (0.3) at depth 1; 2 (0.2) under 1 and 3 (0.5) under 0 at depth 2; 4 (0.4)
    /// under 3 at depth 3.
    fn three_levels() -> TraceStep {
        step(&[
            (-1, 0.6, 1),
            (-1, 0.3, 1),
            (1, 0.2, 2),
            (0, 0.5, 2),
            (3, 0.4, 3),
        ])
    }

    #[test]
    fn specfit_prices_each_position_at_the_tokens_cached_before_it() {
        // One node of 0.5; a = 10 ms, experts free, 0.01 ms per row per cached token: worth
        // verifying at the start, not at 2 000 tokens (1.5 / 50 against 1 / 30).
        let header = TraceHeader::new(1, 4, 1, 16);
        let cost = CostModel::paper(vec![10.0; 2], 0.0)
            .unwrap()
            .with_context_ms(0.01)
            .unwrap();
        let machine = SimConfig::verify_only(0, cost.clone());
        let lru = Lru::new(&header, &machine);
        let mut policy = VerifyPolicy::specfit(Selector::new(cost, 1, Objective::Ratio).unwrap());
        let at = |position| TraceStep {
            position,
            ..step(&[(-1, 0.5, 1)])
        };
        let chosen = |policy: &mut VerifyPolicy, position| {
            choose(&header, &at(position), policy, &lru, usize::MAX)
                .unwrap()
                .0
        };
        assert_eq!(chosen(&mut policy, 0), vec![0]);
        assert_eq!(chosen(&mut policy, 2000), Vec::<usize>::new());
    }

    #[test]
    fn nodes_up_to_a_depth_keep_their_parents_among_themselves() {
        let s = three_levels();
        let upto = |d| -> Vec<Option<usize>> { nodes_upto(&s, d).map(|(_, p)| p).collect() };
        assert_eq!(upto(1), vec![None, None]);
        assert_eq!(upto(3), vec![None, None, Some(1), Some(0), Some(3)]);
    }

    /// The levels top-`k` drafts on `step` before its choice is settled.
    fn top_k_levels(step: &TraceStep, k: usize) -> usize {
        let header = TraceHeader::new(1, 4, 1, 16);
        let no_slots =
            SimConfig::verify_only(0, CostModel::residency(vec![1.0; 8], 0.0, 1.0).unwrap());
        let lru = Lru::new(&header, &no_slots);
        choose(&header, step, &mut VerifyPolicy::top_k(k), &lru, usize::MAX)
            .unwrap()
            .1
    }

    #[test]
    fn the_top_k_settles_at_the_level_after_which_no_deeper_node_can_enter() {
        let s = three_levels();
        // K = 1: node 0 (0.6) beats every deeper node already at level 1.
        assert_eq!(top_k_levels(&s, 1), 1);
        // K = 2: level 1 holds 0.6 and 0.3, but node 3 (0.5) at level 2 may still enter.
        assert_eq!(top_k_levels(&s, 2), 2);
        // K = 3: {0.6, 0.5, 0.3} after level 2, and node 4 (0.4) at level 3 still enters.
        assert_eq!(top_k_levels(&s, 3), 3);
    }
}
