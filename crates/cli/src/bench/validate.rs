//! Checks the trace simulator against the bench's own measurements: records traces (the full
//! draft pool with the target's routes at every greedy position) of the first prompts of each
//! set, replays them under each measured configuration with this machine's calibration (verify
//! cost, drafting cost, per-layer LRU), and sets the predicted tok/s beside the measured tok/s of
//! the same prompts. It measures nothing itself beyond recording the traces.

use anyhow::Result;
use serde::Serialize;
use specfit_engine::measure::PoolWalk;
use specfit_engine::policy::{verify_policy, PolicySpec};
use specfit_engine::spec::{Atlas, TreeShape};
use specfit_engine::{Eagle3, ExpertCache, Qwen3Moe};
use specfit_selector::json::CalibrationJson;
use specfit_selector::VerifyPolicy;
use specfit_sim::{simulate_many, SimConfig};
use specfit_trace::{TraceHeader, TraceStep};

use super::plan::Config;
use super::report::Tally;
use crate::policy::RouteChoice;

/// One configuration's predicted and measured throughput on the validation prompts.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub label: String,
    pub slots: usize,
    pub measured_tok_s: f64,
    pub simulated_tok_s: f64,
    /// simulated / measured − 1.
    pub error: f64,
    /// Where a miss comes from, side by side: committed tokens per cycle and expert copies
    /// per committed token (a cycle is a speculative cycle or a plain step).
    pub measured_tokens_per_cycle: f64,
    pub simulated_tokens_per_cycle: f64,
    pub measured_copies_per_token: f64,
    pub simulated_copies_per_token: f64,
}

/// The validation of one prompt set.
#[derive(Debug, Clone, Serialize)]
pub struct SetValidation {
    pub name: String,
    pub prompts: usize,
    pub checks: Vec<Check>,
    /// Checks whose |error| ≤ 10% (the bar).
    pub within_10_percent: usize,
}

/// Records one trace per prompt: `positions[i]` greedy positions of `prompts[i]`.
pub fn traces(
    model: &Qwen3Moe,
    drafter: &Eagle3,
    cache: &mut ExpertCache,
    atlas: &mut Atlas,
    prompts: &[(&[u32], usize)],
) -> Result<Vec<Vec<TraceStep>>> {
    let mut walk = PoolWalk {
        target: model,
        drafter,
        cache,
        atlas,
        shape: TreeShape::default(),
    };
    prompts
        .iter()
        .map(|&(p, positions)| Ok(walk.record(p, positions)?))
        .collect()
}

/// What the simulator needs besides the traces.
pub struct Machine<'a> {
    pub header: TraceHeader,
    pub calibration: &'a CalibrationJson,
    pub model: &'a Qwen3Moe,
    pub max_nodes: usize,
}

/// The simulator's policy for a configuration (`None` for route sources the trace does not
/// hold: corrupted or predicted routes).
fn sim_policy(c: &Config, m: &Machine<'_>) -> Result<Option<VerifyPolicy>> {
    // The trace holds atlas routes only, and the simulator reads nothing ahead.
    if (c.policy.needs_routes() && c.routes != RouteChoice::Atlas)
        || c.read_ahead
        || c.layers_ahead > 0
    {
        return Ok(None);
    }
    let spec = PolicySpec {
        name: c.policy,
        max_nodes: m.max_nodes,
        lambda: None,
        beta_scale: c.beta_scale,
        drafter_probs: c.drafter_probs,
        calibration: Some(m.calibration),
    };
    Ok(Some(verify_policy(&spec, m.model.config())?))
}

/// Replays every trace under every configuration and compares with `measured` (the tallies of
/// the same prompts).
pub fn check(
    name: &str,
    traces: &[Vec<TraceStep>],
    configs: &[Config],
    measured: &[Tally],
    m: &Machine<'_>,
) -> Result<SetValidation> {
    let machine = specfit_sim::machine::from_calibration(m.calibration)?;
    let mut checks = Vec::new();
    for (c, t) in configs.iter().zip(measured) {
        let Some(policy) = sim_policy(c, m)? else {
            continue;
        };
        let config = SimConfig {
            slots: c.slots.number(),
            ..machine.clone()
        };
        // The bench's caches carry over from prompt to prompt; so do the simulator's.
        let r = simulate_many(&m.header, traces, &policy, &config)?;
        let (committed, ms) = (r.committed, r.time_ms);
        let simulated = if ms > 0.0 {
            1e3 * committed as f64 / ms
        } else {
            0.0
        };
        let measured = t.tokens_per_second();
        let per = |a: f64, b: usize| if b > 0 { a / b as f64 } else { 0.0 };
        checks.push(Check {
            measured_tokens_per_cycle: per(t.sum.committed as f64, t.sum.cycles),
            simulated_tokens_per_cycle: per(committed as f64, r.cycles + r.plain_steps),
            measured_copies_per_token: per(t.sum.copies.misses as f64, t.sum.committed),
            simulated_copies_per_token: per(r.misses as f64, committed),
            label: c.label.clone(),
            slots: c.slots.number(),
            measured_tok_s: measured,
            simulated_tok_s: simulated,
            error: if measured > 0.0 {
                simulated / measured - 1.0
            } else {
                0.0
            },
        });
    }
    Ok(SetValidation {
        name: name.to_string(),
        prompts: traces.len(),
        within_10_percent: checks.iter().filter(|c| c.error.abs() <= 0.10).count(),
        checks,
    })
}
