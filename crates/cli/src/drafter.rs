//! The `--drafter-dtype` flag and loading the EAGLE-3 drafter with it; what the dtypes are is
//! the engine's ([`DrafterDtype`]).

use std::path::Path;

use anyhow::{Context, Result};
use specfit_engine::{DrafterDtype, Eagle3, Qwen3Moe};

/// `--drafter-dtype`, for every command that loads a drafter.
#[derive(Debug, Clone, clap::Args)]
pub struct DrafterDtypeArg {
    /// How the drafter keeps its matrices: auto (q4_k beside a target whose matrices are kept
    /// quantized, i.e. a GGUF file; as stored otherwise), native (as stored), q8_0 or q4_k
    /// (quantized at load). Drafting gets cheaper at a small change in the drafted
    /// probabilities; the output never depends on it (the target verifies every draft).
    #[arg(long = "drafter-dtype", default_value = "auto", value_parser = parse)]
    pub drafter_dtype: Choice,
}

/// A `--drafter-dtype` value: `auto`, or one dtype.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Choice(Option<DrafterDtype>);

fn parse(name: &str) -> Result<Choice, String> {
    if name == "auto" {
        return Ok(Choice(None));
    }
    DrafterDtype::parse(name)
        .map(|d| Choice(Some(d)))
        .ok_or_else(|| {
            let names: Vec<&str> = DrafterDtype::ALL.iter().map(|d| d.name()).collect();
            format!("expected auto, {}", names.join(", "))
        })
}

impl DrafterDtypeArg {
    /// The dtype for a drafter beside `target`.
    pub fn resolve(&self, target: &Qwen3Moe) -> DrafterDtype {
        self.drafter_dtype
            .0
            .unwrap_or_else(|| DrafterDtype::for_target(target))
    }

    /// Loads the drafter in `dir` for `target`, its matrices as this flag says.
    pub fn load(&self, dir: &Path, target: &Qwen3Moe) -> Result<Eagle3> {
        let dtype = self.resolve(target);
        Eagle3::load_as(dir, target.config(), dtype).with_context(|| {
            format!(
                "loading the drafter {} ({} matrices)",
                dir.display(),
                dtype.name()
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_dtype_name_parses_back_and_auto_leaves_the_choice_open() {
        for d in DrafterDtype::ALL {
            assert_eq!(parse(d.name()), Ok(Choice(Some(d))));
        }
        assert_eq!(parse("auto"), Ok(Choice(None)));
        let err = parse("q5_k").unwrap_err();
        assert!(err.contains("auto, native, q8_0, q4_k"), "{err}");
    }
}
