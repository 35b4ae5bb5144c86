//! The never-lose rule under the machine's timing noise: SpecFit as the bench builds it (the
//! calibration's paper-form cost and acceptance counts, the never-lose bursts) and without
//! bursts, against plain decoding, replayed on recorded traces with the calibration's
//! residency-aware costs at 64 / 16 / 8 / 4 / 0 slots, with log-normal timing noise σ = 0,
//! 0.15 and 0.3 (8 seeds each). `DEARER_MS` adds that much to every verify and scales drafting by
//! 1 + `DEARER_MS` (where speculation should lose). BENCHMARKS.md, "Never lose through the
//! timing noise".
//!
//! ```sh
//! cargo run --release -p specfit-sim --example noise_replay -- CALIBRATION DEARER_MS TRACE…
//! ```

mod common;

use common::{calibration_counts, load, read};
use specfit_selector::json::CalibrationJson;
use specfit_selector::{Bursts, CostModel, VerifyPolicy};
use specfit_sim::{simulate_many, SimConfig};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 3 {
        eprintln!("usage: noise_replay CALIBRATION DEARER_MS TRACE…");
        std::process::exit(2);
    }
    let cal = CalibrationJson::parse(&read(&args[0])).expect("a calibration file");
    let dearer: f64 = args[1].parse().expect("DEARER_MS: a number");
    let (header, traces) = load(&args[2..]);
    let counts = calibration_counts(&cal);
    let specfit = |bursts| common::specfit(&cal, &counts, bursts);
    let base = specfit_sim::machine::from_calibration(&cal).expect("a residency-aware fit");
    let replay = cal.replay.as_ref().expect("a replay fit");
    let intercepts: Vec<f64> = replay.intercepts.iter().map(|a| a + dearer).collect();
    let true_cost = CostModel::residency(intercepts, replay.beta_hit, replay.beta_miss)
        .expect("the calibration's costs");
    let mut drafting = base.drafting;
    drafting.ms_per_level *= 1.0 + dearer;
    for slots in [64usize, 16, 8, 4, 0] {
        for sigma in [0.0, 0.15, 0.3] {
            let seeds = if sigma == 0.0 { 1 } else { 8 };
            let (mut never, mut off, mut plain_share) = (Vec::new(), Vec::new(), Vec::new());
            for seed in 1..=seeds {
                let machine = SimConfig {
                    slots,
                    noise: sigma,
                    noise_seed: seed,
                    true_cost: true_cost.clone(),
                    drafting,
                    ..base.clone()
                };
                let run = |p: &VerifyPolicy| {
                    simulate_many(&header, &traces, p, &machine).expect("replay")
                };
                let ar = run(&VerifyPolicy::plain()).tokens_per_second();
                let n = run(&specfit(Bursts::NeverLose));
                never.push(n.tokens_per_second() / ar);
                off.push(run(&specfit(Bursts::Off)).tokens_per_second() / ar);
                plain_share.push(n.plain_steps as f64 / n.committed.max(1) as f64);
            }
            let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
            let least = never.iter().copied().fold(f64::MAX, f64::min);
            println!(
                "slots {slots:>3}  noise {sigma:.2}:  specfit {:.3}x ar (lowest {least:.3}), plain steps per token {:.2}  |  without bursts {:.3}x",
                mean(&never),
                mean(&plain_share),
                mean(&off)
            );
        }
    }
}
