//! Plain bursts in replay: the never-lose rule against plain decoding and against the paper's
//! SpecFit on synthetic paper-shaped traces, where drafting pays and where it cannot.

use specfit_selector::{
    Bursts, CostModel, Objective, Selector, VerifyPolicy, FIRST_PLAIN_STEPS, PLAIN_FRESH_TOKENS,
    REFRESH_STEPS, SURE_CYCLES,
};
use specfit_sim::synth::{trace, SynthParams};
use specfit_sim::{simulate, Drafting, SimConfig, SimReport};

/// SpecFit believing the true verify cost, with a burst rule.
fn specfit(cost: &CostModel, bursts: Bursts) -> VerifyPolicy {
    let selector = Selector::new(cost.clone(), 7, Objective::Ratio).unwrap();
    VerifyPolicy::specfit(selector).bursts(bursts)
}

/// A 48-slot machine whose verify costs `20 ms + 0.2 ms` per missed expert and whose drafter
/// costs `ms_per_level` per level past the first and as much again to feed.
fn machine(ms_per_level: f64) -> (CostModel, SimConfig) {
    let cost = CostModel::residency(vec![20.0; 8], 0.0, 0.2).unwrap();
    let mut config = SimConfig::verify_only(48, cost.clone());
    config.drafting = Drafting {
        ms_per_level,
        feed_ms: ms_per_level,
        ..Drafting::default()
    };
    (cost, config)
}

/// Plain decoding, the paper's SpecFit and SpecFit with the never-lose rule replayed on
/// `positions` of a paper-shaped trace (`confidence`, `seed`) on [`machine`]`(ms_per_level)`.
fn three_ways(confidence: f64, seed: u64, positions: usize, ms_per_level: f64) -> [SimReport; 3] {
    let mut p = SynthParams::paper(confidence, seed);
    p.positions = positions;
    let (header, steps) = trace(&p);
    let (cost, config) = machine(ms_per_level);
    [
        VerifyPolicy::plain(),
        specfit(&cost, Bursts::Off),
        specfit(&cost, Bursts::NeverLose),
    ]
    .map(|policy| simulate(&header, &steps, &policy, &config).unwrap())
}

#[test]
fn never_lose_decodes_at_plain_speed_where_drafting_cannot_pay() {
    // Each drafted level and the feeding cost two thirds of a plain step.
    let [plain, paper, never] = three_ways(0.7, 3, 2000, 20.0);
    let (plain, paper, never) = (
        plain.tokens_per_second(),
        paper.tokens_per_second(),
        never.tokens_per_second(),
    );
    assert!(
        paper < 0.8 * plain,
        "drafting should lose here: {paper} vs {plain}"
    );
    assert!(
        never >= 0.97 * plain,
        "never lose: {never} vs plain {plain}"
    );
}

#[test]
fn never_lose_keeps_speculating_where_drafting_pays() {
    let [plain, paper, never] = three_ways(0.8, 5, 300, 1.0);
    assert!(paper.tokens_per_second() > 1.2 * plain.tokens_per_second());
    // The measuring plain steps at the start, one after each of the first (cold) cycles that
    // lost, and the refreshes: one whenever the latest plain steps are PLAIN_FRESH_TOKENS old.
    let refreshes = 1 + never.committed / PLAIN_FRESH_TOKENS as usize;
    let most = FIRST_PLAIN_STEPS + SURE_CYCLES + REFRESH_STEPS * refreshes;
    assert!(
        never.plain_steps > 0 && never.plain_steps <= most,
        "{never:?}"
    );
    assert!(
        never.tokens_per_second() >= 0.95 * paper.tokens_per_second(),
        "{} vs {}",
        never.tokens_per_second(),
        paper.tokens_per_second()
    );
}

#[test]
fn every_position_is_committed_once_with_or_without_bursts() {
    let mut p = SynthParams::paper(0.6, 9);
    p.positions = 120;
    let (header, steps) = trace(&p);
    let (cost, config) = machine(40.0);
    for bursts in [Bursts::Off, Bursts::AfterEmpty, Bursts::NeverLose] {
        let r = simulate(&header, &steps, &specfit(&cost, bursts), &config).unwrap();
        // The last cycle may accept past the trace's end.
        assert!(r.committed >= steps.len(), "{bursts:?}: {r:?}");
        assert!(r.committed <= steps.len() + 8, "{bursts:?}: {r:?}");
    }
}
