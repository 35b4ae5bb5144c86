//! Timing noise in replay ([`SimConfig::noise`]): seeded, of mean one, heard by the never-lose
//! rule as measured times are, and changing no choice of a policy that measures nothing.

use specfit_selector::{Bursts, CostModel, Objective, Selector, VerifyPolicy};
use specfit_sim::synth::{trace, SynthParams};
use specfit_sim::{simulate, Drafting, SimConfig, SimReport};
use specfit_trace::{TraceHeader, TraceStep};

/// A paper-shaped trace of `positions` positions.
fn paper_trace(confidence: f64, seed: u64, positions: usize) -> (TraceHeader, Vec<TraceStep>) {
    let mut p = SynthParams::paper(confidence, seed);
    p.positions = positions;
    trace(&p)
}

/// A 48-slot machine (verify `20 ms + 0.2 ms` per missed expert, a drafted level and the
/// feeding `ms_per_level` each) with timing noise `noise` drawn from `seed`.
fn machine(ms_per_level: f64, noise: f64, seed: u64) -> (CostModel, SimConfig) {
    let cost = CostModel::residency(vec![20.0; 8], 0.0, 0.2).unwrap();
    let config = SimConfig {
        drafting: Drafting {
            ms_per_level,
            feed_ms: ms_per_level,
            ..Drafting::default()
        },
        noise,
        noise_seed: seed,
        ..SimConfig::verify_only(48, cost.clone())
    };
    (cost, config)
}

fn specfit(cost: &CostModel, bursts: Bursts) -> VerifyPolicy {
    let selector = Selector::new(cost.clone(), 7, Objective::Ratio).unwrap();
    VerifyPolicy::specfit(selector).bursts(bursts)
}

fn replay(
    steps: &(TraceHeader, Vec<TraceStep>),
    policy: &VerifyPolicy,
    c: &SimConfig,
) -> SimReport {
    simulate(&steps.0, &steps.1, policy, c).unwrap()
}

#[test]
fn timing_noise_is_seeded_and_keeps_the_mean_time() {
    let t = paper_trace(0.7, 1, 2000);
    let plain = VerifyPolicy::plain();
    let exact = replay(&t, &plain, &machine(1.0, 0.0, 0).1);
    let noisy = replay(&t, &plain, &machine(1.0, 0.3, 7).1);
    // The same forwards, each time scaled by a factor of mean 1 (2000 draws: within 3%).
    assert_eq!((noisy.hits, noisy.misses), (exact.hits, exact.misses));
    let ratio = noisy.time_ms / exact.time_ms;
    assert!((ratio - 1.0).abs() < 0.03, "{ratio}");
    assert_eq!(noisy, replay(&t, &plain, &machine(1.0, 0.3, 7).1));
    assert_ne!(
        noisy.time_ms,
        replay(&t, &plain, &machine(1.0, 0.3, 8).1).time_ms
    );
    // A drafting policy's plain steps too: one position left is decoded plainly.
    let (cost, exact) = machine(1.0, 0.0, 0);
    let last = (t.0, t.1[..1].to_vec());
    let policy = specfit(&cost, Bursts::Off);
    let plain_step = |c: &SimConfig| replay(&last, &policy, c);
    let (a, b) = (plain_step(&exact), plain_step(&machine(1.0, 0.3, 7).1));
    assert_eq!((a.plain_steps, b.plain_steps), (1, 1));
    assert_ne!(a.time_ms, b.time_ms);
}

#[test]
fn noise_changes_no_choice_of_a_policy_that_measures_nothing() {
    let t = paper_trace(0.8, 5, 300);
    let (cost, exact) = machine(1.0, 0.0, 0);
    let (_, noisy) = machine(1.0, 0.4, 3);
    let policy = specfit(&cost, Bursts::Off);
    let (a, b) = (replay(&t, &policy, &exact), replay(&t, &policy, &noisy));
    assert_eq!(
        (a.cycles, a.verified_nodes, a.committed, a.hits, a.misses),
        (b.cycles, b.verified_nodes, b.committed, b.hits, b.misses)
    );
    assert_ne!(a.time_ms, b.time_ms);
}

#[test]
fn the_never_lose_rule_hears_the_noise_and_decodes_more_plainly() {
    // Drafting pays by a modest margin; measured through noise, some verdicts come out wrong.
    let t = paper_trace(0.8, 5, 2000);
    let plain_steps = |noise| {
        let (cost, config) = machine(1.0, noise, 11);
        replay(&t, &specfit(&cost, Bursts::NeverLose), &config).plain_steps
    };
    let (exact, noisy) = (plain_steps(0.0), plain_steps(0.4));
    assert!(
        noisy > exact,
        "{noisy} plain steps with noise, {exact} without"
    );
}
