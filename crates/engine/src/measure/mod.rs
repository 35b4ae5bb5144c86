//! Measuring the engine for the tools around decoding: timed verify probes and plain steps for
//! calibrating the cost model (`probe`) and the calibration measured and fitted from them
//! (`calibration`, `specfit calibrate`), and greedy walks that record
//! traces and route-predictor samples (`walk`, `specfit record` / `train-predictor`). It does
//! not decode for users (that is [`crate::spec`]) and fits nothing.

mod calibration;
mod probe;
mod walk;

pub use calibration::{fit, measure_rows, spread, CalibrationPlan, Measured, Prober};
pub use probe::{probe, PlainStep, ProbePlan, ProbeRow, Probed};
pub use walk::{trace_header, PoolWalk};

use crate::error::EngineError;
use crate::experts::ExpertCache;
use crate::kv::KvCache;
use crate::model::{Eagle3, Qwen3Moe};
use crate::sampling::{Sampler, Sampling};
use crate::spec::{prefill, DraftState, Start};

/// The greedy prefill of `prompt` with the drafter, as decoding starts: the target's cache, the
/// root and the drafter's state.
fn greedy_start(
    target: &Qwen3Moe,
    drafter: &Eagle3,
    cache: &mut ExpertCache,
    prompt: &[u32],
) -> Result<(KvCache, u32, DraftState), EngineError> {
    let mut sampler = Sampler::new(Sampling::Greedy, 0);
    let start = Start::Prompt(prompt);
    let (kv, root, draft) = prefill(target, Some(drafter), cache, start, &mut sampler)?;
    Ok((kv, root, draft.expect("prefilled with the drafter")))
}
