//! The oracle: a replay in which the selector knows which drafts the target takes. At each
//! position it may verify any prefix of the recorded pool's agreeing chain (the nodes the target
//! would accept, at most `max_nodes`), drafting only that prefix's levels, or decode the token
//! plainly; it takes whichever commits tokens fastest at the slots' current state. No engine can
//! run it (it reads the future from the trace); it is the reference for how much of what this
//! drafter's pools offer on this machine a real selector gets. It is not a strict bound: it
//! prices each position alone, so what a verify leaves in the slots can cost later positions
//! more than it gained (on a few tokens of a small cache it can even fall below plain
//! decoding). The replay's costs and caches are the policy replay's ([`crate::simulate_many`]);
//! this module owns only the choice.

use specfit_selector::ChildTaken;
use specfit_trace::{TraceHeader, TraceStep};

use crate::{
    check_consecutive, children_taken, plain_step_ms, verify_ms, verify_union, Lru, SimConfig,
    SimError, SimReport,
};

/// Replays `traces` one after the other (the caches carrying over, as in
/// [`crate::simulate_many`]) with the oracle choosing at each position, verifying at most
/// `max_nodes` nodes.
pub fn simulate_oracle(
    header: &TraceHeader,
    traces: &[Vec<TraceStep>],
    max_nodes: usize,
    config: &SimConfig,
) -> Result<SimReport, SimError> {
    let mut lru = Lru::new(header, config);
    let mut report = SimReport::default();
    for steps in traces {
        replay(header, steps, max_nodes, config, &mut lru, &mut report)?;
    }
    Ok(report)
}

/// The nodes of `step`'s pool the target takes, root first down (each the agreeing child of the
/// one before), at most `most` of them.
pub fn agreeing_chain(step: &TraceStep, most: usize) -> Vec<usize> {
    let mut chain = Vec::new();
    let mut here = -1i64;
    while chain.len() < most {
        let Some(next) = step.nodes.iter().position(|n| n.parent == here && n.agrees) else {
            break;
        };
        chain.push(next);
        here = next as i64;
    }
    chain
}

/// What `step` tells about the drafter's children when the target walks its whole agreeing
/// chain: each child of the root and of every chain node, with its probability given its parent,
/// whether it is its parent's top child and whether the target takes it (what a decoder that
/// verified the chain would count).
pub fn children_taken_along_chain(step: &TraceStep) -> Vec<ChildTaken> {
    let mut reached = vec![-1i64];
    reached.extend(
        agreeing_chain(step, usize::MAX)
            .into_iter()
            .map(|i| i as i64),
    );
    children_taken(step, usize::MAX, &reached)
}

/// One way to commit tokens at a position, priced at the slots' state before it.
struct Way {
    /// Chain nodes verified (0: a plain step).
    nodes: usize,
    lru: Lru,
    ms: f64,
    draft_ms: f64,
    hits: u64,
    misses: u64,
}

impl Way {
    fn tokens_per_ms(&self) -> f64 {
        (self.nodes + 1) as f64 / self.ms
    }
}

/// One trace's positions, added to `report`.
fn replay(
    header: &TraceHeader,
    steps: &[TraceStep],
    max_nodes: usize,
    config: &SimConfig,
    lru: &mut Lru,
    report: &mut SimReport,
) -> Result<(), SimError> {
    check_consecutive(steps)?;
    let mut i = 0;
    // Plain steps since the last verified chain: the drafter learns them when drafting resumes.
    let mut unlearned = 0;
    while i < steps.len() {
        let step = &steps[i];
        // Levels past the tokens left would be drafted for nothing (as in the engine).
        let chain = agreeing_chain(step, max_nodes.min(steps.len() - i - 1));
        let best = (0..=chain.len())
            .map(|n| price(header, step, &chain[..n], unlearned, config, lru))
            .reduce(|best, o| {
                // The faster per token; at a tie the shorter (fewer bytes for the same rate).
                if o.tokens_per_ms() > best.tokens_per_ms() {
                    o
                } else {
                    best
                }
            })
            .expect("the plain step is always an option");
        *lru = best.lru;
        report.time_ms += best.ms;
        report.draft_ms += best.draft_ms;
        report.hits += best.hits;
        report.misses += best.misses;
        report.committed += best.nodes + 1;
        if best.nodes == 0 {
            report.plain_steps += 1;
            unlearned += 1;
        } else {
            report.cycles += 1;
            report.verified_nodes += best.nodes;
            unlearned = 0;
        }
        i += best.nodes + 1;
    }
    Ok(())
}

/// What committing `chain` (accepted, plus the bonus token) at `step` costs from the slots in
/// `lru`: a plain step when it is empty, else drafting its levels, verifying it and feeding the
/// drafter what it committed.
fn price(
    header: &TraceHeader,
    step: &TraceStep,
    chain: &[usize],
    unlearned: usize,
    config: &SimConfig,
    lru: &Lru,
) -> Way {
    let mut lru = lru.clone();
    let charged = lru.access(&verify_union(header, step, chain), config.read_width);
    let context = step.position as f64;
    let (ms, draft_ms) = match chain.len() {
        0 => (plain_step_ms(config, &charged, context), 0.0),
        n => {
            let d = &config.drafting;
            let drafting = d.drafting_ms(unlearned, n, context);
            let ms = verify_ms(config, n, &charged, context) + drafting + d.feed(n + 1, context);
            (ms, drafting)
        }
    };
    Way {
        nodes: chain.len(),
        lru,
        ms,
        draft_ms,
        hits: charged.hits,
        misses: charged.misses,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use specfit_trace::TraceNode;

    /// A step whose nodes are (parent, agrees), one expert each in one layer.
    fn step(nodes: &[(i64, bool)]) -> TraceStep {
        let depth = |mut p: i64, nodes: &[(i64, bool)]| {
            let mut d = 1;
            while p >= 0 {
                p = nodes[p as usize].0;
                d += 1;
            }
            d
        };
        TraceStep {
            position: 0,
            root: 0,
            root_routes: vec![vec![0]],
            nodes: nodes
                .iter()
                .map(|&(parent, agrees)| TraceNode {
                    parent,
                    token: 0,
                    prob: 0.5,
                    depth: depth(parent, nodes),
                    routes: vec![vec![1]],
                    agrees,
                })
                .collect(),
            next: 0,
        }
    }

    #[test]
    fn the_chain_follows_agreeing_children_from_the_root_and_stops_at_the_budget() {
        // Root children 0 (no) and 1 (yes); under 1: 2 (no), 3 (yes); under 3: 4 (yes); under
        // 0: 5 (yes, but 0 is not taken).
        let s = step(&[
            (-1, false),
            (-1, true),
            (1, false),
            (1, true),
            (3, true),
            (0, true),
        ]);
        assert_eq!(agreeing_chain(&s, 7), vec![1, 3, 4]);
        assert_eq!(agreeing_chain(&s, 2), vec![1, 3]);
        assert_eq!(agreeing_chain(&s, 0), Vec::<usize>::new());
        let none = step(&[(-1, false), (0, true)]);
        assert_eq!(agreeing_chain(&none, 7), Vec::<usize>::new());
        // The children of the root and of chain nodes 1, 3, 4 (not 5, under node 0), each with
        // its probability given its parent (every path probability here is 0.5, so the first
        // of two siblings is the top child).
        let child = |q, top, taken| ChildTaken { q, top, taken };
        assert_eq!(
            children_taken_along_chain(&s),
            vec![
                child(0.5, true, false),
                child(0.5, false, true),
                child(1.0, true, false),
                child(1.0, false, true),
                child(1.0, true, true)
            ]
        );
        assert_eq!(
            children_taken_along_chain(&none),
            vec![child(0.5, true, false)]
        );
    }
}
