//! Measuring the engine for the tools around decoding: timed verify probes and plain steps for
//! calibrating the cost model (`probe`, `specfit calibrate`), and greedy walks that record
//! traces and route-predictor samples (`walk`, `specfit record` / `train-predictor`). It does
//! not decode for users (that is [`crate::spec`]) and fits nothing.

mod probe;
mod walk;

pub use probe::{probe, PlainStep, ProbePlan, ProbeRow, Probed};
pub use walk::{collect_route_samples, record};
