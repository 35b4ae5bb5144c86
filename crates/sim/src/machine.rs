//! The simulated machine of a calibration file: its replay fit (read latency, attention term,
//! plain steps' own cost) and drafting costs as a [`SimConfig`]. It does not fit (see
//! [`crate::fit`]) or replay.

use specfit_selector::json::CalibrationJson;
use specfit_selector::CostModel;

use crate::{Drafting, PlainCost, SimConfig, SimError};

/// The simulated machine of a calibration (slots still to set): its replay fit (read
/// latency, attention term, plain steps' own cost) and drafting costs when it has them, else its
/// residency-aware fit alone.
pub fn from_calibration(cal: &CalibrationJson) -> Result<SimConfig, SimError> {
    let drafting = cal.drafting.map_or(Drafting::default(), |d| Drafting {
        ms_per_level: d.ms_per_level,
        feed_ms: d.feed_ms,
        feed_ms_per_token: d.feed_ms_per_token,
        level_context_ms: d.level_context_ms,
        feed_context_ms: d.feed_context_ms,
    });
    // Required either way (a calibration without it is refused).
    let residency_fit = cal.cost_model(true)?;
    let Some(r) = &cal.replay else {
        return Ok(SimConfig {
            drafting,
            ..SimConfig::verify_only(0, residency_fit)
        });
    };
    let plain = match &r.plain {
        Some(p) => PlainCost {
            intercept: p.intercept,
            beta_hit: p.beta_hit,
            beta_miss: p.beta_miss,
            read_round_ms: p.read_round_ms,
            slot_wait_ms: p.slot_wait_ms,
            context_ms: p.context_ms,
        },
        // Older files: the plain-step intercept with the verify coefficients.
        None => PlainCost {
            intercept: r.ar_intercept,
            beta_hit: r.beta_hit,
            beta_miss: r.beta_miss,
            read_round_ms: r.read_round_ms,
            slot_wait_ms: r.slot_wait_ms,
            context_ms: r.context_ms,
        },
    };
    let true_cost = CostModel::residency(r.intercepts.clone(), r.beta_hit, r.beta_miss)?;
    Ok(SimConfig {
        drafting,
        context_ms: r.context_ms,
        read_round_ms: r.read_round_ms,
        read_width: r.read_width.max(1),
        slot_wait_ms: r.slot_wait_ms,
        plain: Some(plain),
        ..SimConfig::verify_only(0, true_cost)
    })
}
