//! The simulated machine of a calibration file: its replay fit (read latency, attention term,
//! plain steps' own cost), drafting costs and whether its experts are used in place, as a
//! [`SimConfig`]. It does not fit (see [`crate::fit`]) or replay.

use specfit_selector::json::CalibrationJson;
use specfit_selector::CostModel;

use crate::{Drafting, PlainCost, SimConfig, SimError};

/// The simulated machine of a calibration (slots still to set): its replay fit (read
/// latency, attention term, plain steps' own cost) and drafting costs when it has them, else its
/// residency-aware fit alone.
pub fn from_calibration(cal: &CalibrationJson) -> Result<SimConfig, SimError> {
    let drafting = cal
        .drafting
        .as_ref()
        .map_or(Drafting::default(), |d| Drafting {
            ms_per_level: d.ms_per_level,
            feed_ms: d.feed_ms,
            feed_ms_per_token: d.feed_ms_per_token,
            level_context_ms: d.level_context_ms,
            feed_context_ms: d.feed_context_ms,
        });
    // Required either way (a calibration without it is refused).
    let residency_fit = cal.cost_model(true)?;
    let Some(r) = &cal.replay else {
        // The attention charge moves to the machine's own term (the replay prices the cost
        // model at no context), so it is counted once.
        return Ok(SimConfig {
            drafting,
            in_place: in_place(cal),
            context_ms: residency_fit.context_ms(),
            ..SimConfig::verify_only(0, residency_fit.at_context(0))
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
        in_place: in_place(cal),
        drafting,
        context_ms: r.context_ms,
        read_round_ms: r.read_round_ms,
        read_width: r.read_width.max(1),
        slot_wait_ms: r.slot_wait_ms,
        plain: Some(plain),
        noise: r.noise,
        noise_seed: 0,
        ..SimConfig::verify_only(0, true_cost)
    })
}

/// Whether the calibration was measured on experts used in place (its target stamp's
/// `in_place`; files written before the stamp had it say nothing, read as not).
fn in_place(cal: &CalibrationJson) -> bool {
    cal.target
        .as_ref()
        .and_then(|t| t.get("in_place"))
        .and_then(|v| v.as_bool())
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn experts_used_in_place_are_read_from_the_calibrations_stamp() {
        let json = |stamp: &str| {
            format!(
                r#"{{"format":"specfit-calibration","version":1,"max_nodes":1,
                "cost":{{"intercepts":[1.0,2.0],"beta":0.5}},"fit":{{"rows":4,"r2":0.9,"median_abs_err_ms":0.1}},
                "cost_residency":{{"intercepts":[1.0,2.0],"beta_hit":0.1,"beta_miss":0.5}},
                "fit_residency":{{"rows":4,"r2":0.9,"median_abs_err_ms":0.1}}{stamp}}}"#
            )
        };
        let machine =
            |stamp: &str| from_calibration(&CalibrationJson::parse(&json(stamp)).unwrap()).unwrap();
        assert!(machine(r#","target":{"tier":"ram","in_place":true}"#).in_place);
        assert!(!machine(r#","target":{"tier":"ram","in_place":false}"#).in_place);
        // Written before the stamp said so: not in place.
        assert!(!machine(r#","target":{"tier":"ram"}"#).in_place);
        assert!(!machine("").in_place);
    }
}
