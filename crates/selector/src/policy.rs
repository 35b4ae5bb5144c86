//! The verify policy: after each drafted level, whether to draft another one or which
//! ancestor-closed subtree of the pool to verify — plain decoding, vanilla EAGLE-3's top-K, or
//! SpecFit's exact search with its draft-stop rule, residency and plain bursts — and, between
//! cycles, how many tokens to decode plainly ([`Bursts`]). One decision function
//! ([`VerifyPolicy::decide`]) serves the engine's decoder and the simulator, so both stop and
//! choose alike. It does not draft, route or time anything: the caller reports what cycles and
//! plain steps took ([`VerifyPolicy::observe_cycle`], [`VerifyPolicy::observe_plain`]).

use crate::acceptance::Acceptance;
use crate::cost::ResidentSet;
use crate::error::Error;
use crate::pool::Pool;
use crate::search::Selector;
use crate::stop;
use crate::subtree::{top_k_closed, top_k_settled};

/// How the nodes to verify are chosen.
#[derive(Debug, Clone)]
pub enum Choice {
    /// Plain decoding: no drafting, the root alone every step.
    Plain,
    /// Vanilla EAGLE-3: the `k` most probable nodes (ties by index), ancestor-closed.
    TopK(usize),
    /// SpecFit: the exact search over ancestor-closed subtrees (its cost model, node budget and
    /// objective, λ included, are the selector's).
    SpecFit(Box<Selector>),
}

/// The longest plain burst after cycles that verify nothing ([`Bursts::AfterEmpty`]).
pub const MAX_BURST: usize = 16;

/// The longest plain burst while speculation loses ([`Bursts::NeverLose`]) by a little; where a
/// token costs `r` times more speculating than plainly, bursts may grow to `r` times this, up to
/// [`MAX_LOSING_BURST_FAR`] (a shift in the text that would overturn a wide loss is rarer than
/// one that overturns a narrow one, and each probe of a wide loss costs more).
pub const MAX_LOSING_BURST: usize = 256;

/// The longest plain burst while speculation loses ([`Bursts::NeverLose`]) by a factor of 4 or
/// more: 4 × [`MAX_LOSING_BURST`].
pub const MAX_LOSING_BURST_FAR: usize = 1024;

/// Under [`Bursts::NeverLose`], how much less time per token speculative cycles must measure
/// than plain steps to count as winning: switching between the two costs time neither
/// measures (the first plain step after a cycle, the cache pollution in the steps after it), so
/// at parity plain decoding is the safe side.
pub const WIN_MARGIN: f64 = 0.03;

/// Under [`Bursts::NeverLose`], the share of decoding time that probing cycles may lose while
/// speculation loses: each burst is long enough that one more losing cycle costs at most this
/// share of the burst's time.
pub const PROBE_SHARE: f64 = 0.02;

/// Under [`Bursts::NeverLose`], the speculative cycles whose time per token is compared (the
/// latest ones: enough that the spread of accepted tokens per cycle averages out).
pub const CYCLE_WINDOW: usize = 32;

/// Under [`Bursts::NeverLose`], the cycles since the plain measure's horizon that stand for
/// speculation alone: with at least this many, speculation's time per token is theirs (the same
/// stretch of text as the plain steps it is compared with), else the whole window's.
pub const RECENT_CYCLES: usize = 4;

/// Under [`Bursts::NeverLose`], how many standard errors of the plain measure a loss must
/// exceed to end a winning run at once: a smaller one is within the noise of a few plain steps,
/// and the plain measure is taken again ([`REFRESH_STEPS`] more steps) before the verdict.
pub const NOISE_ERRORS: f64 = 2.0;

/// Under [`Bursts::NeverLose`], cycles in the window before bursts grow: before, a losing cycle
/// is followed by one plain step (the first cycles run on cold caches and are no verdict), and
/// any cycle by [`UNSURE_BURST`] while the expert slots are still filling.
pub const SURE_CYCLES: usize = 8;

/// Under [`Bursts::NeverLose`], the plain steps after each of the first [`SURE_CYCLES`] cycles
/// while the expert slots still have empty ones ([`VerifyPolicy::slots_filling`]), whatever the
/// cycle measured: the first pays for what the cycle left in the processor's caches (not
/// reported), the second measures plain decoding on slots as full as the cycles'. (Measured
/// only on the empty slots at the start, plain steps looked dear beside cycles on slots that
/// had filled since, and speculation ran on where it lost.)
pub const UNSURE_BURST: usize = 2;

/// Under [`Bursts::NeverLose`], how many decoded tokens a plain step's time stays current: older
/// ones were measured under other conditions (emptier slots, colder caches, a shorter context),
/// and comparing today's cycles with them is how a stale measure makes speculation look good.
/// While speculation keeps winning the horizon grows ([`PLAIN_FRESH_MAX_TOKENS`]).
pub const PLAIN_FRESH_TOKENS: u64 = 32;

/// Under [`Bursts::NeverLose`], the longest a plain step's time stays current: each refresh of
/// the plain measure after which speculation still wins doubles the horizon from
/// [`PLAIN_FRESH_TOKENS`] up to this, and a verdict that speculation loses brings it back. A
/// refresh decodes [`REFRESH_STEPS`] tokens plainly while speculation is faster: every
/// [`PLAIN_FRESH_TOKENS`] tokens that is about one token in nine, every 256 one in 65.
pub const PLAIN_FRESH_MAX_TOKENS: u64 = 256;

/// Under [`Bursts::NeverLose`], the current plain steps a verdict needs; with fewer, the next
/// burst measures [`REFRESH_STEPS`].
pub const PLAIN_FRESH_STEPS: usize = 3;

/// Under [`Bursts::NeverLose`], the plain steps that measure plain decoding before the first
/// cycle (the first of them pays for cold caches).
pub const FIRST_PLAIN_STEPS: usize = 4;

/// Under [`Bursts::NeverLose`], the plain steps that refresh the measure of plain decoding
/// once it is no longer current: the first step after a cycle pays for what the cycle left in
/// the processor's caches and is not reported ([`VerifyPolicy::observe_plain`]), the other
/// [`PLAIN_FRESH_STEPS`] are.
pub const REFRESH_STEPS: usize = PLAIN_FRESH_STEPS + 1;

/// When a policy decodes plainly between speculative cycles (plain steps commit the tokens
/// plain decoding commits, so every rule is lossless).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bursts {
    /// Never: every cycle drafts (the paper's SpecFit, EAGLE-3).
    Off,
    /// After a cycle whose best subtree is empty: 1, 2, 4, … up to [`MAX_BURST`] tokens, until a
    /// cycle verifies nodes again (`specfit-adaptive`).
    AfterEmpty,
    /// Never lose: compares the measured time per committed token of speculative cycles
    /// (drafting included) with that of plain steps. Plain decoding's cost is measured by
    /// [`FIRST_PLAIN_STEPS`] plain steps first; it is the mean of the latest plain steps
    /// measured within [`PLAIN_FRESH_TOKENS`] decoded tokens (none measured on the cold slots
    /// at the start once those are older), with its standard error; with fewer than
    /// [`PLAIN_FRESH_STEPS`] of those, the next burst is [`REFRESH_STEPS`] long. Speculation's
    /// is that of the cycles over the same horizon, with at least [`RECENT_CYCLES`] of them,
    /// else of the latest [`CYCLE_WINDOW`]. While the window holds fewer than [`SURE_CYCLES`]
    /// cycles and the expert slots are still filling, each cycle is followed by
    /// [`UNSURE_BURST`] plain steps. While speculation does not cost [`WIN_MARGIN`]
    /// less, it decodes plainly between probing cycles: one token while the window holds fewer
    /// than [`SURE_CYCLES`] cycles; then, while speculation was winning, a loss within
    /// [`NOISE_ERRORS`] standard errors of the plain measure has [`REFRESH_STEPS`] plain steps
    /// measure plain decoding again before the verdict; once it stands, 1, 2, 4, … doubling
    /// while it keeps losing, and at least enough that the next probe's extra time is at most
    /// [`PROBE_SHARE`] of the burst's; at most [`MAX_LOSING_BURST`] times the ratio of the two
    /// measures, within [`MAX_LOSING_BURST`]..=[`MAX_LOSING_BURST_FAR`]. (A median of a few plain
    /// steps reads low, as a step's time is skewed by its misses; compared with it, speculation
    /// lost where it won.) A refresh after which speculation still wins doubles how long plain
    /// steps stay current, up to [`PLAIN_FRESH_MAX_TOKENS`].
    NeverLose,
}

/// The latest `N` observations: tokens committed, the milliseconds they took, and when (the
/// policy's count of decoded tokens).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Latest<const N: usize> {
    seen: [(usize, f64, u64); N],
    len: usize,
    next: usize,
}

impl<const N: usize> Default for Latest<N> {
    fn default() -> Self {
        Latest {
            seen: [(0, 0.0, 0); N],
            len: 0,
            next: 0,
        }
    }
}

impl<const N: usize> Latest<N> {
    /// Keeps an observation (one without tokens, or with a time that is not one, is ignored),
    /// dropping the oldest once `N` are kept.
    fn add(&mut self, tokens: usize, ms: f64, at: u64) {
        if tokens == 0 || !(ms.is_finite() && ms >= 0.0) {
            return;
        }
        self.seen[self.next] = (tokens, ms, at);
        self.next = (self.next + 1) % N;
        self.len = (self.len + 1).min(N);
    }

    fn kept(&self) -> &[(usize, f64, u64)] {
        &self.seen[..self.len]
    }

    fn tokens(&self) -> usize {
        self.kept().iter().map(|&(t, _, _)| t).sum()
    }

    /// All kept time over all kept tokens.
    fn ms_per_token(&self) -> Option<f64> {
        let ms: f64 = self.kept().iter().map(|&(_, ms, _)| ms).sum();
        let tokens = self.tokens();
        (tokens > 0).then(|| ms / tokens as f64)
    }

    /// Tokens per observation (0 before any).
    fn tokens_each(&self) -> f64 {
        self.tokens() as f64 / self.len.max(1) as f64
    }

    /// Time over tokens of the observations made at `since` or later when there are at least
    /// `least` of them, else of all kept ones.
    fn ms_per_token_since(&self, since: u64, least: usize) -> Option<f64> {
        let recent = self.kept().iter().filter(|o| o.2 >= since);
        let (n, tokens, ms) = recent.fold((0, 0, 0.0), |(n, t, m), o| (n + 1, t + o.0, m + o.1));
        match n >= least.max(1) && tokens > 0 {
            true => Some(ms / tokens as f64),
            false => self.ms_per_token(),
        }
    }

    /// The mean of the times per token of the observations made at `since` or later and its
    /// standard error, if there are at least `least` (and two) of them.
    fn mean_and_error(&self, since: u64, least: usize) -> Option<(f64, f64)> {
        let mut each = [0.0; N];
        let mut n = 0;
        for &(t, ms, _) in self.kept().iter().filter(|o| o.2 >= since) {
            each[n] = ms / t as f64;
            n += 1;
        }
        if n < least.max(2) {
            return None;
        }
        let each = &each[..n];
        let mean = each.iter().sum::<f64>() / n as f64;
        let square: f64 = each.iter().map(|x| (x - mean) * (x - mean)).sum();
        Some((mean, (square / (n - 1) as f64 / n as f64).sqrt()))
    }
}

/// Plain steps kept for the plain measure (those within the horizon count).
const PLAIN_KEPT: usize = 8;

/// A verify policy with its state between cycles (the selector's scratch, the burst counter).
#[derive(Debug, Clone)]
pub struct VerifyPolicy {
    choice: Choice,
    /// Stop drafting early: top-K once no deeper level can change its choice; SpecFit once the
    /// winner takes nothing from the newest level.
    stop_rule: bool,
    /// Charge resident experts `beta_hit` (SpecFit with a residency-aware cost).
    residency: bool,
    /// When to decode plainly between cycles.
    bursts: Bursts,
    /// Cycles in a row that verified nothing ([`Bursts::AfterEmpty`]) or lost
    /// ([`Bursts::NeverLose`]).
    streak: u32,
    /// Tokens decoded so far: speculative cycles' and plain bursts' ([`Bursts::NeverLose`]).
    decoded: u64,
    /// Measured time per token of speculative cycles and of plain steps.
    speculative: Latest<CYCLE_WINDOW>,
    plain: Latest<PLAIN_KEPT>,
    burst: usize,
    /// How many decoded tokens a plain step's time stays current now ([`Bursts::NeverLose`]).
    plain_fresh: u64,
    /// Whether the burst handed out last refreshes the measure of plain decoding.
    refreshing: bool,
    /// Whether the expert slots still had empty ones at the latest cycle
    /// ([`VerifyPolicy::slots_filling`]).
    filling: bool,
    /// How often the target takes drafted children ([`VerifyPolicy::acceptance`]).
    acceptance: Option<Acceptance>,
}

/// What a policy decides after a drafted level.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Draft another level.
    Draft,
    /// Stop drafting and verify these pool nodes (ascending, ancestor-closed; empty = the root).
    Verify(Vec<usize>),
}

impl VerifyPolicy {
    fn with(choice: Choice) -> VerifyPolicy {
        VerifyPolicy {
            choice,
            stop_rule: true,
            residency: false,
            bursts: Bursts::Off,
            streak: 0,
            decoded: 0,
            speculative: Latest::default(),
            plain: Latest::default(),
            burst: 0,
            plain_fresh: PLAIN_FRESH_TOKENS,
            refreshing: false,
            filling: false,
            acceptance: None,
        }
    }

    /// Plain decoding (`ar`).
    pub fn plain() -> VerifyPolicy {
        VerifyPolicy::with(Choice::Plain)
    }

    /// Vanilla EAGLE-3 (`eagle3`): the `k` most probable nodes, drafting stopped once they are
    /// settled.
    pub fn top_k(k: usize) -> VerifyPolicy {
        VerifyPolicy::with(Choice::TopK(k))
    }

    /// SpecFit (`specfit`) on `selector`, with the draft-stop rule.
    pub fn specfit(selector: Selector) -> VerifyPolicy {
        VerifyPolicy::with(Choice::SpecFit(Box::new(selector)))
    }

    /// Turns the draft-stop rule on or off (off: every level of the tree shape is drafted).
    pub fn stop_rule(mut self, on: bool) -> VerifyPolicy {
        self.stop_rule = on;
        self
    }

    /// Turns the residency-aware cost on or off (`specfit-resident`).
    pub fn residency(mut self, on: bool) -> VerifyPolicy {
        self.residency = on;
        self
    }

    /// Sets when to decode plainly between cycles. A plain policy has no cycles, so it keeps
    /// [`Bursts::Off`].
    pub fn bursts(mut self, bursts: Bursts) -> VerifyPolicy {
        if self.drafts() {
            self.bursts = bursts;
            // Never lose starts by measuring plain decoding's cost.
            self.burst = if bursts == Bursts::NeverLose {
                FIRST_PLAIN_STEPS
            } else {
                0
            };
        }
        self
    }

    /// Scores nodes by the probability the target takes them rather than by the drafter's:
    /// starting from `counts` (a calibration's, or none), each drafted child's probability goes
    /// through [`Acceptance::curve`], and [`VerifyPolicy::record_taken`] keeps counting while
    /// decoding. The caller builds the selector's pool from [`VerifyPolicy::path_probs`].
    pub fn acceptance(mut self, counts: Acceptance) -> VerifyPolicy {
        self.acceptance = Some(counts);
        self
    }

    /// The acceptance counts the policy scores with, when it does.
    pub fn acceptance_counts(&self) -> Option<&Acceptance> {
        self.acceptance.as_ref()
    }

    /// The path probabilities the policy scores a pool by. Each node is `(parent, edge, path)`
    /// (parents listed before their children): the drafter's probability of the node given its
    /// parent and along its path. Scoring by acceptance, the curve of the counts multiplied down
    /// each path; otherwise the drafter's path probabilities as given.
    pub fn path_probs(&self, nodes: &[(Option<usize>, f64, f64)]) -> Vec<f64> {
        match &self.acceptance {
            Some(counts) => {
                let parents: Vec<Option<usize>> = nodes.iter().map(|&(p, _, _)| p).collect();
                let edges: Vec<f64> = nodes.iter().map(|&(_, e, _)| e).collect();
                counts.curve().path_probs(&parents, &edges)
            }
            None => nodes.iter().map(|&(_, _, path)| path).collect(),
        }
    }

    /// Counts a drafted child of probability `q` given its parent, whose parent the target
    /// reached, whether it is its parent's top child and whether the target took it (a no-op
    /// when the policy does not score by acceptance).
    pub fn record_taken(&mut self, q: f64, top: bool, taken: bool) {
        if let Some(a) = &mut self.acceptance {
            a.record(q, top, taken);
        }
    }

    /// The burst rule.
    pub fn burst_rule(&self) -> Bursts {
        self.bursts
    }

    pub fn choice(&self) -> &Choice {
        &self.choice
    }

    /// Whether the policy drafts at all (every policy but plain decoding).
    pub fn drafts(&self) -> bool {
        !matches!(self.choice, Choice::Plain)
    }

    /// Whether [`VerifyPolicy::decide`] needs the pool's expert routes (SpecFit); the others
    /// read only parents and path probabilities, and may be given a pool with empty routes.
    pub fn needs_routes(&self) -> bool {
        matches!(self.choice, Choice::SpecFit(_))
    }

    /// Whether [`VerifyPolicy::decide`] reads the resident set.
    pub fn uses_residency(&self) -> bool {
        self.residency && self.needs_routes()
    }

    /// Tokens to decode plainly before the next speculative cycle (handed out once; 0 when the
    /// next cycle should speculate).
    pub fn take_burst(&mut self) -> usize {
        self.decoded += self.burst as u64;
        std::mem::take(&mut self.burst)
    }

    /// Gives back the `left` plain steps of a burst that its generation ended before: the next
    /// [`VerifyPolicy::take_burst`] hands them out again, so a policy decoding one generation
    /// after another (a bench set, a server) keeps its bursts across them.
    pub fn keep_burst(&mut self, left: usize) {
        self.decoded = self.decoded.saturating_sub(left as u64);
        self.burst += left;
    }

    /// Reports a speculative cycle: `tokens` committed in `ms` (drafting, choosing and
    /// verifying). Under [`Bursts::NeverLose`] this sets the next burst.
    pub fn observe_cycle(&mut self, tokens: usize, ms: f64) {
        if self.bursts != Bursts::NeverLose {
            return;
        }
        self.decoded += tokens as u64;
        self.speculative.add(tokens, ms, self.decoded);
        let since = self.decoded.saturating_sub(self.plain_fresh);
        let (Some(spec), Some((plain, error))) = (
            self.speculative.ms_per_token_since(since, RECENT_CYCLES),
            self.plain.mean_and_error(since, PLAIN_FRESH_STEPS),
        ) else {
            self.burst = REFRESH_STEPS;
            self.refreshing = true;
            return;
        };
        let refreshed = std::mem::take(&mut self.refreshing);
        let bar = (1.0 - WIN_MARGIN) * plain;
        let sure = self.speculative.kept().len() >= SURE_CYCLES;
        if !sure && self.filling {
            self.burst = UNSURE_BURST;
            return;
        }
        let questioned = sure && !refreshed && self.streak == 0;
        if spec > bar && spec <= bar + NOISE_ERRORS * error && questioned {
            // Within the noise of the plain steps, while speculation was winning: measure them
            // again before a verdict.
            self.burst = REFRESH_STEPS;
            self.refreshing = true;
            return;
        }
        if spec > bar {
            self.plain_fresh = PLAIN_FRESH_TOKENS;
            // One plain step while the first cycles run on cold caches; from SURE_CYCLES
            // cycles on, doubling, and at least enough that a probing cycle's extra time over
            // plain steps for its tokens is at most PROBE_SHARE of the burst's time.
            if !sure {
                self.burst = 1;
                return;
            }
            self.streak += 1;
            let doubling = 1usize << (self.streak - 1).min(MAX_LOSING_BURST.ilog2());
            let excess = self.speculative.tokens_each() * (spec - plain);
            let enough = (excess / (PROBE_SHARE * plain)).ceil();
            let cap = (MAX_LOSING_BURST as f64 * spec / plain)
                .clamp(MAX_LOSING_BURST as f64, MAX_LOSING_BURST_FAR as f64);
            let enough = enough.min(cap) as usize;
            self.burst = doubling.max(enough);
        } else {
            if refreshed {
                self.plain_fresh = (2 * self.plain_fresh).min(PLAIN_FRESH_MAX_TOKENS);
            }
            self.streak = 0;
            self.burst = 0;
        }
    }

    /// Tells the policy whether the expert slots had empty ones when the cycle the caller
    /// reports next ([`VerifyPolicy::observe_cycle`]) began; false where there are no slots to
    /// fill (experts used in place, a cache emptied every forward).
    pub fn slots_filling(&mut self, filling: bool) {
        self.filling = filling;
    }

    /// Reports plain steps that followed plain steps: `tokens` committed in `ms`. Report one step
    /// at a time (the median then sets a slow one aside), and not the first step of a burst: it
    /// pays for what the cycle before it left in the processor's caches, which plain decoding
    /// does not.
    pub fn observe_plain(&mut self, tokens: usize, ms: f64) {
        self.plain.add(tokens, ms, self.decoded);
    }

    /// The decision after drafting the newest level of `pool`; `more` says whether another level
    /// could be drafted (when not, the answer is always [`Decision::Verify`]). `resident` is
    /// read only when [`VerifyPolicy::uses_residency`].
    pub fn decide(
        &mut self,
        pool: &Pool,
        resident: Option<&ResidentSet>,
        more: bool,
    ) -> Result<Decision, Error> {
        let resident = resident.filter(|_| self.residency);
        let chosen = match &mut self.choice {
            Choice::Plain => Some(Vec::new()),
            Choice::TopK(k) => {
                let (parents, probs) = links(pool);
                let stop = !more
                    || (self.stop_rule && top_k_settled(&parents, &probs, *k, &newest_level(pool)));
                stop.then(|| top_k_closed(&parents, &probs, *k))
            }
            Choice::SpecFit(selector) => {
                if more && !self.stop_rule {
                    None
                } else {
                    let selection = selector.select(pool, resident)?;
                    let decision = stop::decide(pool, selection);
                    (!more || !decision.keep_drafting()).then_some(decision.selection.nodes)
                }
            }
        };
        Ok(match chosen {
            Some(nodes) => {
                self.count_burst(&nodes);
                Decision::Verify(nodes)
            }
            None => Decision::Draft,
        })
    }

    /// [`Bursts::AfterEmpty`]: a cycle verifying nothing doubles the next burst, one verifying
    /// nodes ends the streak.
    fn count_burst(&mut self, nodes: &[usize]) {
        if self.bursts != Bursts::AfterEmpty {
            return;
        }
        if nodes.is_empty() {
            self.streak += 1;
            self.burst = (1usize << (self.streak - 1).min(4)).min(MAX_BURST);
        } else {
            self.streak = 0;
            self.burst = 0;
        }
    }
}

/// A pool's parent links and path probabilities, as the subtree functions take them.
fn links(pool: &Pool) -> (Vec<Option<usize>>, Vec<f64>) {
    (0..pool.len())
        .map(|i| (pool.parent(i), pool.prob(i)))
        .unzip()
}

/// The nodes of the pool's newest (deepest) level.
fn newest_level(pool: &Pool) -> Vec<usize> {
    let depth = pool.max_depth();
    (0..pool.len())
        .filter(|&i| pool.depth(i) == depth)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::CostModel;
    use crate::objective::Objective;
    use crate::pool::PoolBuilder;

    /// Node `i` routes to experts `{i, i+1}` of one layer of 8; the root to `{0, 1}`.
    fn pool(nodes: &[(Option<usize>, f64)]) -> Pool {
        let mut b = PoolBuilder::new(1, 8).unwrap();
        b.root_routes(&[vec![0u32, 1]]).unwrap();
        for (i, &(parent, prob)) in nodes.iter().enumerate() {
            let i = i as u32;
            b.push(parent, prob, &[vec![i % 8, (i + 1) % 8]]).unwrap();
        }
        b.build()
    }

    fn specfit() -> VerifyPolicy {
        let cost = CostModel::paper(vec![1.0; 8], 0.3).unwrap();
        VerifyPolicy::specfit(Selector::new(cost, 7, Objective::Ratio).unwrap())
    }

    #[test]
    fn specfit_stops_drafting_with_the_winner_a_fresh_search_would_choose() {
        // A newest level too improbable to take: the stop rule ends drafting here.
        let p = pool(&[(None, 0.9), (None, 0.05), (Some(0), 0.8), (Some(2), 0.01)]);
        let Decision::Verify(nodes) = specfit().decide(&p, None, true).unwrap() else {
            panic!("the stop rule should end drafting");
        };
        let cost = CostModel::paper(vec![1.0; 8], 0.3).unwrap();
        let fresh = Selector::new(cost, 7, Objective::Ratio)
            .unwrap()
            .select(&p, None)
            .unwrap();
        assert_eq!(nodes, fresh.nodes);
        // Without the stop rule it drafts on, and verifies the same winner at the last level.
        let mut every = specfit().stop_rule(false);
        assert_eq!(every.decide(&p, None, true).unwrap(), Decision::Draft);
        assert_eq!(
            every.decide(&p, None, false).unwrap(),
            Decision::Verify(fresh.nodes)
        );
    }

    #[test]
    fn specfit_drafts_on_while_the_winner_takes_the_newest_level() {
        let p = pool(&[(None, 0.95), (Some(0), 0.9)]);
        assert_eq!(specfit().decide(&p, None, true).unwrap(), Decision::Draft);
        assert_eq!(
            specfit().decide(&p, None, false).unwrap(),
            Decision::Verify(vec![0, 1])
        );
    }

    #[test]
    fn top_k_stops_once_settled_and_chooses_what_drafting_every_level_chooses() {
        // Level 2's best (0.3) is below every chosen node: deeper levels cannot change the top 2.
        let p = pool(&[(None, 0.6), (None, 0.35), (Some(0), 0.3), (Some(1), 0.1)]);
        let mut k2 = VerifyPolicy::top_k(2);
        assert_eq!(
            k2.decide(&p, None, true).unwrap(),
            Decision::Verify(vec![0, 1])
        );
        let mut every = VerifyPolicy::top_k(2).stop_rule(false);
        assert_eq!(every.decide(&p, None, true).unwrap(), Decision::Draft);
        assert_eq!(
            every.decide(&p, None, false).unwrap(),
            Decision::Verify(vec![0, 1])
        );
        // Three are settled (the newest level's best ties the third); four are not (node 3 is
        // less probable than a deeper node could be); five are more than the pool has.
        let mut k3 = VerifyPolicy::top_k(3);
        assert_eq!(
            k3.decide(&p, None, true).unwrap(),
            Decision::Verify(vec![0, 1, 2])
        );
        for k in [4, 5] {
            let mut top = VerifyPolicy::top_k(k);
            assert_eq!(
                top.decide(&p, None, true).unwrap(),
                Decision::Draft,
                "k = {k}"
            );
        }
    }

    #[test]
    fn plain_bursts_double_while_cycles_verify_nothing_and_end_when_one_verifies() {
        // Experts so dear that nothing is worth verifying.
        let dear = CostModel::paper(vec![1.0; 8], 50.0).unwrap();
        let mut p = VerifyPolicy::specfit(Selector::new(dear, 7, Objective::Ratio).unwrap())
            .bursts(Bursts::AfterEmpty);
        // One improbable node that needs two experts of its own.
        let mut b = PoolBuilder::new(1, 8).unwrap();
        b.root_routes(&[vec![0u32, 1]]).unwrap();
        b.push(None, 0.01, &[vec![5u32, 6]]).unwrap();
        let unlikely = b.build();
        let mut bursts = Vec::new();
        for _ in 0..7 {
            assert_eq!(
                p.decide(&unlikely, None, false).unwrap(),
                Decision::Verify(vec![])
            );
            bursts.push(p.take_burst());
            assert_eq!(p.take_burst(), 0, "a burst is handed out once");
        }
        assert_eq!(bursts, [1, 2, 4, 8, 16, 16, 16]);
        let cheap = CostModel::paper(vec![1.0; 8], 0.0).unwrap();
        p.choice = Choice::SpecFit(Box::new(Selector::new(cheap, 7, Objective::Ratio).unwrap()));
        let likely = pool(&[(None, 0.99)]);
        assert_eq!(
            p.decide(&likely, None, false).unwrap(),
            Decision::Verify(vec![0])
        );
        assert_eq!(p.take_burst(), 0);
        // Without plain bursts there are none.
        let mut off = specfit();
        off.decide(&unlikely, None, false).unwrap();
        assert_eq!(off.take_burst(), 0);
    }

    /// Decodes a burst as the engine's decoder does: every step but the first reports `ms`.
    fn run_burst(p: &mut VerifyPolicy, ms: f64) -> usize {
        let burst = p.take_burst();
        for _ in 1..burst {
            p.observe_plain(1, ms);
        }
        burst
    }

    #[test]
    fn never_lose_measures_plain_first_then_bursts_double_while_speculation_costs_more() {
        let mut p = specfit().bursts(Bursts::NeverLose);
        assert_eq!(
            p.take_burst(),
            FIRST_PLAIN_STEPS,
            "plain steps measure plain first"
        );
        // The decoder reports the steps after the first (cold) one.
        for ms in [10.0, 10.0, 10.0] {
            p.observe_plain(1, ms);
        }
        // Cycles of 1 token in 10.1 ms lose by a hair: one plain step each while the first
        // cycles run, then bursts double up to the cap.
        let mut bursts = Vec::new();
        for _ in 0..SURE_CYCLES + 9 {
            p.observe_cycle(1, 10.1);
            bursts.push(run_burst(&mut p, 10.0));
            assert_eq!(p.take_burst(), 0, "a burst is handed out once");
        }
        let doubling = [1, 2, 4, 8, 16, 32, 64, 128, 256, 256];
        assert_eq!(bursts[..SURE_CYCLES - 1], [1; SURE_CYCLES - 1]);
        assert_eq!(bursts[SURE_CYCLES - 1..], doubling[..]);
        // Cycles of 2 tokens in 50 ms lose 30 ms each: from the 8th cycle on, the burst is
        // long enough that 30 ms is 2% of it (150 plain tokens of 10 ms).
        let mut p = specfit().bursts(Bursts::NeverLose);
        run_burst(&mut p, 10.0);
        let mut bursts = Vec::new();
        for _ in 0..SURE_CYCLES {
            p.observe_cycle(2, 50.0);
            bursts.push(run_burst(&mut p, 10.0));
        }
        assert_eq!(bursts, [1, 1, 1, 1, 1, 1, 1, 150]);
        // Cycles of 3 tokens in 15 ms win once they outweigh the window's losing ones.
        let mut good = 0;
        loop {
            p.observe_cycle(3, 15.0);
            good += 1;
            // Losing bursts are 150 long; a win gives none (plain was measured just now).
            if run_burst(&mut p, 10.0) == 0 {
                break;
            }
        }
        // 8 cycles of (2, 50) and k of (3, 15) cost at most 9.7 ms a token (10 ms less the win
        // margin) from k = 18.
        assert_eq!(good, 18);
        // Winning, it speculates on, with REFRESH_STEPS plain steps whenever the latest plain
        // steps are older than the horizon: PLAIN_FRESH_TOKENS (32) at first, 33 tokens after
        // the burst (the win's 3 and 10 cycles'); each refresh after which it still wins doubles
        // the horizon up to PLAIN_FRESH_MAX_TOKENS, so the next come after 22, 43 and 86 cycles
        // of 3 tokens (more than 64, 128 and 256 tokens).
        let mut refreshes = Vec::new();
        for cycle in 1..=250 {
            p.observe_cycle(3, 15.0);
            match run_burst(&mut p, 10.0) {
                0 => {}
                REFRESH_STEPS => refreshes.push(cycle),
                other => panic!("a burst of {other} while winning"),
            }
        }
        assert_eq!(refreshes, [10, 32, 75, 161, 247]);
    }

    #[test]
    fn bursts_may_outgrow_the_cap_as_many_times_as_speculation_costs_more() {
        // Cycles of 8 tokens, each token 2, 3 or 5 times a plain step's 10 ms: once the first
        // cycles are past (one plain step after each, and a refresh of the plain measure when
        // it is 32 tokens old), the burst is long enough that a cycle's extra time (80, 160,
        // 320 ms) is 2% of it (400, 800, 1600 tokens), within MAX_LOSING_BURST times the ratio
        // (512, 768, 1280) and MAX_LOSING_BURST_FAR.
        for (cycle_ms, burst) in [(160.0, 400), (240.0, 768), (400.0, MAX_LOSING_BURST_FAR)] {
            let mut p = specfit().bursts(Bursts::NeverLose);
            run_burst(&mut p, 10.0);
            let mut bursts = Vec::new();
            while bursts.last().is_none_or(|&b| b <= REFRESH_STEPS) {
                p.observe_cycle(8, cycle_ms);
                bursts.push(run_burst(&mut p, 10.0));
            }
            assert_eq!(
                bursts,
                [1, 1, 1, 4, 1, 1, 1, 4, burst],
                "cycles of {cycle_ms} ms"
            );
        }
    }

    /// A never-lose policy past its first plain steps, which measured `plain` ms each, and
    /// past its first [`SURE_CYCLES`] cycles (1 token in `ms` each, one plain step of `plain`
    /// ms after each while they lose).
    fn sure_policy(plain: &[f64], ms: f64) -> VerifyPolicy {
        let mut p = specfit().bursts(Bursts::NeverLose);
        p.take_burst();
        for &each in plain {
            p.observe_plain(1, each);
        }
        for _ in 0..SURE_CYCLES - 1 {
            p.observe_cycle(1, ms);
            run_burst(&mut p, 10.0);
        }
        p
    }

    #[test]
    fn a_loss_within_the_noise_of_the_plain_steps_measures_them_again_before_the_verdict() {
        // Plain steps of 8, 12 and 10 ms: mean 10, standard error 1.15. Cycles at 10.5 ms a
        // token lose by 0.8 ms past the margin (9.7), within two standard errors.
        let mut p = sure_policy(&[8.0, 12.0, 10.0], 10.5);
        p.observe_cycle(1, 10.5);
        assert_eq!(run_burst(&mut p, 10.0), REFRESH_STEPS, "measured again");
        // Measured again (10 ms three more times), the loss stands: a losing burst, long enough
        // that the next probe's 0.5 ms over plain is 2% of it (3 steps of 10 ms).
        p.observe_cycle(1, 10.5);
        assert_eq!(run_burst(&mut p, 10.0), 3, "the verdict's burst");
        // While the losing streak lasts, a loss within the noise is not questioned again.
        p.observe_cycle(1, 10.5);
        assert_eq!(p.take_burst(), 3, "the next verdict's burst");
        // Cycles at 13 ms lose past the noise: a losing burst at once (15 steps).
        let mut p = sure_policy(&[8.0, 12.0, 10.0], 13.0);
        p.observe_cycle(1, 13.0);
        assert_eq!(p.take_burst(), 15);
        // Steady plain steps have no noise to wait out: 10.5 against 10, 10, 10 loses at once.
        let mut p = sure_policy(&[10.0, 10.0, 10.0], 10.5);
        p.observe_cycle(1, 10.5);
        assert_eq!(p.take_burst(), 3);
    }

    #[test]
    fn plain_decoding_costs_the_mean_of_its_steps_not_their_median() {
        // Steps skewed by their misses: 6, 6 and 18 ms cost 10 on average (median 6). Cycles at
        // 8 ms a token win.
        let mut p = sure_policy(&[6.0, 6.0, 18.0], 8.0);
        p.observe_cycle(1, 8.0);
        assert_eq!(p.take_burst(), 0);
    }

    #[test]
    fn speculation_costs_what_its_cycles_over_the_plain_horizon_cost() {
        // Cycles kept at decoded-token counts 10, 20, 30, 40, 50: 1 token in 30 ms each, then
        // 3 tokens in 15 ms each.
        let mut w = Latest::<CYCLE_WINDOW>::default();
        for (at, tokens, ms) in [(10, 1, 30.0), (20, 1, 30.0), (30, 3, 15.0), (40, 3, 15.0)] {
            w.add(tokens, ms, at);
        }
        w.add(3, 15.0, 50);
        // Since 25, three cycles: all of them stand for speculation at least 3, else the whole
        // window does.
        assert_eq!(w.ms_per_token_since(25, 3), Some(45.0 / 9.0));
        assert_eq!(w.ms_per_token_since(25, 4), Some(105.0 / 11.0));
        assert_eq!(w.ms_per_token_since(60, 1), Some(105.0 / 11.0));
        assert_eq!(Latest::<4>::default().ms_per_token_since(0, 1), None);
        // The plain measure: mean and standard error of the times per token since.
        let mut plain = Latest::<PLAIN_KEPT>::default();
        for (at, ms) in [(1, 50.0), (5, 8.0), (6, 12.0), (7, 10.0)] {
            plain.add(1, ms, at);
        }
        let (mean, error) = plain.mean_and_error(5, 3).unwrap();
        assert!((mean - 10.0).abs() < 1e-12 && (error - (4.0f64 / 3.0).sqrt()).abs() < 1e-12);
        assert_eq!(plain.mean_and_error(6, 3), None);
    }

    #[test]
    fn a_losing_verdict_brings_plain_refreshes_back_to_the_shortest_horizon() {
        let mut p = specfit().bursts(Bursts::NeverLose);
        run_burst(&mut p, 10.0);
        // Winning long enough for the horizon to reach its longest.
        let mut refreshes = 0;
        while refreshes < 4 {
            p.observe_cycle(3, 15.0);
            refreshes += usize::from(run_burst(&mut p, 10.0) == REFRESH_STEPS);
        }
        assert_eq!(p.plain_fresh, PLAIN_FRESH_MAX_TOKENS);
        // Cycles turn slower than plain steps: once the window says so, bursts begin.
        let mut cycles = 0;
        loop {
            p.observe_cycle(1, 30.0);
            cycles += 1;
            let burst = run_burst(&mut p, 10.0);
            if burst > 0 && burst != REFRESH_STEPS {
                break;
            }
            assert!(
                cycles < CYCLE_WINDOW,
                "still no verdict after {cycles} cycles"
            );
        }
        assert_eq!(p.plain_fresh, PLAIN_FRESH_TOKENS);
        // Fast again: once the window wins, the plain steps of the last burst stay current for
        // PLAIN_FRESH_TOKENS only (at most 11 cycles of 3 tokens), and the horizon grows again
        // from there (22, then 43 cycles).
        let (mut first_win, mut refreshes) = (None, Vec::new());
        for cycle in 1..=200 {
            p.observe_cycle(3, 15.0);
            match run_burst(&mut p, 10.0) {
                0 => {
                    first_win.get_or_insert(cycle);
                }
                REFRESH_STEPS if first_win.is_some() => refreshes.push(cycle),
                _ => {}
            }
        }
        let first_win = first_win.expect("the window wins again");
        assert!(refreshes[0] <= first_win + 11, "{first_win}: {refreshes:?}");
        let gaps: Vec<usize> = refreshes.windows(2).map(|w| w[1] - w[0]).collect();
        assert_eq!(gaps[..2], [22, 43], "refreshes at cycles {refreshes:?}");
    }

    /// A never-lose policy whose opening plain steps measured 40 ms, then `cycles` cycles of 1
    /// token in 12 ms (the slots `filling` or not), each with its burst of 10 ms steps: the
    /// bursts.
    fn after_a_cold_start(cycles: usize, filling: bool) -> Vec<usize> {
        let mut p = specfit().bursts(Bursts::NeverLose);
        run_burst(&mut p, 40.0);
        (0..cycles)
            .map(|_| {
                p.slots_filling(filling);
                p.observe_cycle(1, 12.0);
                run_burst(&mut p, 10.0)
            })
            .collect()
    }

    #[test]
    fn while_the_slots_fill_the_first_cycles_are_each_followed_by_plain_steps_that_are_measured() {
        // Plain steps measured on the empty slots at the start (40 ms) and cycles, later, on
        // slots that have filled (1 token in 12 ms), where plain decoding is 10 ms.
        let bursts = after_a_cold_start(SURE_CYCLES + 2, true);
        // Whatever the first cycles measure, two plain steps follow each (one reported); then
        // the latest eight plain steps (one at 40 ms, seven at 10) cost 13.75 ms, and 12 wins.
        assert_eq!(bursts[..SURE_CYCLES - 1], [UNSURE_BURST; SURE_CYCLES - 1]);
        assert_eq!(bursts[SURE_CYCLES - 1..], [0, 0, 0]);
        // The same cycles on slots that are full (or on none) win against the start's 40 ms:
        // no plain step between them.
        assert_eq!(after_a_cold_start(SURE_CYCLES, false), [0; SURE_CYCLES]);
        // A losing first cycle on full slots is followed by one plain step, as before.
        let mut p = specfit().bursts(Bursts::NeverLose);
        run_burst(&mut p, 10.0);
        p.observe_cycle(1, 30.0);
        assert_eq!(run_burst(&mut p, 10.0), 1);
    }

    #[test]
    fn never_lose_does_not_compare_cycles_with_plain_steps_measured_long_ago() {
        // Plain steps measured on a cold start (40 ms) and cycles, later, on warm caches
        // (1 token in 12 ms) that plain decoding (10 ms) would beat.
        let bursts = after_a_cold_start(PLAIN_FRESH_TOKENS as usize + 8, false);
        // Against the stale 40 ms the cycles win, until those steps are too old to count; the
        // refresh measures the warm 10 ms, and from then on the cycles lose.
        let stale = PLAIN_FRESH_TOKENS as usize;
        assert!(bursts[..stale].iter().all(|&b| b == 0), "{bursts:?}");
        assert_eq!(bursts[stale], REFRESH_STEPS);
        assert!(bursts[stale + 1..].iter().all(|&b| b > 0), "{bursts:?}");
    }

    #[test]
    fn only_never_lose_reads_the_measured_times_and_plain_decoding_has_no_bursts() {
        for rule in [Bursts::Off, Bursts::AfterEmpty] {
            let mut p = specfit().bursts(rule);
            p.observe_plain(1, 1.0);
            p.observe_cycle(1, 100.0);
            assert_eq!(p.take_burst(), 0, "{rule:?}");
        }
        // A burst's unused steps come back whole.
        let mut p = specfit().bursts(Bursts::NeverLose);
        let first = p.take_burst();
        p.keep_burst(first - 1);
        assert_eq!((p.take_burst(), p.take_burst()), (first - 1, 0));
        let mut plain = VerifyPolicy::plain().bursts(Bursts::NeverLose);
        assert_eq!(plain.burst_rule(), Bursts::Off);
        plain.observe_cycle(1, 100.0);
        assert_eq!(plain.take_burst(), 0);
        // Observations without tokens, or with a time that is not one, are ignored.
        let mut p = specfit().bursts(Bursts::NeverLose);
        p.take_burst();
        for (tokens, ms) in [(0, 5.0), (1, f64::NAN), (1, -1.0), (1, f64::INFINITY)] {
            p.observe_plain(tokens, ms);
        }
        p.observe_cycle(1, 1.0);
        assert_eq!(
            p.take_burst(),
            REFRESH_STEPS,
            "plain decoding is still unmeasured"
        );
    }

    #[test]
    fn the_resident_set_is_read_only_by_a_residency_policy() {
        let cost = CostModel::residency(vec![1.0; 8], 0.0, 5.0).unwrap();
        let selector = Selector::new(cost, 7, Objective::Ratio).unwrap();
        // Node 0 needs experts {0, 1} (the root's); node 1 needs {1, 2}: 2 is a miss unless
        // resident.
        let p = pool(&[(None, 0.5), (Some(0), 0.5)]);
        let resident = ResidentSet::new(1, 8, &[vec![2u32]]).unwrap();
        let mut aware = VerifyPolicy::specfit(selector.clone()).residency(true);
        let mut blind = VerifyPolicy::specfit(selector);
        assert!(aware.uses_residency() && !blind.uses_residency());
        let with = aware.decide(&p, Some(&resident), false).unwrap();
        let without = blind.decide(&p, Some(&resident), false).unwrap();
        assert_eq!(with, Decision::Verify(vec![0, 1]));
        assert_eq!(without, Decision::Verify(vec![0]));
    }
}
