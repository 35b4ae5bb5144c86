//! Hand-checked replays of a tiny trace: one MoE layer of 4 experts, unit costs.

use specfit_selector::{CostModel, Objective, Selector, VerifyPolicy};
use specfit_sim::{simulate, SimConfig};
use specfit_trace::{TraceHeader, TraceNode, TraceStep};

fn node(
    parent: i64,
    token: u32,
    prob: f64,
    depth: usize,
    experts: &[u32],
    agrees: bool,
) -> TraceNode {
    TraceNode {
        parent,
        token,
        prob,
        depth,
        routes: vec![experts.to_vec()],
        agrees,
    }
}

/// Four positions. The root always routes to expert 0. At every position the drafted pool is a
/// chain of two nodes on experts 1 and 2; the first node agrees at positions 0 and 2, the second
/// only at position 0.
fn trace() -> (TraceHeader, Vec<TraceStep>) {
    let header = TraceHeader::new(1, 4, 1, 16);
    let steps = (0..4)
        .map(|p| TraceStep {
            position: 10 + p,
            root: 1,
            root_routes: vec![vec![0]],
            nodes: vec![
                node(-1, 5, 0.9, 1, &[1], p % 2 == 0),
                node(0, 6, 0.45, 2, &[2], p == 0),
            ],
            next: 5,
        })
        .collect();
    (header, steps)
}

/// SpecFit believing `a = 10 ms`, `β = 5 ms` per expert of the union, with the stop rule.
fn paper_specfit() -> VerifyPolicy {
    let cost = CostModel::paper(vec![10.0; 8], 5.0).unwrap();
    VerifyPolicy::specfit(Selector::new(cost, 7, Objective::Ratio).unwrap())
}

fn config(slots: usize) -> SimConfig {
    // time = 10 + 0·hits + 1·misses, whatever the node count.
    SimConfig::verify_only(
        slots,
        CostModel::residency(vec![10.0; 8], 0.0, 1.0).unwrap(),
    )
}

#[test]
fn autoregressive_replay_commits_one_token_per_position() {
    let (h, s) = trace();
    let r = simulate(&h, &s, &VerifyPolicy::plain(), &config(4)).unwrap();
    // 4 cycles; expert 0 is copied once, then hits: time = 4·10 + 1.
    assert_eq!(
        (r.cycles, r.committed, r.verified_nodes, r.hits, r.misses),
        (4, 4, 0, 3, 1)
    );
    assert_eq!(r.time_ms, 41.0);
}

#[test]
fn top_k_replay_follows_the_agreement_flags() {
    let (h, s) = trace();
    let r = simulate(&h, &s, &VerifyPolicy::top_k(2), &config(4)).unwrap();
    // Position 0: both nodes agree → 3 tokens; position 3 is the last token, decoded plainly.
    assert_eq!(
        (r.cycles, r.plain_steps, r.committed, r.verified_nodes),
        (1, 1, 4, 2)
    );
    // The cycle copies experts 0, 1, 2; the plain step hits expert 0.
    assert_eq!((r.hits, r.misses), (1, 3));
    assert_eq!(r.time_ms, 10.0 + 3.0 + 10.0);
    // With the cache cleared every forward, both forwards copy everything.
    let cleared = simulate(&h, &s, &VerifyPolicy::top_k(2), &config(0)).unwrap();
    assert_eq!((cleared.hits, cleared.misses), (0, 4));
}

#[test]
fn specfit_replay_skips_nodes_its_costs_make_unprofitable() {
    let (h, s) = trace();
    // Believed costs: a = 10 ms, β = 5 ms per expert of the union (root included). None:
    // 1/15 = .0667; first node: 1.9/20 = .095; both: 2.35/25 = .094 → SpecFit verifies one node.
    let policy = paper_specfit();
    let r = simulate(&h, &s, &policy, &config(4)).unwrap();
    // Positions 0 (accept 1 → 2 tokens), 2 (accept 1 → 2 tokens): 2 cycles, 4 tokens.
    assert_eq!((r.cycles, r.committed, r.verified_nodes), (2, 4, 2));
    // 4 tokens in the replayed time.
    assert_eq!(r.tokens_per_second(), 1e3 * 4.0 / r.time_ms);
}

#[test]
fn traces_with_gaps_are_refused() {
    let (h, mut s) = trace();
    s[2].position = 99;
    let err = simulate(&h, &s, &VerifyPolicy::plain(), &config(4)).unwrap_err();
    assert!(
        matches!(
            err,
            specfit_sim::SimError::Gap {
                index: 2,
                got: 99,
                want: 12
            }
        ),
        "{err}"
    );
}

#[test]
fn drafting_costs_are_charged_per_drafted_level_and_fed_token_but_not_to_plain_decoding() {
    let (h, s) = trace();
    let mut c = config(4);
    c.drafting = specfit_sim::Drafting {
        ms_per_level: 1.0,
        feed_ms: 2.0,
        feed_ms_per_token: 0.5,
        ..Default::default()
    };
    // Plain decoding drafts nothing: the same 41 ms as without drafting costs.
    assert_eq!(
        simulate(&h, &s, &VerifyPolicy::plain(), &c)
            .unwrap()
            .time_ms,
        41.0
    );
    // Top-2 drafts both levels in its one cycle (one drafter forward past level 1) and feeds 3
    // committed tokens: 23 + (1 + 2 + 1.5); the last token's plain step drafts nothing.
    let r = simulate(&h, &s, &VerifyPolicy::top_k(2), &c).unwrap();
    assert_eq!(r.time_ms, 23.0 + 4.5);
    // SpecFit's winner on the level-1 pool takes the level-1 node, so the stop rule drafts level
    // 2 as well at position 0 (one level, the fixed feed, 2 fed tokens); at position 2 two
    // tokens are left, so one level is drafted (no level past the first, the feed, 2 tokens).
    let policy = paper_specfit();
    let plain = simulate(&h, &s, &policy, &config(4)).unwrap();
    let charged = simulate(&h, &s, &policy, &c).unwrap();
    assert_eq!(charged.committed, plain.committed);
    assert_eq!(
        charged.time_ms - plain.time_ms,
        (1.0 + 2.0 + 2.0 * 0.5) + (2.0 + 2.0 * 0.5)
    );
}

#[test]
fn each_read_round_pays_one_read_latency_and_plain_steps_use_their_own_cost() {
    let (h, s) = trace();
    let mut c = config(4);
    c.read_round_ms = 2.0;
    // Plain decoding copies expert 0 once, in its one layer: 41 + 2.
    assert_eq!(
        simulate(&h, &s, &VerifyPolicy::plain(), &c)
            .unwrap()
            .time_ms,
        43.0
    );
    c.plain = Some(specfit_sim::PlainCost {
        intercept: 3.0,
        beta_hit: 0.25,
        beta_miss: 0.5,
        read_round_ms: 1.0,
        slot_wait_ms: 0.0,
        context_ms: 0.125,
    });
    // 4 steps of 3 ms, 3 hits, 1 miss in 1 layer, positions 10..=13 cached: 12 + 0.75 + 0.5 + 1
    // + 0.125 · 46.
    let r = simulate(&h, &s, &VerifyPolicy::plain(), &c).unwrap();
    assert_eq!(r.time_ms, 12.0 + 0.75 + 0.5 + 1.0 + 0.125 * 46.0);
    // Speculative cycles still pay the verify cost (with its per-layer latency), not the plain
    // one. Top-2's one cycle copies experts 0, 1 and 2 in the one layer, one read at a time: 3
    // rounds; the last token's plain step (position 13) hits expert 0.
    let cycle = 10.0 + 3.0;
    let last = 3.0 + 0.25 + 0.125 * 13.0;
    let topk = simulate(&h, &s, &VerifyPolicy::top_k(2), &c).unwrap();
    assert_eq!(topk.time_ms, cycle + 3.0 * 2.0 + last);
    // With 2 reads in flight the three copies take 2 rounds, with 8 one.
    c.read_width = 2;
    let two = simulate(&h, &s, &VerifyPolicy::top_k(2), &c).unwrap();
    assert_eq!(two.time_ms, cycle + 2.0 * 2.0 + last);
    c.read_width = 8;
    let eight = simulate(&h, &s, &VerifyPolicy::top_k(2), &c).unwrap();
    assert_eq!(eight.time_ms, cycle + 2.0 + last);
}

#[test]
fn reads_in_flight_are_capped_by_the_slots_they_land_in() {
    let (h, s) = trace();
    let with = |slots: usize, width: usize| {
        let mut c = config(slots);
        c.read_round_ms = 2.0;
        c.read_width = width;
        simulate(&h, &s, &VerifyPolicy::top_k(2), &c)
            .unwrap()
            .time_ms
    };
    // Two slots hold two reads at once, however many I/O threads there are: the first cycle's three
    // copies take two rounds (as with two threads), not one; with one thread, three.
    assert_eq!(with(2, 8), with(2, 2));
    assert!(with(2, 2) < with(2, 1));
    // A cleared cache (no slots kept) still has every thread's read in flight.
    assert_eq!(with(0, 8), with(0, 3));
    assert!(with(0, 8) < with(0, 2));
}

#[test]
fn drafting_costs_grow_with_the_tokens_already_cached() {
    let (h, s) = trace();
    let base = simulate(&h, &s, &VerifyPolicy::top_k(2), &config(4)).unwrap();
    let mut c = config(4);
    c.drafting = specfit_sim::Drafting {
        level_context_ms: 0.5,
        feed_context_ms: 0.25,
        ..Default::default()
    };
    // One cycle at position 10, one level past the first, feeding 3 tokens; the last token
    // (position 13) is a plain step, which drafts nothing.
    let r = simulate(&h, &s, &VerifyPolicy::top_k(2), &c).unwrap();
    assert_eq!(r.time_ms, base.time_ms + 0.5 * 10.0 + 0.25 * 30.0);
    assert_eq!(
        simulate(&h, &s, &VerifyPolicy::plain(), &c)
            .unwrap()
            .time_ms,
        41.0
    );
}

#[test]
fn reads_that_wait_for_a_slot_pay_their_own_term() {
    let (h, s) = trace();
    let with = |slots: usize, wait: f64| {
        let mut c = config(slots);
        c.read_width = 8;
        c.slot_wait_ms = wait;
        simulate(&h, &s, &VerifyPolicy::top_k(2), &c)
            .unwrap()
            .time_ms
    };
    // Through 2 slots the first cycle's three copies (experts 0, 1, 2) start two at once and
    // the third once the first is computed: one read waits (the second cycle copies 0 again,
    // evicted by 2, with a slot free). Through 4 slots nothing waits.
    assert_eq!(with(2, 3.0), with(2, 0.0) + 3.0);
    assert_eq!(with(4, 3.0), with(4, 0.0));
}

#[test]
fn a_cycle_drafts_no_more_levels_than_the_tokens_left_can_use() {
    let (h, s) = trace();
    // The first two positions only: two tokens left, so top-2 drafts one level and verifies
    // node 0 alone (node 1 would agree, but a third token is past the trace's end).
    let r = simulate(&h, &s[..2], &VerifyPolicy::top_k(2), &config(4)).unwrap();
    assert_eq!((r.cycles, r.committed, r.verified_nodes), (1, 2, 1));
    assert_eq!(r.time_ms, 10.0 + 2.0);
    // One position: the last token is decoded plainly, as the engine's decoder does.
    let r = simulate(&h, &s[..1], &VerifyPolicy::top_k(2), &config(4)).unwrap();
    assert_eq!((r.cycles, r.plain_steps, r.committed), (0, 1, 1));
    assert_eq!(r.time_ms, 10.0 + 1.0);
}
