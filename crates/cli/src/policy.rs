//! The policy flags a user gives (`generate --policy`, `serve`, the bench's rows) and the route
//! sources of SpecFit's selector, parsed into the engine's policy names and route inputs. The
//! policies themselves are built by `specfit_engine::policy`.

use std::path::{Path, PathBuf};

use anyhow::{bail, Result};
use specfit_engine::policy::PolicyName;
use specfit_engine::predictor::{HeadShape, RoutePredictor};
use specfit_engine::spec::Atlas;
use specfit_engine::{Eagle3, Qwen3Moe};

/// Reads the calibration at `path` for `model` and `cache` (checked against both), saying so in
/// one line each when it was measured with another number of slots or another drafter dtype.
pub fn calibration(
    path: &Path,
    model: &Qwen3Moe,
    drafter: &Eagle3,
    cache: &specfit_engine::ExpertCache,
) -> Result<specfit_selector::json::CalibrationJson> {
    let cal = specfit_engine::policy::load_calibration(path, model.config(), cache)?;
    if let Some(note) = specfit_engine::policy::slots_note(path, &cal, cache) {
        eprintln!("{note}");
    }
    if let Some(note) = specfit_engine::policy::drafter_note(path, &cal, drafter.dtype()) {
        eprintln!("{note}");
    }
    Ok(cal)
}

/// Parses `--policy` (the names of [`PolicyName::ALL`]).
pub fn parse_policy() -> impl clap::builder::TypedValueParser<Value = PolicyName> {
    use clap::builder::TypedValueParser;
    let names: Vec<&'static str> = PolicyName::ALL.iter().map(|p| p.name()).collect();
    clap::builder::PossibleValuesParser::new(names)
        .map(|name| name.parse::<PolicyName>().expect("a listed name"))
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
    let shape = HeadShape::for_pair(model.config(), drafter.config().hidden_size);
    Ok(RoutePredictor::load(path, shape)?)
}

/// Turns an atlas into the one `route` names (corrupting it when asked); predictors load
/// separately with [`load_predictor`].
pub fn atlas_for(atlas: Atlas, route: &RouteChoice, seed: u64) -> Atlas {
    match route {
        RouteChoice::Corrupt(p) => atlas.with_corruption(*p, seed),
        _ => atlas,
    }
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
            let err = RouteChoice::parse(bad).unwrap_err().to_string();
            assert!(err.contains("--routes"), "{bad}: {err}");
        }
    }
}
