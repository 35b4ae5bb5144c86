//! How far SpecFit is from the oracle on recorded traces, and how much of the distance better
//! acceptance counts would close: plain decoding, EAGLE-3, SpecFit as the bench builds it (the
//! calibration's paper-form cost and acceptance counts, the never-lose bursts, still learning
//! while it replays), SpecFit starting from acceptance counts taken on other traces (every drafted
//! child of a node the target reached: what a long-running session would have counted), with and
//! without bursts, and the oracle ([`specfit_sim::oracle`]), all replayed with the calibration's
//! residency-aware costs at `SLOTS` slots. Two references beside them: SpecFit on the
//! calibration's counts without bursts (what the never-lose rule costs where speculation pays,
//! and what it saves where it does not) and EAGLE-3's top-`k` for every `k` up to the
//! calibration's node budget (whether one fixed tree size does as well as choosing per position).
//!
//! ```sh
//! cargo run --release -p specfit-sim --example headroom -- CALIBRATION SLOTS TRACE… [--acceptance-from TRACE…]
//! ```
//!
//! Without `--acceptance-from` the counts come from the replayed traces themselves (in sample).

mod common;

use common::{calibration_counts, load, read};
use specfit_selector::json::CalibrationJson;
use specfit_selector::{Acceptance, Bursts, VerifyPolicy};
use specfit_sim::oracle::{children_taken_along_chain, simulate_oracle};
use specfit_sim::{simulate_many, SimConfig, SimReport};
use specfit_trace::TraceStep;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 3 {
        eprintln!("usage: headroom CALIBRATION SLOTS TRACE… [--acceptance-from TRACE…]");
        std::process::exit(2);
    }
    let cal = CalibrationJson::parse(&read(&args[0])).expect("a calibration file");
    let slots: usize = args[1].parse().expect("SLOTS: a number");
    let split = args.iter().position(|a| a == "--acceptance-from");
    let (replayed, counted) = match split {
        Some(at) => (&args[2..at], &args[at + 1..]),
        None => (&args[2..], &args[2..]),
    };
    let (header, traces) = load(replayed);
    let (_, counted) = load(counted);
    let machine = SimConfig {
        slots,
        ..specfit_sim::machine::from_calibration(&cal).expect("a residency-aware fit")
    };
    let k = cal.max_nodes;
    let from_calibration = calibration_counts(&cal);
    let other = acceptance_of(&counted);
    let specfit = |acceptance: &Acceptance, bursts| common::specfit(&cal, acceptance, bursts);
    let replay = |p: &VerifyPolicy| simulate_many(&header, &traces, p, &machine).expect("replay");
    let ar = replay(&VerifyPolicy::plain()).tokens_per_second();
    println!(
        "{} positions in {} traces, {slots} slots; acceptance counted on {} children",
        traces.iter().map(Vec::len).sum::<usize>(),
        traces.len(),
        other.samples()
    );
    let rows = [
        ("ar", VerifyPolicy::plain()),
        ("eagle3", VerifyPolicy::top_k(k)),
        (
            "specfit (calibration's counts)",
            specfit(&from_calibration, Bursts::NeverLose),
        ),
        (
            "specfit (calibration's counts, no bursts)",
            specfit(&from_calibration, Bursts::Off),
        ),
        (
            "specfit (counted counts)",
            specfit(&other, Bursts::NeverLose),
        ),
        (
            "specfit (counted counts, no bursts)",
            specfit(&other, Bursts::Off),
        ),
    ];
    for (name, policy) in &rows {
        print_row(name, &replay(policy), ar);
    }
    for top in 1..=k {
        let name = format!("eagle3 top-{top}");
        print_row(&name, &replay(&VerifyPolicy::top_k(top)), ar);
    }
    let oracle = simulate_oracle(&header, &traces, k, &machine).expect("replay");
    print_row("oracle", &oracle, ar);
}

fn print_row(name: &str, r: &SimReport, ar: f64) {
    let forwards = (r.cycles + r.plain_steps).max(1) as f64;
    println!(
        "{name:<42} {:7.2} tok/s  {:5.2}× ar  tok/forward {:.2}  nodes/forward {:.2}  cycles {:5}  plain steps {:5}",
        r.tokens_per_second(),
        r.tokens_per_second() / ar,
        r.committed as f64 / forwards,
        r.verified_nodes as f64 / forwards,
        r.cycles,
        r.plain_steps
    );
}

/// Every drafted child of a node on the accepted chain (the root included), counted as the
/// decoder counts the children of the nodes it reached.
fn acceptance_of(traces: &[Vec<TraceStep>]) -> Acceptance {
    let mut counts = Acceptance::new();
    for step in traces.iter().flatten() {
        for c in children_taken_along_chain(step) {
            counts.record(c.q, c.top, c.taken);
        }
    }
    counts
}
