//! The oracle replay against the policies it bounds, on synthetic paper-shaped traces: it takes
//! whole agreeing chains where verifying is free, decodes exactly as plain decoding where it
//! never pays, verifies only nodes the target takes, and is at least as fast as every policy.

use specfit_selector::{Bursts, CostModel, Objective, Selector, VerifyPolicy};
use specfit_sim::oracle::{agreeing_chain, simulate_oracle};
use specfit_sim::synth::{trace, SynthParams};
use specfit_sim::{simulate, Drafting, SimConfig};
use specfit_trace::{TraceHeader, TraceStep};

fn paper_trace(confidence: f64, seed: u64, positions: usize) -> (TraceHeader, Vec<TraceStep>) {
    let mut p = SynthParams::paper(confidence, seed);
    p.positions = positions;
    trace(&p)
}

#[test]
fn with_free_verifies_the_oracle_commits_every_agreeing_chain_whole() {
    let (header, steps) = paper_trace(0.7, 1, 300);
    let config = SimConfig::verify_only(32, CostModel::paper(vec![10.0; 8], 0.0).unwrap());
    let r = simulate_oracle(&header, std::slice::from_ref(&steps), 7, &config).unwrap();
    // The naive walk: at each position the whole chain the target takes, then its bonus token.
    let (mut i, mut committed, mut forwards) = (0, 0, 0);
    while i < steps.len() {
        let n = agreeing_chain(&steps[i], 7.min(steps.len() - i - 1)).len();
        committed += n + 1;
        forwards += 1;
        i += n + 1;
    }
    assert_eq!(r.committed, committed);
    assert_eq!(r.cycles + r.plain_steps, forwards);
    assert!(r.cycles > forwards / 2, "{r:?}");
    assert_eq!(r.time_ms, 10.0 * forwards as f64);
}

#[test]
fn where_verifying_never_pays_the_oracle_decodes_as_plain_decoding_does() {
    let (header, steps) = paper_trace(0.7, 2, 300);
    // Each verified node costs more than a plain step, whatever its reads.
    let a: Vec<f64> = (0..8).map(|n| 10.0 + 1000.0 * n as f64).collect();
    let config = SimConfig::verify_only(32, CostModel::residency(a, 0.01, 0.2).unwrap());
    let oracle = simulate_oracle(&header, std::slice::from_ref(&steps), 7, &config).unwrap();
    let ar = simulate(&header, &steps, &VerifyPolicy::plain(), &config).unwrap();
    assert_eq!(oracle.cycles, 0);
    assert_eq!(oracle.plain_steps, ar.cycles);
    assert_eq!(
        (oracle.committed, oracle.hits, oracle.misses),
        (ar.committed, ar.hits, ar.misses)
    );
    assert!((oracle.time_ms - ar.time_ms).abs() < 1e-9 * ar.time_ms);
}

#[test]
fn the_oracle_verifies_only_what_the_target_takes_and_outruns_every_policy() {
    for (confidence, seed) in [(0.5, 3), (0.8, 4)] {
        let (header, steps) = paper_trace(confidence, seed, 400);
        let a: Vec<f64> = (0..8).map(|n| 20.0 + n as f64).collect();
        let cost = CostModel::residency(a, 0.02, 0.4).unwrap();
        for slots in [0, 16, 48] {
            let mut config = SimConfig::verify_only(slots, cost.clone());
            config.drafting = Drafting {
                ms_per_level: 2.0,
                feed_ms: 2.0,
                ..Drafting::default()
            };
            let oracle =
                simulate_oracle(&header, std::slice::from_ref(&steps), 7, &config).unwrap();
            assert_eq!(
                oracle.verified_nodes,
                oracle.committed - oracle.cycles - oracle.plain_steps,
                "every verified node is accepted"
            );
            let specfit = |bursts| {
                let s = Selector::new(cost.clone(), 7, Objective::Ratio).unwrap();
                VerifyPolicy::specfit(s).bursts(bursts)
            };
            for policy in [
                VerifyPolicy::plain(),
                VerifyPolicy::top_k(7),
                specfit(Bursts::Off),
                specfit(Bursts::NeverLose),
            ] {
                let r = simulate(&header, &steps, &policy, &config).unwrap();
                assert!(
                    oracle.tokens_per_second() >= r.tokens_per_second(),
                    "confidence {confidence}, {slots} slots: oracle {} < {:?} {}",
                    oracle.tokens_per_second(),
                    policy.choice(),
                    r.tokens_per_second()
                );
            }
        }
    }
}
