//! What the replay examples share: reading a calibration or trace file, loading traces, and
//! SpecFit as the bench builds it from a calibration.

use specfit_selector::json::CalibrationJson;
use specfit_selector::{Acceptance, Bursts, Objective, Selector, VerifyPolicy};
use specfit_trace::{TraceHeader, TraceStep};

/// The text of `path` (a panic naming it when it cannot be read: these are examples).
pub fn read(path: &str) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The traces at `paths` (one model shape) and their header.
pub fn load(paths: &[String]) -> (TraceHeader, Vec<Vec<TraceStep>>) {
    let mut header = None;
    let traces = paths
        .iter()
        .map(|p| {
            let (h, steps) = specfit_trace::read(&read(p)).unwrap_or_else(|e| panic!("{p}: {e}"));
            header = Some(h);
            steps
        })
        .collect();
    (header.expect("at least one trace"), traces)
}

/// The calibration's acceptance counts (none when it has none).
pub fn calibration_counts(cal: &CalibrationJson) -> Acceptance {
    cal.acceptance
        .as_ref()
        .map(|a| a.to_counts().expect("valid counts"))
        .unwrap_or_default()
}

/// SpecFit as the bench builds it: the calibration's paper-form cost and node budget, scoring
/// by `acceptance`, with the burst rule `bursts`.
pub fn specfit(cal: &CalibrationJson, acceptance: &Acceptance, bursts: Bursts) -> VerifyPolicy {
    let cost = cal.cost_model(false).expect("a paper-form fit");
    let selector = Selector::new(cost, cal.max_nodes, Objective::Ratio).expect("a selector");
    VerifyPolicy::specfit(selector)
        .bursts(bursts)
        .acceptance(acceptance.clone())
}
