//! The speculative policies a user can pick (`generate --policy`, the bench's rows) and the route
//! sources of SpecFit's selector, turned into the engine's verify rules and route inputs. This
//! module owns the mapping from names to rules; the rules themselves live in the engine.

use std::path::{Path, PathBuf};

use anyhow::{bail, Result};
use specfit_engine::policy::SpecFitRule;
use specfit_engine::predictor::RoutePredictor;
use specfit_engine::spec::{Atlas, SpecRule, TopK};
use specfit_engine::{Eagle3, Qwen3Moe};
use specfit_selector::json::CalibrationJson;
use specfit_selector::{CostModel, ExpertCost, Objective, Selector};
use specfit_sim::SimPolicy;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Policy {
    /// No drafting: plain decoding.
    Ar,
    /// Verify the K most probable pool nodes (vanilla EAGLE-3 with --clear-cache).
    Eagle3,
    /// SpecFit: the selector's ratio rule on predicted routes, plus the draft-stop rule.
    Specfit,
    /// SpecFit with the throughput rule (1 + ΣP) − λ·time (--lambda).
    SpecfitLambda,
    /// SpecFit with the residency-aware cost on the live slot contents.
    SpecfitResident,
    /// SpecFit that decodes plainly (no drafting) for 1, 2, 4, … 16 tokens after each cycle
    /// whose best subtree is empty (an extension beyond the paper; still lossless).
    SpecfitAdaptive,
}

impl Policy {
    /// Whether the policy needs routes of the draft nodes.
    pub fn needs_routes(self) -> bool {
        matches!(
            self,
            Policy::Specfit
                | Policy::SpecfitLambda
                | Policy::SpecfitResident
                | Policy::SpecfitAdaptive
        )
    }

    pub fn name(self) -> &'static str {
        match self {
            Policy::Ar => "ar",
            Policy::Eagle3 => "eagle3",
            Policy::Specfit => "specfit",
            Policy::SpecfitLambda => "specfit-lambda",
            Policy::SpecfitResident => "specfit-resident",
            Policy::SpecfitAdaptive => "specfit-adaptive",
        }
    }
}

/// Where the SpecFit policies get the routes of draft nodes.
#[derive(Debug, Clone, PartialEq)]
pub enum RouteChoice {
    /// True routes from the target's routers, computed outside the timer.
    Atlas,
    /// Atlas routes with each expert replaced at random with probability `p`.
    Corrupt(f64),
    /// A linear head on the drafter's hidden state (`specfit train-predictor`).
    Predictor(PathBuf),
}

impl RouteChoice {
    /// Parses `atlas`, `corrupt:P` or `predictor:FILE`.
    pub fn parse(text: &str) -> Result<RouteChoice> {
        if text == "atlas" {
            return Ok(RouteChoice::Atlas);
        }
        if let Some(p) = text.strip_prefix("corrupt:") {
            return match p.parse::<f64>() {
                Ok(p) if (0.0..=1.0).contains(&p) => Ok(RouteChoice::Corrupt(p)),
                _ => bail!("--routes {text:?}: P must be a number in [0, 1]"),
            };
        }
        if let Some(path) = text.strip_prefix("predictor:") {
            return Ok(RouteChoice::Predictor(PathBuf::from(path)));
        }
        bail!("--routes {text:?}: expected atlas, corrupt:P with P in [0, 1], or predictor:FILE")
    }

    /// A short label for reports.
    pub fn label(&self) -> String {
        match self {
            RouteChoice::Atlas => "atlas".into(),
            RouteChoice::Corrupt(p) => format!("corrupt:{p}"),
            RouteChoice::Predictor(_) => "predictor".into(),
        }
    }
}

/// Loads a route predictor head for this target and drafter.
pub fn load_predictor(path: &Path, model: &Qwen3Moe, drafter: &Eagle3) -> Result<RoutePredictor> {
    let cfg = model.config();
    let dim = drafter.config().hidden_size + cfg.hidden_size;
    Ok(RoutePredictor::load(
        path,
        cfg.moe_layers().len(),
        cfg.num_experts,
        cfg.num_experts_per_tok,
        dim,
    )?)
}

/// Turns an atlas into the one `route` names (corrupting it when asked); predictors load
/// separately with [`load_predictor`].
pub fn atlas_for(atlas: Atlas, route: &RouteChoice, seed: u64) -> Atlas {
    match route {
        RouteChoice::Corrupt(p) => atlas.with_corruption(*p, seed),
        _ => atlas,
    }
}

/// Reads a calibration and checks it was measured on a target of this shape; one that does not
/// name its target is refused (its costs could be another model's).
pub fn load_calibration(path: &Path, model: &Qwen3Moe) -> Result<CalibrationJson> {
    let cal = CalibrationJson::parse(&crate::files::read_text(path)?)?;
    let here = crate::calibrate::target_stamp(model.config());
    let Some(stamp) = &cal.target else {
        bail!(
            "calibration {} does not name the target it was fitted on (no \"target\" stamp), so it cannot be checked against this model ({}); measure one with `specfit calibrate`, or fit probe rows with `specfit calibrate --probes FILE --model DIR`",
            path.display(),
            serde_json::Value::Object(here)
        );
    };
    let shape_differs = here
        .iter()
        .any(|(k, v)| stamp.get(k).is_some_and(|s| s != v));
    if shape_differs {
        bail!(
            "calibration {} was measured on a target of shape {} but this model is {}; re-run `specfit calibrate`",
            path.display(),
            serde_json::Value::Object(stamp.clone()),
            serde_json::Value::Object(here)
        );
    }
    Ok(cal)
}

/// What a verify rule is built from.
#[derive(Debug, Clone, Copy)]
pub struct RuleSpec<'a> {
    pub policy: Policy,
    /// K: most draft nodes verified per cycle.
    pub budget: usize,
    /// λ of specfit-lambda, in tokens per ms.
    pub lambda: f64,
    /// Multiplies the calibrated per-expert cost (the paper's β×2 ablation uses 2).
    pub beta_scale: f64,
    pub calibration: Option<&'a CalibrationJson>,
}

/// The verify rule of a policy: top-K for `ar`/`eagle3`, SpecFit's selector otherwise.
pub fn rule(spec: &RuleSpec<'_>, model: &Qwen3Moe) -> Result<Box<dyn SpecRule + Send>> {
    let residency = spec.policy == Policy::SpecfitResident;
    let objective = match spec.policy {
        Policy::Ar => return Ok(Box::new(TopK(0))),
        Policy::Eagle3 => return Ok(Box::new(TopK(spec.budget))),
        Policy::SpecfitLambda => Objective::lambda(spec.lambda)?,
        Policy::Specfit | Policy::SpecfitResident | Policy::SpecfitAdaptive => Objective::Ratio,
    };
    let Some(cal) = spec.calibration else {
        bail!(
            "--policy {} needs a calibration (from `specfit calibrate`)",
            spec.policy.name()
        );
    };
    let cost = scale_beta(&cal.cost_model(residency)?, spec.beta_scale)?;
    let selector = Selector::new(cost, spec.budget.min(cal.max_nodes), objective)?;
    let mut rule = SpecFitRule::new(selector, model.config().num_experts);
    rule.use_resident = residency;
    rule.adaptive = spec.policy == Policy::SpecfitAdaptive;
    Ok(Box::new(rule))
}

/// The cost model with its per-expert charge multiplied by `scale`.
/// The simulator's form of a policy: `eagle3` verifies the `top_k` most probable nodes; the
/// SpecFit policies search up to `max_nodes` believing `cost` under `objective`, with the
/// draft-stop rule (the simulator has no plain bursts: `specfit-adaptive` replays as `specfit`).
pub fn sim_policy(
    policy: Policy,
    (top_k, max_nodes): (usize, usize),
    cost: CostModel,
    objective: Objective,
) -> SimPolicy {
    match policy {
        Policy::Ar => SimPolicy::Ar,
        Policy::Eagle3 => SimPolicy::TopK(top_k),
        Policy::Specfit
        | Policy::SpecfitLambda
        | Policy::SpecfitResident
        | Policy::SpecfitAdaptive => SimPolicy::SpecFit {
            cost,
            objective,
            max_nodes,
            stop_rule: true,
            residency: policy == Policy::SpecfitResident,
        },
    }
}

pub fn scale_beta(cost: &CostModel, scale: f64) -> Result<CostModel> {
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
pub fn default_lambda(cal: &CalibrationJson, model: &Qwen3Moe) -> Result<f64> {
    let cfg = model.config();
    let demand = (cfg.moe_layers().len() * cfg.num_experts_per_tok) as u32;
    let ms = cal.cost_model(false)?.time_ms(0, demand, 0);
    if !(ms.is_finite() && ms > 0.0) {
        bail!("the calibration predicts {ms} ms for a plain decoding step; re-run `specfit calibrate`");
    }
    Ok(1.0 / ms)
}

/// The verify rule a decoding command (`generate`, `serve`) runs: `policy` with at most
/// `budget` nodes, λ as given or, for specfit-lambda, the calibrated plain-decoding rate, the
/// calibrated β unscaled.
pub fn command_rule(
    policy: Policy,
    budget: usize,
    lambda: Option<f64>,
    calibration: Option<&CalibrationJson>,
    model: &Qwen3Moe,
) -> Result<Box<dyn SpecRule + Send>> {
    let lambda = match (lambda, calibration) {
        (Some(l), _) => l,
        (None, Some(cal)) if policy == Policy::SpecfitLambda => default_lambda(cal, model)?,
        _ => 0.0,
    };
    rule(
        &RuleSpec {
            policy,
            budget,
            lambda,
            beta_scale: 1.0,
            calibration,
        },
        model,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn route_choices_parse_and_bad_ones_are_errors() {
        assert_eq!(RouteChoice::parse("atlas").unwrap(), RouteChoice::Atlas);
        assert_eq!(
            RouteChoice::parse("corrupt:0.4").unwrap(),
            RouteChoice::Corrupt(0.4)
        );
        assert_eq!(
            RouteChoice::parse("predictor:a/b.safetensors").unwrap(),
            RouteChoice::Predictor("a/b.safetensors".into())
        );
        for bad in ["corrupt:1.5", "corrupt:x", "corrupt:NaN", "oracle", ""] {
            assert!(RouteChoice::parse(bad).is_err(), "{bad}");
        }
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
}
