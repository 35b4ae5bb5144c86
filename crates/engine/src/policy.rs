//! Verify policies by name, as users pick them (`--policy`, the bench's rows, `serve`): the
//! names, a calibration checked against the target it was measured on, λ's default, and the
//! [`VerifyPolicy`] a name and a calibration make. The decisions themselves are
//! `specfit_selector`'s; parsing flags is the binary's.

use std::path::Path;

use specfit_selector::json::CalibrationJson;
use specfit_selector::{
    Acceptance, Bursts, CostModel, ExpertCost, Objective, Selector, VerifyPolicy,
};

use crate::config::Qwen3MoeConfig;
use crate::error::EngineError;
use crate::experts::ExpertCache;
use crate::model::DrafterDtype;

/// A verify policy's name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PolicyName {
    /// No drafting: plain decoding.
    Ar,
    /// Verify the K most probable pool nodes (vanilla EAGLE-3 with `--slots 0`).
    Eagle3,
    /// SpecFit: the selector's ratio rule on the draft nodes' routes, plus the draft-stop rule,
    /// decoding plainly while its measured cycles cost more per token than plain steps
    /// ([`Bursts::NeverLose`]).
    Specfit,
    /// SpecFit with the throughput rule (1 + ΣP) − λ·time.
    SpecfitLambda,
    /// SpecFit with the residency-aware cost on the live slot contents.
    SpecfitResident,
    /// SpecFit that decodes plainly (no drafting) for 1, 2, 4, … 16 tokens after each cycle
    /// whose best subtree is empty, whatever the cycles measure ([`Bursts::AfterEmpty`]).
    SpecfitAdaptive,
}

impl PolicyName {
    /// Every policy, in the order help texts list them.
    pub const ALL: [PolicyName; 6] = [
        PolicyName::Ar,
        PolicyName::Eagle3,
        PolicyName::Specfit,
        PolicyName::SpecfitLambda,
        PolicyName::SpecfitResident,
        PolicyName::SpecfitAdaptive,
    ];

    pub fn name(self) -> &'static str {
        match self {
            PolicyName::Ar => "ar",
            PolicyName::Eagle3 => "eagle3",
            PolicyName::Specfit => "specfit",
            PolicyName::SpecfitLambda => "specfit-lambda",
            PolicyName::SpecfitResident => "specfit-resident",
            PolicyName::SpecfitAdaptive => "specfit-adaptive",
        }
    }

    /// Whether the policy runs SpecFit's selector, which needs draft-node routes and a
    /// calibration.
    pub fn needs_routes(self) -> bool {
        !matches!(self, PolicyName::Ar | PolicyName::Eagle3)
    }
}

impl std::fmt::Display for PolicyName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for PolicyName {
    type Err = EngineError;

    fn from_str(s: &str) -> Result<PolicyName, EngineError> {
        PolicyName::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| EngineError::UnknownPolicy { name: s.into() })
    }
}

/// What a verify policy is built from.
#[derive(Debug, Clone, Copy)]
pub struct PolicySpec<'a> {
    pub name: PolicyName,
    /// K: most draft nodes verified per cycle.
    pub max_nodes: usize,
    /// λ of specfit-lambda, in tokens per ms; `None`: the calibrated plain-decoding rate
    /// ([`default_lambda`]).
    pub lambda: Option<f64>,
    /// Multiplies the calibrated per-expert cost (the paper's β×2 ablation uses 2).
    pub beta_scale: f64,
    /// Score nodes by the drafter's own path probabilities, as the paper does, instead of by
    /// how often the target takes the drafter's children (the default).
    pub drafter_probs: bool,
    pub calibration: Option<&'a CalibrationJson>,
}

impl<'a> PolicySpec<'a> {
    /// The policy a decoding command (`generate`, `serve`) runs: `name` with at most
    /// `max_nodes` nodes, λ as given (else the calibrated default), the calibrated β unscaled.
    pub fn command(
        name: PolicyName,
        max_nodes: usize,
        lambda: Option<f64>,
        calibration: Option<&'a CalibrationJson>,
    ) -> PolicySpec<'a> {
        PolicySpec {
            name,
            max_nodes,
            lambda,
            beta_scale: 1.0,
            drafter_probs: false,
            calibration,
        }
    }
}

/// The verify policy `spec` names on a target of shape `cfg`: plain decoding for `ar`, top-K for
/// `eagle3`, SpecFit's selector on the calibrated costs otherwise (K capped at the largest
/// subtree the calibration measured), with the never-lose bursts but for `specfit-adaptive`.
pub fn verify_policy(
    spec: &PolicySpec<'_>,
    cfg: &Qwen3MoeConfig,
) -> Result<VerifyPolicy, EngineError> {
    let name = spec.name;
    match name {
        PolicyName::Ar => return Ok(VerifyPolicy::plain()),
        PolicyName::Eagle3 => return Ok(VerifyPolicy::top_k(spec.max_nodes)),
        _ => {}
    }
    let cal = spec
        .calibration
        .ok_or(EngineError::NoCalibration { policy: name })?;
    let objective = match (name, spec.lambda) {
        (PolicyName::SpecfitLambda, Some(lambda)) => Objective::lambda(lambda)?,
        (PolicyName::SpecfitLambda, None) => Objective::lambda(default_lambda(cal, cfg)?)?,
        _ => Objective::Ratio,
    };
    let residency = name == PolicyName::SpecfitResident;
    let cost = scale_beta(&cal.cost_model(residency)?, spec.beta_scale)?;
    let selector = Selector::new(cost, spec.max_nodes.min(cal.max_nodes), objective)?;
    let bursts = match name {
        PolicyName::SpecfitAdaptive => Bursts::AfterEmpty,
        _ => Bursts::NeverLose,
    };
    let policy = VerifyPolicy::specfit(selector)
        .residency(residency)
        .bursts(bursts);
    if spec.drafter_probs {
        return Ok(policy);
    }
    // Nodes scored by how often the target takes the drafter's children: from the
    // calibration's counts when it has them, learning from every verify either way.
    let acceptance = match &cal.acceptance {
        Some(a) => a.to_counts()?,
        None => Acceptance::new(),
    };
    Ok(policy.acceptance(acceptance))
}

/// The cost model with its per-expert charge multiplied by `scale`.
pub fn scale_beta(cost: &CostModel, scale: f64) -> Result<CostModel, EngineError> {
    let expert = match cost.expert() {
        ExpertCost::Uniform { beta } => ExpertCost::Uniform { beta: beta * scale },
        ExpertCost::Residency {
            beta_hit,
            beta_miss,
        } => ExpertCost::Residency {
            beta_hit: beta_hit * scale,
            beta_miss: beta_miss * scale,
        },
    };
    Ok(CostModel::new(cost.intercepts().to_vec(), expert)?)
}

/// λ for specfit-lambda when none is given: the token rate of plain decoding the calibration
/// predicts (1 token per root-only verify of the full top-k demand), so a node is verified when
/// its expected tokens beat what that time would yield autoregressively.
pub fn default_lambda(cal: &CalibrationJson, cfg: &Qwen3MoeConfig) -> Result<f64, EngineError> {
    let demand = (cfg.moe_layers().len() * cfg.num_experts_per_tok) as u32;
    let ms = cal.cost_model(false)?.time_ms(0, demand, 0);
    if !(ms.is_finite() && ms > 0.0) {
        return Err(EngineError::BadPlainStepCost { ms });
    }
    Ok(1.0 / ms)
}

/// The shape a calibration is stamped with, to check it against the target it is used on.
pub fn target_stamp(cfg: &Qwen3MoeConfig) -> serde_json::Map<String, serde_json::Value> {
    let mut m = serde_json::Map::new();
    m.insert("moe_layers".into(), cfg.moe_layers().len().into());
    m.insert("experts".into(), cfg.num_experts.into());
    m.insert("num_experts_per_tok".into(), cfg.num_experts_per_tok.into());
    m.insert("hidden_size".into(), cfg.hidden_size.into());
    m.insert("vocab_size".into(), cfg.vocab_size.into());
    m
}

/// Reads a calibration and checks it was measured on a target of shape `cfg`; one that does not
/// name its target is refused (its costs could be another model's).
pub fn load_calibration(
    path: &Path,
    cfg: &Qwen3MoeConfig,
    cache: &ExpertCache,
) -> Result<CalibrationJson, EngineError> {
    let text = std::fs::read_to_string(path).map_err(EngineError::io(path))?;
    let bad = |reason: String| EngineError::BadCalibration {
        path: path.into(),
        reason,
    };
    let cal = CalibrationJson::parse(&text).map_err(|e| bad(e.to_string()))?;
    let here = serde_json::Value::Object(target_stamp(cfg));
    let Some(stamp) = &cal.target else {
        return Err(bad(format!(
            "it does not name the target it was fitted on (no \"target\" stamp), so it cannot be checked against this model ({here}); measure one with `specfit calibrate`, or fit probe rows with `specfit calibrate --probes FILE --model DIR`"
        )));
    };
    let differs = target_stamp(cfg)
        .iter()
        .any(|(k, v)| stamp.get(k).is_some_and(|s| s != v));
    if differs {
        let there = serde_json::Value::Object(stamp.clone());
        return Err(bad(format!(
            "it was measured on a target of shape {there} but this model is {here}; re-run `specfit calibrate`"
        )));
    }
    // Costs measured with the experts in RAM say nothing of reads from disk, and the reverse.
    let tier = tier_key(cache);
    if let Some(there) = stamp.get("tier").and_then(|t| t.as_str()) {
        if there != tier {
            return Err(bad(format!(
                "it was measured with the experts on the {there} tier but they are on the {tier} tier here; re-run `specfit calibrate` with this --store, or pass a calibration measured on it"
            )));
        }
    }
    Ok(cal)
}

/// A note when `cal` (read from `path`) was measured with another number of slots per layer
/// than `cache` has: its per-expert costs still apply, but the hit rates it was fitted at were
/// another cache's (None: the same, or not stamped).
pub fn slots_note(path: &Path, cal: &CalibrationJson, cache: &ExpertCache) -> Option<String> {
    let there = cal.target.as_ref()?.get("slots")?.as_u64()?;
    let here = cache.slots_per_layer();
    (there != here as u64).then(|| {
        format!(
            "note: calibration {} was measured with {there} expert slots per layer; this run has {here} (its per-expert costs still apply; `specfit calibrate --slots {here}` measures this cache)",
            path.display()
        )
    })
}

/// A note when `cal` (read from `path`) was measured with the drafter's matrices kept otherwise
/// than `dtype` (files from before drafters were quantized count as `native`): its acceptance
/// counts and drafting costs are that drafter's (None: the same).
pub fn drafter_note(path: &Path, cal: &CalibrationJson, dtype: DrafterDtype) -> Option<String> {
    let there = calibration_drafter_dtype(cal);
    let here = dtype.name();
    (there != here).then(|| {
        format!(
            "note: calibration {} was measured with {there} drafter matrices; this run drafts with {here} (its acceptance counts and drafting costs are the other drafter's; `specfit calibrate --drafter-dtype {here}` measures this one)",
            path.display()
        )
    })
}

/// The drafter dtype `cal` was measured with ([`DrafterDtype::name`]): what its drafting costs
/// record, `native` for files from before drafters were quantized or without drafting costs.
pub fn calibration_drafter_dtype(cal: &CalibrationJson) -> &str {
    cal.drafting
        .as_ref()
        .and_then(|d| d.drafter_dtype.as_deref())
        .unwrap_or(DrafterDtype::Native.name())
}

/// The tier a calibration is measured on and stamped with: `disk` (the expert file or a GGUF
/// read into slots) or `ram`.
pub fn tier_key(cache: &ExpertCache) -> &'static str {
    if cache.tier().starts_with("disk") {
        "disk"
    } else {
        "ram"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_policy_name_parses_back_to_itself_and_others_are_refused() {
        for p in PolicyName::ALL {
            assert_eq!(p.name().parse::<PolicyName>().unwrap(), p);
        }
        let err = "specfit-fast".parse::<PolicyName>().unwrap_err();
        assert!(err.to_string().contains("specfit-fast"), "{err}");
        assert!(err.to_string().contains("specfit-resident"), "{err}");
    }

    #[test]
    fn scaling_beta_doubles_every_per_expert_charge_and_keeps_intercepts() {
        let paper = CostModel::paper(vec![1.0, 2.0], 0.5).unwrap();
        let twice = scale_beta(&paper, 2.0).unwrap();
        assert_eq!(twice.intercepts(), &[1.0, 2.0]);
        assert_eq!(twice.expert(), ExpertCost::Uniform { beta: 1.0 });
        let res = CostModel::residency(vec![1.0], 0.1, 0.4).unwrap();
        assert_eq!(
            scale_beta(&res, 2.0).unwrap().expert(),
            ExpertCost::Residency {
                beta_hit: 0.2,
                beta_miss: 0.8
            }
        );
    }

    #[test]
    fn a_calibration_from_another_drafter_dtype_gets_a_note_and_one_without_a_dtype_counts_as_native(
    ) {
        let json = |drafting: &str| {
            format!(
                r#"{{"format":"specfit-calibration","version":1,"max_nodes":1,
                "cost":{{"intercepts":[1.0,2.0],"beta":0.5}},"fit":{{"rows":4,"r2":0.9,"median_abs_err_ms":0.1}}{drafting}}}"#
            )
        };
        let note = |drafting: &str, dtype| {
            let cal = CalibrationJson::parse(&json(drafting)).unwrap();
            drafter_note(Path::new("cal.json"), &cal, dtype)
        };
        let q4 = r#","drafting":{"ms_per_level":2.0,"feed_ms":2.5,"feed_ms_per_token":0.0,"drafter_dtype":"q4_k"}"#;
        let old = r#","drafting":{"ms_per_level":6.0,"feed_ms":7.5,"feed_ms_per_token":0.0}"#;
        assert_eq!(note(q4, DrafterDtype::Q4_K), None);
        let said = note(q4, DrafterDtype::Native).expect("another dtype");
        assert!(
            said.contains("q4_k drafter matrices") && said.contains("--drafter-dtype native"),
            "{said}"
        );
        // Files from before the field, or without drafting costs at all: measured as stored.
        assert_eq!(note(old, DrafterDtype::Native), None);
        assert_eq!(note("", DrafterDtype::Native), None);
        assert!(
            note(old, DrafterDtype::Q8_0).is_some_and(|n| n.contains("native drafter matrices"))
        );
    }
}
