//! What the replay examples share: reading a calibration or trace file, and loading traces.

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
