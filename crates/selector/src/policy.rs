//! The verify policy: after each drafted level, whether to draft another one or which
//! ancestor-closed subtree of the pool to verify — plain decoding, vanilla EAGLE-3's top-K, or
//! SpecFit's exact search with its draft-stop rule, residency and plain bursts. One decision
//! function ([`VerifyPolicy::decide`]) serves the engine's decoder and the simulator, so both
//! stop and choose alike. It does not draft, route or time anything.

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

/// The longest plain burst of a policy with plain bursts.
pub const MAX_BURST: usize = 16;

/// A verify policy with its state between cycles (the selector's scratch, the burst counter).
#[derive(Debug, Clone)]
pub struct VerifyPolicy {
    choice: Choice,
    /// Stop drafting early: top-K once no deeper level can change its choice; SpecFit once the
    /// winner takes nothing from the newest level.
    stop_rule: bool,
    /// Charge resident experts `beta_hit` (SpecFit with a residency-aware cost).
    residency: bool,
    /// After a cycle that verifies nothing, decode 1, 2, 4, … up to [`MAX_BURST`] tokens plainly.
    plain_bursts: bool,
    empty_streak: u32,
    burst: usize,
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
            plain_bursts: false,
            empty_streak: 0,
            burst: 0,
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

    /// Turns plain bursts on or off (`specfit-adaptive`).
    pub fn plain_bursts(mut self, on: bool) -> VerifyPolicy {
        self.plain_bursts = on;
        self
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

    /// Tokens to decode plainly before the next speculative cycle (then 0 until a cycle again
    /// verifies nothing).
    pub fn take_burst(&mut self) -> usize {
        std::mem::take(&mut self.burst)
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

    /// Plain bursts: a cycle verifying nothing doubles the next burst, one verifying nodes ends
    /// the streak.
    fn count_burst(&mut self, nodes: &[usize]) {
        if !self.plain_bursts {
            return;
        }
        if nodes.is_empty() {
            self.empty_streak += 1;
            self.burst = (1usize << (self.empty_streak - 1).min(4)).min(MAX_BURST);
        } else {
            self.empty_streak = 0;
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
            .plain_bursts(true);
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
